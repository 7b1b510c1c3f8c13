// `argus-bench capacity`: a long context far beyond RAM (Llama-3-8B geometry, 256K tokens,
// 32 GiB of exact f16 KV) under a small RAM budget with the rest on disk, decoded through the
// placement engine; beside it, a 32K context held entirely in RAM. Every layer holds the same
// synthetic data (a pool of tokens repeated, with one needle), so the exact attention is computed
// in double precision from the pool with multiplicities, at any length.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "argus/core.h"
#include "argus/eval.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "cache/placement_access.h"
#include "core/measure.h"
#include "core/progress.h"
#include "eval/rate_distortion.h"

namespace argus::cli {
namespace {

constexpr uint32_t kPoolTokens = 4096;

// The context: pool row p % kPoolTokens at position p, except the needle.
struct CapacityData {
  SyntheticContext pool;  // rows rounded to f16 values
  uint32_t needle_pos = 0;
  std::vector<float> needle_k, needle_v;  // [n_kv_heads, head_dim]
  const CacheGeometry& g() const { return pool.model.geometry; }
  size_t row() const { return size_t{g().n_kv_heads} * g().head_dim; }
  // Rows [first, first + n) into k, v.
  void Rows(uint32_t first, uint32_t n, std::vector<float>& k, std::vector<float>& v) const {
    k.resize(n * row());
    v.resize(n * row());
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t p = first + i;
      const float* ks = p == needle_pos ? needle_k.data() : &pool.k[(p % kPoolTokens) * row()];
      const float* vs = p == needle_pos ? needle_v.data() : &pool.v[(p % kPoolTokens) * row()];
      std::copy_n(ks, row(), &k[i * row()]);
      std::copy_n(vs, row(), &v[i * row()]);
    }
  }
};

CapacityData MakeData(const ModelGeometry& model, uint32_t needle_pos, ThreadPool& pool) {
  CapacityData d;
  d.pool = MakeSyntheticContext(model, KeyRegime::kModerateOutliers, 7, kPoolTokens, pool);
  for (float& x : d.pool.k) x = HalfToFloat(FloatToHalf(x));
  for (float& x : d.pool.v) x = HalfToFloat(FloatToHalf(x));
  d.needle_pos = needle_pos;
  d.needle_k.resize(d.row());
  d.needle_v.resize(d.row());
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(state >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  // A distinctive key and value per KV head: 3x the typical norm in a random direction.
  for (size_t i = 0; i < d.row(); ++i) {
    d.needle_k[i] = HalfToFloat(FloatToHalf(3.0f * std::sqrt(3.0f) * uniform()));
    d.needle_v[i] = HalfToFloat(FloatToHalf(3.0f * std::sqrt(3.0f) * uniform()));
  }
  return d;
}

// The query of a step: the pool's query, aimed at the needle on needle steps (its score after
// 1/sqrt(d) raised to `focus`).
std::vector<float> StepQuery(const CapacityData& d, bool seek_needle, float focus) {
  const CacheGeometry& g = d.g();
  std::vector<float> q = d.pool.q;
  if (!seek_needle) return q;
  const uint32_t dim = g.head_dim;
  for (uint32_t h = 0; h < g.n_q_heads; ++h) {
    const float* k = &d.needle_k[size_t{h / g.gqa()} * dim];
    float* qh = &q[size_t{h} * dim];
    double dot = 0, norm2 = 0;
    for (uint32_t i = 0; i < dim; ++i) {
      dot += double{qh[i]} * k[i];
      norm2 += double{k[i]} * k[i];
    }
    const double add = (focus * std::sqrt(static_cast<double>(dim)) - dot) / norm2;
    for (uint32_t i = 0; i < dim; ++i) qh[i] += static_cast<float>(add * k[i]);
  }
  return q;
}

// Exact attention in double over a context of `len` positions (every layer alike). With `mass`,
// also the weight each pool row draws over all its positions, [n_q_heads, kPoolTokens].
std::vector<double> ExactAttention(const CapacityData& d, const std::vector<float>& q, uint32_t len,
                                   std::vector<double>* mass = nullptr) {
  const CacheGeometry& g = d.g();
  const uint32_t dim = g.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> out(size_t{g.n_q_heads} * dim, 0.0);
  std::vector<double> count(kPoolTokens, 0.0);
  for (uint32_t t = 0; t < kPoolTokens; ++t) {
    count[t] = t < len ? (len - 1 - t) / kPoolTokens + 1 : 0;
  }
  const bool has_needle = d.needle_pos < len;
  if (has_needle) count[d.needle_pos % kPoolTokens] -= 1;
  if (mass) mass->resize(size_t{g.n_q_heads} * kPoolTokens);
  for (uint32_t h = 0; h < g.n_q_heads; ++h) {
    const uint32_t kv = h / g.gqa();
    const float* qh = &q[size_t{h} * dim];
    auto score = [&](const float* k) {
      double s = 0;
      for (uint32_t i = 0; i < dim; ++i) s += double{qh[i]} * k[i];
      return s * scale;
    };
    std::vector<double> s(kPoolTokens);
    double m = -1e300;
    for (uint32_t t = 0; t < kPoolTokens; ++t) {
      s[t] = score(&d.pool.k[(size_t{t} * g.n_kv_heads + kv) * dim]);
      if (count[t] > 0) m = std::max(m, s[t]);
    }
    const double sn = has_needle ? score(&d.needle_k[size_t{kv} * dim]) : -1e300;
    m = std::max(m, sn);
    double l = 0;
    double* o = &out[size_t{h} * dim];
    auto add = [&](double w, const float* v) {
      l += w;
      for (uint32_t i = 0; i < dim; ++i) o[i] += w * v[i];
    };
    for (uint32_t t = 0; t < kPoolTokens; ++t) {
      if (count[t] > 0)
        add(count[t] * std::exp(s[t] - m), &d.pool.v[(size_t{t} * g.n_kv_heads + kv) * dim]);
    }
    if (has_needle) add(std::exp(sn - m), &d.needle_v[size_t{kv} * dim]);
    for (uint32_t i = 0; i < dim; ++i) o[i] /= l;
    if (mass) {
      for (uint32_t t = 0; t < kPoolTokens; ++t) {
        (*mass)[size_t{h} * kPoolTokens + t] = count[t] > 0 ? count[t] * std::exp(s[t] - m) / l : 0;
      }
    }
  }
  return out;
}

// The rate-distortion bound's attention error over the run's steps: every pool key and value
// through the bound's test channel (the needle kept exact), keys at bits + split and values at
// bits - split a value, the least error over the splits. Two ways to spend the bits: the same on
// every token (water-filled over the channels), as a codec of uniform rate would; or where they
// count, each value weighted by its first-order effect on the outputs summed over the steps (a
// value: the squared attention weight of its row; a key channel: that times |v - out|^2 q_c^2 /
// head_dim), as a codec that knew the run's attention in advance would. The pool's repetition
// stands in for a context of distinct tokens, so the channel codes the pool once.
class RateDistortionBound {
 public:
  RateDistortionBound(const CapacityData& d, const CapacityBenchOptions& o, uint32_t tokens,
                      ThreadPool& pool)
      : d_(d),
        pool_(pool),
        tokens_(tokens),
        k_columns_(d.pool.k, d.row()),
        v_columns_(d.pool.v, d.row()) {
    const CacheGeometry& g = d.g();
    const uint32_t dim = g.head_dim;
    std::vector<double> k_weight(d.pool.k.size(), 0.0), v_weight(d.pool.v.size(), 0.0);
    for (uint32_t step = 0; step < o.steps; ++step) {
      queries_.push_back(StepQuery(d, (step + 1) % o.needle_period == 0, o.focus));
      std::vector<double> mass;
      exact_.push_back(ExactAttention(d, queries_.back(), Length(step), &mass));
      const std::vector<double>& out = exact_.back();
      for (uint32_t h = 0; h < g.n_q_heads; ++h) {
        const float* q = &queries_.back()[size_t{h} * dim];
        const double* oh = &out[size_t{h} * dim];
        for (uint32_t t = 0; t < kPoolTokens; ++t) {
          const size_t at = (size_t{t} * g.n_kv_heads + h / g.gqa()) * dim;
          const double m2 = mass[size_t{h} * kPoolTokens + t] * mass[size_t{h} * kPoolTokens + t];
          double spread = 0;
          for (uint32_t i = 0; i < dim; ++i)
            spread += (d.pool.v[at + i] - oh[i]) * (d.pool.v[at + i] - oh[i]);
          for (uint32_t i = 0; i < dim; ++i) {
            v_weight[at + i] += m2;
            k_weight[at + i] += m2 * spread * q[i] * q[i] / dim;
          }
        }
      }
    }
    const size_t n = d.pool.k.size();
    uniform_ = {ReverseWaterFilling(k_columns_.variance, n),
                ReverseWaterFilling(v_columns_.variance, n)};
    by_attention_ = {ReverseWaterFilling(k_columns_.variance, n, std::move(k_weight)),
                     ReverseWaterFilling(v_columns_.variance, n, std::move(v_weight))};
  }

  RateDistortionPoint At(double bits_per_value) const {
    return {bits_per_value, Least(bits_per_value, *uniform_),
            Least(bits_per_value, *by_attention_)};
  }

 private:
  struct Filling {
    ReverseWaterFilling k, v;
  };
  static constexpr double kSplits[] = {-1.0, -0.5, 0.0, 0.5, 1.0};

  // The context at a step: the long run's tokens and the ones decoded so far.
  uint32_t Length(size_t step) const { return tokens_ + static_cast<uint32_t>(step) + 1; }

  double Least(double bits_per_value, const Filling& filling) const {
    std::vector<double> splits;
    for (double split : kSplits) {
      if (std::abs(split) <= bits_per_value) splits.push_back(split);
    }
    std::vector<double> errors(splits.size());
    pool_.ParallelFor(splits.size(), 1, [&](size_t, size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        errors[i] = Error(filling.k.Distortions(bits_per_value + splits[i]),
                          filling.v.Distortions(bits_per_value - splits[i]));
      }
    });
    return *std::min_element(errors.begin(), errors.end());
  }

  double Error(const std::vector<double>& k_distortion,
               const std::vector<double>& v_distortion) const {
    CapacityData coded = d_;
    ApplyRateDistortionChannel(coded.pool.k, k_columns_, k_distortion, 1);
    ApplyRateDistortionChannel(coded.pool.v, v_columns_, v_distortion, 2);
    double sum = 0;
    for (size_t step = 0; step < queries_.size(); ++step) {
      const std::vector<double> ideal = ExactAttention(coded, queries_[step], Length(step));
      const std::vector<float> out(ideal.begin(), ideal.end());
      sum += RelativeL2Error(std::span<const float>(out), std::span<const double>(exact_[step]));
    }
    return sum / static_cast<double>(queries_.size());
  }

  const CapacityData& d_;
  ThreadPool& pool_;
  uint32_t tokens_;
  ColumnStatistics k_columns_, v_columns_;
  std::optional<Filling> uniform_, by_attention_;
  std::vector<std::vector<float>> queries_;
  std::vector<std::vector<double>> exact_;
};

// Fills `tokens` positions through `append` (a page of every layer at a time), then decodes
// `steps` steps through `decode` and `end_step`, measuring against the exact attention.
template <typename Append, typename Decode, typename EndStep, typename DiskBytes>
Result<CapacityRun> FillAndDecode(const CapacityData& d, KvCache& cache, SeqId seq,
                                  const CapacityBenchOptions& o, uint32_t tokens,
                                  std::string_view who, Append append, Decode decode,
                                  EndStep end_step, DiskBytes disk_bytes) {
  const CacheGeometry& g = d.g();
  CapacityRun f;
  Progress progress(fmt::format("bench capacity: filling {} tokens ({})", tokens, who));
  auto start = Clock::now();
  std::vector<float> k, v;
  for (uint32_t first = 0; first < tokens; first += o.page_tokens) {
    const uint32_t n = std::min(o.page_tokens, tokens - first);
    d.Rows(first, n, k, v);
    for (uint32_t layer = 0; layer < g.n_layers; ++layer)
      ARGUS_RETURN_IF_ERROR(append(layer, k, v));
    progress.Update(first + n, tokens);
  }
  f.fill_seconds = Seconds(start);
  progress.Done(f.fill_seconds);
  std::vector<float> out(size_t{g.n_q_heads} * g.head_dim);
  const uint64_t disk_before = disk_bytes();
  double seconds = 0, error_sum = 0;
  for (uint32_t step = 0; step < o.steps; ++step) {
    const bool seek = (step + 1) % o.needle_period == 0;
    const std::vector<float> q = StepQuery(d, seek, o.focus);
    const uint32_t len = tokens + step + 1;
    const std::vector<double> exact = ExactAttention(d, q, len);
    d.Rows(len - 1, 1, k, v);
    bool found = true;
    start = Clock::now();
    for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
      ARGUS_RETURN_IF_ERROR(append(layer, k, v));
      ARGUS_RETURN_IF_ERROR(decode(layer, q.data(), out.data()));
      const auto pause = Clock::now();
      const double e = RelativeL2Error(std::span<const float>(out), std::span<const double>(exact));
      f.max_rel_error = std::max(f.max_rel_error, e);
      error_sum += e;
      if (seek) {
        ARGUS_ASSIGN_OR_RETURN(std::vector<PageView> pages, cache.Pages(seq, layer));
        const PageTable& t = PageTableOf(cache);
        PageId best = pages[0].id;
        for (const PageView& view : pages) {
          if (t.mass[view.id] > t.mass[best]) best = view.id;
        }
        found = found && d.needle_pos >= t.first_token[best] &&
                d.needle_pos < t.first_token[best] + t.n_tokens[best];
      }
      start += Clock::now() - pause;  // the measurement is not the decode's time
    }
    ARGUS_RETURN_IF_ERROR(end_step());
    seconds += Seconds(start);
    if (seek) {
      ++f.needle_steps;
      f.needle_found += found ? 1 : 0;
    }
    fmt::print(stderr, "bench capacity: {} step {}: {:.3f} s\n", who, step, Seconds(start));
  }
  f.seconds_per_token = seconds / o.steps;
  f.disk_bytes_per_token = static_cast<double>(disk_bytes() - disk_before) / o.steps;
  f.mean_rel_error = error_sum / (static_cast<double>(o.steps) * g.n_layers);
  return f;
}

}  // namespace

