// argus-bench e2e: decode time per output token of a whole model at several context depths, for
// several KV codecs side by side, split into matmul / attention / other; and time to first token
// for prompts of several lengths, each beside stock llama.cpp on the same file.
//
// The context up to the depth is synthetic K/V appended straight into the cache (a 32K prefill
// of a 0.5B model would take this machine most of an hour); the decode steps then run the real
// forward pass over it. Configurations of one depth are timed in interleaved rounds and the best
// round of each is kept, so the ratios to f16 compare like with like on a noisy machine.
#include <fmt/core.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "argus/core.h"
#include "argus/model.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "bench/cli/peers.h"
#include "cli/commands.h"
#include "core/measure.h"
#include "core/probe.h"
#include "core/splitmix.h"

namespace argus::cli {
namespace {

struct Config {
  CodecPair pair;
  std::unique_ptr<Context> context;
  TimeSplit best;  // per token, the best round
  int32_t token = 0;
  std::optional<double> peer_best_ms;  // the peer's best round on this KV type
  std::string peer_error;
};

// Decodes n tokens greedily; returns the time split per token.
Result<TimeSplit> DecodeRound(Config& c, uint32_t n) {
  c.context->ResetTimes();
  for (uint32_t i = 0; i < n; ++i) {
    ARGUS_ASSIGN_OR_RETURN(std::span<const float> logits, c.context->Eval({&c.token, 1}));
    c.token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  TimeSplit t = c.context->times();
  const double per = 1.0 / n;
  return TimeSplit{t.matmul_s * per, t.attention_s * per, t.other_s * per, 1};
}

// The KV type depthbench takes for a pair: f16, q8_0 or q4_0 for both K and V; "" otherwise.
std::string PeerKvType(const CodecPair& pair) {
  if (pair.k != pair.v) return "";
  for (const char* type : {"f16", "q8_0", "q4_0"}) {
    if (pair.k == type) return type;
  }
  return "";
}

// depthbench's median decode time per token after a prefill of `depth` tokens (flash attention
// on, as its README says), one run. It prints "... decode median M ms mean ...".
Result<double> PeerDecodeMs(const std::string& peer, const std::string& model, uint32_t depth,
                            uint32_t n_tokens, const std::string& type, unsigned threads) {
  ARGUS_ASSIGN_OR_RETURN(
      std::string out, RunPeer(peer, {model, std::to_string(depth), std::to_string(n_tokens), type,
                                      std::to_string(threads)}));
  const size_t at = out.find("decode median ");
  if (at == std::string::npos) return Status::Internal(peer + " printed no decode median: " + out);
  return std::stod(out.substr(at + 14));
}

// One round of the peer on c's KV type, when it has it, kept if best so far; after an error the
// type is not run again.
void PeerRound(const std::string& peer, const std::string& model, uint32_t depth, uint32_t n_tokens,
               unsigned threads, Config& c) {
  const std::string type = PeerKvType(c.pair);
  if (peer.empty() || type.empty() || !c.peer_error.empty()) return;
  fmt::print(stderr, "bench e2e: depth {}: depthbench {}\n", depth, type);
  Result<double> ms = PeerDecodeMs(peer, model, depth, n_tokens, type, threads);
  if (!ms.ok()) {
    c.peer_error = ms.status().message();
    fmt::print(stderr, "bench e2e: peer: {}\n", c.peer_error);
  } else if (!c.peer_best_ms || *ms < *c.peer_best_ms) {
    c.peer_best_ms = *ms;
  }
}

// argus's time to first token for a prompt of n random tokens: one Eval in chunks of n_batch.
Result<double> PrefillMs(const Model& model, uint32_t n, uint32_t n_batch, unsigned threads,
                         uint64_t seed) {
  ContextOptions co;
  co.n_ctx = n;
  co.n_batch = n_batch;
  co.n_threads = threads;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(model, co));
  std::vector<int32_t> tokens(n);
  SplitMix64 rng(seed);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.Next() % model.config().n_vocab);
  const auto start = Clock::now();
  ARGUS_RETURN_IF_ERROR(context->Eval(tokens).status());
  return Seconds(start) * 1e3;
}

// llama-bench's prompt processing of n tokens (flash attention, one repetition), as the time the
// prompt takes at its rate. It prints a JSON array of runs with "avg_ts", tokens per second.
Result<double> PeerPrefillMs(const std::string& peer, const std::string& model, uint32_t n,
                             unsigned threads) {
  ARGUS_ASSIGN_OR_RETURN(std::string out,
                         RunPeer(peer, {"-m", model, "-p", std::to_string(n), "-n", "0", "-fa", "1",
                                        "-t", std::to_string(threads), "-r", "1", "-o", "json"}));
  const nlohmann::json runs = nlohmann::json::parse(out, nullptr, false);
  if (!runs.is_array() || runs.empty() || !runs[0].contains("avg_ts")) {
    return Status::Internal(peer + " printed no prompt rate: " + out.substr(0, 400));
  }
  return n / runs[0]["avg_ts"].get<double>() * 1e3;
}

// The prefill points, argus and the peer interleaved round by round.
Status RunPrefill(const E2eBenchOptions& o, const Model& model, const std::string& path,
                  unsigned threads, E2eReport& report) {
  std::string peer;
  if (!o.no_peer) {
    ARGUS_ASSIGN_OR_RETURN(peer, FindPeer("llama-bench", ""));
  }
  report.prefill_peer = !peer.empty() ? peer
                        : o.no_peer   ? "none (--no-peer)"
                                      : "none (no llama-bench in ../shared/peers/bin)";
  for (uint32_t n : o.prefill_rounds > 0 ? o.prefill : std::vector<uint32_t>{}) {
    PrefillPoint p{.tokens = n};
    for (int round = 0; round < o.prefill_rounds; ++round) {
      fmt::print(stderr, "bench e2e: prefill {} tokens, round {}\n", n, round + 1);
      ARGUS_ASSIGN_OR_RETURN(const double ms,
                             PrefillMs(model, n, o.prefill_batch, threads, o.seed + round));
      if (round == 0 || ms < p.ms) p.ms = ms;
      if (peer.empty() || !p.peer_error.empty()) continue;
      Result<double> peer_ms = PeerPrefillMs(peer, path, n, threads);
      if (!peer_ms.ok()) {
        p.peer_error = peer_ms.status().message();
        fmt::print(stderr, "bench e2e: peer: {}\n", p.peer_error);
      } else if (!p.peer_ms || *peer_ms < *p.peer_ms) {
        p.peer_ms = *peer_ms;
      }
    }
    p.tokens_per_s = n / p.ms * 1e3;
    if (p.peer_ms) p.speedup_vs_peer = *p.peer_ms / p.ms;
    report.prefill.push_back(std::move(p));
  }
  return Status::Ok();
}

}  // namespace

