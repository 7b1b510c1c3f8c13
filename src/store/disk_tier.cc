// The disk tier: slot files per size class, an append-only journal, pinned asynchronous reads
// into a bounded staging area. The format and the recovery rules are in docs/page_format.md.
//
// Locking: write_mu serialises the mutators (Put, Erase, PutRecord, EraseRecord, Compact): they
// own the journal and the choice of slots. mu guards every piece of metadata (index, free lists,
// pins, budgets, counters) and is never held across I/O. A read batch's own mutex is taken
// before mu, never after.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "argus/store.h"
#include "core/checksum.h"
#include "store/disk_format.h"
#include "store/io_engine.h"

namespace argus {

std::string PageKey::ToString() const {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return text;
}

namespace {

using disk::kSlotHeaderBytes;

// Metadata budget charges, documented in docs/page_format.md: an index entry per page (plus its
// tag), a free-list entry per slot of the slot files (free or not: the list's worst case), an
// entry per named record (plus its name and value).
constexpr size_t kIndexBytesPerPage = 128;
constexpr size_t kIndexBytesPerSlot = 48;
constexpr size_t kIndexBytesPerRecord = 64;

constexpr char kLockName[] = "LOCK";
constexpr char kJournalName[] = "journal";
constexpr char kJournalTmpName[] = "journal.tmp";

std::string SlotFileName(uint64_t slot_bytes) {
  return "slots-" + std::to_string(slot_bytes) + ".dat";
}

// The slot size a file name "slots-<n>.dat" declares; 0 for any other name.
uint64_t ParseSlotFileName(const std::string& name) {
  constexpr std::string_view kPrefix = "slots-", kSuffix = ".dat";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return 0;
  }
  uint64_t n = 0;
  for (size_t i = kPrefix.size(); i < name.size() - kSuffix.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || n > (UINT64_MAX - 9) / 10) return 0;
    n = n * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  return n;
}

uint64_t RoundUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// A buffer aligned for O_DIRECT transfers.
struct FreeAligned {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte, FreeAligned>;

Result<AlignedBytes> AllocateAligned(size_t n_bytes, size_t alignment, std::string_view what) {
  void* p = std::aligned_alloc(alignment, RoundUp(n_bytes, alignment));
  if (p == nullptr) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(n_bytes) +
                                     " bytes of staging for " + std::string(what));
  }
  return AlignedBytes(static_cast<std::byte*>(p));
}

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

}  // namespace

struct DiskTier::Impl {
  class Batch;

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

  // ---- Metadata (REQUIRES: mu held) ----------------------------------------------------------

  Status CheckFailedLocked() const {
    if (options.read_only)
      return Status::InvalidArgument("disk store " + options.dir + " is open read-only");
    if (failure.ok()) return Status::Ok();
    return Status::IOError("disk store " + options.dir +
                           " refuses writes after a failed sync: " + failure.message());
  }

  void MarkFailed(const Status& status) {
    std::lock_guard lock(mu);
    if (failure.ok()) failure = status;
  }

  Status CheckMetadataLocked(size_t add_bytes, std::string_view what) const {
    if (add_bytes <=
        options.metadata_budget_bytes - std::min(metadata_bytes, options.metadata_budget_bytes)) {
      return Status::Ok();
    }
    return Status::ResourceExhausted(
        "metadata budget of " + std::to_string(options.metadata_budget_bytes) +
        " bytes: " + std::string(what) + " needs " + std::to_string(add_bytes) + " more bytes, " +
        std::to_string(metadata_bytes) + " in use");
  }

  // Takes staging bytes when they fit now with keep_free_bytes still free after them;
  // otherwise returns the epoch to wait on.
  bool TryReserveStagingLocked(size_t n_bytes, uint64_t* epoch, size_t keep_free_bytes = 0) {
    const size_t free_bytes =
        options.staging_budget_bytes - std::min(staging_used, options.staging_budget_bytes);
    if (n_bytes > free_bytes || keep_free_bytes > free_bytes - n_bytes) {
      if (epoch != nullptr) *epoch = staging_epoch;
      return false;
    }
    staging_used += n_bytes;
    staging_peak = std::max(staging_peak, staging_used);
    return true;
  }

  Status StagingExhausted(size_t n_bytes, std::string_view what, size_t held_bytes) const {
    return Status::ResourceExhausted(
        "staging budget of " + std::to_string(options.staging_budget_bytes) +
        " bytes: " + std::string(what) + " needs " + std::to_string(n_bytes) + " bytes, " +
        std::to_string(staging_used) + " in use" +
        (held_bytes > 0 ? " (" + std::to_string(held_bytes) + " by this batch's unreleased pages)"
                        : std::string()));
  }

  // What read-ahead leaves free in the staging budget: the largest slot of the store, so a Put
  // or Read of any one page, or an on-demand Get, never finds staging taken by read-ahead alone.
  // (A store whose largest slot is the whole budget reads on demand only.)
  size_t ReadAheadReserveLocked() const {
    return classes.empty() ? 0 : static_cast<size_t>(classes.rbegin()->first);
  }

  void ReleaseStaging(size_t n_bytes) {
    {
      std::lock_guard lock(mu);
      staging_used -= n_bytes;
      ++staging_epoch;
    }
    staging_cv.notify_all();
  }

  void WaitStagingChange(uint64_t epoch) {
    std::unique_lock lock(mu);
    staging_cv.wait(lock, [&] { return staging_epoch != epoch; });
  }

  void FreeSlotLocked(SizeClass* cls, uint32_t slot) {
    auto pin = pins.find({cls->slot_bytes, slot});
    if (pin != pins.end()) {
      pin->second.free_on_unpin = true;
      return;
    }
    cls->free.insert(slot);
    used_bytes -= cls->slot_bytes;
  }

  void PinLocked(const ReadTarget& t) { ++pins[{t.slot_bytes, t.slot}].count; }

  void UnpinLocked(const ReadTarget& t) {
    auto pin = pins.find({t.slot_bytes, t.slot});
    if (--pin->second.count > 0) return;
    const bool free_now = pin->second.free_on_unpin;
    pins.erase(pin);
    if (free_now) FreeSlotLocked(classes.at(t.slot_bytes).get(), t.slot);
  }

