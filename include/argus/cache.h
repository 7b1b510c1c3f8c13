// The paged KV cache: a page table, sequences, and the KvCache facade.
//
// A page holds `page_tokens` consecutive tokens of one layer of one sequence, all KV heads, with
// a K plane and a V plane. Its bytes, in one RAM slot, are n_kv_heads K tiles then n_kv_heads V
// tiles, each tile encoded by the page's K or V codec (shape [n_tokens, head_dim]). The newest,
// partly filled page of each layer is *active*: it is held in the active codec (f16 or f32),
// sized for a full page, and filled row by row; when it fills it is encoded to the cache's K and
// V codecs, its key summary is computed, and it becomes immutable. Full pages can be shared by
// forked sequences (reference-counted, never written again).
//
// With a disk tier, a full page can be moved to disk (its bytes written durably, its RAM slot
// freed; its summary stays in RAM) and back; attention reads disk pages through the disk tier's
// staging area. Sequences can be saved into the disk tier and restored, and full pages can be
// stored under prefix keys (a hash chain over a model fingerprint, the cache's shape and codecs,
// and the token ids up to the page) so a later request, in this process or another, loads them
// instead of recomputing them.
//
// Thread safety: none inside. Mutating calls (append, crop, fork, release, reencode, record,
// the moves between tiers, save, restore, erase of a save, and the prefix calls, which use the
// cache's scratch and key serial) need external serialisation; read-only calls may run
// concurrently with each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/codec.h"
#include "argus/status.h"
#include "argus/store.h"

namespace argus {

struct CacheGeometry {
  uint32_t n_layers = 0;
  uint32_t n_q_heads = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t gqa() const { return n_kv_heads ? n_q_heads / n_kv_heads : 0; }
  // InvalidArgument unless all are >= 1, n_kv_heads divides n_q_heads, a GQA group has at most
  // kMaxGroupHeads query heads and head_dim <= kMaxTileDim.
  Status Validate() const;
  std::string ToString() const;  // "32 layers, 32 q heads, 8 kv heads, head_dim 128"
};

struct CacheOptions {
  CacheGeometry geometry;
  uint32_t page_tokens = 256;   // a power of two in [1, 4096]
  size_t ram_budget_bytes = 0;  // required: bytes of page slots in RAM
  std::string k_codec = "f16";  // codec specs of full pages (see CodecSpec)
  std::string v_codec = "f16";
  std::string active_codec = "f16";   // "f16" or "f32": the partly filled page
  CodecRegistry* registry = nullptr;  // nullptr: CodecRegistry::Default()
  // Optional: where MoveToDisk, Save and prefix pages put bytes. Not owned; must outlive the
  // cache, and no other cache may use it at the same time with the same key nonce (keys of
  // moved pages carry a per-cache random nonce, so two caches never collide in practice).
  DiskTier* disk = nullptr;
};

using SeqId = uint32_t;
using PageId = uint32_t;
inline constexpr PageId kNoPage = UINT32_MAX;

enum class PageState : uint8_t { kFree = 0, kActive = 1, kFull = 2 };

// One row per page id, as a structure of arrays (hot paths walk single columns). Rows of freed
// pages are reused. Codec columns index KvCache::codec().
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
  std::vector<uint64_t> last_use;  // KvCache's attention clock at that call; 0 = never
  // Key summary of full pages, over the decoded keys: per KV head, per channel min and max,
  // [page][2][n_kv_heads][head_dim] (min plane then max plane), and per KV head the largest key
  // norm, [page][n_kv_heads].
  std::vector<float> key_bounds;
  std::vector<float> key_norm_max;

  size_t size() const { return state.size(); }
};

// What the attention engine reads of one page: its tiles and summary. A page on disk has no
// bytes: the reader fetches `n_bytes` under `disk_key` and points `bytes` at them.
struct PageView {
  PageId id = kNoPage;
  uint32_t first_token = 0, n_tokens = 0;
  const Codec* k_codec = nullptr;
  const Codec* v_codec = nullptr;
  TierKind tier = TierKind::kRam;
  PageKey disk_key;
  size_t n_bytes = 0;
  const std::byte* bytes = nullptr;       // nullptr on disk
  size_t k_stride = 0, k_tile_bytes = 0;  // K tile h: [h * k_stride, + k_tile_bytes)
  size_t v_offset = 0, v_stride = 0, v_tile_bytes = 0;
  const float* key_min = nullptr;  // [n_kv_heads, head_dim]; nullptr for an active page
  const float* key_max = nullptr;
  const float* key_norm_max = nullptr;  // [n_kv_heads]

