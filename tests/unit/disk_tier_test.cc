// The disk tier: round trips, replacement, erasure, generations, named records, recovery on
// reopen, the three budgets, read batches (read-ahead under a small staging budget, on-demand
// reads out of order, both I/O backends), pinning, compaction, and key identity.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "argus/store.h"
#include "core/files.h"
#include "fault/fault_env.h"
#include "fuzz/journal_recovery.h"
#include "store/disk_format.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::TempDir;

// Deterministic bytes for (key, version): any mix-up of pages or versions shows.
std::vector<std::byte> Payload(const PageKey& key, uint64_t version, size_t n_bytes) {
  std::mt19937_64 rng(testing::TestSeed() ^ key.hi ^ (key.lo * 0x9E3779B97F4A7C15ull) ^
                      (version << 40));
  std::vector<std::byte> bytes(n_bytes);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

DiskTierOptions Options(const TempDir& dir) {
  DiskTierOptions o;
  o.dir = dir / "store";
  o.disk_budget_bytes = size_t{256} << 20;
  o.io = DiskIoBackend::kThreads;
  o.n_io_threads = 2;
  return o;
}

std::unique_ptr<DiskTier> OpenOrDie(const DiskTierOptions& o) {
  auto tier = DiskTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(tier).value() : nullptr;
}

std::vector<std::byte> ReadOrDie(DiskTier& tier, const PageKey& key) {
  auto info = tier.Info(key);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  if (!info.ok()) return {};
  std::vector<std::byte> bytes(info->payload_bytes);
  Status s = tier.Read(key, bytes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return bytes;
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

size_t SlotBytes(const DiskTier& tier, size_t payload_bytes) {
  const size_t a = tier.stats().alignment_bytes;
  return (disk::kSlotHeaderBytes + payload_bytes + a - 1) / a * a;
}

// Overwrites bytes of a slot file behind the store's back.
void Scribble(const std::string& path, uint64_t offset, std::span<const std::byte> bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

TEST(DiskTier, PayloadsOfEverySizeRoundTripAndSurviveReopen) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  const std::vector<size_t> sizes = {1, 4095, 4096, 65537, size_t{1} << 20};
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    EXPECT_GE(tier->stats().alignment_bytes, 512u);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const PageKey key{7, i};
      const auto payload = Payload(key, 0, sizes[i]);
      ASSERT_TRUE(tier->Put({key, "q4_0/q8_0", payload}).ok());
      EXPECT_EQ(ReadOrDie(*tier, key), payload) << sizes[i];
      const StoredPageInfo info = tier->Info(key).value();
      EXPECT_EQ(info.payload_bytes, sizes[i]);
      EXPECT_EQ(info.slot_bytes, SlotBytes(*tier, sizes[i]));
      EXPECT_EQ(info.tag, "q4_0/q8_0");
    }
    std::set<size_t> classes;
    for (size_t n : sizes) classes.insert(SlotBytes(*tier, n));
    EXPECT_EQ(tier->stats().n_size_classes, classes.size());
  }
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->Keys().size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(ReadOrDie(*tier, {7, i}), Payload({7, i}, 0, sizes[i])) << sizes[i];
  }
  EXPECT_EQ(tier->stats().n_lost_pages, 0u);
  EXPECT_EQ(tier->stats().journal_dropped_bytes, 0u);
}

TEST(DiskTier, ReplaceServesNewBytesRaisesGenerationAndFreesOldSlot) {
  TempDir dir;
  auto tier = OpenOrDie(Options(dir));
  ASSERT_TRUE(tier);
  const PageKey a{1, 1};
  const auto v1 = Payload(a, 1, 3000), v2 = Payload(a, 2, 3000);
  ASSERT_TRUE(tier->Put({a, "v1", v1}).ok());
  const uint64_t g1 = tier->Info(a)->generation;
  ASSERT_TRUE(tier->Put({a, "v2", v2}).ok());
  EXPECT_GT(tier->Info(a)->generation, g1);
  EXPECT_EQ(tier->Info(a)->tag, "v2");
  EXPECT_EQ(ReadOrDie(*tier, a), v2);
  const DiskTierStats st = tier->stats();
  EXPECT_EQ(st.n_pages, 1u);
  EXPECT_EQ(st.used_bytes, SlotBytes(*tier, 3000));
  EXPECT_EQ(st.n_free_slots, 1u);
  EXPECT_EQ(st.file_bytes, 2 * SlotBytes(*tier, 3000));
  // The freed slot (the lowest) is the next one taken: the file does not grow.
  ASSERT_TRUE(tier->Put({{1, 2}, "", Payload({1, 2}, 0, 3000)}).ok());
  EXPECT_EQ(tier->stats().file_bytes, 2 * SlotBytes(*tier, 3000));
  EXPECT_EQ(tier->stats().n_free_slots, 0u);
}

