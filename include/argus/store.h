// Tiers: where page bytes live. Stores move and keep bytes; they never decide placement.
//
// RamTier is the RAM pool: slabs of fixed-size slots, one pool per slot size (size class), so
// pages of one codec and shape share contiguous blocks. A byte budget bounds the bytes of the
// slots in use; slabs are allocated on demand and returned when their last slot is freed.
// Not thread-safe: the owner (the cache) serialises calls. Bytes() of a live slot stays valid
// until that slot is freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/env.h"
#include "argus/status.h"

namespace argus {

enum class TierKind : uint8_t { kRam = 0, kDisk = 1 };  // append only: page table and stats
std::string_view TierName(TierKind tier);

// A slot in a tier: size class and index within it. Valid until freed.
struct SlotId {
  uint32_t size_class = UINT32_MAX;
  uint32_t index = UINT32_MAX;
  bool valid() const { return size_class != UINT32_MAX; }
};

struct RamTierStats {
  size_t budget_bytes = 0;
  size_t used_bytes = 0;      // sum of the sizes of live slots; within the budget between calls
                              // (AllocateReplacing holds old and new until the old is freed)
  size_t reserved_bytes = 0;  // bytes of allocated slabs (used and free slots, huge-page padding)
  size_t n_slots = 0;         // live slots
  size_t n_slabs = 0;
  size_t n_size_classes = 0;
};

class RamTier {
 public:
  // Slabs hold about slab_bytes each (at least one slot).
  explicit RamTier(size_t budget_bytes, size_t slab_bytes = size_t{2} << 20);
  RamTier(const RamTier&) = delete;
  RamTier& operator=(const RamTier&) = delete;
  ~RamTier();

  // Would allocating `add_bytes` after freeing `release_bytes` fit the budget?
  bool Fits(size_t add_bytes, size_t release_bytes) const;
  // Fits, as a status: `what` names the request in the error, ResourceExhausted "RAM budget of
  // B bytes: W needs N more bytes, U in use".
  Status CheckFits(size_t add_bytes, size_t release_bytes, std::string_view what) const;

  // A zeroed slot of exactly n_bytes (> 0). ResourceExhausted when the budget would be exceeded
  // (nothing changes), or when the slab allocation fails.
  Result<SlotId> Allocate(size_t n_bytes, std::string_view what);
  // Replaces `old` by a new slot of n_bytes, checking the budget as if `old` were already freed;
  // `old` stays live (its bytes readable) until the caller frees it. On error nothing changes.
  Result<SlotId> AllocateReplacing(SlotId old, size_t n_bytes, std::string_view what);
  // REQUIRES: slot is live.
  void Free(SlotId slot);

  std::span<std::byte> Bytes(SlotId slot);
  std::span<const std::byte> Bytes(SlotId slot) const;
  size_t SlotBytes(SlotId slot) const;

  size_t budget_bytes() const { return budget_bytes_; }
  size_t used_bytes() const { return used_bytes_; }
  RamTierStats stats() const;

 private:
  struct SizeClass;
  Result<SlotId> AllocateUnchecked(size_t n_bytes);

