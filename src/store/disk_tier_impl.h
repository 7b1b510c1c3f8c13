// Internal to the store: the disk tier's state (DiskTier::Impl) and the types its files share.
// The format and the recovery rules are in docs/page_format.md. The tier's work is cut by job:
//   disk_tier.cc        the public API: open, put, erase, read, records, check, stats
//   disk_budgets.cc     the index and its budgets: pages, records, slots, pins, staging, metadata
//   disk_journal.cc     the journal: durable appends, replay at open, compaction
//   disk_recovery.cc    opening a store: the lock, the journal, the slot files, the I/O engine
//   disk_verify.cc      checking a slot read from disk against the index
//   disk_read_batch.cc  pinned asynchronous reads into the bounded staging area
//
// Locking: write_mu serialises the mutators (Put, Erase, PutRecord, EraseRecord, Compact): they
// own the journal and the choice of slots. mu guards every piece of metadata (index, free lists,
// pins, budgets, counters) and is never held across I/O. A read batch's own mutex is taken
// before mu, never after.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "argus/store.h"
#include "store/disk_format.h"
#include "store/io_engine.h"

namespace argus {

namespace disk {

// Metadata budget charges, documented in docs/page_format.md: an index entry per page (plus its
// tag), a free-list entry per slot of the slot files (free or not: the list's worst case), an
// entry per named record (plus its name and value).
inline constexpr size_t kIndexBytesPerPage = 128;
inline constexpr size_t kIndexBytesPerSlot = 48;
inline constexpr size_t kIndexBytesPerRecord = 64;

inline constexpr char kLockName[] = "LOCK";
inline constexpr char kJournalName[] = "journal";
inline constexpr char kJournalTmpName[] = "journal.tmp";

std::string SlotFileName(uint64_t slot_bytes);
// The slot size a file name "slots-<n>.dat" declares; 0 for any other name.
uint64_t ParseSlotFileName(const std::string& name);

inline uint64_t RoundUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// A buffer aligned for O_DIRECT transfers.
struct FreeAligned {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte, FreeAligned>;

Result<AlignedBytes> AllocateAligned(size_t n_bytes, size_t alignment, std::string_view what);

struct SizeClass {
  uint64_t slot_bytes = 0;
  std::string path;
  std::unique_ptr<File> file;
  uint32_t n_slots = 0;     // slots the file holds or has held (live, pinned, free)
  std::set<uint32_t> free;  // handed out lowest first, so files stay dense
};

struct PageEntry {
  std::string tag;
  uint64_t generation = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  SizeClass* cls = nullptr;
  uint32_t slot = 0;
};

// Everything a read needs, copied from the index when the slot is pinned.
struct ReadTarget {
  PageKey key;
  uint64_t generation = 0, payload_bytes = 0, payload_checksum = 0, slot_bytes = 0;
  uint32_t slot = 0;
  File* file = nullptr;
  uint64_t offset() const { return uint64_t{slot} * slot_bytes; }
};

using SlotRef = std::pair<uint64_t, uint32_t>;  // slot bytes, index

struct Pin {
  uint32_t count = 0;
  bool free_on_unpin = false;  // replaced or erased while pinned
};

}  // namespace disk

struct DiskTier::Impl {
  class Batch;
  using PageEntry = disk::PageEntry;
  using Pin = disk::Pin;
  using ReadTarget = disk::ReadTarget;
  using SizeClass = disk::SizeClass;
  using SlotRef = disk::SlotRef;

  DiskTierOptions options;
  Env* env = nullptr;
  // DIR/LOCK, held for the store's life. Declared first so it is released last, after every
  // other file of the directory is closed.
  std::unique_ptr<File> dir_lock;
  std::string journal_path;
  uint32_t alignment = 0;
  bool direct_io = false;
  std::unique_ptr<IoEngine> engine;

  std::mutex write_mu;
  mutable std::mutex mu;
  std::condition_variable staging_cv;  // staging was returned (staging_epoch moved)
  uint64_t staging_epoch = 0;

  std::unique_ptr<File> journal;
  uint64_t journal_bytes = 0;
  size_t n_journal_records = 0, journal_dropped_bytes = 0;
  std::map<uint64_t, std::unique_ptr<SizeClass>> classes;  // by slot bytes; never removed
  std::unordered_map<PageKey, PageEntry, PageKeyHash> pages;
  std::map<std::string, std::vector<std::byte>, std::less<>> records;
  std::map<SlotRef, Pin> pins;
  std::vector<std::pair<PageKey, std::string>> lost_at_open;  // kept out of the index
  std::unordered_set<PageKey, PageKeyHash> lost_keys;
  uint64_t next_generation = 1;
  size_t used_bytes = 0, staging_used = 0, staging_peak = 0, metadata_bytes = 0;
  uint64_t n_reads = 0, read_bytes = 0, n_writes = 0, write_bytes = 0, n_corrupt_reads = 0;
  Status failure;  // the first failed Sync: no further writes

  std::string Path(std::string_view name) const { return options.dir + "/" + std::string(name); }

