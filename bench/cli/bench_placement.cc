// `argus-bench placement`: every profile on identical work (traces), under RAM budgets that are
// fractions of the exact cache, side by side with the exact cache all in RAM (time, error) and
// with the offline optimum (disk bytes).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "argus/core.h"
#include "argus/eval.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "cli/commands.h"

namespace argus::cli {
namespace {

struct TraceCase {
  std::string name;
  TraceKind kind;
  double needle_depth = 0.5;
};

std::vector<TraceCase> DefaultTraces() {
  return {{"recency", TraceKind::kRecency},
          {"recall", TraceKind::kRecall},
          {"needle@0.1", TraceKind::kNeedle, 0.1},
          {"needle@0.5", TraceKind::kNeedle, 0.5},
          {"needle@0.9", TraceKind::kNeedle, 0.9}};
}

// The pages every profile pins when decoding starts (sinks and the recent window), as the
// optimum's starting content, in the ids ReplayResult::hot_pages uses.
std::vector<uint32_t> PinnedAtStart(const Trace& trace, const Profile& profile,
                                    uint32_t page_tokens) {
  std::vector<uint32_t> pinned;
  const uint32_t n = trace.options.n_prefix_tokens;
  for (uint32_t layer = 0; layer < trace.options.geometry.n_layers; ++layer) {
    for (uint32_t first = 0; first < trace.n_tokens(); first += page_tokens) {
      if (first < profile.pin_sinks || first + page_tokens + profile.pin_recent > n) {
        pinned.push_back(layer << 20 | first / page_tokens);
      }
    }
  }
  return pinned;
}

Result<ReplayResult> RunOnDisk(const Trace& trace, ReplayOptions options, const std::string& dir,
                               size_t disk_budget) {
  std::filesystem::remove_all(dir);
  DiskTierOptions d;
  d.dir = dir;
  d.disk_budget_bytes = disk_budget;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> disk, DiskTier::Open(d));
  options.disk = disk.get();
  auto result = Replay(trace, options);
  disk.reset();
  std::filesystem::remove_all(dir);
  return result;
}

nlohmann::json PlacementStatsJson(const PlacementStats& s) {
  nlohmann::json paths = nlohmann::json::object();
  for (const auto& [codec, path] : s.kernel_paths) paths[codec] = path;
  return {{"active", s.active},
          {"ram_read_gbps", s.ram_read_gbps},
          {"disk_read_gbps", s.disk_read_gbps},
          {"step_seconds", s.step_seconds},
          {"disk_pages_allowed", s.n_disk_pages_allowed},
          {"plans", s.n_plans},
          {"promotions", s.n_promotions},
          {"promotions_on_demand", s.n_promotions_on_demand},
          {"refetched_calls", s.n_refetched_steps},
          {"demotions", s.n_demotions},
          {"migrations_dropped", s.n_migrations_dropped},
          {"last_error", s.last_error},
          {"promoted_bytes_read", s.promoted_bytes_read},
          {"attention_disk_bytes_read", s.attention_disk_bytes_read},
          {"master_bytes_written", s.master_bytes_written},
          {"prefetches", s.n_prefetches},
          {"prefetches_used", s.n_prefetches_used},
          {"prefetches_wasted", s.n_prefetches_wasted},
          {"tiles_skipped", s.n_tiles_skipped},
          {"max_skipped_mass_bound", s.max_skipped_mass_bound},
          {"ram_budget_bytes", s.ram_budget_bytes},
          {"ram_used_bytes", s.ram_used_bytes},
          {"disk_used_bytes", s.disk_used_bytes},
          {"pages_per_state", s.pages_per_state},
          {"effective_bits_per_value", s.effective_bits_per_value},
          {"kernel_paths", paths}};
}

// Below the high-water mark: the engine (research profile, budget twice the exact cache) beside
// the plain cache, interleaved; the engine must stay inactive and change nothing.
Result<ActivationFigures> MeasureActivation(const Trace& trace, const ReplayOptions& base, int reps,
                                            const std::string& dir, size_t exact_bytes) {
  ReplayOptions plain = base;
  plain.engine = false;
  plain.keep_outputs = true;
  ReplayOptions engine = base;
  ARGUS_ASSIGN_OR_RETURN(engine.placement.profile, Profile::BuiltIn("research"));
  engine.ram_budget_bytes = 2 * exact_bytes;
  engine.keep_outputs = true;
  double best_plain = 1e30, best_engine = 1e30;
  bool identical = true, active = false;
  for (int r = 0; r < reps; ++r) {
    ARGUS_ASSIGN_OR_RETURN(ReplayResult p, Replay(trace, plain));
    ARGUS_ASSIGN_OR_RETURN(ReplayResult e, RunOnDisk(trace, engine, dir, 2 * exact_bytes));
    best_plain = std::min(best_plain, p.seconds_per_token());
    best_engine = std::min(best_engine, e.seconds_per_token());
    identical = identical && p.outputs == e.outputs;
    active = active || e.placement.active;
  }
  return ActivationFigures{.profile = "research",
                           .ram_budget_bytes = 2 * exact_bytes,
                           .engine_active = active,
                           .bit_identical = identical,
                           .plain_seconds_per_token = best_plain,
                           .engine_seconds_per_token = best_engine,
                           .reps = reps};
}

}  // namespace

