// Long-context decode shared by `argus demo` and argus-bench (eval/long_context.h).
#include "eval/long_context.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "argus/model.h"
#include "core/measure.h"
#include "core/probe.h"
#include "core/progress.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace argus {
namespace {

constexpr uint32_t kAppendTokens = 1024;  // rows per Append call while filling

size_t ProcStatusBytes(std::string_view field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with(field) && line.size() > field.size() && line[field.size()] == ':') {
      std::istringstream value(line.substr(field.size() + 1));
      size_t kib = 0;
      value >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

Result<ModelGeometry> FindModel(std::string_view name) {
  // The models the benchmarks measure; their geometry is the model preset's.
  static constexpr std::string_view kModels[] = {"llama-3-8b", "qwen2.5-0.5b"};
  if (std::ranges::find(kModels, name) == std::end(kModels)) {
    return Status::InvalidArgument(fmt::format("model '{}' is not one of the known geometries ({})",
                                               name, fmt::join(kModels, ", ")));
  }
  ARGUS_ASSIGN_OR_RETURN(ModelConfig config, ModelPreset(name));
  return ModelGeometry{std::string(name), config.geometry()};
}

Result<CodecPair> ParseCodecPair(std::string_view text) {
  auto valid = [](std::string_view spec) {
    return !spec.empty() && CodecRegistry::Default().Create(spec).ok();
  };
  std::vector<CodecPair> splits;
  for (size_t at = text.find('/'); at != std::string_view::npos; at = text.find('/', at + 1)) {
    if (valid(text.substr(0, at)) && valid(text.substr(at + 1))) {
      splits.push_back({std::string(text.substr(0, at)), std::string(text.substr(at + 1))});
    }
  }
  if (splits.size() == 1) return splits[0];
  if (splits.empty() && valid(text)) return CodecPair{std::string(text), std::string(text)};
  return Status::InvalidArgument(
      fmt::format("codec pair '{}' is not K/V with two valid codec specs (e.g. q8_0/q8_0){}", text,
                  splits.size() > 1 ? ": it splits more than one way" : ""));
}

SyntheticContext MakeSyntheticContext(const ModelGeometry& model, KeyRegime regime, uint64_t seed,
                                      uint32_t pool_tokens, ThreadPool& pool) {
  const CacheGeometry& g = model.geometry;
  const uint32_t d = g.head_dim, gqa = g.gqa();
  SyntheticContext context{.model = model, .pool_tokens = pool_tokens};
  const size_t row = size_t{g.n_kv_heads} * d;
  context.k.resize(size_t{pool_tokens} * row);
  context.v.resize(size_t{pool_tokens} * row);
  context.q.resize(size_t{g.n_q_heads} * d);
  // Each KV head writes its own columns of k, v and its own rows of q.
  pool.ParallelFor(g.n_kv_heads, 1, [&](size_t, size_t begin, size_t end) {
    for (size_t h = begin; h < end; ++h) {
      SyntheticKvOptions options{.regime = regime, .dim = d, .n_q = gqa, .seed = seed + h};
      SyntheticKv kv = GenerateSyntheticKv(options, pool_tokens);
      for (uint32_t t = 0; t < pool_tokens; ++t) {
        std::copy_n(kv.k.data() + size_t{t} * d, d, context.k.data() + t * row + h * d);
        std::copy_n(kv.v.data() + size_t{t} * d, d, context.v.data() + t * row + h * d);
      }
      std::copy(kv.q.begin(), kv.q.end(), context.q.begin() + h * gqa * d);
    }
  });
  return context;
}

Result<FilledCache> BuildSyntheticCache(const SyntheticContext& context, uint32_t n_layers,
                                        uint32_t n_tokens, const CodecPair& pair,
                                        uint32_t page_tokens, std::string_view who,
                                        DiskTier* disk) {
  return BuildCache(context.model, n_layers, n_tokens, pair, page_tokens, who,
                    SyntheticRows(context), disk);
}

Result<CacheEvictor> CacheEvictor::Create(ThreadPool& pool) {
  CacheEvictor evictor;
  evictor.pool_ = &pool;
  ARGUS_ASSIGN_OR_RETURN(evictor.buffer_, AlignedBuffer::Allocate(2 * LastLevelCacheBytes()));
  // Touch every page now, so that no eviction pays for page faults.
  std::memset(evictor.buffer_.data(), 1, evictor.buffer_.size());
  return evictor;
}

void CacheEvictor::Evict() const {
  // One load per cache line brings the whole buffer through the cache.
  const uint64_t* words = buffer_.as<uint64_t>();
  const size_t n_lines = buffer_.size() / kBufferAlign,
               line_words = kBufferAlign / sizeof(uint64_t);
  pool_->ParallelFor(n_lines, size_t{1} << 14, [&](size_t, size_t begin, size_t end) {
    uint64_t sum = 0;
    for (size_t i = begin; i < end; ++i) sum += words[i * line_words];
    volatile uint64_t sink = sum;  // keeps the loads
    (void)sink;
  });
}

Result<DecodePass> DecodeAllLayers(AttentionEngine& engine, FilledCache& cache, const float* q,
                                   float* out, const CacheEvictor* evictor, size_t q_layer_stride) {
  const CacheGeometry& g = cache.cache->geometry();
  const size_t layer_values = size_t{g.n_q_heads} * g.head_dim;
  DecodePass pass;
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    if (evictor != nullptr) evictor->Evict();
    const auto start = Clock::now();
    ARGUS_ASSIGN_OR_RETURN(AttentionStats stats,
                           engine.Decode(*cache.cache, cache.seq, layer, q + layer * q_layer_stride,
                                         out + layer * layer_values));
    pass.seconds += Seconds(start);
    pass.attention += stats;
  }
  return pass;
}

Result<SideBySide> TimeDecodeSideBySide(AttentionEngine& engine, FilledCache& cache,
                                        FilledCache* reference, const float* q, int reps,
                                        const CacheEvictor& evictor, size_t q_layer_stride) {
  const CacheGeometry& g = cache.cache->geometry();
  std::vector<float> out(size_t{g.n_layers} * g.n_q_heads * g.head_dim);
  SideBySide best;
  best.best.seconds = best.best_reference.seconds = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (reference != nullptr) {
      ARGUS_ASSIGN_OR_RETURN(DecodePass pass, DecodeAllLayers(engine, *reference, q, out.data(),
                                                              &evictor, q_layer_stride));
      if (pass.seconds < best.best_reference.seconds) best.best_reference = pass;
    }
    ARGUS_ASSIGN_OR_RETURN(DecodePass pass,
                           DecodeAllLayers(engine, cache, q, out.data(), &evictor, q_layer_stride));
    if (pass.seconds < best.best.seconds) best.best = pass;
  }
  if (reference == nullptr) best.best_reference = best.best;
  return best;
}

