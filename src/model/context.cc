// A single sequence's inference context: the forward pass (model/forward.h) over a KvCache of its
// own, optionally under a placement engine, with prefix pages in a disk and a remote tier.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "argus/core.h"
#include "argus/model.h"
#include "core/measure.h"
#include "model/forward.h"
#include "model/model_internal.h"
#include "model/remote_prefix.h"

namespace argus {

struct Context::Impl {
  const ModelImpl& m;
  ContextOptions options;
  ThreadPool pool;
  AttentionEngine engine;
  model::Forward forward;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<PlacementEngine> placement;  // optional; destroyed before the cache and pool
  SeqId seq = 0;
  uint32_t n_past = 0;
  // Tokens [0, n_exact) have the K/V a canonical computation gives: a chunk attended with an
  // epsilon, window, sinks, custom scale or over pages not in their full codecs lowers it to
  // the chunk's first position (its later layers' K/V differ). Prefix pages past it are not
  // stored: a prompt cache must serve only what an exact run computes.
  uint32_t n_exact = UINT32_MAX;
  std::vector<float> logits;
  std::vector<uint32_t> out_rows;
  AttentionStats attention_stats;
  RemotePrefixStats remote_stats;

  Impl(const ModelImpl& model, const ContextOptions& o)
      : m(model), options(o), pool(o.n_threads), engine(pool), forward(model, pool) {}

  const ModelConfig& config() const { return m.config; }

  // The chunk's K/V into the cache and its n queries' attention (decode for one) over it.
  Status Attention(uint32_t layer, uint32_t n) {
    const uint32_t kv_dim = config().n_kv_heads * config().head_dim;
    const float* q = forward.q_rows(0);
    const float* k = forward.k_rows(0);
    const float* v = forward.v_rows(0);
    if (options.qkv_observer) options.qkv_observer(layer, n_past, n, q, k, v);
    ARGUS_RETURN_IF_ERROR(Append(layer, {k, size_t{n} * kv_dim}, {v, size_t{n} * kv_dim}));
    Result<AttentionStats> stats = Attend(layer, q, n, forward.attn_rows(0));
    if (!stats.ok()) return stats.status();
    if (!model::AttendedCanonically(options.attention, placement.get(), *cache, seq, layer))
      n_exact = std::min(n_exact, n_past);
    attention_stats += *stats;
    return Status::Ok();
  }

  Result<AttentionStats> Attend(uint32_t layer, const float* q, uint32_t n, float* out) {
    if (placement) {
      return n > 1 ? placement->Prefill(layer, q, n, out) : placement->Decode(layer, q, out);
    }
    return n > 1 ? engine.Prefill(*cache, seq, layer, q, n, out, options.attention)
                 : engine.Decode(*cache, seq, layer, q, out, options.attention);
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

  // Runs one chunk; the logits of its last n_out tokens (0, 1 or n) go to out.
  Status Chunk(const int32_t* tokens, uint32_t n, uint32_t n_out, float* out) {
    const model::Segment segment{seq, n_past, n};
    out_rows.resize(n_out);
    std::iota(out_rows.begin(), out_rows.end(), n - n_out);
    ARGUS_RETURN_IF_ERROR(forward.Run(
        {&segment, 1}, tokens, out_rows, out,
        [&](uint32_t layer, const model::Segment&, uint32_t) { return Attention(layer, n); }));
    if (placement) ARGUS_RETURN_IF_ERROR(placement->EndStep());
    n_past += n;
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
  if (o.placement) {
    ARGUS_RETURN_IF_ERROR(
        model::CheckPlacementOptions(o.k_codec, o.v_codec, o.attention, *o.placement));
  }
  ARGUS_ASSIGN_OR_RETURN(CacheOptions cache_options,
                         model::ContextCacheOptions(c, o.page_tokens, o.k_codec, o.v_codec,
                                                    o.active_codec, o.ram_budget_bytes, o.n_ctx));
  cache_options.disk = o.disk;
  o.ram_budget_bytes = cache_options.ram_budget_bytes;

  std::unique_ptr<Context> context(new Context());
  context->impl_ = std::make_unique<Impl>(ModelAccess::Of(model), o);
  Impl& s = *context->impl_;
  ARGUS_ASSIGN_OR_RETURN(s.cache, KvCache::Create(cache_options));
  ARGUS_ASSIGN_OR_RETURN(s.seq, s.cache->CreateSequence());
  if (o.placement) {
    ARGUS_ASSIGN_OR_RETURN(s.placement, PlacementEngine::Create(*s.cache, s.pool, *o.placement));
    ARGUS_RETURN_IF_ERROR(s.BeginRequest());
  }

  ARGUS_RETURN_IF_ERROR(s.forward.Reserve(o.n_batch));
  return context;
}

Result<std::span<const float>> Context::Eval(std::span<const int32_t> tokens, bool all_logits) {
  Impl& s = *impl_;
  const ModelConfig& c = s.config();
  if (tokens.empty()) return Status::InvalidArgument("Eval needs at least one token");
  ARGUS_RETURN_IF_ERROR(model::CheckTokens(tokens, c.n_vocab));
  if (tokens.size() > s.options.n_ctx - s.n_past) {
    return Status::InvalidArgument(std::to_string(tokens.size()) + " tokens after " +
                                   std::to_string(s.n_past) + " exceed the context of " +
                                   std::to_string(s.options.n_ctx));
  }
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
const TimeSplit& Context::times() const { return impl_->forward.times(); }
void Context::ResetTimes() { impl_->forward.times() = {}; }

}  // namespace argus
