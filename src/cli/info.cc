// argus info: what this build is and what this machine can do.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "argus/codec.h"
#include "argus/core.h"
#include "cli/commands.h"
#include "core/build_info.h"
#include "core/probe.h"

namespace argus::cli {

void AddInfoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Version, build flags, CPU features and machine probes");
  struct Options {
    bool json = false;
    unsigned threads = 0;
  };
  auto opt = std::make_shared<Options>();  // owned by the callback, which the app keeps
  cmd->add_flag("--json", opt->json, "Print JSON instead of text");
  AddThreadsOption(*cmd, opt->threads, "Threads for the all-threads bandwidth probe (0: all)");
  cmd->callback([opt] {
    const BuildInfo& build = GetBuildInfo();
    ThreadPool pool(opt->threads);
    std::fprintf(stderr, "argus info: probing memory bandwidth and FMA rate...\n");
    MachineProbe probe = ValueOrThrow(ProbeMachine(pool));
    if (opt->json) {
      nlohmann::json j = {
          {"version", build.version},
          {"compiler", build.compiler},
          {"build_type", build.build_type},
          {"flags", build.flags},
          {"cpu_features", GetCpuFeatures().ToString()},
          {"kernel_path", std::string(KernelPathName(BestKernelPath()))},
          {"last_level_cache_bytes", LastLevelCacheBytes()},
          {"probe",
           {{"read_gbps_one_thread", probe.read_gbps_one_thread},
            {"read_gbps_all_threads", probe.read_gbps_all_threads},
            {"fma_gflops_one_thread", probe.fma_gflops_one_thread},
            {"fma_gflops_all_threads", probe.fma_gflops_all_threads},
            {"buffer_bytes", probe.buffer_bytes},
            {"threads", probe.n_threads}}},
      };
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("argus {}\n", build.version);
    fmt::print("build        {} {} [{}]\n", build.compiler, build.build_type, build.flags);
    fmt::print("cpu          {}\n", GetCpuFeatures().ToString());
    fmt::print("kernels      {}\n", KernelPathName(BestKernelPath()));
    fmt::print("llc          {:.0f} MiB\n", static_cast<double>(LastLevelCacheBytes()) / (1 << 20));
    fmt::print("read bw      {:.1f} GB/s (1 thread), {:.1f} GB/s ({} threads), over {:.0f} MiB\n",
               probe.read_gbps_one_thread, probe.read_gbps_all_threads, probe.n_threads,
               static_cast<double>(probe.buffer_bytes) / (1 << 20));
    fmt::print("fma peak     {:.1f} GFLOP/s fp32 (1 thread), {:.1f} GFLOP/s ({} threads)\n",
               probe.fma_gflops_one_thread, probe.fma_gflops_all_threads, probe.n_threads);
  });
}

}  // namespace argus::cli
