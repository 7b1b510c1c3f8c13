// The forward pass of Llama and Qwen2 over a chunk of tokens, with every K/V row stored in a
// KvCache and attention computed by the AttentionEngine over its pages.
//
// Per layer, for a chunk of B tokens at positions p0 .. p0+B-1:
//   h = RMSNorm(x) * attn_norm;  q, k, v = h Wq, h Wk, h Wv (+ biases for Qwen2);  RoPE(q, k)
//   cache.Append(k, v);  a = attention(q) over the cache;  x += a Wo
//   h = RMSNorm(x) * ffn_norm;  x += (SiLU(h Wgate) * h Wup) Wdown
// then logits = RMSNorm(x) * output_norm Wout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "argus/core.h"
#include "argus/model.h"
#include "core/measure.h"
#include "model/model_internal.h"
#include "model/remote_prefix.h"

namespace argus {

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

}  // namespace

struct Context::Impl {
  const ModelImpl& m;
  ContextOptions options;
  ThreadPool pool;
  AttentionEngine engine;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<PlacementEngine> placement;  // optional; destroyed before the cache and pool
  SeqId seq = 0;
  uint32_t n_past = 0;
  // Tokens [0, n_exact) have the K/V a canonical computation gives: a chunk attended with an
  // epsilon, window, sinks, custom scale or over pages not in their full codecs lowers it to
  // the chunk's first position (its later layers' K/V differ). Prefix pages past it are not
  // stored: a prompt cache must serve only what an exact run computes.
  uint32_t n_exact = UINT32_MAX;
  std::vector<float> inv_freq;  // [head_dim / 2]: theta = position * inv_freq[i]
  model::MatMulScratch scratch;
  // Activations of one chunk, [n_batch, width] each.
  std::vector<float> x, h, q, k, v, attn, ffn_gate, ffn_up, rope_cos, rope_sin, logits;
  AttentionStats attention_stats;
  TimeSplit times;
  RemotePrefixStats remote_stats;

  Impl(const ModelImpl& model, const ContextOptions& o)
      : m(model), options(o), pool(o.n_threads), engine(pool) {}

  const ModelConfig& config() const { return m.config; }

  void MatMul(const model::WeightMatrix& w, const float* in, uint32_t n, float* out) {
    const auto t0 = Clock::now();
    model::MatMul(w, in, n, out, pool, scratch);
    times.matmul_s += Seconds(t0);
  }

  void PrepareRope(uint32_t n) {
    const uint32_t half = config().head_dim / 2;
    for (uint32_t t = 0; t < n; ++t) {
      const double position = n_past + t;
      for (uint32_t i = 0; i < half; ++i) {
        const double theta = position * inv_freq[i];
        rope_cos[t * half + i] = static_cast<float>(std::cos(theta));
        rope_sin[t * half + i] = static_cast<float>(std::sin(theta));
      }
    }
  }