void to_json(nlohmann::json& j, const PrefillPoint& p) {
  j = {{"tokens", p.tokens}, {"ms", p.ms}, {"tokens_per_s", p.tokens_per_s}};
  if (p.peer_ms) j["peer_ms"] = *p.peer_ms;
  if (p.speedup_vs_peer) j["speedup_vs_peer"] = *p.speedup_vs_peer;
  if (!p.peer_error.empty()) j["peer_error"] = p.peer_error;
}

void to_json(nlohmann::json& j, const E2ePoint& p) {
  j = {{"depth", p.depth},
       {"kv", p.kv},
       {"ms_per_token", p.ms_per_token},
       {"tokens_per_s", p.tokens_per_s},
       {"matmul_ms", p.matmul_ms},
       {"attention_ms", p.attention_ms},
       {"other_ms", p.other_ms},
       {"kv_bytes", p.kv_bytes},
       {"matmul_vs_roofline", p.matmul_vs_roofline},
       {"roofline_ms", p.roofline_ms},
       {"vs_roofline", p.vs_roofline}};
  if (p.speedup_vs_f16) j["speedup_vs_f16"] = *p.speedup_vs_f16;
  if (p.attention_speedup_vs_f16) j["attention_speedup_vs_f16"] = *p.attention_speedup_vs_f16;
  if (p.peer_ms_per_token) j["peer_ms_per_token"] = *p.peer_ms_per_token;
  if (p.speedup_vs_peer) j["speedup_vs_peer"] = *p.speedup_vs_peer;
  if (!p.peer_error.empty()) j["peer_error"] = p.peer_error;
}

