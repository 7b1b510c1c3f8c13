// The paged KV cache: sequences of pages, and the KvCache a host engine drives.
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
// Thread safety: none inside. Mutating calls (append, crop, fork, release, reencode, the moves
// between tiers, save, restore, erase of a save, the prefix calls, which use the cache's scratch
// and key serial, and attention over the cache, which records each page's attention mass) need
// external serialisation; const calls may run concurrently with each other.
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
  size_t k_bytes = 0, v_bytes = 0;            // plane bytes of pages using this codec for K / for V
  size_t k_disk_bytes = 0, v_disk_bytes = 0;  // of which in pages on disk
  size_t n_k_pages = 0, n_v_pages = 0;
};

// The full prefix pages (one per page index and layer) StorePrefix saw, by what became of them.
struct PrefixStoreStats {
  size_t n_stored = 0;     // written by this call
  size_t n_present = 0;    // stored already
  size_t n_inexact = 0;    // not stored: computed by approximate attention or over lossy pages
  size_t n_reencoded = 0;  // not stored: re-encoded (e.g. demoted) since they filled
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

// A paged KV cache for one model shape. Owns its pages; borrows options.disk and
// options.registry. See the file comment for thread safety.
class KvCache {
 public:
  // A cache with no sequences. InvalidArgument for a bad geometry, page size, budget, active
  // codec or codec spec (naming it).
  static Result<std::unique_ptr<KvCache>> Create(const CacheOptions& options);
  // The most RAM bytes one sequence occupies under these options while it grows, by appends, to
  // n_tokens in every layer: the smallest budget that lets it. Errors as Create's (but
  // options.ram_budget_bytes is ignored); InvalidArgument when the size overflows size_t.
  static Result<size_t> RequiredRamBytes(const CacheOptions& options, uint32_t n_tokens);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // The options the cache was created with, their geometry, and tokens per page. Never fail.
  const CacheOptions& options() const;
  const CacheGeometry& geometry() const;
  uint32_t page_tokens() const;

  // A new, empty sequence (every layer 0 tokens). ResourceExhausted when the 2^32 - 1 sequence
  // ids of this cache are used up (ids are never reused).
  Result<SeqId> CreateSequence();
  // Appends n_tokens >= 1 rows to one layer: k, v are [n_tokens, n_kv_heads, head_dim], finite.
  // NotFound for an unknown seq; InvalidArgument for a bad layer, shape or value;
  // ResourceExhausted (naming the budget) when the pages do not fit. All or nothing: on error
  // the cache is as it was. AppendF16 takes IEEE half bits.
  Status Append(SeqId seq, uint32_t layer, std::span<const float> k, std::span<const float> v);
  Status AppendF16(SeqId seq, uint32_t layer, std::span<const uint16_t> k,
                   std::span<const uint16_t> v);
  // Keeps the first n_tokens of every layer. A full page cut in two becomes the active page
  // again (a lossy page stays as lossy as it was); shared pages are copied, never written.
  // NotFound for an unknown seq; InvalidArgument when a layer holds fewer than n_tokens;
  // ResourceExhausted when the copies do not fit. On error the sequence is unchanged.
  Status Crop(SeqId seq, uint32_t n_tokens);
  // A new sequence sharing seq's full pages (copy-on-write; neither sees the other's later
  // appends) with copies of its active pages. NotFound for an unknown seq; ResourceExhausted
  // when the copies do not fit or sequence ids are used up.
  Result<SeqId> Fork(SeqId seq);
  // Drops a sequence and every page no other sequence shares. NotFound for an unknown seq.
  Status Release(SeqId seq);
  // Tokens in one layer of a sequence. NotFound for an unknown seq; InvalidArgument for a bad
  // layer.
  Result<uint32_t> Length(SeqId seq, uint32_t layer) const;

  // The layer's pages of a sequence in token order (what the attention engine reads; their ids
  // are what Reencode and the moves take). Views stay valid until the next mutating call.
  // NotFound for an unknown seq; InvalidArgument for a bad layer.
  Result<std::vector<PageView>> Pages(SeqId seq, uint32_t layer) const;

  // Re-encodes a full page in RAM to other codecs (decoded first, so a lossy page stays as lossy
  // as it was); a shared page changes for every sequence holding it. InvalidArgument for a
  // missing or active page or a bad codec spec; Unsupported for a page on disk (move it first);
  // ResourceExhausted, with the old bytes counted as freed. On error the page is unchanged.
  Status Reencode(PageId page, std::string_view k_codec, std::string_view v_codec);

  // Moves a full, unpinned page's bytes into the disk tier (durable before its RAM slot is
  // freed) or back into RAM (verified against the page's checksum before its disk copy is
  // erased); a shared page moves for every sequence holding it. InvalidArgument without a disk
  // tier, or for an active, pinned or missing page or one already there; the tiers' budget,
  // Corruption and I/O errors otherwise. On error the page stays where it was.
  Status MoveToDisk(PageId page);
  Status MoveToRam(PageId page);
  // The disk tier of the options (not owned), or nullptr.
  DiskTier* disk() const;

  // Saves a sequence durably into the disk tier under `name` (1 to 200 bytes, any bytes): its
  // shape, codecs, token counts and every page. Replaces an earlier save of that name once the
  // new one is published; a crash before that leaves the old one. InvalidArgument without a disk
  // tier or for a bad name; NotFound for an unknown seq; the tier's errors otherwise.
  Status Save(SeqId seq, std::string_view name);
  // A new sequence holding a saved one, its pages in RAM, so decoding continues exactly as it
  // would have. NotFound when nothing is saved under `name`; InvalidArgument without a disk tier
  // or for a save of another geometry, page size or active codec; ResourceExhausted (checked
  // before anything loads); Corruption when the save or a page fails verification.
  Result<SeqId> Restore(std::string_view name);
  // Erases a save and its pages. NotFound when nothing is saved under `name`; InvalidArgument
  // without a disk tier.
  Status EraseSave(std::string_view name);

  // Stores the full pages of seq whose tokens are given (tokens[i]: the id at position i, all
  // layers) under their prefix keys, skipping those stored already. The fingerprint names the
  // model (any bytes: a hash of its weights and metadata): K/V of another model or tokenizer must
  // never be served. The keys also hash the geometry, page size and the active, K and V codecs.
  // A stored page must be what a fresh exact computation gives, so pages reaching past the
  // first n_exact_tokens (the tokens whose K/V came from canonical attention: no epsilon,
  // window or sinks, every page attended in its full codecs) and pages re-encoded since they
  // filled are not stored. `stats` counts every page, on error too (the pages written before
  // a failure stay written).
  Status StorePrefix(SeqId seq, std::string_view fingerprint, std::span<const int32_t> tokens,
                     uint32_t n_exact_tokens, PrefixStoreStats& stats);
  // Into an empty sequence: loads the longest run of leading pages, wholly inside `tokens`,
  // stored for every layer under this fingerprint; returns the tokens loaded (a multiple of
  // page_tokens; 0 when none). InvalidArgument without a disk tier or for a non-empty seq;
  // NotFound for an unknown seq; ResourceExhausted (checked before anything loads).
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

  // Counts and bytes of pages, per tier and codec, and the tiers' statistics. Never fails.
  CacheStats stats() const;

 private:
  struct Impl;
  // The library's internal tools (src/cache/placement_access.h) reach the implementation here.
  friend struct KvCacheAccess;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace argus
