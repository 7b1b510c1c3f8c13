// Runs the argus and argus-bench programs built beside the tests (ARGUS_CLI_PATH,
// ARGUS_BENCH_PATH) and captures what they print.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/files.h"

namespace argus::testing {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// `args` go through the shell (quote them as a shell wants).
inline CliRun RunProgram(const std::string& program, const std::string& args) {
  const std::string err_path =
      (std::filesystem::temp_directory_path() / ("argus_cli_err_" + std::to_string(::getpid())))
          .string();
  const std::string command = program + " " + args + " 2>" + err_path;
  CliRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) run.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto err = ReadFileBytes(err_path);
  if (err.ok()) run.err.assign(reinterpret_cast<const char*>(err->data()), err->size());
  std::filesystem::remove(err_path);
  return run;
}

// Skips where argus-bench is not built: the sanitizer build, which checks the runtime; the
// measuring ground's tests run in the release suite.
#define ARGUS_SKIP_WITHOUT_BENCH()                                           \
  do {                                                                       \
    if (std::string_view(ARGUS_BENCH_PATH).empty())                          \
      GTEST_SKIP() << "argus-bench is not built here (the sanitizer build)"; \
  } while (0)

inline CliRun RunArgus(const std::string& args) { return RunProgram(ARGUS_CLI_PATH, args); }
inline CliRun RunArgusBench(const std::string& args) { return RunProgram(ARGUS_BENCH_PATH, args); }

}  // namespace argus::testing
