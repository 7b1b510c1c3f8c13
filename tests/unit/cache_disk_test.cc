// The cache over the disk tier: pages moved to disk and back, attention over sequences partly on
// disk (bit-identical to all in RAM), save and restore across a restart, prefix pages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/core.h"
#include "argus/store.h"
#include "cache/placement_access.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::RandomValues;
using testing::TempDir;

constexpr uint32_t kAllExact = UINT32_MAX;  // StorePrefix: every token computed exactly

std::unique_ptr<DiskTier> OpenDisk(const std::string& dir, size_t staging = size_t{64} << 20) {
  DiskTierOptions o;
  o.dir = dir;
  o.disk_budget_bytes = size_t{1} << 30;
  o.staging_budget_bytes = staging;
  auto disk = DiskTier::Open(o);
  EXPECT_TRUE(disk.ok()) << disk.status().ToString();
  return disk.ok() ? std::move(disk).value() : nullptr;
}

CacheGeometry Geometry() { return {2, 8, 2, 64}; }  // 2 layers, GQA 4

std::unique_ptr<KvCache> MakeCache(DiskTier* disk, const std::string& k = "f16",
                                   const std::string& v = "f16", uint32_t page_tokens = 16,
                                   size_t ram = size_t{64} << 20) {
  CacheOptions o;
  o.geometry = Geometry();
  o.page_tokens = page_tokens;
  o.ram_budget_bytes = ram;
  o.k_codec = k;
  o.v_codec = v;
  o.disk = disk;
  auto cache = KvCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(cache).value();
}

// Appends n_tokens of random K/V (seeded by salt) to every layer.
SeqId Fill(KvCache& cache, uint32_t n_tokens, uint64_t salt) {
  SeqId seq = cache.CreateSequence().value();
  const size_t n = size_t{n_tokens} * Geometry().n_kv_heads * Geometry().head_dim;
  for (uint32_t l = 0; l < Geometry().n_layers; ++l) {
    auto k = RandomValues(n, salt * 10 + l), v = RandomValues(n, salt * 10 + l + 5);
    EXPECT_TRUE(cache.Append(seq, l, k, v).ok());
  }
  return seq;
}

std::vector<float> Decode(KvCache& cache, SeqId seq, uint32_t layer, unsigned n_threads,
                          double epsilon = 0, AttentionStats* stats_out = nullptr) {
  ThreadPool pool(n_threads);
  AttentionEngine engine(pool);
  const CacheGeometry g = Geometry();
  auto q = RandomValues(size_t{g.n_q_heads} * g.head_dim, 99 + layer);
  std::vector<float> out(q.size());
  AttentionOptions options;
  options.epsilon = epsilon;
  auto stats = engine.Decode(cache, seq, layer, q.data(), out.data(), options);
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (stats.ok() && stats_out) *stats_out = *stats;
  return out;
}

std::vector<PageId> FullPages(const KvCache& cache, SeqId seq, uint32_t layer) {
  std::vector<PageId> ids;
  const std::vector<PageView> pages = cache.Pages(seq, layer).value();
  for (const PageView& page : pages)
    if (page.key_min != nullptr) ids.push_back(page.id);
  return ids;
}

// The bytes of a page in RAM, through the view attention reads.
std::vector<std::byte> PageBytes(const KvCache& cache, SeqId seq, uint32_t layer, PageId page) {
  const std::vector<PageView> views = cache.Pages(seq, layer).value();
  for (const PageView& view : views) {
    if (view.id == page && view.bytes != nullptr) return {view.bytes, view.bytes + view.n_bytes};
  }
  ADD_FAILURE() << "page " << page << " is not in RAM";
  return {};
}

