// `argus run --remote`: processes with different local prompt caches share prefix pages through
// a redis-server of the test's own, and whatever Redis does (killed, slow, full, damaged or
// foreign values) the run prints exactly what a run without any cache prints.
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "argus/argus.h"
#include "argus/model.h"
#include "argus/remote.h"
#include "cli_run.h"
#include "redis_server.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::CliRun;
using testing::RedisServer;
using testing::RespClient;
using testing::RunArgus;
using testing::RunArgusBench;

constexpr uint32_t kRemotePageTokens = 16;
constexpr uint32_t kPrefixPages = 19;                   // of the prompt below
constexpr long kPrefixValues = kPrefixPages * 5;  // a value per page and layer (5 layers)
constexpr int kGenerated = 8;                     // tokens each run generates

class RemoteCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::SharedDir().empty()) GTEST_SKIP() << "../shared is absent: no stories260K";
    // The story's first three lines: 307 tokens, kPrefixPages full pages of 16 before the last
    // token (enough pages for every path; each run is a prefill under the sanitizers too).
    std::ifstream story(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
    std::string line;
    for (int i = 0; i < 3 && std::getline(story, line); ++i) prompt_ += line + "\n";
    std::ofstream(dir_ / "prompt.txt") << prompt_;
    baseline_ = RunArgus(Args());
    ASSERT_EQ(baseline_.exit_code, 0) << baseline_.err;
    ASSERT_FALSE(baseline_.out.empty());
  }

  std::string ModelPath() const { return testing::SharedDir() + "/models/stories260K.gguf"; }
  std::string Args() const {
    return "run -m " + ModelPath() + " -f " + (dir_ / "prompt.txt") + " -c 1024 -n " +
           std::to_string(kGenerated) + " --page-tokens " + std::to_string(kRemotePageTokens) +
           " --stats";
  }
  // A run with its own fresh local prompt cache and the remote tier.
  CliRun RunShared(const RedisServer& server, const std::string& extra = "") {
    const std::string local = dir_ / ("local" + std::to_string(n_locals_++));
    return RunArgus(Args() + " --prompt-cache " + local + " --remote " + server.url() + " " + extra);
  }
  // A shared run that must complete and print the text of the run without any cache.
  CliRun RunSharedSameText(const RedisServer& server, const std::string& extra = "") {
    CliRun r = RunShared(server, extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, baseline_.out) << r.err;
    return r;
  }
  static long Stat(const CliRun& r, const std::string& pattern) {
    std::smatch m;
    if (!std::regex_search(r.err, m, std::regex(pattern))) return -1;
    return std::stol(m[1]);
  }
  static long RemoteTokens(const CliRun& r) {
    return Stat(r, R"(remote tier: (\d+) of \d+ prompt tokens)");
  }

  testing::TempDir dir_;
  std::string prompt_;
  CliRun baseline_;
  int n_locals_ = 0;
};

TEST_F(RemoteCliTest, SecondProcessReusesTheFirstsPagesAndPrintsTheSameText) {
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.ok());
  CliRun first = RunSharedSameText(server);
  EXPECT_EQ(RemoteTokens(first), 0) << first.err;
  EXPECT_EQ(Stat(first, R"(\((\d+) pages fetched, \d+ stored\))"), 0) << first.err;
  EXPECT_EQ(Stat(first, R"(\d+ pages fetched, (\d+) stored)"), kPrefixValues) << first.err;
  // Another local directory: only Redis has the pages.
  CliRun second = RunSharedSameText(server);
  EXPECT_EQ(RemoteTokens(second), kPrefixPages * kRemotePageTokens) << second.err;
  EXPECT_NE(second.err.find("prompt cache: 304 of 307"), std::string::npos) << second.err;
  EXPECT_EQ(Stat(second, R"(\d+ pages fetched, (\d+) stored)"), 0) << second.err;
  // One MGET for all the pages (and one EXISTS when storing).
  EXPECT_EQ(Stat(second, R"((\d+) round trips)"), 2) << second.err;
  EXPECT_EQ(Stat(second, R"((\d+) damaged)"), 0) << second.err;
}

