// argus demo: what `make demo` runs. One decode step at 32K tokens on Llama-3-8B geometry over
// a KvCache in three K/V codec mixes, side by side with f16: memory, attention time, error.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "argus/attention.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "cli/commands.h"
#include "core/build_info.h"
#include "eval/long_context.h"

namespace argus::cli {
namespace {

constexpr uint32_t kDemoTokens = 32768;
constexpr uint32_t kDemoLayers = 2;  // built and timed; figures are scaled to the whole model
constexpr int kDemoReps = 5;
constexpr KeyRegime kDemoRegime = KeyRegime::kModerateOutliers;

void RunDemo() {
  const ModelGeometry model = ValueOrThrow(FindModel("llama-3-8b"));
  const CacheGeometry& g = model.geometry;
  const double scale = static_cast<double>(g.n_layers) / kDemoLayers;
  ThreadPool pool;
  AttentionEngine engine(pool);
  fmt::print(
      "ARGUS {}: one decode step at {} tokens of context on Llama-3-8B geometry ({}),\n"
      "the KV cache held in three K/V codec mixes, each timed side by side with f16.\n"
      "Synthetic KV ({}, seed 1); {} layers built and timed, figures for all {}; {} threads.\n\n",
      GetBuildInfo().version, kDemoTokens, g.ToString(), KeyRegimeName(kDemoRegime), kDemoLayers,
      g.n_layers, pool.n_threads());

  fmt::print(stderr, "demo: generating synthetic KV...\n");
  const CacheEvictor evictor = ValueOrThrow(CacheEvictor::Create(pool));
  const SyntheticContext context = MakeSyntheticContext(model, kDemoRegime, 1, kDemoTokens, pool);
  FilledCache reference = ValueOrThrow(
      BuildSyntheticCache(context, kDemoLayers, kDemoTokens, {"f16", "f16"}, 256, "demo"));
  const size_t n_out = size_t{kDemoLayers} * g.n_q_heads * g.head_dim;
  std::vector<float> reference_out(n_out), out(n_out);
  ValueOrThrow(DecodeAllLayers(engine, reference, context.q.data(), reference_out.data()));

  struct Row {
    CodecPair pair;
    double memory_gib, budget_gib, ms, speedup, max_error, mean_error;
  };
  std::vector<Row> rows;
  double best_f16_seconds = 1e30;  // over every f16 pass: the f16 row's time
  for (const CodecPair& pair :
       {CodecPair{"f16", "f16"}, CodecPair{"q8_0", "q8_0"}, CodecPair{"int4:channel", "int4"}}) {
    std::optional<FilledCache> own;
    if (pair.k != "f16" || pair.v != "f16") {
      own.emplace(
          ValueOrThrow(BuildSyntheticCache(context, kDemoLayers, kDemoTokens, pair, 256, "demo")));
    }
    FilledCache& measured = own ? *own : reference;
    fmt::print(stderr, "demo: timing {}...\n", pair.name());
    const SideBySide times = ValueOrThrow(TimeDecodeSideBySide(
        engine, measured, own ? &reference : nullptr, context.q.data(), kDemoReps, evictor));
    best_f16_seconds = std::min(best_f16_seconds, times.best_reference.seconds);
    ValueOrThrow(DecodeAllLayers(engine, measured, context.q.data(), out.data()));
    const HeadErrors error = OutputHeadErrors<float>(out, reference_out, g.head_dim);
    rows.push_back({pair, measured.cache->stats().page_bytes * scale / (1 << 30),
                    measured.budget_bytes * scale / (1 << 30), times.best.seconds * 1e3 * scale,
                    1.0 / times.time_ratio(), error.max, error.mean});
    own.reset();
    ReleaseFreedMemory();
  }
  rows[0].ms = best_f16_seconds * 1e3 * scale;

  fmt::print("{:<20} {:>9} {:>9} | {:>11} {:>7} | {:>21}\n", "K/V codecs", "memory", "budget",
             "attention", "vs f16", "output error vs f16");
  fmt::print("{:<20} {:>9} {:>9} | {:>11} {:>7} | {:>10} {:>10}\n", "", "GiB", "GiB", "ms/token",
             "speedup", "max head", "mean");
  for (const Row& r : rows) {
    fmt::print("{:<20} {:>9.2f} {:>9.2f} | {:>11.2f} {:>6.2f}x | {:>10.2e} {:>10.2e}\n",
               r.pair.name(), r.memory_gib, r.budget_gib, r.ms, r.speedup, r.max_error,
               r.mean_error);
  }
  fmt::print(
      "\nmemory: the cache's page bytes for all {} layers; budget: the RAM budget each cache ran "
      "under.\nattention: one decode step over all layers, each layer's call on an evicted "
      "last-level cache;\nbest of {} passes interleaved with the f16 cache's (f16: best of all "
      "its passes).\nerror: relative L2 "
      "error of each query head's attention output against "
      "the f16 cache's.\n",
      g.n_layers, kDemoReps);
  fmt::print(
      "\nMore: `argus-bench attention` (two models, contexts to 128K, time against context, "
      "memory)\n      `argus-bench codecs` (every codec: kernel speed and quality against double "
      "precision)\n");
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "The default demonstration (about a minute)");
  cmd->callback([] { RunDemo(); });
}

}  // namespace argus::cli
