// Internal to the library: the page table of a KvCache, read by the placement engine, the
// attention engine's bookkeeping and the tests through src/cache/placement_access.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "argus/cache.h"
#include "argus/store.h"

namespace argus {

enum class PageState : uint8_t { kFree = 0, kActive = 1, kFull = 2 };

// One row per page id, as a structure of arrays (hot paths walk single columns). Rows of freed
// pages are reused. Codec columns index CodecAt().
struct PageTable {
  std::vector<PageState> state;
  std::vector<SeqId> owner;  // the sequence that wrote the page
  std::vector<uint32_t> layer;
  std::vector<uint32_t> first_token;  // position of the page's first token
  std::vector<uint32_t> n_tokens;
  std::vector<uint16_t> k_codec, v_codec;
  std::vector<TierKind> tier;
  std::vector<SlotId> slot;        // the RAM slot (tier kRam)
  std::vector<PageKey> disk_key;   // the key in the disk tier (tier kDisk)
  std::vector<size_t> n_bytes;     // bytes of the slot (K and V planes together)
  std::vector<size_t> k_bytes;     // of which the K plane
  std::vector<uint64_t> checksum;  // XXH3 of the bytes; set when the page fills, checked on
                                   // every load from disk
  std::vector<uint32_t> ref_count;
  std::vector<uint32_t> pin_count;  // a pinned page is never moved to disk
  // The page's exact master on the disk tier (its bytes as it filled, in the cache's K and V
  // codecs) while RAM may hold a lossy replica; PageKey{} when it has none. A page on disk that
  // is its master has disk_key == master_key.
  std::vector<PageKey> master_key;
  std::vector<uint64_t> master_checksum;  // XXH3 of the master's bytes
  // Bumped whenever the page's bytes, codecs or tier change or its row is reused: work staged
  // on a copy of the page checks it before committing.
  std::vector<uint32_t> generation;
  // Attention mass the page received at the last attention call over its layer: the fraction
  // of the softmax weight of the layer's query heads, averaged over those heads (sums to 1 over
  // a sequence's pages of a layer). 0 when the page was masked or skipped.
  std::vector<float> mass;
  std::vector<uint64_t> last_use;  // the cache's attention clock at that call; 0 = never
  // Key summary of full pages, over the decoded keys: per KV head, per channel min and max,
  // [page][2][n_kv_heads][head_dim] (min plane then max plane), and per KV head the largest key
  // norm, [page][n_kv_heads].
  std::vector<float> key_bounds;
  std::vector<float> key_norm_max;

  size_t size() const { return state.size(); }
};

}  // namespace argus
