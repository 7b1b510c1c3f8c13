// `argus-bench store` as a user runs it, on a tiny grid: the JSON report's shape, the table, and
// the report without fio.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_run.h"
#include "core/files.h"
#include "test_util.h"

namespace argus {
namespace {

struct BenchRun {
  int exit_code = -1;
  std::string out, err;
  nlohmann::json report;
};

// Runs `argus-bench store` on pages of `page_sizes` at queue depths 1 and 4 in dir.
BenchRun RunBenchStore(const std::string& dir, const std::string& page_sizes,
                       const std::string& extra) {
  const std::string json_path = dir + "/out.json";
  const testing::CliRun cli = testing::RunArgusBench("store --dir " + dir + "/bench --json " +
                                                json_path + " --page-sizes " + page_sizes +
                                                " --queue-depths 1,4 --bytes 1M --reps 1 " + extra);
  BenchRun run{cli.exit_code, cli.out, cli.err, {}};
  auto json = ReadFileBytes(json_path);
  if (json.ok()) {
    run.report = nlohmann::json::parse(reinterpret_cast<const char*>(json->data()),
                                       reinterpret_cast<const char*>(json->data()) + json->size(),
                                       nullptr, /*allow_exceptions=*/false);
  }
  return run;
}

// Every write and read point is there once, with positive ARGUS figures, and with fio's figure
// and the ratio exactly when fio ran.
void ExpectReportShape(const nlohmann::json& report, const std::vector<uint64_t>& pages,
                       bool with_fio) {
  ASSERT_TRUE(report.is_object()) << report.dump();
  EXPECT_EQ(report["fio"]["available"], with_fio) << report["fio"].dump();
  EXPECT_TRUE(report["store"]["direct_io"].is_boolean());
  EXPECT_TRUE(report["store"]["io_backend"].is_string());
  auto check_figures = [&](const nlohmann::json& p) {
    EXPECT_GT(p["argus"]["gbps"].get<double>(), 0) << p.dump();
    EXPECT_GE(p["slot_bytes"].get<uint64_t>(), p["page_bytes"].get<uint64_t>()) << p.dump();
    EXPECT_EQ(p["pages"], 1048576 / p["page_bytes"].get<uint64_t>()) << p.dump();
    EXPECT_EQ(p.contains("vs_fio"), with_fio) << p.dump();
    if (with_fio) {
      EXPECT_NEAR(p["vs_fio"].get<double>(),
                  p["argus"]["gbps"].get<double>() / p["fio"]["gbps"].get<double>(), 1e-9);
    }
  };
  ASSERT_EQ(report["writes"].size(), pages.size());
  for (const auto& p : report["writes"]) check_figures(p);
  ASSERT_EQ(report["reads"].size(), pages.size() * 4);  // x 2 orders x 2 queue depths
  for (uint64_t page : pages) {
    for (const char* order : {"sequential", "random"}) {
      for (uint32_t qd : {1u, 4u}) {
        int n_found = 0;
        for (const auto& p : report["reads"]) {
          if (p["page_bytes"] == page && p["order"] == order && p["queue_depth"] == qd) {
            ++n_found;
            check_figures(p);
          }
        }
        EXPECT_EQ(n_found, 1) << page << " " << order << " qd " << qd;
      }
    }
  }
  EXPECT_FALSE(report.contains("targets"));  // measured figures only, no verdicts
}

TEST(BenchStoreCli, TinyGridReportsEveryPointBesideFioAndCleansUp) {
  ARGUS_SKIP_WITHOUT_BENCH();
  testing::TempDir dir;
  // Few points (fio takes ~0.4 s a run), and a small decode section.
  BenchRun run = RunBenchStore(dir.path(), "64K",
                               "--decode-model qwen2.5-0.5b --decode-tokens 2048 "
                               "--decode-layers 1 --decode-reps 1 --decode-fractions 0,0.5");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // Decode: all in RAM, then half of the pages on disk, read at a rate beside fio's.
  const nlohmann::json& decode = run.report["decode"];
  ASSERT_EQ(decode["cases"].size(), 2u) << decode.dump();
  EXPECT_EQ(decode["cases"][0]["time_vs_ram"], 1.0);
  const nlohmann::json& half = decode["cases"][1];
  EXPECT_EQ(half["pages_on_disk"], 4);  // 8 full pages of 256 tokens, half moved
  EXPECT_GT(half["disk_bytes_per_token"].get<double>(), 0);
  EXPECT_EQ(half.contains("disk_read_vs_reference"), run.report["fio"]["available"] == true)
      << half.dump();
  EXPECT_NE(run.out.find("decode with pages on disk"), std::string::npos) << run.out;
  const bool with_fio = run.report["fio"]["available"] == true;
  if (!with_fio) {
    // Only a machine without fio may report without it, and then it must say so.
    EXPECT_NE(run.err.find("fio"), std::string::npos) << run.err;
  }
  ExpectReportShape(run.report, {65536}, with_fio);
  EXPECT_NE(run.out.find("sequential"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("random"), std::string::npos) << run.out;
  // The store and fio's file are removed; the directory stays, empty.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() + "/bench"));
}

TEST(BenchStoreCli, MissingFioIsSaidAndAbsoluteFiguresRemain) {
  ARGUS_SKIP_WITHOUT_BENCH();
  testing::TempDir dir;
  BenchRun run = RunBenchStore(dir.path(), "64K,128K",
                               "--decode-tokens 0 --fio " + dir.path() + "/no-such-fio");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("no-such-fio"), std::string::npos) << run.err;
  EXPECT_NE(run.report["fio"]["reason"].get<std::string>().find("not installed"),
            std::string::npos);
  ExpectReportShape(run.report, {65536, 131072}, false);
}

}  // namespace
}  // namespace argus
