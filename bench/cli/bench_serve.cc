// argus-bench serve: argus serve's throughput and latency with N concurrent streamed requests
// over loopback HTTP, each N in one run so the ratios to one stream are same-run figures; stock
// llama-server (../shared/peers) on the same file and the same requests beside it when present.
#include <fmt/core.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "argus/model.h"
#include "bench/cli/bench_commands.h"
#include "bench/cli/peers.h"
#include "bench/cli/serve_memory.h"
#include "cli/commands.h"
#include "serve/server.h"

namespace argus::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct ServeBenchOptions {
  std::string model_path, json_path, peer_path;
  std::vector<uint32_t> streams = {1, 4, 16, 64};
  uint32_t prompt_tokens = 64, max_tokens = 64, n_ctx = 1024, page_tokens = 256;
  unsigned threads = 0;
  bool no_peer = false;
  bool memory = false;  // the memory scenario (serve_memory.h) instead of the streams
};

// What one client saw of its streamed request.
struct StreamTiming {
  double ttft_s = 0;           // request sent -> first text
  double tpot_s = 0;           // between its first and last text, per later token
  uint32_t output_tokens = 0;  // usage.completion_tokens
  bool texts = false;          // its tokens came as text chunks (else tpot_s is 0)
  std::string error;           // why the stream did not complete; "" when it did
};

struct ServeBenchRun {
  std::string server;  // "argus" or "llama-server"
  uint32_t streams = 0;
  uint32_t output_tokens = 0;
  double wall_s = 0;
  double tokens_per_s = 0;
  double tokens_per_s_vs_one_stream = 0;
  double tokens_per_s_vs_peer = 0;  // argus's runs, when the peer ran the same streams
  double ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0, tpot_p99_ms = 0;
  double mean_step_rows = 0;  // argus: rows per forward pass, from the server's counters
  std::string error;          // the first stream's failure, of a peer's run; "" when all completed
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServeBenchRun, server, streams, output_tokens, wall_s,
                                   tokens_per_s, tokens_per_s_vs_one_stream, tokens_per_s_vs_peer,
                                   ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, tpot_p99_ms,
                                   mean_step_rows, error)

struct ServeBenchReport {
  std::string model;
  uint32_t prompt_tokens = 0, max_tokens = 0, n_ctx = 0, threads = 0;
  std::string peer;  // the llama-server binary, or why none ran
  std::vector<ServeBenchRun> runs;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServeBenchReport, model, prompt_tokens, max_tokens, n_ctx,
                                   threads, peer, runs)

// Sends one streamed POST /v1/completions (with stream_options.include_usage, which both servers
// answer with the token count) and times its chunks as they arrive.
StreamTiming StreamOnce(int port, const std::string& body) {
  StreamTiming t;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::minutes(10));
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body;
  request.set_header("Content-Type", "application/json");
  std::string pending, head;  // head: the stream's first bytes, for errors
  uint32_t n_texts = 0;
  Clock::time_point first, last, first_chunk;
  bool any_chunk = false;
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    pending.append(data, size);
    if (head.size() < 300) head.append(data, std::min<size_t>(size, 300 - head.size()));
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      if (pending.compare(0, 6, "data: ") != 0) continue;
      const nlohmann::json chunk =
          nlohmann::json::parse(pending.begin() + 6, pending.begin() + static_cast<long>(end),
                                nullptr, /*allow_exceptions=*/false);
      if (!chunk.is_object()) continue;  // [DONE]
      if (!any_chunk) {
        any_chunk = true;
        first_chunk = Clock::now();
      }
      const nlohmann::json& choices = chunk.value("choices", nlohmann::json::array());
      if (!choices.empty() && !choices[0].value("text", "").empty()) {
        last = Clock::now();
        if (n_texts++ == 0) first = last;
      }
      if (chunk.contains("usage")) {
        t.output_tokens = chunk["usage"].value("completion_tokens", 0u);
      }
    }
    return true;
  };
  const Clock::time_point sent = Clock::now();
  const httplib::Result result = client.send(request);
  if (!result) {
    t.error = "HTTP: " + httplib::to_string(result.error());
  } else if (result->status != 200) {
    t.error = "status " + std::to_string(result->status) + ": " + pending.substr(0, 200);
  } else if (t.output_tokens == 0) {
    t.error = "no usage in the stream: " + head;
  } else if (n_texts == 0) {
    // Tokens that form no UTF-8 text yet (a byte-level model's partial characters) may be held
    // back to the end: the stream completed, its first chunk is its first token's time.
    t.ttft_s = std::chrono::duration<double>(first_chunk - sent).count();
  } else {
    t.texts = true;
    t.ttft_s = std::chrono::duration<double>(first - sent).count();
    t.tpot_s = t.output_tokens > 1
                   ? std::chrono::duration<double>(last - first).count() / (t.output_tokens - 1)
                   : 0;
  }
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

