// Synthetic decode traces and their file format (docs/traces.md). Every random value comes from
// splitmix64 streams and Box-Muller normals (never <random>'s distributions, whose outputs differ
// between standard libraries), so a seed gives the same trace, byte for byte, on every machine.
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "argus/codec.h"
#include "argus/core.h"
#include "argus/env.h"
#include "argus/eval.h"
#include "core/byte_codec.h"
#include "core/checked.h"
#include "core/splitmix.h"

namespace argus {
namespace {

static_assert(std::endian::native == std::endian::little,
              "trace files are little-endian and are written from memory as they are");

constexpr char kMagic[8] = {'A', 'R', 'G', 'U', 'S', 'T', 'R', 'C'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 112;
constexpr size_t kMaxTraceBytes = size_t{8} << 30;

// Scores (q.k / sqrt(head_dim), measured from the mean key) as fractions of `focus`.
constexpr double kSinkScore = 0.6, kRecentScore = 0.8;
constexpr double kHeadMixLow = 0.8;  // each head scales its sink and recent scores by [0.8, 1)
constexpr double kNoiseScore = 0.5;  // std of the score noise every key receives
constexpr double kNeedleNormRatio = 3.0;

// Salts separating the streams drawn for one (layer, kv_head).
enum : uint64_t { kKvSalt = 1, kNeedleSalt = 2, kQuerySalt = 3 };

uint64_t StreamSeed(uint64_t seed, uint64_t salt, uint32_t layer, uint32_t kv_head) {
  return SplitMix64Mix(SplitMix64At(seed, salt) ^ ((uint64_t{layer} << 32) | kv_head));
}

class Rng : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  uint64_t Below(uint64_t n) { return Next() % n; }  // the bias is far below anything measured
};

struct TraceSizes {
  size_t n_kv_values = 0;  // of k, and of v
  size_t n_q_values = 0;
  size_t n_bytes = 0;  // k, v, q and target together
};

Result<TraceSizes> SizesOf(const TraceOptions& o) {
  const CacheGeometry& g = o.geometry;
  const size_t n_tokens = size_t{o.n_prefix_tokens} + o.n_steps;
  TraceSizes s;
  ARGUS_ASSIGN_OR_RETURN(size_t row, CheckedMul(g.n_kv_heads, g.head_dim, "trace K/V row"));
  ARGUS_ASSIGN_OR_RETURN(size_t per_layer, CheckedMul(row, n_tokens, "trace K/V layer"));
  ARGUS_ASSIGN_OR_RETURN(s.n_kv_values, CheckedMul(per_layer, g.n_layers, "trace K/V"));
  ARGUS_ASSIGN_OR_RETURN(size_t q_row, CheckedMul(g.n_q_heads, g.head_dim, "trace query row"));
  ARGUS_ASSIGN_OR_RETURN(size_t q_step, CheckedMul(q_row, g.n_layers, "trace query step"));
  ARGUS_ASSIGN_OR_RETURN(s.n_q_values, CheckedMul(q_step, o.n_steps, "trace queries"));
  ARGUS_ASSIGN_OR_RETURN(size_t kv_bytes, CheckedMul(s.n_kv_values, 4, "trace K/V bytes"));
  ARGUS_ASSIGN_OR_RETURN(size_t q_bytes, CheckedMul(s.n_q_values, 4, "trace query bytes"));
  ARGUS_ASSIGN_OR_RETURN(size_t sum, CheckedAdd(kv_bytes, q_bytes, "trace bytes"));
  ARGUS_ASSIGN_OR_RETURN(s.n_bytes, CheckedAdd(sum, size_t{o.n_steps} * 8, "trace bytes"));
  return s;
}

// The first prefix position recall targets may take and how many follow it: the targets stay
// clear of the sinks and of every step's recent window.
uint32_t RecallSpan(const TraceOptions& o) {
  const uint64_t reserved = uint64_t{o.n_sinks} + o.recent_tokens;
  return reserved >= o.n_prefix_tokens ? 0 : o.n_prefix_tokens - static_cast<uint32_t>(reserved);
}

Status ValidateOptions(const TraceOptions& o) {
  if (static_cast<uint8_t>(o.kind) > static_cast<uint8_t>(TraceKind::kRecorded)) {
    return Status::InvalidArgument("trace: unknown kind " +
                                   std::to_string(static_cast<unsigned>(o.kind)));
  }
  if (Status s = o.geometry.Validate(); !s.ok()) {
    return Status::InvalidArgument("trace geometry: " + s.message());
  }
  if (o.n_prefix_tokens == 0) return Status::InvalidArgument("trace: n_prefix_tokens is 0");
  if (o.n_steps == 0) return Status::InvalidArgument("trace: n_steps is 0");
  if (uint64_t{o.n_prefix_tokens} + o.n_steps > UINT32_MAX) {
    return Status::InvalidArgument("trace: n_prefix_tokens + n_steps exceeds 2^32 - 1");
  }
  if (o.n_sinks >= o.n_prefix_tokens) {
    return Status::InvalidArgument("trace: n_sinks (" + std::to_string(o.n_sinks) +
                                   ") must be below n_prefix_tokens (" +
                                   std::to_string(o.n_prefix_tokens) + ")");
  }
  if (!(o.needle_depth >= 0 && o.needle_depth <= 1)) {
    return Status::InvalidArgument("trace: needle_depth " + std::to_string(o.needle_depth) +
                                   " is outside [0, 1]");
  }
  if (!(o.focus > 0) || !std::isfinite(o.focus)) {
    return Status::InvalidArgument("trace: focus " + std::to_string(o.focus) +
                                   " must be a positive finite score");
  }
  if (o.kind == TraceKind::kRecall) {
    if (o.n_recall_targets == 0) return Status::InvalidArgument("trace: n_recall_targets is 0");
    if (o.recall_period == 0) return Status::InvalidArgument("trace: recall_period is 0");
    if (RecallSpan(o) < o.n_recall_targets) {
      return Status::InvalidArgument(
          "trace: " + std::to_string(o.n_recall_targets) +
          " recall targets do not fit between the sinks and the recent window of a " +
          std::to_string(o.n_prefix_tokens) + "-token prefix (n_sinks " +
          std::to_string(o.n_sinks) + ", recent_tokens " + std::to_string(o.recent_tokens) + ")");
    }
  }
  if (o.kind == TraceKind::kNeedle && o.needle_period == 0) {
    return Status::InvalidArgument("trace: needle_period is 0");
  }
  ARGUS_ASSIGN_OR_RETURN(TraceSizes sizes, SizesOf(o));
  if (sizes.n_bytes > kMaxTraceBytes) {
    return Status::InvalidArgument("trace: " + std::to_string(sizes.n_bytes) +
                                   " bytes of K/V and queries exceed the 8 GiB limit (" +
                                   o.geometry.ToString() + ", " +
                                   std::to_string(o.n_prefix_tokens + uint64_t{o.n_steps}) +
                                   " tokens, " + std::to_string(o.n_steps) + " steps)");
  }
  return Status::Ok();
}

uint32_t NeedlePosition(const TraceOptions& o) {
  const double at = std::round(o.needle_depth * (o.n_prefix_tokens - 1));
  return std::clamp(static_cast<uint32_t>(at), o.n_sinks, o.n_prefix_tokens - 1);
}

// target[step], from valid options.
std::vector<int64_t> TargetSchedule(const TraceOptions& o) {
  std::vector<int64_t> target(o.n_steps, -1);
  if (o.kind == TraceKind::kRecall) {
    const uint64_t span = RecallSpan(o), n = o.n_recall_targets;
    for (uint32_t s = 0; s < o.n_steps; s += o.recall_period) {
      const uint64_t i = (s / o.recall_period) % n;
      target[s] = o.n_sinks + static_cast<int64_t>((2 * i + 1) * span / (2 * n));
    }
  } else if (o.kind == TraceKind::kNeedle) {
    for (uint64_t s = o.needle_period - 1; s < o.n_steps; s += o.needle_period) {
      target[s] = NeedlePosition(o);
    }
  }
  return target;
}

// Replaces a token's row [dim] by a random direction with kNeedleNormRatio times the RMS row
// norm of `rows` [n_tokens, dim].
void PlantNeedle(std::vector<float>& rows, uint32_t dim, uint32_t token, Rng& rng) {
  const size_t n_tokens = rows.size() / dim;
  double sum_sq = 0;
  for (float x : rows) sum_sq += double{x} * x;
  const double rms_norm = std::sqrt(sum_sq / static_cast<double>(n_tokens));
  std::vector<double> dir(dim);
  double norm_sq = 0;
  for (double& x : dir) {
    x = rng.Normal();
    norm_sq += x * x;
  }
  const double scale = kNeedleNormRatio * rms_norm / std::sqrt(norm_sq);
  for (uint32_t c = 0; c < dim; ++c) {
    rows[size_t{token} * dim + c] = static_cast<float>(dir[c] * scale);
  }
}

// Builds queries for one KV head's keys. Keys are whitened per channel (centred on the channel
// mean, divided by the channel's standard deviation); a query is the minimum-norm vector, in
// whitened coordinates, that gives each aimed key exactly its chosen score relative to the
// mean key, plus isotropic noise. Whitening keeps the few wide outlier channels and the channel
// means from dominating: aimed naively (q along k_j), a query would also score every key by
// its agreement with k_j on those channels.
class QueryBuilder {
 public:
  // keys: [n_tokens, dim], the f16-rounded values the trace stores.
  QueryBuilder(std::vector<float> keys, uint32_t dim) : keys_(std::move(keys)), dim_(dim) {
    const size_t n_tokens = keys_.size() / dim;
    mean_.assign(dim, 0);
    inv_sd_.assign(dim, 0);
    std::vector<double> sum_sq(dim, 0);
    for (size_t t = 0; t < n_tokens; ++t) {
      for (uint32_t c = 0; c < dim; ++c) {
        const double x = keys_[t * dim + c];
        mean_[c] += x;
        sum_sq[c] += x * x;
      }
    }
    for (uint32_t c = 0; c < dim; ++c) {
      mean_[c] /= static_cast<double>(n_tokens);
      const double var = sum_sq[c] / static_cast<double>(n_tokens) - mean_[c] * mean_[c];
      inv_sd_[c] = 1.0 / std::sqrt(std::max(var, 1e-6));
    }
  }

