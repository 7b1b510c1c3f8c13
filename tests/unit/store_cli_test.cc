// argus store check / argus store compact, run as a user runs them, on stores
// made here.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "argus/store.h"
#include "cli_run.h"
#include "core/files.h"
#include "crash/versioned_page.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::CliRun;
using testing::RunArgus;
using testing::TestPageKey;
using testing::VersionedPayload;

std::unique_ptr<DiskTier> OpenStore(const std::string &dir) {
  DiskTierOptions options;
  options.dir = dir;
  options.disk_budget_bytes = size_t{64} << 20;
  auto store = DiskTier::Open(options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

// Pages 0..4 of sizes that need different slot sizes, and one named record.
// Returns the sum of the pages' payload and slot bytes as the store reported
// them at Put.
struct MadeStore {
  size_t payload_bytes = 0, slot_bytes = 0;
};
constexpr size_t kPageBytes[] = {300, 5000, 70000, 5000, 131072};
constexpr size_t kNumPages = std::size(kPageBytes);

MadeStore MakeStore(const std::string &dir) {
  auto store = OpenStore(dir);
  MadeStore made;
  if (store == nullptr) return made;
  for (size_t i = 0; i < kNumPages; ++i) {
    auto payload = VersionedPayload(TestPageKey(i), 1, kPageBytes[i]);
    EXPECT_TRUE(store->Put({TestPageKey(i), "f16/f16", payload}).ok());
    auto info = store->Info(TestPageKey(i));
    EXPECT_TRUE(info.ok());
    if (info.ok()) made.slot_bytes += info->slot_bytes;
    made.payload_bytes += kPageBytes[i];
  }
  const std::string manifest = "sequence manifest";
  EXPECT_TRUE(store->PutRecord("seq/1", std::as_bytes(std::span(manifest))).ok());
  return made;
}

// Flips one byte in the middle of page i's stored payload. The payload's first
// 64 bytes are unique to it (key, version, then its stream), so finding them in
// the store's files locates the page without depending on the slot layout.
void FlipPayloadByte(const std::string &dir, size_t i) {
  const auto payload = VersionedPayload(TestPageKey(i), 1, kPageBytes[i]);
  const std::string needle(reinterpret_cast<const char *>(payload.data()), 64);
  int n_found = 0;
  for (const auto &entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    auto bytes = ReadFileBytes(entry.path().string());
    ASSERT_TRUE(bytes.ok());
    const std::string text(reinterpret_cast<const char *>(bytes->data()), bytes->size());
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n_found;
      std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(static_cast<std::streamoff>(at + kPageBytes[i] / 2));
      const char flipped = static_cast<char>(text[at + kPageBytes[i] / 2] ^ 0x10);
      file.write(&flipped, 1);
      ASSERT_TRUE(file.good()) << entry.path();
    }
  }
  ASSERT_EQ(n_found, 1) << "page " << i << "'s payload should be stored exactly once";
}

TEST(StoreCli, CheckOfACleanStoreCountsPagesBytesAndRecordsAndExitsZero) {
  testing::TempDir dir;
  const MadeStore made = MakeStore(dir / "store");
  CliRun text = RunArgus("store check " + dir / "store");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("pages        5 verified ("), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("lost pages   0"), std::string::npos) << text.out;

  CliRun json = RunArgus("store check --json " + dir / "store");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["pages"], kNumPages);
  EXPECT_EQ(j["payload_bytes"], made.payload_bytes);
  EXPECT_EQ(j["payload_bytes"], 300 + 5000 + 70000 + 5000 + 131072);
  EXPECT_EQ(j["slot_bytes"], made.slot_bytes);
  EXPECT_EQ(j["records"], 1);
  EXPECT_EQ(j["lost_pages"], 0);
  EXPECT_TRUE(j["lost"].empty());
}

TEST(StoreCli, CheckNamesAPageWithAFlippedByteAndExitsNonZero) {
  testing::TempDir dir;
  MakeStore(dir / "store");
  FlipPayloadByte(dir / "store", 3);
  CliRun text = RunArgus("store check " + dir / "store");
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.out.find("pages        4 verified"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("lost pages   1"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(TestPageKey(3).ToString()), std::string::npos) << text.out;
  EXPECT_NE(text.err.find("1 of 5 pages lost"), std::string::npos) << text.err;

  CliRun json = RunArgus("store check --json " + dir / "store");
  EXPECT_EQ(json.exit_code, 1);
  auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["pages"], kNumPages - 1);
  EXPECT_EQ(j["payload_bytes"], 300 + 5000 + 70000 + 131072);
  EXPECT_EQ(j["lost_pages"], 1);
  ASSERT_EQ(j["lost"].size(), 1u);
  EXPECT_EQ(j["lost"][0]["key"], TestPageKey(3).ToString());
  EXPECT_FALSE(j["lost"][0]["why"].get<std::string>().empty());
}

