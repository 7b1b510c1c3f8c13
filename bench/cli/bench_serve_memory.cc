// argus-bench serve --memory (bench/cli/serve_memory.h): every conversation at once over
// loopback HTTP against argus serve with a placement engine, its RAM budget a fraction of their
// exact KV, and what the KV memory held at the end, by codec, tier and ladder state.
#include <fmt/core.h>
#include <httplib.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "argus/model.h"
#include "argus/store.h"
#include "bench/cli/bench_commands.h"
#include "bench/cli/serve_memory.h"
#include "cli/commands.h"
#include "serve/server.h"

namespace argus::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct MemoryKvBytes {
  std::string codec, part, tier;
  size_t bytes = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryKvBytes, codec, part, tier, bytes)

struct MemoryReport {
  std::string model, profile;
  uint32_t conversations = 0, conversation_tokens = 0, max_tokens = 0, page_tokens = 0;
  uint32_t threads = 0;
  size_t exact_kv_bytes = 0, ram_budget_bytes = 0, placeable_bytes = 0;
  uint32_t completed = 0;
  std::vector<std::string> errors;  // of the conversations that did not complete
  uint64_t prompt_tokens = 0, output_tokens = 0;
  double wall_s = 0;
  size_t ram_used_peak_bytes = 0;  // the largest of the server's snapshots (every 100 ms)
  // At the end: what each conversation's sequence still holds (its prompt's whole pages,
  // retained for later forks).
  std::vector<MemoryKvBytes> kv_bytes;
  std::map<std::string, size_t> pages_per_state;
  size_t ram_used_bytes = 0, disk_page_bytes = 0, disk_used_bytes = 0;
  uint64_t n_demotions = 0, n_promotions = 0, master_bytes_written = 0;
  uint64_t attention_disk_bytes_read = 0, promoted_bytes_read = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryReport, model, profile, conversations, conversation_tokens,
                                   max_tokens, page_tokens, threads, exact_kv_bytes,
                                   ram_budget_bytes, placeable_bytes, completed, errors,
                                   prompt_tokens, output_tokens, wall_s, ram_used_peak_bytes,
                                   kv_bytes, pages_per_state, ram_used_bytes, disk_page_bytes,
                                   disk_used_bytes, n_demotions, n_promotions, master_bytes_written,
                                   attention_disk_bytes_read, promoted_bytes_read)

// A directory for the disk tier that goes with the run unless the caller named one.
class DiskDir {
 public:
  explicit DiskDir(const std::string& dir) : path_(dir) {
    if (!path_.empty()) return;
    std::string pattern = (std::filesystem::temp_directory_path() / "argus-serve-memory-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw CommandError{Status::IOError("cannot create a temporary directory " + pattern)};
    }
    path_ = pattern;
    owned_ = true;
  }
  ~DiskDir() {
    std::error_code ignored;
    if (owned_) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool owned_ = false;
};

// Letters that encode to about n tokens of a byte-level vocabulary, distinct per conversation.
std::string MemoryPrompt(uint32_t n, uint32_t conversation) {
  std::mt19937 rng(4321 + conversation);
  std::string text;
  for (uint32_t i = 0; i < n; ++i) text += static_cast<char>('a' + rng() % 26);
  return text;
}

// One non-streamed completion; its usage, or why it failed.
struct MemoryReply {
  uint64_t prompt_tokens = 0, output_tokens = 0;
  std::string error;
};

MemoryReply Complete(int port, const std::string& body) {
  MemoryReply reply;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::hours(4));
  const httplib::Result r = client.Post("/v1/completions", body, "application/json");
  if (!r) {
    reply.error = "HTTP: " + httplib::to_string(r.error());
  } else if (r->status != 200) {
    reply.error = "status " + std::to_string(r->status) + ": " + r->body.substr(0, 300);
  } else {
    const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
    if (!j.is_object() || !j.contains("usage")) {
      reply.error = "no usage in the reply";
    } else {
      reply.prompt_tokens = j["usage"].value("prompt_tokens", 0u);
      reply.output_tokens = j["usage"].value("completion_tokens", 0u);
    }
  }
  return reply;
}

// A gauge's value in the server's /metrics text; 0 when absent.
double Gauge(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? 0 : std::stod(text.substr(at + name.size() + 2));
}