TEST(CacheDisk, MoveToDiskAndBackKeepsTheBytesAndMovesTheAccounting) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get(), "q8_0", "q4_0");
  SeqId seq = Fill(*cache, 70, 1);
  const PageId page = FullPages(*cache, seq, 1)[2];
  const auto before = PageBytes(*cache, seq, 1, page);
  const size_t ram_before = cache->stats().ram.used_bytes;

  ASSERT_TRUE(cache->MoveToDisk(page).ok());
  CacheStats s = cache->stats();
  EXPECT_EQ(PageTableOf(*cache).tier[page], TierKind::kDisk);
  EXPECT_EQ(s.ram.used_bytes, ram_before - before.size());
  EXPECT_EQ(s.n_disk_pages, 1u);
  EXPECT_EQ(s.disk_page_bytes, before.size());
  EXPECT_EQ(s.disk.n_pages, 1u);
  EXPECT_EQ(cache->MoveToDisk(page).code(), StatusCode::kInvalidArgument);  // already there

  ASSERT_TRUE(cache->MoveToRam(page).ok());
  EXPECT_EQ(PageBytes(*cache, seq, 1, page), before);
  EXPECT_EQ(cache->stats().ram.used_bytes, ram_before);
  EXPECT_EQ(disk->stats().n_pages, 0u);  // the disk copy is erased
}

TEST(CacheDisk, MoveRefusesActivePinnedAndDisklessPages) {
  auto diskless = MakeCache(nullptr);
  SeqId seq = Fill(*diskless, 40, 2);
  EXPECT_EQ(diskless->MoveToDisk(FullPages(*diskless, seq, 0)[0]).code(),
            StatusCode::kInvalidArgument);

  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  seq = Fill(*cache, 40, 2);
  const auto pages = cache->Pages(seq, 0).value();
  Status active = cache->MoveToDisk(pages.back().id);  // 40 = 2 full pages + 8 tokens
  EXPECT_EQ(active.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(active.message().find("not a full page"), std::string::npos) << active.ToString();
  const_cast<PageTable&>(PageTableOf(*cache)).pin_count[pages[0].id] = 1;
  Status pinned = cache->MoveToDisk(pages[0].id);
  EXPECT_NE(pinned.message().find("pinned"), std::string::npos) << pinned.ToString();
  EXPECT_EQ(PageTableOf(*cache).tier[pages[0].id], TierKind::kRam);
}

TEST(CacheDisk, MoveToRamOverBudgetLeavesThePageOnDisk) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  CacheOptions probe;
  probe.geometry = Geometry();
  probe.page_tokens = 16;
  const size_t need = KvCache::RequiredRamBytes(probe, 64).value();
  auto cache = MakeCache(disk.get(), "f16", "f16", 16, need);
  SeqId seq = Fill(*cache, 64, 3);
  const auto full = FullPages(*cache, seq, 0);
  ASSERT_TRUE(cache->MoveToDisk(full[0]).ok());
  // Fill the freed RAM with another sequence's page, then ask for the page back.
  SeqId other = cache->CreateSequence().value();
  const size_t n = size_t{16} * Geometry().n_kv_heads * Geometry().head_dim;
  ASSERT_TRUE(cache->Append(other, 0, RandomValues(n, 7), RandomValues(n, 8)).ok());
  Status status = cache->MoveToRam(full[0]);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_EQ(PageTableOf(*cache).tier[full[0]], TierKind::kDisk);
  EXPECT_EQ(disk->stats().n_pages, 1u);
}

// Every layer of a 200-token sequence (12 full pages + an active one per layer) with `on_disk`
// of its full pages moved to disk gives the same attention output, bit for bit, as all in RAM.
void ExpectDiskAttentionIdentical(const std::string& k, const std::string& v, size_t staging,
                                  double fraction_on_disk) {
  TempDir dir;
  auto disk = OpenDisk(dir.path(), staging);
  auto cache = MakeCache(disk.get(), k, v);
  SeqId seq = Fill(*cache, 200, 4);
  std::vector<std::vector<float>> expected;
  for (uint32_t l = 0; l < Geometry().n_layers; ++l) expected.push_back(Decode(*cache, seq, l, 1));
  uint32_t n_moved = 0;
  for (uint32_t l = 0; l < Geometry().n_layers; ++l) {
    const auto full = FullPages(*cache, seq, l);
    for (size_t i = 0; i < full.size() * fraction_on_disk; ++i) {
      ASSERT_TRUE(cache->MoveToDisk(full[i]).ok());
      ++n_moved;
    }
  }
  for (unsigned threads : {1u, 2u, 4u}) {
    for (uint32_t l = 0; l < Geometry().n_layers; ++l) {
      AttentionStats stats;
      EXPECT_EQ(Decode(*cache, seq, l, threads, 0, &stats), expected[l])
          << k << "/" << v << " layer " << l << ", " << threads << " threads";
      EXPECT_EQ(stats.n_disk_pages_read, n_moved / Geometry().n_layers);
    }
  }
  EXPECT_EQ(disk->stats().staging_used_bytes, 0u);  // every staged page was released
}

