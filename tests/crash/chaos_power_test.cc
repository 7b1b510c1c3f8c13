// The chaos campaign's power cuts: a prompt cache's life (KvCache::StorePrefix into a DiskTier
// through Context::StorePrefix, placement migrations of an exact profile with masters on disk in
// the same store, a journal compaction, a second prompt sharing the first one's pages) on
// FaultEnv's power-loss model, cut at its sync points with seeded loss and tearing of unsynced
// writes. After each cut the store is recovered twice and checked: no page lost (Check), every
// prefix whose StorePrefix returned OK loads in full, and the logits of each prompt evaluated
// over what the cache loads equal those of a context without a cache, bit for bit (a torn or
// foreign page served would change them).
//
// The suite runs 12 cuts spread over the sync points. The campaign (scripts/chaos.py) sets
// ARGUS_CHAOS_CUTS=N (every sync point in turn, with a new seed each round) and
// ARGUS_CHAOS_JSON=FILE for the counts; ARGUS_LONG_TESTS=1 alone runs 1,000.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "argus/model.h"
#include "argus/store.h"
#include "fault/fault_env.h"
#include "fault/store_workload.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::FaultEnv;
using testing::FaultOp;
using testing::TempDir;

constexpr uint32_t kPageTokens = 16;
constexpr uint32_t kCtx = 256;

struct Prompt {
  std::vector<int32_t> tokens;
  std::vector<float> want;     // last-token logits without a cache
  uint32_t n_loadable = 0;     // tokens LoadPrefix covers once its StorePrefix returned OK
};

ContextOptions Plain(DiskTier* disk) {
  ContextOptions o;
  o.n_ctx = kCtx;
  o.page_tokens = kPageTokens;
  o.n_threads = 1;
  o.disk = disk;
  return o;
}

// Loads what the cache holds of the prompt, evaluates the rest, stores its pages (when `store`);
// `loaded` receives the tokens the cache covered, `logits` the last token's logits.
Status RunPrompt(const Model& model, DiskTier* disk, const std::vector<int32_t>& tokens, bool store,
                 uint32_t* loaded, std::vector<float>* logits) {
  ARGUS_ASSIGN_OR_RETURN(auto context, Context::Create(model, Plain(disk)));
  uint32_t n = 0;
  if (disk != nullptr) {
    ARGUS_ASSIGN_OR_RETURN(n, context->LoadPrefix(tokens));
    n = std::min<uint32_t>(n, static_cast<uint32_t>(tokens.size()) - 1);
    if (n < context->n_past()) ARGUS_RETURN_IF_ERROR(context->Truncate(n));
  }
  if (loaded != nullptr) *loaded = n;
  ARGUS_ASSIGN_OR_RETURN(auto out, context->Eval(std::span(tokens).subspan(n)));
  if (logits != nullptr) logits->assign(out.begin(), out.end());
  if (!store) return Status::Ok();
  PrefixStoreStats stats;
  return context->StorePrefix(tokens, stats);
}

// An exact profile at a quarter of the RAM the cache needs, masters on disk, migrations in the
// foreground (so a run's sync points are the same every time): a prefill and decode steps.
Status RunPlacement(const Model& model, DiskTier& disk, const std::vector<int32_t>& story) {
  CacheOptions c;
  c.geometry = model.config().geometry();
  c.page_tokens = kPageTokens;
  ContextOptions o = Plain(&disk);
  o.ram_budget_bytes = KvCache::RequiredRamBytes(c, kCtx).value() / 4;
  o.placement.emplace();
  ARGUS_ASSIGN_OR_RETURN(o.placement->profile, Profile::BuiltIn("exact"));
  o.placement->profile.pin_recent = kPageTokens;
  o.placement->background = false;
  ARGUS_ASSIGN_OR_RETURN(auto context, Context::Create(model, o));
  const std::span<const int32_t> tokens(story.data(), 192);
  for (size_t first = 0; first < 160; first += 64) {
    ARGUS_RETURN_IF_ERROR(context->Eval(tokens.subspan(first, std::min<size_t>(64, 160 - first)))
                              .status());
  }
  for (size_t p = 160; p < tokens.size(); ++p)
    ARGUS_RETURN_IF_ERROR(context->Eval(tokens.subspan(p, 1)).status());
  const std::optional<PlacementStats> stats = context->placement_stats();
  if (!stats || stats->n_demotions == 0)
    return Status::Internal("the placement run moved no page to disk");
  return Status::Ok();
}

