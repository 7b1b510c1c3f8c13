// argus bench attention: decode attention over a KvCache, per token and per layer, for model
// geometries, context lengths and K/V codec pairs, each pair timed beside the f16 cache of the
// same context; or, with --kv-dir, over real activations dumped by `argus eval --dump-kv`, with
// the output error against double precision. Also the shared pieces of `argus demo` and the
// dump reader (attention_bench.h).
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "argus/core.h"
#include "cli/attention_bench.h"
#include "cli/bench.h"
#include "cli/progress.h"
#include "core/buffer.h"
#include "core/measure.h"
#include "core/npy.h"
#include "core/probe.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace argus::cli {
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

// Least-squares line y = slope * x + intercept, and its R^2.
struct LineFit {
  double slope = 0, intercept = 0, r2 = 0;
};
LineFit FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i] / n;
    my += y[i] / n;
  }
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  LineFit fit;
  fit.slope = sxx > 0 ? sxy / sxx : 0;
  fit.intercept = my - fit.slope * mx;
  double ss_res = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = y[i] - (fit.slope * x[i] + fit.intercept);
    ss_res += e * e;
  }
  fit.r2 = syy > 0 ? 1.0 - ss_res / syy : 1.0;
  return fit;
}

// Bits of the codes of a pair when K and V share them (4, 8, 16), else 0: the classes whose
// ordering the report checks.
uint32_t PairCodeBits(const CodecPair& pair) {
  auto k = CodecRegistry::Default().Create(pair.k);
  auto v = CodecRegistry::Default().Create(pair.v);
  if (!k.ok() || !v.ok()) return 0;
  const uint32_t bits = (*k)->info().code_bits;
  return bits == (*v)->info().code_bits ? bits : 0;
}

bool IsF16Pair(const CodecPair& pair) { return pair.k == "f16" && pair.v == "f16"; }

// What one pass over the built layers does, whatever its time.
struct PassWork {
  double bytes = 0;  // K and V tile bytes read
  double fmas = 0;   // float-equivalent FMAs: 2 * n_q_heads * tokens * head_dim per layer
};

// The figures that follow from a pass's time: per token and layer, for the whole model (times
// `scale`), and against the probes. The roofline time is that of the bytes at the bandwidth probe
// or of the float work at the FMA probe, whichever is longer.
nlohmann::json TimeFigures(double seconds, const PassWork& work, uint32_t layers, double scale,
                           double read_gbps, double fma_gflops) {
  const double bytes_seconds = work.bytes / (read_gbps * 1e9);
  const double fma_seconds = 2 * work.fmas / (fma_gflops * 1e9);
  const double roofline = std::max(bytes_seconds, fma_seconds);
  return {{"ms_per_token_per_layer", seconds * 1e3 / layers},
          {"ms_per_token_model", seconds * 1e3 * scale},
          {"read_gbps", work.bytes / seconds / 1e9},
          {"bandwidth_fraction", bytes_seconds / seconds},
          {"fma_fraction", fma_seconds / seconds},
          {"roofline_ms_model", roofline * 1e3 * scale},
          {"roofline_ratio", seconds / roofline},
          {"roofline_bound", bytes_seconds >= fma_seconds ? "bandwidth" : "fma"}};
}

// A layer's K and V rows from token `first` on: n_rows >= 1 rows, [n_rows, n_kv_heads, head_dim]
// each.
struct KvRows {
  const float* k = nullptr;
  const float* v = nullptr;
  uint32_t n_rows = 0;
};
using KvRowSource = std::function<KvRows(uint32_t layer, uint32_t first)>;