  std::span<const std::byte> k_tile(uint32_t h) const {
    return {bytes + h * k_stride, k_tile_bytes};
  }
  std::span<const std::byte> v_tile(uint32_t h) const {
    return {bytes + v_offset + h * v_stride, v_tile_bytes};
  }
};

struct CodecBytes {
  std::string codec;
  size_t k_bytes = 0, v_bytes = 0;  // plane bytes of pages using this codec for K / for V
  size_t n_k_pages = 0, n_v_pages = 0;
};

struct CacheStats {
  size_t n_sequences = 0;
  size_t n_pages = 0;  // live pages (full + active)
  size_t n_full_pages = 0, n_active_pages = 0;
  size_t page_bytes = 0;       // bytes of all live pages, both tiers
  size_t ram_page_bytes = 0;   // of which in RAM; equals ram.used_bytes
  size_t disk_page_bytes = 0;  // of which on disk (payload bytes; slots are larger, see disk)
  size_t n_ram_pages = 0, n_disk_pages = 0;
  // Erases of pages released while on disk that failed (one per call that released some):
  // their slots stay used (the store had failed; see its stats).
  size_t n_disk_erase_failures = 0;
  size_t metadata_bytes = 0;  // page table, key summaries and sequence tables
  std::vector<CodecBytes> by_codec;
  RamTierStats ram;
  bool has_disk = false;
  DiskTierStats disk;  // when has_disk
};

class KvCache {
 public:
  // InvalidArgument for a bad geometry, page size, budget or codec spec (naming it).
  static Result<std::unique_ptr<KvCache>> Create(const CacheOptions& options);
  // The most RAM bytes one sequence occupies under these options while it grows, by appends, to
  // n_tokens in every layer: the smallest budget that lets it. (A layer ending on a page
  // boundary held an active page before its last page filled.) Errors as Create's, except that
  // options.ram_budget_bytes is ignored.
  static Result<size_t> RequiredRamBytes(const CacheOptions& options, uint32_t n_tokens);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const CacheOptions& options() const;
  const CacheGeometry& geometry() const;
  uint32_t page_tokens() const;

  Result<SeqId> CreateSequence();
  // Appends n_tokens rows to one layer: k, v are [n_tokens, n_kv_heads, head_dim]. Values must
  // be finite. All or nothing: ResourceExhausted (naming the budget) or InvalidArgument leaves
  // the cache as it was.
  Status Append(SeqId seq, uint32_t layer, std::span<const float> k, std::span<const float> v);
  Status AppendF16(SeqId seq, uint32_t layer, std::span<const uint16_t> k,
                   std::span<const uint16_t> v);
  // Keeps the first n_tokens of every layer (n_tokens <= every layer's length). A full page cut
  // in two becomes the active page again, decoded into the active codec (a lossy page stays as
  // lossy as it was); shared pages are copied, never written.
  Status Crop(SeqId seq, uint32_t n_tokens);
  // A new sequence sharing seq's full pages (copy-on-write); active pages are copied.
  Result<SeqId> Fork(SeqId seq);
  Status Release(SeqId seq);
  // Tokens in one layer of a sequence.
  Result<uint32_t> Length(SeqId seq, uint32_t layer) const;

  // The layer's pages of a sequence in token order. Views stay valid until the next mutating call.
  Result<std::vector<PageView>> Pages(SeqId seq, uint32_t layer) const;

  // Re-encodes a full page in RAM to other codecs, replacing its old bytes (decoded first, so a
  // lossy page stays as lossy as it was). The budget is checked as if the old bytes were already
  // freed; on error the page is unchanged. A page on disk is Unsupported (move it first). Shared
  // pages change for every sequence holding them.
  Status Reencode(PageId page, std::string_view k_codec, std::string_view v_codec);

  // Moves a full, unpinned page's bytes into the disk tier (durable before its RAM slot is
  // freed) or back into RAM (verified against the page's checksum before its disk copy is
  // erased). A shared page moves for every sequence holding it. InvalidArgument without a disk
  // tier, for an active, pinned or missing page, or a page already there; the tiers' budget and
  // I/O errors otherwise. On error the page stays where it was.
  Status MoveToDisk(PageId page);
  Status MoveToRam(PageId page);
  DiskTier* disk() const;

  // Saves a sequence durably into the disk tier under `name` (any bytes, at most 200): its
  // geometry, page size, codecs, token counts and every page (the active pages in the active
  // codec). Replaces an earlier save of that name, whose pages are erased after the new one is
  // published. A crash before the new save is published leaves the old one.
  Status Save(SeqId seq, std::string_view name);
  // A new sequence holding a saved one, its pages in RAM (budget checked first), so decoding
  // continues exactly as it would have. NotFound when nothing is saved under `name`;
  // InvalidArgument when the save was made by a cache of another geometry, page size or active
  // codec; Corruption when the save or a page fails verification.
  Result<SeqId> Restore(std::string_view name);
  Status EraseSave(std::string_view name);

