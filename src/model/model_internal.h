// What a loaded Model holds, shared by the loader (model.cc) and the forward pass (context.cc).
#pragma once

#include <memory>
#include <vector>

#include "argus/gguf.h"
#include "argus/model.h"
#include "model/matmul.h"

namespace argus {

namespace model {

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
  uint64_t weight_bytes = 0;
};

}  // namespace argus
