// Replays a trace through a plain cache or a placement engine, measuring time, disk reads,
// error against a reference, needle retrieval and the hot pages the offline optimum needs.
#include <chrono>
#include <cmath>

#include "argus/core.h"
#include "argus/eval.h"
#include "cache/placement_access.h"
#include "core/measure.h"

namespace argus {

namespace {

void ToFloat(std::span<const uint16_t> h, std::vector<float>& out) {
  out.resize(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = HalfToFloat(h[i]);
}

// The calls a replay makes, on a plain cache or through an engine.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual Status Append(uint32_t layer, std::span<const float> k, std::span<const float> v) = 0;
  virtual Result<AttentionStats> Decode(uint32_t layer, const float* q, float* out) = 0;
  virtual Status EndStep() = 0;
  virtual uint64_t DiskBytesRead() const = 0;
};

class PlainRunner : public Runner {
 public:
  PlainRunner(KvCache& cache, SeqId seq, ThreadPool& pool)
      : cache_(cache), seq_(seq), attention_(pool) {}
  Status Append(uint32_t layer, std::span<const float> k, std::span<const float> v) override {
    return cache_.Append(seq_, layer, k, v);
  }
  Result<AttentionStats> Decode(uint32_t layer, const float* q, float* out) override {
    ARGUS_ASSIGN_OR_RETURN(AttentionStats s, attention_.Decode(cache_, seq_, layer, q, out));
    disk_bytes_ += s.disk_bytes_read;
    return s;
  }
  Status EndStep() override { return Status::Ok(); }
  uint64_t DiskBytesRead() const override { return disk_bytes_; }

 private:
  KvCache& cache_;
  SeqId seq_;
  AttentionEngine attention_;
  uint64_t disk_bytes_ = 0;
};

class EngineRunner : public Runner {
 public:
  explicit EngineRunner(PlacementEngine& engine) : engine_(engine) {}
  Status Append(uint32_t layer, std::span<const float> k, std::span<const float> v) override {
    return engine_.Append(layer, k, v);
  }
  Result<AttentionStats> Decode(uint32_t layer, const float* q, float* out) override {
    return engine_.Decode(layer, q, out);
  }
  Status EndStep() override { return engine_.EndStep(); }
  uint64_t DiskBytesRead() const override {
    const PlacementStats s = engine_.stats();
    return s.attention_disk_bytes_read + s.promoted_bytes_read;
  }

 private:
  PlacementEngine& engine_;
};

}  // namespace

Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  const TraceOptions& to = trace.options;
  const CacheGeometry& g = to.geometry;
  if (options.pool == nullptr) return Status::InvalidArgument("replay: a thread pool is required");
  CacheOptions co;
  co.geometry = g;
  co.page_tokens = options.page_tokens;
  co.disk = options.disk;
  ReplayResult result;
  ARGUS_ASSIGN_OR_RETURN(result.exact_bytes, KvCache::RequiredRamBytes(co, trace.n_tokens()));
  co.ram_budget_bytes = options.ram_budget_bytes ? options.ram_budget_bytes : result.exact_bytes;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(co));
  ARGUS_ASSIGN_OR_RETURN(SeqId seq, cache->CreateSequence());
  std::unique_ptr<PlacementEngine> engine;
  std::unique_ptr<Runner> runner;
  if (options.engine) {
    ARGUS_ASSIGN_OR_RETURN(engine,
                           PlacementEngine::Create(*cache, *options.pool, options.placement));
    ARGUS_RETURN_IF_ERROR(engine->BeginRequest(
        seq, options.expected_tokens ? options.expected_tokens : trace.n_tokens()));
    runner = std::make_unique<EngineRunner>(*engine);
  } else {
    runner = std::make_unique<PlainRunner>(*cache, seq, *options.pool);
  }

  // The prefix, a page of every layer at a time (as a prefill in chunks would).
  auto start = Clock::now();
  std::vector<float> k, v;
  for (uint32_t first = 0; first < to.n_prefix_tokens; first += options.page_tokens) {
    const uint32_t n = std::min(options.page_tokens, to.n_prefix_tokens - first);
    for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
      ToFloat(trace.K(layer, first, n), k);
      ToFloat(trace.V(layer, first, n), v);
      ARGUS_RETURN_IF_ERROR(runner->Append(layer, k, v).WithContext("replaying the prefix"));
    }
  }
  result.prefix_seconds = Seconds(start);
  if (options.progress) options.progress(0);

  const size_t out_size = size_t{g.n_q_heads} * g.head_dim;
  std::vector<float> out(out_size);
  const uint64_t disk_before = runner->DiskBytesRead();
  const PageTable& table = PageTableOf(*cache);
  double error_sum = 0;
  result.n_steps = to.n_steps;
  result.hot_pages.resize(to.n_steps);
  if (options.keep_outputs) result.outputs.reserve(size_t{to.n_steps} * g.n_layers * out_size);
  for (uint32_t step = 0; step < to.n_steps; ++step) {
    const int64_t target = trace.target[step];
    bool found = true;
    start = Clock::now();
    for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
      ToFloat(trace.K(layer, to.n_prefix_tokens + step, 1), k);
      ToFloat(trace.V(layer, to.n_prefix_tokens + step, 1), v);
      ARGUS_RETURN_IF_ERROR(runner->Append(layer, k, v));
      ARGUS_RETURN_IF_ERROR(
          runner->Decode(layer, trace.Q(step, layer).data(), out.data()).status());
      // The measurements below read the page table this attention call just wrote, so they run
      // inside the timed step, alike for every run (the reference included).
      ARGUS_ASSIGN_OR_RETURN(std::vector<PageView> pages, cache->Pages(seq, layer));
      PageId best = kNoPage;
      for (const PageView& view : pages) {
        if (best == kNoPage || table.mass[view.id] > table.mass[best]) best = view.id;
        if (table.mass[view.id] >= options.hot_mass) {
          result.hot_pages[step].push_back(layer << 20 | view.first_token / options.page_tokens);
        }
      }
      if (target >= 0) {
        const int64_t first = table.first_token[best];
        found = found && target >= first && target < first + table.n_tokens[best];
      }
      if (options.reference != nullptr) {
        const size_t offset = (size_t{step} * g.n_layers + layer) * out_size;
        const double e = RelativeL2Error(
            out, std::span<const float>(options.reference->data() + offset, out_size));
        result.max_rel_error = std::max(result.max_rel_error, e);
        result.step_errors.resize(step + 1, 0.0);
        result.step_errors[step] = std::max(result.step_errors[step], e);
        error_sum += e;
      }
      if (options.keep_outputs) result.outputs.insert(result.outputs.end(), out.begin(), out.end());
    }
    ARGUS_RETURN_IF_ERROR(runner->EndStep());
    result.decode_seconds += Seconds(start);
    if (target >= 0) {
      ++result.n_target_steps;
      if (found) ++result.n_targets_found;
    }
    if (options.progress) options.progress(step + 1);
  }
  if (engine != nullptr) ARGUS_RETURN_IF_ERROR(engine->Drain());
  result.disk_bytes_read = runner->DiskBytesRead() - disk_before;
  if (options.reference != nullptr && to.n_steps > 0) {
    result.mean_rel_error = error_sum / (static_cast<double>(to.n_steps) * g.n_layers);
  }
  if (engine != nullptr) result.placement = engine->stats();
  result.cache = cache->stats();
  return result;
}

}  // namespace argus
