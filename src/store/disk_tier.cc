// The disk tier's public API: slot files per size class, an append-only journal, pinned
// asynchronous reads into a bounded staging area. The state, and the files that do the tier's
// other jobs, are in disk_tier_impl.h; the format and the recovery rules in docs/page_format.md.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "argus/store.h"
#include "core/checksum.h"
#include "store/disk_tier_impl.h"

namespace argus {

std::string PageKey::ToString() const {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return text;
}

namespace disk {

Result<AlignedBytes> AllocateAligned(size_t n_bytes, size_t alignment, std::string_view what) {
  void* p = std::aligned_alloc(alignment, RoundUp(n_bytes, alignment));
  if (p == nullptr) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(n_bytes) +
                                     " bytes of staging for " + std::string(what));
  }
  return AlignedBytes(static_cast<std::byte*>(p));
}

}  // namespace disk

using disk::AlignedBytes;
using disk::AllocateAligned;
using disk::kIndexBytesPerPage;
using disk::kIndexBytesPerRecord;
using disk::kIndexBytesPerSlot;
using disk::kSlotHeaderBytes;
using disk::PageEntry;
using disk::ReadTarget;
using disk::RoundUp;
using disk::SizeClass;

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
    slot_bytes[i] = SlotBytes(p.payload.size());
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

size_t DiskTier::SlotBytes(size_t payload_bytes) const {
  return RoundUp(kSlotHeaderBytes + payload_bytes, impl_->alignment);
}

}  // namespace argus