void to_json(nlohmann::json& j, const PlacementRun& r) {
  j = {{"profile", r.profile},
       {"budget_fraction", r.budget_fraction},
       {"ram_budget_bytes", r.ram_budget_bytes}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return;
  }
  const double disk = r.disk_bytes_per_token, optimum = r.optimal_disk_bytes_per_token;
  j["seconds_per_token"] = r.seconds_per_token;
  j["exact_ram_seconds_per_token"] = r.exact_ram_seconds_per_token;
  j["time_vs_exact_ram"] = r.time_vs_exact_ram();
  j["disk_bytes_per_token"] = disk;
  j["optimal_disk_bytes_per_token"] = optimum;
  j["disk_vs_optimum"] = optimum > 0 ? nlohmann::json(disk / optimum)
                         : disk > 0  ? nlohmann::json("inf")
                                     : nlohmann::json(1.0);
  j["max_rel_error"] = r.max_rel_error;
  j["mean_rel_error"] = r.mean_rel_error;
  j["step_errors"] = r.step_errors;
  j["bit_identical"] = r.max_rel_error == 0;
  j["needle_steps"] = r.needle_steps;
  j["needle_found"] = r.needle_found;
  j["prefix_seconds"] = r.prefix_seconds;
  j["placement"] = PlacementStatsJson(r.placement);
}

void to_json(nlohmann::json& j, const PlacementTrace& t) {
  j = {{"name", t.name},
       {"kind", TraceKindName(t.kind)},
       {"exact_bytes", t.exact_bytes},
       {"runs", t.runs}};
  // Each profile beside the cascade (exact pages, LRU to disk) at the same budget, same run.
  for (size_t i = 0; i < t.runs.size(); ++i) {
    const PlacementRun& run = t.runs[i];
    const auto cascade = std::find_if(t.runs.begin(), t.runs.end(), [&](const PlacementRun& c) {
      return c.profile == "cascade" && c.budget_fraction == run.budget_fraction && c.error.empty();
    });
    if (cascade == t.runs.end() || run.profile == "cascade" || !run.error.empty()) continue;
    nlohmann::json& rj = j["runs"][i];
    rj["time_gain_vs_cascade"] = cascade->seconds_per_token / run.seconds_per_token;
    rj["disk_gain_vs_cascade"] =
        run.disk_bytes_per_token > 0
            ? nlohmann::json(cascade->disk_bytes_per_token / run.disk_bytes_per_token)
            : nlohmann::json("inf");
  }
  if (t.kind == TraceKind::kNeedle) j["needle_depth"] = t.needle_depth;
}

