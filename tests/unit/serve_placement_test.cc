// argus serve under memory pressure: the program with a RAM budget below what its concurrent
// requests' KV needs, a disk tier and the exact profile. Every request completes with what
// `argus run` prints for it alone, and /metrics shows the pages the engine moved to disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "argus/model.h"
#include "argus/policy.h"
#include "cli_run.h"
#include "test_util.h"

namespace argus {
namespace {

constexpr uint32_t kPressureTokens = 24;  // generated per request
constexpr size_t kPressureRequests = 6;

std::string PressureModelPath() { return testing::SharedDir() + "/models/stories260K.gguf"; }

// Long prompts from different places of the story, in characters a shell's single quotes keep.
std::vector<std::string> PressurePrompts() {
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::erase_if(text, [](char c) {
    return !(std::isalnum(static_cast<unsigned char>(c)) || c == ' ' || c == '.' || c == ',');
  });
  std::vector<std::string> prompts;
  for (size_t i = 0; i < kPressureRequests; ++i) {
    prompts.push_back(text.substr(97 * i, 280 + 30 * i));
  }
  return prompts;
}

// `argus serve` in a child process, its stderr in a file; the port it listens on.
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args, const std::string& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, STDERR_FILENO);
      std::vector<char*> argv = {const_cast<char*>(ARGUS_CLI_PATH)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(ARGUS_CLI_PATH, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 600 && port_ == 0 && pid_ > 0; ++i) {  // up to 60 s (sanitizer builds)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream in(log);
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      const size_t at = text.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) port_ = std::stoi(text.substr(at + 30));
    }
  }
  ~ServeProcess() { Stop(); }
  // SIGTERM, and the exit status as waitpid gives it (-1 when it was stopped already).
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// The value of a sample of /metrics (its name with its labels), or -1 when it is absent.
double PressureMetric(const std::string& metrics, const std::string& sample) {
  const size_t at = metrics.find("\n" + sample + " ");
  return at == std::string::npos ? -1 : std::stod(metrics.substr(at + sample.size() + 2));
}

// A request of max_tokens at temperature 0: its text, or the status and body when it failed.
std::string GreedyText(int port, const std::string& prompt, uint32_t max_tokens) {
  const nlohmann::json body = {{"model", "stories260K"},
                               {"max_tokens", max_tokens},
                               {"temperature", 0},
                               {"messages", {{{"role", "user"}, {"content", prompt}}}}};
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120);
  httplib::Result r = client.Post("/v1/messages", body.dump(), "application/json");
  if (!r) return "no reply";
  if (r->status != 200) return std::to_string(r->status) + " " + r->body;
  return nlohmann::json::parse(r->body)["content"][0]["text"].get<std::string>();
}

std::string MetricsOf(int port) {
  httplib::Client client("127.0.0.1", port);
  httplib::Result r = client.Get("/metrics");
  return r ? r->body : std::string();
}

// `argus serve --prompt-cache` over a store in `dir`: one request, then SIGTERM. The server must
// reply with `expected` and exit 0; returns its /metrics as they stood after the request.
std::string ServeOnceWithPromptCache(const testing::TempDir& dir, const std::string& prompt,
                                     const std::string& expected) {
  ServeProcess serve({"serve", "-m", PressureModelPath(), "--port", "0", "-c", "256", "-b", "16",
                      "--page-tokens", "16", "--prompt-cache", dir / "prompt-cache"},
                     dir / "serve.log");
  EXPECT_GT(serve.port(), 0) << "no listening line in " << (dir / "serve.log");
  if (serve.port() == 0) return "";
  EXPECT_EQ(GreedyText(serve.port(), prompt, kPressureTokens), expected);
  std::string metrics = MetricsOf(serve.port());
  const int status = serve.Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return metrics;
}

// What `argus run` prints for the prompt with the pages and chunks the servers here use.
std::string SoloText(const std::string& prompt) {
  const testing::CliRun run =
      testing::RunArgus("run -m " + PressureModelPath() + " -c 256 -b 16 --page-tokens 16 -n " +
                        std::to_string(kPressureTokens) + " -p '" + prompt + "'");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  return run.out;
}

TEST(ServePromptCache, ARestartedServerLoadsTheStoredPagesOfAPromptAndRepliesTheSame) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string prompt = PressurePrompts()[1];
  const std::string solo = SoloText(prompt);
  const uint32_t n_prompt = static_cast<uint32_t>(
      Model::Load(PressureModelPath()).value()->tokenizer().Encode(prompt).size());
  const uint32_t n_whole_pages = (n_prompt - 1) / 16;  // the last token is always evaluated
  ASSERT_GE(n_whole_pages, 2u);
  testing::TempDir dir;
  const std::string first = ServeOnceWithPromptCache(dir, prompt, solo);
  EXPECT_EQ(PressureMetric(first, "argus_prompt_cache_tokens_loaded_total"), 0) << first;
  EXPECT_GE(PressureMetric(first, "argus_prompt_cache_pages_stored_total"), n_whole_pages * 5)
      << first;  // 5 layers
  const std::string second = ServeOnceWithPromptCache(dir, prompt, solo);
  EXPECT_EQ(PressureMetric(second, "argus_prompt_cache_tokens_loaded_total"), n_whole_pages * 16)
      << second;
  EXPECT_EQ(PressureMetric(second, "argus_prompt_cache_failures_total"), 0) << second;
}

