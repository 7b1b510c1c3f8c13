// Many sequences in one KvCache, a step of several sequences' tokens in one forward pass.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "argus/core.h"
#include "argus/model.h"
#include "core/checked.h"
#include "model/forward.h"
#include "model/model_internal.h"

namespace argus {

struct BatchContext::Impl {
  const ModelImpl& m;
  BatchContextOptions options;
  ThreadPool pool;
  AttentionEngine engine;
  model::Forward forward;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<PlacementEngine> placement;  // optional; destroyed before the cache and pool
  // Each live sequence's tokens, and the first of them whose K/V a canonical computation may not
  // give (as Context's n_exact: prefix pages past it are not stored).
  struct SeqState {
    uint32_t length = 0;
    uint32_t n_exact = UINT32_MAX;
    void Cut(uint32_t n_tokens) {
      length = n_tokens;
      if (n_exact >= n_tokens) n_exact = UINT32_MAX;  // nothing computed inexactly remains
    }
  };
  std::unordered_map<SeqId, SeqState> seqs;
  std::vector<model::Segment> segments;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> out_rows;
  std::vector<float> logits;

  Impl(const ModelImpl& model, const BatchContextOptions& o)
      : m(model), options(o), pool(o.n_threads), engine(pool), forward(model, pool) {}

  Result<SeqState*> StateOf(SeqId seq) {
    auto it = seqs.find(seq);
    if (it == seqs.end()) return Status::NotFound("no sequence " + std::to_string(seq));
    return &it->second;
  }

  // NotFound for an unknown seq; InvalidArgument when it holds fewer than n_tokens.
  Status CheckHolds(SeqId seq, uint32_t n_tokens) {
    ARGUS_ASSIGN_OR_RETURN(const SeqState* state, StateOf(seq));
    if (n_tokens <= state->length) return Status::Ok();
    return Status::InvalidArgument("sequence " + std::to_string(seq) + " holds " +
                                   std::to_string(state->length) + " tokens, not " +
                                   std::to_string(n_tokens));
  }

  // One segment's layer: its K/V rows into its sequence, its queries over its pages.
  Status Attend(uint32_t layer, const model::Segment& s, uint32_t row) {
    const size_t kv = size_t{s.n} * m.config.n_kv_heads * m.config.head_dim;
    const std::span<const float> k{forward.k_rows(row), kv}, v{forward.v_rows(row), kv};
    ARGUS_RETURN_IF_ERROR(placement ? placement->Append(s.seq, layer, k, v)
                                    : cache->Append(s.seq, layer, k, v));
    const float* q = forward.q_rows(row);
    float* out = forward.attn_rows(row);
    Result<AttentionStats> stats =
        placement ? (s.n > 1 ? placement->Prefill(s.seq, layer, q, s.n, out)
                             : placement->Decode(s.seq, layer, q, out))
        : s.n > 1 ? engine.Prefill(*cache, s.seq, layer, q, s.n, out, options.attention)
                  : engine.Decode(*cache, s.seq, layer, q, out, options.attention);
    ARGUS_RETURN_IF_ERROR(stats.status());
    SeqState& state = seqs.at(s.seq);
    if (state.n_exact > s.first &&
        !model::AttendedCanonically(options.attention, placement.get(), *cache, s.seq, layer))
      state.n_exact = s.first;
    return Status::Ok();
  }

  // Through the placement engine when there is one: it drains its migrations first and makes
  // room for the pages a crop re-opens.
  Status Crop(SeqId seq, uint32_t n_tokens) {
    return placement ? placement->Crop(seq, n_tokens) : cache->Crop(seq, n_tokens);
  }
  Status ReleaseSequence(SeqId seq) {
    return placement ? placement->Release(seq) : cache->Release(seq);
  }
  Status Track(SeqId seq) { return placement ? placement->AddSequence(seq) : Status::Ok(); }

  // One forward pass over the gathered segments, and the engine's end of step.
  Status Run() {
    ARGUS_RETURN_IF_ERROR(forward.Run(segments, tokens.data(), out_rows, logits.data(),
                                      [&](uint32_t layer, const model::Segment& segment,
                                          uint32_t row) { return Attend(layer, segment, row); }));
    return placement ? placement->EndStep() : Status::Ok();
  }