void to_json(nlohmann::json& j, const ActivationFigures& a) {
  j = {{"trace", a.trace},
       {"profile", a.profile},
       {"ram_budget_bytes", a.ram_budget_bytes},
       {"engine_active", a.engine_active},
       {"bit_identical", a.bit_identical},
       {"plain_seconds_per_token", a.plain_seconds_per_token},
       {"engine_seconds_per_token", a.engine_seconds_per_token},
       {"time_ratio", a.engine_seconds_per_token / a.plain_seconds_per_token},
       {"reps", a.reps}};
}

void to_json(nlohmann::json& j, const PlacementReport& r) {
  const PlacementBenchOptions& c = r.config;
  j = {{"config",
        {{"model", c.model},
         {"layers", c.layers},
         {"prefix_tokens", c.prefix_tokens},
         {"steps", c.steps},
         {"page_tokens", c.page_tokens},
         {"budgets", c.budgets},
         {"profiles", c.profiles},
         {"hot_mass", c.hot_mass},
         {"threads", r.threads},
         {"seed", c.seed}}},
       {"traces", r.traces}};
  if (r.activation) j["activation"] = *r.activation;
}

Result<PlacementReport> RunPlacementBench(const PlacementBenchOptions& o) {
  ARGUS_ASSIGN_OR_RETURN(ModelGeometry model, FindModel(o.model));
  model.geometry.n_layers = o.layers;
  ThreadPool pool(o.threads);
  PlacementReport report{.config = o, .threads = pool.n_threads()};
  std::vector<Profile> profiles;
  for (const std::string& name : o.profiles) {
    ARGUS_ASSIGN_OR_RETURN(Profile p, Profile::Load(name));
    profiles.push_back(std::move(p));
  }
  std::vector<TraceCase> cases = DefaultTraces();
  if (!o.traces.empty()) {
    std::erase_if(cases, [&](const TraceCase& c) {
      return std::find(o.traces.begin(), o.traces.end(), c.name) == o.traces.end();
    });
  }
  for (const TraceCase& tc : cases) {
    TraceOptions to;
    to.kind = tc.kind;
    to.geometry = model.geometry;
    to.n_prefix_tokens = o.prefix_tokens;
    to.n_steps = o.steps;
    to.seed = o.seed;
    to.needle_depth = tc.needle_depth;
    fmt::print(stderr, "bench placement: trace {}: generating\n", tc.name);
    ARGUS_ASSIGN_OR_RETURN(Trace trace, GenerateTrace(to));
    ReplayOptions base;
    base.pool = &pool;
    base.page_tokens = o.page_tokens;
    base.hot_mass = o.hot_mass;
    ReplayOptions exact = base;
    exact.engine = false;
    exact.keep_outputs = true;
    ARGUS_ASSIGN_OR_RETURN(ReplayResult reference, Replay(trace, exact));
    PlacementTrace& tj = report.traces.emplace_back(PlacementTrace{.name = tc.name,
                                                                    .kind = tc.kind,
                                                                    .needle_depth = tc.needle_depth,
                                                                    .exact_bytes =
                                                                        reference.exact_bytes});
    const size_t page_bytes = size_t{o.page_tokens} * model.geometry.n_kv_heads *
                              model.geometry.head_dim * 2 * sizeof(uint16_t);
    for (double fraction : o.budgets) {
      const auto budget =
          static_cast<size_t>(fraction * static_cast<double>(reference.exact_bytes));
      // The reference again, beside this budget's runs: the machine drifts.
      ARGUS_ASSIGN_OR_RETURN(ReplayResult ref_now, Replay(trace, exact));
      const double ref_seconds =
          std::min(ref_now.seconds_per_token(), reference.seconds_per_token());
      const size_t capacity_pages = budget / page_bytes > model.geometry.n_layers
                                        ? budget / page_bytes - model.geometry.n_layers
                                        : 0;
      for (const Profile& profile : profiles) {
        fmt::print(stderr, "bench placement: {} at {:.0f}% RAM, profile {}\n", tc.name,
                   fraction * 100, profile.name);
        ReplayOptions run = base;
        run.placement.profile = profile;
        run.ram_budget_bytes = budget;
        run.reference = &reference.outputs;
        auto result = RunOnDisk(trace, run, o.dir + "/argus-bench-placement",
                                2 * reference.exact_bytes + (size_t{64} << 20));
        PlacementRun& rj = tj.runs.emplace_back(PlacementRun{
            .profile = profile.name, .budget_fraction = fraction, .ram_budget_bytes = budget});
        if (!result.ok()) {
          fmt::print(stderr, "  failed: {}\n", result.status().ToString());
          rj.error = result.status().ToString();
          continue;
        }
        const uint64_t misses = OptimalMisses(reference.hot_pages, capacity_pages,
                                              PinnedAtStart(trace, profile, o.page_tokens));
        const double optimum = static_cast<double>(misses * page_bytes) / o.steps;
        const double disk = static_cast<double>(result->disk_bytes_read) / o.steps;
        rj.seconds_per_token = result->seconds_per_token();
        rj.exact_ram_seconds_per_token = ref_seconds;
        rj.disk_bytes_per_token = disk;
        rj.optimal_disk_bytes_per_token = optimum;
        rj.max_rel_error = result->max_rel_error;
        rj.mean_rel_error = result->mean_rel_error;
        rj.step_errors = result->step_errors;
        rj.needle_steps = result->n_target_steps;
        rj.needle_found = result->n_targets_found;
        rj.prefix_seconds = result->prefix_seconds;
        rj.placement = result->placement;
        fmt::print(stderr,
                   "  time x{:.2f}, disk {:.2f} MB/token (optimum {:.2f}), error {:.2e} max "
                   "{:.2e} mean, targets {}/{}\n",
                   result->seconds_per_token() / ref_seconds, disk / 1e6, optimum / 1e6,
                   result->max_rel_error, result->mean_rel_error, result->n_targets_found,
                   result->n_target_steps);
      }
    }
    if (o.activation_reps > 0 && !report.activation) {
      fmt::print(stderr, "bench placement: activation overhead on trace {}\n", tc.name);
      ARGUS_ASSIGN_OR_RETURN(
          report.activation,
          MeasureActivation(trace, base, o.activation_reps, o.dir + "/argus-bench-placement",
                            reference.exact_bytes));
      report.activation->trace = tc.name;
    }
  }
  return report;
}

