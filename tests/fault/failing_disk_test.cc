// A disk that keeps failing, and faults on the io_uring path.
//
// FailingDisk: from the Nth call of a kind on (write, sync, directory sync, read, truncate,
// rename, open), every such call fails, for every N the store's workload reaches. The store must
// give clear errors, keep serving the verified pages it holds (or fail their reads cleanly),
// never serve torn or foreign bytes, and after a failed sync (of a file or of the directory)
// refuse every write without touching the disk. Reopened on a healthy disk, every durable page
// is there.
//
// DiskTierUring: the disk tier reading through io_uring (the program's engine), with EIO, short
// reads, reads that stop at end of file and flipped bits injected into the kernel's completions
// (FaultEnv::UseNativeDescriptors): IOError or Corruption naming the file, never a wrong page.
#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "argus/store.h"
#include "crash/versioned_page.h"
#include "fault/fault_env.h"
#include "fault/store_workload.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::FaultEnv;
using testing::FaultOp;
using testing::FaultOpName;
using testing::PayloadVersion;
using testing::TempDir;
using testing::TestPageKey;
using testing::VersionedPayload;

// The workload, reading every key back between steps, on a disk that fails every call of `op`
// from the nth on (nth 0: never). Returns the number of calls of `op` made.
uint64_t RunOnFailingDisk(FaultOp op, uint64_t nth) {
  const std::vector<testing::WorkloadStep> steps = testing::StoreWorkload();
  TempDir dir;
  FaultEnv env;
  testing::AllowedStates allowed = testing::WorkloadStartStates();
  {
    auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", &env));
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return 0;
    env.Reset();
    if (nth > 0) env.FailFrom(op, nth);
    bool sync_failed = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i));
      const uint64_t n_writes = env.count(FaultOp::kWrite), n_syncs = env.count(FaultOp::kSync);
      const Status status = steps[i].run(**store);
      testing::ApplyWorkloadStep(steps[i], status.ok(), allowed);
      if (nth == 0) {
        EXPECT_TRUE(status.ok()) << status.ToString();
      }
      if (sync_failed) {
        // Refused up front: no write or sync reaches the disk after its sync failed.
        EXPECT_EQ(status.code(), StatusCode::kIOError);
        EXPECT_NE(status.message().find("refuses writes after a failed sync"), std::string::npos)
            << status.ToString();
        EXPECT_EQ(env.count(FaultOp::kWrite), n_writes);
        EXPECT_EQ(env.count(FaultOp::kSync), n_syncs);
      }
      if (!status.ok() && (op == FaultOp::kSync || op == FaultOp::kSyncDir) && env.fired()) {
        sync_failed = true;
      }
      // The pages it holds are still served exactly, or their reads fail cleanly.
      testing::WorkloadState found;
      EXPECT_EQ(testing::VerifyWorkload(**store, allowed, found, op == FaultOp::kRead), "");
    }
    EXPECT_EQ((*store)->stats().n_corrupt_reads, 0u);
  }
  const uint64_t n_calls = env.count(op);
  // The disk heals (a new one, the same bytes): every durable page and record is there.
  auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", Env::Default()));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return n_calls;
  testing::WorkloadState found;
  EXPECT_EQ(testing::VerifyWorkload(**store, allowed, found), "");
  EXPECT_EQ((*store)->stats().n_lost_pages, 0u);
  auto check = (*store)->Check();
  EXPECT_TRUE(check.ok() && check->ok());
  return n_calls;
}

TEST(FailingDisk, EveryCallFromTheNthOnFailsAndNoDurablePageIsLostNorWrongPageServed) {
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kSync, FaultOp::kSyncDir, FaultOp::kRead,
                     FaultOp::kTruncate, FaultOp::kRename, FaultOp::kOpen}) {
    const uint64_t n_calls = RunOnFailingDisk(op, 0);
    ASSERT_GT(n_calls, 0u) << FaultOpName(op);
    for (uint64_t nth = 1; nth <= n_calls; ++nth) {
      SCOPED_TRACE(std::string(FaultOpName(op)) + " fails from call " + std::to_string(nth) +
                   " of " + std::to_string(n_calls));
      RunOnFailingDisk(op, nth);
      if (HasFatalFailure()) return;
    }
  }
}

