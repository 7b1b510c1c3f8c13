// argus bench codecs: every codec side by side with f16 in one run. Speed over a context whose
// encoded bytes exceed the last-level cache (so every byte comes from memory), quality against
// double precision on the synthetic KV generator's three key regimes.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "argus/codec.h"
#include "argus/core.h"
#include "cli/bench.h"
#include "cli/commands.h"

namespace argus::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kTileTokens = 256;
constexpr uint32_t kPoolTiles = 16;  // distinct tiles; the context repeats them

// Variants measured beside every registered codec: groupings and transforms the targets name.
const char* const kVariants[] = {"int8:channel", "int4:channel", "int2:channel", "q4_0+center",
                                 "q4_0+rot",     "int4+rot",     "int2+rot",     "int2:channel+rot",
                                 "q4_0+rot+center"};

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

struct SpeedResult {
  double ns_per_token = 0;     // scores + accumulate, one KV head (n_q query heads), per cached token
  double bytes_per_token = 0;  // encoded K + V bytes per cached token
  size_t context_tokens = 0;
};

// Times scores+accumulate over a context of repeated pool tiles, larger than `min_bytes`.
Result<SpeedResult> MeasureSpeed(const Codec& k_codec, const Codec& v_codec, const SyntheticKv& pool,
                                 uint32_t n_q, size_t min_bytes, int reps) {
  const uint32_t d = pool.dim;
  const TileShape shape{kTileTokens, d};
  ARGUS_ASSIGN_OR_RETURN(size_t k_bytes, k_codec.encoded_size(shape));
  ARGUS_ASSIGN_OR_RETURN(size_t v_bytes, v_codec.encoded_size(shape));
  const bool has_v = v_codec.info().role != CodecRole::kKeys;
  const size_t pair_bytes = k_bytes + (has_v ? v_bytes : 0);
  const size_t n_tiles = std::max<size_t>(kPoolTiles, (min_bytes + pair_bytes - 1) / pair_bytes);
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer context, AlignedBuffer::Allocate(n_tiles * pair_bytes));
  // Tile i = pool tile i % kPoolTiles, K then V, packed back to back as a page store would.
  for (size_t i = 0; i < n_tiles; ++i) {
    const size_t src = (i % kPoolTiles) * size_t{kTileTokens} * d;
    std::byte* dst = context.data() + i * pair_bytes;
    if (i < kPoolTiles) {
      ARGUS_RETURN_IF_ERROR(k_codec.encode(pool.k.data() + src, shape, {dst, k_bytes}));
      if (has_v) ARGUS_RETURN_IF_ERROR(v_codec.encode(pool.v.data() + src, shape, {dst + k_bytes, v_bytes}));
    } else {
      std::memcpy(dst, context.data() + (i % kPoolTiles) * pair_bytes, pair_bytes);
    }
  }
  std::vector<float> q(pool.q.begin(), pool.q.begin() + size_t{n_q} * d);
  std::vector<float> s(size_t{n_q} * kTileTokens), acc(size_t{n_q} * d, 0.0f);
  std::vector<float> p(size_t{n_q} * kTileTokens, 1.0f / static_cast<float>(n_tiles * kTileTokens));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    for (size_t i = 0; i < n_tiles; ++i) {
      const std::byte* tile = context.data() + i * pair_bytes;
      ARGUS_RETURN_IF_ERROR(k_codec.scores({tile, k_bytes}, shape, q.data(), n_q, s.data()));
      if (has_v) ARGUS_RETURN_IF_ERROR(v_codec.accumulate({tile + k_bytes, v_bytes}, shape, p.data(), n_q, acc.data()));
    }
    best = std::min(best, Seconds(start));
  }
  SpeedResult result;
  result.context_tokens = n_tiles * kTileTokens;
  result.ns_per_token = best * 1e9 / static_cast<double>(result.context_tokens);
  result.bytes_per_token = static_cast<double>(pair_bytes) / kTileTokens;
  return result;
}

// Encode and decode throughput in GB/s of float32 values, over the pool (cache-resident).
Result<std::pair<double, double>> MeasureCodingRate(const Codec& codec, const SyntheticKv& pool) {
  const TileShape shape{kTileTokens, pool.dim};
  ARGUS_ASSIGN_OR_RETURN(size_t n_bytes, codec.encoded_size(shape));
  std::vector<std::byte> tile(n_bytes);
  std::vector<float> out(shape.n_values());
  double best_encode = 1e30, best_decode = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto start = Clock::now();
    for (uint32_t i = 0; i < kPoolTiles; ++i) {
      ARGUS_RETURN_IF_ERROR(codec.encode(pool.k.data() + size_t{i} * shape.n_values(), shape, tile));
    }
    best_encode = std::min(best_encode, Seconds(start));
    start = Clock::now();
    for (uint32_t i = 0; i < kPoolTiles; ++i) ARGUS_RETURN_IF_ERROR(codec.decode(tile, shape, out.data()));
    best_decode = std::min(best_decode, Seconds(start));
  }
  const double bytes = 4.0 * static_cast<double>(shape.n_values()) * kPoolTiles;
  return std::make_pair(bytes / best_encode / 1e9, bytes / best_decode / 1e9);
}

std::vector<std::string> DefaultSpecs() {
  std::vector<std::string> specs;
  for (const CodecInfo& info : CodecRegistry::Default().List()) specs.push_back(info.name);
  for (const char* variant : kVariants) {
    if (CodecRegistry::Default().Create(variant).ok()) specs.push_back(variant);
  }
  return specs;
}

}  // namespace