  struct Aim {
    uint32_t token;
    double score;
  };
  static constexpr size_t kMaxAims = 3;

  // Writes q [dim].
  void Build(std::span<const Aim> aims, Rng& rng, float* q) const {
    const size_t n = aims.size();
    std::vector<double> u(n * dim_);  // [n, dim]: whitened centred keys
    for (size_t a = 0; a < n; ++a) {
      for (uint32_t c = 0; c < dim_; ++c) {
        u[a * dim_ + c] = (keys_[size_t{aims[a].token} * dim_ + c] - mean_[c]) * inv_sd_[c];
      }
    }
    // Noise first, then the minimum-norm correction that gives every aimed key exactly its
    // score: solve (U U^T) w = scores * sqrt(dim) - U noise; the whitened query is noise +
    // U^T w. Noise on an aimed key would scale with that key's whitened norm, which for the
    // needle is several times the others'. A tiny ridge keeps two nearly equal keys from
    // making the system singular.
    std::vector<double> x(dim_);
    for (double& c : x) c = kNoiseScore * rng.Normal();
    double gram[kMaxAims][kMaxAims + 1] = {};
    double trace = 0;
    for (size_t a = 0; a < n; ++a) {
      double noise_dot = 0;
      for (uint32_t c = 0; c < dim_; ++c) noise_dot += u[a * dim_ + c] * x[c];
      for (size_t b = 0; b < n; ++b) {
        double dot = 0;
        for (uint32_t c = 0; c < dim_; ++c) dot += u[a * dim_ + c] * u[b * dim_ + c];
        gram[a][b] = dot;
      }
      gram[a][n] = aims[a].score * std::sqrt(static_cast<double>(dim_)) - noise_dot;
      trace += gram[a][a];
    }
    for (size_t a = 0; a < n; ++a) gram[a][a] += 1e-9 * trace;
    double w[kMaxAims] = {};
    SolveInPlace(gram, n, w);
    for (uint32_t c = 0; c < dim_; ++c) {
      for (size_t a = 0; a < n; ++a) x[c] += w[a] * u[a * dim_ + c];
      q[c] = static_cast<float>(x[c] * inv_sd_[c]);
    }
  }