// A new slot file's directory entry is made durable by a directory sync; when that fails the
// file may vanish at a crash with the pages later published in it, so the store must refuse
// writes as after any failed sync (it used to retry and publish pages into the file).
TEST(FailingDisk, FailedDirectorySyncOfANewSlotFileRefusesLaterWrites) {
  TempDir dir;
  FaultEnv env;
  auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", &env));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  env.Reset();
  env.FailNth(FaultOp::kSyncDir, 1);
  const std::vector<std::byte> page = VersionedPayload(TestPageKey(1), 1, 3000);
  const Status first = (*store)->Put({TestPageKey(1), "t", page});
  EXPECT_EQ(first.code(), StatusCode::kIOError);
  ASSERT_TRUE(env.fired());
  const Status later = (*store)->Put({TestPageKey(1), "t", page});
  EXPECT_EQ(later.code(), StatusCode::kIOError);
  EXPECT_NE(later.message().find("refuses writes after a failed sync"), std::string::npos)
      << later.ToString();
  EXPECT_EQ(env.count(FaultOp::kWrite), 0u);
}

// A compaction's new journal failing its sync: the disk has shown it loses writes, so the store
// refuses writes from then on (it used to carry on appending to the old journal).
TEST(FailingDisk, FailedSyncOfTheCompactedJournalRefusesLaterWrites) {
  TempDir dir;
  FaultEnv env;
  auto store = DiskTier::Open(testing::BufferedStoreOptions(dir / "store", &env));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::vector<std::byte> page = VersionedPayload(TestPageKey(1), 1, 3000);
  ASSERT_TRUE((*store)->Put({TestPageKey(1), "t", page}).ok());
  env.Reset();
  env.FailNth(FaultOp::kSync, 1);
  EXPECT_EQ((*store)->Compact().code(), StatusCode::kIOError);
  ASSERT_TRUE(env.fired());
  const Status later = (*store)->PutRecord("r", page);
  EXPECT_NE(later.message().find("refuses writes after a failed sync"), std::string::npos)
      << later.ToString();
  std::vector<std::byte> got(page.size());
  ASSERT_TRUE((*store)->Read(TestPageKey(1), got).ok());  // reads continue
  EXPECT_EQ(got, page);
}

// ---- io_uring ---------------------------------------------------------------------------------

constexpr uint64_t kNumUringPages = 6;
size_t UringPageBytes(uint64_t k) { return k % 2 == 0 ? 3000 : 9000; }  // two slot sizes

struct UringStore {
  TempDir dir;
  FaultEnv env;
  std::unique_ptr<DiskTier> store;
  std::string skip;  // why io_uring cannot be tested here

  explicit UringStore(bool direct_io) {
    env.UseNativeDescriptors(true);
    DiskTierOptions o = testing::BufferedStoreOptions(dir / "store", &env);
    o.io = DiskIoBackend::kUring;
    o.direct_io = direct_io;
    auto opened = DiskTier::Open(o);
    if (!opened.ok() && opened.status().code() == StatusCode::kUnsupported) {
      skip = opened.status().ToString();
      return;
    }
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (!opened.ok()) return;
    store = std::move(opened).value();
    EXPECT_EQ(store->stats().io_backend.rfind("io_uring", 0), 0u) << store->stats().io_backend;
    for (uint64_t k = 0; k < kNumUringPages; ++k) {
      const std::vector<std::byte> page = VersionedPayload(TestPageKey(k), 1, UringPageBytes(k));
      EXPECT_TRUE(store->Put({TestPageKey(k), "t", page}).ok());
    }
  }

  // Reads every page in one batch: each is its exact bytes or an error whose code is `allowed`;
  // returns the number of errors.
  size_t ReadAll(StatusCode allowed) {
    std::vector<PageKey> keys;
    for (uint64_t k = 0; k < kNumUringPages; ++k) keys.push_back(TestPageKey(k));
    auto batch = store->ReadBatch(keys);
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch.ok()) return kNumUringPages;
    size_t n_errors = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto page = (*batch)->Get(i);
      if (page.ok()) {
        EXPECT_EQ(page->size(), UringPageBytes(i));
        EXPECT_TRUE(PayloadVersion(keys[i], *page) == std::optional<uint64_t>(1))
            << "page " << i << " served wrong bytes";
      } else {
        ++n_errors;
        EXPECT_EQ(page.status().code(), allowed) << page.status().ToString();
        EXPECT_NE(page.status().message().find("slots-"), std::string::npos)
            << "names no file: " << page.status().ToString();
      }
      (*batch)->Release(i);
    }
    return n_errors;
  }
};

