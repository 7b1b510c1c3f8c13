// argus store check / argus store compact: maintenance of a disk tier directory.
#include <fmt/core.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "argus/store.h"
#include "cli/commands.h"

namespace argus::cli {
namespace {

// Opens an existing store (read-only for check: it creates, cuts and writes nothing). The
// directory must exist and hold files: a check of a mistyped path must fail, not succeed on
// nothing. The disk budget is the size of the files, which bounds the slots of the pages they
// hold. Errors name the store and what `store` can do about them.
Result<std::unique_ptr<DiskTier>> OpenExisting(const std::string& dir, bool read_only) {
  std::error_code error;
  size_t file_bytes = 0, n_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (!entry.is_regular_file(error)) continue;
    file_bytes += entry.file_size(error);
    ++n_files;
  }
  if (error) return Status::NotFound(dir + ": " + error.message());
  if (n_files == 0) return Status::NotFound(dir + " is not a disk store (no files)");
  DiskTierOptions options;
  options.dir = dir;
  options.disk_budget_bytes = std::max<size_t>(file_bytes, 1);
  options.metadata_budget_bytes = std::max(options.metadata_budget_bytes, file_bytes);
  options.verify_on_open = false;  // check verifies each page once; compact needs no reads
  options.read_only = read_only;
  return DiskTier::Open(options);
}

void RunCheck(const std::string& dir, bool json) {
  auto opened = OpenExisting(dir, /*read_only=*/true);
  if (!opened.ok() && opened.status().code() == StatusCode::kCorruption) {
    // A journal damaged in place: no page can be trusted to be the one published. Said as a
    // finding, with what to do, not only as an error.
    if (json) {
      nlohmann::json j = {
          {"dir", dir}, {"ok", false}, {"journal_damage", opened.status().message()}};
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("store        {}\n", dir);
      fmt::print("journal      damaged: {}\n", opened.status().message());
      fmt::print(
          "             (a run with --prompt-cache moves such a store aside and starts "
          "an empty one)\n");
    }
  }
  auto store = ValueOrThrow(std::move(opened));
  const StoreCheckReport report = ValueOrThrow(store->Check());
  const DiskTierStats stats = store->stats();
  // report.n_pages counts the verified pages; report.lost names the others, stats counts them.
  const size_t n_lost = std::max(stats.n_lost_pages, report.lost.size());
  if (json) {
    nlohmann::json lost = nlohmann::json::array();
    for (const auto& [key, why] : report.lost) {
      lost.push_back({{"key", key.ToString()}, {"why", why}});
    }
    nlohmann::json j = {
        {"dir", dir},
        {"ok", n_lost == 0},
        {"pages", report.n_pages},
        {"payload_bytes", report.payload_bytes},
        {"slot_bytes", report.slot_bytes},
        {"records", report.n_records},
        {"lost_pages", n_lost},
        {"lost", lost},
        {"journal_bytes", stats.journal_bytes},
        {"journal_records", stats.n_journal_records},
        {"journal_damaged_tail_bytes", stats.journal_dropped_bytes},
        {"file_bytes", stats.file_bytes},
        {"io_backend", stats.io_backend},
        {"direct_io", stats.direct_io},
    };
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("store        {}\n", dir);
    fmt::print("pages        {} verified ({} payload bytes in {} slot bytes)\n", report.n_pages,
               report.payload_bytes, report.slot_bytes);
    fmt::print("records      {}\n", report.n_records);
    fmt::print("journal      {} bytes, {} records\n", stats.journal_bytes, stats.n_journal_records);
    if (stats.journal_dropped_bytes > 0) {
      fmt::print(
          "journal tail {} damaged bytes after byte {} (a write cut short; the next writer cuts "
          "them)\n",
          stats.journal_dropped_bytes, stats.journal_bytes);
    }
    fmt::print("files        {} bytes; {}, direct I/O {}\n", stats.file_bytes, stats.io_backend,
               stats.direct_io ? "on" : "off");
    fmt::print("lost pages   {}\n", n_lost);
    for (const auto& [key, why] : report.lost) fmt::print("  {}  {}\n", key.ToString(), why);
  }
  if (n_lost > 0) {
    throw CommandError{Status::Corruption(
        fmt::format("{}: {} of {} pages lost", dir, n_lost, report.n_pages + n_lost))};
  }
}

void RunCompact(const std::string& dir) {
  auto opened = OpenExisting(dir, /*read_only=*/false);
  if (!opened.ok()) {
    throw CommandError{opened.status().WithContext(
        "store compact " + dir + " (`argus store check " + dir + "` reports what is wrong)")};
  }
  auto store = std::move(opened).value();
  const DiskTierStats before = store->stats();
  ThrowIfError(store->Compact());
  const DiskTierStats after = store->stats();
  fmt::print("journal {}: {} bytes in {} records -> {} bytes in {} records\n", dir,
             before.journal_bytes, before.n_journal_records, after.journal_bytes,
             after.n_journal_records);
}

}  // namespace

void AddStoreCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("store", "Check or compact a disk tier directory");
  cmd->require_subcommand(1);

  struct Options {
    std::string dir;
    bool json = false;
  };
  auto check_opt = std::make_shared<Options>();
  auto* check = cmd->add_subcommand(
      "check", "Verify every page; exit 1 when any is lost (the lost pages are listed)");
  check->add_option("dir", check_opt->dir, "Store directory")->required();
  check->add_flag("--json", check_opt->json, "Print JSON instead of text");
  check->callback([check_opt] { RunCheck(check_opt->dir, check_opt->json); });

  auto compact_opt = std::make_shared<Options>();
  auto* compact = cmd->add_subcommand(
      "compact", "Rewrite the journal with one record per live page and named record");
  compact->add_option("dir", compact_opt->dir, "Store directory")->required();
  compact->callback([compact_opt] { RunCompact(compact_opt->dir); });
}

}  // namespace argus::cli