TEST(CacheDisk, AttentionPartlyOnDiskIsBitIdenticalToAllInRam) {
  ExpectDiskAttentionIdentical("f16", "f16", size_t{64} << 20, 0.5);
  ExpectDiskAttentionIdentical("q8_0", "q4_0", size_t{64} << 20, 0.9);
  ExpectDiskAttentionIdentical("int4:channel", "int4", size_t{64} << 20, 1.0);
}

TEST(CacheDisk, AttentionStreamsThroughAStagingBudgetSmallerThanTheLayer) {
  // A 16-token f16 page of 2 heads x 64 is 8 KiB; 12 pages on disk need 96 KiB and more with
  // slot headers: 48 KiB of staging forces the read-ahead to wait for releases.
  ExpectDiskAttentionIdentical("f16", "f16", size_t{48} << 10, 1.0);
}

// 64 pages of a layer on disk split into 32 chunks of two: two threads run two chunks at once,
// four pages, and the staging holds three. The call splits into chunks of one page instead of
// refusing; the output is the all-in-RAM one up to the order of the chunks' merge.
TEST(CacheDisk, AttentionSplitsIntoSmallerChunksWhenAWindowOutgrowsTheStaging) {
  TempDir probe_dir, dir;
  auto probe = OpenDisk(probe_dir.path());
  ASSERT_NE(probe, nullptr);
  const CacheGeometry g = Geometry();
  const size_t page_bytes = size_t{16} * g.n_kv_heads * g.head_dim * 2 * sizeof(uint16_t);
  auto disk = OpenDisk(dir.path(), 3 * probe->SlotBytes(page_bytes));
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 1024, 6);
  const std::vector<float> expected = Decode(*cache, seq, 0, 2);
  const std::vector<PageId> full = FullPages(*cache, seq, 0);
  ASSERT_EQ(full.size(), 64u);
  for (PageId page : full) ASSERT_TRUE(cache->MoveToDisk(page).ok());
  AttentionStats stats;
  const std::vector<float> out = Decode(*cache, seq, 0, 2, 0, &stats);
  EXPECT_EQ(stats.n_disk_pages_read, 64u);
  ASSERT_EQ(out.size(), expected.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-5) << i;
  EXPECT_LE(disk->stats().staging_peak_bytes, 3 * probe->SlotBytes(page_bytes));
}

TEST(CacheDisk, StagingTooSmallForOneChunkIsResourceExhausted) {
  TempDir dir;
  auto disk = OpenDisk(dir.path(), 12 << 10);  // one page write fits, a chunk read does not
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 200, 5);
  for (PageId page : FullPages(*cache, seq, 0)) ASSERT_TRUE(cache->MoveToDisk(page).ok());
  ThreadPool pool(1);
  AttentionEngine engine(pool);
  std::vector<float> q(size_t{8} * 64, 0.5f), out(q.size());
  auto stats = engine.Decode(*cache, seq, 0, q.data(), out.data());
  EXPECT_EQ(stats.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(stats.status().message().find("staging budget"), std::string::npos);
}

TEST(CacheDisk, CertifiedSkippingDoesNotReadSkippedDiskPages) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  // Keys of the old pages are small, the recent ones large: the old pages carry no mass.
  SeqId seq = cache->CreateSequence().value();
  const CacheGeometry g = Geometry();
  const size_t row = size_t{g.n_kv_heads} * g.head_dim;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    auto k = RandomValues(row * 256, 11 + l, 0.01f);
    auto recent = RandomValues(row * 32, 21 + l, 8.0f);
    std::copy(recent.begin(), recent.end(), k.end() - static_cast<ptrdiff_t>(recent.size()));
    ASSERT_TRUE(cache->Append(seq, l, k, RandomValues(row * 256, 31 + l)).ok());
  }
  const auto expected = Decode(*cache, seq, 0, 1, 1e-2);
  const auto full = FullPages(*cache, seq, 0);
  for (size_t i = 0; i + 2 < full.size(); ++i) ASSERT_TRUE(cache->MoveToDisk(full[i]).ok());
  const uint64_t reads_before = disk->stats().n_reads;
  AttentionStats stats;
  EXPECT_EQ(Decode(*cache, seq, 0, 2, 1e-2, &stats), expected);
  EXPECT_GT(stats.n_tiles_skipped, 0u);
  EXPECT_LT(stats.n_disk_pages_read, full.size() - 2);
  EXPECT_EQ(disk->stats().n_reads - reads_before, stats.n_disk_pages_read);
}