  Result<ReadTarget> TargetLocked(const PageKey& key) const {
    auto it = pages.find(key);
    if (it == pages.end()) {
      return Status::NotFound("page " + key.ToString() + " is not stored in " + options.dir);
    }
    const PageEntry& e = it->second;
    return ReadTarget{
        key,    e.generation,     e.payload_bytes, e.payload_checksum, e.cls->slot_bytes,
        e.slot, e.cls->file.get()};
  }

  // Storing or erasing a key ends its loss: n_lost_pages counts keys whose published page is
  // unreadable now.
  void SetPageLocked(const PageKey& key, PageEntry entry) {
    lost_keys.erase(key);
    auto it = pages.find(key);
    if (it != pages.end()) {
      metadata_bytes -= kIndexBytesPerPage + it->second.tag.size();
      FreeSlotLocked(it->second.cls, it->second.slot);
      pages.erase(it);
    }
    metadata_bytes += kIndexBytesPerPage + entry.tag.size();
    pages.emplace(key, std::move(entry));
  }

  void ErasePageLocked(const PageKey& key) {
    lost_keys.erase(key);
    auto it = pages.find(key);
    metadata_bytes -= kIndexBytesPerPage + it->second.tag.size();
    FreeSlotLocked(it->second.cls, it->second.slot);
    pages.erase(it);
  }

  void SetRecordLocked(std::string_view name, std::vector<std::byte> value) {
    EraseRecordLocked(name);
    metadata_bytes += kIndexBytesPerRecord + name.size() + value.size();
    records.emplace(std::string(name), std::move(value));
  }

  void EraseRecordLocked(std::string_view name) {
    auto it = records.find(name);
    if (it == records.end()) return;
    metadata_bytes -= kIndexBytesPerRecord + it->first.size() + it->second.size();
    records.erase(it);
  }

  // ---- Files ----------------------------------------------------------------------------------

  // Opens slots-<slot_bytes>.dat (creating it, durably), with O_DIRECT when asked and possible.
  Status OpenSlotFile(SizeClass& cls) {
    cls.path = Path(SlotFileName(cls.slot_bytes));
    ARGUS_ASSIGN_OR_RETURN(const bool existed, env->Exists(cls.path));
    FileOpenOptions open{.create = !options.read_only,
                         .read_only = options.read_only,
                         .direct = direct_io,
                         .private_file = true};
    auto file = env->Open(cls.path, open);
    if (!file.ok() && direct_io && file.status().code() == StatusCode::kUnsupported) {
      {
        std::lock_guard lock(mu);
        direct_io = false;  // reported by stats(); classes opened later use buffered I/O too
      }
      open.direct = false;
      file = env->Open(cls.path, open);
    }
    if (!file.ok()) return file.status();
    cls.file = std::move(file).value();
    if (!existed) {
      // Like a failed fdatasync: the new file's entry may be lost at a crash, and with it the
      // pages a later Put would publish in it. Not retried.
      Status synced = env->SyncDir(options.dir);
      if (!synced.ok()) {
        MarkFailed(synced);
        return synced;
      }
    }
    ARGUS_ASSIGN_OR_RETURN(const uint64_t size, cls.file->Size());
    const uint64_t n_slots = (size + cls.slot_bytes - 1) / cls.slot_bytes;
    if (n_slots > UINT32_MAX) {
      return Status::Corruption(cls.path + ": " + std::to_string(size) +
                                " bytes hold more slots than a 32-bit index");
    }
    cls.n_slots = static_cast<uint32_t>(n_slots);
    return Status::Ok();
  }

  // Appends framed records and makes them durable. A failed write is cut off again so the
  // journal never holds garbage before a later record; a failed sync fails the store.
  Status AppendJournal(std::span<const std::byte> bytes, size_t n_records) {
    Status written = WriteExact(*journal, journal_bytes, bytes, "a journal record");
    if (!written.ok()) {
      Status cut = journal->Truncate(journal_bytes);
      if (!cut.ok()) MarkFailed(cut);
      return written;
    }
    Status synced = journal->Sync();
    if (!synced.ok()) {
      MarkFailed(synced);
      return synced;
    }
    std::lock_guard lock(mu);
    journal_bytes += bytes.size();
    n_journal_records += n_records;
    return Status::Ok();
  }

  Status AppendRecord(const disk::JournalRecord& record) {
    std::vector<std::byte> bytes;
    ARGUS_RETURN_IF_ERROR(disk::AppendRecord(record, bytes));
    return AppendJournal(bytes, 1);
  }

  // ---- Verification ---------------------------------------------------------------------------

  // Checks a slot read from disk against the index entry; counts the read, or the corruption.
  Status Verify(const ReadTarget& t, std::span<const std::byte> slot) {
    Status s = VerifyBytes(t, slot);
    std::lock_guard lock(mu);
    if (s.ok()) {
      ++n_reads;
      read_bytes += t.slot_bytes;
    } else {
      ++n_corrupt_reads;
      lost_keys.insert(t.key);
    }
    return s;
  }

  Status VerifyBytes(const ReadTarget& t, std::span<const std::byte> slot) const {
    const std::string where = "page " + t.key.ToString() + " in " + t.file->path() + " slot " +
                              std::to_string(t.slot) + ": ";
    auto header = disk::DecodeSlotHeader(slot);
    if (!header.ok()) return Status::Corruption(where + header.status().message());
    if (!(header->key == t.key) || header->generation != t.generation) {
      return Status::Corruption(where + "holds page " + header->key.ToString() + " generation " +
                                std::to_string(header->generation) + ", expected generation " +
                                std::to_string(t.generation));
    }
    if (header->payload_bytes != t.payload_bytes ||
        header->payload_checksum != t.payload_checksum) {
      return Status::Corruption(where + "header describes " +
                                std::to_string(header->payload_bytes) +
                                " payload bytes, the journal " + std::to_string(t.payload_bytes));
    }
    if (Checksum64(slot.subspan(kSlotHeaderBytes, t.payload_bytes)) != t.payload_checksum) {
      return Status::Corruption(where + "payload checksum mismatch");
    }
    return Status::Ok();
  }

  // ---- Recovery -------------------------------------------------------------------------------

  Status Recover();
  Status ReplayJournal();
  Status CheckTornTail(uint64_t bad, uint64_t size);
  Status Apply(const disk::JournalRecord& record);
  Status VerifyAll();

