// The subcommands of argus-bench, each registered with its options on the program's app; the
// callback runs the benchmark, prints its table and writes its JSON report.
#pragma once

#include <CLI/CLI.hpp>

namespace argus::cli {

void AddBenchCommands(CLI::App& app);       // codecs, attention, e2e, store, placement, capacity
void AddRemoteBenchCommand(CLI::App& app);  // remote
void AddServeBenchCommand(CLI::App& app);   // serve

}  // namespace argus::cli
