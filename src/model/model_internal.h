// What a loaded Model holds, shared by the loader (model.cc) and the forward pass (context.cc).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "argus/gguf.h"
#include "argus/model.h"
#include "core/splitmix.h"
#include "model/matmul.h"

namespace argus {

namespace model {

// A deterministic value in [-1, 1) for (key, index): splitmix64, the same on every machine and
// standard library (std:: distributions are not), and cheap enough to fill gigabytes.
inline float UnitNoise(uint64_t key, uint64_t index) {
  const uint64_t z = SplitMix64At(key, index);
  return static_cast<float>(static_cast<double>(z >> 40) * 0x1.0p-23 - 1.0);
}

struct LayerWeights {
  WeightMatrix q, k, v, o;       // [n_heads*head_dim | n_kv*head_dim, n_embd], o: [n_embd, ...]
  WeightMatrix gate, up, down;   // [n_ff, n_embd] x2, [n_embd, n_ff]
  std::vector<float> attn_norm;  // [n_embd]
  std::vector<float> ffn_norm;   // [n_embd]
  std::vector<float> q_bias, k_bias, v_bias;  // Qwen2 only, else empty
};

}  // namespace model

struct Model::Impl {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig config;
  model::WeightMatrix token_embd;        // [n_vocab, n_embd]
  model::WeightMatrix output;            // [n_vocab, n_embd]: token_embd when tied
  std::vector<float> output_norm;        // [n_embd]
  std::vector<float> rope_freq_factors;  // [head_dim / 2], or empty
  std::vector<model::LayerWeights> layers;
  std::vector<AlignedBuffer> packed_weights;  // the matrices above held outside the file
  uint64_t weight_bytes = 0;
  mutable std::once_flag fingerprint_once;
  mutable std::string fingerprint_hex;
  const std::string& fingerprint() const;  // see Model::fingerprint
};

// How the loader and the forward pass reach a Model's weights.
struct ModelAccess {
  using Impl = Model::Impl;
  static const Impl& Of(const Model& model) { return *model.impl_; }
};
using ModelImpl = ModelAccess::Impl;

}  // namespace argus