void to_json(nlohmann::json& j, const RateDistortionPoint& p) {
  j = {{"bits_per_value", p.bits_per_value},
       {"uniform_rel_error", p.uniform_rel_error},
       {"by_attention_rel_error", p.by_attention_rel_error}};
}

void to_json(nlohmann::json& j, const CapacityRun& r) {
  j = {{"exact_bytes", r.exact_bytes},
       {"seconds_per_token", r.seconds_per_token},
       {"disk_bytes_per_token", r.disk_bytes_per_token},
       {"max_rel_error", r.max_rel_error},
       {"mean_rel_error", r.mean_rel_error},
       {"needle_steps", r.needle_steps},
       {"needle_found", r.needle_found},
       {"fill_seconds", r.fill_seconds}};
  if (const auto& s = r.placement) {
    j["pages_per_state"] = s->pages_per_state;
    j["state_names"] = s->state_names;
    j["n_disk_pages_allowed"] = s->n_disk_pages_allowed;
    j["step_seconds"] = s->step_seconds;
    j["effective_bits_per_value"] = s->effective_bits_per_value;
    j["ram_used_bytes"] = s->ram_used_bytes;
    j["disk_used_bytes"] = s->disk_used_bytes;
    j["promotions"] = s->n_promotions;
    j["demotions"] = s->n_demotions;
    j["master_bytes_written"] = s->master_bytes_written;
  }
  if (r.rate_distortion) j["rate_distortion"] = *r.rate_distortion;
}

