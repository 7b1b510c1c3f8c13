// Internal to the cache module: the KvCache implementation's state, shared by kv_cache.cc (the
// page table, appends, crops, forks) and persist.cc (moves between tiers, save and restore,
// prefix pages).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "argus/cache.h"
#include "argus/core.h"
#include "cache/page_table.h"
#include "core/buffer.h"

namespace argus {
namespace cache_internal {

constexpr uint32_t kMaxPageTokens = 4096;
constexpr uint16_t kActiveCodec = 0;  // the codec table's first entry
constexpr size_t kMaxCodecs = 256;    // entries of one cache's codec table
// The smallest float magnitude that rounds to Inf in f16.
constexpr float kHalfOverflow = 65520.0f;

struct CodecEntry {
  std::string spec;  // canonical (CodecSpec::ToString)
  std::unique_ptr<Codec> codec;
  size_t tile_bytes = 0;  // encoded_size({page_tokens, head_dim})
};

struct LayerPages {
  std::vector<PageId> pages;  // the block table, in token order; an active page is last
  uint32_t n_tokens = 0;
};

struct Sequence {
  std::vector<LayerPages> layers;
};

inline std::string SeqLayer(SeqId seq, uint32_t layer) {
  return "sequence " + std::to_string(seq) + " layer " + std::to_string(layer);
}

inline float AsFloat(float x) { return x; }
inline float AsFloat(uint16_t h) { return HalfToFloat(h); }

template <typename V>
size_t CapacityBytes(const V& v) {
  return v.capacity() * sizeof(typename V::value_type);
}

// An upper bound on x in float (the key norm bound must never be below a true norm).
inline float RoundUp(double x) {
  float f = static_cast<float>(x);
  return static_cast<double>(f) < x ? std::nextafter(f, INFINITY) : f;
}

}  // namespace cache_internal
using namespace cache_internal;  // NOLINT: internal header of one module

struct KvCache::Impl {
  // Slots and page rows a mutating call has taken: given back on destruction unless committed,
  // so a call that fails part-way leaves the cache as it was.
  class Pending {
   public:
    explicit Pending(Impl& impl) : impl_(impl) {}
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    ~Pending() {
      if (committed_) return;
      for (PageId page : rows_) impl_.FreeRow(page);
      for (SlotId slot : slots_) impl_.ram.Free(slot);
    }
    SlotId Hold(SlotId slot) {
      slots_.push_back(slot);
      return slot;
    }
    PageId HoldRow(PageId page) {
      rows_.push_back(page);
      return page;
    }
    void Commit() { committed_ = true; }

   private:
    Impl& impl_;
    std::vector<SlotId> slots_;
    std::vector<PageId> rows_;
    bool committed_ = false;
  };

  explicit Impl(const CacheOptions& o)
      : options(o),
        ram(o.ram_budget_bytes),
        n_kv_heads(o.geometry.n_kv_heads),
        head_dim(o.geometry.head_dim),
        page_tokens(o.page_tokens),
        key_nonce(NewKeyNonce()) {}

  CacheOptions options;
  RamTier ram;
  const uint32_t n_kv_heads, head_dim, page_tokens;
  PageTable table;
  std::vector<PageId> free_rows;
  std::vector<CodecEntry> codecs;  // [kActiveCodec] is the active codec
  uint16_t k_codec = 0, v_codec = 0;
  bool active_is_f16 = true;
  size_t active_row_bytes = 0;  // one row of an active tile
  std::unordered_map<SeqId, Sequence> sequences;
  SeqId next_seq = 0;
  uint64_t clock = 0;
  // Scratch of mutating calls, reused across calls.
  AlignedBuffer tile_scratch;     // float [page_tokens, head_dim]: one decoded tile
  AlignedBuffer row_scratch;      // float [head_dim]
  AlignedBuffer summary_scratch;  // float [2 * n_kv_heads * head_dim + n_kv_heads]
  AlignedBuffer stage_scratch;    // one active page, made on first use (see Append)
  AlignedBuffer load_scratch;     // one page read from disk (Crop, Save), made on first use
  // Keys of pages this cache moves to disk: {nonce, serial}, the nonce random per cache.
  uint64_t key_nonce, next_key_serial = 1;
  size_t n_disk_erase_failures = 0;
  // Keys of disk pages released by the running call, erased together when it ends (one journal
  // record and sync for all of them; see ErasesAtExit).
  std::vector<PageKey> released_disk_keys;
  void EraseReleasedDiskPages();
  // Erases the disk pages a mutating call released, whichever way it returns.
  struct ErasesAtExit {
    Impl& impl;
    ~ErasesAtExit() { impl.EraseReleasedDiskPages(); }
  };

  Status Init();
  Result<uint16_t> FindOrAddCodec(std::string_view text, CodecRole plane);

