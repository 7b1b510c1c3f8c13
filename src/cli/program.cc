// The command line of argus and argus-bench: parse, run the subcommand, report its failure.
#include <cstdio>

#include "cli/commands.h"

namespace argus::cli {

int ParseAndRun(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 exits 0 for --help and --version; every option error is status 1, as for any
    // other error (its own codes, 104 to 109, say nothing more to a script).
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const CommandError& e) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace argus::cli
