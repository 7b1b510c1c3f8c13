// argus: the command-line face of libargus.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ARGUS: virtual memory for transformer KV caches"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "argus " ARGUS_VERSION_STRING);
  argus::cli::AddInfoCommand(app);
  argus::cli::AddCodecsCommand(app);
  argus::cli::AddCodecCommand(app);
  argus::cli::AddAttendCommand(app);
  argus::cli::AddBenchCommand(app);
  argus::cli::AddRemoteBenchCommand(app);  // bench remote
  argus::cli::AddModelCommands(app);
  argus::cli::AddStoreCommand(app);
  argus::cli::AddReplayCommand(app);
  argus::cli::AddTraceCommand(app);
  argus::cli::AddDemoCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 exits 0 for --help and --version; every option error is status 1, as for any
    // other error (its own codes, 104 to 109, say nothing more to a script).
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const argus::cli::CommandError& e) {
    std::fprintf(stderr, "argus: %s\n", e.status.ToString().c_str());
    return 1;
  }
  return 0;
}