  size_t KPlaneBytes(uint16_t k) const { return size_t{n_kv_heads} * codecs[k].tile_bytes; }
  size_t PageBytes(uint16_t k, uint16_t v) const { return KPlaneBytes(k) + KPlaneBytes(v); }
  size_t ActivePageBytes() const { return PageBytes(kActiveCodec, kActiveCodec); }
  size_t SummaryFloats() const { return 2 * size_t{n_kv_heads} * head_dim + n_kv_heads; }
  float* Bounds(PageId page) {
    return table.key_bounds.data() + size_t{page} * 2 * n_kv_heads * head_dim;
  }
  float* Norms(PageId page) { return table.key_norm_max.data() + size_t{page} * n_kv_heads; }
  bool HasMaster(PageId page) const { return table.master_key[page] != PageKey{}; }
  // Sets a page's key summary ([bounds][norms], SummaryFloats()), or widens the old one to cover
  // it too (when the page may still be read from a copy the old summary describes).
  void SetSummary(PageId page, const float* summary, bool keep_old);

  Result<const LayerPages*> FindLayer(SeqId seq, uint32_t layer) const;
  Result<LayerPages*> FindLayer(SeqId seq, uint32_t layer) {
    ARGUS_ASSIGN_OR_RETURN(const LayerPages* lp, std::as_const(*this).FindLayer(seq, layer));
    return const_cast<LayerPages*>(lp);
  }
  PageId ActivePage(const LayerPages& lp) const {
    return lp.pages.empty() || table.state[lp.pages.back()] != PageState::kActive ? kNoPage
                                                                                  : lp.pages.back();
  }

  Status CheckRows(size_t n_new, std::string_view what) const;
  PageId NewRow(PageState state, SeqId owner, uint32_t layer, uint32_t first_token,
                uint32_t n_tokens, uint16_t k, uint16_t v, SlotId slot);
  void SetSlot(PageId page, SlotId slot, uint16_t k, uint16_t v);
  void FreeRow(PageId page);
  void ReleasePage(PageId page);

  template <typename T>
  Status CheckValues(std::span<const T> x, const char* plane, SeqId seq, uint32_t layer) const;
  template <typename T>
  Status WriteRows(std::span<std::byte> page, uint32_t row0, uint32_t n_rows, std::span<const T> k,
                   std::span<const T> v, size_t token0);
  // Both read only codecs: thread-safe given their own scratch (page_tokens * head_dim floats).
  Status Transcode(std::span<const std::byte> src, uint16_t src_k, uint16_t src_v,
                   std::span<std::byte> dst, uint16_t dst_k, uint16_t dst_v, uint32_t n_rows,
                   float* scratch) const;
  Status Summarize(std::span<const std::byte> page, uint16_t k, float* bounds, float* norms,
                   float* scratch) const;
  float* TileScratch() { return tile_scratch.as<float>(); }

  // What an append of n_tokens rows to a layer does to its pages, and the RAM it takes: the
  // bytes of its new slots (add_bytes), less the active slot a filling page is re-encoded out of,
  // freed at its commit (release_bytes).
  struct AppendPlan {
    PageId active = kNoPage;
    uint32_t n_into_active = 0;
    bool active_fills = false;
    size_t n_new_full = 0;
    uint32_t n_tail = 0;
    size_t n_new_pages = 0;
    bool in_place = false;
    SlotId replaced;
    size_t full_bytes = 0, active_bytes = 0;
    size_t add_bytes = 0, release_bytes = 0;
  };
  static std::string AppendName(SeqId seq, uint32_t layer, size_t n_tokens);
  Result<AppendPlan> PlanAppend(const LayerPages& lp, size_t n_tokens, std::string_view what) const;
  template <typename T>
  Status Append(SeqId seq, uint32_t layer, std::span<const T> k, std::span<const T> v);
  Status Crop(SeqId seq, uint32_t n_tokens);
  Result<SeqId> Fork(SeqId seq);
  Status Reencode(PageId page, std::string_view k_spec, std::string_view v_spec);
  Status ReencodeBody(PageId page, std::string_view k_spec, std::string_view v_spec);
  PageView View(PageId page) const;
  // A page's bytes wherever they are: its RAM slot, or read from disk into load_scratch and
  // verified against the page's checksum (valid until the next call).
  Result<std::span<const std::byte>> PageBytesAnywhere(PageId page);
  // A new RAM page row holding `key`'s bytes read from disk, verified against `checksum` when
  // it is not 0, its summary computed when full. The row and slot are held by `pending`.
  Result<PageId> LoadRow(Pending& pending, const PageKey& key, PageState state, SeqId owner,
                         uint32_t layer, uint32_t first_token, uint32_t n_tokens, uint16_t k,
                         uint16_t v, std::string_view what);
  Status CheckPageChecksum(PageId page, std::span<const std::byte> bytes) const;
  // InvalidArgument unless the cache has a disk tier and page is a full, unpinned page in `from`.
  Status CheckMovable(PageId page, TierKind from, std::string_view what) const;
  // [page][layer] prefix keys of the first n_pages pages of `tokens` (see persist.cc).
  std::vector<std::vector<PageKey>> PrefixKeys(std::string_view fingerprint,
                                               std::span<const int32_t> tokens,
                                               size_t n_pages) const;
  static uint64_t NewKeyNonce();
  ~Impl();  // erases the pages this cache left on disk
  size_t MetadataBytes() const;
};

// How the library's internal tools (placement_access.h) reach a cache's implementation.
struct KvCacheAccess {
  using Impl = KvCache::Impl;
  static Impl& Of(KvCache& cache) { return *cache.impl_; }
  static const Impl& Of(const KvCache& cache) { return *cache.impl_; }
};
using CacheImpl = KvCacheAccess::Impl;

}  // namespace argus
