// The system benchmarks of argus-bench. Each returns a JSON report; figures are ratios
// measured side by side in the same run (to f16, to the machine probes, to double precision).
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "argus/codec.h"
#include "argus/eval.h"
#include "argus/policy.h"
#include "argus/status.h"
#include "argus/store.h"
#include "bench/cli/attention_bench.h"

namespace argus::cli {

struct CodecBenchOptions {
  std::vector<std::string> specs;  // empty: every registered codec plus key variants
  std::vector<uint32_t> dims = {64, 128};
  std::vector<uint32_t> groups = {1, 4, 7};  // query heads per KV head (GQA group size)
  uint32_t quality_tokens = 4096;
  uint64_t seed = 1;
  int reps = 3;
  bool quick = false;  // context of half the last-level cache instead of twice it
  // A dump of real activations (see KvDump in eval/kv_dump.h): quality is also measured on
  // each of its (layer, KV head) groups, reported as the regime "real:<dir's name>". Speed stays
  // synthetic: it depends on the shape, not on the values (except for the lossless codec's).
  std::string kv_dir;
};

// A codec's encode and decode rates at one head_dim, GB/s of float input.
struct CodecCodingRate {
  uint32_t dim = 0;
  double encode_gbps = 0, decode_gbps = 0;
};
// Scores + accumulate over a context larger than the last-level cache, beside f16's.
struct CodecSpeed {
  uint32_t dim = 0, gqa = 0;
  double ns_per_token = 0;
  double time_ratio_to_f16 = 0;
  double bytes_per_token = 0;
  size_t context_tokens = 0;
  double read_gbps = 0;
  double bandwidth_fraction = 0, fma_fraction = 0;  // of the one-thread probes
  std::string bound;                                // "bandwidth" or "arithmetic"
  double speedup_vs_f16() const { return 1.0 / time_ratio_to_f16; }
};
// Quality on one regime (synthetic, or a dump's "real:<name>") against double precision.
struct CodecQualityRow {
  uint32_t dim = 0;
  std::string regime;
  std::string skipped;   // the reason the codec cannot hold the dump's shape (no figures)
  CodecQuality quality;  // a dump's: the mean over its groups
  std::optional<CodecQuality> max;  // a dump's: the max over its groups
  size_t n_groups = 0;              // a dump's groups
};
struct CodecFigures {
  std::string codec;
  double bits_per_value = 0;
  std::string kernel_path;
  bool lossless = false;
  std::string values_codec;  // keys-only codecs are measured with f16 values
  std::vector<CodecCodingRate> coding;
  std::vector<CodecSpeed> speed;
  std::vector<CodecQualityRow> quality;
  const CodecSpeed* FindSpeed(uint32_t dim, uint32_t gqa) const;
  const CodecQualityRow* FindQuality(std::string_view regime, uint32_t dim) const;
};
// The dump a report's real-activation rows come from.
struct RealKvConfig {
  std::string kv_dir, regime, geometry;
  uint32_t head_dim = 0, tokens = 0, gqa = 0, tile_tokens = 0;
  size_t n_groups = 0;
};
struct CodecBenchReport {
  double read_gbps_one_thread = 0, fma_gflops_one_thread = 0;
  size_t last_level_cache_bytes = 0;
  std::string cpu_features;
  uint32_t tile_tokens = 0;
  size_t min_context_bytes = 0;
  CodecBenchOptions config;
  std::optional<RealKvConfig> real_kv;
  std::vector<CodecFigures> codecs;  // f16 first
  const CodecFigures* Find(std::string_view codec) const;
};
void to_json(nlohmann::json& j, const CodecQualityRow& row);
void to_json(nlohmann::json& j, const CodecFigures& figures);
void to_json(nlohmann::json& j, const CodecBenchReport& report);

Result<CodecBenchReport> RunCodecBench(const CodecBenchOptions& options);
// A readable table of a codec bench report, to stdout.
void PrintCodecBench(const CodecBenchReport& report);

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
  // Stock llama.cpp's depthbench at the same depths, KV types (f16, q8_0, q4_0 for both K and V)
  // and threads on the same file: `peer_path`, else ../shared/peers/bin/depthbench when present.
  std::string peer_path;
  bool no_peer = false;
  // Time to first token for prompts of these lengths (f16 KV, chunks of prefill_batch), beside
  // stock llama-bench's prompt processing (-p N -n 0, flash attention) on the same file, in
  // prefill_rounds interleaved rounds; the best of each is kept.
  std::vector<uint32_t> prefill = {512, 4096};
  uint32_t prefill_batch = 512;
  int prefill_rounds = 2;
};