// Every value damaged (a payload byte changed in Redis), then every value another key's: the
// run computes the prefix, prints the same text, and counts what it refused.
TEST_F(RemoteCliTest, DamagedOrForeignValuesAreNeverUsed) {
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(RunShared(server).exit_code, 0);
  RespClient client(server.port());
  std::vector<std::string> keys = client.Keys("argus:*");
  ASSERT_EQ(keys.size(), static_cast<size_t>(kPrefixValues));
  for (const std::string& key : keys) {
    EXPECT_EQ(client.Command({"SETRANGE", key, "200", "garbage"}).substr(0, 1), ":");
  }
  CliRun damaged = RunSharedSameText(server);
  EXPECT_EQ(RemoteTokens(damaged), 0) << damaged.err;
  // Every value of the MGET.
  EXPECT_EQ(Stat(damaged, R"((\d+) damaged)"), kPrefixValues) << damaged.err;
  EXPECT_NE(damaged.err.find("value refused"), std::string::npos) << damaged.err;

  // Valid values, each under another page's key.
  EXPECT_EQ(client.Command({"FLUSHALL"}), "+OK");
  ASSERT_EQ(RunShared(server).exit_code, 0);
  keys = client.Keys("argus:*");
  ASSERT_EQ(keys.size(), static_cast<size_t>(kPrefixValues));
  for (size_t i = 0; i < keys.size(); ++i)
    client.Command({"COPY", keys[(i + 1) % keys.size()], "tmp:" + keys[i]});
  for (const std::string& key : keys) client.Command({"RENAME", "tmp:" + key, key});
  CliRun foreign = RunSharedSameText(server);
  EXPECT_EQ(RemoteTokens(foreign), 0) << foreign.err;
  EXPECT_GT(Stat(foreign, R"((\d+) damaged)"), 0) << foreign.err;
}

// Redis down (connection refused), made slow (DEBUG SLEEP past the timeout), and full
// (maxmemory 1mb, noeviction): each run completes with the same text.
TEST_F(RemoteCliTest, RedisDownSlowOrFullLeavesTheOutputUnchanged) {
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(RunShared(server).exit_code, 0);

  {
    RespClient sleeper(server.port());
    ASSERT_TRUE(sleeper.Send({"DEBUG", "SLEEP", "3"}));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CliRun slow = RunSharedSameText(server, "--remote-timeout 0.2");
    EXPECT_EQ(RemoteTokens(slow), 0) << slow.err;
    EXPECT_GE(Stat(slow, R"((\d+) errors)"), 1) << slow.err;
    EXPECT_NE(slow.err.find("run: IOError: remote tier"), std::string::npos) << slow.err;
  }

  server.Kill();
  CliRun down = RunSharedSameText(server);
  EXPECT_EQ(RemoteTokens(down), 0) << down.err;
  EXPECT_NE(down.err.find("cannot connect"), std::string::npos) << down.err;

  server.Restart();
  ASSERT_TRUE(server.ok());
  RespClient client(server.port());
  EXPECT_EQ(client.Command({"CONFIG", "SET", "maxmemory", "1mb"}), "+OK");
  EXPECT_EQ(client.Command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "+OK");
  CliRun full = RunSharedSameText(server);
  EXPECT_GE(Stat(full, R"((\d+) errors)"), 1) << full.err;
  EXPECT_NE(full.err.find("OOM"), std::string::npos) << full.err;
  CliRun after_full = RunSharedSameText(server);  // what Redis kept is used, and only that
  EXPECT_EQ(Stat(after_full, R"((\d+) damaged)"), 0) << after_full.err;
}

