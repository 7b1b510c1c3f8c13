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
#include <vector>

#include "argus/core.h"
#include "argus/status.h"

namespace argus {

enum class TierKind : uint8_t { kRam = 0 };  // append only: reaches the page table and stats
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
  size_t reserved_bytes = 0;  // bytes of allocated slabs (used plus free slots in them)
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

  // Would allocating `add_bytes` after freeing `release_bytes` fit the budget? `what` names the
  // request in the error: ResourceExhausted "RAM budget of B bytes: W needs N more bytes, U in
  // use".
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

}  // namespace argus
