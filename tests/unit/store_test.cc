// The RAM tier: the byte budget, slot replacement, slab lifetime, size classes and slot bytes.
#include "argus/store.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "test_util.h"

namespace argus {
namespace {

void ExpectSameStats(const RamTierStats& a, const RamTierStats& b) {
  EXPECT_EQ(a.budget_bytes, b.budget_bytes);
  EXPECT_EQ(a.used_bytes, b.used_bytes);
  EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
  EXPECT_EQ(a.n_slots, b.n_slots);
  EXPECT_EQ(a.n_slabs, b.n_slabs);
  EXPECT_EQ(a.n_size_classes, b.n_size_classes);
}

using testing::ContainsText;

TEST(RamTier, NameIsRam) { EXPECT_EQ(TierName(TierKind::kRam), "ram"); }

TEST(RamTier, ExactBudgetFitsAndOneByteOverIsResourceExhausted) {
  RamTier ram(1000);
  auto a = ram.Allocate(600, "slot a");
  auto b = ram.Allocate(400, "slot b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ram.used_bytes(), 1000u);
  EXPECT_TRUE(ram.CheckFits(0, 0, "nothing").ok());
  const RamTierStats before = ram.stats();

  auto over = ram.Allocate(1, "page 7");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  const std::string m = over.status().message();
  EXPECT_TRUE(ContainsText(m, "RAM budget of 1000 bytes")) << m;
  EXPECT_TRUE(ContainsText(m, "page 7 needs 1 more bytes")) << m;
  EXPECT_TRUE(ContainsText(m, "1000 in use")) << m;
  ExpectSameStats(ram.stats(), before);

  // After freeing 400, exactly 400 fit again and 401 do not.
  ram.Free(*b);
  EXPECT_TRUE(ram.CheckFits(400, 0, "x").ok());
  EXPECT_EQ(ram.CheckFits(401, 0, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(ram.CheckFits(1000, 600, "x").ok());  // as if a were freed
  EXPECT_FALSE(ram.CheckFits(1001, 600, "x").ok());
}

TEST(RamTier, ZeroByteSlotIsInvalidArgument) {
  RamTier ram(1000);
  EXPECT_EQ(ram.Allocate(0, "empty").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ram.stats().n_size_classes, 0u);
}

// The new slot is checked as if the old one were free; the old one stays readable until freed.
TEST(RamTier, AllocateReplacingChecksAsIfOldWereFreeAndKeepsOldLive) {
  RamTier ram(1000);
  SlotId old = *ram.Allocate(800, "old");
  std::memset(ram.Bytes(old).data(), 0x5a, 800);

  auto too_big = ram.AllocateReplacing(old, 1001, "replacement");
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(ContainsText(too_big.status().message(), "replacement needs 201 more bytes"))
      << too_big.status().message();
  EXPECT_EQ(ram.used_bytes(), 800u);
  EXPECT_EQ(ram.stats().n_slots, 1u);

  auto fresh = ram.AllocateReplacing(old, 1000, "replacement");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  for (std::byte b : ram.Bytes(old)) ASSERT_EQ(b, std::byte{0x5a});
  for (std::byte b : ram.Bytes(*fresh)) ASSERT_EQ(b, std::byte{0});
  ram.Free(old);
  EXPECT_EQ(ram.used_bytes(), 1000u);
  EXPECT_EQ(ram.stats().n_slots, 1u);
}

TEST(RamTier, SlabIsReturnedWhenItsLastSlotIsFreed) {
  // Slots of 1000 bytes take a 1024-byte stride: four to a 4096-byte slab.
  RamTier ram(1 << 20, 4096);
  std::vector<SlotId> slots;
  for (int i = 0; i < 10; ++i) slots.push_back(*ram.Allocate(1000, "slot"));
  EXPECT_EQ(ram.stats().n_slabs, 3u);
  EXPECT_EQ(ram.stats().reserved_bytes, 3u * 4096);
  EXPECT_EQ(ram.used_bytes(), 10000u);

  // Slots 4..7 fill the middle slab: freeing them returns it, and nothing else.
  for (int i = 4; i < 8; ++i) ram.Free(slots[i]);
  EXPECT_EQ(ram.stats().n_slabs, 2u);
  EXPECT_EQ(ram.stats().reserved_bytes, 2u * 4096);

  // The freed slab's index is taken again before a new one is made.
  std::vector<SlotId> again;
  for (int i = 0; i < 4; ++i) again.push_back(*ram.Allocate(1000, "slot"));
  EXPECT_EQ(ram.stats().n_slabs, 3u);

  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  std::vector<SlotId> live = {slots[0], slots[1], slots[2], slots[3], slots[8], slots[9]};
  live.insert(live.end(), again.begin(), again.end());
  std::shuffle(live.begin(), live.end(), rng);
  for (SlotId s : live) ram.Free(s);
  const RamTierStats end = ram.stats();
  EXPECT_EQ(end.used_bytes, 0u);
  EXPECT_EQ(end.reserved_bytes, 0u);
  EXPECT_EQ(end.n_slabs, 0u);
  EXPECT_EQ(end.n_slots, 0u);
}

// A slab within 1/32 of whole huge pages is rounded up to them, on a huge-page boundary, and the
// padding counts as reserved; a slab further from them is not.
TEST(RamTier, SlabsCloseToWholeHugePagesAreHugePageBuffers) {
  RamTier ram(64 << 20);                           // the default 2 MiB slabs
  const size_t close = kHugePageBytes / 8 - 1000;  // 8 slots: 8000 bytes short of 2 MiB
  SlotId a = *ram.Allocate(close, "close");
  EXPECT_EQ(ram.stats().reserved_bytes, kHugePageBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ram.Bytes(a).data()) % kHugePageBytes, 0u);
  const size_t far = kHugePageBytes / 4 * 3;  // one slot to a slab, a quarter short of 2 MiB
  SlotId b = *ram.Allocate(far, "far");
  EXPECT_EQ(ram.stats().reserved_bytes, kHugePageBytes + far);
  ram.Free(a);
  ram.Free(b);
  EXPECT_EQ(ram.stats().reserved_bytes, 0u);

  EXPECT_EQ(AlignedBuffer::AllocateHugePages(kHugePageBytes + 64).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AlignedBuffer::AllocateHugePages(0).status().code(), StatusCode::kInvalidArgument);
}

// A freed slot is reused (zeroed) before a new slab is made.
TEST(RamTier, FreedSlotIsReusedZeroed) {
  RamTier ram(1 << 20, 4096);
  SlotId a = *ram.Allocate(1000, "a");
  SlotId b = *ram.Allocate(1000, "b");
  std::memset(ram.Bytes(a).data(), 0xff, 1000);
  ram.Free(a);
  SlotId c = *ram.Allocate(1000, "c");
  EXPECT_EQ(ram.stats().n_slabs, 1u);
  for (std::byte x : ram.Bytes(c)) ASSERT_EQ(x, std::byte{0});
  ram.Free(b);
  ram.Free(c);
  EXPECT_EQ(ram.stats().reserved_bytes, 0u);
}

// One class per exact size; every slot is exactly its size, 64-byte aligned, and holds its own
// bytes.
TEST(RamTier, ManySizeClassesHoldDistinctAlignedBytes) {
  RamTier ram(64 << 20, 8192);
  std::vector<size_t> sizes(150);
  std::iota(sizes.begin(), sizes.end(), 1);
  for (size_t s : {size_t{255}, size_t{4096}, size_t{4097}, size_t{8192}, size_t{20000}}) {
    sizes.push_back(s);
  }
  std::vector<SlotId> slots;
  std::vector<size_t> slot_size;
  for (int round = 0; round < 3; ++round) {
    for (size_t s : sizes) {
      auto slot = ram.Allocate(s, "slot");
      ASSERT_TRUE(slot.ok()) << slot.status().ToString();
      slots.push_back(*slot);
      slot_size.push_back(s);
    }
  }
  EXPECT_EQ(ram.stats().n_size_classes, sizes.size());
  size_t total = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    std::span<std::byte> bytes = ram.Bytes(slots[i]);
    ASSERT_EQ(bytes.size(), slot_size[i]);
    ASSERT_EQ(ram.SlotBytes(slots[i]), slot_size[i]);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(bytes.data()) % 64, 0u) << slot_size[i];
    for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = std::byte(i * 7 + j);
    total += slot_size[i];
  }
  EXPECT_EQ(ram.used_bytes(), total);
  EXPECT_GE(ram.stats().reserved_bytes, total);
  for (size_t i = 0; i < slots.size(); ++i) {
    std::span<const std::byte> bytes = std::as_const(ram).Bytes(slots[i]);
    for (size_t j = 0; j < bytes.size(); ++j) ASSERT_EQ(bytes[j], std::byte(i * 7 + j)) << i;
  }
  for (SlotId s : slots) ram.Free(s);
  EXPECT_EQ(ram.stats().used_bytes, 0u);
  EXPECT_EQ(ram.stats().reserved_bytes, 0u);
}

// A slot larger than the slab size gets a slab of its own.
TEST(RamTier, SlotLargerThanSlabGetsItsOwnSlab) {
  RamTier ram(1 << 20, 4096);
  SlotId a = *ram.Allocate(10000, "a");
  SlotId b = *ram.Allocate(10000, "b");
  const RamTierStats s = ram.stats();
  EXPECT_EQ(s.n_slabs, 2u);
  EXPECT_EQ(s.reserved_bytes, 2u * 10048);  // stride rounded up to 64
  EXPECT_NE(ram.Bytes(a).data(), ram.Bytes(b).data());
  ram.Free(a);
  ram.Free(b);
  EXPECT_EQ(ram.stats().reserved_bytes, 0u);
}

}  // namespace
}  // namespace argus