  Result<std::unique_ptr<Batch>> NewBatch(const std::span<const PageKey>* keys);
};

// ---- Read batches ----------------------------------------------------------------------------

class DiskTier::Impl::Batch final : public PageReadBatch {
 public:
  Batch(Impl* store, std::vector<ReadTarget> targets)
      : store_(store), n_(targets.size()), items_(new Item[targets.size()]) {
    for (size_t i = 0; i < n_; ++i) items_[i].target = targets[i];
    std::lock_guard lock(mu_);
    PumpLocked();
  }

  ~Batch() override {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < n_; ++i) {
      Item& it = items_[i];
      if (it.state == State::kInFlight) (void)store_->engine->Wait(&it.request);
      DropLocked(it);
    }
    std::lock_guard store_lock(store_->mu);
    for (size_t i = 0; i < n_; ++i) store_->UnpinLocked(items_[i].target);
  }

  size_t size() const override { return n_; }
  const ReadTarget& target(size_t i) const { return items_[i].target; }

  Result<std::span<const std::byte>> Get(size_t i) override {
    if (i >= n_) {
      return Status::InvalidArgument("page " + std::to_string(i) + " of a read batch of " +
                                     std::to_string(n_));
    }
    std::unique_lock lock(mu_);
    Item& it = items_[i];
    for (;;) {
      switch (it.state) {
        case State::kReleased:
          return Status::InvalidArgument("page " + it.target.key.ToString() + " (" +
                                         std::to_string(i) + " of the batch) was released");
        case State::kReady:
          if (!it.result.ok()) return it.result;
          return std::span<const std::byte>(it.buffer.get() + kSlotHeaderBytes,
                                            it.target.payload_bytes);
        case State::kWaiting:
          cv_.wait(lock);
          break;
        case State::kInFlight: {
          it.state = State::kWaiting;
          lock.unlock();
          Status s = store_->engine->Wait(&it.request);
          if (s.ok()) s = store_->Verify(it.target, {it.buffer.get(), it.target.slot_bytes});
          lock.lock();
          it.result = std::move(s);
          it.state = State::kReady;
          if (!it.result.ok()) DropLocked(it);
          cv_.notify_all();
          PumpLocked();
          break;
        }
        case State::kIdle: {
          uint64_t epoch = 0;
          if (IssueLocked(i, &epoch, false)) break;
          // Read-ahead nobody has asked for (kInFlight: a Get turns its page kWaiting) gives
          // way to the page asked for, the last in list order first. Pages before i go last:
          // with consumers on several threads they are the read-ahead of other consumers,
          // who issue them again on demand if they were dropped.
          for (size_t k = n_; k-- > 0;) {
            if (k == i || items_[k].state != State::kInFlight) continue;
            (void)store_->engine->Wait(&items_[k].request);
            DropLocked(items_[k]);
            items_[k].state = State::kIdle;
            next_ = std::min(next_, k);
            if (IssueLocked(i, &epoch, false)) break;
          }
          if (it.state != State::kIdle) break;
          if (it.target.slot_bytes > store_->options.staging_budget_bytes - held_bytes_) {
            std::lock_guard store_lock(store_->mu);
            return store_->StagingExhausted(it.target.slot_bytes,
                                            "page " + it.target.key.ToString(), held_bytes_);
          }
          lock.unlock();  // other batches hold the staging: wait for them to release some
          store_->WaitStagingChange(epoch);
          lock.lock();
          break;
        }
      }
    }
  }

  void Release(size_t i) override {
    if (i >= n_) return;
    std::unique_lock lock(mu_);
    Item& it = items_[i];
    cv_.wait(lock, [&] { return it.state != State::kWaiting; });
    if (it.state == State::kInFlight) (void)store_->engine->Wait(&it.request);
    DropLocked(it);
    it.state = State::kReleased;
    PumpLocked();
  }

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
    AlignedBytes buffer;
    IoRequest request;
    Status result;
  };

  // Submits page i when its staging fits now (true; an allocation failure makes it kReady with
  // the error). Read-ahead also leaves the store's read-ahead reserve free. REQUIRES: mu_ held,
  // page i idle.
  bool IssueLocked(size_t i, uint64_t* epoch, bool read_ahead) {
    Item& it = items_[i];
    {
      std::lock_guard store_lock(store_->mu);
      const size_t keep_free = read_ahead ? store_->ReadAheadReserveLocked() : 0;
      if (!store_->TryReserveStagingLocked(it.target.slot_bytes, epoch, keep_free)) return false;
    }
    auto buffer = AllocateAligned(it.target.slot_bytes, store_->alignment,
                                  "page " + it.target.key.ToString());
    if (!buffer.ok()) {
      store_->ReleaseStaging(it.target.slot_bytes);
      it.result = buffer.status();
      it.state = State::kReady;
      return true;
    }
    it.buffer = std::move(buffer).value();
    held_bytes_ += it.target.slot_bytes;
    it.request.file = it.target.file;
    it.request.offset = it.target.offset();
    it.request.dst = {it.buffer.get(), it.target.slot_bytes};
    it.request.status = Status::Ok();
    it.request.done.store(false, std::memory_order_relaxed);
    it.state = State::kInFlight;
    store_->engine->Submit(&it.request);
    return true;
  }

  // Issues pages in list order while their staging fits. The engine keeps at most queue_depth
  // of them on the device and submits the next as each completes: a batch that waited for its
  // consumer to come back before issuing more would leave the disk idle while the consumer
  // works on other pages (measured: decode with half the pages on disk ran at the sum of the
  // disk and compute times instead of the larger one).
  void PumpLocked() {
    while (next_ < n_) {
      if (items_[next_].state == State::kIdle && !IssueLocked(next_, nullptr, true)) return;
      ++next_;
    }
  }

  // Returns page bytes to the staging budget. REQUIRES: no read in flight into them.
  void DropLocked(Item& it) {
    if (!it.buffer) return;
    it.buffer.reset();
    held_bytes_ -= it.target.slot_bytes;
    store_->ReleaseStaging(it.target.slot_bytes);
  }

  Impl* store_;
  size_t n_;
  std::unique_ptr<Item[]> items_;
  std::mutex mu_;
  std::condition_variable cv_;  // a page left kWaiting
  size_t next_ = 0;             // read-ahead: first page not considered yet
  size_t held_bytes_ = 0;       // staging held by this batch
};