TEST(ServePromptCache, DamagedPagesAreEvaluatedInsteadAndTheReplyIsTheSame) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string prompt = PressurePrompts()[2];
  const std::string solo = SoloText(prompt);
  testing::TempDir dir;
  ServeOnceWithPromptCache(dir, prompt, solo);
  // Every byte of the stored pages inverted: each page's checksum fails.
  size_t n_damaged = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "prompt-cache")) {
    if (entry.path().extension() != ".dat") continue;
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    for (char& c : bytes) c = static_cast<char>(~c);
    file.seekp(0);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    n_damaged += bytes.size();
  }
  ASSERT_GT(n_damaged, 0u);
  const std::string second = ServeOnceWithPromptCache(dir, prompt, solo);
  EXPECT_EQ(PressureMetric(second, "argus_prompt_cache_tokens_loaded_total"), 0) << second;
  EXPECT_GE(PressureMetric(second, "argus_prompt_cache_failures_total"), 1) << second;
}

TEST(ServePressure, RequestsBeyondTheRamBudgetCompleteWithTheirSoloOutputFromDisk) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::vector<std::string> prompts = PressurePrompts();
  std::vector<std::string> solo;
  for (const std::string& p : prompts) solo.push_back(SoloText(p));

  // Half the RAM the requests' exact KV needs together.
  const std::unique_ptr<Model> model = Model::Load(PressureModelPath()).value();
  CacheOptions cache;
  cache.geometry = model->config().geometry();
  cache.page_tokens = 16;
  size_t exact = 0;
  for (const std::string& p : prompts) {
    const auto n = static_cast<uint32_t>(model->tokenizer().Encode(p).size() + kPressureTokens);
    exact += KvCache::RequiredRamBytes(cache, n).value();
  }
  testing::TempDir dir;
  // The exact profile pinning one page of recent tokens (the built-in pins 256: every page here).
  Profile profile = Profile::BuiltIn("exact").value();
  profile.pin_recent = 16;
  std::ofstream(dir / "exact16.json") << profile.ToJson();
  ServeProcess serve(
      {"serve", "-m", PressureModelPath(), "--port", "0", "-c", "256", "-b", "16", "--page-tokens",
       "16", "--parallel", std::to_string(kPressureRequests), "--ram-budget",
       std::to_string(exact / 2), "--disk-dir", dir / "disk", "--profile", dir / "exact16.json"},
      dir / "serve.log");
  ASSERT_GT(serve.port(), 0) << "no listening line in " << (dir / "serve.log");

  // Every reply is its solo text (a failed request's reply is its status and body).
  std::vector<std::string> replies(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back(
        [&, i] { replies[i] = GreedyText(serve.port(), prompts[i], kPressureTokens); });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(replies[i], solo[i]) << "request " << i;
  }

  const std::string metrics = MetricsOf(serve.port());
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(PressureMetric(metrics, "argus_kv_placement_active"), 1) << metrics;
  EXPECT_GT(PressureMetric(metrics, "argus_kv_demotions_total"), 0) << metrics;
  EXPECT_GT(PressureMetric(metrics, "argus_kv_ladder_pages{state=\"disk\"}"), 0) << metrics;
  EXPECT_GT(PressureMetric(metrics, "argus_kv_bytes{codec=\"f16\",part=\"k\",tier=\"disk\"}"), 0)
      << metrics;
  EXPECT_LE(PressureMetric(metrics, "argus_kv_ram_used_bytes"),
            PressureMetric(metrics, "argus_kv_ram_budget_bytes"));
}

// argus-bench serve --memory, scaled down: every conversation completes under a quarter of their
// exact KV, and the report gives the KV bytes by tier and the pages by ladder state.
TEST(ServePressure, BenchServeMemoryCompletesEveryConversationAndReportsTheStates) {
  ARGUS_SKIP_WITHOUT_BENCH();
  ARGUS_SKIP_WITHOUT_SHARED();
  testing::TempDir dir;
  Profile profile = Profile::BuiltIn("exact").value();
  profile.pin_recent = 16;
  std::ofstream(dir / "exact16.json") << profile.ToJson();
  const testing::CliRun run = testing::RunArgusBench(
      "serve --memory -m " + PressureModelPath() +
      " --conversations 4 --conversation-tokens 200 --max-tokens 8 --page-tokens 16 "
      "--ram-fraction 0.4 --profile " +
      (dir / "exact16.json") + " --disk-dir " + (dir / "disk") + " --json " + (dir / "m.json"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ifstream in(dir / "m.json");
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_EQ(report["completed"], 4);
  EXPECT_GT(report["output_tokens"].get<uint64_t>(), 0u);
  EXPECT_LE(report["ram_used_peak_bytes"].get<size_t>(), report["ram_budget_bytes"].get<size_t>());
  EXPECT_GT(report["n_demotions"].get<uint64_t>(), 0u);
  EXPECT_GT(report["pages_per_state"]["disk"].get<size_t>(), 0u);
  bool disk_bytes = false;
  for (const nlohmann::json& b : report["kv_bytes"]) disk_bytes |= b["tier"] == "disk";
  EXPECT_TRUE(disk_bytes) << report.dump(2);
}

}  // namespace
}  // namespace argus