  size_t budget_bytes_;
  size_t slab_bytes_;
  size_t used_bytes_ = 0;
  std::vector<std::unique_ptr<SizeClass>> classes_;
  std::map<size_t, uint32_t> class_by_bytes_;
};

// ---- The disk tier ---------------------------------------------------------------------------
//
// A durable page store in a directory: one file of fixed-size slots per slot size (size class),
// opened with O_DIRECT where the file system allows it, and an append-only journal. The on-disk
// format is specified in docs/page_format.md. A Put writes each page into a free slot (slot
// header: magic, format version, key, tag, payload length, generation, XXH3 of payload and
// header), makes the slot files durable, and only then publishes the pages in one checksummed
// journal record and makes that durable; the slots the pages replaced are freed after that. A
// crash at any instant therefore leaves every key at its old or its new page, never a torn one.
// Every read verifies the slot header (key, generation, length) and the payload checksum: a
// mismatch is Corruption naming the key and the file, the page is counted lost, and its bytes
// are never returned.
//
// Thread safety: all methods may be called from several threads at once. A page being read is
// pinned: replacing or erasing its key frees its slot only after the read ends.

// The identity of a stored page: 128 bits chosen by the caller (the cache: a per-cache nonce and
// a page serial, or a prefix hash chain).
struct PageKey {
  uint64_t hi = 0, lo = 0;
  friend bool operator==(const PageKey&, const PageKey&) = default;
  std::string ToString() const;  // 32 hex digits
};
struct PageKeyHash {
  size_t operator()(const PageKey& key) const { return key.hi ^ (key.lo * 0x9E3779B97F4A7C15ull); }
};

enum class DiskIoBackend : uint8_t { kAuto = 0, kUring = 1, kThreads = 2 };

struct DiskTierOptions {
  std::string dir;               // created when missing
  Env* env = nullptr;            // nullptr: Env::Default()
  size_t disk_budget_bytes = 0;  // required: bytes of slots holding live pages
  // RAM for reads and writes in flight (aligned staging buffers).
  size_t staging_budget_bytes = size_t{64} << 20;
  // RAM for the index of stored pages, free-slot lists and named records.
  size_t metadata_budget_bytes = size_t{64} << 20;
  DiskIoBackend io = DiskIoBackend::kAuto;  // kAuto: io_uring when the kernel allows it
  uint32_t n_io_threads = 4;                // the pread pool (kThreads, or kAuto's fallback)
  uint32_t queue_depth = 32;                // reads in flight at most
  bool direct_io = true;       // O_DIRECT; when the file system refuses, buffered I/O (see stats)
  bool verify_on_open = true;  // read and verify every published page at Open
  // Inspection only (`argus store check`): Open creates, cuts and removes nothing (a damaged
  // journal tail is counted in journal_dropped_bytes but stays), a directory without a journal
  // is NotFound, and every write (Put, Erase, records, Compact) is InvalidArgument.
  bool read_only = false;
};

// A page to store. The tag is a short caller label kept in the slot header and the index (the
// cache stores "k_codec/v_codec"); at most kMaxPageTagBytes bytes.
struct PagePut {
  PageKey key;
  std::string_view tag;
  std::span<const std::byte> payload;  // 1 .. kMaxPagePayloadBytes bytes
};
inline constexpr size_t kMaxPageTagBytes = 48;
inline constexpr size_t kMaxPagePayloadBytes = size_t{1} << 30;

struct StoredPageInfo {
  PageKey key;
  std::string tag;
  uint64_t generation = 0;  // increases with every Put of any key in the store
  size_t payload_bytes = 0;
  size_t slot_bytes = 0;
};

struct DiskTierStats {
  std::string dir;
  std::string io_backend;  // "io_uring" or "pread pool of N threads"
  bool direct_io = false;  // whether the slot files are open with O_DIRECT
  uint32_t alignment_bytes = 0;
  size_t budget_bytes = 0, used_bytes = 0;  // slots of live pages (and of pinned old slots)
  size_t file_bytes = 0;                    // slot files on disk, free slots included
  size_t n_pages = 0, n_free_slots = 0, n_size_classes = 0;
  size_t staging_budget_bytes = 0, staging_used_bytes = 0, staging_peak_bytes = 0;
  size_t metadata_budget_bytes = 0, metadata_bytes = 0;
  size_t journal_bytes = 0, n_journal_records = 0;
  size_t journal_dropped_bytes = 0;  // a damaged journal tail cut off at Open
  uint64_t n_reads = 0, read_bytes = 0, n_writes = 0, write_bytes = 0;
  uint64_t n_corrupt_reads = 0;  // reads refused on a checksum or identity mismatch
  size_t n_lost_pages = 0;       // published pages found unreadable (at open, check or read)
};

struct StoreCheckReport {
  size_t n_pages = 0, payload_bytes = 0, slot_bytes = 0;
  size_t n_records = 0;                               // named records
  std::vector<std::pair<PageKey, std::string>> lost;  // key, why
  bool ok() const { return lost.empty(); }
};

class DiskTier;

// Asynchronous reads of a list of pages into staging buffers, issued in list order while their
// staging bytes fit the staging budget beside every other batch's (the I/O engine keeps at most
// queue_depth on the device). Get(i) returns page i's verified payload, issuing its read first when
// it was not issued yet (so a consumer may also read on demand, out of order); the bytes stay valid
// until Release(i) or the batch's destruction. Release(i) returns the staging bytes and lets the
// read-ahead advance. The pages are pinned from construction to destruction. Read-ahead leaves
// the store's largest slot size free in the staging budget, so a Put or Read of one page beside
// an open batch is not refused for staging taken by read-ahead; an on-demand Get(i) may drop the
// read-ahead of pages nobody has asked for yet, the last in list order first.
// Thread safety: Get and Release may be called concurrently for different i.
// REQUIRES: destroyed before its DiskTier.
class PageReadBatch {
 public:
  virtual ~PageReadBatch() = default;  // waits for reads in flight
  virtual size_t size() const = 0;
  // Corruption (checksum or identity mismatch: the page is lost), IOError, or ResourceExhausted
  // naming the staging budget when page i can never fit beside the staged pages not released.
  virtual Result<std::span<const std::byte>> Get(size_t i) = 0;
  virtual void Release(size_t i) = 0;
};

class DiskTier {
 public:
  // Creates the directory and an empty store, or recovers an existing one: replays the
  // journal up to its first damaged record, cutting off a torn tail (counted in
  // journal_dropped_bytes), and with verify_on_open reads and verifies every page. Damage with a
  // valid record after it is not a torn tail: Corruption naming both offsets, nothing cut.
  // Pages that fail verification at Open are kept out of the index (Contains is false, Read
  // NotFound) but keep their slots, and Check lists them as lost. The store holds an exclusive
  // lock on DIR/LOCK until destroyed: a directory already open (in this or another process) is
  // IOError naming it "in use". InvalidArgument for bad options, IOError/Corruption naming the
  // file otherwise.
  static Result<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Stores pages durably and publishes them together (see above). All or nothing: a budget
  // that does not fit (ResourceExhausted naming the disk, staging or metadata budget), ENOSPC
  // (NoSpace) or an I/O error leaves every key at its previous page. Keys must be distinct.
  // Exception: when the journal's sync fails after its write, the record may still have reached
  // the disk, so after reopening a key may read as the new page; the store refuses writes from
  // then on.
  Status Put(std::span<const PagePut> pages);
  Status Put(const PagePut& page) { return Put(std::span<const PagePut>(&page, 1)); }
  // Unpublishes pages (NotFound for a key not stored: nothing changes).
  Status Erase(std::span<const PageKey> keys);

