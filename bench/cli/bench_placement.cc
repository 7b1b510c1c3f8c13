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

nlohmann::json PlacementJson(const PlacementStats& s) {
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
Result<nlohmann::json> MeasureActivation(const Trace& trace, const ReplayOptions& base, int reps,
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
  return nlohmann::json{{"profile", "research"},
                        {"ram_budget_bytes", 2 * exact_bytes},
                        {"engine_active", active},
                        {"bit_identical", identical},
                        {"plain_seconds_per_token", best_plain},
                        {"engine_seconds_per_token", best_engine},
                        {"time_ratio", best_engine / best_plain},
                        {"reps", reps}};
}

}  // namespace

Result<nlohmann::json> RunPlacementBench(const PlacementBenchOptions& o) {
  ARGUS_ASSIGN_OR_RETURN(ModelGeometry model, FindModel(o.model));
  model.geometry.n_layers = o.layers;
  ThreadPool pool(o.threads);
  nlohmann::json report;
  report["config"] = {
      {"model", o.model},       {"layers", o.layers},           {"prefix_tokens", o.prefix_tokens},
      {"steps", o.steps},       {"page_tokens", o.page_tokens}, {"budgets", o.budgets},
      {"profiles", o.profiles}, {"hot_mass", o.hot_mass},       {"threads", pool.n_threads()},
      {"seed", o.seed}};
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
    nlohmann::json tj = {{"name", tc.name},
                         {"kind", TraceKindName(tc.kind)},
                         {"exact_bytes", reference.exact_bytes},
                         {"runs", nlohmann::json::array()}};
    if (tc.kind == TraceKind::kNeedle) tj["needle_depth"] = tc.needle_depth;
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
        nlohmann::json rj = {
            {"profile", profile.name}, {"budget_fraction", fraction}, {"ram_budget_bytes", budget}};
        if (!result.ok()) {
          fmt::print(stderr, "  failed: {}\n", result.status().ToString());
          rj["error"] = result.status().ToString();
          tj["runs"].push_back(rj);
          continue;
        }
        const uint64_t misses = OptimalMisses(reference.hot_pages, capacity_pages,
                                              PinnedAtStart(trace, profile, o.page_tokens));
        const double optimum = static_cast<double>(misses * page_bytes) / o.steps;
        const double disk = static_cast<double>(result->disk_bytes_read) / o.steps;
        rj["seconds_per_token"] = result->seconds_per_token();
        rj["exact_ram_seconds_per_token"] = ref_seconds;
        rj["time_vs_exact_ram"] = result->seconds_per_token() / ref_seconds;
        rj["disk_bytes_per_token"] = disk;
        rj["optimal_disk_bytes_per_token"] = optimum;
        rj["disk_vs_optimum"] = optimum > 0 ? nlohmann::json(disk / optimum)
                                : disk > 0  ? nlohmann::json("inf")
                                            : nlohmann::json(1.0);
        rj["max_rel_error"] = result->max_rel_error;
        rj["mean_rel_error"] = result->mean_rel_error;
        rj["step_errors"] = result->step_errors;
        rj["bit_identical"] = result->max_rel_error == 0;
        rj["needle_steps"] = result->n_target_steps;
        rj["needle_found"] = result->n_targets_found;
        rj["prefix_seconds"] = result->prefix_seconds;
        rj["placement"] = PlacementJson(result->placement);
        fmt::print(stderr,
                   "  time x{:.2f}, disk {:.2f} MB/token (optimum {:.2f}), error {:.2e} max "
                   "{:.2e} mean, targets {}/{}\n",
                   result->seconds_per_token() / ref_seconds, disk / 1e6, optimum / 1e6,
                   result->max_rel_error, result->mean_rel_error, result->n_targets_found,
                   result->n_target_steps);
        tj["runs"].push_back(rj);
      }
    }
    report["traces"].push_back(tj);
    if (o.activation_reps > 0 && !report.contains("activation")) {
      fmt::print(stderr, "bench placement: activation overhead on trace {}\n", tc.name);
      ARGUS_ASSIGN_OR_RETURN(
          report["activation"],
          MeasureActivation(trace, base, o.activation_reps, o.dir + "/argus-bench-placement",
                            reference.exact_bytes));
      report["activation"]["trace"] = tc.name;
    }
  }
  return report;
}

void PrintPlacementBench(const nlohmann::json& report) {
  for (const auto& trace : report["traces"]) {
    fmt::print("\ntrace {} ({} MB exact)\n", trace["name"].get<std::string>(),
               trace["exact_bytes"].get<double>() / 1e6);
    fmt::print("{:>6} {:>10} {:>9} {:>12} {:>12} {:>10} {:>10} {:>8}\n", "budget", "profile",
               "time/RAM", "disk MB/tok", "optimum MB", "max err", "mean err", "needle");
    for (const auto& run : trace["runs"]) {
      if (run.contains("error")) {
        fmt::print("{:>5.0f}% {:>10} {}\n", run["budget_fraction"].get<double>() * 100,
                   run["profile"].get<std::string>(), run["error"].get<std::string>());
        continue;
      }
      fmt::print("{:>5.0f}% {:>10} {:>9.2f} {:>12.3f} {:>12.3f} {:>10.2e} {:>10.2e} {:>4}/{:<3}\n",
                 run["budget_fraction"].get<double>() * 100, run["profile"].get<std::string>(),
                 run["time_vs_exact_ram"].get<double>(),
                 run["disk_bytes_per_token"].get<double>() / 1e6,
                 run["optimal_disk_bytes_per_token"].get<double>() / 1e6,
                 run["max_rel_error"].get<double>(), run["mean_rel_error"].get<double>(),
                 run["needle_found"].get<uint32_t>(), run["needle_steps"].get<uint32_t>());
    }
  }
  if (report.contains("activation")) {
    const auto& a = report["activation"];
    fmt::print("below the high-water mark ({}): engine active {}, bit-identical {}, time x{:.3f}\n",
               a["trace"].get<std::string>(), a["engine_active"].get<bool>(),
               a["bit_identical"].get<bool>(), a["time_ratio"].get<double>());
  }
  fmt::print("\n");
}

}  // namespace argus::cli