  // Stores the full pages of seq whose tokens are given (tokens[i]: the id at position i, all
  // layers) under their prefix keys, skipping those stored already. The fingerprint names the
  // model (any bytes: a hash of its weights and metadata): K/V of another model or tokenizer must
  // never be served. The keys also hash the geometry, page size and the active, K and V codecs.
  // Pages re-encoded since they filled are not stored (they are not what a fresh computation
  // gives). Returns the pages written.
  Result<size_t> StorePrefix(SeqId seq, std::string_view fingerprint,
                             std::span<const int32_t> tokens);
  // Into an empty sequence: loads the longest run of leading pages, wholly inside `tokens`,
  // stored for every layer under this fingerprint; returns the tokens loaded (a multiple of
  // page_tokens; 0 when none). Budget checked before anything is loaded.
  Result<uint32_t> LoadPrefix(SeqId seq, std::string_view fingerprint,
                              std::span<const int32_t> tokens);
  // The keys StorePrefix and LoadPrefix use for the whole pages of `tokens` ([page][layer]),
  // the tag such pages are stored with and a page's payload bytes, so a tier below the disk (the
  // remote tier) can fetch and keep exactly the pages LoadPrefix looks for.
  struct PrefixPages {
    std::vector<std::vector<PageKey>> keys;  // [page][layer]
    std::string tag;
    size_t page_bytes = 0;
  };
  PrefixPages PrefixPageKeys(std::string_view fingerprint, std::span<const int32_t> tokens) const;

  // ---- Placement mechanism (the placement engine's tools; they decide nothing) ----
  // The codec-table index of a spec, added when new (at most 256 codecs per cache). Table
  // entries never move once added.
  Result<uint16_t> AddCodec(std::string_view spec, CodecRole plane);
  // Codec-table indices of full pages' K and V codecs as they fill (CacheOptions k_codec,
  // v_codec): the codecs of masters.
  uint16_t full_k_codec() const;
  uint16_t full_v_codec() const;
  // Bytes of a full page in these codecs.
  size_t FullPageBytes(uint16_t k, uint16_t v) const;
  // Floats of a key summary: [2][n_kv_heads][head_dim] bounds then [n_kv_heads] norms.
  size_t SummaryFloats() const;
  // Re-encodes a full page's bytes (codecs src_k, src_v) into dst (codecs dst_k, dst_v; exactly
  // FullPageBytes(dst_k, dst_v) bytes) and writes the key summary of the result. Thread-safe,
  // also beside mutating calls (even those adding codecs): it reads only codec-table entries,
  // which never move, and immutable codecs; scratch holds page_tokens * head_dim floats.
  Status TranscodePage(std::span<const std::byte> src, uint16_t src_k, uint16_t src_v,
                       std::span<std::byte> dst, uint16_t dst_k, uint16_t dst_v, float* summary,
                       float* scratch) const;
  // A fresh key for a page copy in the disk tier, and the tag such copies carry.
  PageKey NewDiskKey();
  std::string DiskTag(uint16_t k, uint16_t v) const;
  // Records that the disk tier holds, under `key` (written with DiskTag of the full codecs), the
  // page's exact bytes with this checksum. Aborted (the caller erases its copy) when
  // the page changed since `generation` or is not in its full codecs in RAM; InvalidArgument for
  // a page that has a master already.
  Status AttachMaster(PageId page, uint32_t generation, const PageKey& key, uint64_t checksum);
  // Replaces a full page's bytes (in RAM, or on disk with a master) by `bytes` in codecs (k, v),
  // made from the page as of `generation`; the key summary becomes the union of the old one and
  // `summary` (a bound for every copy the page may be read from). The RAM budget is checked as
  // if the old bytes were freed. Aborted when the page changed since; the budget's
  // ResourceExhausted; on error nothing changes.
  Status InstallPage(PageId page, uint32_t generation, uint16_t k, uint16_t v,
                     std::span<const std::byte> bytes, const float* summary);
  // Frees the RAM bytes of a full page that has a master: the page is read from its master.
  Status DropToMaster(PageId page);

  // Called by the attention engine: mass[i] for pages[i]; advances the attention clock.
  void RecordAttention(std::span<const PageId> pages, std::span<const float> mass);

  const PageTable& page_table() const;
  // Codec of a page-table codec index.
  const Codec& codec(uint16_t index) const;
  CacheStats stats() const;

 private:
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace argus
