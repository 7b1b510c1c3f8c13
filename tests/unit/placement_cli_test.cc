// `argus trace`, `argus replay`, `argus-bench placement` and `argus-bench capacity` as a user
// runs them, on tiny shapes: outputs, JSON reports, and errors that name the cause.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "core/files.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::RunArgus;
using testing::RunArgusBench;
using testing::TempDir;

nlohmann::json ReadJson(const std::string& path) {
  auto bytes = ReadFileBytes(path);
  if (!bytes.ok()) return {};
  return nlohmann::json::parse(reinterpret_cast<const char*>(bytes->data()),
                               reinterpret_cast<const char*>(bytes->data()) + bytes->size(),
                               nullptr, /*allow_exceptions=*/false);
}

const char* kSmall = "--geometry 2,4,2,64 --layers 2 --prefix-tokens 1024 --steps 8 ";

TEST(PlacementCli, TraceGenerateInfoAndReplayReportTheRun) {
  TempDir dir;
  const std::string trace = dir / "t.trace";
  auto gen = RunArgus("trace generate --kind needle " + std::string(kSmall) + "-o " + trace);
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  auto info = RunArgus("trace info " + trace + " --json");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = nlohmann::json::parse(info.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << info.out;
  EXPECT_NE(info.out.find("needle"), std::string::npos) << info.out;

  // Exact with a quarter of the RAM: pages on disk, output bit-identical to all in RAM.
  auto exact = RunArgus("replay " + trace + " --profile exact --ram-budget 600K --page-tokens 64 " +
                        "--disk-dir " + (dir / "d1") + " --json");
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  const auto e = nlohmann::json::parse(exact.out, nullptr, false);
  ASSERT_FALSE(e.is_discarded()) << exact.out;
  EXPECT_TRUE(e["active"].get<bool>());
  EXPECT_EQ(e["max_rel_error"].get<double>(), 0.0);
  EXPECT_GT(e["disk_bytes_per_token"].get<double>(), 0.0);
  EXPECT_EQ(e["targets_found"], e["targets"]);

  auto text = RunArgus("replay " + trace + " --profile research --ram-budget 1M --page-tokens 64 " +
                       "--disk-dir " + (dir / "d2"));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("time per token"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("pages per state"), std::string::npos) << text.out;
}

TEST(PlacementCli, ReplayErrorsNameTheCause) {
  TempDir dir;
  const std::string trace = dir / "t.trace";
  ASSERT_EQ(
      RunArgus("trace generate --kind recall " + std::string(kSmall) + "-o " + trace).exit_code, 0);
  auto no_disk =
      RunArgus("replay " + trace + " --profile exact --ram-budget 600K --page-tokens 64");
  EXPECT_EQ(no_disk.exit_code, 1);
  EXPECT_NE(no_disk.err.find("disk tier"), std::string::npos) << no_disk.err;
  auto tiny = RunArgus("replay " + trace + " --profile research --ram-budget 8K --page-tokens 64 " +
                       "--disk-dir " + (dir / "d"));
  EXPECT_EQ(tiny.exit_code, 1);
  EXPECT_NE(tiny.err.find("pins"), std::string::npos) << tiny.err;
  auto bad_profile = RunArgus("replay " + trace + " --profile " + (dir / "missing.json"));
  EXPECT_EQ(bad_profile.exit_code, 1);
  EXPECT_NE(bad_profile.err.find("missing.json"), std::string::npos) << bad_profile.err;
  auto corrupt = RunArgus("replay " + (dir / "none.trace"));
  EXPECT_NE(corrupt.exit_code, 0);
}

TEST(PlacementCli, BenchPlacementWritesEveryRunBesideTheCascade) {
  ARGUS_SKIP_WITHOUT_BENCH();
  TempDir dir;
  const std::string json = dir / "p.json";
  auto run = RunArgusBench(
      "placement --dir " + dir.path() + " --model qwen2.5-0.5b --layers 1 " +
      "--prefix-tokens 2048 --steps 8 --page-tokens 64 --budgets 0.5,0.25 " +
      "--profiles exact,research,cascade --traces recall --activation-reps 1 " + "--json " + json);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json r = ReadJson(json);
  ASSERT_EQ(r["traces"].size(), 1u);
  ASSERT_EQ(r["traces"][0]["runs"].size(), 6u);
  for (const auto& x : r["traces"][0]["runs"]) {
    ASSERT_FALSE(x.contains("error")) << x.dump();
    EXPECT_GT(x["seconds_per_token"].get<double>(), 0.0);
    if (x["profile"] == "exact") {
      EXPECT_TRUE(x["bit_identical"].get<bool>()) << x.dump();
    }
    // Every profile's time and disk bytes against the cascade's at its budget, from this run.
    EXPECT_EQ(x.contains("time_gain_vs_cascade"), x["profile"] != "cascade") << x.dump();
    if (x["profile"] != "cascade") {
      EXPECT_GT(x["time_gain_vs_cascade"].get<double>(), 0.0) << x.dump();
      EXPECT_TRUE(x.contains("disk_gain_vs_cascade")) << x.dump();
    }
  }
  EXPECT_FALSE(r["activation"]["engine_active"].get<bool>());
  EXPECT_TRUE(r["activation"]["bit_identical"].get<bool>());
  EXPECT_FALSE(r.contains("targets"));  // measured figures only, no verdicts
  EXPECT_NE(run.out.find("time/RAM"), std::string::npos) << run.out;
}

TEST(PlacementCli, BenchCapacityDecodesBeyondTheBudgetAndMatchesExactInRam) {
  ARGUS_SKIP_WITHOUT_BENCH();
  TempDir dir;
  const std::string json = dir / "c.json";
  // 2 MiB of the 8 MiB exact: some pages on disk, about 3.3 bits a value in RAM, where the bound
  // falls with every bit (below about 1.5 it need not: keys of almost no bits give noisier scores
  // than keys of none, all alike).
  auto run = RunArgusBench("capacity --dir " + dir.path() + " --model qwen2.5-0.5b --layers 2 " +
                           "--tokens 8192 --ram-budget 2M --reference-tokens 1024 --steps 2 " +
                           "--page-tokens 64 --json " + json);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json r = ReadJson(json);
  EXPECT_LE(r["long"]["ram_used_bytes"].get<double>(), double{2 << 20});
  EXPECT_GT(r["long"]["disk_used_bytes"].get<double>(), 0.0);
  // The all-in-RAM run is f16 against double precision over the same f16 values.
  EXPECT_LT(r["ram"]["max_rel_error"].get<double>(), 1e-3);
  EXPECT_EQ(r["ram"]["needle_found"], r["ram"]["needle_steps"]);
  // The rate-distortion bound: its error falls with every bit, at least halving from 4 to 5 bits
  // and from 7 to 8 (2^-1 in theory when every value holds bits); spending the bits where attention
  // falls never does worse than the same on every token; the run's own figures lie on the curves
  // between the whole bits around its rate.
  const nlohmann::json& bound = r["rate_distortion"];
  ASSERT_EQ(bound.size(), 8u);
  for (const char* kind : {"uniform_rel_error", "by_attention_rel_error"}) {
    for (size_t i = 1; i < bound.size(); ++i) {
      const double ratio = bound[i][kind].get<double>() / bound[i - 1][kind].get<double>();
      EXPECT_LT(ratio, i == 4 || i == 7 ? 0.55 : 1.0) << kind << " at " << i + 1 << " bits";
    }
    const double bits = r["long"]["rate_distortion"]["bits_per_value"].get<double>();
    const double error = r["long"]["rate_distortion"][kind].get<double>();
    const auto at = [&](double b) { return bound[static_cast<size_t>(b) - 1][kind].get<double>(); };
    ASSERT_GE(bits, 1.5);
    EXPECT_LE(error, at(std::floor(bits))) << kind;
    EXPECT_GE(error, at(std::floor(bits) + 1)) << kind;
  }
  for (const nlohmann::json& point : bound) {
    EXPECT_LE(point["by_attention_rel_error"].get<double>(),
              point["uniform_rel_error"].get<double>());
  }
}

}  // namespace
}  // namespace argus