void to_json(nlohmann::json& j, const E2eReport& r) {
  j = {{"bench", "e2e"},
       {"model", r.model},
       {"model_config", r.model_config},
       {"weight_bytes", r.weight_bytes},
       {"weight_type", r.weight_type},
       {"threads", r.threads},
       {"read_gbps", r.read_gbps},
       {"matmul_roofline_ms", r.matmul_roofline_ms},
       {"peer", r.peer},
       {"tokens_per_round", r.tokens_per_round},
       {"rounds", r.rounds},
       {"points", r.points},
       {"prefill_peer", r.prefill_peer},
       {"prefill", r.prefill}};
}

Result<E2eReport> RunE2eBench(const E2eBenchOptions& o) {
  std::string path = o.model_path;
  std::filesystem::path temp;
  if (path.empty()) {
    RandomModelOptions random;
    ARGUS_ASSIGN_OR_RETURN(random.config, ModelPreset(o.preset));
    random.type = o.type == "q4_0" ? GgmlType::kQ4_0 : GgmlType::kQ8_0;
    temp = std::filesystem::temp_directory_path() /
           fmt::format("argus-bench-{}-{}.gguf", o.preset, getpid());
    fmt::print(stderr, "bench e2e: writing a random {} model ({}) to {}\n", o.preset, o.type,
               temp.string());
    ARGUS_RETURN_IF_ERROR(WriteRandomModel(random, temp.string()));
    path = temp.string();
  }
  // The temporary model goes away however this returns.
  std::shared_ptr<void> remove_temp(nullptr, [temp](void*) {
    if (!temp.empty()) std::filesystem::remove(temp);
  });
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(path));
  const ModelConfig& mc = model->config();
  ThreadPool probe_pool(o.threads);
  ARGUS_ASSIGN_OR_RETURN(MachineProbe probe, ProbeMachine(probe_pool));
  const double matmul_roofline_ms =
      static_cast<double>(model->weight_bytes()) / (probe.read_gbps_all_threads * 1e9) * 1e3;
  fmt::print(stderr, "bench e2e: {}, {:.1f} MiB of weights; read bandwidth {:.1f} GB/s\n",
             mc.ToString(), model->weight_bytes() / 1048576.0, probe.read_gbps_all_threads);

  std::string peer;
  if (!o.no_peer) {
    ARGUS_ASSIGN_OR_RETURN(peer, FindPeer("depthbench", o.peer_path));
  }
  E2eReport report{.model = mc.name,
                   .model_config = mc.ToString(),
                   .weight_bytes = model->weight_bytes(),
                   .weight_type = o.model_path.empty() ? o.type : "from file",
                   .threads = probe.n_threads,
                   .read_gbps = probe.read_gbps_all_threads,
                   .matmul_roofline_ms = matmul_roofline_ms,
                   .peer = !peer.empty() ? peer
                           : o.no_peer   ? "none (--no-peer)"
                                         : "none (no depthbench in ../shared/peers/bin)",
                   .tokens_per_round = o.tokens,
                   .rounds = o.rounds};
  for (uint32_t depth : o.depths) {
    std::vector<Config> configs;
    for (const std::string& pair : o.kv) {
      Config c;
      ARGUS_ASSIGN_OR_RETURN(c.pair, ParseCodecPair(pair));
      ContextOptions co;
      co.n_ctx = depth + o.tokens * (o.rounds + 1) + 1;
      co.n_threads = o.threads;
      co.page_tokens = o.page_tokens;
      co.k_codec = c.pair.k;
      co.v_codec = c.pair.v;
      ARGUS_ASSIGN_OR_RETURN(c.context, Context::Create(*model, co));
      fmt::print(stderr, "bench e2e: depth {}: filling {}\n", depth, c.pair.name());
      ARGUS_RETURN_IF_ERROR(c.context->AppendSyntheticContext(depth, o.seed));
      c.token = model->tokenizer().bos() >= 0 ? model->tokenizer().bos() : 0;
      ARGUS_RETURN_IF_ERROR(DecodeRound(c, 1).status());  // warm-up
      configs.push_back(std::move(c));
    }
    // Each round runs argus's configurations, then the peer's: both see the machine as it is
    // during that round (this VM's memory bandwidth moves by tens of percent within minutes).
    for (int round = 0; round < o.rounds; ++round) {
      for (Config& c : configs) {
        ARGUS_ASSIGN_OR_RETURN(TimeSplit t, DecodeRound(c, o.tokens));
        if (round == 0 || t.total_s() < c.best.total_s()) c.best = t;
      }
      for (Config& c : configs) PeerRound(peer, path, depth, o.tokens, probe.n_threads, c);
    }
    const Config* f16 = nullptr;
    for (const Config& c : configs) {
      if (c.pair.k == "f16" && c.pair.v == "f16") f16 = &c;
    }
    for (const Config& c : configs) {
      const TimeSplit& t = c.best;
      const size_t kv_bytes = c.context->cache().stats().page_bytes;
      const double roofline_ms = static_cast<double>(model->weight_bytes() + kv_bytes) /
                                 (probe.read_gbps_all_threads * 1e9) * 1e3;
      E2ePoint p{.depth = depth,
                 .kv = c.pair.name(),
                 .ms_per_token = t.total_s() * 1e3,
                 .tokens_per_s = 1.0 / t.total_s(),
                 .matmul_ms = t.matmul_s * 1e3,
                 .attention_ms = t.attention_s * 1e3,
                 .other_ms = t.other_s * 1e3,
                 .kv_bytes = kv_bytes,
                 .matmul_vs_roofline = t.matmul_s * 1e3 / matmul_roofline_ms,
                 .roofline_ms = roofline_ms,
                 .vs_roofline = t.total_s() * 1e3 / roofline_ms};
      if (f16 != nullptr) {
        p.speedup_vs_f16 = f16->best.total_s() / t.total_s();
        p.attention_speedup_vs_f16 = f16->best.attention_s / t.attention_s;
      }
      if (c.peer_best_ms) {
        p.peer_ms_per_token = *c.peer_best_ms;
        p.speedup_vs_peer = *c.peer_best_ms / p.ms_per_token;
      }
      p.peer_error = c.peer_error;
      fmt::print(stderr, "  {:>6} {:<20} {:7.2f} ms/token (matmul {:.2f}, attention {:.2f})\n",
                 depth, p.kv, p.ms_per_token, p.matmul_ms, p.attention_ms);
      report.points.push_back(std::move(p));
    }
  }
  ARGUS_RETURN_IF_ERROR(RunPrefill(o, *model, path, probe.n_threads, report));
  return report;
}

