// Synthetic long-context decode, shared by `argus bench attention` and `argus demo`: model
// geometries, a KvCache filled from the synthetic KV generator, decode timed side by side with
// an f16 cache, and the process's resident memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "argus/status.h"

namespace argus::cli {

// A model's attention geometry (all of its layers).
struct ModelGeometry {
  std::string name;
  CacheGeometry geometry;
};
// "llama-3-8b" or "qwen2.5-0.5b"; InvalidArgument naming the known ones otherwise.
Result<ModelGeometry> FindModel(std::string_view name);

// A K codec spec and a V codec spec, written "K/V" (e.g. "int4:channel/int4").
struct CodecPair {
  std::string k, v;
  std::string name() const { return k + "/" + v; }
};
// Splits "K/V" at the '/' that leaves a valid codec spec on both sides (codec names may hold a
// '/', as plane8/4 does); a single spec means the same codec for both. InvalidArgument when no
// split, or more than one, works.
Result<CodecPair> ParseCodecPair(std::string_view text);

// Synthetic K/V for every KV head of a model: GenerateSyntheticKv per KV head (seed + head, the
// heads generated in parallel on `pool`), pool_tokens long, to be repeated up to any context
// length (every layer holds the same data).
struct SyntheticContext {
  ModelGeometry model;
  uint32_t pool_tokens = 0;
  std::vector<float> k, v;  // [pool_tokens, n_kv_heads, head_dim]
  std::vector<float> q;     // [n_q_heads, head_dim]; query head h belongs to KV head h / gqa
};
SyntheticContext MakeSyntheticContext(const ModelGeometry& model, KeyRegime regime, uint64_t seed,
                                      uint32_t pool_tokens, ThreadPool& pool);

struct FilledCache {
  std::unique_ptr<KvCache> cache;
  SeqId seq = 0;
  size_t budget_bytes = 0;
  double fill_seconds = 0;
};
// A cache of n_layers layers of the context's model holding n_tokens per layer (the pool
// repeated), budget from KvCache::RequiredRamBytes. Progress on stderr: "<who>: filling llama-3-8b
// 32768 tokens, q8_0/q8_0: 45%".
Result<FilledCache> BuildSyntheticCache(const SyntheticContext& context, uint32_t n_layers,
                                        uint32_t n_tokens, const CodecPair& pair,
                                        uint32_t page_tokens, std::string_view who);

// Evicts the last-level cache by reading a buffer twice its size. In a model, the other layers'
// weights and KV pass through the cache between two attention calls of one layer; with only a
// few layers built, a timed call would otherwise find its pages still cached. The read is split
// over the pool's threads, as a model's matrix products are, so the threads are as awake at the
// next call as they would be in a model.
class CacheEvictor {
 public:
  // ResourceExhausted when the buffer cannot be had.
  static Result<CacheEvictor> Create(ThreadPool& pool);
  void Evict() const;

 private:
  AlignedBuffer buffer_;
  ThreadPool* pool_ = nullptr;
};

// One decode step over every layer of a cache, one Decode call per layer as a model makes them.
struct DecodePass {
  double seconds = 0;       // of the Decode calls only
  uint64_t bytes_read = 0;  // K and V tile bytes, all layers
};
// q: [n_q_heads, head_dim] for every layer; out: [n_layers, n_q_heads, head_dim]. With an
// evictor, the last-level cache is evicted (untimed) before each call.
Result<DecodePass> DecodeAllLayers(AttentionEngine& engine, FilledCache& cache, const float* q,
                                   float* out, const CacheEvictor* evictor = nullptr);

// Best of `reps` passes over `cache` and over `reference`, the passes interleaved so that both
// see the same machine, each call on an evicted last-level cache. With no reference,
// best_reference is best.
struct SideBySide {
  DecodePass best, best_reference;
  double time_ratio() const { return best.seconds / best_reference.seconds; }
};
Result<SideBySide> TimeDecodeSideBySide(AttentionEngine& engine, FilledCache& cache,
                                        FilledCache* reference, const float* q, int reps,
                                        const CacheEvictor& evictor);

// Resident memory of this process, from /proc/self/status (0 where unavailable).
// CacheStats::by_codec as a JSON array of {codec, k_bytes, v_bytes, n_k_pages, n_v_pages}.
nlohmann::json CodecBytesJson(const std::vector<CodecBytes>& by_codec);

size_t CurrentRssBytes();  // VmRSS
size_t PeakRssBytes();     // VmHWM
// Resets VmHWM to the current RSS (/proc/self/clear_refs); false where the kernel refuses.
bool ResetPeakRss();
// Returns freed heap memory to the system, so that one cache's pages do not stay resident
// under the next one's measurement.
void ReleaseFreedMemory();

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
};

Result<nlohmann::json> RunAttentionBench(const AttentionBenchOptions& options);
// A readable table of an attention bench report, to stdout.
void PrintAttentionBench(const nlohmann::json& report);

}  // namespace argus::cli