TEST(DiskTier, EraseUnpublishesAndMissingKeyIsNotFoundChangingNothing) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    const PageKey a{2, 1}, b{2, 2};
    ASSERT_TRUE(
        tier->Put(std::vector<PagePut>{{a, "", Payload(a, 0, 100)}, {b, "", Payload(b, 0, 100)}})
            .ok());
    const PageKey both[] = {a, {9, 9}};
    Status missing = tier->Erase(both);
    EXPECT_EQ(missing.code(), StatusCode::kNotFound);
    EXPECT_TRUE(Has(missing.message(), PageKey{9, 9}.ToString())) << missing.message();
    EXPECT_TRUE(tier->Contains(a));
    ASSERT_TRUE(tier->Erase(std::span(&a, 1)).ok());
    EXPECT_FALSE(tier->Contains(a));
    EXPECT_EQ(tier->Info(a).status().code(), StatusCode::kNotFound);
    std::vector<std::byte> dst(100);
    EXPECT_EQ(tier->Read(a, dst).code(), StatusCode::kNotFound);
    EXPECT_EQ(tier->Erase(std::span(&a, 1)).code(), StatusCode::kNotFound);
    EXPECT_EQ(tier->stats().used_bytes, SlotBytes(*tier, 100));
  }
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->Keys(), (std::vector<PageKey>{PageKey{2, 2}}));
  EXPECT_EQ(ReadOrDie(*tier, {2, 2}), Payload({2, 2}, 0, 100));
  EXPECT_EQ(tier->stats().n_free_slots, 1u);
}

TEST(DiskTier, GenerationsKeepIncreasingAcrossReopenAndCompaction) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  uint64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    const PageKey k{3, static_cast<uint64_t>(round)};
    ASSERT_TRUE(tier->Put({k, "", Payload(k, 0, 10)}).ok());
    EXPECT_GT(tier->Info(k)->generation, last);
    last = tier->Info(k)->generation;
    // Erasing the newest page and compacting must not let its generation be handed out again.
    ASSERT_TRUE(tier->Erase(std::span(&k, 1)).ok());
    ASSERT_TRUE(tier->Compact().ok());
  }
}

TEST(DiskTier, NamedRecordsReplaceEraseAndSurviveReopen) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  const auto m1 = Payload({4, 1}, 0, 300), m2 = Payload({4, 2}, 0, 5);
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    ASSERT_TRUE(tier->PutRecord("seq/1", m1).ok());
    ASSERT_TRUE(tier->PutRecord("seq/2", m1).ok());
    ASSERT_TRUE(tier->PutRecord("seq/2", m2).ok());
    ASSERT_TRUE(tier->PutRecord("seq/3", m1).ok());
    ASSERT_TRUE(tier->EraseRecord("seq/3").ok());
    EXPECT_EQ(tier->EraseRecord("seq/3").code(), StatusCode::kNotFound);
    EXPECT_EQ(tier->GetRecord("seq/3").status().code(), StatusCode::kNotFound);
    EXPECT_EQ(tier->PutRecord("", m1).code(), StatusCode::kInvalidArgument);
  }
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->RecordNames(), (std::vector<std::string>{"seq/1", "seq/2"}));
  EXPECT_EQ(tier->GetRecord("seq/1").value(), m1);
  EXPECT_EQ(tier->GetRecord("seq/2").value(), m2);
}