void PrintE2eBench(const E2eReport& report) {
  fmt::print("{} ({} weights, {} threads); matmul roofline {:.2f} ms/token at {:.1f} GB/s\n",
             report.model_config, report.weight_type, report.threads, report.matmul_roofline_ms,
             report.read_gbps);
  fmt::print("peer: {}\n", report.peer);
  fmt::print("{:>6}  {:<20} {:>9} {:>8} {:>9} {:>9} {:>7} {:>8} {:>9} {:>9} {:>8}\n", "depth", "KV",
             "ms/token", "tok/s", "matmul", "attention", "other", "vs f16", "roofline", "peer ms",
             "vs peer");
  for (const E2ePoint& p : report.points) {
    fmt::print(
        "{:>6}  {:<20} {:>9.2f} {:>8.1f} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.2f}x {:>8.2f}x {:>9} "
        "{:>8}\n",
        p.depth, p.kv, p.ms_per_token, p.tokens_per_s, p.matmul_ms, p.attention_ms, p.other_ms,
        p.speedup_vs_f16.value_or(0.0), p.vs_roofline,
        p.peer_ms_per_token ? fmt::format("{:.2f}", *p.peer_ms_per_token) : "-",
        p.speedup_vs_peer ? fmt::format("{:.2f}x", *p.speedup_vs_peer) : "-");
  }
  if (report.prefill.empty()) return;
  fmt::print("\ntime to first token (f16 KV); peer: {}\n", report.prefill_peer);
  fmt::print("{:>7}  {:>10} {:>8} {:>10} {:>8}\n", "prompt", "ms", "tok/s", "peer ms", "vs peer");
  for (const PrefillPoint& p : report.prefill) {
    fmt::print("{:>7}  {:>10.1f} {:>8.1f} {:>10} {:>8}\n", p.tokens, p.ms, p.tokens_per_s,
               p.peer_ms ? fmt::format("{:.1f}", *p.peer_ms) : "-",
               p.speedup_vs_peer ? fmt::format("{:.2f}x", *p.speedup_vs_peer) : "-");
  }
}

}  // namespace argus::cli
