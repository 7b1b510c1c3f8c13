// argus-bench serve: argus serve's throughput and latency with N concurrent streamed requests
// over loopback HTTP, each N in one run so the ratios to one stream are same-run figures.
#include <arpa/inet.h>
#include <fmt/core.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "argus/model.h"
#include "bench/cli/bench_commands.h"
#include "cli/commands.h"
#include "serve/server.h"

namespace argus::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct ServeBenchOptions {
  std::string model_path, json_path;
  std::vector<uint32_t> streams = {1, 4, 16, 64};
  uint32_t prompt_tokens = 64, max_tokens = 64, n_ctx = 1024, page_tokens = 256;
  unsigned threads = 0;
};

// What one client saw of its streamed request.
struct StreamTiming {
  double ttft_s = 0;           // request sent -> first text_delta
  double tpot_s = 0;           // between its first and last text_delta, per later token
  uint32_t output_tokens = 0;  // usage.output_tokens of message_delta
  bool ok = false;
};

struct ServeBenchRun {
  uint32_t streams = 0;
  uint32_t output_tokens = 0;
  double wall_s = 0;
  double tokens_per_s = 0;
  double tokens_per_s_vs_one_stream = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0, tpot_p99_ms = 0;
  double mean_step_rows = 0;  // rows per forward pass, from the server's counters
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServeBenchRun, streams, output_tokens, wall_s, tokens_per_s,
                                   tokens_per_s_vs_one_stream, ttft_p50_ms, ttft_p99_ms,
                                   tpot_p50_ms, tpot_p99_ms, mean_step_rows)

struct ServeBenchReport {
  std::string model;
  uint32_t prompt_tokens = 0, max_tokens = 0, n_ctx = 0, threads = 0;
  std::vector<ServeBenchRun> runs;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServeBenchReport, model, prompt_tokens, max_tokens, n_ctx,
                                   threads, runs)

// Sends one streamed /v1/messages request on a raw socket and times its events as they come
// (an HTTP library would hand over the body only at the end).
StreamTiming StreamOnce(int port, const std::string& body) {
  StreamTiming t;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return t;
  }
  const std::string request =
      "POST /v1/messages HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  const Clock::time_point sent = Clock::now();
  Clock::time_point first, last;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    std::string received;
    size_t scanned = 0;
    uint32_t n_deltas = 0;
    char buffer[16384];
    ssize_t n = 0;
    while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) {
      received.append(buffer, static_cast<size_t>(n));
      for (size_t at;
           (at = received.find("event: content_block_delta", scanned)) != std::string::npos;
           scanned = at + 1) {
        last = Clock::now();
        if (n_deltas++ == 0) first = last;
      }
      if (received.find("event: message_stop") != std::string::npos) break;
    }
    const size_t usage = received.find("\"output_tokens\":", received.find("message_delta"));
    if (usage != std::string::npos && n_deltas > 0) {
      t.output_tokens = static_cast<uint32_t>(std::stoul(received.substr(usage + 16)));
      t.ttft_s = std::chrono::duration<double>(first - sent).count();
      t.tpot_s = t.output_tokens > 1
                     ? std::chrono::duration<double>(last - first).count() / (t.output_tokens - 1)
                     : 0;
      t.ok = true;
    }
  }
  ::close(fd);
  return t;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(i, values.size() - 1)];
}

// A prompt of printable ASCII that encodes to about n tokens of a byte-level vocabulary, distinct
// per stream so no two share a prefix page.
std::string BenchPrompt(uint32_t n, uint32_t stream) {
  std::mt19937 rng(1234 + stream);
  std::string text;
  for (uint32_t i = 0; i < n; ++i) text += static_cast<char>('a' + rng() % 26);
  return text;
}