Result<std::unique_ptr<DiskTier::Impl::Batch>> DiskTier::Impl::NewBatch(
    const std::span<const PageKey>* keys) {
  std::vector<ReadTarget> targets;
  {
    std::lock_guard lock(mu);
    if (keys == nullptr) {
      targets.reserve(pages.size());
      for (const auto& [key, entry] : pages) targets.push_back(TargetLocked(key).value());
    } else {
      targets.reserve(keys->size());
      for (const PageKey& key : *keys) {
        ARGUS_ASSIGN_OR_RETURN(ReadTarget t, TargetLocked(key));
        targets.push_back(t);
      }
    }
    for (const ReadTarget& t : targets) PinLocked(t);
  }
  return std::make_unique<Batch>(this, std::move(targets));
}

// ---- Recovery --------------------------------------------------------------------------------

Status DiskTier::Impl::Apply(const disk::JournalRecord& r) {
  switch (r.kind) {
    case disk::RecordKind::kPublish:
      for (const disk::PublishedPage& p : r.pages) {
        auto& cls = classes[p.slot_bytes];
        if (!cls) {
          cls = std::make_unique<SizeClass>();
          cls->slot_bytes = p.slot_bytes;
        }
        pages.erase(p.key);
        pages.emplace(p.key, PageEntry{p.tag, p.generation, p.payload_bytes, p.payload_checksum,
                                       cls.get(), p.slot_index});
        next_generation = std::max(next_generation, p.generation + 1);
      }
      return Status::Ok();
    case disk::RecordKind::kErase:
      for (const PageKey& key : r.keys) {
        if (pages.erase(key) == 0) {
          return Status::Corruption("erases page " + key.ToString() + ", which is not stored");
        }
      }
      return Status::Ok();
    case disk::RecordKind::kPutRecord:
      records[r.name] = r.value;
      return Status::Ok();
    case disk::RecordKind::kEraseRecord:
      if (records.erase(r.name) == 0) {
        return Status::Corruption("erases record '" + r.name + "', which is not stored");
      }
      return Status::Ok();
    case disk::RecordKind::kNextGeneration:
      next_generation = std::max(next_generation, r.next_generation);
      return Status::Ok();
  }
  return Status::Internal("unhandled record kind");
}

// A bad record is a torn tail only when no valid record follows it: a record is appended only
// after the one before it was synced, so a valid record after a bad one means the journal was
// damaged in place, and cutting it there would drop published pages. Then nothing is cut.
Status DiskTier::Impl::CheckTornTail(uint64_t bad, uint64_t size) {
  std::vector<std::byte> tail(size - bad);
  ARGUS_RETURN_IF_ERROR(ReadExact(*journal, bad, tail, "the journal's tail"));
  for (size_t at = 1; at + disk::kRecordHeaderBytes <= tail.size(); ++at) {
    const std::span<const std::byte> rest = std::span<const std::byte>(tail).subspan(at);
    const disk::RecordHeader header = disk::DecodeRecordHeader(rest);
    if (header.body_bytes > rest.size() - disk::kRecordHeaderBytes) continue;
    if (!disk::RecordChecksumMatches(rest.first(disk::kRecordHeaderBytes + header.body_bytes)))
      continue;
    return Status::Corruption(journal_path + ": the record at byte " + std::to_string(bad) +
                              " is damaged, but a valid record follows at byte " +
                              std::to_string(bad + at) +
                              ": not a torn tail; nothing was cut (pages published after the "
                              "damage would be lost)");
  }
  return Status::Ok();
}

// Replays records up to the first one that is cut short or fails its checksum, and cuts the
// journal there: appends are synced one by one, so only the last can be torn by a crash.
Status DiskTier::Impl::ReplayJournal() {
  ARGUS_ASSIGN_OR_RETURN(const uint64_t size, journal->Size());
  if (size < disk::kJournalHeaderBytes) {  // new, or its creation was cut short
    if (options.read_only) {
      return Status::Corruption(journal_path + ": " + std::to_string(size) +
                                " bytes, shorter than its header");
    }
    const std::vector<std::byte> header = disk::JournalFileHeader();
    ARGUS_RETURN_IF_ERROR(journal->Truncate(0));
    ARGUS_RETURN_IF_ERROR(WriteExact(*journal, 0, header, "the journal header"));
    ARGUS_RETURN_IF_ERROR(journal->Sync());
    ARGUS_RETURN_IF_ERROR(env->SyncDir(options.dir));
    journal_bytes = header.size();
    return Status::Ok();
  }
  std::vector<std::byte> bytes(disk::kJournalHeaderBytes);
  ARGUS_RETURN_IF_ERROR(ReadExact(*journal, 0, bytes, "the journal header"));
  Status header_ok = disk::CheckJournalFileHeader(bytes);
  if (!header_ok.ok()) return header_ok.WithContext(journal_path);

  uint64_t offset = disk::kJournalHeaderBytes;
  while (size - offset >= disk::kRecordHeaderBytes) {
    bytes.resize(disk::kRecordHeaderBytes);
    ARGUS_RETURN_IF_ERROR(ReadExact(*journal, offset, bytes, "a journal record header"));
    const disk::RecordHeader header = disk::DecodeRecordHeader(bytes);
    if (header.body_bytes > size - offset - disk::kRecordHeaderBytes) break;
    bytes.resize(disk::kRecordHeaderBytes + header.body_bytes);
    ARGUS_RETURN_IF_ERROR(ReadExact(*journal, offset + disk::kRecordHeaderBytes,
                                    std::span(bytes).subspan(disk::kRecordHeaderBytes),
                                    "a journal record body"));
    if (!disk::RecordChecksumMatches(bytes)) break;
    auto record = disk::DecodeRecordBody(
        header.kind, std::span<const std::byte>(bytes).subspan(disk::kRecordHeaderBytes));
    Status applied = record.ok() ? Apply(*record) : record.status();
    if (!applied.ok()) {
      return applied.WithContext(journal_path + ": record at byte " + std::to_string(offset));
    }
    offset += bytes.size();
    ++n_journal_records;
  }
  journal_bytes = offset;
  if (offset < size) {
    ARGUS_RETURN_IF_ERROR(CheckTornTail(offset, size));
    journal_dropped_bytes = size - offset;
    if (options.read_only) return Status::Ok();
    ARGUS_RETURN_IF_ERROR(journal->Truncate(offset));
    ARGUS_RETURN_IF_ERROR(journal->Sync());
  }
  return Status::Ok();
}