void PrintPlacementBench(const PlacementReport& report) {
  for (const PlacementTrace& trace : report.traces) {
    fmt::print("\ntrace {} ({} MB exact)\n", trace.name,
               static_cast<double>(trace.exact_bytes) / 1e6);
    fmt::print("{:>6} {:>10} {:>9} {:>12} {:>12} {:>10} {:>10} {:>8}\n", "budget", "profile",
               "time/RAM", "disk MB/tok", "optimum MB", "max err", "mean err", "needle");
    for (const PlacementRun& run : trace.runs) {
      if (!run.error.empty()) {
        fmt::print("{:>5.0f}% {:>10} {}\n", run.budget_fraction * 100, run.profile, run.error);
        continue;
      }
      fmt::print("{:>5.0f}% {:>10} {:>9.2f} {:>12.3f} {:>12.3f} {:>10.2e} {:>10.2e} {:>4}/{:<3}\n",
                 run.budget_fraction * 100, run.profile, run.time_vs_exact_ram(),
                 run.disk_bytes_per_token / 1e6, run.optimal_disk_bytes_per_token / 1e6,
                 run.max_rel_error, run.mean_rel_error, run.needle_found, run.needle_steps);
    }
  }
  if (const auto& a = report.activation) {
    fmt::print("below the high-water mark ({}): engine active {}, bit-identical {}, time x{:.3f}\n",
               a->trace, a->engine_active, a->bit_identical,
               a->engine_seconds_per_token / a->plain_seconds_per_token);
  }
  fmt::print("\n");
}

}  // namespace argus::cli
