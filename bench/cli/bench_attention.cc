// argus-bench attention: decode attention over a KvCache, per token and per layer, for model
// geometries, context lengths and K/V codec pairs, each pair timed beside the f16 cache of the
// same context; or, with --kv-dir, over real activations dumped by `argus eval --dump-kv`, with
// the output error against double precision.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "argus/core.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "cli/stats_json.h"
#include "core/probe.h"
#include "eval/kv_dump.h"

namespace argus::cli {
namespace {

constexpr const char* kOrderingRule =
    "by time ratio to f16 measured side by side: every 4-bit pair faster than every 8-bit pair, "
    "every 8-bit pair faster than f16";

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

// A pass's time figures; `scale` takes the layers built to the whole model.
AttentionTimeFigures TimeFigures(double seconds, const PassWork& work, uint32_t layers,
                                 double scale, double read_gbps, double fma_gflops) {
  const double bytes_seconds = work.bytes / (read_gbps * 1e9);
  const double fma_seconds = 2 * work.fmas / (fma_gflops * 1e9);
  const double roofline = std::max(bytes_seconds, fma_seconds);
  return {.ms_per_token_per_layer = seconds * 1e3 / layers,
          .ms_per_token_model = seconds * 1e3 * scale,
          .read_gbps = work.bytes / seconds / 1e9,
          .bandwidth_fraction = bytes_seconds / seconds,
          .fma_fraction = fma_seconds / seconds,
          .roofline_ms_model = roofline * 1e3 * scale,
          .roofline_ratio = seconds / roofline,
          .roofline_bound = bytes_seconds >= fma_seconds ? "bandwidth" : "fma"};
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

// The output error of a pass against the model's reference.
AttentionErrors ErrorFigures(const std::vector<float>& out, const BenchModel& m) {
  const CacheGeometry& g = m.model.geometry;
  const size_t layer_values = size_t{g.n_q_heads} * g.head_dim;
  std::vector<double> by_layer;
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
  return {.max_rel_error = max_error,
          .mean_rel_error = mean_error,
          .max_rel_error_by_layer = std::move(by_layer)};
}

// Rows of one context of one model into `results`: every pair's cache timed side by side with the
// f16 cache of the same data (pairs[0] is f16/f16).
Status MeasureContext(const BenchModel& m, uint32_t n_tokens, const std::vector<CodecPair>& pairs,
                      const BenchRun& run, std::vector<AttentionRow>& results) {
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
    const PassWork work{static_cast<double>(times.best.attention.bytes_read),
                        2.0 * g.n_q_heads * n_tokens * g.head_dim * m.n_layers};
    if (!own) f16_work = work;
    best_f16_seconds = std::min(best_f16_seconds, times.best_reference.seconds);
    AttentionRow row{
        .model = m.model.name,
        .model_layers = g.n_layers,
        .context = n_tokens,
        .pair = pair,
        .code_bits = PairCodeBits(pair),
        .f16_ms_per_token_model = times.best_reference.seconds * 1e3 * scale,
        .time_ratio_to_f16 = times.time_ratio(),
        .kv_bytes_model = static_cast<double>(stats.page_bytes) * scale,
        .bytes_read_per_token_model = work.bytes * scale,
        .fmas_per_token_model = work.fmas * scale,
        .cache = stats,
        .cache_budget_bytes = measured.budget_bytes,
        .overhead_rss_bytes = overhead_rss,
        .peak_rss_bytes = peak_rss,
        .accounted_bytes = accounted,
        .peak_rss_reset = peak_reset,
        .fill_seconds = measured.fill_seconds,
        .time = TimeFigures(times.best.seconds, work, m.n_layers, scale, run.read_gbps,
                            run.fma_gflops)};
    if (!m.reference_out.empty()) {
      // Outputs do not depend on timing or threads: one more untimed pass gives them.
      std::vector<float> out(m.reference_out.size());
      ARGUS_RETURN_IF_ERROR(
          DecodeAllLayers(run.engine, measured, m.q, out.data(), nullptr, m.q_layer_stride)
              .status());
      row.errors = ErrorFigures(out, m);
    }
    results.push_back(row);
    own.reset();
    ReleaseFreedMemory();
  }
  AttentionRow& f16 = results[f16_row];
  f16.time =
      TimeFigures(best_f16_seconds, f16_work, m.n_layers, scale, run.read_gbps, run.fma_gflops);
  f16.f16_ms_per_token_model = f16.time.ms_per_token_model;
  f16.f16_passes = run.reps * pairs.size();
  return Status::Ok();
}

}  // namespace

// ---- argus-bench attention ------------------------------------------------------------------

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
                        std::vector<AttentionRow>& results) {
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

Result<AttentionBenchReport> RunAttentionBench(const AttentionBenchOptions& options) {
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

  AttentionBenchReport report{.machine = probe,
                              .last_level_cache_bytes = LastLevelCacheBytes(),
                              .cpu_features = GetCpuFeatures().ToString(),
                              .kernel_path = std::string(KernelPathName(BestKernelPath())),
                              .options = options,
                              .contexts = contexts,
                              .layers = real ? dump->model.geometry.n_layers : options.layers,
                              .threads = n_threads,
                              .bandwidth_gbps_used = read_gbps,
                              .fma_gflops_used = fma_gflops};
  for (const CodecPair& pair : pairs) report.pairs.push_back(pair.name());
  for (const ModelGeometry& model : models) report.models.push_back(model.name);
  if (real) {
    report.geometry = dump->model.geometry.ToString();
    fmt::print(stderr, "bench attention: {} ({}), {} tokens, reference in double...\n",
               dump->model.name, report.geometry, dump->n_tokens);
    ARGUS_RETURN_IF_ERROR(
        MeasureContext(DumpBenchModel(*dump), dump->n_tokens, pairs, run, report.results));
  } else {
    report.regime = std::string(KeyRegimeName(kRegime));
    report.pool_tokens = pool_tokens;
    ARGUS_RETURN_IF_ERROR(MeasureSynthetic(models, contexts, pool_tokens, kRegime, options, pairs,
                                           run, pool, report.results));
  }

  // Time against context per (model, pair), and the ordering of the code-bit classes.
  for (const ModelGeometry& model : models) {
    for (const CodecPair& pair : pairs) {
      std::vector<double> x, y;
      for (const AttentionRow& row : report.results) {
        if (row.model == model.name && row.pair.name() == pair.name()) {
          x.push_back(row.context);
          y.push_back(row.time.ms_per_token_model);
        }
      }
      AttentionSlope& slope = report.slopes.emplace_back(
          AttentionSlope{.model = model.name, .pair = pair.name(), .n_contexts = x.size()});
      if (x.size() >= 2) slope.fit = FitLine(x, y);
    }
    for (uint32_t n_tokens : contexts) {
      // Lowest and highest time ratio to f16 (measured side by side) of each class: 4-bit,
      // 8-bit and 16-bit codes.
      std::map<uint32_t, std::pair<double, double>> classes;
      std::vector<std::pair<double, std::string>> order;
      for (const AttentionRow& row : report.results) {
        if (row.model != model.name || row.context != n_tokens) continue;
        const double ratio = row.time_ratio_to_f16;
        order.emplace_back(ratio, row.pair.name());
        const uint32_t bits = row.code_bits;
        if (bits != 4 && bits != 8 && bits != 16) continue;
        auto [it, inserted] = classes.emplace(bits, std::make_pair(ratio, ratio));
        it->second.first = std::min(it->second.first, ratio);
        it->second.second = std::max(it->second.second, ratio);
      }
      std::sort(order.begin(), order.end());
      AttentionOrdering& entry = report.ordering.emplace_back(
          AttentionOrdering{.model = model.name, .context = n_tokens, .classes = classes.size()});
      for (const auto& [ratio, name] : order) entry.fastest_first.push_back(name);
      if (classes.size() >= 2) {
        // Each class's slowest pair is faster than the next wider class's fastest.
        bool kept = true;
        for (auto it = classes.begin(); std::next(it) != classes.end(); ++it) {
          kept = kept && it->second.second < std::next(it)->second.first;
        }
        entry.kept = kept;
        report.ordering_kept = report.ordering_kept && kept;
      }
    }
  }
  return report;
}

void to_json(nlohmann::json& j, const AttentionRow& r) {
  const double accounted = static_cast<double>(r.accounted_bytes);
  const double overhead = static_cast<double>(r.overhead_rss_bytes);
  const double peak = static_cast<double>(r.peak_rss_bytes);
  const AttentionTimeFigures& t = r.time;
  j = {{"model", r.model},
       {"model_layers", r.model_layers},
       {"context", r.context},
       {"pair", r.pair.name()},
       {"k_codec", r.pair.k},
       {"v_codec", r.pair.v},
       {"code_bits", r.code_bits},
       {"f16_ms_per_token_model", r.f16_ms_per_token_model},
       {"time_ratio_to_f16", r.time_ratio_to_f16},
       {"speedup_vs_f16", r.speedup_vs_f16()},
       {"kv_bytes_model", r.kv_bytes_model},
       {"bytes_read_per_token_model", r.bytes_read_per_token_model},
       {"fmas_per_token_model", r.fmas_per_token_model},
       {"cache_page_bytes", r.cache.page_bytes},
       {"cache_metadata_bytes", r.cache.metadata_bytes},
       {"cache_budget_bytes", r.cache_budget_bytes},
       {"cache_bytes_by_codec", r.cache.by_codec},
       {"overhead_rss_bytes", r.overhead_rss_bytes},
       {"peak_rss_bytes", r.peak_rss_bytes},
       {"accounted_bytes", r.accounted_bytes},
       {"rss_to_accounted", peak / accounted},
       // The caches alone: RSS growth over the overhead against their byte accounting.
       {"cache_rss_to_accounted", (peak - overhead) / (accounted - overhead)},
       {"peak_rss_reset", r.peak_rss_reset},
       {"fill_seconds", r.fill_seconds},
       {"ms_per_token_per_layer", t.ms_per_token_per_layer},
       {"ms_per_token_model", t.ms_per_token_model},
       {"read_gbps", t.read_gbps},
       {"bandwidth_fraction", t.bandwidth_fraction},
       {"fma_fraction", t.fma_fraction},
       {"roofline_ms_model", t.roofline_ms_model},
       {"roofline_ratio", t.roofline_ratio},
       {"roofline_bound", t.roofline_bound}};
  if (r.errors) {
    j["max_rel_error"] = r.errors->max_rel_error;
    j["mean_rel_error"] = r.errors->mean_rel_error;
    j["max_rel_error_by_layer"] = r.errors->max_rel_error_by_layer;
  }
  if (r.f16_passes) j["f16_passes"] = *r.f16_passes;
}

void to_json(nlohmann::json& j, const AttentionBenchReport& r) {
  const AttentionBenchOptions& o = r.options;
  nlohmann::json config = {{"contexts", r.contexts},
                           {"models", r.models},
                           {"pairs", r.pairs},
                           {"layers", r.layers},
                           {"threads", r.threads},
                           {"reps", o.reps},
                           {"quick", o.quick},
                           {"page_tokens", o.page_tokens},
                           {"bandwidth_gbps_used", r.bandwidth_gbps_used},
                           {"fma_gflops_used", r.fma_gflops_used},
                           {"llc_evicted_before_each_call", true}};
  if (r.real()) {
    config["kv_dir"] = o.kv_dir;
    config["geometry"] = r.geometry;
    config["real"] =
        "K/V of every layer of the dump, all its tokens; one decode step at the last position with "
        "each layer's last-token query; error: per query head ||o - ref|| / ||ref|| against "
        "ReferenceAttention in double on the dump's float32 K/V, max and mean over layers and "
        "heads";
  } else {
    config.update({{"regime", r.regime},
                   {"seed", o.seed},
                   {"pool_tokens", r.pool_tokens},
                   {"synthetic",
                    "GenerateSyntheticKv per KV head (seed + head), pool_tokens long, "
                    "repeated to the context; every layer holds the same data and is "
                    "decoded with the same queries"}});
  }
  nlohmann::json slopes = nlohmann::json::array(), ordering = nlohmann::json::array();
  for (const AttentionSlope& s : r.slopes) {
    nlohmann::json slope = {{"model", s.model}, {"pair", s.pair}, {"n_contexts", s.n_contexts}};
    if (s.fit) {
      slope["ns_per_context_token_model"] = s.fit->slope * 1e6;
      slope["intercept_ms_model"] = s.fit->intercept;
      slope["r2"] = s.fit->r2;
    }
    slopes.push_back(slope);
  }
  for (const AttentionOrdering& by_context : r.ordering) {
    nlohmann::json entry = {{"model", by_context.model},
                            {"context", by_context.context},
                            {"fastest_first", by_context.fastest_first},
                            {"classes", by_context.classes}};
    if (by_context.kept) entry["kept"] = *by_context.kept;
    ordering.push_back(entry);
  }
  const MachineProbe& m = r.machine;
  j = {{"machine",
        {{"read_gbps_one_thread", m.read_gbps_one_thread},
         {"read_gbps_all_threads", m.read_gbps_all_threads},
         {"fma_gflops_one_thread", m.fma_gflops_one_thread},
         {"fma_gflops_all_threads", m.fma_gflops_all_threads},
         {"probe_threads", m.n_threads},
         {"last_level_cache_bytes", r.last_level_cache_bytes},
         {"cpu_features", r.cpu_features},
         {"kernel_path", r.kernel_path}}},
       {"config", config},
       {"results", r.results},
       {"slopes", slopes},
       {"ordering",
        {{"rule", kOrderingRule},
         {"kept_everywhere", r.ordering_kept},
         {"by_context", ordering}}}};
}

void PrintAttentionBench(const AttentionBenchReport& report) {
  const MachineProbe& m = report.machine;
  fmt::print(
      "machine: read {:.1f} GB/s (1 thread), {:.1f} GB/s ({} threads), FMA {:.1f} GFLOP/s "
      "(1 thread), {:.1f} GFLOP/s ({} threads), LLC {:.0f} MiB\n",
      m.read_gbps_one_thread, m.read_gbps_all_threads, m.n_threads, m.fma_gflops_one_thread,
      m.fma_gflops_all_threads, m.n_threads,
      static_cast<double>(report.last_level_cache_bytes) / (1 << 20));
  const bool real = report.real();
  if (real) {
    fmt::print(
        "decode attention, {} threads, real K/V from {} ({}, {} tokens): every layer built and "
        "timed, one Decode call per layer\non an evicted last-level cache, each layer's last-token "
        "query; best of {} passes interleaved with the f16 cache's; pages of {} tokens\n"
        "err max, mean: per query head ||o - ref|| / ||ref|| against double precision on the "
        "float32 dump, max and mean over layers and heads\n",
        report.threads, report.options.kv_dir, report.geometry, report.contexts[0],
        report.options.reps, report.options.page_tokens);
  } else {
    fmt::print(
        "decode attention, {} threads, {} layers of each model built and timed (whole-model "
        "figures scaled), one Decode call per layer on an evicted last-level cache,\nbest of {} "
        "passes interleaved with the f16 cache's; "
        "synthetic KV ({}): {} tokens per KV head repeated to the context; pages of {} tokens\n",
        report.threads, report.layers, report.options.reps, report.regime, report.pool_tokens,
        report.options.page_tokens);
  }
  fmt::print(
      "f16 ms beside: the f16 cache's time in the passes interleaved with the pair's (f16/f16: "
      "best of all f16 passes); speedup = f16 beside / ms\n"
      "bw, fma: achieved read rate and float-equivalent FMA rate over the probes ({:.1f} GB/s, "
      "{:.1f} GFLOP/s); /roof: time over max(bytes/bw, flops/fma)\n"
      "peak RSS (VmHWM) against acct = RSS before the caches + their page and metadata bytes; "
      "cache RSS/ = the growth over that RSS against the caches' bytes\n",
      report.bandwidth_gbps_used, report.fma_gflops_used);
  std::string current_model;
  for (const AttentionRow& row : report.results) {
    if (row.model != current_model) {
      current_model = row.model;
      fmt::print("\n{} ({} layers)\n", current_model, row.model_layers);
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
        row.errors ? fmt::format(" | {:>9.2e} {:>9.2e}", row.errors->max_rel_error,
                                 row.errors->mean_rel_error)
                   : "";
    const double peak = static_cast<double>(row.peak_rss_bytes);
    const double accounted = static_cast<double>(row.accounted_bytes);
    const double overhead = static_cast<double>(row.overhead_rss_bytes);
    fmt::print(
        "{:>7} {:<20} {:>8.3f} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.3f} {:>8.1f} {:>5.2f} {:>5.2f} "
        "{:>6.2f} | {:>8.0f} {:>8.0f} {:>6.2f} {:>6.2f}{}\n",
        row.context, row.pair.name(), row.time.ms_per_token_per_layer, row.time.ms_per_token_model,
        row.f16_ms_per_token_model, row.speedup_vs_f16(), row.kv_bytes_model / (1 << 30),
        row.bytes_read_per_token_model / 1e6, row.time.bandwidth_fraction, row.time.fma_fraction,
        row.time.roofline_ratio, peak / (1 << 20), accounted / (1 << 20), peak / accounted,
        (peak - overhead) / (accounted - overhead), errors);
  }
  const auto& slopes = report.slopes;
  if (std::any_of(slopes.begin(), slopes.end(), [](const AttentionSlope& s) { return s.fit; })) {
    fmt::print("\ntime per token against context (whole model, least squares):\n");
  } else {
    fmt::print("\n");
  }
  for (const AttentionSlope& s : slopes) {
    if (!s.fit) continue;
    fmt::print(
        "  {:<13} {:<20} {:>9.2f} ns per context token, intercept {:>+8.3f} ms (R^2 {:.4f}, "
        "{} contexts)\n",
        s.model, s.pair, s.fit->slope * 1e6, s.fit->intercept, s.fit->r2, s.n_contexts);
  }
  fmt::print("ordering ({}):\n", kOrderingRule);
  for (const AttentionOrdering& o : report.ordering) {
    std::string order;
    for (const std::string& pair : o.fastest_first) order += (order.empty() ? "" : " < ") + pair;
    fmt::print("  {:<13} {:>7}: {} ({})\n", o.model, o.context,
               !o.kept ? "n/a" : (*o.kept ? "kept" : "NOT kept"), order);
  }
}

}  // namespace argus::cli
