// A BatchContext under a placement engine: many sequences share a RAM budget far below their
// exact KV; the engine demotes and spills the coldest pages of any sequence so every one runs to
// completion; the exact profile (f16 in RAM, exact masters on disk) changes no logit; a lossy
// profile completes within the budget.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "argus/model.h"
#include "batch_steps.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::BatchStories;
using testing::BatchStory;
using testing::Conversation;
using testing::StepTogether;

constexpr uint32_t kPlacedPage = 16;   // page tokens, and prompt tokens per piece
constexpr uint32_t kPlacedDecode = 8;  // greedy tokens after each prompt

// Prompts of different lengths from different places of the story.
std::vector<Conversation> Conversations() {
  const std::vector<int32_t> story = BatchStory();
  EXPECT_GE(story.size(), 300u);
  std::vector<Conversation> all(5);
  const size_t firsts[] = {0, 40, 90, 20, 60}, lengths[] = {200, 150, 190, 120, 170};
  for (size_t i = 0; i < all.size(); ++i) {
    all[i].prompt.assign(story.begin() + firsts[i], story.begin() + firsts[i] + lengths[i]);
  }
  return all;
}

// The RAM each conversation's exact KV needs at its end, summed.
size_t ExactBytesOf(const std::vector<Conversation>& conversations) {
  CacheOptions c;
  c.geometry = BatchStories().config().geometry();
  c.page_tokens = kPlacedPage;
  size_t total = 0;
  for (const Conversation& conv : conversations) {
    const auto n = static_cast<uint32_t>(conv.prompt.size() + kPlacedDecode + 1);
    total += KvCache::RequiredRamBytes(c, n).value();
  }
  return total;
}

BatchContextOptions PlacedOptions(size_t ram_budget) {
  BatchContextOptions o;
  o.n_ctx = 512;
  o.n_batch = 96;
  o.page_tokens = kPlacedPage;
  o.n_threads = 2;
  o.ram_budget_bytes = ram_budget;
  return o;
}

// The options with a built-in profile whose recent pin is one page (the built-ins pin 256
// tokens: all of these prompts), migrations inline so every run is the same.
BatchContextOptions WithPlacement(BatchContextOptions o, const char* profile, DiskTier* disk) {
  o.placement.emplace();
  o.placement->profile = Profile::BuiltIn(profile).value();
  o.placement->profile.pin_recent = kPlacedPage;
  o.placement->background = false;
  o.n_full_sequences = 5;
  o.disk = disk;
  return o;
}

std::unique_ptr<DiskTier> PlacedDisk(const testing::TempDir& dir) {
  DiskTierOptions d;
  d.dir = dir / "disk";
  d.disk_budget_bytes = size_t{256} << 20;
  return DiskTier::Open(d).value();
}

TEST(BatchPlacement, TheExactProfileRunsFiveSequencesInAThirdOfTheirKvWithTheirAllRamLogits) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::vector<Conversation> all_ram = Conversations();
  const size_t exact = ExactBytesOf(all_ram);
  {
    auto context = BatchContext::Create(BatchStories(), PlacedOptions(2 * exact)).value();
    for (Conversation& c : all_ram) c.seq = context->NewSequence().value();
    StepTogether(*context, all_ram, kPlacedPage, kPlacedDecode);
  }

  testing::TempDir dir;
  std::unique_ptr<DiskTier> disk = PlacedDisk(dir);
  const size_t budget = exact / 3;
  auto context = BatchContext::Create(BatchStories(),
                                      WithPlacement(PlacedOptions(budget), "exact", disk.get()))
                     .value();
  EXPECT_GT(context->placeable_bytes(), exact);  // the disk holds what RAM does not
  std::vector<Conversation> placed = Conversations();
  for (Conversation& c : placed) c.seq = context->NewSequence().value();
  const size_t peak = StepTogether(*context, placed, kPlacedPage, kPlacedDecode);
  EXPECT_LE(peak, budget);

  const PlacementStats stats = context->placement_stats().value();
  EXPECT_TRUE(stats.active);
  EXPECT_GT(stats.n_demotions, 0u);
  ASSERT_EQ(stats.state_names, (std::vector<std::string>{"f16/f16", "disk"}));
  EXPECT_GT(stats.pages_per_state[1], 0u);  // spilled: their exact masters serve them
  EXPECT_GT(stats.attention_disk_bytes_read, 0u);
  EXPECT_GT(context->cache().stats().n_disk_pages, 0u);
  for (size_t i = 0; i < placed.size(); ++i) {
    SCOPED_TRACE("conversation " + std::to_string(i));
    ASSERT_EQ(placed[i].logits.size(), all_ram[i].logits.size());
    for (size_t step = 0; step < placed[i].logits.size(); ++step) {
      EXPECT_TRUE(placed[i].logits[step] == all_ram[i].logits[step]) << "step " << step;
    }
  }
  // Sequences leave through the engine: every page goes, on disk too.
  for (const Conversation& c : placed) ASSERT_TRUE(context->Release(c.seq).ok());
  EXPECT_EQ(context->cache().stats().n_pages, 0u);
}

