// `argus replay TRACE`: one profile on a trace file, beside the exact cache all in RAM.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "argus/core.h"
#include "argus/eval.h"
#include "cli/commands.h"
#include "cli/model_options.h"

namespace argus::cli {

namespace {

struct ReplayCmdOptions {
  std::string trace_path;
  std::string profile = "research";
  size_t ram_budget_bytes = 0;
  std::string disk_dir;
  size_t disk_budget_bytes = 0;
  uint32_t page_tokens = 256;
  unsigned threads = 0;
  bool json = false;
};

void RunReplay(const ReplayCmdOptions& o) {
  const Trace trace = ValueOrThrow(ReadTrace(o.trace_path));
  ThreadPool pool(o.threads);
  ReplayOptions base;
  base.pool = &pool;
  base.page_tokens = o.page_tokens;
  ReplayOptions exact = base;
  exact.engine = false;
  exact.keep_outputs = true;
  fmt::print(stderr, "replay: the exact cache all in RAM\n");
  const ReplayResult reference = ValueOrThrow(Replay(trace, exact));
  ReplayOptions run = base;
  run.placement.profile = ValueOrThrow(Profile::Load(o.profile));
  run.ram_budget_bytes = o.ram_budget_bytes;
  run.reference = &reference.outputs;
  const std::unique_ptr<DiskTier> disk = OpenDiskTier(
      o.disk_dir,
      o.disk_budget_bytes ? o.disk_budget_bytes : 2 * reference.exact_bytes + (size_t{64} << 20));
  run.disk = disk.get();
  fmt::print(stderr, "replay: profile {} with a RAM budget of {} bytes\n",
             run.placement.profile.name,
             o.ram_budget_bytes ? o.ram_budget_bytes : reference.exact_bytes);
  const ReplayResult r = ValueOrThrow(Replay(trace, run));
  const PlacementStats& s = r.placement;
  nlohmann::json j = {{"trace", o.trace_path},
                      {"profile", run.placement.profile.name},
                      {"ram_budget_bytes", s.ram_budget_bytes},
                      {"exact_bytes", r.exact_bytes},
                      {"active", s.active},
                      {"seconds_per_token", r.seconds_per_token()},
                      {"exact_ram_seconds_per_token", reference.seconds_per_token()},
                      {"time_vs_exact_ram", r.seconds_per_token() / reference.seconds_per_token()},
                      {"disk_bytes_per_token", static_cast<double>(r.disk_bytes_read) / r.n_steps},
                      {"max_rel_error", r.max_rel_error},
                      {"mean_rel_error", r.mean_rel_error},
                      {"targets", r.n_target_steps},
                      {"targets_found", r.n_targets_found},
                      {"promotions", s.n_promotions},
                      {"promotions_on_demand", s.n_promotions_on_demand},
                      {"demotions", s.n_demotions},
                      {"pages_per_state", s.pages_per_state},
                      {"effective_bits_per_value", s.effective_bits_per_value},
                      {"step_seconds", s.step_seconds},
                      {"disk_pages_allowed", s.n_disk_pages_allowed}};
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("profile {} on {} ({} steps), RAM budget {:.1f} MB of {:.1f} MB exact{}\n",
             j["profile"].get<std::string>(), o.trace_path, r.n_steps, s.ram_budget_bytes / 1e6,
             r.exact_bytes / 1e6, s.active ? "" : " (below the high-water mark: inactive)");
  fmt::print("  time per token    {:.3f} ms (x{:.2f} the exact cache all in RAM)\n",
             r.seconds_per_token() * 1e3, j["time_vs_exact_ram"].get<double>());
  fmt::print("  disk read         {:.3f} MB per token\n",
             j["disk_bytes_per_token"].get<double>() / 1e6);
  fmt::print("  error vs exact    {:.2e} max, {:.2e} mean (relative L2 per layer output)\n",
             r.max_rel_error, r.mean_rel_error);
  fmt::print("  targets found     {}/{}\n", r.n_targets_found, r.n_target_steps);
  fmt::print("  migrations        {} promotions ({} on demand), {} demotions\n", s.n_promotions,
             s.n_promotions_on_demand, s.n_demotions);
  fmt::print("  pages per state   {}\n", nlohmann::json(s.pages_per_state).dump());
  fmt::print("  bits per value    {:.2f} in RAM\n", s.effective_bits_per_value);
  fmt::print("  page read rate    {:.1f} GB/s from RAM, {:.2f} GB/s from disk (at start)\n",
             s.ram_read_gbps, s.disk_read_gbps);
  fmt::print("  disk for sketches {} pages allowed (a step measured {:.3f} ms)\n",
             s.n_disk_pages_allowed, s.step_seconds * 1e3);
}

}  // namespace

void AddReplayCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "replay", "Replay a trace through one profile, beside the exact cache all in RAM");
  auto opt = std::make_shared<ReplayCmdOptions>();
  cmd->add_option("trace", opt->trace_path, "Trace file (argus trace generate)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--profile", opt->profile, "Profile: a built-in name or a JSON file")
      ->capture_default_str();
  AsByteSize(cmd->add_option("--ram-budget", opt->ram_budget_bytes,
                             "RAM budget (e.g. 64M; default: the exact cache's size)"));
  cmd->add_option("--disk-dir", opt->disk_dir, "Disk tier directory (profiles with disk states)");
  AsByteSize(cmd->add_option("--disk-budget", opt->disk_budget_bytes,
                             "Disk budget (default: twice the exact cache)"));
  cmd->add_option("--page-tokens", opt->page_tokens, "Tokens per page")->capture_default_str();
  AddThreadsOption(*cmd, opt->threads);
  cmd->add_flag("--json", opt->json, "Print the figures as JSON");
  cmd->callback([opt] { RunReplay(*opt); });
}

}  // namespace argus::cli