// N clients at once, each with its own prompt; the run's figures from what they saw.
ServeBenchRun RunClients(int port, const std::string& model_name, const ServeBenchOptions& o,
                         uint32_t n_streams) {
  std::vector<StreamTiming> timings(n_streams);
  std::vector<std::thread> clients;
  const Clock::time_point t0 = Clock::now();
  for (uint32_t i = 0; i < n_streams; ++i) {
    // ignore_eos (llama-server's extension; argus reads no such field) keeps a random-weight
    // model from ending one server's streams early.
    const nlohmann::json body = {{"model", model_name},
                                 {"prompt", BenchPrompt(o.prompt_tokens, i)},
                                 {"max_tokens", o.max_tokens},
                                 {"temperature", 0},
                                 {"ignore_eos", true},
                                 {"stream", true},
                                 {"stream_options", {{"include_usage", true}}}};
    clients.emplace_back([&, i, text = body.dump()] { timings[i] = StreamOnce(port, text); });
  }
  for (std::thread& c : clients) c.join();
  ServeBenchRun run;
  run.streams = n_streams;
  run.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, tpot;
  for (const StreamTiming& t : timings) {
    if (!t.error.empty()) {
      run.error = "a stream did not complete: " + t.error;
      return run;
    }
    run.output_tokens += t.output_tokens;
    ttft.push_back(t.ttft_s * 1e3);
    if (t.texts && t.output_tokens > 1) tpot.push_back(t.tpot_s * 1e3);
  }
  run.tokens_per_s = run.output_tokens / run.wall_s;
  run.ttft_p50_ms = Percentile(ttft, 0.5);
  run.ttft_p99_ms = Percentile(ttft, 0.99);
  run.tpot_p50_ms = Percentile(tpot, 0.5);
  run.tpot_p99_ms = Percentile(tpot, 0.99);
  return run;
}

ServeBenchRun RunArgus(const Model& model, const ServeBenchOptions& o, uint32_t n_streams) {
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
  ServeBenchRun run = RunClients(server->port(), s.model_name, o, n_streams);
  if (!run.error.empty()) throw CommandError{Status::Internal("bench serve: argus: " + run.error)};
  run.server = "argus";
  run.mean_step_rows = server->metrics().MeanStepRows();
  server->Stop(std::chrono::milliseconds(0));
  return run;
}

// llama-server with the same slots, context per slot, threads and requests; flash attention on,
// KV in f16 (its defaults otherwise).
ServeBenchRun RunPeer(const std::string& peer, const ServeBenchOptions& o, uint32_t n_streams,
                      unsigned threads) {
  const int port = ValueOrThrow(FreeLoopbackPort());
  const std::string log_path = fmt::format("/tmp/argus-bench-llama-server-{}.log", ::getpid());
  const std::vector<std::string> args = {"-m",     o.model_path,
                                         "--host", "127.0.0.1",
                                         "--port", std::to_string(port),
                                         "-np",    std::to_string(n_streams),
                                         "-c",     std::to_string(uint64_t{o.n_ctx} * n_streams),
                                         "-t",     std::to_string(threads),
                                         "-tb",    std::to_string(threads),
                                         "-fa"};
  std::unique_ptr<PeerServer> server = ValueOrThrow(PeerServer::Start(peer, args, port, log_path));
  ServeBenchRun run = RunClients(port, "bench", o, n_streams);
  run.server = "llama-server";
  server.reset();
  std::filesystem::remove(log_path);
  return run;
}

void PrintRun(const ServeBenchRun& run) {
  if (!run.error.empty()) {
    fmt::print("{:>13} {:>8} failed: {}\n", run.server, run.streams, run.error);
    return;
  }
  fmt::print(
      "{:>13} {:>8} {:>8} {:>10.1f} {:>8.2f} {:>8} {:>9.1f} {:>9.1f} {:>9.2f} {:>9.2f} {:>9}\n",
      run.server, run.streams, run.output_tokens, run.tokens_per_s, run.tokens_per_s_vs_one_stream,
      run.tokens_per_s_vs_peer > 0 ? fmt::format("{:.2f}", run.tokens_per_s_vs_peer) : "-",
      run.ttft_p50_ms, run.ttft_p99_ms, run.tpot_p50_ms, run.tpot_p99_ms,
      run.mean_step_rows > 0 ? fmt::format("{:.1f}", run.mean_step_rows) : "-");
}