Status DiskTier::Impl::Recover() {
  journal_path = Path(kJournalName);
  bool lock = true;
  if (options.read_only) {
    ARGUS_ASSIGN_OR_RETURN(const bool is_store, env->Exists(journal_path));
    if (!is_store) return Status::NotFound(options.dir + " is not a disk store (no journal)");
    // A LOCK is taken (so no writer changes the store under the reader) but never created.
    ARGUS_ASSIGN_OR_RETURN(lock, env->Exists(Path(kLockName)));
  } else {
    ARGUS_RETURN_IF_ERROR(env->CreateDir(options.dir));
  }
  // Two stores on one directory would hand out the same slots and cut each other's journal.
  auto locked = lock ? env->LockFile(Path(kLockName))
                     : Result<std::unique_ptr<File>>(std::unique_ptr<File>());
  if (!locked.ok()) {
    // Only a lock held elsewhere means "in use"; a LOCK that cannot be created (a read-only
    // directory) is reported as what it is.
    if (locked.status().message() != Path(kLockName) + " is locked by another process")
      return locked.status().WithContext("disk store " + options.dir);
    return Status::IOError("disk store " + options.dir +
                           " is in use by another DiskTier: " + locked.status().message());
  }
  dir_lock = std::move(locked).value();
  ARGUS_ASSIGN_OR_RETURN(journal, env->Open(journal_path, {.create = !options.read_only,
                                                           .read_only = options.read_only,
                                                           .private_file = true}));
  ARGUS_ASSIGN_OR_RETURN(const uint32_t device_alignment, env->DirectIoAlignment(journal_path));
  alignment = std::max<uint32_t>(device_alignment, disk::kMinAlignment);
  if ((alignment & (alignment - 1)) != 0 || alignment > (1u << 20)) {
    return Status::Unsupported(options.dir + ": direct I/O alignment of " +
                               std::to_string(alignment) + " bytes");
  }
  direct_io = options.direct_io;
  ARGUS_ASSIGN_OR_RETURN(const bool stale_tmp, env->Exists(Path(kJournalTmpName)));
  if (stale_tmp && !options.read_only)
    ARGUS_RETURN_IF_ERROR(env->Remove(Path(kJournalTmpName)));  // a cut compaction
  ARGUS_RETURN_IF_ERROR(ReplayJournal());

  // Open every slot file: the ones the journal references and the ones on disk (all free).
  ARGUS_ASSIGN_OR_RETURN(const std::vector<std::string> names, env->ListDir(options.dir));
  for (const std::string& name : names) {
    const uint64_t slot_bytes = ParseSlotFileName(name);
    if (slot_bytes >= kSlotHeaderBytes && slot_bytes % disk::kMinAlignment == 0) {
      classes.try_emplace(slot_bytes);
    }
  }
  for (auto& [slot_bytes, cls] : classes) {
    if (slot_bytes % alignment != 0 && direct_io) {
      return Status::Unsupported(Path(SlotFileName(slot_bytes)) + ": slots of " +
                                 std::to_string(slot_bytes) + " bytes do not meet the " +
                                 std::to_string(alignment) + "-byte direct I/O alignment");
    }
    if (!cls) {
      cls = std::make_unique<SizeClass>();
      cls->slot_bytes = slot_bytes;
    }
    ARGUS_RETURN_IF_ERROR(OpenSlotFile(*cls));
  }
  // Slots referenced by no live page are free.
  std::set<SlotRef> live;
  for (const auto& [key, entry] : pages) {
    SizeClass& cls = *entry.cls;
    if (!live.insert({cls.slot_bytes, entry.slot}).second) {
      return Status::Corruption(journal_path + ": two live pages share " + cls.path + " slot " +
                                std::to_string(entry.slot) + " (one is " + key.ToString() + ")");
    }
    cls.n_slots = std::max(cls.n_slots, entry.slot + 1);
    used_bytes += cls.slot_bytes;
    metadata_bytes += kIndexBytesPerPage + entry.tag.size();
  }
  for (auto& [slot_bytes, cls] : classes) {
    for (uint32_t i = 0; i < cls->n_slots; ++i) {
      if (!live.contains({slot_bytes, i})) cls->free.insert(i);
    }
    metadata_bytes += size_t{cls->n_slots} * kIndexBytesPerSlot;
  }
  for (const auto& [name, value] : records) {
    metadata_bytes += kIndexBytesPerRecord + name.size() + value.size();
  }

  switch (options.io) {
    case DiskIoBackend::kUring: {
      ARGUS_ASSIGN_OR_RETURN(engine, MakeUringIoEngine(options.queue_depth));
      break;
    }
    case DiskIoBackend::kAuto: {
      auto uring = MakeUringIoEngine(options.queue_depth);
      engine = uring.ok() ? std::move(uring).value() : MakeThreadIoEngine(options.n_io_threads);
      break;
    }
    case DiskIoBackend::kThreads:
      engine = MakeThreadIoEngine(options.n_io_threads);
      break;
  }
  return options.verify_on_open ? VerifyAll() : Status::Ok();
}

// Pages that fail verification at open are kept out of the index (so they are never offered)
// but keep their slots, so nothing overwrites the evidence; Check lists them.
Status DiskTier::Impl::VerifyAll() {
  ARGUS_ASSIGN_OR_RETURN(auto batch, NewBatch(nullptr));
  for (size_t i = 0; i < batch->size(); ++i) {
    auto page = batch->Get(i);
    batch->Release(i);
    if (page.ok()) continue;
    if (page.status().code() != StatusCode::kCorruption) return page.status();
    const PageKey& key = batch->target(i).key;
    std::lock_guard lock(mu);
    auto it = pages.find(key);
    metadata_bytes -= kIndexBytesPerPage + it->second.tag.size();
    pages.erase(it);
    lost_at_open.emplace_back(key, page.status().message());
  }
  return Status::Ok();
}

