// argus-bench remote: time to first token after a shared prefix, recomputed, loaded from the
// local disk tier, and fetched from Redis (the remote tier) into a fresh local disk tier.
#include <fmt/core.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "argus/core.h"
#include "argus/model.h"
#include "argus/remote.h"
#include "bench/cli/bench_commands.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/measure.h"
#include "model/remote_prefix.h"

namespace argus::cli {
namespace {

struct RemoteBenchOptions {
  std::string model_path, url, dir, json_path;
  std::vector<uint32_t> prefixes = {4096, 16384};
  uint32_t page_tokens = 256;
  unsigned threads = 0;
  uint64_t seed = 1;
  uint32_t recompute_max = 4096;  // longer prefixes get synthetic pages, not a recomputation
};

struct RemoteBenchRun {
  double ttft_s = 0;
  uint32_t n_reused = 0;
  RemoteTierStats remote_delta;
};

RemoteTierStats RemoteStatsDelta(const RemoteTierStats& a, const RemoteTierStats& b) {
  RemoteTierStats d;
  d.n_hits = b.n_hits - a.n_hits;
  d.n_misses = b.n_misses - a.n_misses;
  d.n_damaged = b.n_damaged - a.n_damaged;
  d.n_written = b.n_written - a.n_written;
  d.read_bytes = b.read_bytes - a.read_bytes;
  d.written_bytes = b.written_bytes - a.written_bytes;
  d.n_round_trips = b.n_round_trips - a.n_round_trips;
  d.n_errors = b.n_errors - a.n_errors;
  return d;
}

// One prefix length: time to first token each way, and the remote tier's traffic of the first
// request (which stores the prefix) and of the request that fetches it.
struct RemotePrefixFigures {
  uint32_t tokens = 0;
  bool computed = true;                   // false: synthetic pages, not recomputed
  std::optional<double> recompute_ttft_s;  // when computed
  double local_disk_ttft_s = 0, redis_ttft_s = 0;
  RemoteTierStats first_request, fetch;
};
struct RemoteBenchReport {
  std::string model, remote;
  uint32_t page_tokens = 0;
  unsigned threads = 0;
  std::vector<RemotePrefixFigures> prefixes;
};

// The report keeps its fields in this order (nlohmann::ordered_json), as a reader scans it.
void RemoteStatsJson(nlohmann::ordered_json& j, const RemoteTierStats& s) {
  j = {{"round_trips", s.n_round_trips}, {"bytes_read", s.read_bytes},
       {"bytes_written", s.written_bytes}, {"pages_hit", s.n_hits},
       {"pages_written", s.n_written},     {"errors", s.n_errors}};
}

void to_json(nlohmann::ordered_json& j, const RemotePrefixFigures& p) {
  nlohmann::ordered_json first_request, fetch;
  RemoteStatsJson(first_request, p.first_request);
  RemoteStatsJson(fetch, p.fetch);
  j = {{"tokens", p.tokens},
       {"pages", p.computed ? "computed" : "synthetic"},
       {"recompute_ttft_s",
        p.recompute_ttft_s ? nlohmann::ordered_json(*p.recompute_ttft_s) : nlohmann::ordered_json()},
       {"local_disk_ttft_s", p.local_disk_ttft_s},
       {"redis_ttft_s", p.redis_ttft_s},
       {"first_request", first_request},
       {"fetch", fetch}};
}

void to_json(nlohmann::ordered_json& j, const RemoteBenchReport& r) {
  j = {{"model", r.model},
       {"remote", r.remote},
       {"page_tokens", r.page_tokens},
       {"threads", r.threads},
       {"prefixes", r.prefixes}};
}

// Stores seeded-noise pages under the prefix keys of `tokens` in the bench's own disk and
// remote tiers, through a cache of the context's shape: the bytes a real prefix of that length
// occupies. (A Context never stores noise as a prefix: it is no token's K/V.)
void StoreSyntheticPrefix(const Model& model, const ContextOptions& context,
                          const std::vector<int32_t>& tokens, uint64_t seed, DiskTier& disk,
                          RemoteTier& remote) {
  CacheOptions options;
  options.geometry = model.config().geometry();
  options.page_tokens = context.page_tokens;
  options.k_codec = context.k_codec;
  options.v_codec = context.v_codec;
  options.disk = &disk;
  options.ram_budget_bytes =
      ValueOrThrow(KvCache::RequiredRamBytes(options, static_cast<uint32_t>(tokens.size())));
  std::unique_ptr<KvCache> cache = ValueOrThrow(KvCache::Create(options));
  const SeqId seq = ValueOrThrow(cache->CreateSequence());
  const CacheGeometry& g = options.geometry;
  const size_t row = size_t{g.n_kv_heads} * g.head_dim;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> k(tokens.size() * row), v(k.size());
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    ThrowIfError(cache->Append(seq, layer, k, v));
  }
  PrefixStoreStats stored;
  ThrowIfError(cache->StorePrefix(seq, model.fingerprint(), tokens, UINT32_MAX, stored));
  model::StoreRemotePrefix(*cache, disk, remote, model.fingerprint(), tokens);
}

// One request: a fresh context (disk and remote tiers optional), prefix pages loaded when there
// is a disk tier, the rest of the prompt evaluated, the first token sampled. With `store`, the
// prefix pages are stored afterwards (not timed). With `synthetic`, the prefix's K/V is seeded
// noise appended without running the model (nothing timed): pages of the same bytes per token,
// for the load paths of a prefix too long to recompute here.
RemoteBenchRun RunRemoteBenchRequest(const Model& model, const RemoteBenchOptions& o,
                                     const std::vector<int32_t>& tokens, DiskTier* disk,
                                     RemoteTier* remote, bool store, bool synthetic = false) {
  ContextOptions options;
  options.n_ctx = static_cast<uint32_t>(tokens.size() + 16);
  options.n_threads = o.threads;
  options.n_batch = 256;
  options.page_tokens = o.page_tokens;
  options.disk = disk;
  options.remote = remote;
  const RemoteTierStats before = remote ? remote->stats() : RemoteTierStats{};
  RemoteBenchRun run;
  if (synthetic) {
    StoreSyntheticPrefix(model, options, tokens, o.seed, *disk, *remote);
    run.remote_delta = RemoteStatsDelta(before, remote->stats());
    return run;
  }
  std::unique_ptr<Context> context = ValueOrThrow(Context::Create(model, options));
  const auto t0 = Clock::now();
  if (disk != nullptr) {
    run.n_reused = ValueOrThrow(context->LoadPrefix(std::span(tokens).first(tokens.size() - 1)));
  }
  std::span<const float> logits;
  for (size_t first = run.n_reused; first < tokens.size(); first += options.n_batch) {
    const size_t n = std::min<size_t>(options.n_batch, tokens.size() - first);
    logits = ValueOrThrow(context->Eval(std::span(tokens).subspan(first, n)));
  }
  Sampler sampler(SamplerOptions{});
  (void)sampler.Sample(logits);
  run.ttft_s = Seconds(t0);
  PrefixStoreStats stored;
  if (store) ThrowIfError(context->StorePrefix(tokens, stored));
  if (remote) run.remote_delta = RemoteStatsDelta(before, remote->stats());
  return run;
}

std::unique_ptr<DiskTier> OpenRemoteBenchDisk(const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path());
  return OpenDiskTier(dir, size_t{16} << 30);
}

