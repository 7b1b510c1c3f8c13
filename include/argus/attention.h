// Attention over the pages of a KvCache, computed directly on the encoded tiles, and the
// double-precision reference it is tested against.
//
// Masks: a query at position p attends to key positions j <= p with p - j < window (window 0:
// no limit), plus the first `sinks` positions. Scores are q.k * scale, scale = 1/sqrt(head_dim)
// unless given. Work is split over (KV head x query-row batch x fixed page chunk); the chunk
// boundaries depend only on the shapes, and chunk states are merged in order, so outputs are
// bit-identical for every thread count. Scratch is one score tile per worker and one softmax
// state per work item, independent of context length.
#pragma once

#include <cstdint>
#include <vector>

#include "argus/cache.h"
#include "argus/core.h"
#include "argus/status.h"

namespace argus {

struct AttentionOptions {
  uint32_t window = 0;  // 0: no sliding window
  uint32_t sinks = 0;   // positions 0 .. sinks-1 are always attended
  float scale = 0;      // 0: 1/sqrt(head_dim)
  // Certified page skipping: skip (page, KV head) tiles whose key-summary bound proves that,
  // together, they carry at most this fraction of each query head's attention mass. 0: exact,
  // every tile inside the mask is read.
  double epsilon = 0;
  bool record_mass = true;  // write each page's attention mass into the page table
};

// True when a query at q_pos attends to the key at k_pos under the options' masks.
inline bool Attends(uint32_t q_pos, uint32_t k_pos, const AttentionOptions& options) {
  if (k_pos > q_pos) return false;
  if (k_pos < options.sinks) return true;
  return options.window == 0 || q_pos - k_pos < options.window;
}

struct SkippedTile {
  PageId page = kNoPage;
  uint32_t kv_head = 0;
};

struct AttentionStats {
  uint32_t n_pages = 0;         // pages of the layer in the sequence
  uint32_t n_pages_masked = 0;  // pages no query attends to (window): never read
  uint64_t n_tiles = 0;         // (page, KV head) tiles inside the mask
  // Tiles no query read (a prefill whose rows need several kernel calls decides per call; a
  // tile counts here when every call skipped it).
  uint64_t n_tiles_skipped = 0;
  uint64_t bytes_read = 0;     // K and V tile bytes read (a tile read by two row batches: twice)
  uint64_t bytes_skipped = 0;  // K and V tile bytes of the skipped tiles
  uint32_t n_disk_pages_read = 0;  // pages read from the disk tier (whole pages)
  uint64_t disk_bytes_read = 0;
  // Proven upper bound on the attention mass of the skipped tiles, as a fraction of the total,
  // maximised over query rows (<= epsilon).
  double skipped_mass_bound = 0;
  std::vector<SkippedTile> skipped;

  // Sums of several calls (the layers of a step): counts and bytes add, the bound is the largest.
  // `skipped` names the tiles of one call and is left as it was.
  AttentionStats& operator+=(const AttentionStats& other);
};

// Computes attention for a block of queries at the last positions of a sequence's layer.
// Thread-safe for concurrent calls on different engines over different caches; one engine runs
// one call at a time. Calls whose caches share one disk tier share its staging budget, which
// the deadlock-freedom argument of engine.cc does not cover: serialise them.
// Errors: InvalidArgument (queries, options), ResourceExhausted naming the staging budget when
// the disk pages one call may hold at once exceed it even split a page a chunk (with epsilon > 0:
// all of the layer's disk pages), Corruption or IOError from a page read from disk (never
// served).
class AttentionEngine {
 public:
  explicit AttentionEngine(ThreadPool& pool);

  // q, out: [n_q_heads, head_dim]. The query is at the layer's last position (its own K/V are
  // already appended).
  Result<AttentionStats> Decode(KvCache& cache, SeqId seq, uint32_t layer, const float* q,
                                float* out, const AttentionOptions& options = {});
  // q, out: [n_queries, n_q_heads, head_dim]: queries at the layer's last n_queries positions,
  // each masked causally (a block of queries against all earlier pages plus a causal block over
  // itself).
  Result<AttentionStats> Prefill(KvCache& cache, SeqId seq, uint32_t layer, const float* q,
                                 uint32_t n_queries, float* out,
                                 const AttentionOptions& options = {});

 private:
  ThreadPool& pool_;
};

// Attention in double precision over dense tensors. q: [n_queries, n_q_heads, head_dim] at
// positions first_position + i; k, v: [n_tokens, n_kv_heads, head_dim] at positions 0 ..
// n_tokens-1. Returns [n_queries, n_q_heads, head_dim] (empty for an invalid geometry). A row
// with no attended key is zero.
std::vector<double> ReferenceAttention(const CacheGeometry& geometry, const float* q,
                                       uint32_t n_queries, uint32_t first_position, const float* k,
                                       const float* v, uint32_t n_tokens,
                                       const AttentionOptions& options);

}  // namespace argus