// ---- DiskTier --------------------------------------------------------------------------------

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.dir.empty()) return Status::InvalidArgument("disk tier: no directory given");
  if (options.disk_budget_bytes == 0) {
    return Status::InvalidArgument("disk tier " + options.dir + ": disk_budget_bytes is 0");
  }
  if (options.queue_depth == 0 || options.n_io_threads == 0) {
    return Status::InvalidArgument("disk tier " + options.dir +
                                   ": queue_depth and n_io_threads must be at least 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->env = options.env != nullptr ? options.env : Env::Default();
  impl->options.env = impl->env;
  ARGUS_RETURN_IF_ERROR(impl->Recover());
  return std::unique_ptr<DiskTier>(new DiskTier(std::move(impl)));
}

Status DiskTier::Put(std::span<const PagePut> pages) {
  Impl& s = *impl_;
  if (pages.empty()) return Status::Ok();
  std::unordered_set<PageKey, PageKeyHash> distinct;
  std::vector<uint64_t> slot_bytes(pages.size());
  uint64_t max_slot_bytes = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    const PagePut& p = pages[i];
    const std::string what = "page " + p.key.ToString();
    if (p.payload.empty() || p.payload.size() > kMaxPagePayloadBytes) {
      return Status::InvalidArgument(what + ": payload of " + std::to_string(p.payload.size()) +
                                     " bytes (1 .. " + std::to_string(kMaxPagePayloadBytes) + ")");
    }
    if (p.tag.size() > kMaxPageTagBytes) {
      return Status::InvalidArgument(what + ": tag of " + std::to_string(p.tag.size()) +
                                     " bytes exceeds " + std::to_string(kMaxPageTagBytes));
    }
    if (!distinct.insert(p.key).second) {
      return Status::InvalidArgument(what + " appears twice in one put");
    }
    slot_bytes[i] = RoundUp(kSlotHeaderBytes + p.payload.size(), s.alignment);
    max_slot_bytes = std::max(max_slot_bytes, slot_bytes[i]);
  }
  const std::string what = "put of " + std::to_string(pages.size()) + " pages";

  std::lock_guard write_lock(s.write_mu);
  // New size classes: their files are opened before taking any slot, outside mu.
  for (uint64_t n : slot_bytes) {
    {
      std::lock_guard lock(s.mu);
      ARGUS_RETURN_IF_ERROR(s.CheckFailedLocked());
      if (s.classes.contains(n)) continue;
    }
    auto cls = std::make_unique<SizeClass>();
    cls->slot_bytes = n;
    ARGUS_RETURN_IF_ERROR(s.OpenSlotFile(*cls));
    std::lock_guard lock(s.mu);
    const size_t class_meta = size_t{cls->n_slots} * kIndexBytesPerSlot;
    ARGUS_RETURN_IF_ERROR(
        s.CheckMetadataLocked(class_meta, what + " (the free list of " + cls->path + ")"));
    s.metadata_bytes += class_meta;
    s.classes.emplace(n, std::move(cls));
  }

  std::vector<SizeClass*> cls(pages.size());
  std::vector<uint32_t> slot(pages.size());
  uint64_t generation0 = 0;
  size_t need_bytes = 0;
  {
    std::lock_guard lock(s.mu);
    ARGUS_RETURN_IF_ERROR(s.CheckFailedLocked());
    // Replaced slots are freed only after the publication, so they do not count as room.
    for (uint64_t n : slot_bytes) need_bytes += n;
    if (need_bytes >
        s.options.disk_budget_bytes - std::min(s.used_bytes, s.options.disk_budget_bytes)) {
      return Status::ResourceExhausted("disk budget of " +
                                       std::to_string(s.options.disk_budget_bytes) +
                                       " bytes: " + what + " needs " + std::to_string(need_bytes) +
                                       " more bytes, " + std::to_string(s.used_bytes) + " in use");
    }
    size_t add_meta = 0;
    std::map<uint64_t, size_t> n_taken;
    for (size_t i = 0; i < pages.size(); ++i) {
      auto old = s.pages.find(pages[i].key);
      add_meta += pages[i].tag.size() + (old == s.pages.end() ? kIndexBytesPerPage : 0);
      if (++n_taken[slot_bytes[i]] > s.classes.at(slot_bytes[i])->free.size()) {
        add_meta += kIndexBytesPerSlot;  // the file grows by a slot
      }
    }
    size_t release_meta = 0;
    for (const PagePut& p : pages) {
      auto old = s.pages.find(p.key);
      if (old != s.pages.end()) release_meta += old->second.tag.size();
    }
    add_meta -= std::min(add_meta, release_meta);
    ARGUS_RETURN_IF_ERROR(s.CheckMetadataLocked(add_meta, what));
    if (!s.TryReserveStagingLocked(max_slot_bytes, nullptr)) {
      return s.StagingExhausted(max_slot_bytes, what + " (its write buffer)", 0);
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      SizeClass& c = *s.classes.at(slot_bytes[i]);
      cls[i] = &c;
      if (!c.free.empty()) {
        slot[i] = *c.free.begin();
        c.free.erase(c.free.begin());
      } else {
        slot[i] = c.n_slots++;
        s.metadata_bytes += kIndexBytesPerSlot;
      }
    }
    s.used_bytes += need_bytes;
    generation0 = s.next_generation;
    s.next_generation += pages.size();
  }
  // Any failure from here on returns the slots taken and the staging; the index is untouched.
  auto undo = [&](Status status) {
    {
      std::lock_guard lock(s.mu);
      for (size_t i = 0; i < pages.size(); ++i) cls[i]->free.insert(slot[i]);
      s.used_bytes -= need_bytes;
    }
    s.ReleaseStaging(max_slot_bytes);
    return status;
  };

  auto staging = AllocateAligned(max_slot_bytes, s.alignment, what);
  if (!staging.ok()) return undo(staging.status());
  disk::JournalRecord record;
  record.kind = disk::RecordKind::kPublish;
  record.pages.resize(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const PagePut& p = pages[i];
    disk::PublishedPage& pub = record.pages[i];
    pub = {p.key,
           std::string(p.tag),
           generation0 + i,
           Checksum64(p.payload),
           slot_bytes[i],
           slot[i],
           static_cast<uint32_t>(p.payload.size())};
    std::span<std::byte> buf(staging->get(), slot_bytes[i]);
    disk::EncodeSlotHeader(
        {pub.key, pub.generation, p.payload.size(), pub.payload_checksum, pub.tag}, buf);
    std::memcpy(buf.data() + kSlotHeaderBytes, p.payload.data(), p.payload.size());
    std::memset(buf.data() + kSlotHeaderBytes + p.payload.size(), 0,
                buf.size() - kSlotHeaderBytes - p.payload.size());
    Status written = WriteExact(*cls[i]->file, uint64_t{slot[i]} * slot_bytes[i], buf,
                                "page " + p.key.ToString());
    if (!written.ok()) return undo(written);
  }
  std::set<SizeClass*> touched(cls.begin(), cls.end());
  for (SizeClass* c : touched) {
    Status synced = c->file->Sync();
    if (!synced.ok()) {
      s.MarkFailed(synced);
      return undo(synced);
    }
  }
  Status published = s.AppendRecord(record);
  if (!published.ok()) return undo(published);

  {
    std::lock_guard lock(s.mu);
    for (size_t i = 0; i < pages.size(); ++i) {
      const disk::PublishedPage& pub = record.pages[i];
      s.SetPageLocked(pub.key, PageEntry{pub.tag, pub.generation, pub.payload_bytes,
                                         pub.payload_checksum, cls[i], slot[i]});
    }
    s.n_writes += pages.size();
    s.write_bytes += need_bytes;
  }
  s.ReleaseStaging(max_slot_bytes);
  return Status::Ok();
}