TEST(CacheDisk, CropForkAndReleaseOfDiskPages) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 64, 6);
  for (uint32_t l = 0; l < Geometry().n_layers; ++l)
    for (PageId page : FullPages(*cache, seq, l)) ASSERT_TRUE(cache->MoveToDisk(page).ok());
  EXPECT_EQ(disk->stats().n_pages, 8u);
  SeqId child = cache->Fork(seq).value();
  const auto parent_out = Decode(*cache, seq, 1, 1);
  EXPECT_EQ(Decode(*cache, child, 1, 1), parent_out);
  // The child cuts its third page in two: that page is read from disk into a new active page,
  // the parent keeps its own.
  ASSERT_TRUE(cache->Crop(child, 40).ok());
  EXPECT_EQ(cache->Length(child, 0).value(), 40u);
  EXPECT_EQ(disk->stats().n_pages, 8u);  // pages 3 and 4 are still the parent's
  ASSERT_TRUE(cache->Release(seq).ok());
  EXPECT_EQ(disk->stats().n_pages, 4u);  // the child's two full pages per layer remain
  ASSERT_TRUE(cache->Release(child).ok());
  EXPECT_EQ(disk->stats().n_pages, 0u);
}

TEST(CacheDisk, CorruptDiskPageIsNeverServed) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 40, 7);
  const PageId page = FullPages(*cache, seq, 0)[0];
  ASSERT_TRUE(cache->MoveToDisk(page).ok());
  // Flip one byte in the middle of every slot file: the page's payload is among them.
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().filename().string().rfind("slots-", 0) != 0) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(entry.file_size() / 2));
    char c;
    f.seekg(static_cast<std::streamoff>(entry.file_size() / 2));
    f.get(c);
    f.seekp(static_cast<std::streamoff>(entry.file_size() / 2));
    f.put(static_cast<char>(c ^ 0x10));
  }
  Status status = cache->MoveToRam(page);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_EQ(PageTableOf(*cache).tier[page], TierKind::kDisk);
  ThreadPool pool(1);
  AttentionEngine engine(pool);
  std::vector<float> q(size_t{8} * 64, 0.5f), out(q.size());
  EXPECT_EQ(engine.Decode(*cache, seq, 0, q.data(), out.data()).status().code(),
            StatusCode::kCorruption);
}

TEST(CacheDisk, SaveAndRestoreAcrossARestartContinuesIdentically) {
  TempDir dir;
  std::vector<float> expected_now, expected_next;
  const size_t row = size_t{Geometry().n_kv_heads} * Geometry().head_dim;
  auto next_k = RandomValues(row * 3, 41), next_v = RandomValues(row * 3, 42);
  {
    auto disk = OpenDisk(dir.path());
    auto cache = MakeCache(disk.get(), "q8_0", "q8_0");
    SeqId seq = Fill(*cache, 75, 8);  // 4 full pages and an active one of 11 tokens
    ASSERT_TRUE(cache->MoveToDisk(FullPages(*cache, seq, 0)[1]).ok());
    ASSERT_TRUE(cache->Save(seq, "story").ok());
    ASSERT_TRUE(cache->Save(seq, "story").ok());  // replaces: the old save's pages go
    expected_now = Decode(*cache, seq, 0, 1);
    for (uint32_t l = 0; l < Geometry().n_layers; ++l)
      ASSERT_TRUE(cache->Append(seq, l, next_k, next_v).ok());
    expected_next = Decode(*cache, seq, 1, 1);
  }
  auto disk = OpenDisk(dir.path());  // a restart: the store recovers from its journal
  // 2 layers x 5 pages saved; the spilled page of the first cache was erased with it.
  EXPECT_EQ(disk->stats().n_pages, 10u);
  auto cache = MakeCache(disk.get(), "q8_0", "q8_0");
  auto seq = cache->Restore("story");
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  EXPECT_EQ(cache->Length(*seq, 1).value(), 75u);
  EXPECT_EQ(Decode(*cache, *seq, 0, 2), expected_now);
  for (uint32_t l = 0; l < Geometry().n_layers; ++l)
    ASSERT_TRUE(cache->Append(*seq, l, next_k, next_v).ok());
  EXPECT_EQ(Decode(*cache, *seq, 1, 2), expected_next);

  EXPECT_EQ(cache->Restore("missing").status().code(), StatusCode::kNotFound);
  auto other = MakeCache(disk.get(), "q8_0", "q8_0", 32);
  Status mismatch = other->Restore("story").status();
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("16-token pages"), std::string::npos) << mismatch.ToString();
  ASSERT_TRUE(cache->EraseSave("story").ok());
  EXPECT_EQ(disk->stats().n_pages, 0u);
}

