// The argus program's subcommands. Each Add*Command registers one subcommand (and its
// options) on the app; the callback runs it. Results go to stdout, progress and logs to stderr.
#pragma once

#include <CLI/CLI.hpp>

#include "argus/status.h"

namespace argus::cli {

void AddInfoCommand(CLI::App& app);
void AddCodecsCommand(CLI::App& app);
void AddCodecCommand(CLI::App& app);  // codec encode / codec decode
void AddAttendCommand(CLI::App& app);
void AddDemoCommand(CLI::App& app);
void AddModelCommands(CLI::App& app);  // run / eval / make-model
void AddStoreCommand(CLI::App& app);   // store check / store compact
void AddReplayCommand(CLI::App& app);  // replay a trace through a profile
void AddTraceCommand(CLI::App& app);   // trace generate / trace info
void AddServeCommand(CLI::App& app);   // the HTTP APIs

// -t/--threads, checked against kMaxThreads while the options are parsed.
CLI::Option* AddThreadsOption(CLI::App& cmd, unsigned& threads,
                              const std::string& help = "Threads (0: one per hardware thread)");

// Byte sizes such as 512M or 2G (CLI::AsSizeValue, which would wrap a negative number around to
// 16 EiB: refused).
CLI::Option* AsByteSize(CLI::Option* option);
// A floating-point option's value must be finite and within [lo, hi] (CLI::Range lets NaN
// through).
CLI::Validator FiniteRange(double lo, double hi);

// Subcommand callbacks report failure by throwing this; ParseAndRun prints it and returns 1.
struct CommandError {
  Status status;
};

// Parses the command line and runs the chosen subcommand's callback. Returns the exit status:
// 0, or 1 after printing "<program>: <error>" to stderr for an option error or a CommandError.
int ParseAndRun(CLI::App& app, int argc, char** argv);
// An option error to throw: InvalidArgument with the message.
inline CommandError Invalid(std::string message) {
  return CommandError{Status::InvalidArgument(std::move(message))};
}
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw CommandError{status};
}
template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw CommandError{result.status()};
  return std::move(result).value();
}
// The whole file as text (its bytes as they are); throws the read's error naming the file.
std::string ReadTextFile(const std::string& path);

}  // namespace argus::cli