TEST(DiskTier, ReopenRecoversEveryPageOfManyBatches) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<std::pair<PageKey, size_t>> pages;
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    for (uint64_t batch = 0; batch < 8; ++batch) {
      std::vector<std::vector<std::byte>> payloads;
      std::vector<PagePut> puts;
      for (uint64_t i = 0; i < 5; ++i) {
        const PageKey key{batch, i};
        const size_t n = 1 + rng() % 20000;
        payloads.push_back(Payload(key, 0, n));
        pages.emplace_back(key, n);
      }
      for (uint64_t i = 0; i < 5; ++i) puts.push_back({{batch, i}, "t", payloads[i]});
      ASSERT_TRUE(tier->Put(puts).ok());
    }
  }
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->stats().n_pages, pages.size());
  EXPECT_EQ(tier->stats().n_journal_records, 8u);
  for (const auto& [key, n] : pages) EXPECT_EQ(ReadOrDie(*tier, key), Payload(key, 0, n));
  auto report = tier->Check();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->n_pages, pages.size());
}

// Each budget: exactly full fits, one byte less refuses the next put naming the budget, and the
// pages already stored are untouched.
TEST(DiskTier, OneByteOverDiskBudgetIsResourceExhaustedAndTouchesNothing) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  const PageKey a{5, 1}, b{5, 2};
  {
    auto probe = OpenOrDie(o);
    ASSERT_TRUE(probe);
    o.disk_budget_bytes = 2 * SlotBytes(*probe, 1000) - 1;
  }
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  ASSERT_TRUE(tier->Put({a, "", Payload(a, 0, 1000)}).ok());
  Status s = tier->Put({b, "", Payload(b, 0, 1000)});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(s.message(), "disk budget of " + std::to_string(o.disk_budget_bytes)))
      << s.message();
  // Replacing needs room for old and new until the new one is published.
  EXPECT_EQ(tier->Put({a, "", Payload(a, 1, 1000)}).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadOrDie(*tier, a), Payload(a, 0, 1000));
  EXPECT_FALSE(tier->Contains(b));
  EXPECT_EQ(tier->stats().used_bytes, SlotBytes(*tier, 1000));
}

TEST(DiskTier, OneByteOverStagingBudgetIsResourceExhaustedAndTouchesNothing) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  const PageKey a{6, 1}, b{6, 2};
  size_t slot = 0;
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    slot = SlotBytes(*tier, 5000);
    ASSERT_TRUE(tier->Put({a, "", Payload(a, 0, 100)}).ok());
  }
  o.staging_budget_bytes = slot - 1;
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  Status s = tier->Put({b, "", Payload(b, 0, 5000)});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(s.message(), "staging budget of " + std::to_string(slot - 1))) << s.message();
  EXPECT_FALSE(tier->Contains(b));
  EXPECT_EQ(ReadOrDie(*tier, a), Payload(a, 0, 100));
  EXPECT_EQ(tier->stats().staging_used_bytes, 0u);
}

TEST(DiskTier, OneByteOverMetadataBudgetIsResourceExhaustedAndTouchesNothing) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  // Documented charges: 128 per page plus its tag, 48 per slot of the slot files.
  const size_t per_page = 128 + 3 + 48;
  o.metadata_budget_bytes = 2 * per_page - 1;
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const PageKey a{7, 1}, b{7, 2};
  ASSERT_TRUE(tier->Put({a, "abc", Payload(a, 0, 10)}).ok());
  EXPECT_EQ(tier->stats().metadata_bytes, per_page);
  Status s = tier->Put({b, "abc", Payload(b, 0, 10)});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(s.message(), "metadata budget of " + std::to_string(2 * per_page - 1)))
      << s.message();
  EXPECT_EQ(tier->PutRecord("r", Payload(b, 0, per_page)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier->Keys(), std::vector<PageKey>{a});
  EXPECT_EQ(ReadOrDie(*tier, a), Payload(a, 0, 10));
  EXPECT_EQ(tier->stats().metadata_bytes, per_page);
  // Replacing a charges only the slot it takes (the tag size is unchanged): that fits.
  EXPECT_TRUE(tier->Put({a, "xyz", Payload(a, 1, 10)}).ok());
}

// Stores n pages of distinct sizes under keys {8, i}.
std::vector<PageKey> PutPages(DiskTier& tier, size_t n, size_t n_bytes) {
  std::vector<PageKey> keys;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back({8, i});
    EXPECT_TRUE(tier.Put({keys.back(), "", Payload(keys.back(), 0, n_bytes)}).ok());
  }
  return keys;
}