 private:
  // Gaussian elimination with partial pivoting of the augmented system m [n, n + 1].
  static void SolveInPlace(double (&m)[kMaxAims][kMaxAims + 1], size_t n, double* x) {
    for (size_t col = 0; col < n; ++col) {
      size_t pivot = col;
      for (size_t r = col + 1; r < n; ++r) {
        if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
      }
      std::swap(m[col], m[pivot]);
      for (size_t r = col + 1; r < n; ++r) {
        const double f = m[r][col] / m[col][col];
        for (size_t c = col; c <= n; ++c) m[r][c] -= f * m[col][c];
      }
    }
    for (size_t r = n; r-- > 0;) {
      double sum = m[r][n];
      for (size_t c = r + 1; c < n; ++c) sum -= m[r][c] * x[c];
      x[r] = sum / m[r][r];
    }
  }

  std::vector<float> keys_;
  uint32_t dim_;
  std::vector<double> mean_, inv_sd_;
};

// Generates one (layer, kv_head): its K/V rows into the trace and its group's queries.
void GenerateHead(Trace& trace, uint32_t layer, uint32_t kv_head) {
  const TraceOptions& o = trace.options;
  const CacheGeometry& g = o.geometry;
  const uint32_t d = g.head_dim, gqa = g.gqa(), n_tokens = trace.n_tokens();

  SyntheticKvOptions kv_options;
  kv_options.regime = KeyRegime::kModerateOutliers;
  kv_options.dim = d;
  kv_options.n_q = gqa;
  kv_options.seed = StreamSeed(o.seed, kKvSalt, layer, kv_head);
  kv_options.sink = true;
  SyntheticKv kv = GenerateSyntheticKv(kv_options, n_tokens);
  if (o.kind == TraceKind::kNeedle) {
    Rng rng(StreamSeed(o.seed, kNeedleSalt, layer, kv_head));
    PlantNeedle(kv.k, d, NeedlePosition(o), rng);
    PlantNeedle(kv.v, d, NeedlePosition(o), rng);
  }

  // Store f16 and aim the queries at the rounded keys, so the scores hold for the stored data.
  for (uint32_t t = 0; t < n_tokens; ++t) {
    const size_t dst = ((size_t{layer} * n_tokens + t) * g.n_kv_heads + kv_head) * d;
    for (uint32_t c = 0; c < d; ++c) {
      const size_t src = size_t{t} * d + c;
      trace.k[dst + c] = FloatToHalf(kv.k[src]);
      trace.v[dst + c] = FloatToHalf(kv.v[src]);
      kv.k[src] = HalfToFloat(trace.k[dst + c]);
    }
  }
  const QueryBuilder builder(std::move(kv.k), d);

  Rng rng(StreamSeed(o.seed, kQuerySalt, layer, kv_head));
  QueryBuilder::Aim aims[QueryBuilder::kMaxAims];
  for (uint32_t s = 0; s < o.n_steps; ++s) {
    const uint32_t pos = o.n_prefix_tokens + s;
    const int64_t target = trace.target[s];
    for (uint32_t i = 0; i < gqa; ++i) {
      size_t n_aims = 0;
      if (o.n_sinks > 0) {
        const double mix = kHeadMixLow + (1 - kHeadMixLow) * rng.Uniform();
        aims[n_aims++] = {0, o.focus * kSinkScore * mix};
      }
      if (o.recent_tokens > 0) {
        // lo >= n_sinks >= 1 when a sink is aimed at, so the two never coincide; the target
        // lies in the prefix and pos is past it.
        const uint32_t lo =
            std::max<uint32_t>(o.n_sinks, pos + 1 - std::min<uint32_t>(o.recent_tokens, pos + 1));
        uint32_t recent = lo + static_cast<uint32_t>(rng.Below(pos - lo + 1));
        if (recent == target) recent = pos;
        const double mix = kHeadMixLow + (1 - kHeadMixLow) * rng.Uniform();
        aims[n_aims++] = {recent, o.focus * kRecentScore * mix};
      }
      if (target >= 0) aims[n_aims++] = {static_cast<uint32_t>(target), o.focus};
      const size_t q_offset =
          ((size_t{s} * g.n_layers + layer) * g.n_q_heads + size_t{kv_head} * gqa + i) * d;
      builder.Build({aims, n_aims}, rng, trace.q.data() + q_offset);
    }
  }
}

// ---- File format ----------------------------------------------------------------------------

std::vector<std::byte> EncodeHeader(const TraceOptions& o, const TraceSizes& sizes) {
  ByteWriter w;
  for (char c : kMagic) w.Put(c);
  w.Put(kVersion);
  w.Put(uint32_t{static_cast<uint8_t>(o.kind)});
  w.Put(o.geometry.n_layers);
  w.Put(o.geometry.n_q_heads);
  w.Put(o.geometry.n_kv_heads);
  w.Put(o.geometry.head_dim);
  w.Put(o.n_prefix_tokens);
  w.Put(o.n_steps);
  w.Put(o.seed);
  w.Put(o.n_sinks);
  w.Put(o.recent_tokens);
  w.Put(o.n_recall_targets);
  w.Put(o.recall_period);
  w.Put(o.needle_depth);
  w.Put(o.needle_period);
  w.Put(o.focus);
  w.Put(uint64_t{sizes.n_kv_values});  // k
  w.Put(uint64_t{sizes.n_kv_values});  // v
  w.Put(uint64_t{sizes.n_q_values});
  w.Put(uint64_t{o.n_steps});  // target
  return std::move(w.bytes());
}

struct XxhStateFree {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};
using XxhState = std::unique_ptr<XXH3_state_t, XxhStateFree>;

XxhState NewXxhState() {
  XxhState state(XXH3_createState());
  if (state) XXH3_64bits_reset(state.get());
  return state;
}

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

// The arrays in file order.
std::vector<std::span<const std::byte>> ArrayBytes(const Trace& trace) {
  return {Bytes(trace.k), Bytes(trace.v), Bytes(trace.q), Bytes(trace.target)};
}

}  // namespace

std::string_view TraceKindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kRecency:
      return "recency";
    case TraceKind::kRecall:
      return "recall";
    case TraceKind::kNeedle:
      return "needle";
    case TraceKind::kRecorded:
      return "recorded";
  }
  return "?";
}