// One prompt length: argus's time to evaluate the prompt (its last token's logits: the first
// token's wait), and llama-bench's for the same count at its prompt-processing rate.
struct PrefillPoint {
  uint32_t tokens = 0;
  double ms = 0, tokens_per_s = 0;
  std::optional<double> peer_ms, speedup_vs_peer;  // peer time / argus time
  std::string peer_error;
};

// One (depth, KV codec pair) point: the best round's time per output token and its split.
struct E2ePoint {
  uint32_t depth = 0;
  std::string kv;  // the pair, "K/V"
  double ms_per_token = 0, tokens_per_s = 0;
  double matmul_ms = 0, attention_ms = 0, other_ms = 0;
  size_t kv_bytes = 0;            // the cache's page bytes
  double matmul_vs_roofline = 0;  // matmul time / the weights' read time at the probe's rate
  // The bytes one token reads, the weights and every KV page, at the probe's rate; the time over
  // it.
  double roofline_ms = 0, vs_roofline = 0;
  std::optional<double> speedup_vs_f16, attention_speedup_vs_f16;  // with f16/f16 at the depth
  // The peer's median decode time at the depth with this KV type, and its time over argus's.
  std::optional<double> peer_ms_per_token, speedup_vs_peer;
  std::string peer_error;  // why the peer gave no figure for a type it has
};
struct E2eReport {
  std::string model, model_config;
  uint64_t weight_bytes = 0;
  std::string weight_type;  // of the random model, or "from file"
  unsigned threads = 0;
  double read_gbps = 0;           // the bandwidth probe, all threads
  double matmul_roofline_ms = 0;  // the weights' bytes at that rate
  std::string peer;               // the depthbench binary, or why none ran
  uint32_t tokens_per_round = 0;
  int rounds = 0;
  std::vector<E2ePoint> points;
  std::string prefill_peer;  // the llama-bench binary, or why none ran
  std::vector<PrefillPoint> prefill;
};
void to_json(nlohmann::json& j, const E2ePoint& point);
void to_json(nlohmann::json& j, const PrefillPoint& point);
void to_json(nlohmann::json& j, const E2eReport& report);

Result<E2eReport> RunE2eBench(const E2eBenchOptions& options);
void PrintE2eBench(const E2eReport& report);

// fio, run as a child process: the denominator of `argus-bench store`. Every job uses O_DIRECT
// and io_uring on one file, so its figure is what the device gives a program that only moves
// bytes.
struct FioJob {
  std::string file;  // created (laid out by fio) when missing or smaller than size_bytes
  bool write = false;
  bool random = false;
  uint64_t block_bytes = 0;
  uint64_t size_bytes = 0;  // the region of the file covered, each block once
  uint32_t queue_depth = 1;
  uint32_t fsync_every = 0;  // writes: fdatasync after this many blocks (0: never)
};
struct FioFigure {
  double seconds = 0;  // fio's own runtime of the job
  double gbps = 0;     // bytes moved per second / 1e9
  double iops = 0;
};
class Fio {
 public:
  // Runs `program --version`; available() is false, with the reason, when that fails.
  static Fio Find(const std::string& program);
  bool available() const { return !version_.empty(); }
  const std::string& version() const { return version_; }
  const std::string& reason() const { return reason_; }
  // IOError with fio's messages when fio fails or reports an error.
  Result<FioFigure> Run(const FioJob& job) const;

 private:
  std::string program_, version_, reason_;
};

