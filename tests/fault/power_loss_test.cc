// Power cuts at every sync point of a store's life (FaultEnv::CutPowerAtSync): writes not yet
// synced are lost, kept or torn, as a seeded power cut decides. After each cut the store must
// reopen; every page and record whose call returned OK before the cut (durable) must read back
// exactly, the call in flight may have happened or not, nothing torn is ever served, and
// recovery is idempotent (a second reopen finds the same). ARGUS_LONG_TESTS=1 runs 50 seeds per
// sync point instead of 4.
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "argus/store.h"
#include "crash/versioned_page.h"
#include "fault/fault_env.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::FaultEnv;
using testing::FaultOp;
using testing::PayloadVersion;
using testing::TempDir;
using testing::TestPageKey;
using testing::VersionedPayload;

// What may be stored under each page key and the record: a version, or nullopt for absent.
using State = std::map<uint64_t, std::optional<uint64_t>>;
constexpr uint64_t kRecordKey = 100;  // the named record "r", its version in its bytes
constexpr size_t kPageBytes[] = {3000, 700, 700, 7000};

std::vector<std::byte> RecordValue(uint64_t version) {
  const std::string text = "record version " + std::to_string(version);
  const auto bytes = std::as_bytes(std::span(text));
  return {bytes.begin(), bytes.end()};
}

struct Step {
  State changes;  // the state this step leaves, for the keys it touches
  std::function<Status(DiskTier&)> run;
};

Status PutPages(DiskTier& store, std::vector<std::pair<uint64_t, uint64_t>> pages) {
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PagePut> puts;
  for (const auto& [k, version] : pages)
    payloads.push_back(VersionedPayload(TestPageKey(k), version, kPageBytes[k]));
  for (size_t i = 0; i < pages.size(); ++i)
    puts.push_back({TestPageKey(pages[i].first), "t", payloads[i]});
  return store.Put(puts);
}

// Replacements, a batch, erasures, a record, a second slot size and a compaction.
std::vector<Step> Workload() {
  auto put = [](std::vector<std::pair<uint64_t, uint64_t>> pages) {
    Step s;
    for (const auto& [k, v] : pages) s.changes[k] = v;
    s.run = [pages](DiskTier& store) { return PutPages(store, pages); };
    return s;
  };
  auto erase = [](uint64_t k) {
    return Step{{{k, std::nullopt}}, [k](DiskTier& store) {
                  const PageKey key = TestPageKey(k);
                  return store.Erase(std::span<const PageKey>(&key, 1));
                }};
  };
  return {
      put({{0, 1}}),
      put({{1, 1}, {2, 1}}),
      put({{0, 2}}),
      erase(1),
      {{{kRecordKey, 1}}, [](DiskTier& store) { return store.PutRecord("r", RecordValue(1)); }},
      put({{3, 1}}),
      {{}, [](DiskTier& store) { return store.Compact(); }},
      put({{2, 2}, {3, 2}}),
      erase(0),
      {{{kRecordKey, 2}}, [](DiskTier& store) { return store.PutRecord("r", RecordValue(2)); }}};
}

DiskTierOptions Options(const TempDir& dir, Env* env) {
  DiskTierOptions o;
  o.dir = dir / "store";
  o.env = env;
  o.disk_budget_bytes = size_t{16} << 20;
  o.io = DiskIoBackend::kThreads;
  o.n_io_threads = 2;
  o.direct_io = false;
  return o;
}

// What each key holds now, "" when it is one of `allowed`, else what is wrong.
std::string Verify(DiskTier& store,
                   const std::map<uint64_t, std::set<std::optional<uint64_t>>>& allowed,
                   State& found) {
  for (const auto& [k, states] : allowed) {
    std::optional<uint64_t> got;
    if (k == kRecordKey) {
      auto value = store.GetRecord("r");
      if (value.ok()) {
        for (uint64_t v : {uint64_t{1}, uint64_t{2}})
          if (*value == RecordValue(v)) got = v;
        if (!got) return "the record holds bytes of no version";
      }
    } else if (store.Contains(TestPageKey(k))) {
      std::vector<std::byte> bytes(kPageBytes[k]);
      const Status read = store.Read(TestPageKey(k), bytes);
      if (!read.ok()) return "page " + std::to_string(k) + ": " + read.ToString();
      got = PayloadVersion(TestPageKey(k), bytes);
      if (!got) return "page " + std::to_string(k) + " served torn or foreign bytes";
    }
    if (!states.contains(got)) {
      return "key " + std::to_string(k) + " holds " + (got ? std::to_string(*got) : "nothing") +
             ", not what a durable or in-flight call left";
    }
    found[k] = got;
  }
  return "";
}

TEST(PowerLoss, EveryDurablePageSurvivesACutAtEverySyncAndNothingTornIsServed) {
  const std::vector<Step> steps = Workload();
  uint64_t n_syncs = 0;
  {
    TempDir dir;
    FaultEnv env;
    auto store = DiskTier::Open(Options(dir, &env));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    env.Reset();  // sync points are counted from the first step on
    for (const Step& step : steps) ASSERT_TRUE(step.run(**store).ok());
    n_syncs = env.count(FaultOp::kSync);
  }
  ASSERT_GT(n_syncs, steps.size());
  const char* long_mode = std::getenv("ARGUS_LONG_TESTS");
  const uint64_t n_seeds = long_mode && std::string(long_mode) == "1" ? 50 : 4;
  uint64_t n_cuts = 0, n_cuts_mid_step = 0, n_lost = 0;
  for (uint64_t nth = 1; nth <= n_syncs; ++nth) {
    for (uint64_t seed = 0; seed < n_seeds; ++seed) {
      SCOPED_TRACE("power cut at sync " + std::to_string(nth) + ", seed " + std::to_string(seed));
      TempDir dir;
      FaultEnv env;
      std::map<uint64_t, std::set<std::optional<uint64_t>>> allowed;
      for (uint64_t k : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, kRecordKey})
        allowed[k] = {std::nullopt};
      {
        auto store = DiskTier::Open(Options(dir, &env));
        ASSERT_TRUE(store.ok()) << store.status().ToString();
        env.Reset();
        env.CutPowerAtSync(nth, testing::TestSeed() ^ (nth << 32) ^ seed);
        for (const Step& step : steps) {
          const Status status = step.run(**store);
          for (const auto& [k, v] : step.changes) {
            if (status.ok()) allowed[k].clear();  // durable now: only the new state
            allowed[k].insert(v);
          }
          if (!status.ok()) {
            ASSERT_TRUE(env.crashed()) << status.ToString();
            ++n_cuts_mid_step;
            break;
          }
        }
      }
      ++n_cuts;
      n_lost += env.n_changes_lost();
      // The store's own recovery, twice: the second finds exactly what the first left.
      State first, second;
      for (State* found : {&first, &second}) {
        auto store = DiskTier::Open(Options(dir, Env::Default()));
        ASSERT_TRUE(store.ok()) << store.status().ToString();
        const std::string wrong = Verify(**store, allowed, *found);
        ASSERT_EQ(wrong, "");
        EXPECT_EQ((*store)->stats().n_lost_pages, 0u);
      }
      EXPECT_EQ(first, second);
    }
  }
  EXPECT_EQ(n_cuts_mid_step, n_cuts);  // every sync point was reached and cut
  EXPECT_GT(n_lost, 0u);               // the cuts did lose or tear unsynced writes
  std::printf("power cuts: %llu, %llu unsynced changes lost or torn; every durable page intact\n",
              static_cast<unsigned long long>(n_cuts), static_cast<unsigned long long>(n_lost));
}

}  // namespace
}  // namespace argus