TEST(CacheDisk, RestoreOverBudgetChangesNothing) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 64, 9);
  ASSERT_TRUE(cache->Save(seq, "s").ok());
  auto small = MakeCache(disk.get(), "f16", "f16", 16, 4096);
  auto restored = small->Restore("s");
  EXPECT_EQ(restored.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(small->stats().n_pages, 0u);
  EXPECT_EQ(small->stats().ram.used_bytes, 0u);
}

TEST(CacheDisk, PrefixPagesAreFoundByTokensAndFingerprintOnly) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  std::vector<int32_t> tokens(70);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 + 1);
  std::vector<std::vector<float>> expected;
  {
    auto cache = MakeCache(disk.get());
    SeqId seq = Fill(*cache, 70, 10);
    PrefixStoreStats stored;
    Status status = cache->StorePrefix(seq, "model-a", tokens, kAllExact, stored);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(stored.n_stored, 8u);  // 4 full pages x 2 layers
    PrefixStoreStats again;
    ASSERT_TRUE(cache->StorePrefix(seq, "model-a", tokens, kAllExact, again).ok());
    EXPECT_EQ(again.n_stored, 0u);
    EXPECT_EQ(again.n_present, 8u);
    ASSERT_TRUE(cache->Crop(seq, 64).ok());
    for (uint32_t l = 0; l < Geometry().n_layers; ++l)
      expected.push_back(Decode(*cache, seq, l, 1));
  }
  auto cache = MakeCache(disk.get());
  SeqId seq = cache->CreateSequence().value();
  EXPECT_EQ(cache->LoadPrefix(seq, "model-b", tokens).value(), 0u);  // another model
  auto changed = tokens;
  changed[40] += 1;  // page 2 differs: pages 0 and 1 still match
  EXPECT_EQ(cache->LoadPrefix(seq, "model-a", changed).value(), 32u);
  ASSERT_TRUE(cache->Release(seq).ok());
  seq = cache->CreateSequence().value();
  EXPECT_EQ(cache->LoadPrefix(seq, "model-a", tokens).value(), 64u);
  for (uint32_t l = 0; l < Geometry().n_layers; ++l)
    EXPECT_EQ(Decode(*cache, seq, l, 1), expected[l]);
  auto other_codec = MakeCache(disk.get(), "q8_0", "q8_0");
  SeqId s2 = other_codec->CreateSequence().value();
  EXPECT_EQ(other_codec->LoadPrefix(s2, "model-a", tokens).value(), 0u);  // codecs are keyed
}

TEST(CacheDisk, SaveThatFailsPartWayLeavesNoPagesBehind) {
  TempDir dir;
  DiskTierOptions o;
  o.dir = dir.path();
  // 80 pages of 8 KiB, slots of 8 KiB + 512 (header, 512-byte alignment): room for 70, so the
  // first batch of 64 is written and the second is refused.
  o.disk_budget_bytes = 70 * (8192 + 512);
  auto disk = DiskTier::Open(o).value();
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 640, 12);  // 40 full pages per layer
  Status status = cache->Save(seq, "big");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_EQ(disk->stats().n_pages, 0u);
  EXPECT_TRUE(disk->RecordNames().empty());
}

TEST(CacheDisk, ResaveErasesTheOldPagesEvenWhenOneIsAlreadyGone) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 48, 13);  // 3 full pages per layer
  ASSERT_TRUE(cache->Save(seq, "s").ok());
  const std::vector<PageKey> old_keys = disk->Keys();
  ASSERT_EQ(old_keys.size(), 6u);
  ASSERT_TRUE(disk->Erase(std::span(old_keys).first(1)).ok());
  ASSERT_TRUE(cache->Save(seq, "s").ok());
  for (const PageKey& key : old_keys) EXPECT_FALSE(disk->Contains(key));
  EXPECT_EQ(disk->stats().n_pages, 6u);
}