Status DiskTier::Erase(std::span<const PageKey> keys) {
  Impl& s = *impl_;
  if (keys.empty()) return Status::Ok();
  std::unordered_set<PageKey, PageKeyHash> distinct;
  for (const PageKey& key : keys) {
    if (!distinct.insert(key).second) {
      return Status::InvalidArgument("page " + key.ToString() + " appears twice in one erase");
    }
  }
  std::lock_guard write_lock(s.write_mu);
  {
    std::lock_guard lock(s.mu);
    ARGUS_RETURN_IF_ERROR(s.CheckFailedLocked());
    for (const PageKey& key : keys) {
      if (!s.pages.contains(key)) {
        return Status::NotFound("page " + key.ToString() + " is not stored in " + s.options.dir);
      }
    }
  }
  disk::JournalRecord record;
  record.kind = disk::RecordKind::kErase;
  record.keys.assign(keys.begin(), keys.end());
  ARGUS_RETURN_IF_ERROR(s.AppendRecord(record));
  std::lock_guard lock(s.mu);
  for (const PageKey& key : keys) s.ErasePageLocked(key);
  return Status::Ok();
}

bool DiskTier::Contains(const PageKey& key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->pages.contains(key);
}

Result<StoredPageInfo> DiskTier::Info(const PageKey& key) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->pages.find(key);
  if (it == impl_->pages.end()) {
    return Status::NotFound("page " + key.ToString() + " is not stored in " + impl_->options.dir);
  }
  const PageEntry& e = it->second;
  return StoredPageInfo{key, e.tag, e.generation, e.payload_bytes, e.cls->slot_bytes};
}

std::vector<PageKey> DiskTier::Keys() const {
  std::lock_guard lock(impl_->mu);
  std::vector<PageKey> keys;
  keys.reserve(impl_->pages.size());
  for (const auto& [key, entry] : impl_->pages) keys.push_back(key);
  return keys;
}

Status DiskTier::Read(const PageKey& key, std::span<std::byte> dst) {
  Impl& s = *impl_;
  ReadTarget t;
  {
    std::lock_guard lock(s.mu);
    ARGUS_ASSIGN_OR_RETURN(t, s.TargetLocked(key));
    if (dst.size() != t.payload_bytes) {
      return Status::InvalidArgument("page " + key.ToString() + " holds " +
                                     std::to_string(t.payload_bytes) + " bytes, the read wants " +
                                     std::to_string(dst.size()));
    }
    if (!s.TryReserveStagingLocked(t.slot_bytes, nullptr)) {
      return s.StagingExhausted(t.slot_bytes, "a read of page " + key.ToString(), 0);
    }
    s.PinLocked(t);
  }
  Status status = [&]() -> Status {
    ARGUS_ASSIGN_OR_RETURN(AlignedBytes buffer,
                           AllocateAligned(t.slot_bytes, s.alignment, "page " + key.ToString()));
    std::span<std::byte> slot(buffer.get(), t.slot_bytes);
    ARGUS_RETURN_IF_ERROR(ReadExact(*t.file, t.offset(), slot, "page " + key.ToString()));
    ARGUS_RETURN_IF_ERROR(s.Verify(t, slot));
    std::memcpy(dst.data(), slot.data() + kSlotHeaderBytes, t.payload_bytes);
    return Status::Ok();
  }();
  {
    std::lock_guard lock(s.mu);
    s.UnpinLocked(t);
  }
  s.ReleaseStaging(t.slot_bytes);
  return status;
}

Result<std::unique_ptr<PageReadBatch>> DiskTier::ReadBatch(std::span<const PageKey> keys) {
  ARGUS_ASSIGN_OR_RETURN(auto batch, impl_->NewBatch(&keys));
  return std::unique_ptr<PageReadBatch>(std::move(batch));
}

Status DiskTier::PutRecord(std::string_view name, std::span<const std::byte> value) {
  Impl& s = *impl_;
  if (name.empty() || name.size() > disk::kMaxRecordNameBytes) {
    return Status::InvalidArgument("record name of " + std::to_string(name.size()) +
                                   " bytes (1 .. " + std::to_string(disk::kMaxRecordNameBytes) +
                                   ")");
  }
  const std::string what = "record '" + std::string(name) + "'";
  std::lock_guard write_lock(s.write_mu);
  {
    std::lock_guard lock(s.mu);
    ARGUS_RETURN_IF_ERROR(s.CheckFailedLocked());
    auto old = s.records.find(name);
    const size_t old_bytes =
        old == s.records.end() ? 0 : kIndexBytesPerRecord + old->first.size() + old->second.size();
    const size_t new_bytes = kIndexBytesPerRecord + name.size() + value.size();
    ARGUS_RETURN_IF_ERROR(s.CheckMetadataLocked(new_bytes - std::min(new_bytes, old_bytes), what));
  }
  disk::JournalRecord record;
  record.kind = disk::RecordKind::kPutRecord;
  record.name = name;
  record.value.assign(value.begin(), value.end());
  ARGUS_RETURN_IF_ERROR(s.AppendRecord(record));
  std::lock_guard lock(s.mu);
  s.SetRecordLocked(name, std::move(record.value));
  return Status::Ok();
}