  // The step's segments, tokens and logit rows; InvalidArgument for a bad piece.
  Status Gather(std::span<const BatchPiece> pieces) {
    segments.clear();
    tokens.clear();
    out_rows.clear();
    std::unordered_set<SeqId> seen;
    for (const BatchPiece& p : pieces) {
      ARGUS_ASSIGN_OR_RETURN(const SeqState* state, StateOf(p.seq));
      const uint32_t length = state->length;
      const std::string name = "sequence " + std::to_string(p.seq);
      if (!seen.insert(p.seq).second) return Status::InvalidArgument(name + " is in two pieces");
      if (p.tokens.empty()) return Status::InvalidArgument(name + ": a piece needs a token");
      ARGUS_RETURN_IF_ERROR(model::CheckTokens(p.tokens, m.config.n_vocab));
      if (p.tokens.size() > options.n_ctx - length) {
        return Status::InvalidArgument(name + ": " + std::to_string(p.tokens.size()) +
                                       " tokens after " + std::to_string(length) +
                                       " exceed the context of " + std::to_string(options.n_ctx));
      }
      if (tokens.size() + p.tokens.size() > options.n_batch) {
        return Status::InvalidArgument("the pieces hold over " + std::to_string(options.n_batch) +
                                       " tokens (n_batch)");
      }
      const uint32_t n = static_cast<uint32_t>(p.tokens.size());
      segments.push_back({p.seq, length, n});
      tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
      if (p.logits) out_rows.push_back(static_cast<uint32_t>(tokens.size()) - 1);
    }
    return Status::Ok();
  }
};

BatchContext::BatchContext() = default;
BatchContext::~BatchContext() = default;

Result<std::unique_ptr<BatchContext>> BatchContext::Create(const Model& model,
                                                           const BatchContextOptions& options) {
  BatchContextOptions o = options;
  if (o.n_ctx == 0) o.n_ctx = model.config().n_ctx_train;
  if (o.n_batch == 0) return Status::InvalidArgument("n_batch must be at least 1");
  ARGUS_RETURN_IF_ERROR(CheckThreadCount(o.n_threads, "batch context"));
  if (o.placement) {
    ARGUS_RETURN_IF_ERROR(
        model::CheckPlacementOptions(o.k_codec, o.v_codec, o.attention, *o.placement));
  }
  ARGUS_ASSIGN_OR_RETURN(
      CacheOptions cache_options,
      model::ContextCacheOptions(model.config(), o.page_tokens, o.k_codec, o.v_codec,
                                 o.active_codec, o.ram_budget_bytes, o.n_ctx));
  if (o.ram_budget_bytes == 0) {
    ARGUS_ASSIGN_OR_RETURN(cache_options.ram_budget_bytes,
                           CheckedMul(cache_options.ram_budget_bytes, o.n_full_sequences,
                                      "the RAM budget of n_full_sequences"));
  }
  cache_options.disk = o.disk;
  o.ram_budget_bytes = cache_options.ram_budget_bytes;
  std::unique_ptr<BatchContext> context(new BatchContext());
  context->impl_ = std::make_unique<Impl>(ModelAccess::Of(model), o);
  Impl& s = *context->impl_;
  ARGUS_ASSIGN_OR_RETURN(s.cache, KvCache::Create(cache_options));
  if (o.placement) {
    ARGUS_ASSIGN_OR_RETURN(s.placement, PlacementEngine::Create(*s.cache, s.pool, *o.placement));
    ARGUS_RETURN_IF_ERROR(s.placement->BeginBatch(o.n_full_sequences, o.n_ctx));
  }
  ARGUS_RETURN_IF_ERROR(s.forward.Reserve(o.n_batch));
  return context;
}

Result<SeqId> BatchContext::NewSequence() {
  Impl& s = *impl_;
  ARGUS_ASSIGN_OR_RETURN(const SeqId seq, s.cache->CreateSequence());
  if (Status status = s.Track(seq); !status.ok()) {
    (void)s.cache->Release(seq);  // empty and untracked: nothing else refers to it
    return status;
  }
  s.seqs[seq] = {};
  return seq;
}

Result<SeqId> BatchContext::Fork(SeqId seq, uint32_t n_tokens) {
  Impl& s = *impl_;
  ARGUS_RETURN_IF_ERROR(s.CheckHolds(seq, n_tokens));
  ARGUS_ASSIGN_OR_RETURN(const SeqId fork, s.cache->Fork(seq));
  Status status = s.Track(fork);
  if (status.ok()) status = s.Crop(fork, n_tokens);
  if (!status.ok()) {
    // The fork is unused; its release frees only its own pages.
    if (!s.ReleaseSequence(fork).ok()) (void)s.cache->Release(fork);
    return status;
  }
  Impl::SeqState state = s.seqs.at(seq);
  state.Cut(n_tokens);
  s.seqs[fork] = state;
  return fork;
}

Status BatchContext::Release(SeqId seq) {
  Impl& s = *impl_;
  ARGUS_RETURN_IF_ERROR(s.StateOf(seq).status());
  ARGUS_RETURN_IF_ERROR(s.ReleaseSequence(seq));
  s.seqs.erase(seq);
  return Status::Ok();
}

Status BatchContext::Truncate(SeqId seq, uint32_t n_tokens) {
  Impl& s = *impl_;
  ARGUS_RETURN_IF_ERROR(s.CheckHolds(seq, n_tokens));
  ARGUS_RETURN_IF_ERROR(s.Crop(seq, n_tokens));
  s.seqs.at(seq).Cut(n_tokens);
  return Status::Ok();
}

Result<uint32_t> BatchContext::Length(SeqId seq) const {
  auto it = impl_->seqs.find(seq);
  if (it == impl_->seqs.end()) return Status::NotFound("no sequence " + std::to_string(seq));
  return it->second.length;
}

Result<std::span<const float>> BatchContext::Eval(std::span<const BatchPiece> pieces) {
  Impl& s = *impl_;
  if (pieces.empty()) return Status::InvalidArgument("Eval needs at least one piece");
  ARGUS_RETURN_IF_ERROR(s.Gather(pieces));
  s.logits.resize(s.out_rows.size() * s.m.config.n_vocab);
  Status status = s.Run();
  if (!status.ok()) {
    // All or nothing: each sequence drops whatever this step appended to any layer.
    for (const model::Segment& segment : s.segments) {
      if (Status crop = s.Crop(segment.seq, segment.first); !crop.ok()) {
        return Status::Internal(status.message() + "; rollback failed: " + crop.message());
      }
      s.seqs.at(segment.seq).Cut(segment.first);
    }
    return status;
  }
  for (const model::Segment& segment : s.segments) s.seqs.at(segment.seq).length += segment.n;
  return std::span<const float>(s.logits);
}

Result<uint32_t> BatchContext::LoadPrefix(SeqId seq, std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  ARGUS_ASSIGN_OR_RETURN(Impl::SeqState * state, s.StateOf(seq));
  tokens = tokens.first(std::min<size_t>(tokens.size(), s.options.n_ctx));
  // The engine's migrations change pages under the cache's feet: none may run meanwhile.
  if (s.placement) ARGUS_RETURN_IF_ERROR(s.placement->Drain());
  ARGUS_ASSIGN_OR_RETURN(const uint32_t n, s.cache->LoadPrefix(seq, s.m.fingerprint(), tokens));
  state->length = n;
  return n;
}

Status BatchContext::StorePrefix(SeqId seq, std::span<const int32_t> tokens,
                                 PrefixStoreStats& stats) {
  Impl& s = *impl_;
  ARGUS_ASSIGN_OR_RETURN(const Impl::SeqState* state, s.StateOf(seq));
  tokens = tokens.first(std::min<size_t>(tokens.size(), state->length));
  if (s.placement) ARGUS_RETURN_IF_ERROR(s.placement->Drain());
  return s.cache->StorePrefix(seq, s.m.fingerprint(), tokens, state->n_exact, stats);
}

const KvCache& BatchContext::cache() const { return *impl_->cache; }
uint32_t BatchContext::n_ctx() const { return impl_->options.n_ctx; }
uint32_t BatchContext::n_batch() const { return impl_->options.n_batch; }
const TimeSplit& BatchContext::times() const { return impl_->forward.times(); }
std::optional<PlacementStats> BatchContext::placement_stats() const {
  if (!impl_->placement) return std::nullopt;
  return impl_->placement->stats();
}
size_t BatchContext::placeable_bytes() const {
  if (!impl_->placement) return impl_->cache->stats().ram.budget_bytes;
  return impl_->placement->PlaceableBytes();
}

}  // namespace argus