  bool Contains(const PageKey& key) const;
  Result<StoredPageInfo> Info(const PageKey& key) const;  // NotFound
  std::vector<PageKey> Keys() const;
  // Reads and verifies one page; dst.size() must equal its payload bytes.
  Status Read(const PageKey& key, std::span<std::byte> dst);
  // NotFound when a key is not stored (nothing is issued then).
  Result<std::unique_ptr<PageReadBatch>> ReadBatch(std::span<const PageKey> keys);

  // Named records: small blobs (a saved sequence's manifest) published durably in the journal,
  // counted in the metadata budget. Put replaces; Erase of a missing name is NotFound.
  Status PutRecord(std::string_view name, std::span<const std::byte> value);
  Result<std::vector<std::byte>> GetRecord(std::string_view name) const;
  Status EraseRecord(std::string_view name);
  std::vector<std::string> RecordNames() const;

  // Reads and verifies every page; lost pages are reported (and counted), never removed. The
  // report also lists the pages that failed verification at Open (no longer in the index).
  Result<StoreCheckReport> Check();
  // Rewrites the journal with one record per live page and named record (tmp, fsync, rename,
  // fsync of the directory), so it stops growing with replaced and erased pages.
  Status Compact();

  DiskTierStats stats() const;
  const DiskTierOptions& options() const;
  // The bytes a page of payload_bytes takes on disk and in staging while it is read.
  size_t SlotBytes(size_t payload_bytes) const;

 private:
  struct Impl;
  explicit DiskTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace argus