RemoteBenchReport RunRemoteBench(const RemoteBenchOptions& o) {
  std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  RemoteTierOptions remote_options;
  remote_options.url = o.url;
  remote_options.timeout_s = 10;
  remote_options.on_warning = [](const Status& s) {
    fmt::print(stderr, "bench remote: {}\n", s.ToString());
  };
  std::unique_ptr<RemoteTier> remote = ValueOrThrow(RemoteTier::Open(remote_options));
  RemoteBenchReport report{.model = model->config().ToString(),
                           .remote = remote->name(),
                           .page_tokens = o.page_tokens,
                           .threads = o.threads};
  std::mt19937_64 rng(o.seed);
  for (uint32_t n_prefix : o.prefixes) {
    // A prefix of whole pages, then one token of the request's own.
    std::vector<int32_t> tokens(n_prefix + 1);
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(model->config().n_vocab) - 1);
    for (int32_t& t : tokens) t = id(rng);
    const bool recompute_it = n_prefix <= o.recompute_max;
    fmt::print(stderr, "bench remote: {} prefix tokens: {}\n", n_prefix,
               recompute_it ? "recomputing" : "synthetic pages (not recomputed)");
    const std::string local = o.dir + "/local", fresh = o.dir + "/fresh";
    RemoteBenchRun recompute;
    {
      std::unique_ptr<DiskTier> disk = OpenRemoteBenchDisk(local);
      // The first request computes the prefix and stores its pages locally and in Redis.
      recompute = RunRemoteBenchRequest(*model, o, tokens, disk.get(), remote.get(), true,
                                        !recompute_it);
      fmt::print(stderr, "bench remote: {} prefix tokens: from the local disk\n", n_prefix);
      const RemoteBenchRun from_disk =
          RunRemoteBenchRequest(*model, o, tokens, disk.get(), nullptr, false);
      disk.reset();
      fmt::print(stderr, "bench remote: {} prefix tokens: from Redis\n", n_prefix);
      std::unique_ptr<DiskTier> empty = OpenRemoteBenchDisk(fresh);
      const RemoteBenchRun from_redis =
          RunRemoteBenchRequest(*model, o, tokens, empty.get(), remote.get(), false);
      empty.reset();
      std::filesystem::remove_all(local);
      std::filesystem::remove_all(fresh);
      if (recompute.n_reused != 0 || from_disk.n_reused != n_prefix ||
          from_redis.n_reused != n_prefix) {
        throw CommandError{Status::Internal(fmt::format(
            "bench remote: {0} prefix tokens: reused {1} (recompute), {2} (disk), {3} (Redis); "
            "expected 0, {0}, {0}",
            n_prefix, recompute.n_reused, from_disk.n_reused, from_redis.n_reused))};
      }
      report.prefixes.push_back({.tokens = n_prefix,
                                 .computed = recompute_it,
                                 .recompute_ttft_s = recompute_it
                                                         ? std::optional<double>(recompute.ttft_s)
                                                         : std::nullopt,
                                 .local_disk_ttft_s = from_disk.ttft_s,
                                 .redis_ttft_s = from_redis.ttft_s,
                                 .first_request = recompute.remote_delta,
                                 .fetch = from_redis.remote_delta});
      fmt::print(stderr, "bench remote: {}\n",
                 nlohmann::ordered_json(report.prefixes.back()).dump());
      // Rewritten after each prefix, so a run cut short keeps what it measured.
      WriteJsonReport(nlohmann::ordered_json(report).dump(2), o.json_path, "bench remote");
    }
  }
  return report;
}