  // ---- Metadata (REQUIRES: mu held; disk_budgets.cc) ------------------------------------------

  Status CheckFailedLocked() const;
  void MarkFailed(const Status& status);  // takes mu
  Status CheckMetadataLocked(size_t add_bytes, std::string_view what) const;
  // Takes staging bytes when they fit now with keep_free_bytes still free after them;
  // otherwise returns the epoch to wait on.
  bool TryReserveStagingLocked(size_t n_bytes, uint64_t* epoch, size_t keep_free_bytes = 0);
  Status StagingExhausted(size_t n_bytes, std::string_view what, size_t held_bytes) const;
  // What read-ahead leaves free in the staging budget: the largest slot of the store, so a Put
  // or Read of any one page, or an on-demand Get, never finds staging taken by read-ahead alone.
  // (A store whose largest slot is the whole budget reads on demand only.)
  size_t ReadAheadReserveLocked() const;
  void ReleaseStaging(size_t n_bytes);     // takes mu
  void WaitStagingChange(uint64_t epoch);  // takes mu
  void FreeSlotLocked(SizeClass* cls, uint32_t slot);
  void PinLocked(const ReadTarget& t);
  void UnpinLocked(const ReadTarget& t);
  Result<ReadTarget> TargetLocked(const PageKey& key) const;
  // Storing or erasing a key ends its loss: n_lost_pages counts keys whose published page is
  // unreadable now.
  void SetPageLocked(const PageKey& key, PageEntry entry);
  void ErasePageLocked(const PageKey& key);
  void SetRecordLocked(std::string_view name, std::vector<std::byte> value);
  void EraseRecordLocked(std::string_view name);

  // ---- Journal (disk_journal.cc) --------------------------------------------------------------

  // Appends framed records and makes them durable. A failed write is cut off again so the
  // journal never holds garbage before a later record; a failed sync fails the store.
  Status AppendJournal(std::span<const std::byte> bytes, size_t n_records);
  Status AppendRecord(const disk::JournalRecord& record);
  Status ReplayJournal();
  Status CheckTornTail(uint64_t bad, uint64_t size);
  Status Apply(const disk::JournalRecord& record);

  // ---- Recovery (disk_recovery.cc) ------------------------------------------------------------

  Status Recover();
  // Opens slots-<slot_bytes>.dat (creating it, durably), with O_DIRECT when asked and possible.
  Status OpenSlotFile(SizeClass& cls);
  Status VerifyAll();

  // ---- Verification (disk_verify.cc) ----------------------------------------------------------

  // Checks a slot read from disk against the index entry; counts the read, or the corruption.
  Status Verify(const ReadTarget& t, std::span<const std::byte> slot);
  Status VerifyBytes(const ReadTarget& t, std::span<const std::byte> slot) const;

  // ---- Read batches (disk_read_batch.cc) ------------------------------------------------------

  // Pins the pages of `keys` (every page when null) and starts reading them ahead.
  Result<std::unique_ptr<Batch>> NewBatch(const std::span<const PageKey>* keys);
};

class DiskTier::Impl::Batch final : public PageReadBatch {
 public:
  Batch(Impl* store, std::vector<ReadTarget> targets);
  ~Batch() override;

  size_t size() const override { return n_; }
  const ReadTarget& target(size_t i) const { return items_[i].target; }

  Result<std::span<const std::byte>> Get(size_t i) override;
  void Release(size_t i) override;

 private:
  enum class State : uint8_t {
    kIdle,      // not issued (or its read-ahead was dropped to make room)
    kInFlight,  // submitted; nobody waits for it yet
    kWaiting,   // a Get waits for it and verifies it
    kReady,     // verified (result ok) or failed (result holds the error)
    kReleased,
  };
  struct Item {
    ReadTarget target;
    State state = State::kIdle;
    disk::AlignedBytes buffer;
    IoRequest request;
    Status result;
  };

  // Submits page i when its staging fits now (true; an allocation failure makes it kReady with
  // the error). Read-ahead also leaves the store's read-ahead reserve free. REQUIRES: mu_ held,
  // page i idle.
  bool IssueLocked(size_t i, uint64_t* epoch, bool read_ahead);
  // Issues pages in list order while their staging fits. The engine keeps at most queue_depth
  // of them on the device and submits the next as each completes: a batch that waited for its
  // consumer to come back before issuing more would leave the disk idle while the consumer
  // works on other pages (measured: decode with half the pages on disk ran at the sum of the
  // disk and compute times instead of the larger one).
  void PumpLocked();
  // Returns page bytes to the staging budget. REQUIRES: no read in flight into them.
  void DropLocked(Item& it);

  Impl* store_;
  size_t n_;
  std::unique_ptr<Item[]> items_;
  std::mutex mu_;
  std::condition_variable cv_;  // a page left kWaiting
  size_t next_ = 0;             // read-ahead: first page not considered yet
  size_t held_bytes_ = 0;       // staging held by this batch
};

}  // namespace argus
