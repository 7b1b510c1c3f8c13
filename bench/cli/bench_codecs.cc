// argus-bench codecs: every codec side by side with f16 in one run. Speed over a context whose
// encoded bytes exceed the last-level cache (so every byte comes from memory), quality against
// double precision on the synthetic KV generator's three key regimes and, with --kv-dir, on real
// activations dumped by `argus eval --dump-kv`.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "argus/codec.h"
#include "argus/core.h"
#include "argus/eval.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "cli/commands.h"
#include "core/buffer.h"
#include "core/measure.h"
#include "core/probe.h"
#include "eval/kv_dump.h"

namespace argus::cli {
namespace {

constexpr uint32_t kTileTokens = 256;
constexpr uint32_t kPoolTiles = 16;  // distinct tiles; the context repeats them

// Variants measured beside every registered codec: per-channel grouping, centring and rotation.
const char* const kVariants[] = {"int8:channel", "int4:channel",     "int2:channel",
                                 "q4_0+center",  "q4_0+rot",         "int4+rot",
                                 "int2+rot",     "int2:channel+rot", "q4_0+rot+center"};

// A context of repeated pool tiles, K then V back to back as a page store holds them, larger
// than `min_bytes` so that every pass reads from memory, not from the cache.
class TimedContext {
 public:
  static Result<TimedContext> Build(const Codec& k_codec, const Codec& v_codec,
                                    const SyntheticKv& pool, size_t min_bytes) {
    TimedContext c(k_codec, v_codec, pool);
    ARGUS_ASSIGN_OR_RETURN(c.k_bytes_, k_codec.encoded_size(c.shape_));
    ARGUS_ASSIGN_OR_RETURN(c.v_bytes_, v_codec.encoded_size(c.shape_));
    c.has_v_ = v_codec.info().role != CodecRole::kKeys;
    c.pair_bytes_ = c.k_bytes_ + (c.has_v_ ? c.v_bytes_ : 0);
    c.n_tiles_ = std::max<size_t>(kPoolTiles, (min_bytes + c.pair_bytes_ - 1) / c.pair_bytes_);
    ARGUS_ASSIGN_OR_RETURN(c.bytes_, AlignedBuffer::Allocate(c.n_tiles_ * c.pair_bytes_));
    const size_t tile_values = c.shape_.n_values();
    for (size_t i = 0; i < kPoolTiles; ++i) {
      std::byte* dst = c.bytes_.data() + i * c.pair_bytes_;
      ARGUS_RETURN_IF_ERROR(
          k_codec.encode(pool.k.data() + i * tile_values, c.shape_, {dst, c.k_bytes_}));
      if (c.has_v_) {
        ARGUS_RETURN_IF_ERROR(v_codec.encode(pool.v.data() + i * tile_values, c.shape_,
                                             {dst + c.k_bytes_, c.v_bytes_}));
      }
    }
    for (size_t i = kPoolTiles; i < c.n_tiles_; ++i) {
      std::memcpy(c.bytes_.data() + i * c.pair_bytes_,
                  c.bytes_.data() + (i % kPoolTiles) * c.pair_bytes_, c.pair_bytes_);
    }
    return c;
  }

  // Seconds of one pass of scores + accumulate over the whole context, n_q query heads.
  Result<double> Pass(uint32_t n_q) {
    const uint32_t d = shape_.dim;
    q_.assign(pool_->q.begin(), pool_->q.begin() + size_t{n_q} * d);
    s_.resize(size_t{n_q} * kTileTokens);
    acc_.assign(size_t{n_q} * d, 0.0f);
    p_.assign(size_t{n_q} * kTileTokens, 1.0f / static_cast<float>(tokens()));
    auto start = Clock::now();
    for (size_t i = 0; i < n_tiles_; ++i) {
      const std::byte* tile = bytes_.data() + i * pair_bytes_;
      ARGUS_RETURN_IF_ERROR(k_codec_->scores({tile, k_bytes_}, shape_, q_.data(), n_q, s_.data()));
      if (has_v_) {
        ARGUS_RETURN_IF_ERROR(
            v_codec_->accumulate({tile + k_bytes_, v_bytes_}, shape_, p_.data(), n_q, acc_.data()));
      }
    }
    return Seconds(start);
  }

