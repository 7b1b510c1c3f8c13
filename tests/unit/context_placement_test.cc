// A model context whose KV cache a placement engine keeps within a RAM budget: the exact
// profile with masters on disk must change no logit; lossy profiles move perplexity by a
// measured, bounded amount; options that contradict the profile are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <optional>

#include "argus/model.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::TempDir;

std::string StoriesPath() { return testing::SharedDir() + "/models/stories260K.gguf"; }

std::vector<int32_t> StoryTokens(const Model& model) {
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return model.tokenizer().Encode(text, true);
}

// Pages of 16 tokens, so a window of 256 spans many pages per layer.
ContextOptions Plain(uint32_t n_ctx) {
  ContextOptions o;
  o.n_ctx = n_ctx;
  o.page_tokens = 16;
  return o;
}

// `fraction` of the RAM the plain cache needs for n_ctx tokens.
size_t BudgetOf(const Model& model, uint32_t n_ctx, double fraction) {
  CacheOptions c;
  c.geometry = model.config().geometry();
  c.page_tokens = 16;
  return static_cast<size_t>(fraction *
                             static_cast<double>(KvCache::RequiredRamBytes(c, n_ctx).value()));
}

ContextOptions WithProfile(ContextOptions o, const char* profile, size_t ram_budget, DiskTier* disk,
                           bool background) {
  o.placement.emplace();
  o.placement->profile = Profile::BuiltIn(profile).value();
  // The built-ins pin the last 256 tokens: all of a 256-token window. One page of them here.
  o.placement->profile.pin_recent = 16;
  o.placement->background = background;
  o.ram_budget_bytes = ram_budget;
  o.disk = disk;
  return o;
}

std::unique_ptr<DiskTier> OpenDisk(const TempDir& dir) {
  DiskTierOptions d;
  d.dir = dir / "disk";
  d.disk_budget_bytes = size_t{64} << 20;
  auto disk = DiskTier::Open(d);
  EXPECT_TRUE(disk.ok()) << disk.status().ToString();
  return disk.ok() ? std::move(disk).value() : nullptr;
}

// Prefill of `n_prompt` tokens in chunks of 64, then one token at a time: every logit.
std::vector<float> PrefillThenDecode(Context& context, std::span<const int32_t> tokens,
                                     size_t n_prompt, size_t ram_budget) {
  std::vector<float> logits;
  auto keep = [&](Result<std::span<const float>> r) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) logits.insert(logits.end(), r->begin(), r->end());
    EXPECT_LE(context.cache().stats().ram.used_bytes, ram_budget);
  };
  for (size_t first = 0; first < n_prompt; first += 64) {
    keep(context.Eval(tokens.subspan(first, std::min<size_t>(64, n_prompt - first)), true));
  }
  for (size_t p = n_prompt; p < tokens.size(); ++p) keep(context.Eval(tokens.subspan(p, 1)));
  // Back into the middle of a page (200 = 12.5 pages of 16), which the engine may have sent to
  // disk, and forward again.
  const Status truncated = context.Truncate(200);
  EXPECT_TRUE(truncated.ok()) << truncated.ToString();
  keep(context.Eval(tokens.subspan(200), true));
  return logits;
}

TEST(ContextPlacement, ExactProfileWithMastersOnDiskChangesNoLogit) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = Model::Load(StoriesPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<int32_t> story = StoryTokens(**model);
  ASSERT_GE(story.size(), 256u);
  const std::span<const int32_t> tokens(story.data(), 256);
  const size_t full = BudgetOf(**model, 256, 1.0), quarter = BudgetOf(**model, 256, 0.25);

  auto plain = Context::Create(**model, Plain(256));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const std::vector<float> want = PrefillThenDecode(**plain, tokens, 192, full);

  TempDir dir;
  auto disk = OpenDisk(dir);
  ASSERT_TRUE(disk);
  auto placed =
      Context::Create(**model, WithProfile(Plain(256), "exact", quarter, disk.get(), true));
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  const std::vector<float> got = PrefillThenDecode(**placed, tokens, 192, quarter);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "the exact profile changed a logit";

  const PlacementStats s = (*placed)->placement_stats().value();
  EXPECT_TRUE(s.active);
  EXPECT_GT(s.n_demotions, 0u);  // pages did go to disk: the test exercises what it claims
  EXPECT_GT((*placed)->cache().stats().n_disk_pages, 0u);
  EXPECT_FALSE((*plain)->placement_stats().has_value());
  // The last step's attention read pages from disk, and the context's statistics say so (they
  // used to drop the disk fields of the sum).
  ASSERT_TRUE((*placed)->Truncate(255).ok());
  ASSERT_TRUE((*placed)->Eval(tokens.subspan(255)).ok());
  const AttentionStats& attention = (*placed)->last_attention_stats();
  EXPECT_GT(attention.n_disk_pages_read, 0u);
  EXPECT_GT(attention.disk_bytes_read, 0u);
  EXPECT_EQ(attention.n_pages, 5u * 16u);  // 5 layers of 256 tokens in pages of 16
}

