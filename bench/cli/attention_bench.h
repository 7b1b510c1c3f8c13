// Long-context decode, shared by `argus bench attention` and `argus demo`: model geometries, a
// KvCache filled from the synthetic KV generator, decode timed side by side with an f16 cache,
// and the process's resident memory. Also the reader of real activations dumped by `argus eval
// --dump-kv`, shared with `argus bench codecs`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
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
// With a disk tier, the cache can move pages there (CacheOptions::disk).
Result<FilledCache> BuildSyntheticCache(const SyntheticContext& context, uint32_t n_layers,
                                        uint32_t n_tokens, const CodecPair& pair,
                                        uint32_t page_tokens, std::string_view who,
                                        DiskTier* disk = nullptr);

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
  double seconds = 0;            // of the Decode calls only
  uint64_t bytes_read = 0;       // K and V tile bytes, all layers
  uint64_t disk_bytes_read = 0;  // of pages read from the disk tier
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

// Decode with a share of the pages on disk, side by side with all in RAM (`argus bench store`):
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
Result<nlohmann::json> MeasureDecodeOnDisk(const DecodeOnDiskOptions& options, ThreadPool& pool);

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

// ---- Real activations ------------------------------------------------------------------------

// The dump's file of `plane` ('q', 'k' or 'v') for a layer: "layerNN_k.npy" (NN = 00, 01, ...).
std::string DumpName(uint32_t layer, char plane);
std::string DumpPath(const std::string& dir, uint32_t layer, char plane);

// The attention inputs of a model's first window as `argus eval --dump-kv DIR` writes them, per
// layer NN = 00, 01, ...: DIR/layerNN_q.npy [tokens, n_q_heads, head_dim], DIR/layerNN_k.npy and
// DIR/layerNN_v.npy [tokens, n_kv_heads, head_dim], float32, after RoPE. Only the last token's
// queries are kept: the benchmarks decode one step at the last position.
struct KvDump {
  std::string dir;
  ModelGeometry model;  // name "real:<basename of dir>"; n_layers: the dump's layers
  uint32_t n_tokens = 0;
  std::vector<std::vector<float>> k, v;  // per layer: [n_tokens, n_kv_heads, head_dim]
  std::vector<float> q;                  // [n_layers, n_q_heads, head_dim]: the last token's
};
// NotFound for a missing directory or one without layerNN_k.npy files; otherwise errors name the
// file: a missing layer file, a dtype other than float32, a shape that disagrees with the layer's
// other files or with layer 00's, or a geometry the cache cannot hold.
Result<KvDump> ReadKvDump(const std::string& dir);

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
  // A dump of real activations (see KvDump): instead of the synthetic models and contexts, the
  // dump's geometry, every one of its layers and its tokens, decoded with each layer's last
  // query; rows also give the output error against ReferenceAttention in double.
  std::string kv_dir;
};

Result<nlohmann::json> RunAttentionBench(const AttentionBenchOptions& options);
// A readable table of an attention bench report, to stdout.
void PrintAttentionBench(const nlohmann::json& report);

}  // namespace argus::cli
