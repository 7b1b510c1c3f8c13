// Opening a disk tier: the directory lock, the journal's replay, the slot files (those the
// journal references and any others on disk, all of whose slots are free), the metadata charges
// of what was found, the I/O engine, and optionally the verification of every page.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "store/disk_tier_impl.h"

namespace argus {

using disk::kIndexBytesPerPage;
using disk::kIndexBytesPerRecord;
using disk::kIndexBytesPerSlot;
using disk::kJournalName;
using disk::kJournalTmpName;
using disk::kLockName;
using disk::kSlotHeaderBytes;
using disk::ParseSlotFileName;
using disk::SizeClass;
using disk::SlotFileName;
using disk::SlotRef;

namespace disk {

std::string SlotFileName(uint64_t slot_bytes) {
  return "slots-" + std::to_string(slot_bytes) + ".dat";
}

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

}  // namespace disk

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

Status DiskTier::Impl::OpenSlotFile(SizeClass& cls) {
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

}  // namespace argus