  size_t tokens() const { return n_tiles_ * kTileTokens; }
  double bytes_per_token() const { return static_cast<double>(pair_bytes_) / kTileTokens; }

 private:
  TimedContext(const Codec& k, const Codec& v, const SyntheticKv& pool)
      : k_codec_(&k), v_codec_(&v), pool_(&pool), shape_{kTileTokens, pool.dim} {}

  const Codec* k_codec_;
  const Codec* v_codec_;
  const SyntheticKv* pool_;
  TileShape shape_;
  size_t k_bytes_ = 0, v_bytes_ = 0, pair_bytes_ = 0, n_tiles_ = 0;
  bool has_v_ = false;
  AlignedBuffer bytes_;
  std::vector<float> q_, s_, acc_, p_;
};

// Best-of-`reps` seconds per pass of `codec` and of `reference`, passes interleaved so that both
// see the same machine (these machines are noisy; a drift between two runs is not a ratio).
Result<std::pair<double, double>> TimeSideBySide(TimedContext& codec, TimedContext* reference,
                                                 uint32_t n_q, int reps) {
  double best = 1e30, best_reference = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (reference != nullptr) {
      ARGUS_ASSIGN_OR_RETURN(double t, reference->Pass(n_q));
      best_reference = std::min(best_reference, t);
    }
    ARGUS_ASSIGN_OR_RETURN(double t, codec.Pass(n_q));
    best = std::min(best, t);
  }
  return std::make_pair(best, reference != nullptr ? best_reference : best);
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
      ARGUS_RETURN_IF_ERROR(
          codec.encode(pool.k.data() + size_t{i} * shape.n_values(), shape, tile));
    }
    best_encode = std::min(best_encode, Seconds(start));
    start = Clock::now();
    for (uint32_t i = 0; i < kPoolTiles; ++i)
      ARGUS_RETURN_IF_ERROR(codec.decode(tile, shape, out.data()));
    best_decode = std::min(best_decode, Seconds(start));
  }
  const double bytes = 4.0 * static_cast<double>(shape.n_values()) * kPoolTiles;
  return std::make_pair(bytes / best_encode / 1e9, bytes / best_decode / 1e9);
}

// The figures of a quality row, by name.
constexpr std::pair<const char*, double CodecQuality::*> kQualityFields[] = {
    {"k_rel_rmse", &CodecQuality::k_rel_rmse},       {"v_rel_rmse", &CodecQuality::v_rel_rmse},
    {"logit_max_abs", &CodecQuality::logit_max_abs}, {"logit_rms", &CodecQuality::logit_rms},
    {"out_rel_err", &CodecQuality::out_rel_err},     {"kl", &CodecQuality::kl}};

nlohmann::json QualityFields(const CodecQuality& q) {
  nlohmann::json fields;
  for (const auto& [name, field] : kQualityFields) fields[name] = q.*field;
  return fields;
}

// Every (layer, KV head) group of a dump as MeasureQuality takes it: the head's keys and values,
// and the queries of the group's query heads at the last token.
std::vector<SyntheticKv> DumpGroups(const KvDump& dump) {
  const CacheGeometry& g = dump.model.geometry;
  const uint32_t d = g.head_dim, gqa = g.gqa(), n = dump.n_tokens;
  std::vector<SyntheticKv> groups;
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      SyntheticKv kv{.tokens = n, .dim = d, .n_q = gqa};
      kv.k.resize(size_t{n} * d);
      kv.v.resize(size_t{n} * d);
      for (uint32_t t = 0; t < n; ++t) {
        const size_t from = (size_t{t} * g.n_kv_heads + h) * d;
        std::copy_n(dump.k[layer].data() + from, d, kv.k.data() + size_t{t} * d);
        std::copy_n(dump.v[layer].data() + from, d, kv.v.data() + size_t{t} * d);
      }
      // Query head i belongs to KV head i / gqa.
      const float* q = dump.q.data() + (size_t{layer} * g.n_q_heads + size_t{h} * gqa) * d;
      kv.q.assign(q, q + size_t{gqa} * d);
      groups.push_back(std::move(kv));
    }
  }
  return groups;
}