#define ARGUS_URING_STORE(name, direct)                     \
  UringStore name(direct);                                  \
  if (!name.skip.empty()) GTEST_SKIP() << name.skip;        \
  ASSERT_TRUE(name.store != nullptr)

TEST(DiskTierUring, EioOnEveryCompletionIsIOErrorNamingTheFileAndNeverServesWrongPage) {
  for (bool direct : {true, false}) {
    ARGUS_URING_STORE(h, direct);
    h.env.Reset();
    ASSERT_EQ(h.ReadAll(StatusCode::kOk), 0u);
    const uint64_t n_reads = h.env.count(FaultOp::kRead);
    ASSERT_GE(n_reads, kNumUringPages);  // every page's read completed through the filter
    for (uint64_t nth = 1; nth <= n_reads; ++nth) {
      SCOPED_TRACE("EIO on completion " + std::to_string(nth) + (direct ? ", O_DIRECT" : ""));
      h.env.Reset();
      h.env.FailNth(FaultOp::kRead, nth, EIO);
      EXPECT_EQ(h.ReadAll(StatusCode::kIOError), 1u);
      EXPECT_TRUE(h.env.fired());
    }
    h.env.Reset();
    EXPECT_EQ(h.ReadAll(StatusCode::kOk), 0u);  // the engine and the store carry on
    EXPECT_EQ(h.store->stats().n_lost_pages, 0u);  // an I/O error loses no page
  }
}

TEST(DiskTierUring, ShortCompletionsAreContinuedAndEndOfFileIsCorruption) {
  ARGUS_URING_STORE(h, false);
  for (uint64_t nth = 1; nth <= kNumUringPages; ++nth) {
    SCOPED_TRACE("completion " + std::to_string(nth));
    h.env.Reset();
    h.env.ShortNth(FaultOp::kRead, nth, 100);  // the rest is read by a continuation
    EXPECT_EQ(h.ReadAll(StatusCode::kOk), 0u);
    EXPECT_TRUE(h.env.fired());
    EXPECT_EQ(h.env.count(FaultOp::kRead), kNumUringPages + 1);
    h.env.Reset();
    h.env.ShortNth(FaultOp::kRead, nth, 0);  // a completion of 0 bytes: end of file
    EXPECT_EQ(h.ReadAll(StatusCode::kCorruption), 1u);
    EXPECT_TRUE(h.env.fired());
  }
}

TEST(DiskTierUring, FlippedBitInEveryCompletionIsCorruptionAndCounted) {
  ARGUS_URING_STORE(h, true);
  for (uint64_t nth = 1; nth <= kNumUringPages; ++nth) {
    SCOPED_TRACE("flip in completion " + std::to_string(nth));
    h.env.Reset();
    h.env.FlipNth(nth);
    EXPECT_EQ(h.ReadAll(StatusCode::kCorruption), 1u);
    EXPECT_EQ(h.store->stats().n_corrupt_reads, nth);
  }
}

TEST(DiskTierUring, DiskThatKeepsFailingReadsFailsEveryLaterReadAndRecovers) {
  ARGUS_URING_STORE(h, true);
  h.env.Reset();
  h.env.FailFrom(FaultOp::kRead, 3, EIO);
  EXPECT_EQ(h.ReadAll(StatusCode::kIOError), kNumUringPages - 2);
  EXPECT_EQ(h.ReadAll(StatusCode::kIOError), kNumUringPages);
  EXPECT_EQ(h.env.n_fired(), 2 * kNumUringPages - 2);
  // Writes do not read: the store still takes pages while its reads fail.
  const std::vector<std::byte> page = VersionedPayload(TestPageKey(0), 1, UringPageBytes(0));
  EXPECT_TRUE(h.store->Put({TestPageKey(0), "t", page}).ok());
  h.env.Reset();
  EXPECT_EQ(h.ReadAll(StatusCode::kOk), 0u);
  EXPECT_EQ(h.store->stats().n_lost_pages, 0u);
}

}  // namespace
}  // namespace argus
