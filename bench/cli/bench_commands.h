// The subcommands of argus-bench, each registered with its options on the program's app; the
// callback runs the benchmark, prints its table and writes its JSON report.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

namespace argus::cli {

void AddBenchCommands(CLI::App& app);       // codecs, attention, e2e, store, placement, capacity
void AddRemoteBenchCommand(CLI::App& app);  // remote
void AddServeBenchCommand(CLI::App& app);   // serve

// --json PATH on cmd, into *path: where the subcommand writes its report. The file's directory
// must exist, which is checked as the options are parsed, before a bench that may run for
// minutes rather than after it.
CLI::Option* AddJsonOption(CLI::App& cmd, std::string* path);
// Writes json (a report, dumped) to path through a temporary file and a rename, and says so on
// stderr; nothing when path is empty. Throws CommandError naming the file when it cannot.
void WriteJsonReport(const std::string& json, const std::string& path, std::string_view who);

}  // namespace argus::cli
