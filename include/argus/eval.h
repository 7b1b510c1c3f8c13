// The measuring ground: what benchmarks and tests measure the runtime with, and the runtime
// itself does not need. The quality of a codec pair against double precision on synthetic KV
// (argus/codec.h's generator); traces, identical work for every placement policy, with their file
// format; their replay through a cache or a placement engine; and the offline optimum a policy's
// disk reads are compared with. Not part of libargus: programs and tests link the eval module.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/cache.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "argus/policy.h"
#include "argus/status.h"
#include "argus/store.h"

namespace argus {

class Model;

// ---- Quality of a codec pair -----------------------------------------------------------------

// Errors of attention computed through codecs against double precision on the same inputs.
struct CodecQuality {
  double k_rel_rmse = 0, v_rel_rmse = 0;  // ||x - x'|| / ||x|| over the tiles
  double logit_max_abs = 0;               // max |s' - s| of scaled logits
  double logit_rms = 0;
  double out_rel_err = 0;  // ||o' - o|| / ||o||, averaged over heads
  double kl = 0;           // KL(p || p'), averaged over heads, nats
};
// kv: one group's context; k/v are encoded in tiles of `tile_tokens`, attention is computed
// tile by tile with the fused kernels (online softmax in double), scale 1/sqrt(dim).
Result<CodecQuality> MeasureQuality(const Codec& k_codec, const Codec& v_codec,
                                    const SyntheticKv& kv, uint32_t tile_tokens);

// ---- Traces -----------------------------------------------------------------------------------

// A trace is identical work for every policy: a prefix of K/V appended at once, then decode
// steps, each appending one token's K/V to every layer and giving every layer a query. The file
// format is in docs/traces.md. Values are f16 (K/V) and f32 (queries).
// kRecorded: the K/V and queries a model computed over a text (RecordTrace), no targets.
enum class TraceKind : uint8_t { kRecency = 0, kRecall = 1, kNeedle = 2, kRecorded = 3 };
std::string_view TraceKindName(TraceKind kind);

struct TraceOptions {
  TraceKind kind = TraceKind::kRecall;
  CacheGeometry geometry;
  uint32_t n_prefix_tokens = 16384;
  uint32_t n_steps = 64;
  uint64_t seed = 1;
  uint32_t n_sinks = 4;           // tokens the queries keep attending to
  uint32_t recent_tokens = 256;   // the window recent-token attention falls in
  uint32_t n_recall_targets = 4;  // recall: distant tokens recalled in turn
  uint32_t recall_period = 8;     // recall: every this many steps a target is recalled
  double needle_depth = 0.5;      // needle: where in the prefix (0 = start, 1 = end)
  uint32_t needle_period = 8;     // needle: every this many steps the query seeks the needle
  float focus = 12.0f;            // score (after 1/sqrt(d)) of a targeted key: how peaked
};

struct Trace {
  TraceOptions options;
  // [layer][token][kv_head][dim], f16 bits, n_prefix_tokens + n_steps tokens: the prefix, then
  // the token each step appends.
  std::vector<uint16_t> k, v;
  // [step][layer][q_head][dim]
  std::vector<float> q;
  // [step]: the position a step's queries seek (recall target, needle), or -1.
  std::vector<int64_t> target;

  uint32_t n_tokens() const { return options.n_prefix_tokens + options.n_steps; }
  // Rows [first, first + n) of a layer: [n, kv_heads, dim].
  std::span<const uint16_t> K(uint32_t layer, uint32_t first, uint32_t n) const;
  std::span<const uint16_t> V(uint32_t layer, uint32_t first, uint32_t n) const;
  std::span<const float> Q(uint32_t step, uint32_t layer) const;
};

// A synthetic trace; InvalidArgument for kRecorded (RecordTrace makes those).
Result<Trace> GenerateTrace(const TraceOptions& options);
// The trace a model gives over `tokens`: its first n_prefix_tokens evaluated in chunks of
// n_batch, then n_steps decoded one at a time; each layer's K/V (after RoPE, stored as f16) and
// each step's queries as its attention received them. No targets. InvalidArgument when there
// are fewer tokens or the context cannot hold them.
Result<Trace> RecordTrace(const Model& model, std::span<const int32_t> tokens,
                          uint32_t n_prefix_tokens, uint32_t n_steps, uint32_t n_batch,
                          uint32_t n_threads);
Status WriteTrace(const Trace& trace, const std::string& path);
// Corruption naming the file and field for a damaged or truncated file.
Result<Trace> ReadTrace(const std::string& path);

// ---- Replay ------------------------------------------------------------------------------------

// Runs a trace through a cache: the prefix appended, then each step appends its token to every
// layer, attends every layer and ends the step. With `engine` unset the cache is plain (every
// page F16 in RAM, the budget sized to fit): the exact reference every policy is measured against.
struct ReplayOptions {
  bool engine = true;
  PlacementOptions placement;
  size_t ram_budget_bytes = 0;  // 0: what the whole trace needs exact (KvCache::RequiredRamBytes)
  DiskTier* disk = nullptr;     // needed by profiles with disk states or masters
  uint32_t page_tokens = 256;
  uint32_t expected_tokens = 0;  // told to BeginRequest; 0: the trace's length
  ThreadPool* pool = nullptr;    // required
  // Outputs to measure the error against ([step][layer][q_head][dim]), e.g. the reference's.
  const std::vector<float>* reference = nullptr;
  double hot_mass = 0.02;  // a page with this much mass in a step is "needed" (hot_pages)
  bool keep_outputs = false;
  // Called after the prefix and after every step (progress); may be empty.
  std::function<void(uint32_t steps_done)> progress;
};

struct ReplayResult {
  size_t exact_bytes = 0;  // RAM bytes the whole trace needs exact
  double prefix_seconds = 0;
  double decode_seconds = 0;  // the steps, EndStep included (wall time)
  double seconds_per_token() const { return n_steps ? decode_seconds / n_steps : 0; }
  uint32_t n_steps = 0;
  uint64_t disk_bytes_read = 0;  // during the steps: attention's disk reads and promotions
  // Relative L2 error of each (step, layer) output against the reference, over all query heads.
  double max_rel_error = 0, mean_rel_error = 0;
  std::vector<double> step_errors;  // per step, the largest over layers
  // Steps with a target, and those where, in every layer, the page with the most attention
  // mass holds the target position.
  uint32_t n_target_steps = 0, n_targets_found = 0;
  // [step]: the pages with at least hot_mass in that step, as layer * 2^20 + page index.
  std::vector<std::vector<uint32_t>> hot_pages;
  std::vector<float> outputs;  // when keep_outputs
  PlacementStats placement;    // with the engine
  CacheStats cache;            // at the end
};

Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options);

// The offline optimum of a trace for a fast tier of `capacity` pages (Belady's MIN: knowing the
// future, on a miss evict the page needed again farthest ahead). needed[t] lists the pages
// (any ids) step t must read at full precision; the tier starts holding the first `capacity`
// distinct pages of `initial`. Returns the number of misses (pages fetched).
uint64_t OptimalMisses(std::span<const std::vector<uint32_t>> needed, size_t capacity,
                       std::span<const uint32_t> initial);

}  // namespace argus