TEST(DiskTier, ReadBatchUnderSmallStagingBudgetCompletesByReleasing) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.staging_budget_bytes = 3 * 8704 + 100;  // three slots of 8 KiB pages at 512-byte alignment
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  ASSERT_LE(SlotBytes(*tier, 8192), 8704u) << "the test assumes an alignment of at most 512";
  const std::vector<PageKey> keys = PutPages(*tier, 12, 8192);
  auto batch = tier->ReadBatch(keys);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto page = (*batch)->Get(i);
    ASSERT_TRUE(page.ok()) << i << ": " << page.status().ToString();
    EXPECT_TRUE(std::ranges::equal(*page, Payload(keys[i], 0, 8192))) << i;
    (*batch)->Release(i);
  }
  EXPECT_LE(tier->stats().staging_peak_bytes, o.staging_budget_bytes);
  EXPECT_GE(tier->stats().staging_peak_bytes, 2 * SlotBytes(*tier, 8192));  // read ahead ran
  batch->reset();
  EXPECT_EQ(tier->stats().staging_used_bytes, 0u);
}

TEST(DiskTier, ReadBatchPageThatCanNeverFitIsResourceExhaustedNamingStaging) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.staging_budget_bytes = 2 * 8704;
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const std::vector<PageKey> keys = PutPages(*tier, 3, 8192);
  auto batch = tier->ReadBatch(keys);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE((*batch)->Get(0).ok());
  ASSERT_TRUE((*batch)->Get(1).ok());
  auto third = (*batch)->Get(2);  // both slots held by unreleased pages of this batch
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(third.status().message(), "staging budget of " + std::to_string(2 * 8704)))
      << third.status().message();
  (*batch)->Release(0);
  auto retry = (*batch)->Get(2);
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_TRUE(std::ranges::equal(*retry, Payload(keys[2], 0, 8192)));
}

// Closes the store and reopens it with a staging budget of staging_bytes.
std::unique_ptr<DiskTier> ReopenWithStaging(std::unique_ptr<DiskTier> tier, DiskTierOptions o,
                                            size_t staging_bytes) {
  tier.reset();
  o.staging_budget_bytes = staging_bytes;
  return OpenOrDie(o);
}

TEST(DiskTier, ReadBatchOnDemandGetDropsReadAheadOfEarlierPagesOnlyToFit) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const size_t a = tier->stats().alignment_bytes;
  const std::vector<PageKey> keys = {{9, 0}, {9, 1}, {9, 2}};
  const std::vector<size_t> sizes = {100, 100, 3 * a - disk::kSlotHeaderBytes};  // A, A, 3A
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(tier->Put({keys[i], "", Payload(keys[i], 0, sizes[i])}).ok());
  }
  ASSERT_EQ(tier->Info(keys[2]).value().slot_bytes, 3 * a);
  tier = ReopenWithStaging(std::move(tier), o, 4 * a);
  ASSERT_TRUE(tier);
  // Read-ahead issues page 0 only (it keeps the largest slot, 3A, free); Get(1) takes A more
  // without touching page 0's read-ahead.
  auto batch = tier->ReadBatch(keys);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  ASSERT_TRUE((*batch)->Get(1).ok());
  EXPECT_EQ(tier->stats().staging_used_bytes, 2 * a);
  // Page 2 fits only if page 0's read-ahead, which nobody has asked for, gives way.
  auto third = (*batch)->Get(2);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_TRUE(std::ranges::equal(*third, Payload(keys[2], 0, sizes[2])));
  EXPECT_EQ(tier->stats().staging_used_bytes, 4 * a);
  // Page 0 is read again on demand, once its consumer's own pages leave room for it.
  auto full = (*batch)->Get(0);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  (*batch)->Release(1);
  auto first = (*batch)->Get(0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(std::ranges::equal(*first, Payload(keys[0], 0, sizes[0])));
  EXPECT_EQ(tier->stats().n_corrupt_reads, 0u);
}