// A cache of n_layers layers of `model` holding n_tokens per layer from `rows`, budget from
// KvCache::RequiredRamBytes, with the progress line of BuildSyntheticCache.
Result<FilledCache> BuildCache(const ModelGeometry& model, uint32_t n_layers, uint32_t n_tokens,
                               const CodecPair& pair, uint32_t page_tokens, std::string_view who,
                               const KvRowSource& rows, DiskTier* disk = nullptr) {
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

// The synthetic pool, repeated to any context; every layer holds the same rows.
KvRowSource SyntheticRows(const SyntheticContext& context) {
  const size_t row = size_t{context.model.geometry.n_kv_heads} * context.model.geometry.head_dim;
  return [&context, row](uint32_t, uint32_t first) {
    const uint32_t at = first % context.pool_tokens;
    return KvRows{context.k.data() + at * row, context.v.data() + at * row,
                  context.pool_tokens - at};
  };
}

// What one model's rows are measured on: the caches' K/V, the layers built and the queries, and
// for real activations the outputs in double precision that the rows' errors are taken against.
struct BenchModel {
  ModelGeometry model;    // model.geometry.n_layers: the whole model's layers
  uint32_t n_layers = 0;  // built and timed; figures are scaled to the whole model
  KvRowSource rows;
  const float* q = nullptr;  // [n_q_heads, head_dim], advanced by q_layer_stride per layer
  size_t q_layer_stride = 0;
  std::vector<double> reference_out;  // [n_layers, n_q_heads, head_dim]; empty: no errors
};

// The machine every row is measured on, and the options that shape a measurement.
struct BenchRun {
  AttentionEngine& engine;
  const CacheEvictor& evictor;
  double read_gbps, fma_gflops;
  int reps;
  uint32_t page_tokens;
};

// The output error of a pass against the model's reference: per query head relative L2, max and
// mean over layers and heads, and the max per layer.
nlohmann::json ErrorFigures(const std::vector<float>& out, const BenchModel& m) {
  const CacheGeometry& g = m.model.geometry;
  const size_t layer_values = size_t{g.n_q_heads} * g.head_dim;
  nlohmann::json by_layer = nlohmann::json::array();
  double max_error = 0, mean_error = 0;
  for (uint32_t layer = 0; layer < m.n_layers; ++layer) {
    const HeadErrors e = OutputHeadErrors(
        std::span(out).subspan(layer * layer_values, layer_values),
        std::span<const double>(m.reference_out).subspan(layer * layer_values, layer_values),
        g.head_dim);
    by_layer.push_back(e.max);
    max_error = std::max(max_error, e.max);
    mean_error += e.mean / m.n_layers;
  }
  return {{"max_rel_error", max_error},
          {"mean_rel_error", mean_error},
          {"max_rel_error_by_layer", by_layer}};
}

// Rows of one context of one model into `results`: every pair's cache timed side by side with the
// f16 cache of the same data (pairs[0] is f16/f16).
Status MeasureContext(const BenchModel& m, uint32_t n_tokens, const std::vector<CodecPair>& pairs,
                      const BenchRun& run, nlohmann::json& results) {
  constexpr std::string_view kWho = "bench attention";
  const CacheGeometry& g = m.model.geometry;
  const double scale = static_cast<double>(g.n_layers) / m.n_layers;  // to the whole model
  auto build = [&](const CodecPair& pair) {
    return BuildCache(m.model, m.n_layers, n_tokens, pair, run.page_tokens, kWho, m.rows);
  };
  ReleaseFreedMemory();
  const size_t overhead_rss = CurrentRssBytes();
  const bool reference_peak_reset = ResetPeakRss();
  ARGUS_ASSIGN_OR_RETURN(FilledCache reference, build(pairs[0]));
  const CacheStats reference_stats = reference.cache->stats();
  // The f16/f16 row reports the best of every f16 pass of this context: its own and those
  // interleaved with each pair's.
  const size_t f16_row = results.size();
  double best_f16_seconds = 1e30;
  PassWork f16_work;
  for (const CodecPair& pair : pairs) {
    // The peak since the reset covers building and timing this pair's cache beside the
    // reference (f16/f16: the reference itself).
    std::optional<FilledCache> own;
    bool peak_reset = reference_peak_reset;
    if (!IsF16Pair(pair)) {
      peak_reset = ResetPeakRss();
      ARGUS_ASSIGN_OR_RETURN(FilledCache built, build(pair));
      own.emplace(std::move(built));
    }
    fmt::print(stderr, "{}: timing {} {} tokens, {}...\n", kWho, m.model.name, n_tokens,
               pair.name());
    FilledCache& measured = own ? *own : reference;
    ARGUS_ASSIGN_OR_RETURN(SideBySide times,
                           TimeDecodeSideBySide(run.engine, measured, own ? &reference : nullptr,
                                                m.q, run.reps, run.evictor, m.q_layer_stride));
    const size_t peak_rss = PeakRssBytes();
    const CacheStats stats = own ? own->cache->stats() : reference_stats;
    const size_t accounted = overhead_rss + reference_stats.page_bytes +
                             reference_stats.metadata_bytes +
                             (own ? stats.page_bytes + stats.metadata_bytes : 0);
    const PassWork work{static_cast<double>(times.best.bytes_read),
                        2.0 * g.n_q_heads * n_tokens * g.head_dim * m.n_layers};
    if (!own) f16_work = work;
    best_f16_seconds = std::min(best_f16_seconds, times.best_reference.seconds);
    nlohmann::json row = {
        {"model", m.model.name},
        {"model_layers", g.n_layers},
        {"context", n_tokens},
        {"pair", pair.name()},
        {"k_codec", pair.k},
        {"v_codec", pair.v},
        {"code_bits", PairCodeBits(pair)},
        {"f16_ms_per_token_model", times.best_reference.seconds * 1e3 * scale},
        {"time_ratio_to_f16", times.time_ratio()},
        {"speedup_vs_f16", 1.0 / times.time_ratio()},
        {"kv_bytes_model", static_cast<double>(stats.page_bytes) * scale},
        {"bytes_read_per_token_model", work.bytes * scale},
        {"fmas_per_token_model", work.fmas * scale},
        {"cache_page_bytes", stats.page_bytes},
        {"cache_metadata_bytes", stats.metadata_bytes},
        {"cache_budget_bytes", measured.budget_bytes},
        {"cache_bytes_by_codec", CodecBytesJson(stats.by_codec)},
        {"overhead_rss_bytes", overhead_rss},
        {"peak_rss_bytes", peak_rss},
        {"accounted_bytes", accounted},
        {"rss_to_accounted", static_cast<double>(peak_rss) / static_cast<double>(accounted)},
        // The caches alone: RSS growth over the overhead against their byte accounting.
        {"cache_rss_to_accounted", (static_cast<double>(peak_rss) - overhead_rss) /
                                       static_cast<double>(accounted - overhead_rss)},
        {"peak_rss_reset", peak_reset},
        {"fill_seconds", measured.fill_seconds},
    };
    row.update(
        TimeFigures(times.best.seconds, work, m.n_layers, scale, run.read_gbps, run.fma_gflops));
    if (!m.reference_out.empty()) {
      // Outputs do not depend on timing or threads: one more untimed pass gives them.
      std::vector<float> out(m.reference_out.size());
      ARGUS_RETURN_IF_ERROR(
          DecodeAllLayers(run.engine, measured, m.q, out.data(), nullptr, m.q_layer_stride)
              .status());
      row.update(ErrorFigures(out, m));
    }
    results.push_back(row);
    own.reset();
    ReleaseFreedMemory();
  }
  nlohmann::json& f16 = results[f16_row];
  f16.update(
      TimeFigures(best_f16_seconds, f16_work, m.n_layers, scale, run.read_gbps, run.fma_gflops));
  f16["f16_ms_per_token_model"] = f16["ms_per_token_model"];
  f16["f16_passes"] = run.reps * pairs.size();
  return Status::Ok();
}

// A float32 array of 3 non-zero dimensions; errors name the file.
Result<NpyArray> ReadDumpArray(const std::string& path) {
  ARGUS_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  if (array.type != NpyType::kFloat32) {
    return Status::InvalidArgument(
        fmt::format("{}: dtype {}; a dump holds float32", path,
                    array.type == NpyType::kFloat16 ? "float16" : "uint8"));
  }
  if (array.shape.size() != 3 || array.n_values() == 0 || array.shape[0] > UINT32_MAX ||
      array.shape[1] > UINT32_MAX || array.shape[2] > UINT32_MAX) {
    return Status::InvalidArgument(fmt::format("{}: shape {}; expected [tokens, heads, head_dim]",
                                               path, NpyShapeText(array.shape)));
  }
  return array;
}

// InvalidArgument naming the file whose shape differs from the other file's.
Status SameShape(const std::string& path, const std::vector<size_t>& shape,
                 const std::string& other, const std::vector<size_t>& expected) {
  if (shape == expected) return Status::Ok();
  return Status::InvalidArgument(fmt::format("{}: shape {} differs from {}'s {}", path,
                                             NpyShapeText(shape), other, NpyShapeText(expected)));
}

// The layers the directory holds: the count of layerNN_k.npy files, which must be 00 .. count-1.
Result<uint32_t> CountDumpLayers(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::NotFound(fmt::format("{}: no such directory", dir));
  }
  std::set<uint32_t> layers;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "layer", kSuffix = "_k.npy";
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    const std::string digits =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const uint32_t layer = static_cast<uint32_t>(std::stoul(digits));
    if (DumpName(layer, 'k') == name) layers.insert(layer);  // layer05, layer123; not layer5
  }
  if (ec) return Status::IOError(fmt::format("{}: {}", dir, ec.message()));
  if (layers.empty()) {
    return Status::NotFound(
        fmt::format("{}: no layerNN_k.npy files (write a dump with argus eval --dump-kv)", dir));
  }
  const uint32_t n_layers = static_cast<uint32_t>(layers.size());
  for (uint32_t layer = 0; layer < n_layers; ++layer) {
    if (!layers.contains(layer)) {
      return Status::NotFound(fmt::format("{}: missing, though the dump has layers up to {}",
                                          DumpPath(dir, layer, 'k'),
                                          DumpName(*layers.rbegin(), 'k')));
    }
  }
  return n_layers;
}

}  // namespace