ServeBenchRun RunStreams(const Model& model, const ServeBenchOptions& o, uint32_t n_streams) {
  BatchContextOptions b;
  b.n_ctx = o.n_ctx;
  b.n_threads = o.threads;
  b.page_tokens = o.page_tokens;
  b.n_batch = n_streams + 2 * 64;
  b.n_full_sequences = n_streams;  // the default budget: every stream's full context
  std::unique_ptr<BatchContext> context = ValueOrThrow(BatchContext::Create(model, b));
  serve::ServerOptions s;
  s.port = 0;
  s.model_name = "bench";
  s.scheduler.parallel = n_streams;
  s.scheduler.queue_limit = n_streams;
  std::unique_ptr<serve::Server> server = ValueOrThrow(serve::Server::Start(model, *context, s));

  std::vector<StreamTiming> timings(n_streams);
  std::vector<std::thread> clients;
  const Clock::time_point t0 = Clock::now();
  for (uint32_t i = 0; i < n_streams; ++i) {
    const nlohmann::json body = {
        {"model", "bench"},
        {"max_tokens", o.max_tokens},
        {"temperature", 0},
        {"stream", true},
        {"messages", {{{"role", "user"}, {"content", BenchPrompt(o.prompt_tokens, i)}}}}};
    clients.emplace_back(
        [&, i, text = body.dump()] { timings[i] = StreamOnce(server->port(), text); });
  }
  for (std::thread& c : clients) c.join();
  ServeBenchRun run;
  run.streams = n_streams;
  run.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, tpot;
  for (const StreamTiming& t : timings) {
    if (!t.ok) throw CommandError{Status::Internal("bench serve: a stream did not complete")};
    run.output_tokens += t.output_tokens;
    ttft.push_back(t.ttft_s * 1e3);
    if (t.output_tokens > 1) tpot.push_back(t.tpot_s * 1e3);
  }
  run.tokens_per_s = run.output_tokens / run.wall_s;
  run.ttft_p50_ms = Percentile(ttft, 0.5);
  run.ttft_p99_ms = Percentile(ttft, 0.99);
  run.tpot_p50_ms = Percentile(tpot, 0.5);
  run.tpot_p99_ms = Percentile(tpot, 0.99);
  const std::string metrics = server->metrics().Render();
  const auto counter = [&](const std::string& name) {
    const size_t at = metrics.find("\n" + name + " ");
    return at == std::string::npos ? 0.0 : std::stod(metrics.substr(at + name.size() + 2));
  };
  const double steps = counter("argus_steps_total");
  run.mean_step_rows = steps > 0 ? counter("argus_step_rows_total") / steps : 0;
  server->Stop(std::chrono::milliseconds(0));
  return run;
}

void RunServeBench(const ServeBenchOptions& o) {
  std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  ServeBenchReport report;
  report.model = model->config().ToString();
  report.prompt_tokens = o.prompt_tokens;
  report.max_tokens = o.max_tokens;
  report.n_ctx = o.n_ctx;
  report.threads = o.threads;
  fmt::print("{:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "streams", "tokens",
             "tok/s", "vs 1", "ttft p50", "ttft p99", "tpot p50", "tpot p99", "rows/step");
  for (uint32_t n : o.streams) {
    fmt::print(stderr, "bench serve: {} concurrent streams\n", n);
    ServeBenchRun run = RunStreams(*model, o, n);
    if (!report.runs.empty() && report.runs.front().streams == 1) {
      run.tokens_per_s_vs_one_stream = run.tokens_per_s / report.runs.front().tokens_per_s;
    } else if (n == 1) {
      run.tokens_per_s_vs_one_stream = 1;
    }
    fmt::print("{:>8} {:>8} {:>10.1f} {:>10.2f} {:>9.1f} {:>9.1f} {:>9.2f} {:>9.2f} {:>9.1f}\n",
               run.streams, run.output_tokens, run.tokens_per_s, run.tokens_per_s_vs_one_stream,
               run.ttft_p50_ms, run.ttft_p99_ms, run.tpot_p50_ms, run.tpot_p99_ms,
               run.mean_step_rows);
    report.runs.push_back(run);
    if (!o.json_path.empty()) std::ofstream(o.json_path) << nlohmann::json(report).dump(2) << "\n";
  }
}

}  // namespace

void AddServeBenchCommand(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "serve",
      "argus serve with N concurrent streamed requests over loopback HTTP: aggregate "
      "tokens per second and time to first token / per output token");
  auto o = std::make_shared<ServeBenchOptions>();
  cmd->add_option("-m,--model", o->model_path, "GGUF model (e.g. from argus make-model)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--streams", o->streams, "Concurrent streams of each run")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length (letters)")
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens each request generates")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->n_ctx, "Context of each sequence")->capture_default_str();
  cmd->add_option("--page-tokens", o->page_tokens, "Tokens per KV page")->capture_default_str();
  AddThreadsOption(*cmd, o->threads);
  cmd->add_option("--json", o->json_path, "Write the report as JSON to this file");
  cmd->callback([o] { RunServeBench(*o); });
}

}  // namespace argus::cli