void FillEnd(MemoryReport& report, const CacheStats& cache, const PlacementStats& p) {
  for (const CodecBytes& c : cache.by_codec) {
    const std::pair<const char*, std::pair<size_t, size_t>> parts[] = {
        {"k", {c.k_bytes, c.k_disk_bytes}}, {"v", {c.v_bytes, c.v_disk_bytes}}};
    for (const auto& [part, bytes] : parts) {
      if (bytes.first > bytes.second) {
        report.kv_bytes.push_back({c.codec, part, "ram", bytes.first - bytes.second});
      }
      if (bytes.second > 0) report.kv_bytes.push_back({c.codec, part, "disk", bytes.second});
    }
  }
  for (size_t i = 0; i < p.pages_per_state.size() && i < p.state_names.size(); ++i) {
    report.pages_per_state[p.state_names[i]] = p.pages_per_state[i];
  }
  report.ram_used_bytes = cache.ram.used_bytes;
  report.disk_page_bytes = cache.disk_page_bytes;
  report.disk_used_bytes = p.disk_used_bytes;
  report.n_demotions = p.n_demotions;
  report.n_promotions = p.n_promotions;
  report.master_bytes_written = p.master_bytes_written;
  report.attention_disk_bytes_read = p.attention_disk_bytes_read;
  report.promoted_bytes_read = p.promoted_bytes_read;
}

void PrintReport(const MemoryReport& r) {
  fmt::print("memory scenario: {} conversations of {} tokens, profile {}\n", r.conversations,
             r.conversation_tokens, r.profile);
  fmt::print("  exact KV {:.1f} MiB, RAM budget {:.1f} MiB, peak RAM seen {:.1f} MiB\n",
             r.exact_kv_bytes / 1048576.0, r.ram_budget_bytes / 1048576.0,
             r.ram_used_peak_bytes / 1048576.0);
  fmt::print("  completed {} of {} in {:.1f} s ({} prompt and {} generated tokens)\n", r.completed,
             r.conversations, r.wall_s, r.prompt_tokens, r.output_tokens);
  fmt::print("  at the end: RAM {:.1f} MiB, pages on disk {:.1f} MiB, disk tier {:.1f} MiB\n",
             r.ram_used_bytes / 1048576.0, r.disk_page_bytes / 1048576.0,
             r.disk_used_bytes / 1048576.0);
  for (const MemoryKvBytes& b : r.kv_bytes) {
    fmt::print("  {:>16} {} {:>4} {:>10.2f} MiB\n", b.codec, b.part, b.tier, b.bytes / 1048576.0);
  }
  for (const auto& [state, n] : r.pages_per_state) fmt::print("  {:>16} {:>8} pages\n", state, n);
  fmt::print("  {} demotions, {} promotions, {:.1f} MiB of masters written, {:.1f} MiB read\n",
             r.n_demotions, r.n_promotions, r.master_bytes_written / 1048576.0,
             (r.attention_disk_bytes_read + r.promoted_bytes_read) / 1048576.0);
}

}  // namespace

