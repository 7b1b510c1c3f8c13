// Readers and a writer on one disk tier at once (the test the ThreadSanitizer build runs): one
// thread replaces, erases and re-puts a fixed set of keys while three threads read them with
// Read and with ReadBatch. Every page read must be a whole version of its key that is no older
// than one the same reader saw before; NotFound is allowed (erased keys), Corruption never.
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
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

constexpr uint32_t kNumKeys = 12;
constexpr int kWriterOps = 400;
constexpr int kMinReaderOps = 200;      // per reader, even when the writer is done first
constexpr int kMaxReaderOps = 200'000;  // per reader: a bound, never reached in practice
constexpr int kNumReaders = 3;

// One size per key (sizes differ between keys, some are not block multiples), so a reader that
// sized its buffer from Info() is never raced into a size mismatch by a replacement.
size_t PayloadBytes(uint32_t k) { return 1000 + 3001 * k; }

// The outcome a reader saw, checked after the threads are joined (gtest assertions from the
// threads would be thread-safe too, but one summary per reader keeps a failure readable).
struct ReaderLog {
  int n_reads = 0, n_found = 0;
  std::vector<std::string> errors;
  std::map<uint32_t, uint64_t> last_version;

  // Records a page read of key k: it must be a whole version, and not older than the last one.
  void Saw(uint32_t k, std::span<const std::byte> payload, const char* how) {
    ++n_found;
    auto version = PayloadVersion(TestPageKey(k), payload);
    if (!version) {
      errors.push_back(std::string(how) + " of key " + std::to_string(k) +
                       " returned a torn or foreign page");
      return;
    }
    auto [it, first] = last_version.try_emplace(k, *version);
    if (!first && *version < it->second) {
      errors.push_back(std::string(how) + " of key " + std::to_string(k) + " returned version " +
                       std::to_string(*version) + " after version " + std::to_string(it->second));
    }
    if (*version > it->second) it->second = *version;
  }
  void Failed(const Status& status, const char* how) {
    // NotFound is a fine answer while the writer erases keys; anything else is a failure.
    if (status.code() != StatusCode::kNotFound) {
      errors.push_back(std::string(how) + ": " + status.ToString());
    }
  }
};

void ReadOne(DiskTier& store, uint32_t k, ReaderLog& log) {
  auto info = store.Info(TestPageKey(k));
  if (!info.ok()) return log.Failed(info.status(), "Info");
  std::vector<std::byte> payload(info->payload_bytes);
  Status status = store.Read(TestPageKey(k), payload);
  if (!status.ok()) return log.Failed(status, "Read");
  log.Saw(k, payload, "Read");
}

void ReadSome(DiskTier& store, uint64_t& rng, ReaderLog& log) {
  std::vector<uint32_t> ks;
  std::vector<PageKey> keys;
  for (size_t i = 0, n = 1 + SplitMix64Next(rng) % 4; i < n; ++i) {
    ks.push_back(static_cast<uint32_t>(SplitMix64Next(rng) % kNumKeys));
    keys.push_back(TestPageKey(ks.back()));
  }
  auto batch = store.ReadBatch(keys);
  if (!batch.ok()) return log.Failed(batch.status(), "ReadBatch");
  // The pages are pinned from here on: every Get must succeed, in any order.
  for (size_t j = 0; j < ks.size(); ++j) {
    const size_t i = ks.size() - 1 - j;
    auto bytes = (*batch)->Get(i);
    if (!bytes.ok()) {
      log.errors.push_back("ReadBatch Get of a pinned page: " + bytes.status().ToString());
      continue;
    }
    log.Saw(ks[i], *bytes, "ReadBatch");
    (*batch)->Release(i);
  }
}

TEST(DiskTierConcurrency, ReadersDuringReplacementsAndErasesSeeOnlyWholePages) {
  testing::TempDir dir;
  DiskTierOptions options;
  options.dir = dir / "store";
  options.disk_budget_bytes = size_t{16} << 20;
  auto opened = DiskTier::Open(options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  DiskTier& store = **opened;
  const uint64_t seed = testing::TestSeed();

  // Every key starts stored at version 0, so readers find pages from the first moment.
  for (uint32_t k = 0; k < kNumKeys; ++k) {
    auto payload = VersionedPayload(TestPageKey(k), 0, PayloadBytes(k));
    ASSERT_TRUE(store.Put({TestPageKey(k), "conc", payload}).ok());
  }

  std::atomic<bool> writer_done{false};
  std::map<uint32_t, std::optional<uint64_t>> final_state;  // written by the writer only
  std::vector<std::string> writer_errors;
  std::thread writer([&] {
    uint64_t rng = seed ^ 0x57A7'E000ull;
    for (uint32_t k = 0; k < kNumKeys; ++k) final_state[k] = 0;
    for (int op = 1; op <= kWriterOps; ++op) {
      const uint32_t k = static_cast<uint32_t>(SplitMix64Next(rng) % kNumKeys);
      const PageKey key = TestPageKey(k);
      Status status;
      if (final_state[k] && SplitMix64Next(rng) % 6 == 0) {
        status = store.Erase(std::span<const PageKey>(&key, 1));
        final_state[k] = std::nullopt;
      } else {  // a replacement, or the re-put of an erased key
        auto payload = VersionedPayload(key, static_cast<uint64_t>(op), PayloadBytes(k));
        status = store.Put({key, "conc", payload});
        final_state[k] = static_cast<uint64_t>(op);
      }
      if (!status.ok())
        writer_errors.push_back("op " + std::to_string(op) + ": " + status.ToString());
    }
    writer_done.store(true, std::memory_order_release);
  });

  std::vector<ReaderLog> logs(kNumReaders);
  std::vector<std::thread> readers;
  for (int r = 0; r < kNumReaders; ++r) {
    readers.emplace_back([&, r] {
      uint64_t rng = seed ^ (0x4EAD'0000ull + static_cast<uint64_t>(r));
      ReaderLog& log = logs[r];
      while (log.n_reads < kMaxReaderOps &&
             (log.n_reads < kMinReaderOps || !writer_done.load(std::memory_order_acquire))) {
        ++log.n_reads;
        if (SplitMix64Next(rng) % 2 == 0) {
          ReadOne(store, static_cast<uint32_t>(SplitMix64Next(rng) % kNumKeys), log);
        } else {
          ReadSome(store, rng, log);
        }
      }
    });
  }
  writer.join();
  for (std::thread& reader : readers) reader.join();

  for (const std::string& error : writer_errors) ADD_FAILURE() << "writer " << error;
  for (int r = 0; r < kNumReaders; ++r) {
    for (const std::string& error : logs[r].errors)
      ADD_FAILURE() << "reader " << r << ": " << error;
    EXPECT_GT(logs[r].n_found, 0);
  }
  // At rest, every key holds the writer's last word, and nothing was ever refused as corrupt.
  for (const auto& [k, version] : final_state) {
    std::vector<std::byte> payload(PayloadBytes(k));
    Status status = store.Read(TestPageKey(k), payload);
    if (version) {
      ASSERT_TRUE(status.ok()) << "key " << k << ": " << status.ToString();
      EXPECT_EQ(PayloadVersion(TestPageKey(k), payload), version) << "key " << k;
    } else {
      EXPECT_EQ(status.code(), StatusCode::kNotFound) << "key " << k << ": " << status.ToString();
    }
  }
  EXPECT_EQ(store.stats().n_corrupt_reads, 0u);
  EXPECT_EQ(store.stats().n_lost_pages, 0u);
  auto report = store.Check();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok());
}

}  // namespace
}  // namespace argus