Result<nlohmann::json> RunCodecBench(const CodecBenchOptions& options) {
  ThreadPool pool(1);
  fmt::print(stderr, "bench codecs: probing the machine...\n");
  ARGUS_ASSIGN_OR_RETURN(MachineProbe probe, ProbeMachine(pool));
  const size_t min_bytes = options.quick ? LastLevelCacheBytes() / 2 : 2 * LastLevelCacheBytes();
  std::vector<std::string> specs = options.specs.empty() ? DefaultSpecs() : options.specs;
  // f16 runs first: every other codec's time is a ratio to it.
  std::erase(specs, "f16");
  specs.insert(specs.begin(), "f16");

  nlohmann::json report;
  report["machine"] = {{"read_gbps_one_thread", probe.read_gbps_one_thread},
                       {"fma_gflops_one_thread", probe.fma_gflops_one_thread},
                       {"last_level_cache_bytes", LastLevelCacheBytes()},
                       {"cpu_features", GetCpuFeatures().ToString()}};
  report["config"] = {{"tile_tokens", kTileTokens},
                      {"min_context_bytes", min_bytes},
                      {"quality_tokens", options.quality_tokens},
                      {"threads", 1},
                      {"seed", options.seed},
                      {"quick", options.quick}};

  std::map<std::pair<uint32_t, uint32_t>, double> f16_ns;  // (dim, n_q) -> f16 time per token
  nlohmann::json codecs = nlohmann::json::array();
  for (const std::string& spec : specs) {
    auto created = CodecRegistry::Default().Create(spec);
    if (!created.ok()) return created.status().WithContext("bench codecs");
    const Codec& codec = **created;
    // Keys-only codecs are measured with f16 values.
    std::unique_ptr<Codec> f16 = std::move(CodecRegistry::Default().Create("f16")).value();
    const Codec& v_codec = codec.info().role == CodecRole::kKeys ? *f16 : codec;
    nlohmann::json entry = {{"codec", spec},
                            {"bits_per_value", codec.info().bits_per_value},
                            {"kernel_path", std::string(KernelPathName(codec.kernel_path()))},
                            {"lossless", codec.info().lossless},
                            {"values_codec", v_codec.info().name}};
    nlohmann::json speed = nlohmann::json::array(), quality = nlohmann::json::array();
    for (uint32_t dim : options.dims) {
      fmt::print(stderr, "bench codecs: {} at head_dim {}...\n", spec, dim);
      SyntheticKvOptions gen{.regime = KeyRegime::kIsotropic, .dim = dim, .n_q = 8, .seed = options.seed};
      SyntheticKv speed_pool = GenerateSyntheticKv(gen, kPoolTiles * kTileTokens);
      if (dim == options.dims.front()) {
        ARGUS_ASSIGN_OR_RETURN(auto rates, MeasureCodingRate(codec, speed_pool));
        entry["encode_gbps"] = rates.first;
        entry["decode_gbps"] = rates.second;
      }
      for (uint32_t n_q : options.groups) {
        ARGUS_ASSIGN_OR_RETURN(SpeedResult r, MeasureSpeed(codec, v_codec, speed_pool, n_q, min_bytes, options.reps));
        if (spec == "f16") f16_ns[{dim, n_q}] = r.ns_per_token;
        const double ratio = r.ns_per_token / f16_ns[{dim, n_q}];
        const double gbps = r.bytes_per_token / r.ns_per_token;
        // Float-equivalent work: n_q dot products and n_q axpys of length dim per token.
        const double gflops = 4.0 * n_q * dim / r.ns_per_token;
        speed.push_back({{"dim", dim},
                         {"gqa", n_q},
                         {"ns_per_token", r.ns_per_token},
                         {"time_ratio_to_f16", ratio},
                         {"speedup_vs_f16", 1.0 / ratio},
                         {"bytes_per_token", r.bytes_per_token},
                         {"context_tokens", r.context_tokens},
                         {"read_gbps", gbps},
                         {"bandwidth_fraction", gbps / probe.read_gbps_one_thread},
                         {"fma_fraction", gflops / probe.fma_gflops_one_thread},
                         // Near the probe's bandwidth, bytes bound the time; below it, the
                         // kernel's arithmetic (or decode work) does.
                         {"bound", gbps >= 0.7 * probe.read_gbps_one_thread ? "bandwidth" : "arithmetic"}});
      }
      for (KeyRegime regime : {KeyRegime::kIsotropic, KeyRegime::kModerateOutliers, KeyRegime::kHeavyOutliers}) {
        SyntheticKvOptions qgen{.regime = regime, .dim = dim, .n_q = 4, .seed = options.seed};
        SyntheticKv kv = GenerateSyntheticKv(qgen, options.quality_tokens);
        ARGUS_ASSIGN_OR_RETURN(CodecQuality q, MeasureQuality(codec, v_codec, kv, kTileTokens));
        quality.push_back({{"dim", dim},
                           {"regime", std::string(KeyRegimeName(regime))},
                           {"k_rel_rmse", q.k_rel_rmse},
                           {"v_rel_rmse", q.v_rel_rmse},
                           {"logit_max_abs", q.logit_max_abs},
                           {"logit_rms", q.logit_rms},
                           {"out_rel_err", q.out_rel_err},
                           {"kl", q.kl}});
      }
    }
    entry["speed"] = speed;
    entry["quality"] = quality;
    codecs.push_back(entry);
  }
  report["codecs"] = codecs;
  report["targets"] = EvaluateTargets(report);
  return report;
}

}  // namespace argus::cli