// Redis killed mid-run, after the prefix was fetched and before the pages are stored: the
// context goes on, StorePrefix succeeds locally, and the text is the baseline's.
TEST_F(RemoteCliTest, RedisKilledMidRunLeavesTheRunUnchanged) {
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(RunShared(server).exit_code, 0);

  auto model = Model::Load(ModelPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  DiskTierOptions disk_options;
  disk_options.dir = dir_ / "inprocess";
  disk_options.disk_budget_bytes = size_t{64} << 20;
  auto disk = DiskTier::Open(disk_options);
  ASSERT_TRUE(disk.ok()) << disk.status().ToString();
  RemoteTierOptions remote_options;
  remote_options.url = server.url();
  auto remote = RemoteTier::Open(remote_options);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  ContextOptions options;
  options.n_ctx = 1024;
  options.page_tokens = kRemotePageTokens;
  options.disk = disk->get();
  options.remote = remote->get();
  auto context = Context::Create(**model, options);
  ASSERT_TRUE(context.ok()) << context.status().ToString();
  const std::vector<int32_t> tokens = (*model)->tokenizer().Encode(prompt_, true);
  auto loaded = (*context)->LoadPrefix(std::span(tokens).first(tokens.size() - 1));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, kPrefixPages * kRemotePageTokens);
  EXPECT_EQ((*context)->remote_prefix_stats().n_tokens_loaded, kPrefixPages * kRemotePageTokens);
  server.Kill();
  std::span<const float> logits;
  for (size_t first = *loaded; first < tokens.size(); first += 64) {
    auto r = (*context)->Eval(std::span(tokens).subspan(first, std::min<size_t>(64, tokens.size() - first)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    logits = *r;
  }
  Sampler sampler(SamplerOptions{});
  std::string text;
  int32_t token = sampler.Sample(logits);
  for (int i = 0; i < kGenerated && !(*model)->tokenizer().IsEndOfGeneration(token); ++i) {
    text += (*model)->tokenizer().TokenToPiece(token);
    if (i + 1 == kGenerated) break;
    auto r = (*context)->Eval({&token, 1});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    token = sampler.Sample(*r);
  }
  EXPECT_EQ(text, baseline_.out);
  PrefixStoreStats stored;
  const Status store = (*context)->StorePrefix(tokens, stored);
  ASSERT_TRUE(store.ok()) << store.ToString();
  EXPECT_EQ((*context)->remote_prefix_stats().n_pages_stored, 0u);
  EXPECT_GE((*remote)->stats().n_errors, 1u);
}

// Errors of the options name their cause; no server is needed for them.
TEST_F(RemoteCliTest, RemoteOptionErrorsNameTheCause) {
  const std::string run = "run -m " + ModelPath() + " -p hi -n 4 ";
  const std::string local = " --prompt-cache " + (dir_ / "pc");
  CliRun no_local = RunArgus(run + "--remote redis://127.0.0.1:1");
  EXPECT_EQ(no_local.exit_code, 1);
  EXPECT_NE(no_local.err.find("--remote needs --prompt-cache"), std::string::npos) << no_local.err;
  CliRun tls = RunArgus(run + local + " --remote rediss://127.0.0.1:1");
  EXPECT_EQ(tls.exit_code, 1);
  EXPECT_NE(tls.err.find("Unsupported: remote URL rediss://"), std::string::npos) << tls.err;
  CliRun db = RunArgus(run + local + " --remote redis://127.0.0.1:1/abc");
  EXPECT_EQ(db.exit_code, 1);
  EXPECT_NE(db.err.find("database 'abc'"), std::string::npos) << db.err;
}

// argus-bench remote on stories260K: every figure of both prefixes (the longer one from synthetic
// pages, not recomputed), each path reusing the whole prefix, the fetch one MGET.
TEST_F(RemoteCliTest, BenchRemoteReportsEveryPathOfEachPrefix) {
  ARGUS_SKIP_WITHOUT_BENCH();
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.ok());
  CliRun r = RunArgusBench("remote -m " + ModelPath() + " --remote " + server.url() + " --dir " +
                      (dir_ / "bench") + " --prefixes 32,64 --page-tokens 16 --recompute-max 32 " +
                      "--json " + (dir_ / "bench.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir_ / "bench.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["prefixes"].size(), 2u) << j.dump();
  EXPECT_GT(j["prefixes"][0]["recompute_ttft_s"].get<double>(), 0) << j.dump();
  EXPECT_TRUE(j["prefixes"][1]["recompute_ttft_s"].is_null()) << j.dump();
  for (const auto& p : j["prefixes"]) {
    EXPECT_GT(p["local_disk_ttft_s"].get<double>(), 0) << j.dump();
    EXPECT_GT(p["redis_ttft_s"].get<double>(), 0) << j.dump();
    EXPECT_EQ(p["fetch"]["round_trips"], 1) << j.dump();
    EXPECT_EQ(p["fetch"]["pages_hit"], p["tokens"].get<int>() / 16 * 5) << j.dump();
  }
}

// The C API: a context given a disk directory and a remote URL loads the pages another process
// stored in Redis; a malformed URL or a remote tier without a disk fails argus_context_create.
TEST_F(RemoteCliTest, CApiContextLoadsPrefixPagesFromRedis) {
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_EQ(RunShared(server).exit_code, 0);
  char* err = nullptr;
  argus_model_t* model = argus_model_load(ModelPath().c_str(), &err);
  ASSERT_NE(model, nullptr) << err;
  size_t n_tokens = 0;
  int32_t* tokens = argus_tokenize(model, prompt_.data(), prompt_.size(), 1, &n_tokens, &err);
  ASSERT_NE(tokens, nullptr) << err;
  argus_context_options_t* options = argus_context_options_create();
  argus_context_options_set_n_ctx(options, 1024);
  argus_context_options_set_page_tokens(options, kRemotePageTokens);
  argus_context_options_set_remote(options, "http://127.0.0.1:1");
  EXPECT_EQ(argus_context_create(model, options, &err), nullptr);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(err).find("needs a disk tier"), std::string::npos) << err;
  argus_context_options_set_disk(options, (dir_ / "capi").c_str(), 64 << 20);
  EXPECT_EQ(argus_context_create(model, options, &err), nullptr);
  EXPECT_NE(std::string(err).find("redis://"), std::string::npos) << err;
  argus_context_options_set_remote(options, server.url().c_str());
  argus_context_t* context = argus_context_create(model, options, &err);
  ASSERT_NE(context, nullptr) << err;
  EXPECT_EQ(argus_context_load_prefix(context, tokens, n_tokens - 1, &err),
            kPrefixPages * kRemotePageTokens)
      << (err ? err : "");
  char* stats = argus_context_stats_json(context, &err);
  ASSERT_NE(stats, nullptr) << err;
  const nlohmann::json j = nlohmann::json::parse(stats);
  EXPECT_EQ(j["remote"]["n_tokens_loaded"], kPrefixPages * kRemotePageTokens) << stats;
  EXPECT_EQ(j["remote"]["n_damaged"], 0) << stats;
  argus_free(stats);
  argus_free(err);
  argus_context_close(context);
  argus_context_options_destroy(options);
  argus_free(tokens);
  argus_model_close(model);
}

}  // namespace
}  // namespace argus
