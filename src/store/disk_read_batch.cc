// Read batches of the disk tier: a batch pins its pages' slots (an erase or a replacement frees a
// pinned slot only at the unpin), reads them ahead in list order into the bounded staging area
// and verifies each page as it is taken. Read-ahead gives way to a page asked for.
#include <algorithm>
#include <string>
#include <vector>

#include "store/disk_tier_impl.h"

namespace argus {

using disk::AllocateAligned;
using disk::kSlotHeaderBytes;
using disk::ReadTarget;

DiskTier::Impl::Batch::Batch(Impl* store, std::vector<ReadTarget> targets)
    : store_(store), n_(targets.size()), items_(new Item[targets.size()]) {
  for (size_t i = 0; i < n_; ++i) items_[i].target = targets[i];
  std::lock_guard lock(mu_);
  PumpLocked();
}

DiskTier::Impl::Batch::~Batch() {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < n_; ++i) {
    Item& it = items_[i];
    if (it.state == State::kInFlight) (void)store_->engine->Wait(&it.request);
    DropLocked(it);
  }
  std::lock_guard store_lock(store_->mu);
  for (size_t i = 0; i < n_; ++i) store_->UnpinLocked(items_[i].target);
}

Result<std::span<const std::byte>> DiskTier::Impl::Batch::Get(size_t i) {
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
          return store_->StagingExhausted(it.target.slot_bytes, "page " + it.target.key.ToString(),
                                          held_bytes_);
        }
        lock.unlock();  // other batches hold the staging: wait for them to release some
        store_->WaitStagingChange(epoch);
        lock.lock();
        break;
      }
    }
  }
}

void DiskTier::Impl::Batch::Release(size_t i) {
  if (i >= n_) return;
  std::unique_lock lock(mu_);
  Item& it = items_[i];
  cv_.wait(lock, [&] { return it.state != State::kWaiting; });
  if (it.state == State::kInFlight) (void)store_->engine->Wait(&it.request);
  DropLocked(it);
  it.state = State::kReleased;
  PumpLocked();
}

bool DiskTier::Impl::Batch::IssueLocked(size_t i, uint64_t* epoch, bool read_ahead) {
  Item& it = items_[i];
  {
    std::lock_guard store_lock(store_->mu);
    const size_t keep_free = read_ahead ? store_->ReadAheadReserveLocked() : 0;
    if (!store_->TryReserveStagingLocked(it.target.slot_bytes, epoch, keep_free)) return false;
  }
  auto buffer =
      AllocateAligned(it.target.slot_bytes, store_->alignment, "page " + it.target.key.ToString());
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

void DiskTier::Impl::Batch::PumpLocked() {
  while (next_ < n_) {
    if (items_[next_].state == State::kIdle && !IssueLocked(next_, nullptr, true)) return;
    ++next_;
  }
}

void DiskTier::Impl::Batch::DropLocked(Item& it) {
  if (!it.buffer) return;
  it.buffer.reset();
  held_bytes_ -= it.target.slot_bytes;
  store_->ReleaseStaging(it.target.slot_bytes);
}

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

}  // namespace argus