void to_json(nlohmann::json& j, const CapacityReport& r) {
  const CapacityReport::Config& c = r.config;
  j = {{"config",
        {{"model", c.model},
         {"layers", c.layers},
         {"tokens", c.tokens},
         {"ram_budget_bytes", c.ram_budget_bytes},
         {"profile", c.profile},
         {"disk_time_share", c.disk_time_share},
         {"steps", c.steps},
         {"needle_depth", c.needle_depth},
         {"page_tokens", c.page_tokens},
         {"reference_tokens", c.reference_tokens},
         {"threads", c.threads}}},
       {"long", r.long_run},
       {"ram", r.ram},
       {"time_ratio", r.time_ratio()}};
  for (const RateDistortionPoint& p : r.rate_distortion) j["rate_distortion"].push_back(p);
}

Result<CapacityReport> RunCapacityBench(const CapacityBenchOptions& o) {
  ARGUS_ASSIGN_OR_RETURN(ModelGeometry model, FindModel(o.model));
  if (o.layers > 0) model.geometry.n_layers = o.layers;
  const CacheGeometry& g = model.geometry;
  ThreadPool pool(o.threads);
  ARGUS_ASSIGN_OR_RETURN(Profile profile, Profile::Load(o.profile));
  const auto needle = static_cast<uint32_t>(o.needle_depth * (o.tokens - 1));
  const CapacityData data = MakeData(model, needle, pool);
  CapacityReport report;
  report.config = {.model = o.model,
                   .layers = g.n_layers,
                   .tokens = o.tokens,
                   .ram_budget_bytes = o.ram_budget_bytes,
                   .profile = profile.name,
                   .disk_time_share = o.disk_time_share,
                   .steps = o.steps,
                   .needle_depth = o.needle_depth,
                   .page_tokens = o.page_tokens,
                   .reference_tokens = o.reference_tokens,
                   .threads = pool.n_threads()};

  // The long context through the engine.
  {
    std::filesystem::remove_all(o.dir + "/argus-bench-capacity");
    DiskTierOptions d;
    d.dir = o.dir + "/argus-bench-capacity";
    CacheOptions co;
    co.geometry = g;
    co.page_tokens = o.page_tokens;
    ARGUS_ASSIGN_OR_RETURN(size_t exact, KvCache::RequiredRamBytes(co, o.tokens + o.steps));
    d.disk_budget_bytes = exact + exact / 4;
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> disk, DiskTier::Open(d));
    co.disk = disk.get();
    if (o.ram_fraction > 0) {
      report.config.ram_budget_bytes =
          static_cast<size_t>(o.ram_fraction * static_cast<double>(exact));
    }
    co.ram_budget_bytes = report.config.ram_budget_bytes;
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(co));
    PlacementOptions po;
    po.profile = profile;
    po.disk_time_share = o.disk_time_share;
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<PlacementEngine> engine,
                           PlacementEngine::Create(*cache, pool, po));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, cache->CreateSequence());
    ARGUS_RETURN_IF_ERROR(engine->BeginRequest(seq, o.tokens + o.steps));
    ARGUS_ASSIGN_OR_RETURN(
        report.long_run, FillAndDecode(
                             data, *cache, seq, o, o.tokens, "engine",
                             [&](uint32_t layer, std::span<const float> k,
                                 std::span<const float> v) { return engine->Append(layer, k, v); },
                             [&](uint32_t layer, const float* q, float* out) {
                               return engine->Decode(layer, q, out).status();
                             },
                             [&] { return engine->EndStep(); },
                             [&] {
                               const PlacementStats s = engine->stats();
                               return s.attention_disk_bytes_read + s.promoted_bytes_read;
                             }));
    report.long_run.exact_bytes = exact;
    report.long_run.placement = engine->stats();
    engine.reset();
    cache.reset();
    disk.reset();
    std::filesystem::remove_all(o.dir + "/argus-bench-capacity");
  }
  // The short context all in RAM, plain.
  {
    CacheOptions co;
    co.geometry = g;
    co.page_tokens = o.page_tokens;
    ARGUS_ASSIGN_OR_RETURN(co.ram_budget_bytes,
                           KvCache::RequiredRamBytes(co, o.reference_tokens + o.steps));
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(co));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, cache->CreateSequence());
    AttentionEngine attention(pool);
    CapacityData short_data = data;
    short_data.needle_pos = static_cast<uint32_t>(o.needle_depth * (o.reference_tokens - 1));
    ARGUS_ASSIGN_OR_RETURN(
        report.ram, FillAndDecode(
                        short_data, *cache, seq, o, o.reference_tokens, "all in RAM",
                        [&](uint32_t layer, std::span<const float> k, std::span<const float> v) {
                          return cache->Append(seq, layer, k, v);
                        },
                        [&](uint32_t layer, const float* q, float* out) {
                          return attention.Decode(*cache, seq, layer, q, out).status();
                        },
                        [] { return Status::Ok(); }, [] { return uint64_t{0}; }));
    report.ram.exact_bytes = co.ram_budget_bytes;
  }
  // The bound at the long run's bits per value in RAM, and over whole bits.
  Progress progress("bench capacity: the rate-distortion bound");
  const auto start = Clock::now();
  const RateDistortionBound bound(data, o, o.tokens, pool);
  report.long_run.rate_distortion = bound.At(report.long_run.placement->effective_bits_per_value);
  constexpr int kMaxBits = 8;
  for (int bits = 1; bits <= kMaxBits; ++bits) {
    report.rate_distortion.push_back(bound.At(bits));
    progress.Update(bits, kMaxBits);
  }
  progress.Done(Seconds(start));
  return report;
}

