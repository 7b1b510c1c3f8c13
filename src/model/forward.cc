#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/measure.h"
#include "model/activation.h"

namespace argus::model {

namespace {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]
void RmsNorm(const float* x, const float* w, uint32_t n, float eps, float* out) {
  double sum_sq = 0;
  for (uint32_t i = 0; i < n; ++i) sum_sq += double{x[i]} * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / n + eps));
  for (uint32_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void AddBias(float* x, const std::vector<float>& bias, uint32_t n_rows) {
  if (bias.empty()) return;
  const size_t n = bias.size();
  for (uint32_t r = 0; r < n_rows; ++r) {
    for (size_t i = 0; i < n; ++i) x[r * n + i] += bias[i];
  }
}

uint32_t RowsOf(std::span<const Segment> segments) {
  uint32_t n = 0;
  for (const Segment& s : segments) n += s.n;
  return n;
}

}  // namespace

Result<CacheOptions> ContextCacheOptions(const ModelConfig& config, uint32_t page_tokens,
                                         const std::string& k_codec, const std::string& v_codec,
                                         const std::string& active_codec, size_t ram_budget_bytes,
                                         uint32_t n_ctx) {
  CacheOptions o;
  o.geometry = config.geometry();
  o.page_tokens = page_tokens;
  o.k_codec = k_codec;
  o.v_codec = v_codec;
  o.active_codec = active_codec;
  o.ram_budget_bytes = ram_budget_bytes;
  if (o.ram_budget_bytes == 0) {
    ARGUS_ASSIGN_OR_RETURN(o.ram_budget_bytes, KvCache::RequiredRamBytes(o, n_ctx));
  }
  return o;
}

Status CheckPlacementOptions(const std::string& k_codec, const std::string& v_codec,
                             const AttentionOptions& attention, const PlacementOptions& placement) {
  const LadderState& best = placement.profile.ladder.at(0);
  if (k_codec != best.k_codec || v_codec != best.v_codec) {
    return Status::InvalidArgument("KV codecs " + k_codec + "/" + v_codec + " differ from " +
                                   best.k_codec + "/" + best.v_codec +
                                   ", the best state of profile '" + placement.profile.name + "'");
  }
  if (attention.window || attention.sinks || attention.scale != 0 || attention.epsilon != 0) {
    return Status::InvalidArgument(
        "a context with a placement engine attends with its profile's epsilon and without a "
        "window, sinks or a custom scale");
  }
  return Status::Ok();
}

bool AttendedCanonically(const AttentionOptions& attention, const PlacementEngine* placement,
                         const KvCache& cache, SeqId seq, uint32_t layer) {
  if (attention.window != 0 || attention.sinks != 0 || attention.scale != 0 ||
      attention.epsilon != 0)
    return false;
  if (placement == nullptr || !placement->active()) return true;
  if (placement->profile().epsilon != 0) return false;
  Result<std::vector<PageView>> pages = cache.Pages(seq, layer);
  if (!pages.ok()) return false;
  const CacheOptions& full = cache.options();
  return std::all_of(pages->begin(), pages->end(), [&](const PageView& p) {
    return p.k_codec->info().name == full.k_codec && p.v_codec->info().name == full.v_codec;
  });
}