Result<std::vector<std::byte>> DiskTier::GetRecord(std::string_view name) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->records.find(name);
  if (it == impl_->records.end()) {
    return Status::NotFound("record '" + std::string(name) + "' is not stored in " +
                            impl_->options.dir);
  }
  return it->second;
}

Status DiskTier::EraseRecord(std::string_view name) {
  Impl& s = *impl_;
  std::lock_guard write_lock(s.write_mu);
  {
    std::lock_guard lock(s.mu);
    ARGUS_RETURN_IF_ERROR(s.CheckFailedLocked());
    if (!s.records.contains(name)) {
      return Status::NotFound("record '" + std::string(name) + "' is not stored in " +
                              s.options.dir);
    }
  }
  disk::JournalRecord record;
  record.kind = disk::RecordKind::kEraseRecord;
  record.name = name;
  ARGUS_RETURN_IF_ERROR(s.AppendRecord(record));
  std::lock_guard lock(s.mu);
  s.EraseRecordLocked(name);
  return Status::Ok();
}

std::vector<std::string> DiskTier::RecordNames() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::string> names;
  for (const auto& [name, value] : impl_->records) names.push_back(name);
  return names;
}

Result<StoreCheckReport> DiskTier::Check() {
  Impl& s = *impl_;
  ARGUS_ASSIGN_OR_RETURN(auto batch, s.NewBatch(nullptr));
  StoreCheckReport report;
  for (size_t i = 0; i < batch->size(); ++i) {
    auto page = batch->Get(i);
    batch->Release(i);
    if (!page.ok()) {
      if (page.status().code() != StatusCode::kCorruption) return page.status();
      report.lost.emplace_back(batch->target(i).key, page.status().message());
      continue;
    }
    ++report.n_pages;
    report.payload_bytes += page->size();
    report.slot_bytes += batch->target(i).slot_bytes;
  }
  std::lock_guard lock(s.mu);
  report.lost.insert(report.lost.end(), s.lost_at_open.begin(), s.lost_at_open.end());
  report.n_records = s.records.size();
  return report;
}

Status DiskTier::Compact() {
  Impl& s = *impl_;
  std::lock_guard write_lock(s.write_mu);
  std::vector<std::byte> bytes = disk::JournalFileHeader();
  size_t n_records = 0;
  {
    std::lock_guard lock(s.mu);
    ARGUS_RETURN_IF_ERROR(s.CheckFailedLocked());
    disk::JournalRecord r;
    r.kind = disk::RecordKind::kNextGeneration;
    r.next_generation = s.next_generation;
    ARGUS_RETURN_IF_ERROR(disk::AppendRecord(r, bytes));
    r.kind = disk::RecordKind::kPublish;
    r.pages.resize(1);
    for (const auto& [key, e] : s.pages) {
      r.pages[0] = {key,
                    e.tag,
                    e.generation,
                    e.payload_checksum,
                    e.cls->slot_bytes,
                    e.slot,
                    static_cast<uint32_t>(e.payload_bytes)};
      ARGUS_RETURN_IF_ERROR(disk::AppendRecord(r, bytes));
    }
    r.kind = disk::RecordKind::kPutRecord;
    for (const auto& [name, value] : s.records) {
      r.name = name;
      r.value = value;
      ARGUS_RETURN_IF_ERROR(disk::AppendRecord(r, bytes));
    }
    n_records = 1 + s.pages.size() + s.records.size();
  }
  const std::string tmp = s.Path(kJournalTmpName);
  Status written = [&]() -> Status {
    ARGUS_ASSIGN_OR_RETURN(auto file, s.env->Open(tmp, {.create = true, .private_file = true}));
    ARGUS_RETURN_IF_ERROR(file->Truncate(0));
    ARGUS_RETURN_IF_ERROR(WriteExact(*file, 0, bytes, "the compacted journal"));
    // The disk has shown it may drop written pages: no further writes, as after any failed sync.
    Status synced = file->Sync();
    if (!synced.ok()) s.MarkFailed(synced);
    return synced;
  }();
  if (written.ok()) written = s.env->Rename(tmp, s.journal_path);
  if (!written.ok()) {
    (void)s.env->Remove(tmp);
    return written;
  }
  // From here the new journal is in place: a failure leaves the store unable to append safely.
  Status reopened = s.env->SyncDir(s.options.dir);
  auto journal = reopened.ok() ? s.env->Open(s.journal_path, {.private_file = true})
                               : Result<std::unique_ptr<File>>(reopened);
  if (!journal.ok()) {
    s.MarkFailed(journal.status());
    return journal.status();
  }
  std::lock_guard lock(s.mu);
  s.journal = std::move(journal).value();
  s.journal_bytes = bytes.size();
  s.n_journal_records = n_records;
  return Status::Ok();
}

DiskTierStats DiskTier::stats() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  DiskTierStats st;
  st.dir = s.options.dir;
  st.io_backend = s.engine->name();
  st.direct_io = s.direct_io;
  st.alignment_bytes = s.alignment;
  st.budget_bytes = s.options.disk_budget_bytes;
  st.used_bytes = s.used_bytes;
  for (const auto& [slot_bytes, cls] : s.classes) {
    st.file_bytes += uint64_t{cls->n_slots} * slot_bytes;
    st.n_free_slots += cls->free.size();
  }
  st.n_pages = s.pages.size();
  st.n_size_classes = s.classes.size();
  st.staging_budget_bytes = s.options.staging_budget_bytes;
  st.staging_used_bytes = s.staging_used;
  st.staging_peak_bytes = s.staging_peak;
  st.metadata_budget_bytes = s.options.metadata_budget_bytes;
  st.metadata_bytes = s.metadata_bytes;
  st.journal_bytes = s.journal_bytes;
  st.n_journal_records = s.n_journal_records;
  st.journal_dropped_bytes = s.journal_dropped_bytes;
  st.n_reads = s.n_reads;
  st.read_bytes = s.read_bytes;
  st.n_writes = s.n_writes;
  st.write_bytes = s.write_bytes;
  st.n_corrupt_reads = s.n_corrupt_reads;
  st.n_lost_pages = s.lost_keys.size();
  return st;
}

const DiskTierOptions& DiskTier::options() const { return impl_->options; }

}  // namespace argus
