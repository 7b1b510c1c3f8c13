// The placement engine and its planner: budgets kept under random workloads, exact output with
// masters on disk, inactivity below the high-water mark, promotion of a page that turns hot.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "argus/core.h"
#include "argus/eval.h"
#include "argus/policy.h"
#include "cache/placement_access.h"
#include "policy/planner.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::TempDir;

constexpr uint32_t kPageTokens = 16;

std::unique_ptr<DiskTier> OpenDisk(
    const std::string& dir, size_t staging_budget_bytes = DiskTierOptions{}.staging_budget_bytes) {
  DiskTierOptions o;
  o.dir = dir;
  o.disk_budget_bytes = size_t{256} << 20;
  o.staging_budget_bytes = staging_budget_bytes;
  auto disk = DiskTier::Open(o);
  EXPECT_TRUE(disk.ok()) << disk.status().ToString();
  return disk.ok() ? std::move(disk).value() : nullptr;
}

// A cache of the small geometry with a disk tier (or none) under a RAM budget.
std::unique_ptr<KvCache> SmallCache(size_t ram_budget_bytes, DiskTier* disk,
                                    const CacheGeometry& g = {2, 4, 2, 64},
                                    uint32_t page_tokens = kPageTokens) {
  CacheOptions co;
  co.geometry = g;
  co.page_tokens = page_tokens;
  co.ram_budget_bytes = ram_budget_bytes;
  co.disk = disk;
  auto cache = KvCache::Create(co);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

Trace SmallTrace(TraceKind kind, uint64_t seed = 1, uint32_t steps = 24) {
  TraceOptions o;
  o.kind = kind;
  o.geometry = {2, 4, 2, 64};
  o.n_prefix_tokens = 512;
  o.n_steps = steps;
  o.seed = seed;
  o.recent_tokens = 32;
  o.recall_period = 4;
  o.needle_period = 4;
  auto trace = GenerateTrace(o);
  EXPECT_TRUE(trace.ok()) << trace.status().ToString();
  return trace.ok() ? std::move(trace).value() : Trace{};
}

// A built-in profile with pins that suit 16-token pages.
Profile SmallProfile(const std::string& name) {
  auto p = Profile::BuiltIn(name);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  Profile profile = p.ok() ? *p : Profile{};
  profile.pin_sinks = 4;
  profile.pin_recent = 16;
  profile.replan_every = 4;
  return profile;
}

ReplayResult ReplayWith(const Trace& trace, ThreadPool& pool, const Profile* profile,
                        double fraction, DiskTier* disk, const std::vector<float>* reference,
                        bool background = true) {
  ReplayOptions o;
  o.pool = &pool;
  o.page_tokens = kPageTokens;
  o.keep_outputs = true;
  o.reference = reference;
  o.disk = disk;
  o.engine = profile != nullptr;
  if (profile != nullptr) o.placement.profile = *profile;
  o.placement.background = background;
  if (fraction > 0) {
    CacheOptions co;
    co.geometry = trace.options.geometry;
    co.page_tokens = kPageTokens;
    o.ram_budget_bytes = static_cast<size_t>(
        fraction * static_cast<double>(*KvCache::RequiredRamBytes(co, trace.n_tokens())));
  }
  auto result = Replay(trace, o);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : ReplayResult{};
}

TEST(Placement, ExactProfileWithMastersOnDiskIsBitIdenticalToAllInRam) {
  ThreadPool pool(2);
  for (TraceKind kind : {TraceKind::kRecency, TraceKind::kRecall, TraceKind::kNeedle}) {
    const Trace trace = SmallTrace(kind);
    const ReplayResult reference = ReplayWith(trace, pool, nullptr, 0, nullptr, nullptr);
    const Profile exact = SmallProfile("exact");
    for (double fraction : {0.5, 0.25}) {
      for (bool background : {true, false}) {
        TempDir dir;
        auto disk = OpenDisk(dir.path());
        ASSERT_NE(disk, nullptr);
        const ReplayResult r =
            ReplayWith(trace, pool, &exact, fraction, disk.get(), &reference.outputs, background);
        EXPECT_TRUE(r.placement.active);
        EXPECT_GT(r.cache.n_disk_pages, 0u) << "pages should have gone to disk";
        EXPECT_EQ(r.outputs, reference.outputs)
            << TraceKindName(kind) << " at " << fraction << ", background " << background;
        EXPECT_EQ(r.max_rel_error, 0.0);
      }
    }
  }
}

TEST(Placement, BelowTheHighWaterMarkNothingChanges) {
  ThreadPool pool(2);
  const Trace trace = SmallTrace(TraceKind::kRecall);
  const ReplayResult reference = ReplayWith(trace, pool, nullptr, 0, nullptr, nullptr);
  const Profile research = SmallProfile("research");
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  const ReplayResult r = ReplayWith(trace, pool, &research, 2.0, disk.get(), &reference.outputs);
  EXPECT_FALSE(r.placement.active);
  EXPECT_EQ(r.placement.n_demotions + r.placement.n_promotions, 0u);
  EXPECT_EQ(r.outputs, reference.outputs);
}

TEST(Placement, HysteresisKeepsTheLadderActiveBetweenTheRatios) {
  ThreadPool pool(1);
  CacheOptions co;
  co.geometry = {2, 4, 2, 64};
  co.page_tokens = kPageTokens;
  const size_t per_token = *KvCache::RequiredRamBytes(co, 1024) / 1024;
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = SmallCache(1000 * per_token, disk.get());
  ASSERT_NE(cache, nullptr);
  PlacementOptions po;
  po.profile = SmallProfile("research");  // activate 0.9, deactivate 0.7
  auto engine = PlacementEngine::Create(*cache, pool, po);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const SeqId seq = *cache->CreateSequence();
  struct Case {
    uint32_t tokens;
    bool active;
  };
  // 800 tokens: 0.8 of the budget, below the activation ratio; 950: above; 800 again: stays
  // active (above deactivate); 600: below deactivate.
  for (Case c : {Case{800, false}, Case{950, true}, Case{800, true}, Case{600, false}}) {
    ASSERT_TRUE((*engine)->BeginRequest(seq, c.tokens).ok());
    EXPECT_EQ((*engine)->stats().active, c.active) << c.tokens << " tokens";
  }
}

TEST(Placement, BudgetTooSmallForThePinsIsAnErrorNamingThem) {
  ThreadPool pool(1);
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = SmallCache(4096, disk.get());
  ASSERT_NE(cache, nullptr);
  PlacementOptions po;
  po.profile = SmallProfile("research");
  auto engine = PlacementEngine::Create(*cache, pool, po);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("pins"), std::string::npos) << engine.status().message();
}

