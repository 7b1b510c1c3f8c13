// The disk tier's journal: durable appends of framed records (each synced before the next), the
// replay that rebuilds the index at open and cuts a torn tail, and compaction into a fresh file.
// The record formats are in disk_format.h and docs/page_format.md.
#include <algorithm>
#include <string>
#include <vector>

#include "store/disk_tier_impl.h"

namespace argus {

using disk::kJournalTmpName;
using disk::PageEntry;
using disk::SizeClass;

Status DiskTier::Impl::AppendJournal(std::span<const std::byte> bytes, size_t n_records) {
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

Status DiskTier::Impl::AppendRecord(const disk::JournalRecord& record) {
  std::vector<std::byte> bytes;
  ARGUS_RETURN_IF_ERROR(disk::AppendRecord(record, bytes));
  return AppendJournal(bytes, 1);
}

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

}  // namespace argus
