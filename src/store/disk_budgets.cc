// The disk tier's index and its budgets: pages, named records, slots and their pins, and the
// disk, staging and metadata budgets they are charged to. Every function here but MarkFailed,
// ReleaseStaging and WaitStagingChange REQUIRES mu held.
#include <algorithm>
#include <string>

#include "store/disk_tier_impl.h"

namespace argus {

using disk::kIndexBytesPerPage;
using disk::kIndexBytesPerRecord;
using disk::ReadTarget;

Status DiskTier::Impl::CheckFailedLocked() const {
  if (options.read_only)
    return Status::InvalidArgument("disk store " + options.dir + " is open read-only");
  if (failure.ok()) return Status::Ok();
  return Status::IOError("disk store " + options.dir +
                         " refuses writes after a failed sync: " + failure.message());
}

void DiskTier::Impl::MarkFailed(const Status& status) {
  std::lock_guard lock(mu);
  if (failure.ok()) failure = status;
}

Status DiskTier::Impl::CheckMetadataLocked(size_t add_bytes, std::string_view what) const {
  if (add_bytes <=
      options.metadata_budget_bytes - std::min(metadata_bytes, options.metadata_budget_bytes)) {
    return Status::Ok();
  }
  return Status::ResourceExhausted(
      "metadata budget of " + std::to_string(options.metadata_budget_bytes) +
      " bytes: " + std::string(what) + " needs " + std::to_string(add_bytes) + " more bytes, " +
      std::to_string(metadata_bytes) + " in use");
}

bool DiskTier::Impl::TryReserveStagingLocked(size_t n_bytes, uint64_t* epoch,
                                             size_t keep_free_bytes) {
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

Status DiskTier::Impl::StagingExhausted(size_t n_bytes, std::string_view what,
                                        size_t held_bytes) const {
  return Status::ResourceExhausted(
      "staging budget of " + std::to_string(options.staging_budget_bytes) +
      " bytes: " + std::string(what) + " needs " + std::to_string(n_bytes) + " bytes, " +
      std::to_string(staging_used) + " in use" +
      (held_bytes > 0 ? " (" + std::to_string(held_bytes) + " by this batch's unreleased pages)"
                      : std::string()));
}

size_t DiskTier::Impl::ReadAheadReserveLocked() const {
  return classes.empty() ? 0 : static_cast<size_t>(classes.rbegin()->first);
}

void DiskTier::Impl::ReleaseStaging(size_t n_bytes) {
  {
    std::lock_guard lock(mu);
    staging_used -= n_bytes;
    ++staging_epoch;
  }
  staging_cv.notify_all();
}

void DiskTier::Impl::WaitStagingChange(uint64_t epoch) {
  std::unique_lock lock(mu);
  staging_cv.wait(lock, [&] { return staging_epoch != epoch; });
}

void DiskTier::Impl::FreeSlotLocked(SizeClass* cls, uint32_t slot) {
  auto pin = pins.find({cls->slot_bytes, slot});
  if (pin != pins.end()) {
    pin->second.free_on_unpin = true;
    return;
  }
  cls->free.insert(slot);
  used_bytes -= cls->slot_bytes;
}

void DiskTier::Impl::PinLocked(const ReadTarget& t) { ++pins[{t.slot_bytes, t.slot}].count; }

void DiskTier::Impl::UnpinLocked(const ReadTarget& t) {
  auto pin = pins.find({t.slot_bytes, t.slot});
  if (--pin->second.count > 0) return;
  const bool free_now = pin->second.free_on_unpin;
  pins.erase(pin);
  if (free_now) FreeSlotLocked(classes.at(t.slot_bytes).get(), t.slot);
}

Result<ReadTarget> DiskTier::Impl::TargetLocked(const PageKey& key) const {
  auto it = pages.find(key);
  if (it == pages.end()) {
    return Status::NotFound("page " + key.ToString() + " is not stored in " + options.dir);
  }
  const PageEntry& e = it->second;
  return ReadTarget{
      key,    e.generation,     e.payload_bytes, e.payload_checksum, e.cls->slot_bytes,
      e.slot, e.cls->file.get()};
}

void DiskTier::Impl::SetPageLocked(const PageKey& key, PageEntry entry) {
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

void DiskTier::Impl::ErasePageLocked(const PageKey& key) {
  lost_keys.erase(key);
  auto it = pages.find(key);
  metadata_bytes -= kIndexBytesPerPage + it->second.tag.size();
  FreeSlotLocked(it->second.cls, it->second.slot);
  pages.erase(it);
}

void DiskTier::Impl::SetRecordLocked(std::string_view name, std::vector<std::byte> value) {
  EraseRecordLocked(name);
  metadata_bytes += kIndexBytesPerRecord + name.size() + value.size();
  records.emplace(std::string(name), std::move(value));
}

void DiskTier::Impl::EraseRecordLocked(std::string_view name) {
  auto it = records.find(name);
  if (it == records.end()) return;
  metadata_bytes -= kIndexBytesPerRecord + it->first.size() + it->second.size();
  records.erase(it);
}

}  // namespace argus