  // Rotates each head of rows: [n, n_heads, head_dim] by its token's angles.
  void Rope(float* rows, uint32_t n, uint32_t n_heads) const {
    const uint32_t d = config().head_dim, half = d / 2;
    // Llama GGUF files rotate adjacent pairs; NeoX (Qwen2) rotates x[i] with x[i + d/2].
    const uint32_t stride = config().rope_neox ? 1 : 2, partner = config().rope_neox ? half : 1;
    for (uint32_t t = 0; t < n; ++t) {
      const float* cos = &rope_cos[t * half];
      const float* sin = &rope_sin[t * half];
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

  Status Attention(uint32_t layer, uint32_t n) {
    const auto t0 = Clock::now();
    const uint32_t kv_dim = config().n_kv_heads * config().head_dim;
    if (options.qkv_observer) options.qkv_observer(layer, n_past, n, q.data(), k.data(), v.data());
    ARGUS_RETURN_IF_ERROR(
        Append(layer, {k.data(), size_t{n} * kv_dim}, {v.data(), size_t{n} * kv_dim}));
    Result<AttentionStats> stats = Attend(layer, n);
    if (!stats.ok()) return stats.status();
    if (!AttendedCanonically(layer)) n_exact = std::min(n_exact, n_past);
    attention_stats += *stats;
    times.attention_s += Seconds(t0);
    return Status::Ok();
  }

  // Attention of the chunk's n queries (decode for one) over the cache: q -> attn.
  Result<AttentionStats> Attend(uint32_t layer, uint32_t n) {
    if (placement) {
      return n > 1 ? placement->Prefill(layer, q.data(), n, attn.data())
                   : placement->Decode(layer, q.data(), attn.data());
    }
    return n > 1 ? engine.Prefill(*cache, seq, layer, q.data(), n, attn.data(), options.attention)
                 : engine.Decode(*cache, seq, layer, q.data(), attn.data(), options.attention);
  }

  // Whether the last attention call of the layer was the canonical one: exact softmax over every
  // position, each page in the cache's full codecs (inactive, the placement engine's calls are
  // the cache's own).
  bool AttendedCanonically(uint32_t layer) const {
    const AttentionOptions& a = options.attention;
    if (a.window != 0 || a.sinks != 0 || a.scale != 0 || a.epsilon != 0) return false;
    if (!placement || !placement->active()) return true;
    if (options.placement->profile.epsilon != 0) return false;
    Result<std::vector<PageView>> pages = cache->Pages(seq, layer);
    if (!pages.ok()) return false;
    return std::all_of(pages->begin(), pages->end(), [&](const PageView& p) {
      return p.k_codec->info().name == options.k_codec && p.v_codec->info().name == options.v_codec;
    });
  }

  Status Append(uint32_t layer, std::span<const float> k_rows, std::span<const float> v_rows) {
    return placement ? placement->Append(layer, k_rows, v_rows)
                     : cache->Append(seq, layer, k_rows, v_rows);
  }

  // Drops everything after the first n_tokens (through the placement engine, which makes room
  // for the pages a crop re-opens). n_past follows even when the crop fails.
  Status Crop(uint32_t n_tokens) {
    n_past = n_tokens;
    if (n_exact >= n_tokens) n_exact = UINT32_MAX;  // nothing computed inexactly remains
    return placement ? placement->Crop(n_tokens) : cache->Crop(seq, n_tokens);
  }

  Status BeginRequest() {
    if (!placement) return Status::Ok();
    return placement->BeginRequest(
        seq, options.expected_tokens ? options.expected_tokens : options.n_ctx);
  }

  Status Layer(uint32_t l, uint32_t n) {
    const ModelConfig& c = config();
    const model::LayerWeights& w = m.layers[l];
    const uint32_t e = c.n_embd;
    for (uint32_t t = 0; t < n; ++t) {
      RmsNorm(&x[size_t{t} * e], w.attn_norm.data(), e, c.rms_eps, &h[size_t{t} * e]);
    }
    MatMul(w.q, h.data(), n, q.data());
    MatMul(w.k, h.data(), n, k.data());
    MatMul(w.v, h.data(), n, v.data());
    AddBias(q.data(), w.q_bias, n);
    AddBias(k.data(), w.k_bias, n);
    AddBias(v.data(), w.v_bias, n);
    Rope(q.data(), n, c.n_heads);
    Rope(k.data(), n, c.n_kv_heads);
    ARGUS_RETURN_IF_ERROR(Attention(l, n));
    MatMul(w.o, attn.data(), n, h.data());
    for (size_t i = 0; i < size_t{n} * e; ++i) x[i] += h[i];

    for (uint32_t t = 0; t < n; ++t) {
      RmsNorm(&x[size_t{t} * e], w.ffn_norm.data(), e, c.rms_eps, &h[size_t{t} * e]);
    }
    MatMul(w.gate, h.data(), n, ffn_gate.data());
    MatMul(w.up, h.data(), n, ffn_up.data());
    for (size_t i = 0; i < size_t{n} * c.n_ff; ++i) {
      const float g = ffn_gate[i];
      ffn_gate[i] = g / (1.0f + std::exp(-g)) * ffn_up[i];
    }
    MatMul(w.down, ffn_gate.data(), n, h.data());
    for (size_t i = 0; i < size_t{n} * e; ++i) x[i] += h[i];
    return Status::Ok();
  }

  // Runs one chunk; the logits of its last n_out tokens (0, 1 or n) go to out.
  Status Chunk(const int32_t* tokens, uint32_t n, uint32_t n_out, float* out) {
    const ModelConfig& c = config();
    const uint32_t e = c.n_embd;
    for (uint32_t t = 0; t < n; ++t) {
      model::DequantizeRow(m.token_embd, static_cast<uint32_t>(tokens[t]), &x[size_t{t} * e]);
    }
    PrepareRope(n);
    for (uint32_t l = 0; l < c.n_layers; ++l) ARGUS_RETURN_IF_ERROR(Layer(l, n));
    if (placement) ARGUS_RETURN_IF_ERROR(placement->EndStep());
    n_past += n;
    if (n_out == 0) return Status::Ok();
    const uint32_t first = n - n_out;
    for (uint32_t t = 0; t < n_out; ++t) {
      RmsNorm(&x[size_t{first + t} * e], m.output_norm.data(), e, c.rms_eps, &h[size_t{t} * e]);
    }
    MatMul(m.output, h.data(), n_out, out);
    // Sampling from non-finite logits would print a token as if nothing were wrong.
    const float* begin = out;
    const float* end = out + size_t{n_out} * c.n_vocab;
    if (const float* bad =
            std::find_if_not(begin, end, [](float value) { return std::isfinite(value); });
        bad != end) {
      const size_t i = static_cast<size_t>(bad - out);
      return Status::InvalidArgument(
          "the logits of position " + std::to_string(n_past - n_out + i / c.n_vocab) +
          " are not finite (token " + std::to_string(i % c.n_vocab) + ")");
    }
    return Status::Ok();
  }
};

Context::Context() = default;
Context::~Context() = default;

Result<std::unique_ptr<Context>> Context::Create(const Model& model,
                                                 const ContextOptions& options) {
  const ModelConfig& c = model.config();
  ContextOptions o = options;
  if (o.n_ctx == 0) o.n_ctx = c.n_ctx_train;
  if (o.n_batch == 0) return Status::InvalidArgument("n_batch must be at least 1");
  ARGUS_RETURN_IF_ERROR(CheckThreadCount(o.n_threads, "context"));
  CacheOptions cache_options;
  cache_options.geometry = c.geometry();
  cache_options.page_tokens = o.page_tokens;
  if (o.placement) {
    const LadderState& best = o.placement->profile.ladder.at(0);
    if (o.k_codec != best.k_codec || o.v_codec != best.v_codec) {
      return Status::InvalidArgument(
          "KV codecs " + o.k_codec + "/" + o.v_codec + " differ from " + best.k_codec + "/" +
          best.v_codec + ", the best state of profile '" + o.placement->profile.name + "'");
    }
    if (o.attention.window || o.attention.sinks || o.attention.scale != 0 ||
        o.attention.epsilon != 0) {
      return Status::InvalidArgument(
          "a context with a placement engine attends with its profile's epsilon and without a "
          "window, sinks or a custom scale");
    }
  }
  cache_options.k_codec = o.k_codec;
  cache_options.v_codec = o.v_codec;
  cache_options.active_codec = o.active_codec;
  cache_options.disk = o.disk;
  if (o.ram_budget_bytes == 0) {
    ARGUS_ASSIGN_OR_RETURN(o.ram_budget_bytes, KvCache::RequiredRamBytes(cache_options, o.n_ctx));
  }
  cache_options.ram_budget_bytes = o.ram_budget_bytes;

  std::unique_ptr<Context> context(new Context());
  context->impl_ = std::make_unique<Impl>(ModelAccess::Of(model), o);
  Impl& s = *context->impl_;
  ARGUS_ASSIGN_OR_RETURN(s.cache, KvCache::Create(cache_options));
  ARGUS_ASSIGN_OR_RETURN(s.seq, s.cache->CreateSequence());
  if (o.placement) {
    ARGUS_ASSIGN_OR_RETURN(s.placement, PlacementEngine::Create(*s.cache, s.pool, *o.placement));
    ARGUS_RETURN_IF_ERROR(s.BeginRequest());
  }

  const uint32_t half = c.head_dim / 2;
  s.inv_freq.resize(half);
  const std::vector<float>& factors = ModelAccess::Of(model).rope_freq_factors;
  for (uint32_t i = 0; i < half; ++i) {
    const double freq = std::pow(double{c.rope_theta}, -2.0 * i / c.head_dim);
    s.inv_freq[i] = static_cast<float>(freq / (factors.empty() ? 1.0 : factors[i]));
  }
  const size_t b = o.n_batch, q_dim = size_t{c.n_heads} * c.head_dim;
  s.x.resize(b * c.n_embd);
  s.h.resize(b * std::max<size_t>(c.n_embd, q_dim));
  s.q.resize(b * q_dim);
  s.k.resize(b * c.n_kv_heads * c.head_dim);
  s.v.resize(s.k.size());
  s.attn.resize(b * q_dim);
  s.ffn_gate.resize(b * c.n_ff);
  s.ffn_up.resize(b * c.n_ff);
  s.rope_cos.resize(b * half);
  s.rope_sin.resize(b * half);
  // The quantised activations of the widest input, reserved now so no product allocates.
  const uint32_t widest = std::max({c.n_embd, c.n_ff, c.n_heads * c.head_dim});
  if (s.scratch.Reserve(b * model::QuantizedRowBytes((widest + 31) / 32 * 32)) == nullptr) {
    return Status::ResourceExhausted("activation scratch for a batch of " + std::to_string(b));
  }
  return context;
}

Result<std::span<const float>> Context::Eval(std::span<const int32_t> tokens, bool all_logits) {
  Impl& s = *impl_;
  const ModelConfig& c = s.config();
  if (tokens.empty()) return Status::InvalidArgument("Eval needs at least one token");
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= c.n_vocab) {
      return Status::InvalidArgument("token id " + std::to_string(t) +
                                     " is outside the vocabulary of " + std::to_string(c.n_vocab));
    }
  }
  if (tokens.size() > s.options.n_ctx - s.n_past) {
    return Status::InvalidArgument(std::to_string(tokens.size()) + " tokens after " +
                                   std::to_string(s.n_past) + " exceed the context of " +
                                   std::to_string(s.options.n_ctx));
  }
  const auto t0 = Clock::now();
  const TimeSplit before = s.times;
  const uint32_t n_past_before = s.n_past;
  const uint32_t n_out = all_logits ? static_cast<uint32_t>(tokens.size()) : 1;
  s.logits.resize(size_t{n_out} * c.n_vocab);
  s.attention_stats = {};
  for (size_t first = 0; first < tokens.size(); first += s.options.n_batch) {
    const uint32_t n =
        static_cast<uint32_t>(std::min<size_t>(s.options.n_batch, tokens.size() - first));
    const bool last_chunk = first + n == tokens.size();
    const uint32_t n_chunk_out = all_logits ? n : (last_chunk ? 1 : 0);
    float* out = all_logits ? &s.logits[first * c.n_vocab] : s.logits.data();
    Status status = s.Chunk(tokens.data() + first, n, n_chunk_out, out);
    if (!status.ok()) {
      // All or nothing: the cache drops whatever this call appended to any layer.
      Status crop = s.Crop(n_past_before);
      if (!crop.ok())
        return Status::Internal(status.message() + "; rollback failed: " + crop.message());
      return status;
    }
  }
  const double total = Seconds(t0);
  s.times.other_s +=
      total - (s.times.matmul_s - before.matmul_s) - (s.times.attention_s - before.attention_s);
  s.times.n_tokens += tokens.size();
  return std::span<const float>(s.logits);
}