void RunServeMemoryBench(const ServeMemoryOptions& o) {
  if (o.max_tokens == 0 || o.conversation_tokens <= o.max_tokens + 1) {
    throw CommandError{Status::InvalidArgument(
        "--conversation-tokens must exceed --max-tokens and the BOS token")};
  }
  if (!(o.ram_fraction > 0 && o.ram_fraction <= 1)) {
    throw CommandError{Status::InvalidArgument("--ram-fraction must be in (0, 1]")};
  }
  std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  const DiskDir dir(o.disk_dir);
  DiskTierOptions d;
  d.dir = dir.path();
  d.disk_budget_bytes = o.disk_budget_bytes;
  std::unique_ptr<DiskTier> disk = ValueOrThrow(DiskTier::Open(d));

  MemoryReport report;
  report.model = model->config().ToString();
  report.conversations = o.conversations;
  report.conversation_tokens = o.conversation_tokens;
  report.max_tokens = o.max_tokens;
  report.page_tokens = o.page_tokens;
  report.threads = o.threads != 0 ? o.threads : std::thread::hardware_concurrency();
  CacheOptions cache;
  cache.geometry = model->config().geometry();
  cache.page_tokens = o.page_tokens;
  const size_t one = ValueOrThrow(KvCache::RequiredRamBytes(cache, o.conversation_tokens));
  report.exact_kv_bytes = one * o.conversations;
  report.ram_budget_bytes = static_cast<size_t>(o.ram_fraction * report.exact_kv_bytes);

  BatchContextOptions b;
  b.n_ctx = o.conversation_tokens + o.page_tokens;  // room for a tokenizer that merges less
  b.n_threads = o.threads;
  b.page_tokens = o.page_tokens;
  b.n_batch = o.conversations + 2 * o.prefill_chunk;
  b.ram_budget_bytes = report.ram_budget_bytes;
  b.n_full_sequences = o.conversations;
  b.disk = disk.get();
  b.placement.emplace();
  b.placement->profile = ValueOrThrow(Profile::Load(o.profile));
  report.profile = b.placement->profile.name;
  b.k_codec = b.placement->profile.ladder.at(0).k_codec;
  b.v_codec = b.placement->profile.ladder.at(0).v_codec;
  std::unique_ptr<BatchContext> context = ValueOrThrow(BatchContext::Create(*model, b));
  report.placeable_bytes = context->placeable_bytes();

  serve::ServerOptions s;
  s.port = 0;
  s.model_name = "bench";
  s.scheduler.parallel = o.conversations;
  s.scheduler.queue_limit = o.conversations;
  s.scheduler.prefill_chunk = o.prefill_chunk;
  s.scheduler.request_timeout = std::chrono::hours(4);
  std::unique_ptr<serve::Server> server = ValueOrThrow(serve::Server::Start(*model, *context, s));
  fmt::print(stderr,
             "bench serve --memory: {} conversations of {} tokens, exact KV {:.1f} MiB, RAM "
             "budget {:.1f} MiB, disk tier {}\n",
             o.conversations, o.conversation_tokens, report.exact_kv_bytes / 1048576.0,
             report.ram_budget_bytes / 1048576.0, dir.path());

  std::atomic<bool> running{true};
  std::thread monitor([&] {
    while (running) {
      const std::string text = server->metrics().Render();
      report.ram_used_peak_bytes = std::max(
          report.ram_used_peak_bytes, static_cast<size_t>(Gauge(text, "argus_kv_ram_used_bytes")));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::vector<MemoryReply> replies(o.conversations);
  std::vector<std::thread> clients;
  const Clock::time_point t0 = Clock::now();
  for (uint32_t i = 0; i < o.conversations; ++i) {
    const nlohmann::json body = {
        {"model", s.model_name},
        {"prompt", MemoryPrompt(o.conversation_tokens - o.max_tokens - 1, i)},
        {"max_tokens", o.max_tokens},
        {"temperature", 0}};
    clients.emplace_back([&, i, text = body.dump()] {
      replies[i] = Complete(server->port(), text);
      if (replies[i].error.empty()) {
        fmt::print(stderr, "bench serve --memory: conversation {} complete after {:.1f} s\n", i,
                   std::chrono::duration<double>(Clock::now() - t0).count());
      }
    });
  }
  for (std::thread& c : clients) c.join();
  report.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  running = false;
  monitor.join();
  server->Stop(std::chrono::milliseconds(0));  // the context is the caller's again
  for (const MemoryReply& r : replies) {
    if (!r.error.empty()) {
      report.errors.push_back(r.error);
      continue;
    }
    ++report.completed;
    report.prompt_tokens += r.prompt_tokens;
    report.output_tokens += r.output_tokens;
  }
  report.ram_used_peak_bytes =
      std::max(report.ram_used_peak_bytes, context->cache().stats().ram.used_bytes);
  FillEnd(report, context->cache().stats(), context->placement_stats().value());
  PrintReport(report);
  WriteJsonReport(nlohmann::json(report).dump(2), o.json_path, "bench serve --memory");
  if (report.completed != o.conversations) {
    throw CommandError{Status::ResourceExhausted(
        fmt::format("bench serve --memory: {} of {} conversations did not complete: {}",
                    o.conversations - report.completed, o.conversations, report.errors.front()))};
  }
}

}  // namespace argus::cli