void PrintCapacityBench(const CapacityReport& r) {
  const CapacityReport::Config& c = r.config;
  fmt::print("\n{} geometry, {} layers; profile {}, RAM budget {:.2f} GiB\n", c.model, c.layers,
             c.profile, static_cast<double>(c.ram_budget_bytes) / (1 << 30));
  fmt::print("{:>24} {:>10} {:>10} {:>12} {:>10} {:>10} {:>8}\n", "", "KV GiB", "s/token",
             "disk MB/tok", "max err", "mean err", "needle");
  auto row = [&](const char* name, const CapacityRun& f, uint32_t tokens) {
    fmt::print("{:>16} {:>7} {:>10.2f} {:>10.3f} {:>12.1f} {:>10.2e} {:>10.2e} {:>4}/{:<3}\n", name,
               tokens, static_cast<double>(f.exact_bytes) / (1 << 30), f.seconds_per_token,
               f.disk_bytes_per_token / 1e6, f.max_rel_error, f.mean_rel_error, f.needle_found,
               f.needle_steps);
  };
  row("engine, tokens", r.long_run, c.tokens);
  row("all in RAM, tokens", r.ram, c.reference_tokens);
  fmt::print("time per token, long vs all in RAM: x{:.2f}\n", r.time_ratio());
  if (const auto& bound = r.long_run.rate_distortion) {
    fmt::print(
        "rate-distortion bound at the engine's {:.2f} bits a value in RAM: mean error {:.2e} with "
        "the same rate on every token, {:.2e} with the bits where attention falls\n",
        bound->bits_per_value, bound->uniform_rel_error, bound->by_attention_rel_error);
  }
  fmt::print("\n");
}

}  // namespace argus::cli