TEST(DiskTier, PutAndReadSucceedWhileABatchThatCouldFillStagingIsOpen) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const size_t a = tier->stats().alignment_bytes;
  const std::vector<PageKey> keys = PutPages(*tier, 8, 100);  // one slot of A bytes each
  tier = ReopenWithStaging(std::move(tier), o, 4 * a);
  ASSERT_TRUE(tier);
  auto batch = tier->ReadBatch(keys);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(tier->stats().staging_used_bytes, 3 * a);  // read-ahead left one slot free
  const PageKey extra{9, 99};
  Status put = tier->Put({extra, "", Payload(extra, 0, 100)});
  EXPECT_TRUE(put.ok()) << put.ToString();
  EXPECT_EQ(ReadOrDie(*tier, extra), Payload(extra, 0, 100));
  for (size_t i = 0; i < keys.size(); ++i) {
    auto page = (*batch)->Get(i);
    ASSERT_TRUE(page.ok()) << i << ": " << page.status().ToString();
    EXPECT_TRUE(std::ranges::equal(*page, Payload(keys[i], 0, 100))) << i;
    (*batch)->Release(i);
  }
}

// A symbolic link planted as a store file redirected the store's writes to its target (a root
// run wrote journal bytes and pages into files it pointed at). Links are refused, the target is
// untouched, and the store's new files are private (0600).
TEST(DiskTier, SymlinkedStoreFilesAreRefusedAndNewFilesArePrivate) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  std::string slot_file;
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    const PageKey key{9, 2};
    ASSERT_TRUE(tier->Put({key, "", Payload(key, 0, 3000)}).ok());
  }
  for (const auto& entry : std::filesystem::directory_iterator(o.dir)) {
    const auto perms = std::filesystem::status(entry.path()).permissions();
    EXPECT_EQ(perms & (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
              std::filesystem::perms::none)
        << entry.path();
    if (entry.path().filename().string().starts_with("slots-")) slot_file = entry.path();
  }
  ASSERT_FALSE(slot_file.empty());
  const std::string target = dir / "victim";
  std::ofstream(target) << "precious";
  for (const std::string& name : {slot_file, o.dir + "/journal"}) {
    SCOPED_TRACE(name);
    const std::string saved = name + ".saved";
    std::filesystem::rename(name, saved);
    std::filesystem::create_symlink(target, name);
    auto opened = DiskTier::Open(o);
    EXPECT_FALSE(opened.ok());
    EXPECT_TRUE(Has(opened.status().message(), name + ": a symbolic link, refused in a store"))
        << opened.status().message();
    std::filesystem::remove(name);
    std::filesystem::rename(saved, name);
  }
  std::ifstream in(target);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious");
  auto tier = OpenOrDie(o);
  EXPECT_TRUE(tier);
}

TEST(DiskTier, StoreFileOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving a file to another user needs root";
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  { ASSERT_TRUE(OpenOrDie(o)); }
  const std::string journal = o.dir + "/journal";
  ASSERT_EQ(::chown(journal.c_str(), 4242, 4242), 0);
  auto opened = DiskTier::Open(o);
  ASSERT_FALSE(opened.ok());
  EXPECT_TRUE(Has(opened.status().message(), journal + ": owned by user 4242"))
      << opened.status().message();
}

TEST(DiskTier, SecondOpenOfAnOpenDirectoryIsIOErrorInUseAndFreedByClosing) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const PageKey key{9, 1};
  ASSERT_TRUE(tier->Put({key, "", Payload(key, 0, 100)}).ok());
  auto second = DiskTier::Open(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(Has(second.status().message(), o.dir)) << second.status().message();
  EXPECT_TRUE(Has(second.status().message(), "in use")) << second.status().message();
  EXPECT_EQ(ReadOrDie(*tier, key), Payload(key, 0, 100));  // the failed open touched nothing
  tier.reset();
  tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(ReadOrDie(*tier, key), Payload(key, 0, 100));
}

