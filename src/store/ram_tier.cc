// The RAM tier: one pool of fixed-size slots per slot size, carved out of 64-byte aligned slabs
// (huge-page backed where they come close to whole huge pages).
#include <algorithm>
#include <cassert>
#include <cstring>
#include <set>
#include <string>

#include "argus/store.h"
#include "core/buffer.h"
#include "core/checked.h"

namespace argus {

std::string_view TierName(TierKind tier) {
  switch (tier) {
    case TierKind::kRam:
      return "ram";
    case TierKind::kDisk:
      return "disk";
  }
  return "unknown";
}

namespace {
constexpr uint32_t kNoSlab = UINT32_MAX;

// A slab of n_bytes, in whole huge pages when rounding up to them adds at most 1/32 (the default
// 2 MiB slab of 128 KiB pages is one exactly). Attention streams slabs from DRAM, and on 4 KiB
// pages every 4 KiB of a tile was a TLB miss: one decode of a Qwen-geometry 4K-token layer took
// about 6% longer (median of 5 alternating runs, 2 threads, evicted cache).
Result<AlignedBuffer> AllocateSlab(size_t n_bytes) {
  const size_t huge = (n_bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (huge >= n_bytes && huge - n_bytes <= n_bytes / 32)
    return AlignedBuffer::AllocateHugePages(huge);
  return AlignedBuffer::Allocate(n_bytes);
}
}  // namespace

// Slot i of the class lives in slab i / slots_per_slab at offset (i % slots_per_slab) * stride.
// Free slots are handed out lowest index first, so live slots gather in the low slabs and the
// high ones empty out and are returned.
struct RamTier::SizeClass {
  size_t slot_bytes = 0;
  size_t stride = 0;  // slot_bytes rounded up to kBufferAlign: every slot starts aligned
  uint32_t slots_per_slab = 0;
  std::vector<AlignedBuffer> slabs;  // an empty buffer is a returned slab; its index is reused
  std::vector<uint32_t> n_live;      // live slots per slab
  std::set<uint32_t> free_slots;     // freed slots of allocated slabs
  // The slab whose never-used tail is handed out next (zeroed by the slab allocation), and the
  // first such slot within it. Only the newest slab has one: a slab is made only when the free
  // set is empty and that tail is used up.
  uint32_t fresh_slab = kNoSlab;
  uint32_t fresh_next = 0;
  size_t n_slots = 0;
  size_t n_slabs = 0;