uint32_t Context::n_past() const { return impl_->n_past; }

Result<uint32_t> Context::LoadPrefix(std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  if (s.n_past != 0) return Status::InvalidArgument("prefix pages load into an empty context");
  tokens = tokens.first(std::min<size_t>(tokens.size(), s.options.n_ctx));
  model::RemoteFetch fetch;
  if (s.options.remote != nullptr && s.options.disk != nullptr) {
    fetch = model::FetchRemotePrefix(*s.cache, *s.options.disk, *s.options.remote,
                                     s.m.fingerprint(), tokens);
    s.remote_stats.n_pages_fetched += fetch.n_pages;
  }
  ARGUS_ASSIGN_OR_RETURN(uint32_t n, s.cache->LoadPrefix(s.seq, s.m.fingerprint(), tokens));
  const size_t page = s.cache->page_tokens();
  s.remote_stats.n_tokens_loaded = static_cast<uint32_t>(
      std::min<size_t>(n, fetch.end_page * page) - std::min<size_t>(n, fetch.first_page * page));
  s.n_past = n;
  return n;
}

Status Context::StorePrefix(std::span<const int32_t> tokens, PrefixStoreStats& stats) {
  Impl& s = *impl_;
  tokens = tokens.first(std::min<size_t>(tokens.size(), s.n_past));
  ARGUS_RETURN_IF_ERROR(s.cache->StorePrefix(s.seq, s.m.fingerprint(), tokens, s.n_exact, stats));
  // Only pages the local store holds, which are exact ones, go to the shared tier.
  if (s.options.remote != nullptr && s.options.disk != nullptr) {
    s.remote_stats.n_pages_stored += model::StoreRemotePrefix(
        *s.cache, *s.options.disk, *s.options.remote, s.m.fingerprint(), tokens);
  }
  return Status::Ok();
}