struct StoreBenchOptions {
  std::string dir;  // the bench writes argus-bench-store/ and argus-bench-fio.dat there
  std::vector<uint64_t> page_sizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20};  // payload bytes
  std::vector<uint32_t> queue_depths = {1, 4, 16, 32};
  uint64_t bytes = uint64_t{256} << 20;  // payload stored per page size, read once per point
  int reps = 2;                          // interleaved ARGUS/fio rounds (the best is kept)
  uint32_t put_batch = 8;                // pages per durable Put
  DiskIoBackend io = DiskIoBackend::kAuto;
  std::string fio = "fio";
  uint64_t seed = 1;  // of the random read order
};

// One pattern's figures: ARGUS's best and fio's best on the same pattern. Device bytes are slot
// bytes (header, payload, padding), like fio's blocks.
struct StoreFigure {
  double seconds = 0;
  double gbps = 0;          // slot bytes
  double payload_gbps = 0;  // payload bytes
  double pages_per_second = 0;
};
struct StorePoint {
  uint64_t page_bytes = 0, slot_bytes = 0;
  size_t pages = 0;
  StoreFigure argus;
  std::optional<FioFigure> fio;  // when fio ran
  double vs_fio() const { return argus.gbps / fio->gbps; }
};
struct StoreReadPoint {
  std::string order;  // "sequential" or "random"
  uint32_t queue_depth = 0;
  StorePoint point;
};
// Whether fio ran, and why not.
struct FioInfo {
  bool available = false;
  std::string version, reason;
};
struct StoreReport {
  StoreBenchOptions config;
  DiskTierStats store;  // the store's I/O backend, O_DIRECT and alignment
  FioInfo fio;
  std::vector<StorePoint> writes;  // durable Puts of config.put_batch pages; fio: fdatasync
  std::vector<StoreReadPoint> reads;
  std::optional<DecodeOnDiskReport> decode;  // the decode section, when run
};
void to_json(nlohmann::json& j, const FioFigure& figure);
void to_json(nlohmann::json& j, const StoreFigure& figure);
void to_json(nlohmann::json& j, const StorePoint& point);
void to_json(nlohmann::json& j, const StoreReadPoint& read);
void to_json(nlohmann::json& j, const StoreReport& report);

// Page writes (Put) and reads (ReadBatch, verified) through a DiskTier in options.dir, beside fio
// on the same pattern in the same run.
Result<StoreReport> RunStoreBench(const StoreBenchOptions& options);
void PrintStoreBench(const StoreReport& report);

struct PlacementBenchOptions {
  std::string dir;  // the runs' disk tiers go in dir/argus-bench-placement (removed after)
  std::string model = "llama-3-8b";
  uint32_t layers = 2;
  uint32_t prefix_tokens = 16384;
  uint32_t steps = 64;
  uint32_t page_tokens = 256;
  std::vector<double> budgets = {1.0, 0.5, 0.25, 0.1};  // fractions of the exact cache
  std::vector<std::string> profiles = {"exact", "balanced", "research", "capacity", "cascade"};
  std::vector<std::string> traces;  // names (recency, recall, needle@0.1, ...); empty: all
  double hot_mass = 0.02;           // "needed" for the optimum: this much mass in a step
  int activation_reps = 3;          // interleaved rounds of the activation overhead section
  unsigned threads = 0;
  uint64_t seed = 1;
};

// Replays each trace under each budget and profile (see docs/placement.md). The report holds
// per trace and run the time per token as a ratio to the exact cache all in RAM, disk bytes per
// token beside the offline optimum, errors against the exact outputs and needle retrieval; and the
// activation overhead below the high-water mark.
// One profile at one budget on one trace.
struct PlacementRun {
  std::string profile;
  double budget_fraction = 0;
  size_t ram_budget_bytes = 0;
  std::string error;  // the run failed with it (no figures); empty: it ran
  double seconds_per_token = 0;
  double exact_ram_seconds_per_token = 0;  // the exact cache all in RAM, beside this budget
  double disk_bytes_per_token = 0, optimal_disk_bytes_per_token = 0;
  double max_rel_error = 0, mean_rel_error = 0;
  std::vector<double> step_errors;
  uint32_t needle_steps = 0, needle_found = 0;
  double prefix_seconds = 0;
  PlacementStats placement;
  double time_vs_exact_ram() const { return seconds_per_token / exact_ram_seconds_per_token; }
};
struct PlacementTrace {
  std::string name;
  TraceKind kind = TraceKind::kRecall;
  double needle_depth = 0;  // of a needle trace
  size_t exact_bytes = 0;
  std::vector<PlacementRun> runs;
};
// Below the high-water mark: the engine beside the plain cache, on one trace.
struct ActivationFigures {
  std::string trace, profile;
  size_t ram_budget_bytes = 0;
  bool engine_active = false, bit_identical = false;
  double plain_seconds_per_token = 0, engine_seconds_per_token = 0;
  int reps = 0;
};
struct PlacementReport {
  PlacementBenchOptions config;
  unsigned threads = 0;
  std::vector<PlacementTrace> traces;
  std::optional<ActivationFigures> activation;
};
void to_json(nlohmann::json& j, const PlacementRun& run);
void to_json(nlohmann::json& j, const PlacementTrace& trace);
void to_json(nlohmann::json& j, const ActivationFigures& activation);
void to_json(nlohmann::json& j, const PlacementReport& report);

