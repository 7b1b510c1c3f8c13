// The disk tier survives SIGKILL at any instant. A forked child writes and publishes pages in a
// loop (batches of new keys and replacements, and erases) and reports every operation that
// returned OK through a pipe; the parent kills it at a random moment, reopens the store and
// checks that every reported operation is there, the one in flight is all old or all new, no
// page is torn or lost, and Check() passes. Each cycle continues on the same store, so recovery
// after recovery is exercised.
//
// 20 kills per run; ARGUS_LONG_TESTS=1 makes it 200 (the long mode).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "argus/store.h"
#include "crash/versioned_page.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::PayloadVersion;
using testing::TestPageKey;
using testing::VersionedPayload;

constexpr uint32_t kNumKeys = 48;
constexpr uint64_t kReadyRecord = UINT64_MAX;  // the child opened the store
constexpr uint64_t kMaxChildOps = 1'000'000;   // a bound in case no kill ever comes

// What the store should hold: key index -> version of its live page. The version of every page
// an operation writes is the operation's index, so versions grow and never repeat.
using KeyVersions = std::map<uint32_t, uint64_t>;

struct Op {
  uint64_t index = 0;
  bool erase = false;
  std::vector<uint32_t> keys;  // distinct
};

// Payload sizes vary with the version too, so a replacement may move a key to another size
// class; some are not multiples of any alignment.
size_t PayloadBytes(uint32_t key, uint64_t version) {
  static constexpr size_t kSizes[] = {100, 4000, 4096, 9000, 20000};
  uint64_t state = uint64_t{key} << 40 ^ version;
  return kSizes[SplitMix64Next(state) % std::size(kSizes)];
}

// Operation `index` given the state before it: a pure function, so the parent regenerates
// exactly what the child did (and what it was doing when it died).
Op MakeOp(uint64_t seed, uint64_t index, const KeyVersions& model) {
  uint64_t state = seed ^ (index * 0xA24BAED4963EE407ull);
  Op op{index, !model.empty() && SplitMix64Next(state) % 5 == 0, {}};
  std::vector<uint32_t> pool;
  if (op.erase) {
    for (const auto& entry : model) pool.push_back(entry.first);
  } else {
    for (uint32_t k = 0; k < kNumKeys; ++k) pool.push_back(k);
  }
  const size_t n = std::min<size_t>(1 + SplitMix64Next(state) % (op.erase ? 3 : 8), pool.size());
  for (size_t i = 0; i < n; ++i) {  // partial Fisher-Yates: n distinct keys
    std::swap(pool[i], pool[i + SplitMix64Next(state) % (pool.size() - i)]);
    op.keys.push_back(pool[i]);
  }
  return op;
}

void Apply(const Op& op, KeyVersions& model) {
  for (uint32_t k : op.keys) {
    if (op.erase) {
      model.erase(k);
    } else {
      model[k] = op.index;
    }
  }
}

DiskTierOptions StoreOptions(const std::string& dir) {
  DiskTierOptions options;
  options.dir = dir;
  options.disk_budget_bytes = size_t{64} << 20;
  options.verify_on_open = true;
  return options;
}

void WriteRecord(int fd, uint64_t record) {
  // 8 bytes into a pipe are written whole or not at all (PIPE_BUF).
  if (::write(fd, &record, sizeof(record)) != sizeof(record)) ::_exit(4);
}

// The child: no gtest machinery, no return. A failed call is printed and exits 3, which the
// parent reports (a kill is the only expected end).
[[noreturn]] void RunWriter(const std::string& dir, uint64_t seed, uint64_t first_op, KeyVersions model,
                            int report_fd) {
  auto fail = [](const std::string& what, const Status& status) {
    std::fprintf(stderr, "crash child: %s: %s\n", what.c_str(), status.ToString().c_str());
    ::_exit(3);
  };
  auto store = DiskTier::Open(StoreOptions(dir));
  if (!store.ok()) fail("Open " + dir, store.status());
  WriteRecord(report_fd, kReadyRecord);
  for (uint64_t index = first_op; index < first_op + kMaxChildOps; ++index) {
    const Op op = MakeOp(seed, index, model);
    std::vector<PageKey> keys;
    std::vector<std::vector<std::byte>> payloads;
    std::vector<PagePut> puts;
    for (uint32_t k : op.keys) keys.push_back(TestPageKey(k));
    Status status;
    if (op.erase) {
      status = (*store)->Erase(keys);
    } else {
      for (uint32_t k : op.keys) {
        payloads.push_back(VersionedPayload(TestPageKey(k), index, PayloadBytes(k, index)));
      }
      for (size_t i = 0; i < keys.size(); ++i) puts.push_back({keys[i], "crash", payloads[i]});
      status = (*store)->Put(puts);
    }
    if (!status.ok()) fail((op.erase ? "Erase, op " : "Put, op ") + std::to_string(index), status);
    Apply(op, model);
    WriteRecord(report_fd, index);
  }
  ::_exit(0);
}

