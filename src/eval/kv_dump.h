// The reader of real activations dumped by `argus eval --dump-kv`, for the benchmarks that
// measure on them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "argus/status.h"
#include "eval/long_context.h"

namespace argus {

// The dump's file of `plane` ('q', 'k' or 'v') for a layer: "layerNN_k.npy" (NN = 00, 01, ...).
std::string DumpName(uint32_t layer, char plane);
std::string DumpPath(const std::string& dir, uint32_t layer, char plane);

// The attention inputs of a model's first window as `argus eval --dump-kv DIR` writes them, per
// layer NN = 00, 01, ...: DIR/layerNN_q.npy [tokens, n_q_heads, head_dim], DIR/layerNN_k.npy and
// DIR/layerNN_v.npy [tokens, n_kv_heads, head_dim], float32, after RoPE. Only the last token's
// queries are kept: the benchmarks decode one step at the last position.
struct KvDump {
  std::string dir;
  ModelGeometry model;  // name "real:<basename of dir>"; n_layers: the dump's layers
  uint32_t n_tokens = 0;
  std::vector<std::vector<float>> k, v;  // per layer: [n_tokens, n_kv_heads, head_dim]
  std::vector<float> q;                  // [n_layers, n_q_heads, head_dim]: the last token's
};
// NotFound for a missing directory or one without layerNN_k.npy files; otherwise errors name the
// file: a missing layer file, a dtype other than float32, a shape that disagrees with the layer's
// other files or with layer 00's, or a geometry the cache cannot hold.
Result<KvDump> ReadKvDump(const std::string& dir);

}  // namespace argus