TEST(CacheDisk, RestoreOfASaveMissingAPageIsCorruption) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 48, 14);
  ASSERT_TRUE(cache->Save(seq, "s").ok());
  const std::vector<PageKey> keys = disk->Keys();
  ASSERT_TRUE(disk->Erase(std::span(keys).first(1)).ok());
  auto restored = cache->Restore("s");
  EXPECT_EQ(restored.status().code(), StatusCode::kCorruption) << restored.status().ToString();
  EXPECT_NE(restored.status().message().find("missing"), std::string::npos);
  EXPECT_EQ(cache->stats().n_sequences, 1u);
}

TEST(CacheDisk, HostileManifestIsCorruptionNotACrash) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  // A valid header claiming 2^32-1 layers, then nothing.
  std::vector<std::byte> bytes;
  auto put = [&](const auto& value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  for (char c : std::string("ARGUSSQ1")) put(c);
  for (uint32_t x : {UINT32_MAX, 8u, 2u, 64u, 16u}) put(x);
  put(uint16_t{3});
  for (char c : std::string("f16")) put(c);
  put(uint64_t{1});
  ASSERT_TRUE(disk->PutRecord("seq:evil", bytes).ok());
  auto restored = cache->Restore("evil");
  EXPECT_EQ(restored.status().code(), StatusCode::kCorruption) << restored.status().ToString();
}

TEST(CacheDisk, ReleasingManyDiskPagesWritesOneJournalRecord) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 160, 15);
  for (uint32_t l = 0; l < Geometry().n_layers; ++l)
    for (PageId page : FullPages(*cache, seq, l)) ASSERT_TRUE(cache->MoveToDisk(page).ok());
  ASSERT_EQ(disk->stats().n_pages, 20u);
  const size_t records = disk->stats().n_journal_records;
  ASSERT_TRUE(cache->Release(seq).ok());
  EXPECT_EQ(disk->stats().n_pages, 0u);
  EXPECT_EQ(disk->stats().n_journal_records, records + 1);
}

TEST(CacheDisk, PrefixPagesPastTheExactTokensAreNotStored) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  std::vector<int32_t> tokens(70, 3);
  auto cache = MakeCache(disk.get());
  SeqId seq = Fill(*cache, 70, 10);
  // Tokens 40 on came from approximate attention: pages 0 and 1 (tokens 0-31) are exact,
  // page 2 (32-47) reaches past them.
  PrefixStoreStats stored;
  ASSERT_TRUE(cache->StorePrefix(seq, "m", tokens, 40, stored).ok());
  EXPECT_EQ(stored.n_stored, 4u);   // 2 pages x 2 layers
  EXPECT_EQ(stored.n_inexact, 4u);  // pages 2 and 3
  auto fresh = MakeCache(disk.get());
  SeqId s2 = fresh->CreateSequence().value();
  EXPECT_EQ(fresh->LoadPrefix(s2, "m", tokens).value(), 32u);
}

TEST(CacheDisk, PrefixKeysNameTheActiveCodecToo) {
  TempDir dir;
  auto disk = OpenDisk(dir.path());
  std::vector<int32_t> tokens(40, 5);
  auto f16 = MakeCache(disk.get(), "q8_0", "q8_0");
  SeqId seq = Fill(*f16, 40, 16);
  PrefixStoreStats stored;
  ASSERT_TRUE(f16->StorePrefix(seq, "m", tokens, kAllExact, stored).ok());
  ASSERT_EQ(stored.n_stored, 4u);
  CacheOptions o;
  o.geometry = Geometry();
  o.page_tokens = 16;
  o.ram_budget_bytes = size_t{64} << 20;
  o.k_codec = o.v_codec = "q8_0";
  o.active_codec = "f32";  // q8_0 pages filled from f32 rows differ from those filled from f16
  o.disk = disk.get();
  auto f32 = KvCache::Create(o).value();
  SeqId s2 = f32->CreateSequence().value();
  EXPECT_EQ(f32->LoadPrefix(s2, "m", tokens).value(), 0u);
}

}  // namespace
}  // namespace argus