const RemotePrefixStats& Context::remote_prefix_stats() const { return impl_->remote_stats; }

Status Context::AppendSyntheticContext(uint32_t n_tokens, uint64_t seed) {
  Impl& s = *impl_;
  const ModelConfig& c = s.config();
  if (n_tokens > s.options.n_ctx - s.n_past) {
    return Status::InvalidArgument(std::to_string(n_tokens) + " synthetic tokens after " +
                                   std::to_string(s.n_past) + " exceed the context of " +
                                   std::to_string(s.options.n_ctx));
  }
  constexpr uint32_t kChunk = 256;
  const size_t row = size_t{c.n_kv_heads} * c.head_dim;
  std::vector<float> k(kChunk * row), v(kChunk * row);
  // Uniform with unit variance: the codecs' speed does not depend on the distribution.
  const float amplitude = std::sqrt(3.0f);
  uint64_t index = 0;
  const uint32_t n_past_before = s.n_past;
  s.n_exact = std::min(s.n_exact, s.n_past);  // noise, not any token's K/V
  for (uint32_t first = 0; first < n_tokens; first += kChunk) {
    const uint32_t n = std::min(kChunk, n_tokens - first);
    for (uint32_t l = 0; l < c.n_layers; ++l) {
      for (size_t i = 0; i < n * row; ++i) {
        k[i] = amplitude * model::UnitNoise(seed, index++);
        v[i] = amplitude * model::UnitNoise(seed, index++);
      }
      Status status = s.Append(l, {k.data(), n * row}, {v.data(), n * row});
      if (!status.ok()) {  // all or nothing, as Eval
        ARGUS_RETURN_IF_ERROR(s.Crop(n_past_before));
        return status;
      }
    }
    s.n_past += n;
  }
  return Status::Ok();
}

Status Context::Truncate(uint32_t n_tokens) {
  Impl& s = *impl_;
  if (n_tokens > s.n_past) {
    return Status::InvalidArgument("cannot truncate " + std::to_string(s.n_past) + " tokens to " +
                                   std::to_string(n_tokens));
  }
  const bool used = s.n_past > 0;
  ARGUS_RETURN_IF_ERROR(s.Crop(n_tokens));
  return n_tokens == 0 && used ? s.BeginRequest() : Status::Ok();
}

const KvCache& Context::cache() const { return *impl_->cache; }
std::optional<PlacementStats> Context::placement_stats() const {
  if (!impl_->placement) return std::nullopt;
  return impl_->placement->stats();
}
const AttentionStats& Context::last_attention_stats() const { return impl_->attention_stats; }
const TimeSplit& Context::times() const { return impl_->times; }
void Context::ResetTimes() { impl_->times = {}; }

}  // namespace argus