// REQUIRES (all three): the ranges lie inside the trace.
std::span<const uint16_t> Trace::K(uint32_t layer, uint32_t first, uint32_t n) const {
  const size_t row = size_t{options.geometry.n_kv_heads} * options.geometry.head_dim;
  return std::span(k).subspan((size_t{layer} * n_tokens() + first) * row, size_t{n} * row);
}

std::span<const uint16_t> Trace::V(uint32_t layer, uint32_t first, uint32_t n) const {
  const size_t row = size_t{options.geometry.n_kv_heads} * options.geometry.head_dim;
  return std::span(v).subspan((size_t{layer} * n_tokens() + first) * row, size_t{n} * row);
}

std::span<const float> Trace::Q(uint32_t step, uint32_t layer) const {
  const CacheGeometry& g = options.geometry;
  const size_t row = size_t{g.n_q_heads} * g.head_dim;
  return std::span(q).subspan((size_t{step} * g.n_layers + layer) * row, row);
}

Result<Trace> GenerateTrace(const TraceOptions& options) {
  ARGUS_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.kind == TraceKind::kRecorded) {
    return Status::InvalidArgument("trace: a recorded trace comes from a model (RecordTrace)");
  }
  ARGUS_ASSIGN_OR_RETURN(TraceSizes sizes, SizesOf(options));
  Trace trace;
  trace.options = options;
  trace.k.resize(sizes.n_kv_values);
  trace.v.resize(sizes.n_kv_values);
  trace.q.resize(sizes.n_q_values);
  trace.target = TargetSchedule(options);
  // Each (layer, KV head) draws from its own streams and writes disjoint rows, so the trace is
  // the same for any thread count. Most of the time is GenerateSyntheticKv's normals.
  const uint32_t n_kv_heads = options.geometry.n_kv_heads;
  ThreadPool pool;
  pool.ParallelFor(size_t{options.geometry.n_layers} * n_kv_heads, 1,
                   [&](size_t, size_t begin, size_t end) {
                     for (size_t i = begin; i < end; ++i) {
                       GenerateHead(trace, static_cast<uint32_t>(i / n_kv_heads),
                                    static_cast<uint32_t>(i % n_kv_heads));
                     }
                   });
  return trace;
}