Status CheckTokens(std::span<const int32_t> tokens, uint32_t n_vocab) {
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= n_vocab) {
      return Status::InvalidArgument("token id " + std::to_string(t) +
                                     " is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  return Status::Ok();
}

Forward::Forward(const ModelImpl& model, ThreadPool& pool)
    : m_(model), c_(model.config), pool_(pool) {
  const uint32_t half = c_.head_dim / 2;
  inv_freq_.resize(half);
  const std::vector<float>& factors = model.rope_freq_factors;
  for (uint32_t i = 0; i < half; ++i) {
    const double freq = std::pow(double{c_.rope_theta}, -2.0 * i / c_.head_dim);
    inv_freq_[i] = static_cast<float>(freq / (factors.empty() ? 1.0 : factors[i]));
  }
}

Status Forward::Reserve(uint32_t n_rows) {
  const size_t b = n_rows, q_dim = size_t{c_.n_heads} * c_.head_dim, half = c_.head_dim / 2;
  x_.resize(b * c_.n_embd);
  h_.resize(b * std::max<size_t>(c_.n_embd, q_dim));
  q_.resize(b * q_dim);
  k_.resize(b * c_.n_kv_heads * c_.head_dim);
  v_.resize(k_.size());
  attn_.resize(b * q_dim);
  ffn_gate_.resize(b * c_.n_ff);
  ffn_up_.resize(b * c_.n_ff);
  rope_cos_.resize(b * half);
  rope_sin_.resize(b * half);
  // The quantised activations of the widest input, reserved now so no product allocates.
  const uint32_t widest = std::max({c_.n_embd, c_.n_ff, c_.n_heads * c_.head_dim});
  if (scratch_.Reserve(MatMulScratchBytes(n_rows, (widest + 31) / 32 * 32)) == nullptr) {
    return Status::ResourceExhausted("activation scratch for a batch of " + std::to_string(b));
  }
  capacity_ = n_rows;
  return Status::Ok();
}

const float* Forward::q_rows(uint32_t row) const {
  return &q_[size_t{row} * c_.n_heads * c_.head_dim];
}
const float* Forward::k_rows(uint32_t row) const {
  return &k_[size_t{row} * c_.n_kv_heads * c_.head_dim];
}
const float* Forward::v_rows(uint32_t row) const {
  return &v_[size_t{row} * c_.n_kv_heads * c_.head_dim];
}
float* Forward::attn_rows(uint32_t row) { return &attn_[size_t{row} * c_.n_heads * c_.head_dim]; }

void Forward::MatMul(const WeightMatrix& w, const float* in, uint32_t n, float* out) {
  const auto t0 = Clock::now();
  model::MatMul(w, in, n, out, pool_, scratch_);
  times_.matmul_s += Seconds(t0);
}

void Forward::PrepareRope(std::span<const Segment> segments) {
  const uint32_t half = c_.head_dim / 2;
  size_t row = 0;
  for (const Segment& s : segments) {
    for (uint32_t t = 0; t < s.n; ++t, ++row) {
      const double position = s.first + t;
      for (uint32_t i = 0; i < half; ++i) {
        const double theta = position * inv_freq_[i];
        rope_cos_[row * half + i] = static_cast<float>(std::cos(theta));
        rope_sin_[row * half + i] = static_cast<float>(std::sin(theta));
      }
    }
  }
}

// Rotates each head of rows: [n, n_heads, head_dim] by its token's angles.
void Forward::Rope(float* rows, uint32_t n, uint32_t n_heads) const {
  const uint32_t d = c_.head_dim, half = d / 2;
  // Llama GGUF files rotate adjacent pairs; NeoX (Qwen2) rotates x[i] with x[i + d/2].
  const uint32_t stride = c_.rope_neox ? 1 : 2, partner = c_.rope_neox ? half : 1;
  for (uint32_t t = 0; t < n; ++t) {
    const float* cos = &rope_cos_[t * half];
    const float* sin = &rope_sin_[t * half];
    for (uint32_t hd = 0; hd < n_heads; ++hd) {
      float* row = rows + (size_t{t} * n_heads + hd) * d;
      for (uint32_t i = 0; i < half; ++i) {
        float& a = row[i * stride];
        float& b = row[i * stride + partner];
        const float x0 = a, x1 = b;
        a = x0 * cos[i] - x1 * sin[i];
        b = x0 * sin[i] + x1 * cos[i];
      }
    }
  }
}

// Elementwise, so the rows of a batch split over the pool give the values of one call.
void Forward::Gate(uint32_t n) {
  const size_t width = c_.n_ff;
  pool_.ParallelFor(n, 1, [&](size_t, size_t begin, size_t end) {
    SiluMul(BestKernelPath(), &ffn_gate_[begin * width], &ffn_up_[begin * width],
            (end - begin) * width);
  });
}

Status Forward::Layer(uint32_t l, std::span<const Segment> segments, uint32_t n,
                      const Attend& attend) {
  const LayerWeights& w = m_.layers[l];
  const uint32_t e = c_.n_embd;
  for (uint32_t t = 0; t < n; ++t) {
    RmsNorm(&x_[size_t{t} * e], w.attn_norm.data(), e, c_.rms_eps, &h_[size_t{t} * e]);
  }
  MatMul(w.q, h_.data(), n, q_.data());
  MatMul(w.k, h_.data(), n, k_.data());
  MatMul(w.v, h_.data(), n, v_.data());
  AddBias(q_.data(), w.q_bias, n);
  AddBias(k_.data(), w.k_bias, n);
  AddBias(v_.data(), w.v_bias, n);
  Rope(q_.data(), n, c_.n_heads);
  Rope(k_.data(), n, c_.n_kv_heads);
  const auto t0 = Clock::now();
  uint32_t row = 0;
  for (const Segment& s : segments) {
    ARGUS_RETURN_IF_ERROR(attend(l, s, row));
    row += s.n;
  }
  times_.attention_s += Seconds(t0);
  MatMul(w.o, attn_.data(), n, h_.data());
  for (size_t i = 0; i < size_t{n} * e; ++i) x_[i] += h_[i];

  for (uint32_t t = 0; t < n; ++t) {
    RmsNorm(&x_[size_t{t} * e], w.ffn_norm.data(), e, c_.rms_eps, &h_[size_t{t} * e]);
  }
  MatMul(w.gate, h_.data(), n, ffn_gate_.data());
  MatMul(w.up, h_.data(), n, ffn_up_.data());
  Gate(n);
  MatMul(w.down, ffn_gate_.data(), n, h_.data());
  for (size_t i = 0; i < size_t{n} * e; ++i) x_[i] += h_[i];
  return Status::Ok();
}

Status Forward::Logits(std::span<const Segment> segments, std::span<const uint32_t> out_rows,
                       float* out) {
  const uint32_t e = c_.n_embd;
  const uint32_t n_out = static_cast<uint32_t>(out_rows.size());
  for (uint32_t t = 0; t < n_out; ++t) {
    RmsNorm(&x_[size_t{out_rows[t]} * e], m_.output_norm.data(), e, c_.rms_eps, &h_[size_t{t} * e]);
  }
  MatMul(m_.output, h_.data(), n_out, out);
  // Sampling from non-finite logits would print a token as if nothing were wrong.
  const float* begin = out;
  const float* end = begin + size_t{n_out} * c_.n_vocab;
  const float* bad = std::find_if_not(begin, end, [](float value) { return std::isfinite(value); });
  if (bad == end) return Status::Ok();
  const size_t i = static_cast<size_t>(bad - begin);
  uint32_t row = out_rows[i / c_.n_vocab];
  uint32_t position = 0;
  for (const Segment& s : segments) {
    if (row < s.n) {
      position = s.first + row;
      break;
    }
    row -= s.n;
  }
  return Status::InvalidArgument("the logits of position " + std::to_string(position) +
                                 " are not finite (token " + std::to_string(i % c_.n_vocab) + ")");
}

Status Forward::Run(std::span<const Segment> segments, const int32_t* tokens,
                    std::span<const uint32_t> out_rows, float* out, const Attend& attend) {
  const auto t0 = Clock::now();
  const TimeSplit before = times_;
  const uint32_t n = RowsOf(segments);
  for (uint32_t t = 0; t < n; ++t) {
    DequantizeRow(m_.token_embd, static_cast<uint32_t>(tokens[t]), &x_[size_t{t} * c_.n_embd]);
  }
  PrepareRope(segments);
  Status status = Status::Ok();
  for (uint32_t l = 0; l < c_.n_layers && status.ok(); ++l) {
    status = Layer(l, segments, n, attend);
  }
  if (status.ok() && !out_rows.empty()) status = Logits(segments, out_rows, out);
  times_.other_s +=
      Seconds(t0) - (times_.matmul_s - before.matmul_s) - (times_.attention_s - before.attention_s);
  if (status.ok()) times_.n_tokens += n;
  return status;
}

}  // namespace argus::model