TEST(Placement, ProfileWithDiskStatesNeedsADiskTier) {
  ThreadPool pool(1);
  auto cache = SmallCache(size_t{64} << 20, nullptr);
  ASSERT_NE(cache, nullptr);
  PlacementOptions po;
  po.profile = SmallProfile("exact");
  auto engine = PlacementEngine::Create(*cache, pool, po);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("disk tier"), std::string::npos);
}

// Random traces, profiles, budgets and modes: after every step the RAM in use is within the
// budget and the disk within its own; nothing fails.
TEST(Placement, RandomWorkloadsKeepEveryBudget) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  const char* profiles[] = {"exact", "balanced", "research", "capacity", "cascade"};
  for (int round = 0; round < 6; ++round) {
    const auto kind = static_cast<TraceKind>(rng() % 3);
    const Trace trace = SmallTrace(kind, rng(), 20);
    const Profile profile = SmallProfile(profiles[rng() % 5]);
    const double fraction = 0.2 + 0.6 * static_cast<double>(rng() % 1000) / 1000.0;
    const bool background = rng() % 2 == 0;
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " round " << round << ": " << TraceKindName(kind) << ", "
                 << profile.name << " at " << fraction << ", background " << background);
    TempDir dir;
    DiskTierOptions d;
    d.dir = dir.path();
    d.disk_budget_bytes = size_t{8} << 20;
    auto disk = DiskTier::Open(d);
    ASSERT_TRUE(disk.ok());
    CacheOptions co;
    co.geometry = trace.options.geometry;
    co.page_tokens = kPageTokens;
    co.disk = disk->get();
    co.ram_budget_bytes = static_cast<size_t>(
        fraction * static_cast<double>(*KvCache::RequiredRamBytes(co, trace.n_tokens())));
    auto cache = KvCache::Create(co);
    ASSERT_TRUE(cache.ok());
    PlacementOptions po;
    po.profile = profile;
    po.background = background;
    auto engine = PlacementEngine::Create(**cache, pool, po);
    if (!engine.ok()) {
      // Only a budget below the pins may refuse.
      EXPECT_NE(engine.status().message().find("pins"), std::string::npos)
          << engine.status().message();
      continue;
    }
    PlacementEngine& e = **engine;
    const SeqId seq = *(*cache)->CreateSequence();
    ASSERT_TRUE(e.BeginRequest(seq, trace.n_tokens()).ok());
    const CacheGeometry& g = trace.options.geometry;
    auto append = [&](uint32_t layer, uint32_t first, uint32_t n) {
      std::vector<float> k, v;
      for (uint16_t h : trace.K(layer, first, n)) k.push_back(HalfToFloat(h));
      for (uint16_t h : trace.V(layer, first, n)) v.push_back(HalfToFloat(h));
      return e.Append(layer, k, v);
    };
    auto check_budgets = [&] {
      const CacheStats s = (*cache)->stats();
      EXPECT_LE(s.ram.used_bytes, s.ram.budget_bytes);
      EXPECT_LE(s.disk.used_bytes, s.disk.budget_bytes);
    };
    for (uint32_t first = 0; first < trace.options.n_prefix_tokens; first += 100) {
      const uint32_t n = std::min(100u, trace.options.n_prefix_tokens - first);
      for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
        ASSERT_TRUE(append(layer, first, n).ok());
        check_budgets();
      }
    }
    std::vector<float> out(size_t{g.n_q_heads} * g.head_dim);
    for (uint32_t step = 0; step < trace.options.n_steps; ++step) {
      for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
        ASSERT_TRUE(append(layer, trace.options.n_prefix_tokens + step, 1).ok());
        auto s = e.Decode(layer, trace.Q(step, layer).data(), out.data());
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        check_budgets();
      }
      ASSERT_TRUE(e.EndStep().ok());
      check_budgets();
    }
    ASSERT_TRUE(e.Drain().ok());
    check_budgets();
    EXPECT_EQ(e.stats().last_error, "");
  }
}

