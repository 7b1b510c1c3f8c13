// System benchmarks behind `argus bench`. Each returns a JSON report; figures are ratios
// measured side by side in the same run (to f16, to the machine probes, to double precision).
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "argus/status.h"

namespace argus::cli {

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct CodecBenchOptions {
  std::vector<std::string> specs;  // empty: every registered codec plus key variants
  std::vector<uint32_t> dims = {64, 128};
  std::vector<uint32_t> groups = {1, 4, 7};  // query heads per KV head (GQA group size)
  uint32_t quality_tokens = 4096;
  uint64_t seed = 1;
  int reps = 3;
  bool quick = false;  // context of half the last-level cache instead of twice it
};

Result<nlohmann::json> RunCodecBench(const CodecBenchOptions& options);
// The targets, evaluated from a report: speed at GQA 4 / head_dim 128, and the
// logit-error ratios of per-channel grouping, centring and rotation on the outlier regimes.
nlohmann::json EvaluateTargets(const nlohmann::json& report);
// A readable table of a codec bench report, to stdout.
void PrintCodecBench(const nlohmann::json& report);

}  // namespace argus::cli