double PerplexityWith(const Model& model, const std::vector<int32_t>& tokens,
                      const ContextOptions& options) {
  auto r = Perplexity(model, options, tokens);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->perplexity : NAN;
}

// Under a RAM budget the engine must move pages to lossy states or disk, and perplexity moves
// with them by a bounded amount: balanced (F16 -> FP8 -> disk) at a quarter of the exact cache's
// RAM, research (F16 -> FP8 -> INT8 -> INT4 -> INT2 -> JL -> disk) at half. Measured on this
// text's first three windows: +0.27% and +0.01%. (Research at a quarter is not bounded: after the
// pins, a quarter leaves under 1 bit per value, and its sketch states cost 36-48x in perplexity;
// docs/eval.md.)
TEST(ContextPlacement, LossyProfilesUnderABudgetMovePerplexityALittle) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = Model::Load(StoriesPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<int32_t> tokens = StoryTokens(**model);
  tokens.resize(768);  // three windows: enough pages to demote, a third of the sanitizer's time
  const double exact = PerplexityWith(**model, tokens, Plain(256));
  TempDir dir;
  auto disk = OpenDisk(dir);
  ASSERT_TRUE(disk);
  const double balanced = PerplexityWith(
      **model, tokens,
      WithProfile(Plain(256), "balanced", BudgetOf(**model, 256, 0.25), disk.get(), false));
  const double research = PerplexityWith(
      **model, tokens,
      WithProfile(Plain(256), "research", BudgetOf(**model, 256, 0.5), disk.get(), false));
  EXPECT_NE(balanced, exact);  // the budget did force lossy pages
  EXPECT_LE(std::abs(balanced / exact - 1), 0.01);
  EXPECT_NE(research, exact);
  EXPECT_LE(std::abs(research / exact - 1), 0.03);
}

// A context's life is one request, and each Truncate(0) after appends begins the next (a
// perplexity window each); a request decides activation once.
TEST(ContextPlacement, EachTruncateToZeroAfterAppendsBeginsOneRequest) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = Model::Load(StoriesPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<int32_t> tokens = StoryTokens(**model);
  TempDir dir;
  auto disk = OpenDisk(dir);
  ASSERT_TRUE(disk);
  auto context = Context::Create(
      **model, WithProfile(Plain(256), "exact", BudgetOf(**model, 256, 0.5), disk.get(), false));
  ASSERT_TRUE(context.ok()) << context.status().ToString();
  EXPECT_EQ((*context)->placement_stats()->n_requests, 1u);
  EXPECT_TRUE((*context)->Truncate(0).ok());  // nothing appended yet: the same request
  EXPECT_EQ((*context)->placement_stats()->n_requests, 1u);
  ASSERT_TRUE((*context)->Eval(std::span(tokens).first(64)).ok());
  EXPECT_TRUE((*context)->Truncate(0).ok());
  EXPECT_EQ((*context)->placement_stats()->n_requests, 2u);
  EXPECT_TRUE((*context)->placement_stats()->active);  // 256 expected tokens need 2x the budget

  tokens.resize(768);
  ContextOptions o =
      WithProfile(Plain(256), "exact", BudgetOf(**model, 256, 0.5), disk.get(), false);
  auto r = Perplexity(**model, o, tokens);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->placement.has_value());
  EXPECT_EQ(r->placement->n_requests, 3u);  // one per window
  EXPECT_EQ(r->placement->n_requests_active, 3u);
  EXPECT_GT(r->placement->attention_disk_bytes_read, 0u);  // prefill read pages from disk
}

