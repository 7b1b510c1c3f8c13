// Power cuts at every sync point of a store's life (FaultEnv::CutPowerAtSync): writes not yet
// synced are lost, kept or torn, as a seeded power cut decides. After each cut the store must
// reopen; every page and record whose call returned OK before the cut (durable) must read back
// exactly, the call in flight may have happened or not, nothing torn is ever served, and
// recovery is idempotent (a second reopen finds the same). ARGUS_LONG_TESTS=1 runs 50 seeds per
// sync point instead of 4.
#include <cstdlib>
#include <string>
#include <vector>

#include "argus/store.h"
#include "fault/fault_env.h"
#include "fault/store_workload.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::FaultEnv;
using testing::FaultOp;
using testing::TempDir;
using testing::WorkloadState;
using testing::WorkloadStep;

TEST(PowerLoss, EveryDurablePageSurvivesACutAtEverySyncAndNothingTornIsServed) {
  const std::vector<WorkloadStep> steps = testing::StoreWorkload();
  uint64_t n_syncs = 0;
  {
    TempDir dir;
    FaultEnv env;
    auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", &env));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    env.Reset();  // sync points are counted from the first step on
    for (const WorkloadStep& step : steps) ASSERT_TRUE(step.run(**store).ok());
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
      testing::AllowedStates allowed = testing::WorkloadStartStates();
      {
        auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", &env));
        ASSERT_TRUE(store.ok()) << store.status().ToString();
        env.Reset();
        env.CutPowerAtSync(nth, testing::TestSeed() ^ (nth << 32) ^ seed);
        for (const WorkloadStep& step : steps) {
          const Status status = step.run(**store);
          testing::ApplyWorkloadStep(step, status.ok(), allowed);
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
      WorkloadState first, second;
      for (WorkloadState* found : {&first, &second}) {
        auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", Env::Default()));
        ASSERT_TRUE(store.ok()) << store.status().ToString();
        const std::string wrong = testing::VerifyWorkload(**store, allowed, *found);
        ASSERT_EQ(wrong, "");
        EXPECT_EQ((*store)->stats().n_lost_pages, 0u);
      }
      EXPECT_EQ(first, second);
    }
  }
  EXPECT_EQ(n_cuts_mid_step, n_cuts);  // every sync point was reached and cut
  EXPECT_GT(n_lost, 0u);               // the cuts did lose or tear unsynced writes
}

}  // namespace
}  // namespace argus