TEST(Placement, RecalledPageIsPromotedFromItsMasterAndServedExact) {
  ThreadPool pool(2);
  const Trace trace = SmallTrace(TraceKind::kNeedle);
  const ReplayResult reference = ReplayWith(trace, pool, nullptr, 0, nullptr, nullptr);
  Profile research = SmallProfile("research");
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  const ReplayResult r = ReplayWith(trace, pool, &research, 0.5, disk.get(), &reference.outputs);
  EXPECT_TRUE(r.placement.active);
  EXPECT_GT(r.placement.n_promotions, 0u);
  EXPECT_GT(r.placement.promoted_bytes_read, 0u);
  EXPECT_GT(r.placement.n_demotions, 0u);
  EXPECT_EQ(r.n_targets_found, r.n_target_steps);
  EXPECT_GT(r.placement.n_promotions_on_demand, 0u);
  // Needle steps are served from the needle page's exact master: their error is the other
  // pages' codec error only, which is smaller than serving the needle lossy.
  ASSERT_EQ(r.step_errors.size(), trace.options.n_steps);
  for (uint32_t step = 0; step < trace.options.n_steps; ++step) {
    if (trace.target[step] < 0) continue;
    EXPECT_LT(r.step_errors[step], 0.2) << "step " << step;
  }
}

// The exact profile with one lossy RAM state inserted, replayed under half the exact cache's
// budget with disk time shares of none, unbounded, and unbounded without masters.
struct ShareRuns {
  ReplayResult none, unbounded, unbounded_without_masters;
};