Status WriteTrace(const Trace& trace, const std::string& path) {
  if (Status s = ValidateOptions(trace.options); !s.ok()) {
    return Status::InvalidArgument(path + ": " + s.message());
  }
  ARGUS_ASSIGN_OR_RETURN(TraceSizes sizes, SizesOf(trace.options));
  if (trace.k.size() != sizes.n_kv_values || trace.v.size() != sizes.n_kv_values ||
      trace.q.size() != sizes.n_q_values || trace.target.size() != trace.options.n_steps) {
    return Status::InvalidArgument(path + ": the trace's arrays do not match its options");
  }
  XxhState hash = NewXxhState();
  if (!hash) return Status::ResourceExhausted(path + ": cannot allocate the checksum state");

  Env* env = Env::Default();
  const std::string tmp = path + ".tmp";
  FileOpenOptions open_options;
  open_options.create = true;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(tmp, open_options));
  auto write_all = [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(file->Truncate(0));
    const std::vector<std::byte> header = EncodeHeader(trace.options, sizes);
    uint64_t offset = 0;
    std::vector<std::span<const std::byte>> parts = ArrayBytes(trace);
    parts.insert(parts.begin(), header);
    for (std::span<const std::byte> part : parts) {
      ARGUS_RETURN_IF_ERROR(WriteExact(*file, offset, part, "trace"));
      XXH3_64bits_update(hash.get(), part.data(), part.size());
      offset += part.size();
    }
    const uint64_t checksum = XXH3_64bits_digest(hash.get());
    ARGUS_RETURN_IF_ERROR(
        WriteExact(*file, offset, std::as_bytes(std::span(&checksum, 1)), "trace checksum"));
    return file->Sync();
  };
  if (Status s = write_all(); !s.ok()) {
    file.reset();
    (void)env->Remove(tmp);
    return s;
  }
  file.reset();
  if (Status s = env->Rename(tmp, path); !s.ok()) {
    (void)env->Remove(tmp);
    return s;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return env->SyncDir(dir.empty() ? "." : dir);
}

