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

Result<nlohmann::json> RunAttentionBench(const AttentionBenchOptions& options);
// A readable table of an attention bench report, to stdout.
void PrintAttentionBench(const nlohmann::json& report);

}  // namespace argus::cli