ShareRuns ReplayWithDiskShares(const LadderState& lossy) {
  ThreadPool pool(2);
  const Trace trace = SmallTrace(TraceKind::kRecall);
  const ReplayResult reference = ReplayWith(trace, pool, nullptr, 0, nullptr, nullptr);
  Profile profile = SmallProfile("exact");
  profile.ladder.insert(profile.ladder.begin() + 1, lossy);
  ShareRuns runs;
  ReplayResult* out[3] = {&runs.none, &runs.unbounded, &runs.unbounded_without_masters};
  const double shares[3] = {0.0, 1e30, 1e30};
  for (int i = 0; i < 3; ++i) {
    TempDir dir;
    auto disk = OpenDisk(dir.path());
    EXPECT_NE(disk, nullptr);
    if (disk == nullptr) return runs;
    ReplayOptions o;
    o.pool = &pool;
    o.page_tokens = kPageTokens;
    o.reference = &reference.outputs;
    o.disk = disk.get();
    o.placement.profile = profile;
    if (i == 2) o.placement.profile.masters = MasterRule::kNever;
    o.placement.background = false;
    o.placement.disk_time_share = shares[i];
    CacheOptions co;
    co.geometry = trace.options.geometry;
    co.page_tokens = kPageTokens;
    o.ram_budget_bytes = *KvCache::RequiredRamBytes(co, trace.n_tokens()) / 2;
    auto r = Replay(trace, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return runs;
    *out[i] = std::move(r).value();
    EXPECT_GT(out[i]->placement.step_seconds, 0.0);
  }
  return runs;
}

// A sketch (jl keys), and a 2-bit state (int2 keys and values, priced over the sketch price),
// under a budget too small for every page in f16: with no time share for disk reads the plan
// fills RAM with them; with an unbounded share they are served exact from disk instead.
TEST(Placement, SketchedPagesAreServedFromDiskWithinTheTimeShare) {
  for (const LadderState& sketch :
       {LadderState{"jl", "int2:token"}, LadderState{"int2:channel", "int2:token"}}) {
    SCOPED_TRACE(sketch.k_codec + "/" + sketch.v_codec);
    const ShareRuns runs = ReplayWithDiskShares(sketch);
    const std::vector<size_t>& none = runs.none.placement.pages_per_state;
    const std::vector<size_t>& all = runs.unbounded.placement.pages_per_state;
    ASSERT_EQ(none.size(), 3u);
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(runs.none.placement.n_disk_pages_allowed, 0u);
    EXPECT_GT(none[1], 0u) << "the budget should need the sketch state";
    EXPECT_EQ(none[2], 0u) << "no time share: no page should be on disk";
    EXPECT_EQ(all[1], 0u) << "an unbounded share leaves no page sketched";
    EXPECT_GT(all[2], 0u);
    // Plans made before a step was timed (the prefix) may sketch; by the last step every page
    // is exact, in RAM or on disk.
    ASSERT_FALSE(runs.unbounded.step_errors.empty());
    EXPECT_EQ(runs.unbounded.step_errors.back(), 0.0);
    EXPECT_GT(runs.none.step_errors.back(), 1e-2);
    EXPECT_GT(runs.unbounded.disk_bytes_read, runs.none.disk_bytes_read);
    EXPECT_EQ(runs.unbounded_without_masters.placement.n_disk_pages_allowed, 0u);
    EXPECT_EQ(runs.unbounded_without_masters.placement.pages_per_state, none)
        << "without masters nothing goes to disk";
  }
}

// With a skipping epsilon an attention call holds all of its layer's disk pages at once: the plan
// sends no more of a layer's pages to disk than the disk tier's staging holds, where an
// unbounded time share alone would send them all (and attention would refuse the call).
TEST(Placement, ALayersDiskPagesFitWhatItsAttentionCallCanStage) {
  ThreadPool pool(2);
  const Trace trace = SmallTrace(TraceKind::kRecall);
  Profile profile = SmallProfile("exact");
  profile.ladder.insert(profile.ladder.begin() + 1, LadderState{"int2:channel", "int2:token"});
  profile.epsilon = 1e-3;
  const CacheGeometry& g = trace.options.geometry;
  const size_t page_bytes = size_t{kPageTokens} * g.n_kv_heads * g.head_dim * 2 * sizeof(uint16_t);
  TempDir probe_dir, dir;
  auto probe = OpenDisk(probe_dir.path());
  ASSERT_NE(probe, nullptr);
  constexpr size_t kStagedPages = 2;
  auto disk = OpenDisk(dir.path(), kStagedPages * probe->SlotBytes(page_bytes));
  ASSERT_NE(disk, nullptr);
  ReplayOptions o;
  o.pool = &pool;
  o.page_tokens = kPageTokens;
  o.disk = disk.get();
  o.placement.profile = profile;
  o.placement.background = false;
  o.placement.disk_time_share = 1e30;
  CacheOptions co;
  co.geometry = g;
  co.page_tokens = kPageTokens;
  o.ram_budget_bytes = *KvCache::RequiredRamBytes(co, trace.n_tokens()) / 2;
  auto r = Replay(trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<size_t>& per_state = r->placement.pages_per_state;
  ASSERT_EQ(per_state.size(), 3u);
  EXPECT_GT(per_state[1], 0u) << "the staging should leave pages in the 2-bit state";
  EXPECT_GT(per_state[2], 0u);
  EXPECT_LE(per_state[2], kStagedPages * g.n_layers);
}

// The disk rate a plan's time share is weighed at is measured as attention reads: a batch of
// about 1 MiB of pages issued together (16 pages of 8 KiB here), or as many as the staging holds,
// best of three batches; the probe's pages are erased.
TEST(Placement, TheDiskIsProbedWithABatchOfPagesAsAttentionReadsThem) {
  ThreadPool pool(2);
  const CacheGeometry g{2, 4, 2, 64};
  const size_t page_bytes = size_t{kPageTokens} * g.n_kv_heads * g.head_dim * 2 * sizeof(uint16_t);
  TempDir probe_dir;
  auto probe = OpenDisk(probe_dir.path());
  ASSERT_NE(probe, nullptr);
  const size_t slot_bytes = probe->SlotBytes(page_bytes);
  for (const auto& [staging, n_pages] :
       {std::pair<size_t, uint64_t>{DiskTierOptions{}.staging_budget_bytes, 16},
        std::pair<size_t, uint64_t>{3 * slot_bytes, 3}}) {
    TempDir dir;
    auto disk = OpenDisk(dir.path(), staging);
    ASSERT_NE(disk, nullptr);
    auto cache = SmallCache(size_t{1} << 20, disk.get(), g);
    ASSERT_NE(cache, nullptr);
    PlacementOptions o;
    o.profile = SmallProfile("exact");
    o.background = false;
    auto engine = PlacementEngine::Create(*cache, pool, o);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const DiskTierStats stats = disk->stats();
    EXPECT_EQ(stats.n_writes, n_pages);
    EXPECT_EQ(stats.n_reads, 3 * n_pages);
    EXPECT_EQ(stats.n_pages, 0u);
    EXPECT_GT((*engine)->stats().disk_read_gbps, 0.0);
  }
}

// A 4-bit state is priced under the sketch price: its pages stay in RAM whatever the share.
TEST(Placement, FourBitPagesAreNotTradedForDiskReads) {
  const ShareRuns runs = ReplayWithDiskShares({"int4:channel", "int4:token"});
  const std::vector<size_t>& all = runs.unbounded.placement.pages_per_state;
  ASSERT_EQ(all.size(), 3u);
  EXPECT_GT(all[1], 0u);
  EXPECT_EQ(all[2], 0u);
  EXPECT_EQ(runs.unbounded.placement.pages_per_state, runs.none.placement.pages_per_state);
}

TEST(Placement, DiskTimeShareMustBeFiniteAndNotNegative) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = SmallCache(size_t{1} << 20, disk.get());
  ASSERT_NE(cache, nullptr);
  ThreadPool pool(1);
  for (double share :
       {-0.5, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    PlacementOptions po;
    po.profile = SmallProfile("exact");
    po.disk_time_share = share;
    auto engine = PlacementEngine::Create(*cache, pool, po);
    ASSERT_FALSE(engine.ok()) << share;
    EXPECT_NE(engine.status().message().find("disk_time_share"), std::string::npos)
        << engine.status().ToString();
  }
}

// Keys of the sink token and one hot page align with the query; every token of a cold page has
// the page's small key, so the key summaries prove the cold pages irrelevant. With the exact
// profile, epsilon 1e-3 and a budget that sends the cold pages to disk, the skipped disk pages
// are neither read nor promoted.
TEST(Placement, CertifiedSkippingNeitherReadsNorPromotesColdDiskPages) {
  const uint32_t page = 16, n_pages = 12, n_tokens = n_pages * page + 4, hot = 5;
  const CacheGeometry g{1, 8, 2, 64};
  std::vector<float> k(size_t{n_tokens} * 2 * 64), v = testing::RandomValues(k.size(), 7);
  std::vector<float> q(size_t{8} * 64);
  for (uint32_t h = 0; h < 2; ++h) {
    const std::vector<float> dir = testing::RandomValues(64, 11 + h);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      const std::vector<float> key = t == 0 || t / page == hot
                                         ? dir
                                         : testing::RandomValues(64, 100 + t / page * 2 + h, 0.05f);
      std::copy(key.begin(), key.end(), k.begin() + (size_t{t} * 2 + h) * 64);
    }
    for (uint32_t i = 0; i < 4 * 64; ++i) q[h * 4 * 64 + i] = 2.0f * dir[i % 64];
  }
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  const size_t page_bytes = size_t{page} * 2 * 64 * 2 * 2;
  auto cache = SmallCache(6 * page_bytes, disk.get(), g, page);
  ASSERT_NE(cache, nullptr);
  ThreadPool pool(2);
  PlacementOptions po;
  po.profile = SmallProfile("exact");
  po.profile.pin_sinks = 1;
  po.profile.epsilon = 1e-3;
  po.background = false;
  auto engine = PlacementEngine::Create(*cache, pool, po);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  PlacementEngine& e = **engine;
  const SeqId seq = *cache->CreateSequence();
  ASSERT_TRUE(e.BeginRequest(seq, n_tokens).ok());
  ASSERT_TRUE(e.Append(0, k, v).ok());
  ASSERT_TRUE(e.Drain().ok());
  const size_t n_disk = cache->stats().n_disk_pages;
  ASSERT_GT(n_disk, 2u);
  const std::vector<TierKind> tier_before = PageTableOf(*cache).tier;
  std::vector<float> out(q.size());
  auto s = e.Decode(0, q.data(), out.data());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(e.EndStep().ok());
  EXPECT_GT(s->n_tiles_skipped, 0u);
  EXPECT_LE(s->skipped_mass_bound, 1e-3);
  EXPECT_LT(s->disk_bytes_read, n_disk * page_bytes) << "skipped disk pages are not read";
  // Only the hot page, if it had gone to disk, may come back; every skipped page stays there.
  EXPECT_LE(e.stats().n_promotions, 1u);
  const PageTable& t = PageTableOf(*cache);
  for (const SkippedTile& tile : s->skipped) {
    if (t.first_token[tile.page] / page == hot) ADD_FAILURE() << "the hot page was skipped";
  }
  size_t skipped_on_disk = 0;
  for (const SkippedTile& tile : s->skipped) {
    if (tier_before[tile.page] != TierKind::kDisk) continue;
    ++skipped_on_disk;
    EXPECT_EQ(t.tier[tile.page], TierKind::kDisk) << "page " << tile.page << " was promoted";
  }
  EXPECT_GT(skipped_on_disk, 0u);
}

TEST(Planner, FitsTheBudgetAndUpgradesTheMostValuablePagesFirst) {
  using policy_internal::PlanPage;
  using policy_internal::PlanState;
  const std::vector<PlanState> states = {{100, 0.0}, {30, 0.1}, {10, 0.5}, {0, 10.0}};
  std::vector<PlanPage> pages(6);
  for (size_t i = 0; i < pages.size(); ++i) {
    pages[i].value = 1.0 + static_cast<double>(i);  // page 5 the hottest
    pages[i].best = 0;
    pages[i].cheapest = 3;
  }
  pages[0].best = pages[0].cheapest = 0;  // pinned
  // Gains per byte: off disk 0.95 v, to state 1 0.02 v, to state 0 0.0014 v. So every page
  // leaves the disk (150 bytes with the pin), then every page reaches state 1 (250), and the
  // last 70 bytes lift only the hottest page to state 0.
  const std::vector<uint32_t> plan = policy_internal::PlanStates(states, pages, 320);
  size_t used = 0;
  for (uint32_t s : plan) used += states[s].ram_bytes;
  EXPECT_EQ(used, 320u);
  EXPECT_EQ(plan, (std::vector<uint32_t>{0, 1, 1, 1, 1, 0}));
  // One byte less: the hottest page cannot be lifted and nothing else changes.
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 319),
            (std::vector<uint32_t>{0, 1, 1, 1, 1, 1}));
  // Too little for coverage: the coldest pages stay on disk.
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 130),
            (std::vector<uint32_t>{0, 3, 3, 2, 2, 2}));
}