// ---- Shared with argus demo ------------------------------------------------------------------

Result<ModelGeometry> FindModel(std::string_view name) {
  static const ModelGeometry kModels[] = {
      {"llama-3-8b", {.n_layers = 32, .n_q_heads = 32, .n_kv_heads = 8, .head_dim = 128}},
      {"qwen2.5-0.5b", {.n_layers = 24, .n_q_heads = 14, .n_kv_heads = 2, .head_dim = 64}},
  };
  std::string known;
  for (const ModelGeometry& model : kModels) {
    if (model.name == name) return model;
    known += (known.empty() ? "" : ", ") + model.name;
  }
  return Status::InvalidArgument(
      fmt::format("model '{}' is not one of the known geometries ({})", name, known));
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
    pass.bytes_read += stats.bytes_read;
    pass.disk_bytes_read += stats.disk_bytes_read;
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

nlohmann::json CodecBytesJson(const std::vector<CodecBytes>& by_codec) {
  nlohmann::json out = nlohmann::json::array();
  for (const CodecBytes& c : by_codec) {
    out.push_back({{"codec", c.codec},
                   {"k_bytes", c.k_bytes},
                   {"v_bytes", c.v_bytes},
                   {"n_k_pages", c.n_k_pages},
                   {"n_v_pages", c.n_v_pages}});
  }
  return out;
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

// ---- Real activations ------------------------------------------------------------------------

std::string DumpName(uint32_t layer, char plane) {
  return fmt::format("layer{:02}_{}.npy", layer, plane);
}

std::string DumpPath(const std::string& dir, uint32_t layer, char plane) {
  return (std::filesystem::path(dir) / DumpName(layer, plane)).string();
}

Result<KvDump> ReadKvDump(const std::string& dir) {
  ARGUS_ASSIGN_OR_RETURN(const uint32_t n_layers, CountDumpLayers(dir));
  KvDump dump;
  dump.dir = dir;
  std::vector<size_t> k_shape0, q_shape0;  // layer 00's, which every layer must match
  for (uint32_t layer = 0; layer < n_layers; ++layer) {
    const std::string k_path = DumpPath(dir, layer, 'k'), v_path = DumpPath(dir, layer, 'v'),
                      q_path = DumpPath(dir, layer, 'q');
    ARGUS_ASSIGN_OR_RETURN(NpyArray k, ReadDumpArray(k_path));
    ARGUS_ASSIGN_OR_RETURN(NpyArray v, ReadDumpArray(v_path));
    ARGUS_ASSIGN_OR_RETURN(NpyArray q, ReadDumpArray(q_path));
    if (layer == 0) {
      k_shape0 = k.shape;
      if (q.shape[0] != k.shape[0] || q.shape[2] != k.shape[2]) {
        return Status::InvalidArgument(
            fmt::format("{}: shape {}; expected [{}, n_q_heads, {}] ({}'s tokens and head_dim)",
                        q_path, NpyShapeText(q.shape), k.shape[0], k.shape[2], k_path));
      }
      q_shape0 = q.shape;
    }
    ARGUS_RETURN_IF_ERROR(SameShape(k_path, k.shape, DumpName(0, 'k'), k_shape0));
    ARGUS_RETURN_IF_ERROR(SameShape(q_path, q.shape, DumpName(0, 'q'), q_shape0));
    ARGUS_RETURN_IF_ERROR(SameShape(v_path, v.shape, DumpName(layer, 'k'), k.shape));
    const std::vector<float> q_values = q.ToFloat();
    const size_t q_row = q.shape[1] * q.shape[2];
    dump.q.insert(dump.q.end(), q_values.end() - q_row, q_values.end());
    dump.k.push_back(k.ToFloat());
    dump.v.push_back(v.ToFloat());
  }
  dump.n_tokens = static_cast<uint32_t>(k_shape0[0]);
  // "real:stories-kv" for "/tmp/stories-kv/", "." or "../stories-kv".
  std::error_code ec;
  const std::filesystem::path full = std::filesystem::weakly_canonical(dir, ec);
  dump.model.name = "real:" + (ec || full.filename().empty() ? dir : full.filename().string());
  dump.model.geometry = {.n_layers = n_layers,
                         .n_q_heads = static_cast<uint32_t>(q_shape0[1]),
                         .n_kv_heads = static_cast<uint32_t>(k_shape0[1]),
                         .head_dim = static_cast<uint32_t>(k_shape0[2])};
  ARGUS_RETURN_IF_ERROR(dump.model.geometry.Validate().WithContext(DumpPath(dir, 0, 'q') + ", " +
                                                                   DumpPath(dir, 0, 'k')));
  return dump;
}

// ---- argus bench attention -------------------------------------------------------------------

namespace {

// The dump's geometry, every layer, its tokens and last queries; the reference outputs in double.
BenchModel DumpBenchModel(const KvDump& dump) {
  const CacheGeometry& g = dump.model.geometry;
  const size_t row = size_t{g.n_kv_heads} * g.head_dim, q_values = size_t{g.n_q_heads} * g.head_dim;
  BenchModel m{.model = dump.model,
               .n_layers = g.n_layers,
               .rows =
                   [&dump, row](uint32_t layer, uint32_t first) {
                     return KvRows{dump.k[layer].data() + first * row,
                                   dump.v[layer].data() + first * row, dump.n_tokens - first};
                   },
               .q = dump.q.data(),
               .q_layer_stride = q_values};
  CacheGeometry one_layer = g;
  one_layer.n_layers = 1;
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    const std::vector<double> out = ReferenceAttention(
        one_layer, dump.q.data() + layer * q_values, 1, dump.n_tokens - 1, dump.k[layer].data(),
        dump.v[layer].data(), dump.n_tokens, AttentionOptions{});
    m.reference_out.insert(m.reference_out.end(), out.begin(), out.end());
  }
  return m;
}

// Rows of every synthetic model and context.
Status MeasureSynthetic(const std::vector<ModelGeometry>& models,
                        const std::vector<uint32_t>& contexts, uint32_t pool_tokens,
                        KeyRegime regime, const AttentionBenchOptions& options,
                        const std::vector<CodecPair>& pairs, const BenchRun& run, ThreadPool& pool,
                        nlohmann::json& results) {
  for (const ModelGeometry& model : models) {
    fmt::print(stderr, "bench attention: {} synthetic KV, {} tokens per KV head...\n", model.name,
               pool_tokens);
    const SyntheticContext context =
        MakeSyntheticContext(model, regime, options.seed, pool_tokens, pool);
    const BenchModel m{.model = model,
                       .n_layers = options.layers,
                       .rows = SyntheticRows(context),
                       .q = context.q.data()};
    for (uint32_t n_tokens : contexts) {
      ARGUS_RETURN_IF_ERROR(MeasureContext(m, n_tokens, pairs, run, results));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<nlohmann::json> RunAttentionBench(const AttentionBenchOptions& options) {
  const bool real = !options.kv_dir.empty();
  if (options.pairs.empty() || options.reps < 1 ||
      (!real && (options.contexts.empty() || options.models.empty() || options.layers < 1 ||
                 options.pool_tokens < 1))) {
    return Status::InvalidArgument(
        "bench attention: --contexts, --models, --pairs need values; --layers and --reps >= 1");
  }
  // Every model measured, with its contexts: a dump's own, or the synthetic ones.
  std::optional<KvDump> dump;
  std::vector<ModelGeometry> models;
  std::vector<uint32_t> contexts = options.contexts;
  if (real) {
    auto read = ReadKvDump(options.kv_dir);
    if (!read.ok()) return read.status().WithContext("bench attention");
    dump.emplace(std::move(read).value());
    models = {dump->model};
    contexts = {dump->n_tokens};
  } else {
    for (uint32_t context : options.contexts) {
      if (context < 1) return Status::InvalidArgument("bench attention: a context of 0 tokens");
    }
    for (const std::string& name : options.models) {
      auto model = FindModel(name);
      if (!model.ok()) return model.status().WithContext("bench attention");
      if (options.layers > model->geometry.n_layers) {
        return Status::InvalidArgument(fmt::format("bench attention: --layers {} exceeds {}'s {}",
                                                   options.layers, name, model->geometry.n_layers));
      }
      models.push_back(*model);
    }
  }
  // f16/f16 first: every other pair's time is a ratio to it.
  std::vector<CodecPair> pairs = {{"f16", "f16"}};
  for (const std::string& text : options.pairs) {
    auto pair = ParseCodecPair(text);
    if (!pair.ok()) return pair.status().WithContext("bench attention");
    if (!IsF16Pair(*pair)) pairs.push_back(*pair);
  }

  ThreadPool pool(options.threads);
  const unsigned n_threads = pool.n_threads();
  fmt::print(stderr, "bench attention: probing the machine ({} threads)...\n", n_threads);
  ARGUS_ASSIGN_OR_RETURN(MachineProbe probe, ProbeMachine(pool));
  const double read_gbps = n_threads > 1 ? probe.read_gbps_all_threads : probe.read_gbps_one_thread;
  const double fma_gflops =
      n_threads > 1 ? probe.fma_gflops_all_threads : probe.fma_gflops_one_thread;
  AttentionEngine engine(pool);
  ARGUS_ASSIGN_OR_RETURN(const CacheEvictor evictor, CacheEvictor::Create(pool));
  const BenchRun run{engine, evictor, read_gbps, fma_gflops, options.reps, options.page_tokens};
  const uint32_t max_context = *std::max_element(contexts.begin(), contexts.end());
  const uint32_t pool_tokens = std::min(options.pool_tokens, max_context);
  constexpr KeyRegime kRegime = KeyRegime::kModerateOutliers;

  nlohmann::json report;
  report["machine"] = {{"read_gbps_one_thread", probe.read_gbps_one_thread},
                       {"read_gbps_all_threads", probe.read_gbps_all_threads},
                       {"fma_gflops_one_thread", probe.fma_gflops_one_thread},
                       {"fma_gflops_all_threads", probe.fma_gflops_all_threads},
                       {"probe_threads", probe.n_threads},
                       {"last_level_cache_bytes", LastLevelCacheBytes()},
                       {"cpu_features", GetCpuFeatures().ToString()},
                       {"kernel_path", std::string(KernelPathName(BestKernelPath()))}};
  nlohmann::json pair_names = nlohmann::json::array();
  for (const CodecPair& pair : pairs) pair_names.push_back(pair.name());
  nlohmann::json model_names = nlohmann::json::array();
  for (const ModelGeometry& model : models) model_names.push_back(model.name);
  report["config"] = {{"contexts", contexts},
                      {"models", model_names},
                      {"pairs", pair_names},
                      {"layers", real ? dump->model.geometry.n_layers : options.layers},
                      {"threads", n_threads},
                      {"reps", options.reps},
                      {"quick", options.quick},
                      {"page_tokens", options.page_tokens},
                      {"bandwidth_gbps_used", read_gbps},
                      {"fma_gflops_used", fma_gflops},
                      {"llc_evicted_before_each_call", true}};
  if (real) {
    report["config"]["kv_dir"] = options.kv_dir;
    report["config"]["geometry"] = dump->model.geometry.ToString();
    report["config"]["real"] =
        "K/V of every layer of the dump, all its tokens; one decode step at the last position with "
        "each layer's last-token query; error: per query head ||o - ref|| / ||ref|| against "
        "ReferenceAttention in double on the dump's float32 K/V, max and mean over layers and "
        "heads";
  } else {
    report["config"].update({{"regime", std::string(KeyRegimeName(kRegime))},
                             {"seed", options.seed},
                             {"pool_tokens", pool_tokens},
                             {"synthetic",
                              "GenerateSyntheticKv per KV head (seed + head), pool_tokens long, "
                              "repeated to the context; every layer holds the same data and is "
                              "decoded with the same queries"}});
  }

  nlohmann::json results = nlohmann::json::array();
  if (real) {
    fmt::print(stderr, "bench attention: {} ({}), {} tokens, reference in double...\n",
               dump->model.name, dump->model.geometry.ToString(), dump->n_tokens);
    ARGUS_RETURN_IF_ERROR(
        MeasureContext(DumpBenchModel(*dump), dump->n_tokens, pairs, run, results));
  } else {
    ARGUS_RETURN_IF_ERROR(MeasureSynthetic(models, contexts, pool_tokens, kRegime, options, pairs,
                                           run, pool, results));
  }
  report["results"] = results;

  // Time against context per (model, pair), and the ordering of the code-bit classes.
  nlohmann::json slopes = nlohmann::json::array(), ordering = nlohmann::json::array();
  bool ordering_kept = true;
  for (const ModelGeometry& model : models) {
    for (const CodecPair& pair : pairs) {
      std::vector<double> x, y;
      for (const auto& row : results) {
        if (row["model"] == model.name && row["pair"] == pair.name()) {
          x.push_back(row["context"].get<double>());
          y.push_back(row["ms_per_token_model"].get<double>());
        }
      }
      nlohmann::json slope = {
          {"model", model.name}, {"pair", pair.name()}, {"n_contexts", x.size()}};
      if (x.size() >= 2) {
        const LineFit fit = FitLine(x, y);
        slope["ns_per_context_token_model"] = fit.slope * 1e6;
        slope["intercept_ms_model"] = fit.intercept;
        slope["r2"] = fit.r2;
      }
      slopes.push_back(slope);
    }
    for (uint32_t n_tokens : contexts) {
      // Lowest and highest time ratio to f16 (measured side by side) of each class: 4-bit,
      // 8-bit and 16-bit codes.
      std::map<uint32_t, std::pair<double, double>> classes;
      std::vector<std::pair<double, std::string>> order;
      for (const auto& row : results) {
        if (row["model"] != model.name || row["context"] != n_tokens) continue;
        const double ratio = row["time_ratio_to_f16"];
        order.emplace_back(ratio, row["pair"]);
        const uint32_t bits = row["code_bits"];
        if (bits != 4 && bits != 8 && bits != 16) continue;
        auto [it, inserted] = classes.emplace(bits, std::make_pair(ratio, ratio));
        it->second.first = std::min(it->second.first, ratio);
        it->second.second = std::max(it->second.second, ratio);
      }
      std::sort(order.begin(), order.end());
      nlohmann::json fastest_first = nlohmann::json::array();
      for (const auto& entry : order) fastest_first.push_back(entry.second);
      nlohmann::json entry = {{"model", model.name},
                              {"context", n_tokens},
                              {"fastest_first", fastest_first},
                              {"classes", classes.size()}};
      if (classes.size() >= 2) {
        // Each class's slowest pair is faster than the next wider class's fastest.
        bool kept = true;
        for (auto it = classes.begin(); std::next(it) != classes.end(); ++it) {
          kept = kept && it->second.second < std::next(it)->second.first;
        }
        entry["kept"] = kept;
        ordering_kept = ordering_kept && kept;
      }
      ordering.push_back(entry);
    }
  }
  report["slopes"] = slopes;
  report["ordering"] = {{"rule",
                         "by time ratio to f16 measured side by side: every 4-bit pair faster "
                         "than every 8-bit pair, every 8-bit pair faster than f16"},
                        {"kept_everywhere", ordering_kept},
                        {"by_context", ordering}};

  if (real) return report;
  // The reference target: qwen2.5-0.5b at 4096 tokens in f16, all 24 layers, against the
  // roofline time of its bytes and float work.
  nlohmann::json target = {{"model", "qwen2.5-0.5b"}, {"context", 4096}, {"target_ratio", 1.5}};
  for (const auto& row : results) {
    if (row["model"] == "qwen2.5-0.5b" && row["context"] == 4096 && row["pair"] == "f16/f16") {
      target["f16_ms_per_token_model"] = row["ms_per_token_model"];
      target["roofline_ms_model"] = row["roofline_ms_model"];
      target["ratio"] = row["roofline_ratio"];
      target["met"] = row["roofline_ratio"].get<double>() <= 1.5;
    }
  }
  report["roofline_target"] = target;
  return report;
}

void PrintAttentionBench(const nlohmann::json& report) {
  const auto& m = report["machine"];
  const auto& config = report["config"];
  fmt::print(
      "machine: read {:.1f} GB/s (1 thread), {:.1f} GB/s ({} threads), FMA {:.1f} GFLOP/s "
      "(1 thread), {:.1f} GFLOP/s ({} threads), LLC {:.0f} MiB\n",
      m["read_gbps_one_thread"].get<double>(), m["read_gbps_all_threads"].get<double>(),
      m["probe_threads"].get<unsigned>(), m["fma_gflops_one_thread"].get<double>(),
      m["fma_gflops_all_threads"].get<double>(), m["probe_threads"].get<unsigned>(),
      m["last_level_cache_bytes"].get<double>() / (1 << 20));
  const bool real = config.contains("kv_dir");
  if (real) {
    fmt::print(
        "decode attention, {} threads, real K/V from {} ({}, {} tokens): every layer built and "
        "timed, one Decode call per layer\non an evicted last-level cache, each layer's last-token "
        "query; best of {} passes interleaved with the f16 cache's; pages of {} tokens\n"
        "err max, mean: per query head ||o - ref|| / ||ref|| against double precision on the "
        "float32 dump, max and mean over layers and heads\n",
        config["threads"].get<unsigned>(), config["kv_dir"].get<std::string>(),
        config["geometry"].get<std::string>(), config["contexts"][0].get<uint32_t>(),
        config["reps"].get<int>(), config["page_tokens"].get<uint32_t>());
  } else {
    fmt::print(
        "decode attention, {} threads, {} layers of each model built and timed (whole-model "
        "figures scaled), one Decode call per layer on an evicted last-level cache,\nbest of {} "
        "passes interleaved with the f16 cache's; "
        "synthetic KV ({}): {} tokens per KV head repeated to the context; pages of {} tokens\n",
        config["threads"].get<unsigned>(), config["layers"].get<uint32_t>(),
        config["reps"].get<int>(), config["regime"].get<std::string>(),
        config["pool_tokens"].get<uint32_t>(), config["page_tokens"].get<uint32_t>());
  }
  fmt::print(
      "f16 ms beside: the f16 cache's time in the passes interleaved with the pair's (f16/f16: "
      "best of all f16 passes); speedup = f16 beside / ms\n"
      "bw, fma: achieved read rate and float-equivalent FMA rate over the probes ({:.1f} GB/s, "
      "{:.1f} GFLOP/s); /roof: time over max(bytes/bw, flops/fma)\n"
      "peak RSS (VmHWM) against acct = RSS before the caches + their page and metadata bytes; "
      "cache RSS/ = the growth over that RSS against the caches' bytes\n",
      config["bandwidth_gbps_used"].get<double>(), config["fma_gflops_used"].get<double>());
  std::string current_model;
  for (const auto& row : report["results"]) {
    if (row["model"] != current_model) {
      current_model = row["model"];
      fmt::print("\n{} ({} layers)\n", current_model, row["model_layers"].get<uint32_t>());
      fmt::print(
          "{:>7} {:<20} {:>8} {:>9} {:>9} {:>7} {:>7} {:>8} {:>5} {:>5} {:>6} | {:>8} {:>8} "
          "{:>6} {:>6}{}\n",
          "context", "K/V codecs", "ms/tok", "ms/tok", "f16 ms", "speedup", "KV", "MB read", "bw",
          "fma", "/roof", "peak RSS", "acct", "RSS/", "cache",
          real ? fmt::format(" | {:>9} {:>9}", "err", "err") : "");
      fmt::print(
          "{:>7} {:<20} {:>8} {:>9} {:>9} {:>7} {:>7} {:>8} {:>5} {:>5} {:>6} | {:>8} {:>8} "
          "{:>6} {:>6}{}\n",
          "", "", "/layer", "model", "beside", "vs f16", "GiB", "/token", "", "", "", "MiB", "MiB",
          "acct", "RSS/", real ? fmt::format(" | {:>9} {:>9}", "max", "mean") : "");
    }
    const std::string errors =
        real ? fmt::format(" | {:>9.2e} {:>9.2e}", row["max_rel_error"].get<double>(),
                           row["mean_rel_error"].get<double>())
             : "";
    fmt::print(
        "{:>7} {:<20} {:>8.3f} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.3f} {:>8.1f} {:>5.2f} {:>5.2f} "
        "{:>6.2f} | {:>8.0f} {:>8.0f} {:>6.2f} {:>6.2f}{}\n",
        row["context"].get<uint32_t>(), row["pair"].get<std::string>(),
        row["ms_per_token_per_layer"].get<double>(), row["ms_per_token_model"].get<double>(),
        row["f16_ms_per_token_model"].get<double>(), row["speedup_vs_f16"].get<double>(),
        row["kv_bytes_model"].get<double>() / (1 << 30),
        row["bytes_read_per_token_model"].get<double>() / 1e6,
        row["bandwidth_fraction"].get<double>(), row["fma_fraction"].get<double>(),
        row["roofline_ratio"].get<double>(), row["peak_rss_bytes"].get<double>() / (1 << 20),
        row["accounted_bytes"].get<double>() / (1 << 20), row["rss_to_accounted"].get<double>(),
        row["cache_rss_to_accounted"].get<double>(), errors);
  }
  const auto& slopes = report["slopes"];
  if (std::any_of(slopes.begin(), slopes.end(), [](const auto& s) { return s.contains("r2"); })) {
    fmt::print("\ntime per token against context (whole model, least squares):\n");
  } else {
    fmt::print("\n");
  }
  for (const auto& s : slopes) {
    if (!s.contains("r2")) continue;
    fmt::print(
        "  {:<13} {:<20} {:>9.2f} ns per context token, intercept {:>+8.3f} ms (R^2 {:.4f}, "
        "{} contexts)\n",
        s["model"].get<std::string>(), s["pair"].get<std::string>(),
        s["ns_per_context_token_model"].get<double>(), s["intercept_ms_model"].get<double>(),
        s["r2"].get<double>(), s["n_contexts"].get<size_t>());
  }
  fmt::print("ordering ({}):\n", report["ordering"]["rule"].get<std::string>());
  for (const auto& o : report["ordering"]["by_context"]) {
    std::string order;
    for (const auto& pair : o["fastest_first"]) {
      order += (order.empty() ? "" : " < ") + pair.get<std::string>();
    }
    fmt::print("  {:<13} {:>7}: {} ({})\n", o["model"].get<std::string>(),
               o["context"].get<uint32_t>(),
               !o.contains("kept") ? "n/a" : (o["kept"].get<bool>() ? "kept" : "NOT kept"), order);
  }
  if (real) return;  // the roofline target is a synthetic geometry's
  const auto& t = report["roofline_target"];
  if (t.contains("ratio")) {
    fmt::print(
        "target: {} at {} tokens, f16, all layers: {:.3f} ms per token, {:.2f}x the roofline "
        "{:.3f} ms (target <= {:.1f}x): {}\n",
        t["model"].get<std::string>(), t["context"].get<uint32_t>(),
        t["f16_ms_per_token_model"].get<double>(), t["ratio"].get<double>(),
        t["roofline_ms_model"].get<double>(), t["target_ratio"].get<double>(),
        t["met"].get<bool>() ? "met" : "MISSED");
  } else {
    fmt::print("target: qwen2.5-0.5b at 4096 tokens not measured in this run\n");
  }
}

}  // namespace argus::cli