TEST(BatchPlacement, TheCapacityProfileRunsFiveSequencesInAQuarterOfTheirKvPinsAndAll) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::vector<Conversation> placed = Conversations();
  const size_t budget = ExactBytesOf(placed) / 4;
  testing::TempDir dir;
  std::unique_ptr<DiskTier> disk = PlacedDisk(dir);
  // Five sequences' sink and recent pages in f16 would take more than a quarter here: the pins
  // yield rather than fail a step.
  auto context = BatchContext::Create(BatchStories(),
                                      WithPlacement(PlacedOptions(budget), "capacity", disk.get()))
                     .value();
  for (Conversation& c : placed) c.seq = context->NewSequence().value();
  const size_t peak = StepTogether(*context, placed, kPlacedPage, kPlacedDecode);
  EXPECT_LE(peak, budget);
  for (const Conversation& c : placed) EXPECT_EQ(c.logits.size(), kPlacedDecode + 1);
  const PlacementStats stats = context->placement_stats().value();
  EXPECT_GT(stats.n_demotions, 0u);
  size_t below_best = 0;
  for (size_t i = 1; i < stats.pages_per_state.size(); ++i) below_best += stats.pages_per_state[i];
  EXPECT_GT(below_best, 0u);
}

TEST(BatchPlacement, AForkOfAPlacedSequenceEvaluatesAsItsSource) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::vector<Conversation> placed = Conversations();
  testing::TempDir dir;
  std::unique_ptr<DiskTier> disk = PlacedDisk(dir);
  auto context = BatchContext::Create(
                     BatchStories(),
                     WithPlacement(PlacedOptions(ExactBytesOf(placed) / 3), "exact", disk.get()))
                     .value();
  for (Conversation& c : placed) c.seq = context->NewSequence().value();
  StepTogether(*context, placed, kPlacedPage, kPlacedDecode);
  ASSERT_GT(context->placement_stats()->n_demotions, 0u);

  // A fork of the first conversation's prompt pages, some of them on disk by now, re-evaluating
  // the rest of its prompt: the same logits as the first run.
  std::vector<Conversation> again(1);
  again[0].prompt = placed[0].prompt;
  const uint32_t shared = 8 * kPlacedPage;
  again[0].seq = context->Fork(placed[0].seq, shared).value();
  again[0].n_done = shared;
  for (size_t i = 1; i < placed.size(); ++i) ASSERT_TRUE(context->Release(placed[i].seq).ok());
  StepTogether(*context, again, kPlacedPage, kPlacedDecode);
  ASSERT_EQ(again[0].logits.size(), placed[0].logits.size());
  for (size_t step = 0; step < again[0].logits.size(); ++step) {
    EXPECT_TRUE(again[0].logits[step] == placed[0].logits[step]) << "step " << step;
  }
}

TEST(BatchPlacement, OptionsThatContradictTheProfileAreInvalid) {
  ARGUS_SKIP_WITHOUT_SHARED();
  BatchContextOptions o = WithPlacement(PlacedOptions(size_t{1} << 20), "balanced", nullptr);
  // balanced keeps pages on disk: the cache needs a disk tier.
  EXPECT_EQ(BatchContext::Create(BatchStories(), o).status().code(), StatusCode::kInvalidArgument);
  testing::TempDir dir;
  std::unique_ptr<DiskTier> disk = PlacedDisk(dir);
  o.disk = disk.get();
  o.k_codec = "q8_0";
  EXPECT_EQ(BatchContext::Create(BatchStories(), o).status().code(), StatusCode::kInvalidArgument);
  o.k_codec = "f16";
  o.attention.epsilon = 0.01;
  EXPECT_EQ(BatchContext::Create(BatchStories(), o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace argus