TEST(Planner, SketchedPagesGiveWayToDiskColdestFirstAndNoMoreThanNeeded) {
  using policy_internal::PlanPage;
  using policy_internal::PlanState;
  const std::vector<PlanState> states = {
      {100, 0.0}, {30, 0.1}, {10, 2.0, /*sketch=*/true}, {0, 1002.0, false, /*disk=*/true}};
  std::vector<PlanPage> pages(6);
  for (size_t i = 0; i < pages.size(); ++i) {
    pages[i].value = 1.0 + static_cast<double>(i);  // page 0 the coldest
    pages[i].cheapest = 3;
  }
  // 100 bytes: every page leaves the disk for the sketch (60), then the two hottest reach
  // state 1 (20 each).
  const std::vector<uint32_t> sketched = {2, 2, 2, 2, 1, 1};
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100), sketched);
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100, 0), sketched);
  // An allowance of two disk pages: the two coldest go there, and their 20 bytes lift one more.
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100, 2),
            (std::vector<uint32_t>{3, 3, 2, 1, 1, 1}));
  // Unbounded: three pages on disk leave room for every other page in state 1; a fourth would
  // be a read for nothing.
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100, 1000),
            (std::vector<uint32_t>{3, 3, 3, 1, 1, 1}));
  // A page held above the disk (a layer override) stays in RAM, sketched or better.
  pages[0].cheapest = 2;
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100, 1000),
            (std::vector<uint32_t>{1, 3, 3, 3, 1, 1}));
  // Pages the budget already sends to disk count against the allowance.
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 30, 2),
            policy_internal::PlanStates(states, pages, 30));
  // One disk page per layer (what one attention call can stage), pages 0-2 in layer 0 and 3-5
  // in layer 1: the coldest of each layer goes, and the sketched page 1 stays.
  pages[0].cheapest = 3;
  for (size_t i = 0; i < pages.size(); ++i) pages[i].layer = i < 3 ? 0 : 1;
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100, 1000, 1),
            (std::vector<uint32_t>{3, 2, 1, 3, 1, 1}));
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 100, 1000, 3),
            (std::vector<uint32_t>{3, 3, 3, 1, 1, 1}));
}

TEST(Planner, FreeUpgradesAreTakenEvenWithNoBudget) {
  using policy_internal::PlanPage;
  using policy_internal::PlanState;
  // A ladder whose second state costs no more than the third (same bytes, less error).
  const std::vector<PlanState> states = {{50, 0.0}, {10, 0.1}, {10, 0.5}};
  const std::vector<PlanPage> pages = {{1.0, 0, 2}};
  EXPECT_EQ(policy_internal::PlanStates(states, pages, 10), std::vector<uint32_t>{1});
}

}  // namespace
}  // namespace argus
