// argus: the command-line face of libargus. The system benchmarks are a program of their own,
// argus-bench (bench/).
#include "cli/commands.h"

namespace {

// `argus bench ...`, hidden from the help: fails, naming the program that holds the benchmarks.
void AddMovedBenchCommand(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "")->group("");
  bench->allow_extras()->prefix_command();
  bench->callback([bench] {
    std::string args;
    for (const std::string& arg : bench->remaining()) args += " " + arg;
    throw argus::cli::CommandError{argus::Status::InvalidArgument(
        "the benchmarks are a program of their own, argus-bench, with the same subcommands and "
        "options: run argus-bench" + (args.empty() ? std::string(" --help") : args))};
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ARGUS: virtual memory for transformer KV caches", "argus"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "argus " ARGUS_VERSION_STRING);
  argus::cli::AddInfoCommand(app);
  argus::cli::AddCodecsCommand(app);
  argus::cli::AddCodecCommand(app);
  argus::cli::AddAttendCommand(app);
  argus::cli::AddModelCommands(app);
  argus::cli::AddStoreCommand(app);
  argus::cli::AddReplayCommand(app);
  argus::cli::AddTraceCommand(app);
  argus::cli::AddServeCommand(app);
  argus::cli::AddDemoCommand(app);
  AddMovedBenchCommand(app);
  return argus::cli::ParseAndRun(app, argc, argv);
}