void PrintRemoteBench(const RemoteBenchReport& report) {
  fmt::print("{}, {}-token pages, Redis at {}\n", report.model, report.page_tokens,
             report.remote);
  fmt::print("{:>8} {:>13} {:>13} {:>13} {:>12} {:>10} {:>12} {:>10}\n", "prefix",
             "recompute ms", "local disk ms", "Redis ms", "fetched MiB", "fetch RTs",
             "stored MiB", "store RTs");
  for (const RemotePrefixFigures& p : report.prefixes) {
    const std::string recompute = p.recompute_ttft_s
                                      ? fmt::format("{:.1f}", *p.recompute_ttft_s * 1e3)
                                      : std::string("-");
    fmt::print("{:>8} {:>13} {:>13.1f} {:>13.1f} {:>12.1f} {:>10} {:>12.1f} {:>10}\n", p.tokens,
               recompute, p.local_disk_ttft_s * 1e3, p.redis_ttft_s * 1e3,
               static_cast<double>(p.fetch.read_bytes) / 1048576.0, p.fetch.n_round_trips,
               static_cast<double>(p.first_request.written_bytes) / 1048576.0,
               p.first_request.n_round_trips);
  }
}

}  // namespace

void AddRemoteBenchCommand(CLI::App& bench) {
  auto* remote = bench.add_subcommand(
      "remote", "Time to first token after a shared prefix: recomputed, local disk, Redis");
  auto o = std::make_shared<RemoteBenchOptions>();
  remote->add_option("-m,--model", o->model_path, "GGUF model (e.g. from argus make-model)")
      ->required()
      ->check(CLI::ExistingFile);
  remote->add_option("--remote", o->url, "Redis URL, redis://HOST:PORT[/DB]")->required();
  remote->add_option("--dir", o->dir, "Directory for the local disk tiers")->required();
  AddJsonOption(*remote, &o->json_path);
  remote->add_option("--prefixes", o->prefixes, "Prefix lengths in tokens")
      ->delimiter(',')
      ->capture_default_str();
  remote->add_option("--page-tokens", o->page_tokens, "Tokens per page")->capture_default_str();
  remote->add_option("-t,--threads", o->threads, "Threads (0: one per hardware thread)")
      ->capture_default_str();
  remote->add_option("--seed", o->seed, "Seed of the prefix tokens")->capture_default_str();
  remote->add_option("--recompute-max", o->recompute_max,
                     "Longest prefix recomputed; longer ones get synthetic K/V pages (the load "
                     "paths are timed, the recomputation is not)")
      ->capture_default_str();
  remote->callback([o] {
    for (uint32_t n : o->prefixes) {
      if (n == 0 || n % o->page_tokens != 0) {
        throw CommandError{Status::InvalidArgument(
            fmt::format("--prefixes: {} is not a positive multiple of --page-tokens {}", n,
                        o->page_tokens))};
      }
    }
    PrintRemoteBench(RunRemoteBench(*o));
  });
}

}  // namespace argus::cli