Result<FilledCache> BuildCache(const ModelGeometry& model, uint32_t n_layers, uint32_t n_tokens,
                               const CodecPair& pair, uint32_t page_tokens, std::string_view who,
                               const KvRowSource& rows, DiskTier* disk) {
  const std::string label =
      fmt::format("{}: filling {} {} tokens, {}", who, model.name, n_tokens, pair.name());
  CacheOptions options;
  options.geometry = model.geometry;
  options.geometry.n_layers = n_layers;
  options.page_tokens = page_tokens;
  options.k_codec = pair.k;
  options.v_codec = pair.v;
  options.disk = disk;
  ARGUS_ASSIGN_OR_RETURN(options.ram_budget_bytes, KvCache::RequiredRamBytes(options, n_tokens));
  FilledCache filled;
  filled.budget_bytes = options.ram_budget_bytes;
  auto created = KvCache::Create(options);
  if (!created.ok()) return created.status().WithContext(label);
  filled.cache = std::move(created).value();
  ARGUS_ASSIGN_OR_RETURN(filled.seq, filled.cache->CreateSequence());

  const auto start = Clock::now();
  Progress progress(label);
  const size_t row = size_t{options.geometry.n_kv_heads} * options.geometry.head_dim;
  const uint64_t total = uint64_t{n_layers} * n_tokens;
  for (uint32_t layer = 0; layer < n_layers; ++layer) {
    for (uint32_t filled_tokens = 0; filled_tokens < n_tokens;) {
      const KvRows from = rows(layer, filled_tokens);
      const uint32_t n = std::min({from.n_rows, n_tokens - filled_tokens, kAppendTokens});
      Status status = filled.cache->Append(filled.seq, layer, std::span(from.k, n * row),
                                           std::span(from.v, n * row));
      if (!status.ok()) return status.WithContext(label);
      filled_tokens += n;
      progress.Update(uint64_t{layer} * n_tokens + filled_tokens, total);
    }
  }
  filled.fill_seconds = Seconds(start);
  progress.Done(filled.fill_seconds);
  return filled;
}

KvRowSource SyntheticRows(const SyntheticContext& context) {
  const size_t row = size_t{context.model.geometry.n_kv_heads} * context.model.geometry.head_dim;
  return [&context, row](uint32_t, uint32_t first) {
    const uint32_t at = first % context.pool_tokens;
    return KvRows{context.k.data() + at * row, context.v.data() + at * row,
                  context.pool_tokens - at};
  };
}

size_t CurrentRssBytes() { return ProcStatusBytes("VmRSS"); }
size_t PeakRssBytes() { return ProcStatusBytes("VmHWM"); }

bool ResetPeakRss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

void ReleaseFreedMemory() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

}  // namespace argus
