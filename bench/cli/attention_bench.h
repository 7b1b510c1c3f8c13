// argus-bench attention, and decode with pages on disk (argus-bench store); both build on the
// long-context decode of eval/long_context.h.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "argus/status.h"
#include "argus/store.h"
#include "core/probe.h"
#include "eval/long_context.h"

namespace argus::cli {

// Decode with a share of the pages on disk, side by side with all in RAM (`argus-bench store`):
// a synthetic cache of the model's geometry (n_layers of them), and for each fraction a copy
// whose oldest full pages, that share of them in every layer, are moved into a disk tier in
// `dir`. Reports per fraction the time per token as a ratio to all in RAM, disk bytes per token
// and the disk read rate during decode, as a ratio to the reference read rate: `reference_read`
// is called once per round, between the passes, with the disk slot size of a page, and returns
// GB/s of sequential reads of that size at the same queue depth (fio's figure); the best is
// kept. Every pass is checked bit for bit against all in RAM.
struct DecodeOnDiskOptions {
  std::string dir;
  std::string model = "llama-3-8b";
  uint32_t n_layers = 2, n_tokens = 32768, page_tokens = 256;
  CodecPair pair{"f16", "f16"};
  std::vector<double> fractions{0.0, 0.5, 0.9};
  int reps = 3;
  DiskIoBackend io = DiskIoBackend::kAuto;
  uint32_t queue_depth = 16;
  size_t staging_bytes = size_t{256} << 20;
  std::function<Result<double>(uint64_t slot_bytes)> reference_read;  // may be empty
  std::string reference_name;  // what the reference is, for the report
};
// One share of the pages on disk (0: all in RAM), the best pass.
struct DecodeOnDiskCase {
  double fraction_on_disk = 0;
  size_t pages_on_disk = 0;
  double ms_per_token = 0;
  double time_vs_ram = 0;
  uint64_t disk_bytes_per_token = 0;
  double disk_read_gbps = 0;
  std::optional<double> disk_read_vs_reference;  // with a reference and disk reads
  std::optional<DiskTierStats> disk;  // the case's store (its backend, O_DIRECT, staging peak)
};
struct DecodeOnDiskReport {
  std::string model;
  uint32_t layers_built = 0, tokens = 0;
  std::string codecs;  // the pair, "K/V"
  uint32_t page_tokens = 0;
  unsigned threads = 0;
  int reps = 0;
  uint32_t queue_depth = 0;
  uint64_t slot_bytes = 0;
  std::string reference_read;  // what the reference is
  double reference_read_gbps = 0;
  std::vector<DecodeOnDiskCase> cases;
};
void to_json(nlohmann::json& j, const DecodeOnDiskCase& c);
void to_json(nlohmann::json& j, const DecodeOnDiskReport& report);
Result<DecodeOnDiskReport> MeasureDecodeOnDisk(const DecodeOnDiskOptions& options,
                                               ThreadPool& pool);

struct AttentionBenchOptions {
  std::vector<uint32_t> contexts = {4096, 16384, 32768, 131072};
  std::vector<std::string> models = {"llama-3-8b", "qwen2.5-0.5b"};
  std::vector<std::string> pairs = {"f16/f16", "q8_0/q8_0", "q4_0/q4_0", "int4:channel/int4"};
  uint32_t layers = 2;
  unsigned threads = 0;  // 0: one per hardware thread
  int reps = 5;
  uint32_t page_tokens = 256;
  uint32_t pool_tokens = 4096;
  uint64_t seed = 1;
  bool quick = false;  // contexts 4096,16384 and reps 2, unless given
  // A dump of real activations (see KvDump): instead of the synthetic models and contexts, the
  // dump's geometry, every one of its layers and its tokens, decoded with each layer's last
  // query; rows also give the output error against ReferenceAttention in double.
  std::string kv_dir;
};

// The figures that follow from a pass's time: per token and layer, for the whole model (scaled
// from the layers built), and against the probes. The roofline time is that of the bytes at the
// bandwidth probe or of the float work at the FMA probe, whichever is longer.
struct AttentionTimeFigures {
  double ms_per_token_per_layer = 0, ms_per_token_model = 0;
  double read_gbps = 0;
  double bandwidth_fraction = 0, fma_fraction = 0;
  double roofline_ms_model = 0, roofline_ratio = 0;
  std::string roofline_bound;  // "bandwidth" or "fma"
};
// The output error of a pass against double precision: per query head relative L2, max and mean
// over layers and heads, and the max per layer.
struct AttentionErrors {
  double max_rel_error = 0, mean_rel_error = 0;
  std::vector<double> max_rel_error_by_layer;
};
// One codec pair at one context of one model, timed beside the f16 cache of the same data.
struct AttentionRow {
  std::string model;
  uint32_t model_layers = 0, context = 0;
  CodecPair pair;
  uint32_t code_bits = 0;  // shared by K and V (4, 8, 16), else 0
  double f16_ms_per_token_model = 0, time_ratio_to_f16 = 0;
  double kv_bytes_model = 0, bytes_read_per_token_model = 0, fmas_per_token_model = 0;
  CacheStats cache;  // of the pair's cache
  size_t cache_budget_bytes = 0;
  size_t overhead_rss_bytes = 0, peak_rss_bytes = 0, accounted_bytes = 0;
  bool peak_rss_reset = false;
  double fill_seconds = 0;
  AttentionTimeFigures time;
  std::optional<AttentionErrors> errors;  // on real activations
  std::optional<size_t> f16_passes;       // the f16/f16 row: the f16 passes it is the best of
  double speedup_vs_f16() const { return 1.0 / time_ratio_to_f16; }
};
// Least-squares line y = slope * x + intercept, and its R^2.
struct LineFit {
  double slope = 0, intercept = 0, r2 = 0;
};
// Time per token (whole model) against context, for one model and pair.
struct AttentionSlope {
  std::string model, pair;
  size_t n_contexts = 0;
  std::optional<LineFit> fit;  // with two contexts or more
};
// The pairs of one context by time ratio to f16, and whether the code-bit classes keep their
// order (every 4-bit pair faster than every 8-bit pair, every 8-bit pair faster than f16).
struct AttentionOrdering {
  std::string model;
  uint32_t context = 0;
  std::vector<std::string> fastest_first;
  size_t classes = 0;
  std::optional<bool> kept;  // with two classes or more
};
struct AttentionBenchReport {
  MachineProbe machine;
  size_t last_level_cache_bytes = 0;
  std::string cpu_features, kernel_path;
  AttentionBenchOptions options;
  std::vector<uint32_t> contexts;
  std::vector<std::string> models, pairs;
  uint32_t layers = 0;  // built per model
  unsigned threads = 0;
  double bandwidth_gbps_used = 0, fma_gflops_used = 0;
  std::string geometry;                         // real activations: the dump's
  std::string regime;                           // synthetic KV: its key regime
  uint32_t pool_tokens = 0;                     // synthetic KV: tokens per KV head, repeated
  std::vector<AttentionRow> results;
  std::vector<AttentionSlope> slopes;
  std::vector<AttentionOrdering> ordering;
  bool ordering_kept = true;
  bool real() const { return !options.kv_dir.empty(); }
};
void to_json(nlohmann::json& j, const AttentionRow& row);
void to_json(nlohmann::json& j, const AttentionBenchReport& report);

Result<AttentionBenchReport> RunAttentionBench(const AttentionBenchOptions& options);
// A readable table of an attention bench report, to stdout.
void PrintAttentionBench(const AttentionBenchReport& report);

}  // namespace argus::cli