void RunServeBench(const ServeBenchOptions& o) {
  std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  const std::string peer = o.no_peer ? "" : ValueOrThrow(FindPeer("llama-server", o.peer_path));
  const unsigned threads = o.threads != 0 ? o.threads : std::thread::hardware_concurrency();
  ServeBenchReport report;
  report.model = model->config().ToString();
  report.prompt_tokens = o.prompt_tokens;
  report.max_tokens = o.max_tokens;
  report.n_ctx = o.n_ctx;
  report.threads = threads;
  report.peer = !peer.empty() ? peer
                : o.no_peer   ? "none (--no-peer)"
                              : "none (no llama-server in ../shared/peers/bin: argus alone)";
  fmt::print(stderr, "bench serve: peer {}\n", report.peer);
  fmt::print("{:>13} {:>8} {:>8} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "server",
             "streams", "tokens", "tok/s", "vs 1", "vs peer", "ttft p50", "ttft p99", "tpot p50",
             "tpot p99", "rows/step");
  const auto first_of = [&](const std::string& server) -> const ServeBenchRun* {
    for (const ServeBenchRun& r : report.runs) {
      if (r.server == server && r.streams == 1 && r.error.empty()) return &r;
    }
    return nullptr;
  };
  // Each N: argus, then the peer, so both see the machine in the same state.
  for (uint32_t n : o.streams) {
    std::vector<ServeBenchRun> pair;
    fmt::print(stderr, "bench serve: argus, {} concurrent streams\n", n);
    pair.push_back(RunArgus(*model, o, n));
    if (!peer.empty()) {
      fmt::print(stderr, "bench serve: llama-server, {} concurrent streams\n", n);
      pair.push_back(RunPeer(peer, o, n, threads));
      if (pair[1].error.empty())
        pair[0].tokens_per_s_vs_peer = pair[0].tokens_per_s / pair[1].tokens_per_s;
    }
    for (ServeBenchRun& run : pair) {
      const ServeBenchRun* one = first_of(run.server);
      run.tokens_per_s_vs_one_stream =
          n == 1 ? 1 : (one != nullptr ? run.tokens_per_s / one->tokens_per_s : 0);
      PrintRun(run);
      report.runs.push_back(run);
    }
    WriteJsonReport(nlohmann::json(report).dump(2), o.json_path, "bench serve");
  }
}

}  // namespace

void AddServeBenchCommand(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "serve",
      "argus serve with N concurrent streamed requests over loopback HTTP: aggregate "
      "tokens per second and time to first token / per output token, beside llama-server");
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
  cmd->add_option("--peer", o->peer_path,
                  "llama-server to run beside argus on the same file and requests (default: "
                  "../shared/peers/bin/llama-server when present)");
  cmd->add_flag("--no-peer", o->no_peer, "Run argus alone");
  AddJsonOption(*cmd, &o->json_path);
  auto m = std::make_shared<ServeMemoryOptions>();
  cmd->add_flag("--memory", o->memory,
                "Run the memory scenario instead: --conversations requests of "
                "--conversation-tokens tokens at once under a RAM budget of --ram-fraction of "
                "their exact KV, the placement engine spilling to a disk tier");
  cmd->add_option("--conversations", m->conversations, "Memory scenario: conversations at once")
      ->capture_default_str();
  cmd->add_option("--conversation-tokens", m->conversation_tokens,
                  "Memory scenario: tokens of each conversation, prompt and generated")
      ->capture_default_str();
  cmd->add_option("--ram-fraction", m->ram_fraction,
                  "Memory scenario: the RAM budget over the conversations' exact KV")
      ->capture_default_str();
  cmd->add_option("--profile", m->profile,
                  "Memory scenario: the placement profile (a built-in name or a JSON file)")
      ->capture_default_str();
  cmd->add_option("--disk-dir", m->disk_dir,
                  "Memory scenario: the disk tier's directory (default: a temporary one)");
  cmd->callback([o, m] {
    if (!o->memory) return RunServeBench(*o);
    ServeMemoryOptions memory = *m;
    memory.model_path = o->model_path;
    memory.json_path = o->json_path;
    memory.threads = o->threads;
    memory.page_tokens = o->page_tokens;
    memory.max_tokens = o->max_tokens;
    RunServeMemoryBench(memory);
  });
}

}  // namespace argus::cli