  uint32_t SlabOf(uint32_t index) const { return index / slots_per_slab; }
  std::byte* SlotData(uint32_t index) {
    return slabs[SlabOf(index)].data() + size_t{index % slots_per_slab} * stride;
  }
};

RamTier::RamTier(size_t budget_bytes, size_t slab_bytes)
    : budget_bytes_(budget_bytes), slab_bytes_(slab_bytes) {}

RamTier::~RamTier() = default;

bool RamTier::Fits(size_t add_bytes, size_t release_bytes) const {
  const size_t base = used_bytes_ - std::min(release_bytes, used_bytes_);
  return base <= budget_bytes_ && add_bytes <= budget_bytes_ - base;
}

Status RamTier::CheckFits(size_t add_bytes, size_t release_bytes, std::string_view what) const {
  if (Fits(add_bytes, release_bytes)) return Status::Ok();
  const size_t more = add_bytes > release_bytes ? add_bytes - release_bytes : 0;
  return Status::ResourceExhausted(
      "RAM budget of " + std::to_string(budget_bytes_) + " bytes: " + std::string(what) +
      " needs " + std::to_string(more) + " more bytes, " + std::to_string(used_bytes_) + " in use");
}

Result<SlotId> RamTier::Allocate(size_t n_bytes, std::string_view what) {
  if (n_bytes == 0) {
    return Status::InvalidArgument("RAM slot for " + std::string(what) + ": size 0");
  }
  ARGUS_RETURN_IF_ERROR(CheckFits(n_bytes, 0, what));
  return AllocateUnchecked(n_bytes);
}

Result<SlotId> RamTier::AllocateReplacing(SlotId old, size_t n_bytes, std::string_view what) {
  if (n_bytes == 0) {
    return Status::InvalidArgument("RAM slot for " + std::string(what) + ": size 0");
  }
  ARGUS_RETURN_IF_ERROR(CheckFits(n_bytes, SlotBytes(old), what));
  return AllocateUnchecked(n_bytes);
}

Result<SlotId> RamTier::AllocateUnchecked(size_t n_bytes) {
  auto found = class_by_bytes_.find(n_bytes);
  uint32_t class_index;
  if (found != class_by_bytes_.end()) {
    class_index = found->second;
  } else {
    auto sc = std::make_unique<SizeClass>();
    sc->slot_bytes = n_bytes;
    sc->stride = (n_bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
    if (sc->stride < n_bytes) {
      return Status::ResourceExhausted("RAM slot of " + std::to_string(n_bytes) +
                                       " bytes: size overflow");
    }
    sc->slots_per_slab =
        static_cast<uint32_t>(std::clamp<size_t>(slab_bytes_ / sc->stride, 1, UINT32_MAX / 2));
    class_index = static_cast<uint32_t>(classes_.size());
    classes_.push_back(std::move(sc));
    class_by_bytes_.emplace(n_bytes, class_index);
  }
  SizeClass& sc = *classes_[class_index];

  uint32_t index;
  if (!sc.free_slots.empty()) {
    index = *sc.free_slots.begin();
    sc.free_slots.erase(sc.free_slots.begin());
    std::memset(sc.SlotData(index), 0, sc.slot_bytes);  // a reused slot holds old bytes
  } else if (sc.fresh_slab != kNoSlab) {
    index = sc.fresh_slab * sc.slots_per_slab + sc.fresh_next++;
  } else {
    auto empty = std::find_if(sc.slabs.begin(), sc.slabs.end(),
                              [](const AlignedBuffer& b) { return b.size() == 0; });
    const size_t slab = static_cast<size_t>(empty - sc.slabs.begin());
    // Slot indices are uint32_t and UINT32_MAX is never one.
    if ((slab + 1) * sc.slots_per_slab >= UINT32_MAX) {
      return Status::ResourceExhausted("RAM tier: too many slots of " +
                                       std::to_string(sc.slot_bytes) + " bytes");
    }
    ARGUS_ASSIGN_OR_RETURN(size_t n_slab_bytes,
                           CheckedMul(sc.stride, sc.slots_per_slab, "RAM slab bytes"));
    ARGUS_ASSIGN_OR_RETURN(AlignedBuffer buffer, AllocateSlab(n_slab_bytes));
    if (slab == sc.slabs.size()) {
      sc.slabs.push_back(std::move(buffer));
      sc.n_live.push_back(0);
    } else {
      sc.slabs[slab] = std::move(buffer);
    }
    ++sc.n_slabs;
    sc.fresh_slab = static_cast<uint32_t>(slab);
    sc.fresh_next = 0;
    index = sc.fresh_slab * sc.slots_per_slab + sc.fresh_next++;
  }
  if (sc.fresh_slab != kNoSlab && sc.fresh_next == sc.slots_per_slab) sc.fresh_slab = kNoSlab;

  ++sc.n_live[sc.SlabOf(index)];
  ++sc.n_slots;
  used_bytes_ += n_bytes;
  return SlotId{class_index, index};
}

void RamTier::Free(SlotId slot) {
  assert(slot.valid() && slot.size_class < classes_.size());
  SizeClass& sc = *classes_[slot.size_class];
  const uint32_t slab = sc.SlabOf(slot.index);
  assert(slab < sc.slabs.size() && sc.n_live[slab] > 0 && !sc.free_slots.contains(slot.index));
  used_bytes_ -= sc.slot_bytes;
  --sc.n_slots;
  if (--sc.n_live[slab] > 0) {
    sc.free_slots.insert(slot.index);
    return;
  }
  // The slab's last slot: return the slab and forget its free slots.
  sc.free_slots.erase(sc.free_slots.lower_bound(slab * sc.slots_per_slab),
                      sc.free_slots.lower_bound((slab + 1) * sc.slots_per_slab));
  if (sc.fresh_slab == slab) sc.fresh_slab = kNoSlab;
  sc.slabs[slab] = AlignedBuffer();
  --sc.n_slabs;
  while (!sc.slabs.empty() && sc.slabs.back().size() == 0) {
    sc.slabs.pop_back();
    sc.n_live.pop_back();
  }
}

std::span<std::byte> RamTier::Bytes(SlotId slot) {
  SizeClass& sc = *classes_[slot.size_class];
  return {sc.SlotData(slot.index), sc.slot_bytes};
}

std::span<const std::byte> RamTier::Bytes(SlotId slot) const {
  SizeClass& sc = *classes_[slot.size_class];
  return {sc.SlotData(slot.index), sc.slot_bytes};
}

size_t RamTier::SlotBytes(SlotId slot) const { return classes_[slot.size_class]->slot_bytes; }

RamTierStats RamTier::stats() const {
  RamTierStats s;
  s.budget_bytes = budget_bytes_;
  s.used_bytes = used_bytes_;
  s.n_size_classes = classes_.size();
  for (const auto& sc : classes_) {
    s.n_slots += sc->n_slots;
    s.n_slabs += sc->n_slabs;
    for (const AlignedBuffer& slab : sc->slabs) s.reserved_bytes += slab.size();
  }
  return s;
}

}  // namespace argus