Result<PlacementReport> RunPlacementBench(const PlacementBenchOptions& options);
void PrintPlacementBench(const PlacementReport& report);

struct CapacityBenchOptions {
  std::string dir;  // the disk tier goes in dir/argus-bench-capacity (removed after)
  std::string model = "llama-3-8b";
  uint32_t layers = 0;  // 0: the model's
  uint32_t tokens = 262144;
  size_t ram_budget_bytes = size_t{4} << 30;
  double ram_fraction = 0;  // > 0: the budget is this fraction of the long context's exact KV
  std::string profile = "capacity";
  double disk_time_share = PlacementOptions{}.disk_time_share;
  uint32_t steps = 8;
  uint32_t needle_period = 2;  // every this many steps the query seeks the needle
  double needle_depth = 0.5;
  float focus = 12.0f;
  uint32_t reference_tokens = 32768;  // the context held all in RAM beside it
  uint32_t page_tokens = 256;
  unsigned threads = 0;
};

// A long context under a small RAM budget (the rest on disk) through the placement engine, and a
// short one all in RAM: time per token, disk bytes per token, error against exact attention
// (double precision, every layer) and needle retrieval for both.
// One context's run: its fill, then its decode steps against exact attention.
// The rate-distortion bound's mean attention error at one rate: the same rate on every token, and
// the bits spent where the run's attention falls (bench_capacity.cc, RateDistortionBound).
struct RateDistortionPoint {
  double bits_per_value = 0, uniform_rel_error = 0, by_attention_rel_error = 0;
};
struct CapacityRun {
  size_t exact_bytes = 0;  // RAM bytes the context needs exact
  double seconds_per_token = 0, disk_bytes_per_token = 0;
  double max_rel_error = 0, mean_rel_error = 0;
  uint32_t needle_steps = 0, needle_found = 0;
  double fill_seconds = 0;
  std::optional<PlacementStats> placement;  // through the engine: its statistics at the end
  // Through the engine: the rate-distortion bound at the bits per value it holds in RAM.
  std::optional<RateDistortionPoint> rate_distortion;
};
struct CapacityReport {
  struct Config {
    std::string model;
    uint32_t layers = 0, tokens = 0;
    size_t ram_budget_bytes = 0;
    std::string profile;
    double disk_time_share = 0;
    uint32_t steps = 0;
    double needle_depth = 0;
    uint32_t page_tokens = 0, reference_tokens = 0;
    unsigned threads = 0;
  } config;
  CapacityRun long_run;                              // the long context through the engine
  CapacityRun ram;                                   // the short one all in RAM
  std::vector<RateDistortionPoint> rate_distortion;  // the bound's error at 1 to 8 bits a value
  double time_ratio() const { return long_run.seconds_per_token / ram.seconds_per_token; }
};
void to_json(nlohmann::json& j, const RateDistortionPoint& point);
void to_json(nlohmann::json& j, const CapacityRun& run);
void to_json(nlohmann::json& j, const CapacityReport& report);

Result<CapacityReport> RunCapacityBench(const CapacityBenchOptions& options);
void PrintCapacityBench(const CapacityReport& report);

}  // namespace argus::cli