TEST(DiskTier, StoringOrErasingALostKeyTakesItOutOfTheLostCount) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const PageKey kept{9, 1}, erased{9, 2};
  ASSERT_TRUE(tier->Put({kept, "", Payload(kept, 0, 100)}).ok());
  ASSERT_TRUE(tier->Put({erased, "", Payload(erased, 0, 100)}).ok());
  const size_t a = tier->stats().alignment_bytes;
  const std::string file = o.dir + "/slots-" + std::to_string(a) + ".dat";
  const std::vector<std::byte> junk(8, std::byte{0x5a});
  for (uint64_t slot : {0, 1}) Scribble(file, slot * a + disk::kSlotHeaderBytes, junk);
  std::vector<std::byte> bytes(100);
  EXPECT_EQ(tier->Read(kept, bytes).code(), StatusCode::kCorruption);
  EXPECT_EQ(tier->Read(erased, bytes).code(), StatusCode::kCorruption);
  EXPECT_EQ(tier->stats().n_lost_pages, 2u);
  ASSERT_TRUE(tier->Put({kept, "", Payload(kept, 1, 100)}).ok());
  EXPECT_EQ(tier->stats().n_lost_pages, 1u);
  EXPECT_EQ(ReadOrDie(*tier, kept), Payload(kept, 1, 100));
  ASSERT_TRUE(tier->Erase(std::vector<PageKey>{erased}).ok());
  EXPECT_EQ(tier->stats().n_lost_pages, 0u);
}

TEST(DiskTier, NewSizeClassWhoseFreeListOverflowsMetadataBudgetIsResourceExhausted) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.metadata_budget_bytes = 4096;
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const size_t a = tier->stats().alignment_bytes;
  // A slot file of 1000 (free) slots appears behind the store's back: its free list would
  // charge 1000 * 48 bytes, beyond the budget.
  const std::string file = o.dir + "/slots-" + std::to_string(a) + ".dat";
  { std::ofstream(file).put('\0'); }
  std::filesystem::resize_file(file, 1000 * a);
  const PageKey key{9, 1};
  Status s = tier->Put({key, "", Payload(key, 0, 100)});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(s.message(), "metadata budget of 4096")) << s.message();
  EXPECT_TRUE(Has(s.message(), file)) << s.message();
  EXPECT_TRUE(tier->Keys().empty());
  EXPECT_EQ(tier->stats().metadata_bytes, 0u);
  EXPECT_EQ(tier->stats().n_size_classes, 0u);
}

TEST(DiskTier, ReadBatchOnDemandGetsOutOfOrderReturnTheRightPages) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.staging_budget_bytes = 3 * 8704;  // read-ahead fills it: on-demand reads must displace it
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const std::vector<PageKey> keys = PutPages(*tier, 10, 8192);
  auto batch = tier->ReadBatch(keys);
  ASSERT_TRUE(batch.ok());
  for (size_t i : {9, 4, 0, 7, 8, 1, 2, 3, 5, 6}) {
    auto page = (*batch)->Get(i);
    ASSERT_TRUE(page.ok()) << i << ": " << page.status().ToString();
    EXPECT_TRUE(std::ranges::equal(*page, Payload(keys[i], 0, 8192))) << i;
    auto again = (*batch)->Get(i);  // the same bytes, verified once
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->data(), page->data());
    (*batch)->Release(i);
    EXPECT_EQ((*batch)->Get(i).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(tier->stats().n_corrupt_reads, 0u);
}

TEST(DiskTier, ReadBatchGetFromSeveralThreadsReturnsEachPage) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.staging_budget_bytes = 4 * 8704;
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const std::vector<PageKey> keys = PutPages(*tier, 32, 8192);
  auto batch = tier->ReadBatch(keys);
  ASSERT_TRUE(batch.ok());
  // Each consumer holds one page at a time, so the four fit the staging budget together: a
  // Get must wait for, or make room from, read-ahead nobody has asked for, never fail.
  std::vector<std::string> failures(keys.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < keys.size(); i += 4) {
        auto page = (*batch)->Get(i);
        if (!page.ok()) {
          failures[i] = page.status().ToString();
        } else if (!std::ranges::equal(*page, Payload(keys[i], 0, 8192))) {
          failures[i] = "wrong bytes";
        }
        (*batch)->Release(i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(failures[i], "") << "page " << i;
}

TEST(DiskTier, UringAndThreadBackendsReadIdenticalBytes) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  std::vector<PageKey> keys;
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    keys = PutPages(*tier, 16, 70000);
  }
  std::vector<std::vector<std::byte>> seen[2];
  const DiskIoBackend backends[2] = {DiskIoBackend::kThreads, DiskIoBackend::kUring};
  for (int b = 0; b < 2; ++b) {
    o.io = backends[b];
    auto tier = DiskTier::Open(o);
    if (!tier.ok() && b == 1 && tier.status().code() == StatusCode::kUnsupported) {
      GTEST_SKIP() << "io_uring is not available here: " << tier.status().ToString();
    }
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    EXPECT_TRUE(Has((*tier)->stats().io_backend, b == 0 ? "pread" : "io_uring"))
        << (*tier)->stats().io_backend;
    auto batch = (*tier)->ReadBatch(keys);
    ASSERT_TRUE(batch.ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto page = (*batch)->Get(i);
      ASSERT_TRUE(page.ok()) << page.status().ToString();
      seen[b].emplace_back(page->begin(), page->end());
      (*batch)->Release(i);
    }
  }
  EXPECT_EQ(seen[0], seen[1]);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(seen[0][i], Payload(keys[i], 0, 70000));
}