TEST(ContextPlacement, OptionsThatContradictTheProfileAreInvalidArgument) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = Model::Load(StoriesPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ContextOptions codecs = WithProfile(Plain(256), "balanced", 0, nullptr, false);
  codecs.k_codec = "q8_0";
  auto r = Context::Create(**model, codecs);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("balanced"), std::string::npos) << r.status().ToString();

  // The engine attends with its profile's options: any of the context's own is refused.
  for (int field = 0; field < 4; ++field) {
    ContextOptions o = WithProfile(Plain(256), "balanced", 0, nullptr, false);
    if (field == 0) o.attention.window = 64;
    if (field == 1) o.attention.sinks = 4;
    if (field == 2) o.attention.scale = 0.5f;
    if (field == 3) o.attention.epsilon = 1e-3;
    auto refused = Context::Create(**model, o);
    ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(refused.status().message().find("profile's epsilon"), std::string::npos)
        << refused.status().ToString();
  }

  // Research keeps masters and a disk state: without a disk tier the engine refuses it.
  ContextOptions no_disk = WithProfile(Plain(256), "research", 0, nullptr, false);
  EXPECT_EQ(Context::Create(**model, no_disk).status().code(), StatusCode::kInvalidArgument);
}

// ---- Prefix pages stored by approximate runs ----------------------------------------------

// A fresh plain context on `store`: loads the prefix pages of `tokens` the store serves (cut
// back to `cut` tokens when given), evaluates the rest in chunks of 64 and returns the last
// token's logits; `n_served` is what the store served.
std::vector<float> ServeAndFinish(const Model& model, DiskTier& store,
                                  std::span<const int32_t> tokens, uint32_t& n_served,
                                  std::optional<uint32_t> cut = std::nullopt) {
  ContextOptions o = Plain(256);
  o.disk = &store;
  auto context = Context::Create(model, o);
  EXPECT_TRUE(context.ok()) << context.status().ToString();
  if (!context.ok()) return {};
  n_served = (*context)->LoadPrefix(tokens.first(tokens.size() - 1)).value();
  if (cut) {
    EXPECT_TRUE((*context)->Truncate(std::min(*cut, n_served)).ok());
  }
  std::vector<float> logits;
  for (size_t first = (*context)->n_past(); first < tokens.size(); first += 64) {
    auto r = (*context)->Eval(tokens.subspan(first, std::min<size_t>(64, tokens.size() - first)));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) logits.assign(r->begin(), r->end());
  }
  return logits;
}

// A run attending with an epsilon, or under a placement ladder that demoted pages it then
// attended, computed K/V that differ from an exact run's; it stored them under the same prefix
// keys, and a later exact run served them. Now a page is stored only when every token of it
// came from canonical attention: whatever such a store serves equals an exact store's pages
// (the logits after it are bit-identical), and the inexact pages are counted.
TEST(ContextPlacement, PrefixPagesFromApproximateRunsAreNeverServedAsExact) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = Model::Load(StoriesPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<int32_t> story = StoryTokens(**model);
  ASSERT_GE(story.size(), 256u);
  const std::span<const int32_t> tokens(story.data(), 256);
  auto fill = [&](DiskTier& store, ContextOptions o) {
    o.disk = &store;
    auto context = Context::Create(**model, o);
    EXPECT_TRUE(context.ok()) << context.status().ToString();
    if (!context.ok()) return PrefixStoreStats{};
    for (size_t first = 0; first < tokens.size(); first += 64)
      EXPECT_TRUE((*context)->Eval(tokens.subspan(first, 64)).ok());
    PrefixStoreStats stats;
    EXPECT_TRUE((*context)->StorePrefix(tokens, stats).ok());
    return stats;
  };
  TempDir exact_dir;
  auto exact = OpenDisk(exact_dir);
  ASSERT_TRUE(exact);
  EXPECT_EQ(fill(*exact, Plain(256)).n_stored, 16u * 5);  // 16 pages x 5 layers
  ContextOptions epsilon = Plain(256);
  epsilon.attention.epsilon = 0.9;
  const ContextOptions balanced =
      WithProfile(Plain(256), "balanced", BudgetOf(**model, 256, 0.25), nullptr, false);
  for (const ContextOptions& o : {epsilon, balanced}) {
    SCOPED_TRACE(o.placement ? "balanced at a quarter" : "epsilon 0.9");
    TempDir dir;
    auto store = OpenDisk(dir);
    ASSERT_TRUE(store);
    const PrefixStoreStats stats = fill(*store, o);
    EXPECT_GT(stats.n_inexact, 0u);
    uint32_t n_served = 0, n_exact = 0;
    const std::vector<float> got = ServeAndFinish(**model, *store, tokens, n_served);
    const std::vector<float> want = ServeAndFinish(**model, *exact, tokens, n_exact, n_served);
    EXPECT_LT(n_served, 240u);
    EXPECT_TRUE(got == want) << "the store served pages an exact run does not compute (" << n_served
                             << " tokens)";
  }
}

}  // namespace
}  // namespace argus
