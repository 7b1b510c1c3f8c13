// argus-bench: the system benchmarks of ARGUS, each a subcommand writing a table to stdout and,
// with --json, its full report.
#include "bench/cli/bench_commands.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ARGUS system benchmarks: codecs, attention, whole-model decode, the store, "
               "placement, capacity, the remote tier and the server (JSON reports)",
               "argus-bench"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "argus-bench " ARGUS_VERSION_STRING);
  argus::cli::AddBenchCommands(app);
  argus::cli::AddRemoteBenchCommand(app);
  argus::cli::AddServeBenchCommand(app);
  return argus::cli::ParseAndRun(app, argc, argv);
}
