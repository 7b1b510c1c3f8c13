// Long-context decode, shared by `argus demo` and the benchmarks of argus-bench: model
// geometries, a KvCache filled from the synthetic KV generator (or any rows), decode timed side by
// side with a reference cache, output errors, and the process's resident memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "argus/status.h"
#include "argus/store.h"
#include "core/buffer.h"

namespace argus {

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

// A layer's K and V rows from token `first` on: n_rows >= 1 rows, [n_rows, n_kv_heads, head_dim]
// each.
struct KvRows {
  const float* k = nullptr;
  const float* v = nullptr;
  uint32_t n_rows = 0;
};
using KvRowSource = std::function<KvRows(uint32_t layer, uint32_t first)>;

struct FilledCache {
  std::unique_ptr<KvCache> cache;
  SeqId seq = 0;
  size_t budget_bytes = 0;
  double fill_seconds = 0;
};
// A cache of n_layers layers of the context's model holding n_tokens per layer (the pool
// repeated), budget from KvCache::RequiredRamBytes. Progress on stderr: "<who>: filling llama-3-8b
// 32768 tokens, q8_0/q8_0: 45%".
// With a disk tier, the cache can move pages there (CacheOptions::disk).
Result<FilledCache> BuildSyntheticCache(const SyntheticContext& context, uint32_t n_layers,
                                        uint32_t n_tokens, const CodecPair& pair,
                                        uint32_t page_tokens, std::string_view who,
                                        DiskTier* disk = nullptr);
// The same from any rows (e.g. a dump's), with the same progress line.
Result<FilledCache> BuildCache(const ModelGeometry& model, uint32_t n_layers, uint32_t n_tokens,
                               const CodecPair& pair, uint32_t page_tokens, std::string_view who,
                               const KvRowSource& rows, DiskTier* disk = nullptr);
// The synthetic pool, repeated to any context; every layer holds the same rows. The source
// refers to `context`, which must outlive it.
KvRowSource SyntheticRows(const SyntheticContext& context);

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
  double seconds = 0;        // of the Decode calls only
  AttentionStats attention;  // summed over the layers
};
// q: [n_q_heads, head_dim], advanced by q_layer_stride floats per layer (0: the same query for
// every layer); out: [n_layers, n_q_heads, head_dim]. With an evictor, the last-level cache is
// evicted (untimed) before each call.
Result<DecodePass> DecodeAllLayers(AttentionEngine& engine, FilledCache& cache, const float* q,
                                   float* out, const CacheEvictor* evictor = nullptr,
                                   size_t q_layer_stride = 0);

// Best of `reps` passes over `cache` and over `reference`, the passes interleaved so that both
// see the same machine, each call on an evicted last-level cache. With no reference,
// best_reference is best.
struct SideBySide {
  DecodePass best, best_reference;
  double time_ratio() const { return best.seconds / best_reference.seconds; }
};
Result<SideBySide> TimeDecodeSideBySide(AttentionEngine& engine, FilledCache& cache,
                                        FilledCache* reference, const float* q, int reps,
                                        const CacheEvictor& evictor, size_t q_layer_stride = 0);

// Relative L2 error of each head's output against a reference, both [n_heads, head_dim]: the
// max and the mean over heads. A head whose reference is zero counts its absolute error.
struct HeadErrors {
  double max = 0, mean = 0;
};
template <typename Ref>
HeadErrors OutputHeadErrors(std::span<const float> out, std::span<const Ref> reference,
                            uint32_t head_dim) {
  const size_t n_heads = out.size() / head_dim;
  HeadErrors errors;
  for (size_t h = 0; h < n_heads; ++h) {
    double err2 = 0, ref2 = 0;
    for (size_t i = h * head_dim; i < (h + 1) * head_dim; ++i) {
      const double e = double{out[i]} - double{reference[i]};
      err2 += e * e;
      ref2 += double{reference[i]} * double{reference[i]};
    }
    const double error = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    errors.max = std::max(errors.max, error);
    errors.mean += error / static_cast<double>(n_heads);
  }
  return errors;
}

// Resident memory of this process, from /proc/self/status (0 where unavailable).
size_t CurrentRssBytes();  // VmRSS
size_t PeakRssBytes();     // VmHWM
// Resets VmHWM to the current RSS (/proc/self/clear_refs); false where the kernel refuses.
bool ResetPeakRss();
// Returns freed heap memory to the system, so that one cache's pages do not stay resident
// under the next one's measurement.
void ReleaseFreedMemory();

}  // namespace argus
