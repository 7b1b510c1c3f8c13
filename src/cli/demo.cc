// argus demo: what `make demo` runs. The machine, the codecs, and a quick side-by-side
// measurement of the main codecs against f16 (speed, bytes, attention error).
#include <fmt/core.h>

#include "argus/codec.h"
#include "argus/core.h"
#include "cli/bench.h"
#include "cli/commands.h"

namespace argus::cli {

void AddDemoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "The default demonstration (under a minute)");
  cmd->callback([] {
    fmt::print("ARGUS {}: KV-cache codecs measured side by side on this machine\n\n",
               GetBuildInfo().version);
    CodecBenchOptions options;
    options.quick = true;
    options.dims = {128};
    options.groups = {1, 4, 7};
    options.quality_tokens = 2048;
    options.specs = {"f16",      "bf16",   "fp8_e4m3", "q8_0",         "int8",
                     "q4_0",     "iq4_nl", "int4",     "int4:channel", "q4_0+center",
                     "plane8/4", "int2",   "int2+rot", "int1",         "jl"};
    // Codecs not built into this binary are left out rather than failing the demo.
    std::erase_if(options.specs,
                  [](const std::string& s) { return !CodecRegistry::Default().Create(s).ok(); });
    nlohmann::json report = ValueOrThrow(RunCodecBench(options));
    PrintCodecBench(report);
    fmt::print(
        "\nFull report: argus bench codecs --json codecs.json  (all codecs, head_dim 64 and "
        "128)\n");
  });
}

}  // namespace argus::cli