TEST(StoreCli, CompactShrinksAJournalOfReplacementsAndKeepsTheLatestPages) {
  testing::TempDir dir;
  {
    auto store = OpenStore(dir / "store");
    ASSERT_NE(store, nullptr);
    for (uint64_t version = 1; version <= 20; ++version) {
      for (uint64_t k = 0; k < 3; ++k) {
        auto payload = VersionedPayload(TestPageKey(k), version, 4000);
        ASSERT_TRUE(store->Put({TestPageKey(k), "f16/f16", payload}).ok());
      }
    }
  }
  CliRun run = RunArgus("store compact " + dir / "store");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  unsigned long long before = 0, after = 0, records_before = 0, records_after = 0;
  const std::string expected_prefix = "journal " + dir / "store" + ": ";
  ASSERT_EQ(run.out.rfind(expected_prefix, 0), 0u) << run.out;
  ASSERT_EQ(std::sscanf(run.out.c_str() + expected_prefix.size(),
                        "%llu bytes in %llu records -> %llu bytes in %llu records", &before,
                        &records_before, &after, &records_after),
            4)
      << run.out;
  EXPECT_LT(after, before);
  EXPECT_LT(records_after, records_before);

  auto store = OpenStore(dir / "store");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->stats().journal_bytes, after);
  ASSERT_EQ(store->Keys().size(), 3u);
  for (uint64_t k = 0; k < 3; ++k) {
    std::vector<std::byte> payload(4000);
    ASSERT_TRUE(store->Read(TestPageKey(k), payload).ok());
    EXPECT_EQ(testing::PayloadVersion(TestPageKey(k), payload), 20u) << "key " << k;
  }
}

TEST(StoreCli, CheckOfAMissingDirectoryFailsWithoutCreatingAStore) {
  testing::TempDir dir;
  CliRun run = RunArgus("store check " + dir / "store");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find(dir / "store"), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "store"));
}

// `store check` of a directory of other files created LOCK and journal there and called it a
// healthy store; it only reads, and says the directory is not a store.
TEST(StoreCli, CheckOfADirectoryThatIsNotAStoreSaysSoAndCreatesNothing) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "other");
  std::ofstream(dir / "other" + "/notes.txt") << "not a store";
  CliRun run = RunArgus("store check " + dir / "other");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find(dir / "other" + " is not a disk store (no journal)"), std::string::npos)
      << run.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "other" + "/LOCK"));
  EXPECT_FALSE(std::filesystem::exists(dir / "other" + "/journal"));
}

// A torn journal tail is reported by check and left in place (check used to cut it silently).
TEST(StoreCli, CheckReportsATornJournalTailAndLeavesItThere) {
  testing::TempDir dir;
  MakeStore(dir / "store");
  const std::string journal = dir / "store" + "/journal";
  const auto size = std::filesystem::file_size(journal);
  std::ofstream(journal, std::ios::app | std::ios::binary) << std::string(37, '\x7f');
  CliRun run = RunArgus("store check " + dir / "store");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("journal tail 37 damaged bytes after byte " + std::to_string(size)),
            std::string::npos)
      << run.out;
  EXPECT_EQ(std::filesystem::file_size(journal), size + 37);
}

// One byte flipped inside the first journal record (valid records follow): check reports the
// damage as a finding and compact refuses naming the store, instead of an opaque failure.
TEST(StoreCli, CheckAndCompactOfAJournalDamagedInPlaceReportIt) {
  testing::TempDir dir;
  MakeStore(dir / "store");
  const std::string journal = dir / "store" + "/journal";
  std::vector<std::byte> bytes = ReadFileBytes(journal).value();
  bytes[40] ^= std::byte{0x21};
  ASSERT_TRUE(WriteFileBytes(journal, bytes).ok());
  CliRun check = RunArgus("store check " + dir / "store");
  EXPECT_EQ(check.exit_code, 1);
  EXPECT_NE(check.out.find("journal      damaged: " + journal + ": the record at byte 16"),
            std::string::npos)
      << check.out;
  CliRun compact = RunArgus("store compact " + dir / "store");
  EXPECT_EQ(compact.exit_code, 1);
  EXPECT_NE(compact.err.find("store compact " + dir / "store"), std::string::npos) << compact.err;
  EXPECT_EQ(ReadFileBytes(journal).value(), bytes);  // nothing was cut
}

}  // namespace
}  // namespace argus