TEST(DiskTier, PinnedOldSlotIsNotReusedUntilTheBatchEnds) {
  TempDir dir;
  auto tier = OpenOrDie(Options(dir));
  ASSERT_TRUE(tier);
  const PageKey a{9, 1}, c{9, 2};
  ASSERT_TRUE(tier->Put({a, "", Payload(a, 0, 2000)}).ok());
  auto batch = tier->ReadBatch(std::span(&a, 1));
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(tier->Put({a, "", Payload(a, 1, 2000)}).ok());
  ASSERT_TRUE(tier->Erase(std::span(&a, 1)).ok());
  ASSERT_TRUE(tier->Put({c, "", Payload(c, 0, 2000)}).ok());  // must not take a's first slot
  const size_t slot = SlotBytes(*tier, 2000);
  EXPECT_EQ(tier->stats().used_bytes, 2 * slot);  // c and the pinned old a
  auto page = (*batch)->Get(0);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_TRUE(std::ranges::equal(*page, Payload(a, 0, 2000)));
  batch->reset();
  EXPECT_EQ(tier->stats().used_bytes, slot);
  EXPECT_EQ(tier->stats().n_free_slots, 1u);  // c took the erased second slot, the first is free
  EXPECT_EQ(tier->stats().file_bytes, 2 * slot);
  EXPECT_EQ(ReadOrDie(*tier, c), Payload(c, 0, 2000));
}

TEST(DiskTier, CompactKeepsEveryPageAndRecordAndShrinksTheJournal) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  const PageKey keys[] = {{10, 1}, {10, 2}, {10, 3}};
  size_t before = 0;
  {
    auto tier = OpenOrDie(o);
    ASSERT_TRUE(tier);
    for (uint64_t v = 0; v < 20; ++v) {
      for (const PageKey& k : keys) ASSERT_TRUE(tier->Put({k, "tag", Payload(k, v, 700)}).ok());
    }
    ASSERT_TRUE(tier->Erase(std::span(&keys[2], 1)).ok());
    ASSERT_TRUE(tier->PutRecord("manifest", Payload(keys[0], 99, 64)).ok());
    before = tier->stats().journal_bytes;
    ASSERT_TRUE(tier->Compact().ok());
    EXPECT_LT(tier->stats().journal_bytes, before / 10);
    EXPECT_EQ(tier->stats().n_journal_records, 1u + 2u + 1u);
    ASSERT_TRUE(tier->Put({keys[2], "tag", Payload(keys[2], 100, 700)}).ok());  // appends
  }
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(ReadOrDie(*tier, keys[0]), Payload(keys[0], 19, 700));
  EXPECT_EQ(ReadOrDie(*tier, keys[1]), Payload(keys[1], 19, 700));
  EXPECT_EQ(ReadOrDie(*tier, keys[2]), Payload(keys[2], 100, 700));
  EXPECT_EQ(tier->GetRecord("manifest").value(), Payload(keys[0], 99, 64));
  EXPECT_EQ(tier->Info(keys[0])->tag, "tag");
  EXPECT_FALSE(std::filesystem::exists(o.dir + "/journal.tmp"));
}

