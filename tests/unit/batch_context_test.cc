// BatchContext against Context: several sequences evaluated in one forward pass per step give,
// bit for bit, the logits each gives alone; forks share their pages and evaluate as the solo run;
// errors leave every sequence as it was.
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
using testing::Greedy;

constexpr uint32_t kBatchPage = 16;   // page tokens, and prompt tokens per piece
constexpr uint32_t kBatchDecode = 6;  // greedy tokens after each prompt

// The logits after the prompt and after each greedy token, from a Context of its own evaluating
// the prompt in chunks of kBatchPage.
std::vector<std::vector<float>> SoloLogits(const std::vector<int32_t>& prompt) {
  ContextOptions o;
  o.n_ctx = 512;
  o.n_batch = kBatchPage;
  o.page_tokens = kBatchPage;
  o.n_threads = 2;
  auto context = Context::Create(BatchStories(), o).value();
  std::vector<std::vector<float>> out;
  std::span<const float> logits = context->Eval(prompt).value();
  for (uint32_t i = 0;; ++i) {
    out.emplace_back(logits.begin(), logits.end());
    if (i == kBatchDecode) return out;
    const int32_t token = Greedy(logits);
    logits = context->Eval({&token, 1}).value();
  }
}

BatchContextOptions BatchOptions() {
  BatchContextOptions o;
  o.n_ctx = 512;
  o.n_batch = 64;
  o.page_tokens = kBatchPage;
  o.n_threads = 2;
  o.ram_budget_bytes = size_t{16} << 20;
  return o;
}

TEST(BatchContext, EachSequenceGetsTheLogitsOfItsOwnContextBitForBit) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::vector<int32_t> story = BatchStory();
  ASSERT_GE(story.size(), 300u);
  auto context = BatchContext::Create(BatchStories(), BatchOptions()).value();
  // Prompts of different lengths, so that decode steps meet prompt pieces of other sequences.
  std::vector<Conversation> conversations(3);
  conversations[0].prompt.assign(story.begin(), story.begin() + 70);
  conversations[1].prompt.assign(story.begin() + 100, story.begin() + 117);
  conversations[2].prompt.assign(story.begin() + 200, story.begin() + 290);
  for (Conversation& c : conversations) c.seq = context->NewSequence().value();
  testing::StepTogether(*context, conversations, kBatchPage, kBatchDecode);
  for (size_t i = 0; i < conversations.size(); ++i) {
    SCOPED_TRACE("conversation " + std::to_string(i));
    const std::vector<std::vector<float>> solo = SoloLogits(conversations[i].prompt);
    ASSERT_EQ(conversations[i].logits.size(), solo.size());
    for (size_t step = 0; step < solo.size(); ++step) {
      EXPECT_TRUE(conversations[i].logits[step] == solo[step]) << "step " << step;
    }
  }
}

TEST(BatchContext, AForkSharesTheFullPagesAndContinuesAsItsOwnContext) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::vector<int32_t> story = BatchStory();
  auto context = BatchContext::Create(BatchStories(), BatchOptions()).value();
  std::vector<Conversation> first(1);
  first[0].prompt.assign(story.begin(), story.begin() + 50);
  first[0].seq = context->NewSequence().value();
  testing::StepTogether(*context, first, kBatchPage, kBatchDecode);
  const CacheStats before = context->cache().stats();

  // A prompt sharing the first two pages, then its own tokens.
  std::vector<Conversation> second(1);
  second[0].prompt.assign(story.begin(), story.begin() + 2 * kBatchPage);
  second[0].prompt.insert(second[0].prompt.end(), story.begin() + 300, story.begin() + 330);
  second[0].seq = context->Fork(first[0].seq, 2 * kBatchPage).value();
  second[0].n_done = 2 * kBatchPage;
  EXPECT_EQ(context->Length(second[0].seq).value(), 2 * kBatchPage);
  // The fork added no full page: its two are the first sequence's.
  EXPECT_EQ(context->cache().stats().n_full_pages, before.n_full_pages);
  testing::StepTogether(*context, second, kBatchPage, kBatchDecode);
  const std::vector<std::vector<float>> solo = SoloLogits(second[0].prompt);
  ASSERT_EQ(second[0].logits.size(), solo.size());
  for (size_t step = 0; step < solo.size(); ++step) {
    EXPECT_TRUE(second[0].logits[step] == solo[step]) << "step " << step;
  }
  // Releasing the first sequence keeps the pages the fork still holds.
  ASSERT_TRUE(context->Release(first[0].seq).ok());
  EXPECT_EQ(context->Length(first[0].seq).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(context->Release(second[0].seq).ok());
  EXPECT_EQ(context->cache().stats().n_pages, 0u);
}

TEST(BatchContext, BadPiecesAndAFullBudgetLeaveEverySequenceAsItWas) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::vector<int32_t> story = BatchStory();
  BatchContextOptions o = BatchOptions();
  CacheOptions cache;
  cache.geometry = BatchStories().config().geometry();
  cache.page_tokens = kBatchPage;
  // Room for one sequence of 40 tokens, not two.
  o.ram_budget_bytes = KvCache::RequiredRamBytes(cache, 40).value();
  auto context = BatchContext::Create(BatchStories(), o).value();
  const SeqId a = context->NewSequence().value(), b = context->NewSequence().value();
  const std::span<const int32_t> tokens(story.data(), 32);
  const int32_t bad_token = static_cast<int32_t>(BatchStories().config().n_vocab);

  const auto code = [&](std::vector<BatchPiece> pieces) {
    return context->Eval(pieces).status().code();
  };
  EXPECT_EQ(code({{a, tokens}, {a, tokens}}), StatusCode::kInvalidArgument);  // a repeated seq
  EXPECT_EQ(code({{a, tokens}, {99, tokens}}), StatusCode::kNotFound);
  EXPECT_EQ(code({{a, {&bad_token, 1}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{a, std::span(story.data(), 65)}}), StatusCode::kInvalidArgument);  // > n_batch
  EXPECT_EQ(code({{a, {}}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(context->Length(a).value(), 0u);

  ASSERT_TRUE(context->Eval(std::vector<BatchPiece>{{a, tokens}}).ok());
  const size_t used = context->cache().stats().ram.used_bytes;
  EXPECT_EQ(code({{a, tokens.first(8)}, {b, tokens}}), StatusCode::kResourceExhausted);
  EXPECT_EQ(context->Length(a).value(), 32u);
  EXPECT_EQ(context->Length(b).value(), 0u);
  EXPECT_EQ(context->cache().stats().ram.used_bytes, used);
  // What fits still evaluates.
  EXPECT_TRUE(context->Eval(std::vector<BatchPiece>{{a, tokens.first(8)}}).ok());
  EXPECT_EQ(context->Length(a).value(), 40u);
}

}  // namespace
}  // namespace argus