// Reads every record the child wrote until the pipe closes (the child is dead by then), or the
// first one when `first_only`. Returns nullopt when the pipe closed first.
std::optional<uint64_t> ReadRecords(int fd, bool first_only, std::vector<uint64_t>& records) {
  for (;;) {
    uint64_t record = 0;
    ssize_t n = ::read(fd, &record, sizeof(record));
    if (n == sizeof(record)) {
      records.push_back(record);
      if (first_only) return record;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    EXPECT_EQ(n, 0) << "report pipe: " << (n < 0 ? std::strerror(errno) : "a partial record");
    return std::nullopt;
  }
}

// The first key whose stored version differs from `want` ("key 5: stored v12, wanted v17").
std::string FirstDifference(const KeyVersions& stored, const KeyVersions& want) {
  auto text = [](const KeyVersions& model, uint32_t k) {
    auto it = model.find(k);
    return it == model.end() ? std::string("absent") : "v" + std::to_string(it->second);
  };
  for (uint32_t k = 0; k < kNumKeys; ++k) {
    if (text(stored, k) != text(want, k)) {
      return "key " + std::to_string(k) + ": stored " + text(stored, k) + ", wanted " +
             text(want, k);
    }
  }
  return "none";
}

// The version `key` has in the reopened store (nullopt: absent). A torn or foreign payload, or a
// read error other than NotFound, is a test failure (and nullopt).
std::optional<uint64_t> StoredVersion(DiskTier& store, uint32_t k) {
  const PageKey key = TestPageKey(k);
  auto info = store.Info(key);
  if (!info.ok()) {
    EXPECT_EQ(info.status().code(), StatusCode::kNotFound) << info.status().ToString();
    return std::nullopt;
  }
  std::vector<std::byte> payload(info->payload_bytes);
  Status read = store.Read(key, payload);
  EXPECT_TRUE(read.ok()) << "key " << k << ": " << read.ToString();
  if (!read.ok()) return std::nullopt;
  auto version = PayloadVersion(key, payload);
  EXPECT_TRUE(version.has_value()) << "key " << k << ": the page read back is torn or foreign";
  if (version) {
    EXPECT_EQ(payload.size(), PayloadBytes(k, *version)) << "key " << k << " v" << *version;
  }
  return version;
}

TEST(DiskTierCrash, SigkillAtRandomMomentsNeverLosesPublishedPages) {
  const char* long_mode = std::getenv("ARGUS_LONG_TESTS");
  const int n_kills = long_mode != nullptr && std::string(long_mode) == "1" ? 200 : 20;
  const uint64_t seed = testing::TestSeed();
  uint64_t rng = seed ^ 0xC7A5'4B1D'0000'0001ull;
  testing::TempDir dir;

  KeyVersions model;
  uint64_t next_op = 0;  // the first operation of the next child
  uint64_t n_reported_ops = 0;
  for (int kill = 0; kill < n_kills; ++kill) {
    SCOPED_TRACE("kill " + std::to_string(kill) + ", seed " + std::to_string(seed));
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
    std::fflush(nullptr);  // nothing buffered is written twice
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      ::close(fds[0]);
      RunWriter(dir / "store", seed, next_op, model, fds[1]);
    }
    ::close(fds[1]);

    // Most kills are timed from the child's Open, so they land among writes; one in four is
    // timed from the fork and may land in Open's recovery.
    std::vector<uint64_t> records;
    if (SplitMix64Next(rng) % 4 != 0) {
      pollfd ready{fds[0], POLLIN, 0};
      EXPECT_EQ(::poll(&ready, 1, 60'000), 1) << "the child did not open the store in 60 s";
      ReadRecords(fds[0], /*first_only=*/true, records);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(SplitMix64Next(rng) % 30'001));
    ::kill(pid, SIGKILL);
    int wait_status = 0;
    ASSERT_EQ(::waitpid(pid, &wait_status, 0), pid);
    ReadRecords(fds[0], /*first_only=*/false, records);
    ::close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL)
        << "the child ended before the kill (exit code "
        << (WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1) << "; its stderr says why)";

    // Replay what the child reported complete; the next operation may or may not have landed.
    for (uint64_t record : records) {
      if (record == kReadyRecord) continue;
      ASSERT_EQ(record, next_op) << "reports arrive in operation order";
      Apply(MakeOp(seed, next_op, model), model);
      ++next_op;
      ++n_reported_ops;
    }
    const Op in_flight = MakeOp(seed, next_op, model);
    KeyVersions if_applied = model;
    Apply(in_flight, if_applied);

    auto store = DiskTier::Open(StoreOptions(dir / "store"));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->stats().n_lost_pages, 0u);
    for (const PageKey& key : (*store)->Keys()) {
      EXPECT_TRUE(key.lo < kNumKeys && key == TestPageKey(key.lo))
          << "a key never written: " << key.ToString();
    }
    KeyVersions observed;
    for (uint32_t k = 0; k < kNumKeys; ++k) {
      if (auto version = StoredVersion(**store, k)) observed[k] = *version;
    }
    // All or nothing: every key at its reported state, except that the in-flight operation's
    // keys are either all at their old pages or all at their new ones.
    EXPECT_TRUE(observed == model || observed == if_applied)
        << "after op " << next_op - 1 << " (op " << next_op
        << " in flight: " << (in_flight.erase ? "erase of " : "put of ") << in_flight.keys.size()
        << " keys): against the reported state " << FirstDifference(observed, model)
        << "; against the state with op " << next_op << " "
        << FirstDifference(observed, if_applied);
    if (observed == if_applied) model = if_applied;
    ++next_op;  // the in-flight index is spent either way, so versions never repeat

    auto report = (*store)->Check();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->ok()) << report->lost.size()
                              << " lost, first: " << report->lost.front().first.ToString() << " "
                              << report->lost.front().second;
    EXPECT_EQ(report->n_pages, model.size());
    if (::testing::Test::HasFailure()) break;  // one broken store makes every later cycle fail
  }
  // A run in which no operation completed would prove nothing about published pages.
  EXPECT_GT(n_reported_ops, 0u);
}

}  // namespace
}  // namespace argus