DiskTierOptions StoreOptions(const TempDir& dir, Env* env) {
  DiskTierOptions o = testing::BufferedStoreOptions(dir / "cache", env);
  o.disk_budget_bytes = size_t{64} << 20;
  return o;
}

uint64_t CampaignCuts() {
  if (const char* n = std::getenv("ARGUS_CHAOS_CUTS")) return std::strtoull(n, nullptr, 10);
  const char* long_mode = std::getenv("ARGUS_LONG_TESTS");
  return long_mode && std::string(long_mode) == "1" ? 1000 : 12;
}

TEST(Chaos, PowerCutsAcrossPromptCacheWritesCompactionAndMigrationsLoseNoDurablePage) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto loaded_model = Model::Load(testing::SharedDir() + "/models/stories260K.gguf");
  ASSERT_TRUE(loaded_model.ok()) << loaded_model.status().ToString();
  const Model& model = **loaded_model;
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> story = model.tokenizer().Encode(text, true);
  ASSERT_GE(story.size(), 400u);

  // Two prompts sharing their first three pages.
  std::vector<Prompt> prompts(2);
  prompts[0].tokens.assign(story.begin(), story.begin() + 100);
  prompts[1].tokens.assign(story.begin(), story.begin() + 48);
  prompts[1].tokens.insert(prompts[1].tokens.end(), story.begin() + 300, story.begin() + 370);
  for (Prompt& p : prompts)
    ASSERT_TRUE(RunPrompt(model, nullptr, p.tokens, false, nullptr, &p.want).ok());

  enum StepKind { kPromptCacheWrite, kMigrations, kCompaction };
  struct Step {
    StepKind kind;
    int prompt;  // the prompt a prompt-cache write stores, else -1
    std::function<Status(DiskTier&)> run;
  };
  const auto write = [&](int i) {
    return Step{kPromptCacheWrite, i, [&, i](DiskTier& disk) {
                  std::vector<float> logits;
                  return RunPrompt(model, &disk, prompts[i].tokens, true, nullptr, &logits);
                }};
  };
  const std::vector<Step> steps = {
      write(0),
      {kMigrations, -1, [&](DiskTier& disk) { return RunPlacement(model, disk, story); }},
      {kCompaction, -1, [](DiskTier& disk) { return disk.Compact(); }},
      write(1),
      {kMigrations, -1, [&](DiskTier& disk) { return RunPlacement(model, disk, story); }},
  };

  // A run without faults: its sync points, and what each prompt loads once stored.
  uint64_t n_syncs = 0;
  {
    TempDir dir;
    FaultEnv env;
    auto disk = DiskTier::Open(StoreOptions(dir, &env));
    ASSERT_TRUE(disk.ok()) << disk.status().ToString();
    env.Reset();
    for (const Step& step : steps) {
      const Status status = step.run(**disk);
      ASSERT_TRUE(status.ok()) << status.ToString();
    }
    n_syncs = env.count(FaultOp::kSync);
    for (Prompt& p : prompts) {
      std::vector<float> logits;
      ASSERT_TRUE(RunPrompt(model, disk->get(), p.tokens, false, &p.n_loadable, &logits).ok());
      ASSERT_GE(p.n_loadable, 3 * kPageTokens);  // the test stores what it claims
      ASSERT_TRUE(logits == p.want);
    }
  }
  ASSERT_GT(n_syncs, steps.size());

  const uint64_t n_cuts = CampaignCuts();
  const uint32_t n_layers = model.config().geometry().n_layers;
  uint64_t n_pages_checked = 0, n_lost = 0, n_lost_durable = 0, n_mismatch = 0, n_changes = 0,
           n_corrupt_refused = 0, n_outputs = 0;
  uint64_t n_cut_in[3] = {0, 0, 0};
  std::set<uint64_t> points;
  for (uint64_t c = 0; c < n_cuts; ++c) {
    const uint64_t nth = n_cuts < n_syncs ? 1 + c * n_syncs / n_cuts : 1 + c % n_syncs;
    const uint64_t seed = testing::TestSeed() ^ (nth << 32) ^ (n_cuts < n_syncs ? 0 : c / n_syncs);
    SCOPED_TRACE("power cut at sync " + std::to_string(nth) + " of " + std::to_string(n_syncs) +
                 ", cut " + std::to_string(c));
    points.insert(nth);
    TempDir dir;
    FaultEnv env;
    std::vector<bool> durable(prompts.size(), false);
    {
      auto disk = DiskTier::Open(StoreOptions(dir, &env));
      ASSERT_TRUE(disk.ok()) << disk.status().ToString();
      env.Reset();
      env.CutPowerAtSync(nth, seed);
      for (const Step& step : steps) {
        const Status status = step.run(**disk);
        if (status.ok() && step.prompt >= 0) durable[step.prompt] = true;
        if (!status.ok()) {
          ASSERT_TRUE(env.crashed()) << status.ToString();
        }
        // A step may also end OK with the cut behind it: a placement run's context erases its
        // masters as it ends, and nothing reports a failed erase there.
        if (env.crashed()) {
          ++n_cut_in[step.kind];
          break;
        }
      }
    }
    ASSERT_TRUE(env.crashed());
    n_changes += env.n_changes_lost();
    std::vector<PageKey> first_keys;
    for (int round = 0; round < 2; ++round) {  // recovery is idempotent
      auto disk = DiskTier::Open(StoreOptions(dir, Env::Default()));
      ASSERT_TRUE(disk.ok()) << disk.status().ToString();
      auto check = (*disk)->Check();
      ASSERT_TRUE(check.ok()) << check.status().ToString();
      n_pages_checked += check->n_pages;
      n_lost += check->lost.size();
      std::vector<PageKey> keys = (*disk)->Keys();
      std::sort(keys.begin(), keys.end(), [](const PageKey& a, const PageKey& b) {
        return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
      });
      if (round == 0) first_keys = keys;
      EXPECT_TRUE(keys == first_keys) << "a second recovery found other pages";
      for (size_t i = 0; i < prompts.size(); ++i) {
        uint32_t n_loaded = 0;
        std::vector<float> logits;
        const Status run =
            RunPrompt(model, disk->get(), prompts[i].tokens, false, &n_loaded, &logits);
        ASSERT_TRUE(run.ok()) << run.ToString();
        ++n_outputs;
        if (!(logits == prompts[i].want)) ++n_mismatch;
        if (durable[i] && n_loaded < prompts[i].n_loadable)
          n_lost_durable += (prompts[i].n_loadable - n_loaded) / kPageTokens * n_layers;
      }
      n_corrupt_refused += (*disk)->stats().n_corrupt_reads;
    }
  }
  EXPECT_EQ(n_lost, 0u);
  EXPECT_EQ(n_lost_durable, 0u);
  EXPECT_EQ(n_mismatch, 0u);
  EXPECT_GT(n_changes, 0u);  // the cuts did lose or tear unsynced writes
  std::printf(
      "chaos power cuts: %llu at %zu of %llu sync points (%llu in prompt-cache writes, %llu in "
      "migrations, %llu in compaction); %llu pages checked, %llu lost, %llu durable lost, %llu of "
      "%llu outputs mismatching\n",
      static_cast<unsigned long long>(n_cuts), points.size(),
      static_cast<unsigned long long>(n_syncs), static_cast<unsigned long long>(n_cut_in[0]),
      static_cast<unsigned long long>(n_cut_in[1]), static_cast<unsigned long long>(n_cut_in[2]),
      static_cast<unsigned long long>(n_pages_checked), static_cast<unsigned long long>(n_lost),
      static_cast<unsigned long long>(n_lost_durable),
      static_cast<unsigned long long>(n_mismatch), static_cast<unsigned long long>(n_outputs));
  if (const char* path = std::getenv("ARGUS_CHAOS_JSON")) {
    nlohmann::json j = {
        {"power_cuts", n_cuts},
        {"sync_points", n_syncs},
        {"sync_points_cut", points.size()},
        {"cuts_in_prompt_cache_writes", n_cut_in[kPromptCacheWrite]},
        {"cuts_in_migrations", n_cut_in[kMigrations]},
        {"cuts_in_compaction", n_cut_in[kCompaction]},
        {"unsynced_changes_lost_or_torn", n_changes},
        {"recoveries", 2 * n_cuts},
        {"pages_checked", n_pages_checked},
        {"lost_pages", n_lost},
        {"lost_durable_pages", n_lost_durable},
        {"corrupt_reads_refused", n_corrupt_refused},
        {"torn_pages_served", n_mismatch},
        {"outputs_compared", n_outputs},
        {"mismatching_outputs", n_mismatch},
        {"seed", testing::TestSeed()},
    };
    std::ofstream(path) << j.dump(2) << "\n";
  }
}

}  // namespace
}  // namespace argus
