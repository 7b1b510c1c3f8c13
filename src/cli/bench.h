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
  // A dump of real activations (see KvDump in attention_bench.h): quality is also measured on
  // each of its (layer, KV head) groups, reported as the regime "real:<dir's name>". Speed stays
  // synthetic: it depends on the shape, not on the values (except for the lossless codec's).
  std::string kv_dir;
};

Result<nlohmann::json> RunCodecBench(const CodecBenchOptions& options);
// The targets, evaluated from a report: speed at GQA 4 / head_dim 128, and the
// logit-error ratios of per-channel grouping, centring and rotation on the outlier regimes.
nlohmann::json EvaluateTargets(const nlohmann::json& report);
// A readable table of a codec bench report, to stdout.
void PrintCodecBench(const nlohmann::json& report);

struct E2eBenchOptions {
  std::string model_path;  // empty: a random model of `preset`, written to a temporary file
  std::string preset = "qwen2.5-0.5b";
  std::string type = "q8_0";  // weights of the random model: q8_0 or q4_0
  std::vector<uint32_t> depths = {0, 4096, 16384, 32768};
  std::vector<std::string> kv = {"f16", "q8_0", "q4_0", "int4:channel/int4"};  // K[/V] codecs
  uint32_t tokens = 8;  // decode steps per round
  int rounds = 3;       // interleaved rounds per depth; the best is kept
  unsigned threads = 0;
  uint32_t page_tokens = 256;
  uint64_t seed = 1;
};

Result<nlohmann::json> RunE2eBench(const E2eBenchOptions& options);
void PrintE2eBench(const nlohmann::json& report);

}  // namespace argus::cli
