// argus-bench e2e: decode time per output token of a whole model at several context depths, for
// several KV codecs side by side, split into matmul / attention / other.
//
// The context up to the depth is synthetic K/V appended straight into the cache (a 32K prefill
// of a 0.5B model would take this machine most of an hour); the decode steps then run the real
// forward pass over it. Configurations of one depth are timed in interleaved rounds and the best
// round of each is kept, so the ratios to f16 compare like with like on a noisy machine.
#include <fmt/core.h>
#include <unistd.h>

#include <filesystem>

#include "argus/core.h"
#include "argus/model.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "cli/commands.h"
#include "core/probe.h"

namespace argus::cli {
namespace {

struct Config {
  CodecPair pair;
  std::unique_ptr<Context> context;
  TimeSplit best;  // per token, the best round
  int32_t token = 0;
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

nlohmann::json SplitJson(const TimeSplit& t) {
  return {{"ms_per_token", t.total_s() * 1e3},
          {"tokens_per_s", 1.0 / t.total_s()},
          {"matmul_ms", t.matmul_s * 1e3},
          {"attention_ms", t.attention_s * 1e3},
          {"other_ms", t.other_s * 1e3}};
}

}  // namespace

Result<nlohmann::json> RunE2eBench(const E2eBenchOptions& o) {
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

  nlohmann::json points = nlohmann::json::array();
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
    for (int round = 0; round < o.rounds; ++round) {
      for (Config& c : configs) {
        ARGUS_ASSIGN_OR_RETURN(TimeSplit t, DecodeRound(c, o.tokens));
        if (round == 0 || t.total_s() < c.best.total_s()) c.best = t;
      }
    }
    const Config* f16 = nullptr;
    for (const Config& c : configs) {
      if (c.pair.k == "f16" && c.pair.v == "f16") f16 = &c;
    }
    for (const Config& c : configs) {
      nlohmann::json p = SplitJson(c.best);
      p["depth"] = depth;
      p["kv"] = c.pair.name();
      p["kv_bytes"] = c.context->cache().stats().page_bytes;
      p["matmul_vs_roofline"] = c.best.matmul_s * 1e3 / matmul_roofline_ms;
      if (f16 != nullptr) {
        p["speedup_vs_f16"] = f16->best.total_s() / c.best.total_s();
        p["attention_speedup_vs_f16"] = f16->best.attention_s / c.best.attention_s;
      }
      fmt::print(stderr, "  {:>6} {:<20} {:7.2f} ms/token (matmul {:.2f}, attention {:.2f})\n",
                 depth, p["kv"].get<std::string>(), c.best.total_s() * 1e3, c.best.matmul_s * 1e3,
                 c.best.attention_s * 1e3);
      points.push_back(std::move(p));
    }
  }
  return nlohmann::json{
      {"bench", "e2e"},
      {"model", mc.name},
      {"model_config", mc.ToString()},
      {"weight_bytes", model->weight_bytes()},
      {"weight_type", o.model_path.empty() ? o.type : "from file"},
      {"threads", probe.n_threads},
      {"read_gbps", probe.read_gbps_all_threads},
      {"matmul_roofline_ms", matmul_roofline_ms},
      {"tokens_per_round", o.tokens},
      {"rounds", o.rounds},
      {"points", points}};
}

void PrintE2eBench(const nlohmann::json& report) {
  fmt::print("{} ({} weights, {} threads); matmul roofline {:.2f} ms/token at {:.1f} GB/s\n",
             report["model_config"].get<std::string>(), report["weight_type"].get<std::string>(),
             report["threads"].get<unsigned>(), report["matmul_roofline_ms"].get<double>(),
             report["read_gbps"].get<double>());
  fmt::print("{:>6}  {:<20} {:>9} {:>8} {:>9} {:>9} {:>7} {:>8}\n", "depth", "KV", "ms/token",
             "tok/s", "matmul", "attention", "other", "vs f16");
  for (const auto& p : report["points"]) {
    fmt::print("{:>6}  {:<20} {:>9.2f} {:>8.1f} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.2f}x\n",
               p["depth"].get<uint32_t>(), p["kv"].get<std::string>(),
               p["ms_per_token"].get<double>(), p["tokens_per_s"].get<double>(),
               p["matmul_ms"].get<double>(), p["attention_ms"].get<double>(),
               p["other_ms"].get<double>(), p.value("speedup_vs_f16", 0.0));
  }
}

}  // namespace argus::cli