// Quality over a dump's groups, in tiles as the synthetic regimes use (at most the dump's
// tokens): each figure's mean over the groups, and its max under "max". A codec that cannot hold
// the dump's shape (Unsupported) gives a row with the reason under "skipped".
Result<CodecQualityRow> MeasureDumpQuality(const Codec& k_codec, const Codec& v_codec,
                                           const KvDump& dump,
                                           const std::vector<SyntheticKv>& groups) {
  const uint32_t tile_tokens = std::min(kTileTokens, dump.n_tokens);
  CodecQuality mean, max;
  for (const SyntheticKv& group : groups) {
    auto measured = MeasureQuality(k_codec, v_codec, group, tile_tokens);
    if (!measured.ok() && measured.status().code() == StatusCode::kUnsupported) {
      return CodecQualityRow{
          .dim = group.dim, .regime = dump.model.name, .skipped = measured.status().ToString()};
    }
    if (!measured.ok()) return measured.status().WithContext(dump.model.name);
    for (const auto& [name, field] : kQualityFields) {
      mean.*field += (*measured).*field / static_cast<double>(groups.size());
      max.*field = std::max(max.*field, (*measured).*field);
    }
  }
  return CodecQualityRow{.dim = dump.model.geometry.head_dim,
                         .regime = dump.model.name,
                         .quality = mean,
                         .max = max,
                         .n_groups = groups.size()};
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

const CodecSpeed* CodecFigures::FindSpeed(uint32_t dim, uint32_t gqa) const {
  for (const CodecSpeed& s : speed) {
    if (s.dim == dim && s.gqa == gqa) return &s;
  }
  return nullptr;
}

const CodecQualityRow* CodecFigures::FindQuality(std::string_view regime, uint32_t dim) const {
  for (const CodecQualityRow& q : quality) {
    if (q.regime == regime && q.dim == dim) return &q;
  }
  return nullptr;
}

const CodecFigures* CodecBenchReport::Find(std::string_view name) const {
  for (const CodecFigures& c : codecs) {
    if (c.codec == name) return &c;
  }
  return nullptr;
}

void to_json(nlohmann::json& j, const CodecQualityRow& row) {
  j = {{"dim", row.dim}, {"regime", row.regime}};
  if (!row.skipped.empty()) {
    j["skipped"] = row.skipped;
    return;
  }
  j.update(QualityFields(row.quality));
  if (row.max) {
    j["max"] = QualityFields(*row.max);
    j["n_groups"] = row.n_groups;
  }
}

void to_json(nlohmann::json& j, const CodecFigures& c) {
  nlohmann::json coding = nlohmann::json::array(), speed = nlohmann::json::array();
  for (const CodecCodingRate& r : c.coding) {
    coding.push_back(
        {{"dim", r.dim}, {"encode_gbps", r.encode_gbps}, {"decode_gbps", r.decode_gbps}});
  }
  for (const CodecSpeed& s : c.speed) {
    speed.push_back({{"dim", s.dim},
                     {"gqa", s.gqa},
                     {"ns_per_token", s.ns_per_token},
                     {"time_ratio_to_f16", s.time_ratio_to_f16},
                     {"speedup_vs_f16", s.speedup_vs_f16()},
                     {"bytes_per_token", s.bytes_per_token},
                     {"context_tokens", s.context_tokens},
                     {"read_gbps", s.read_gbps},
                     {"bandwidth_fraction", s.bandwidth_fraction},
                     {"fma_fraction", s.fma_fraction},
                     {"bound", s.bound}});
  }
  j = {{"codec", c.codec},
       {"bits_per_value", c.bits_per_value},
       {"kernel_path", c.kernel_path},
       {"lossless", c.lossless},
       {"values_codec", c.values_codec},
       {"coding", coding},
       {"speed", speed},
       {"quality", c.quality}};
}

void to_json(nlohmann::json& j, const CodecBenchReport& r) {
  const CodecBenchOptions& o = r.config;
  j = {{"machine",
        {{"read_gbps_one_thread", r.read_gbps_one_thread},
         {"fma_gflops_one_thread", r.fma_gflops_one_thread},
         {"last_level_cache_bytes", r.last_level_cache_bytes},
         {"cpu_features", r.cpu_features}}},
       {"config",
        {{"tile_tokens", r.tile_tokens},
         {"min_context_bytes", r.min_context_bytes},
         {"quality_tokens", o.quality_tokens},
         {"threads", 1},
         {"dims", o.dims},
         {"gqa", o.groups},
         {"seed", o.seed},
         {"quick", o.quick}}},
       {"codecs", r.codecs}};
  if (const auto& d = r.real_kv) {
    j["config"]["real_kv"] = {
        {"kv_dir", d->kv_dir},
        {"regime", d->regime},
        {"geometry", d->geometry},
        {"head_dim", d->head_dim},
        {"tokens", d->tokens},
        {"gqa", d->gqa},
        {"n_groups", d->n_groups},
        {"tile_tokens", d->tile_tokens},
        {"groups",
         "one per (layer, KV head): its keys and values, the queries of its query heads "
         "at the last token; figures are means over the groups, maxima under \"max\""},
        {"speed",
         "synthetic only: the time depends on the shape, not on the values (except for "
         "the lossless codec)"}};
  }
}

Result<CodecBenchReport> RunCodecBench(const CodecBenchOptions& options) {
  if (options.dims.empty() || options.groups.empty() || options.reps < 1 ||
      options.quality_tokens < 1) {
    return Status::InvalidArgument(
        "bench codecs: --dims, --gqa, --reps and --quality-tokens need values >= 1");
  }
  for (uint32_t n_q : options.groups) {
    if (n_q < 1 || n_q > kMaxGroupHeads) {
      return Status::InvalidArgument(
          fmt::format("bench codecs: GQA group {} is outside 1..{}", n_q, kMaxGroupHeads));
    }
  }
  for (uint32_t dim : options.dims) {
    if (dim < 1 || dim > kMaxTileDim) {
      return Status::InvalidArgument(
          fmt::format("bench codecs: head_dim {} is outside 1..{}", dim, kMaxTileDim));
    }
  }
  // The dump is read first: a bad one fails before the minutes of measurement.
  std::optional<KvDump> dump;
  std::vector<SyntheticKv> dump_groups;
  if (!options.kv_dir.empty()) {
    auto read = ReadKvDump(options.kv_dir);
    if (!read.ok()) return read.status().WithContext("bench codecs");
    dump.emplace(std::move(read).value());
    dump_groups = DumpGroups(*dump);
  }
  ThreadPool probe_pool(1);
  fmt::print(stderr, "bench codecs: probing the machine...\n");
  ARGUS_ASSIGN_OR_RETURN(MachineProbe probe, ProbeMachine(probe_pool));
  const size_t min_bytes = options.quick ? LastLevelCacheBytes() / 2 : 2 * LastLevelCacheBytes();
  std::vector<std::string> specs = options.specs.empty() ? DefaultSpecs() : options.specs;
  // f16 runs first: every other codec's time is a ratio to it.
  std::erase(specs, "f16");
  specs.insert(specs.begin(), "f16");

  CodecBenchReport report{.read_gbps_one_thread = probe.read_gbps_one_thread,
                          .fma_gflops_one_thread = probe.fma_gflops_one_thread,
                          .last_level_cache_bytes = LastLevelCacheBytes(),
                          .cpu_features = GetCpuFeatures().ToString(),
                          .tile_tokens = kTileTokens,
                          .min_context_bytes = min_bytes,
                          .config = options};
  if (dump) {
    const CacheGeometry& g = dump->model.geometry;
    report.real_kv = RealKvConfig{.kv_dir = dump->dir,
                                  .regime = dump->model.name,
                                  .geometry = g.ToString(),
                                  .head_dim = g.head_dim,
                                  .tokens = dump->n_tokens,
                                  .gqa = g.gqa(),
                                  .tile_tokens = std::min(kTileTokens, dump->n_tokens),
                                  .n_groups = dump_groups.size()};
  }

  // The f16 reference contexts, one per head_dim, timed beside every codec.
  std::unique_ptr<Codec> f16 = std::move(CodecRegistry::Default().Create("f16")).value();
  const uint32_t pool_heads = *std::max_element(options.groups.begin(), options.groups.end());
  std::map<uint32_t, SyntheticKv> pools;
  std::map<uint32_t, TimedContext> references;
  for (uint32_t dim : options.dims) {
    SyntheticKvOptions gen{
        .regime = KeyRegime::kIsotropic, .dim = dim, .n_q = pool_heads, .seed = options.seed};
    pools.emplace(dim, GenerateSyntheticKv(gen, kPoolTiles * kTileTokens));
    ARGUS_ASSIGN_OR_RETURN(TimedContext reference,
                           TimedContext::Build(*f16, *f16, pools.at(dim), min_bytes));
    references.emplace(dim, std::move(reference));
  }

  for (const std::string& spec : specs) {
    auto created = CodecRegistry::Default().Create(spec);
    if (!created.ok()) return created.status().WithContext("bench codecs");
    const Codec& codec = **created;
    // Keys-only codecs are measured with f16 values.
    const Codec& v_codec = codec.info().role == CodecRole::kKeys ? *f16 : codec;
    CodecFigures& entry = report.codecs.emplace_back(
        CodecFigures{.codec = spec,
                     .bits_per_value = codec.info().bits_per_value,
                     .kernel_path = std::string(KernelPathName(codec.kernel_path())),
                     .lossless = codec.info().lossless,
                     .values_codec = v_codec.info().name});
    for (uint32_t dim : options.dims) {
      fmt::print(stderr, "bench codecs: {} at head_dim {}...\n", spec, dim);
      const SyntheticKv& pool = pools.at(dim);
      ARGUS_ASSIGN_OR_RETURN(auto rates, MeasureCodingRate(codec, pool));
      entry.coding.push_back(
          {.dim = dim, .encode_gbps = rates.first, .decode_gbps = rates.second});
      TimedContext& reference = references.at(dim);
      std::optional<TimedContext> own;
      if (spec != "f16") {
        ARGUS_ASSIGN_OR_RETURN(TimedContext built,
                               TimedContext::Build(codec, v_codec, pool, min_bytes));
        own.emplace(std::move(built));
      }
      for (uint32_t n_q : options.groups) {
        // f16 itself is the reference: its ratio is 1 by definition.
        ARGUS_ASSIGN_OR_RETURN(auto times,
                               own ? TimeSideBySide(*own, &reference, n_q, options.reps)
                                   : TimeSideBySide(reference, nullptr, n_q, options.reps));
        const TimedContext& measured = own ? *own : reference;
        const double ns_per_token = times.first * 1e9 / static_cast<double>(measured.tokens());
        const double ratio =
            (times.first / measured.tokens()) / (times.second / reference.tokens());
        const double gbps = measured.bytes_per_token() / ns_per_token;
        // Float-equivalent work: n_q dot products and n_q axpys of length dim per token.
        const double gflops = 4.0 * n_q * dim / ns_per_token;
        entry.speed.push_back(
            {.dim = dim,
             .gqa = n_q,
             .ns_per_token = ns_per_token,
             .time_ratio_to_f16 = ratio,
             .bytes_per_token = measured.bytes_per_token(),
             .context_tokens = measured.tokens(),
             .read_gbps = gbps,
             .bandwidth_fraction = gbps / probe.read_gbps_one_thread,
             .fma_fraction = gflops / probe.fma_gflops_one_thread,
             // Near the probe's bandwidth, bytes bound the time; below it, the
             // kernel's arithmetic (or decode work) does.
             .bound = gbps >= 0.7 * probe.read_gbps_one_thread ? "bandwidth" : "arithmetic"});
      }
      for (KeyRegime regime :
           {KeyRegime::kIsotropic, KeyRegime::kModerateOutliers, KeyRegime::kHeavyOutliers}) {
        SyntheticKvOptions qgen{.regime = regime, .dim = dim, .n_q = 4, .seed = options.seed};
        SyntheticKv kv = GenerateSyntheticKv(qgen, options.quality_tokens);
        ARGUS_ASSIGN_OR_RETURN(CodecQuality q, MeasureQuality(codec, v_codec, kv, kTileTokens));
        entry.quality.push_back(
            {.dim = dim, .regime = std::string(KeyRegimeName(regime)), .quality = q});
      }
    }
    if (dump) {
      fmt::print(stderr, "bench codecs: {} on {}...\n", spec, dump->model.name);
      ARGUS_ASSIGN_OR_RETURN(CodecQualityRow row,
                             MeasureDumpQuality(codec, v_codec, *dump, dump_groups));
      entry.quality.push_back(std::move(row));
    }
  }
  return report;
}

}  // namespace argus::cli
