// The forward pass of Llama and Qwen2 over one step's rows, which may belong to several
// sequences: every weight matrix is read once for all rows, and each sequence's rows attend over
// its own pages through the caller (a Context's cache or placement engine, a BatchContext's
// shared cache).
//
// Per layer, for the step's rows at their own positions:
//   h = RMSNorm(x) * attn_norm;  q, k, v = h Wq, h Wk, h Wv (+ biases for Qwen2);  RoPE(q, k)
//   per sequence: cache.Append(k, v);  a = attention(q) over its pages;  x += a Wo
//   h = RMSNorm(x) * ffn_norm;  x += (SiLU(h Wgate) * h Wup) Wdown
// then logits = RMSNorm(x) * output_norm Wout for the rows asked for.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "argus/core.h"
#include "argus/model.h"
#include "model/model_internal.h"

namespace argus::model {

// One sequence's rows in a step: n tokens at positions first .. first+n-1.
struct Segment {
  SeqId seq = 0;
  uint32_t first = 0;
  uint32_t n = 0;
};

// The KV cache of a context: the model's geometry, these codecs and page size, and a RAM budget
// (0: what one sequence of n_ctx tokens needs). The caller adds a disk tier.
Result<CacheOptions> ContextCacheOptions(const ModelConfig& config, uint32_t page_tokens,
                                         const std::string& k_codec, const std::string& v_codec,
                                         const std::string& active_codec, size_t ram_budget_bytes,
                                         uint32_t n_ctx);

// InvalidArgument unless a context under this placement holds full pages in the codecs of the
// profile's best state and leaves attention (window, sinks, scale, epsilon) to the profile.
Status CheckPlacementOptions(const std::string& k_codec, const std::string& v_codec,
                             const AttentionOptions& attention, const PlacementOptions& placement);

// Whether the attention just computed for seq's layer was the canonical one, whose K/V a prompt
// cache may store: exact softmax over every position (no window, sinks, custom scale or epsilon,
// the placement profile's included while its ladder is active) and every page in the cache's full
// codecs. `placement` may be null.
bool AttendedCanonically(const AttentionOptions& attention, const PlacementEngine* placement,
                         const KvCache& cache, SeqId seq, uint32_t layer);

// InvalidArgument naming the first token id outside the vocabulary.
Status CheckTokens(std::span<const int32_t> tokens, uint32_t n_vocab);

class Forward {
 public:
  Forward(const ModelImpl& model, ThreadPool& pool);

  // Activations for steps of up to n_rows rows; ResourceExhausted when they do not fit.
  Status Reserve(uint32_t n_rows);
  uint32_t capacity() const { return capacity_; }

  // A segment's attention in one layer: append its K/V rows (k_rows, v_rows from `row` on) to its
  // sequence and attend its q rows into attn_rows (also from `row` on).
  using Attend = std::function<Status(uint32_t layer, const Segment& segment, uint32_t row)>;

  // Evaluates `tokens` (one per row, the segments' rows in order; at most capacity() rows).
  // The logits of the rows in out_rows go to out ([out_rows.size(), n_vocab]); InvalidArgument
  // when any is not finite. On error the caller rolls its sequences back.
  Status Run(std::span<const Segment> segments, const int32_t* tokens,
             std::span<const uint32_t> out_rows, float* out, const Attend& attend);

  // The rows of the current layer, for Attend: [rows, n_heads | n_kv_heads, head_dim].
  const float* q_rows(uint32_t row) const;
  const float* k_rows(uint32_t row) const;
  const float* v_rows(uint32_t row) const;
  float* attn_rows(uint32_t row);

  // Where the time went (matmul: weight products; attention: the Attend calls; other: the rest
  // of Run), accumulated over calls.
  TimeSplit& times() { return times_; }
  const TimeSplit& times() const { return times_; }

 private:
  void MatMul(const WeightMatrix& w, const float* in, uint32_t n, float* out);
  void PrepareRope(std::span<const Segment> segments);
  void Rope(float* rows, uint32_t n, uint32_t n_heads) const;
  void Gate(uint32_t n);  // ffn_gate_ = silu(ffn_gate_) * ffn_up_, n rows
  Status Layer(uint32_t l, std::span<const Segment> segments, uint32_t n, const Attend& attend);
  Status Logits(std::span<const Segment> segments, std::span<const uint32_t> out_rows, float* out);

  const ModelImpl& m_;
  const ModelConfig& c_;
  ThreadPool& pool_;
  uint32_t capacity_ = 0;
  std::vector<float> inv_freq_;  // [head_dim / 2]: theta = position * inv_freq[i]
  MatMulScratch scratch_;
  // Activations of one step, [capacity, width] each.
  std::vector<float> x_, h_, q_, k_, v_, attn_, ffn_gate_, ffn_up_, rope_cos_, rope_sin_;
  TimeSplit times_;
};

}  // namespace argus::model