TEST(DiskTier, PageStoredUnderOneKeyIsNeverServedForAnother) {
  TempDir dir;
  const DiskTierOptions o = Options(dir);
  auto tier = OpenOrDie(o);
  ASSERT_TRUE(tier);
  const PageKey a{11, 1}, b{11, 2};
  ASSERT_TRUE(
      tier->Put(std::vector<PagePut>{{a, "", Payload(a, 0, 1000)}, {b, "", Payload(b, 0, 1000)}})
          .ok());
  // Copy a's whole slot (slot 0) over b's (slot 1): a valid slot, for the wrong key.
  const size_t slot = SlotBytes(*tier, 1000);
  const std::string file = o.dir + "/slots-" + std::to_string(slot) + ".dat";
  std::vector<std::byte> a_slot(slot);
  {
    const int fd = ::open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, a_slot.data(), slot, 0), static_cast<ssize_t>(slot));
    ::close(fd);
  }
  Scribble(file, slot, a_slot);
  std::vector<std::byte> dst(1000);
  Status s = tier->Read(b, dst);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_TRUE(Has(s.message(), "page " + b.ToString() + " in " + file + " slot 1")) << s.message();
  EXPECT_TRUE(Has(s.message(), "holds page " + a.ToString())) << s.message();
  EXPECT_NE(dst, Payload(a, 0, 1000));
  EXPECT_EQ(ReadOrDie(*tier, a), Payload(a, 0, 1000));
}

TEST(DiskTier, BadArgumentsAreInvalidArgument) {
  TempDir dir;
  DiskTierOptions o = Options(dir);
  o.disk_budget_bytes = 0;
  EXPECT_EQ(DiskTier::Open(o).status().code(), StatusCode::kInvalidArgument);
  auto tier = OpenOrDie(Options(dir));
  ASSERT_TRUE(tier);
  const PageKey a{12, 1};
  const auto payload = Payload(a, 0, 10);
  EXPECT_EQ(tier->Put({a, "", {}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->Put({a, std::string(49, 't'), payload}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->Put(std::vector<PagePut>{{a, "", payload}, {a, "", payload}}).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(tier->Put({a, std::string(48, 't'), payload}).ok());
  std::vector<std::byte> wrong(11);
  EXPECT_EQ(tier->Read(a, wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->ReadBatch(std::vector<PageKey>{a, {1, 2}}).status().code(),
            StatusCode::kNotFound);
}

// Recovery from hostile files (tests/fuzz/journal_recovery.h): every input of the journal
// fuzzer's corpus and regressions, and seeded bit flips and cuts of the corpus, fail with a
// Status or open a store that reads back consistently, twice and read-only alike.
TEST(DiskTierRecovery, FuzzCorpusRegressionsAndMutationsRecoverCleanly) {
  namespace fs = std::filesystem;
  std::vector<std::vector<uint8_t>> seeds;
  for (const char* dir : {"tests/fuzz/corpus/journal", "tests/fuzz/regress/journal"}) {
    const fs::path path = fs::path(ARGUS_SOURCE_DIR) / dir;
    if (!fs::is_directory(path)) continue;
    for (const auto& entry : fs::directory_iterator(path)) {
      auto bytes = ReadFileBytes(entry.path().string());
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      const auto* data = reinterpret_cast<const uint8_t*>(bytes->data());
      seeds.emplace_back(data, data + bytes->size());
      EXPECT_EQ(testing::CheckJournalRecovery(data, bytes->size()), "") << entry.path();
    }
  }
  ASSERT_FALSE(seeds.empty()) << "the seed corpus is missing";
  std::mt19937_64 rng(testing::TestSeed());
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> input = seeds[rng() % seeds.size()];
    const size_t journal_end = 4 + (input[0] | size_t{input[1]} << 8);
    for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips) {
      // Mostly the journal, sometimes the slots after it.
      const size_t at = 4 + rng() % (std::min(input.size(), journal_end + 600) - 4);
      input[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    if (rng() % 5 == 0) input.resize(4 + rng() % (input.size() - 4));
    ASSERT_EQ(testing::CheckJournalRecovery(input.data(), input.size()), "") << "mutation " << i;
  }
}

}  // namespace
}  // namespace argus