Result<Trace> ReadTrace(const std::string& path) {
  FileOpenOptions open_options;
  open_options.read_only = true;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<File> file, Env::Default()->Open(path, open_options));
  ARGUS_ASSIGN_OR_RETURN(const uint64_t file_bytes, file->Size());
  auto corrupt = [&](const std::string& what) {
    return Status::Corruption("trace " + path + ": " + what);
  };

  std::byte header[kHeaderBytes];
  const size_t n_header = static_cast<size_t>(std::min<uint64_t>(file_bytes, kHeaderBytes));
  ARGUS_RETURN_IF_ERROR(ReadExact(*file, 0, {header, n_header}, "trace header"));
  if (n_header < sizeof(kMagic) || std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return corrupt("bad magic (not an ARGUSTRC trace file)");
  }
  if (n_header < kHeaderBytes) {
    return corrupt("truncated: " + std::to_string(file_bytes) + " bytes, the header alone is " +
                   std::to_string(kHeaderBytes));
  }
  ByteReader r({header, kHeaderBytes}, "trace " + path);
  ARGUS_RETURN_IF_ERROR(r.Get<uint64_t>("magic").status());
  ARGUS_ASSIGN_OR_RETURN(const uint32_t version, r.Get<uint32_t>("version"));
  if (version != kVersion) {
    return corrupt("field version: unsupported version " + std::to_string(version));
  }
  Trace trace;
  TraceOptions& o = trace.options;
  ARGUS_ASSIGN_OR_RETURN(const uint32_t kind, r.Get<uint32_t>("kind"));
  if (kind > static_cast<uint32_t>(TraceKind::kRecorded)) {
    return corrupt("field kind: unknown kind " + std::to_string(kind));
  }
  o.kind = static_cast<TraceKind>(kind);
  ARGUS_ASSIGN_OR_RETURN(o.geometry.n_layers, r.Get<uint32_t>("n_layers"));
  ARGUS_ASSIGN_OR_RETURN(o.geometry.n_q_heads, r.Get<uint32_t>("n_q_heads"));
  ARGUS_ASSIGN_OR_RETURN(o.geometry.n_kv_heads, r.Get<uint32_t>("n_kv_heads"));
  ARGUS_ASSIGN_OR_RETURN(o.geometry.head_dim, r.Get<uint32_t>("head_dim"));
  ARGUS_ASSIGN_OR_RETURN(o.n_prefix_tokens, r.Get<uint32_t>("n_prefix_tokens"));
  ARGUS_ASSIGN_OR_RETURN(o.n_steps, r.Get<uint32_t>("n_steps"));
  ARGUS_ASSIGN_OR_RETURN(o.seed, r.Get<uint64_t>("seed"));
  ARGUS_ASSIGN_OR_RETURN(o.n_sinks, r.Get<uint32_t>("n_sinks"));
  ARGUS_ASSIGN_OR_RETURN(o.recent_tokens, r.Get<uint32_t>("recent_tokens"));
  ARGUS_ASSIGN_OR_RETURN(o.n_recall_targets, r.Get<uint32_t>("n_recall_targets"));
  ARGUS_ASSIGN_OR_RETURN(o.recall_period, r.Get<uint32_t>("recall_period"));
  ARGUS_ASSIGN_OR_RETURN(o.needle_depth, r.Get<double>("needle_depth"));
  ARGUS_ASSIGN_OR_RETURN(o.needle_period, r.Get<uint32_t>("needle_period"));
  ARGUS_ASSIGN_OR_RETURN(o.focus, r.Get<float>("focus"));
  if (Status s = ValidateOptions(o); !s.ok()) return corrupt("header options: " + s.message());
  ARGUS_ASSIGN_OR_RETURN(TraceSizes sizes, SizesOf(o));
  const struct {
    const char* field;
    uint64_t expected;
  } counts[] = {{"k", sizes.n_kv_values},
                {"v", sizes.n_kv_values},
                {"q", sizes.n_q_values},
                {"target", o.n_steps}};
  for (const auto& count : counts) {
    ARGUS_ASSIGN_OR_RETURN(const uint64_t n, r.Get<uint64_t>(count.field));
    if (n != count.expected) {
      return corrupt("field " + std::string(count.field) + ": " + std::to_string(n) +
                     " values, the header's options imply " + std::to_string(count.expected));
    }
  }
  const uint64_t expected_bytes = kHeaderBytes + uint64_t{sizes.n_bytes} + 8;
  if (file_bytes != expected_bytes) {
    return corrupt(std::string(file_bytes < expected_bytes ? "truncated" : "trailing bytes") +
                   ": " + std::to_string(file_bytes) + " bytes, the header implies " +
                   std::to_string(expected_bytes));
  }

  XxhState hash = NewXxhState();
  if (!hash) return Status::ResourceExhausted(path + ": cannot allocate the checksum state");
  XXH3_64bits_update(hash.get(), header, kHeaderBytes);
  trace.k.resize(sizes.n_kv_values);
  trace.v.resize(sizes.n_kv_values);
  trace.q.resize(sizes.n_q_values);
  trace.target.resize(o.n_steps);
  const struct {
    const char* field;
    std::span<std::byte> bytes;
  } arrays[] = {{"k", std::as_writable_bytes(std::span(trace.k))},
                {"v", std::as_writable_bytes(std::span(trace.v))},
                {"q", std::as_writable_bytes(std::span(trace.q))},
                {"target", std::as_writable_bytes(std::span(trace.target))}};
  uint64_t offset = kHeaderBytes;
  for (const auto& array : arrays) {
    ARGUS_RETURN_IF_ERROR(ReadExact(*file, offset, array.bytes, array.field));
    XXH3_64bits_update(hash.get(), array.bytes.data(), array.bytes.size());
    offset += array.bytes.size();
  }
  uint64_t stored = 0;
  ARGUS_RETURN_IF_ERROR(
      ReadExact(*file, offset, std::as_writable_bytes(std::span(&stored, 1)), "checksum"));
  if (const uint64_t computed = XXH3_64bits_digest(hash.get()); computed != stored) {
    return corrupt("field checksum: stored " + std::to_string(stored) + ", computed " +
                   std::to_string(computed));
  }
  // The schedule is a function of the options: a target that disagrees is a writer bug or a
  // forged file, never data.
  const std::vector<int64_t> schedule = TargetSchedule(o);
  for (uint32_t s = 0; s < o.n_steps; ++s) {
    if (trace.target[s] != schedule[s]) {
      return corrupt("field target: target[" + std::to_string(s) + "] is " +
                     std::to_string(trace.target[s]) + ", the options imply " +
                     std::to_string(schedule[s]));
    }
  }
  return trace;
}

}  // namespace argus
