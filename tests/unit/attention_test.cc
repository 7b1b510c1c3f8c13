// ReferenceAttention against hand-computed cases, and the AttentionEngine against
// ReferenceAttention (dense, double precision) over codec pairs, shapes, masks, forks, crops,
// prefill blocks, thread counts, mass recording and certified skipping.
//
// Tolerances, per output row (query, q head), as ||out - ref|| / ||ref||:
// - kEngineTol = 2e-4 wherever the reference computes from exactly what the engine reads: f16
//   pages against the f16-rounded input, f32 pages against the input, any pages against their
//   decoded tiles when the codecs' fused kernels state float rounding only (fused_rel_error
//   <= 1e-5), and every codec pair against FusedReference (the same fused kernels, the softmax
//   dense in double). Float scores, softmax and accumulation over a few hundred tokens stay far
//   inside it (about 2e-6 is typical).
// - Against the unrounded input, lossy pairs get CodecErrorBounds, a bound proven from their
//   decoded pages, plus their kernels' measured error.
// - Certified skipping of mass mu moves a row by at most 2 mu max ||v||.
#include "argus/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "argus/cache.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "cache/placement_access.h"
#include "test_util.h"

namespace argus {
namespace {

constexpr double kEngineTol = 2e-4;
constexpr size_t kBudgetBytes = size_t{256} << 20;  // budgets are not under test here

CacheGeometry Geometry(uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim,
                       uint32_t n_layers = 1) {
  return {
      .n_layers = n_layers, .n_q_heads = n_q_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim};
}

// K and V of one layer: [n_tokens, n_kv_heads, head_dim] each.
struct Dense {
  std::vector<float> k, v;
  uint32_t n_tokens = 0;
};

size_t RowValues(const CacheGeometry& g) { return size_t{g.n_kv_heads} * g.head_dim; }

Dense RandomDense(const CacheGeometry& g, uint32_t n_tokens, uint64_t salt) {
  const size_t n = n_tokens * RowValues(g);
  return {testing::RandomValues(n, 2 * salt), testing::RandomValues(n, 2 * salt + 1), n_tokens};
}

// Tokens [begin, end) of a.
Dense Tokens(const CacheGeometry& g, const Dense& a, uint32_t begin, uint32_t end) {
  const size_t b = begin * RowValues(g), e = end * RowValues(g);
  return {{a.k.begin() + b, a.k.begin() + e}, {a.v.begin() + b, a.v.begin() + e}, end - begin};
}

Dense Concat(const Dense& a, const Dense& b) {
  Dense c = a;
  c.k.insert(c.k.end(), b.k.begin(), b.k.end());
  c.v.insert(c.v.end(), b.v.begin(), b.v.end());
  c.n_tokens += b.n_tokens;
  return c;
}

Dense RoundedToHalf(Dense a) {
  for (auto* x : {&a.k, &a.v})
    for (float& f : *x) f = HalfToFloat(FloatToHalf(f));
  return a;
}

std::unique_ptr<KvCache> MakeCache(const CacheGeometry& g, uint32_t page_tokens,
                                   const std::string& k_codec = "f16",
                                   const std::string& v_codec = "f16",
                                   const std::string& active_codec = "f16") {
  CacheOptions options;
  options.geometry = g;
  options.page_tokens = page_tokens;
  options.ram_budget_bytes = kBudgetBytes;
  options.k_codec = k_codec;
  options.v_codec = v_codec;
  options.active_codec = active_codec;
  auto cache = KvCache::Create(options);
  EXPECT_TRUE(cache.ok()) << k_codec << "/" << v_codec << ": " << cache.status().ToString();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

SeqId NewSequence(KvCache& cache) {
  auto seq = cache.CreateSequence();
  EXPECT_TRUE(seq.ok()) << seq.status().ToString();
  return seq.ok() ? *seq : 0;
}

// Appends data to a layer in pieces of `piece` tokens, so appends start and end mid-page.
void Append(KvCache& cache, SeqId seq, uint32_t layer, const Dense& data, uint32_t piece = 7) {
  const size_t row = RowValues(cache.geometry());
  for (uint32_t t = 0; t < data.n_tokens; t += piece) {
    const size_t n = std::min(piece, data.n_tokens - t) * row;
    Status status = cache.Append(seq, layer, std::span(data.k).subspan(t * row, n),
                                 std::span(data.v).subspan(t * row, n));
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
}

// The layer's K/V as the cache holds them: every page's tiles decoded by the page's codecs.
Dense ReadBack(const KvCache& cache, SeqId seq, uint32_t layer) {
  const CacheGeometry& g = cache.geometry();
  Dense out;
  auto pages = cache.Pages(seq, layer);
  EXPECT_TRUE(pages.ok()) << pages.status().ToString();
  if (!pages.ok()) return out;
  std::vector<float> tile;
  for (const PageView& page : *pages) {
    EXPECT_EQ(page.first_token, out.n_tokens) << "page " << page.id;
    const TileShape shape{page.n_tokens, g.head_dim};
    out.n_tokens += page.n_tokens;
    out.k.resize(out.n_tokens * RowValues(g));
    out.v.resize(out.n_tokens * RowValues(g));
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      for (auto [codec, bytes, dst] : {std::tuple{page.k_codec, page.k_tile(h), &out.k},
                                       std::tuple{page.v_codec, page.v_tile(h), &out.v}}) {
        tile = testing::DecodeTile(*codec, bytes, shape);
        for (uint32_t t = 0; t < page.n_tokens; ++t) {
          std::copy_n(
              tile.data() + size_t{t} * g.head_dim, g.head_dim,
              dst->data() + (size_t{page.first_token} + t) * RowValues(g) + size_t{h} * g.head_dim);
        }
      }
    }
  }
  return out;
}

// The reference for n_queries queries at the last positions of `kv`.
std::vector<double> Reference(const CacheGeometry& g, const std::vector<float>& q,
                              uint32_t n_queries, const Dense& kv,
                              const AttentionOptions& options = {}) {
  return ReferenceAttention(g, q.data(), n_queries, kv.n_tokens - n_queries, kv.k.data(),
                            kv.v.data(), kv.n_tokens, options);
}

using testing::Norm;

// ||out - ref|| per output row of head_dim values.
std::vector<double> RowErrors(const std::vector<float>& out, const std::vector<double>& ref,
                              uint32_t head_dim) {
  std::vector<double> errors(ref.size() / head_dim), diff(head_dim);
  for (size_t r = 0; r < errors.size(); ++r) {
    for (uint32_t c = 0; c < head_dim; ++c) diff[c] = out[r * head_dim + c] - ref[r * head_dim + c];
    errors[r] = Norm(diff.data(), head_dim);
  }
  return errors;
}

// max over rows of ||out - ref|| / ||ref|| (absolute where ||ref|| is 0).
double MaxRelError(const std::vector<float>& out, const std::vector<double>& ref,
                   uint32_t head_dim) {
  std::vector<double> errors = RowErrors(out, ref, head_dim);
  double worst = 0;
  for (size_t r = 0; r < errors.size(); ++r) {
    double norm = Norm(ref.data() + r * head_dim, head_dim);
    worst = std::max(worst, norm > 0 ? errors[r] / norm : errors[r]);
  }
  return worst;
}

struct EngineRun {
  std::vector<float> out;
  AttentionStats stats;
};

// Decode for one query, Prefill for more; a test failure (and an empty run) on error.
EngineRun Attend(AttentionEngine& engine, KvCache& cache, SeqId seq, uint32_t layer,
                 const std::vector<float>& q, uint32_t n_queries,
                 const AttentionOptions& options = {}) {
  const CacheGeometry& g = cache.geometry();
  EngineRun run;
  run.out.assign(size_t{n_queries} * g.n_q_heads * g.head_dim, std::nanf(""));
  auto stats = n_queries == 1 ? engine.Decode(cache, seq, layer, q.data(), run.out.data(), options)
                              : engine.Prefill(cache, seq, layer, q.data(), n_queries,
                                               run.out.data(), options);
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (stats.ok()) run.stats = std::move(stats).value();
  return run;
}

// Whether some query at positions [first, last] attends a token of the page.
bool PageIsRead(const PageView& page, uint32_t first, uint32_t last,
                const AttentionOptions& options) {
  for (uint32_t pos = first; pos <= last; ++pos)
    for (uint32_t t = page.first_token; t < page.first_token + page.n_tokens; ++t)
      if (Attends(pos, t, options)) return true;
  return false;
}

// An exact call (epsilon 0) for n_queries random queries at the last positions of `kv` (what
// the layer holds): the output is the reference's within kEngineTol, and the stats count the
// pages no query reaches, the tiles inside the mask (each once) and their bytes.
void ExpectMatchesReference(AttentionEngine& engine, KvCache& cache, SeqId seq, uint32_t layer,
                            const Dense& kv, uint32_t n_queries, uint64_t salt,
                            const AttentionOptions& options = {}) {
  SCOPED_TRACE(std::to_string(n_queries) + " queries over " + std::to_string(kv.n_tokens) +
               " tokens, window " + std::to_string(options.window) + ", sinks " +
               std::to_string(options.sinks) + ", scale " + std::to_string(options.scale));
  const CacheGeometry& g = cache.geometry();
  std::vector<float> q = testing::RandomValues(size_t{n_queries} * g.n_q_heads * g.head_dim, salt);
  EngineRun run = Attend(engine, cache, seq, layer, q, n_queries, options);
  EXPECT_LE(MaxRelError(run.out, Reference(g, q, n_queries, kv, options), g.head_dim), kEngineTol);

  auto pages = cache.Pages(seq, layer);
  ASSERT_TRUE(pages.ok());
  uint32_t n_read = 0;
  uint64_t bytes = 0;
  for (const PageView& page : *pages) {
    if (!PageIsRead(page, kv.n_tokens - n_queries, kv.n_tokens - 1, options)) continue;
    ++n_read;
    bytes += (page.k_tile_bytes + page.v_tile_bytes) * g.n_kv_heads;
  }
  EXPECT_EQ(run.stats.n_pages, pages->size());
  EXPECT_EQ(run.stats.n_pages_masked, pages->size() - n_read);
  EXPECT_EQ(run.stats.n_tiles, uint64_t{n_read} * g.n_kv_heads);
  // A prefill whose rows do not fit one kernel call reads a tile once per call.
  if (n_queries == 1) {
    EXPECT_EQ(run.stats.bytes_read, bytes);
  } else {
    EXPECT_GE(run.stats.bytes_read, bytes);
  }
  EXPECT_EQ(run.stats.n_tiles_skipped, 0u);
  EXPECT_EQ(run.stats.bytes_skipped, 0u);
  EXPECT_EQ(run.stats.skipped_mass_bound, 0.0);
}

// ---- ReferenceAttention on its own -----------------------------------------------------------

// One head, head_dim 4, default scale 1/2. q = (2,0,0,0) and keys 0, e0, -e0 give scores 0, 1,
// -1; the values are 1 e0, 2 e1, 3 e2, so each output channel is one softmax weight times c+1.
TEST(ReferenceAttention, MatchesHandComputedSoftmaxOverThreeTokens) {
  const CacheGeometry g = Geometry(1, 1, 4);
  const float k[] = {0, 0, 0, 0, 1, 0, 0, 0, -1, 0, 0, 0};
  const float v[] = {1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 3, 0};
  const float q3[] = {2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0};  // the same query three times
  const double e = std::exp(1.0), e4 = std::exp(4.0);
  struct Case {
    uint32_t position;
    AttentionOptions options;
    std::vector<double> expected;
  };
  const double z3 = 1 + e + 1 / e, z2 = 1 + e, zs = 1 + 1 / e;
  const Case cases[] = {
      {2, {}, {1 / z3, 2 * e / z3, 3 / e / z3, 0}},
      {1, {}, {1 / z2, 2 * e / z2, 0, 0}},  // causal: token 2 is in the future
      {0, {}, {1, 0, 0, 0}},                // only token 0
      {2, {.window = 1}, {0, 0, 3, 0}},     // only the query's own token
      {2, {.window = 1, .sinks = 1}, {1 / zs, 0, 3 / e / zs, 0}},           // plus the sink
      {2, {.window = 2, .sinks = 5}, {1 / z3, 2 * e / z3, 3 / e / z3, 0}},  // sinks cover all
      {1, {.scale = 2.0f}, {1 / (1 + e4), 2 * e4 / (1 + e4), 0, 0}},        // scores 0, 4
      {5, {.window = 2}, {0, 0, 0, 0}},  // positions 4 and 5 hold no key: a zero row
  };
  for (const Case& c : cases) {
    std::vector<double> out = ReferenceAttention(g, q3, 1, c.position, k, v, 3, c.options);
    ASSERT_EQ(out.size(), 4u);
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(out[i], c.expected[i], 1e-15) << "position " << c.position << ", channel " << i;
  }
  // A block of three queries at positions 0, 1, 2 is the three single queries.
  std::vector<double> block = ReferenceAttention(g, q3, 3, 0, k, v, 3, {});
  for (uint32_t p = 0; p < 3; ++p) {
    std::vector<double> single = ReferenceAttention(g, q3, 1, p, k, v, 3, {});
    EXPECT_TRUE(std::equal(single.begin(), single.end(), block.begin() + 4 * p)) << p;
  }
}

// With every key equal, every attended token has the same weight: the output is the mean of
// the attended values, whatever the window and sinks, and zero when nothing is attended.
TEST(ReferenceAttention, EqualKeysGiveTheMeanOfTheAttendedValues) {
  const CacheGeometry g = Geometry(2, 1, 8);
  const uint32_t n = 40;
  std::vector<float> key = testing::RandomValues(8, 1), k(n * 8),
                     v = testing::RandomValues(n * 8, 2);
  for (uint32_t t = 0; t < n; ++t) std::copy(key.begin(), key.end(), k.begin() + t * 8);
  std::vector<float> q = testing::RandomValues(2 * 8, 3);
  for (uint32_t window : {0u, 1u, 7u, 40u})
    for (uint32_t sinks : {0u, 3u, 50u})
      for (uint32_t position : {0u, 17u, 39u, 45u}) {
        AttentionOptions options{.window = window, .sinks = sinks};
        std::vector<double> out =
            ReferenceAttention(g, q.data(), 1, position, k.data(), v.data(), n, options);
        std::vector<double> mean(8, 0.0);
        uint32_t n_attended = 0;
        for (uint32_t t = 0; t < n; ++t) {
          if (!Attends(position, t, options)) continue;
          ++n_attended;
          for (int c = 0; c < 8; ++c) mean[c] += v[t * 8 + c];
        }
        for (int h = 0; h < 2; ++h)
          for (int c = 0; c < 8; ++c) {
            EXPECT_NEAR(out[h * 8 + c], n_attended ? mean[c] / n_attended : 0.0, 1e-12)
                << "window " << window << ", sinks " << sinks << ", position " << position;
          }
      }
}

// GQA: q head i reads KV head i / gqa, which is the same as attending each group alone.
TEST(ReferenceAttention, QueryHeadsReadTheirGroupsKvHead) {
  const uint32_t gqa = 3, n_kv = 2, d = 8, n = 11;
  const CacheGeometry g = Geometry(gqa * n_kv, n_kv, d), one = Geometry(gqa, 1, d);
  Dense kv = RandomDense(g, n, 4);
  std::vector<float> q = testing::RandomValues(gqa * n_kv * d, 5);
  std::vector<double> out = Reference(g, q, 1, kv);
  for (uint32_t h = 0; h < n_kv; ++h) {
    Dense part;
    part.n_tokens = n;
    for (uint32_t t = 0; t < n; ++t) {
      auto row = (size_t{t} * n_kv + h) * d;
      part.k.insert(part.k.end(), kv.k.begin() + row, kv.k.begin() + row + d);
      part.v.insert(part.v.end(), kv.v.begin() + row, kv.v.begin() + row + d);
    }
    std::vector<float> q_group(q.begin() + h * gqa * d, q.begin() + (h + 1) * gqa * d);
    std::vector<double> group = Reference(one, q_group, 1, part);
    for (size_t i = 0; i < group.size(); ++i) EXPECT_EQ(group[i], out[h * gqa * d + i]) << h;
  }
}

// A custom scale s is the default scale applied to q * s * sqrt(head_dim).
TEST(ReferenceAttention, CustomScaleEqualsAScaledQuery) {
  const CacheGeometry g = Geometry(2, 1, 16);
  Dense kv = RandomDense(g, 9, 6);
  std::vector<float> q = testing::RandomValues(2 * 16, 7), q_scaled = q;
  const float scale = 0.5f;
  for (float& x : q_scaled) x *= scale * 4.0f;  // sqrt(16) = 4: q * 2, exact in float
  std::vector<double> a = Reference(g, q, 1, kv, {.scale = scale});
  std::vector<double> b = Reference(g, q_scaled, 1, kv);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12);
}

TEST(ReferenceAttention, GeometryWithoutWholeGroupsGivesNothing) {
  const float x[4] = {};
  EXPECT_TRUE(ReferenceAttention(Geometry(3, 2, 1), x, 1, 0, x, x, 1, {}).empty());
  EXPECT_TRUE(ReferenceAttention(Geometry(2, 0, 1), x, 1, 0, x, x, 1, {}).empty());
}

// ---- The engine: codec pairs -----------------------------------------------------------------

std::vector<std::string> CodecNames(CodecRole role) {
  std::vector<std::string> names;
  for (const CodecInfo& info : CodecRegistry::Default().Find({.role = role}))
    names.push_back(info.name);
  return names;
}

// Decode attention (default options) through the pages' own fused kernels, scores and
// accumulate on the encoded tiles, with the softmax in double over the whole context: what the
// engine computes, without its online softmax, chunking and merging. Integer kernels (quantised
// queries or weights) differ from decode-then-dot by far more than float rounding, so this, not
// the decoded reference, is what the engine must match to float rounding for every codec pair.
// [n_q_heads, head_dim].
std::vector<double> FusedReference(const CacheGeometry& g, const std::vector<PageView>& pages,
                                   const std::vector<float>& q) {
  const uint32_t d = g.head_dim, gqa = g.gqa();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const uint32_t n_tokens = pages.back().first_token + pages.back().n_tokens;
  std::vector<double> out(size_t{g.n_q_heads} * d, 0.0), s(size_t{gqa} * n_tokens);
  std::vector<float> tile_s, p, acc(size_t{gqa} * d);
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
    const float* q_group = q.data() + size_t{h} * gqa * d;
    for (const PageView& page : pages) {
      tile_s.resize(size_t{gqa} * page.n_tokens);
      EXPECT_TRUE(
          page.k_codec->scores(page.k_tile(h), {page.n_tokens, d}, q_group, gqa, tile_s.data())
              .ok());
      for (uint32_t i = 0; i < gqa; ++i)
        for (uint32_t t = 0; t < page.n_tokens; ++t)
          s[size_t{i} * n_tokens + page.first_token + t] = tile_s[i * page.n_tokens + t] * scale;
    }
    for (uint32_t i = 0; i < gqa; ++i) {
      double* row = s.data() + size_t{i} * n_tokens;
      const double m = *std::max_element(row, row + n_tokens);
      double sum = 0;
      for (uint32_t t = 0; t < n_tokens; ++t) sum += row[t] = std::exp(row[t] - m);
      for (uint32_t t = 0; t < n_tokens; ++t) row[t] /= sum;
    }
    for (const PageView& page : pages) {
      p.resize(size_t{gqa} * page.n_tokens);
      for (uint32_t i = 0; i < gqa; ++i)
        for (uint32_t t = 0; t < page.n_tokens; ++t)
          p[i * page.n_tokens + t] =
              static_cast<float>(s[size_t{i} * n_tokens + page.first_token + t]);
      std::fill(acc.begin(), acc.end(), 0.0f);
      EXPECT_TRUE(
          page.v_codec->accumulate(page.v_tile(h), {page.n_tokens, d}, p.data(), gqa, acc.data())
              .ok());
      for (size_t c = 0; c < acc.size(); ++c) out[size_t{h} * gqa * d + c] += acc[c];
    }
  }
  return out;
}

// Per row, how far attention over the decoded K/V (k', v') may be from attention over the
// input (k, v): with every scaled score moved by at most delta = max_t |q.(k'_t - k_t)| * scale,
// each weight moves by a factor within e^(+-2 delta), so
//   ||o' - o|| <= sum_t p'_t ||v'_t - v_t|| + sum_t |p'_t - p_t| ||v_t||
//              <= max_t ||v'_t - v_t|| + (e^(2 delta) - 1) max_t ||v_t||.
std::vector<double> CodecErrorBounds(const CacheGeometry& g, const std::vector<float>& q,
                                     const Dense& exact, const Dense& decoded) {
  const uint32_t d = g.head_dim, gqa = g.gqa();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> bounds(g.n_q_heads);
  for (uint32_t i = 0; i < g.n_q_heads; ++i) {
    double delta = 0, v_err = 0, v_max = 0;
    for (uint32_t t = 0; t < exact.n_tokens; ++t) {
      const size_t row = (size_t{t} * g.n_kv_heads + i / gqa) * d;
      double dot = 0, e2 = 0, n2 = 0;
      for (uint32_t c = 0; c < d; ++c) {
        dot += double{q[i * d + c]} * (double{decoded.k[row + c]} - exact.k[row + c]);
        double dv = double{decoded.v[row + c]} - exact.v[row + c];
        e2 += dv * dv;
        n2 += double{exact.v[row + c]} * exact.v[row + c];
      }
      delta = std::max(delta, std::fabs(dot) * scale);
      v_err = std::max(v_err, std::sqrt(e2));
      v_max = std::max(v_max, std::sqrt(n2));
    }
    bounds[i] = v_err + std::expm1(2 * delta) * v_max;
  }
  return bounds;
}

// Every K codec against every V codec of the registry (plus grouped and transformed specs),
// over 3 pages and a partial one. Sharp: the engine matches the reference through the same
// fused kernels (FusedReference) for every pair, and the dense reference on the decoded pages
// for pairs whose kernels state float rounding only; f16 pages hold exactly the f16-rounded
// input. Loose: against the reference on the input, the engine is within the codec's own error
// (CodecErrorBounds, from the decoded pages) plus the measured error of its fused kernels.
TEST(AttentionEngine, EveryCodecPairMatchesTheReferenceOnItsDecodedPages) {
  const uint32_t n_kv = 2, gqa = 2, d = 64, page = 16, n_tokens = 3 * page + 5;
  const CacheGeometry g = Geometry(n_kv * gqa, n_kv, d);
  Dense input{std::vector<float>(n_tokens * RowValues(g)),
              std::vector<float>(n_tokens * RowValues(g)), n_tokens};
  std::vector<float> q(g.n_q_heads * d);
  for (uint32_t h = 0; h < n_kv; ++h) {
    SyntheticKv kv = GenerateSyntheticKv({.regime = KeyRegime::kModerateOutliers,
                                          .dim = d,
                                          .n_q = gqa,
                                          .seed = testing::TestSeed() + h},
                                         n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      std::copy_n(kv.k.data() + t * d, d, input.k.data() + (t * n_kv + h) * d);
      std::copy_n(kv.v.data() + t * d, d, input.v.data() + (t * n_kv + h) * d);
    }
    std::copy(kv.q.begin(), kv.q.end(), q.begin() + h * gqa * d);
  }
  const std::vector<double> ref_input = Reference(g, q, 1, input);

  std::vector<std::string> k_specs = CodecNames(CodecRole::kKeys);
  std::vector<std::string> v_specs = CodecNames(CodecRole::kValues);
  for (const char* spec : {"int4:channel", "int2:channel+center", "q4_0+rot", "int8+rot+center"}) {
    k_specs.push_back(spec);
    v_specs.push_back(spec);
  }
  ASSERT_GE(k_specs.size(), 10u);
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  for (const std::string& k_spec : k_specs) {
    for (const std::string& v_spec : v_specs) {
      SCOPED_TRACE(k_spec + " / " + v_spec);
      auto cache = MakeCache(g, page, k_spec, v_spec);
      ASSERT_NE(cache, nullptr);
      SeqId seq = NewSequence(*cache);
      Append(*cache, seq, 0, input);
      EngineRun run = Attend(engine, *cache, seq, 0, q, 1);
      ASSERT_EQ(run.stats.n_pages, 4u);

      Dense stored = ReadBack(*cache, seq, 0);
      ASSERT_EQ(stored.n_tokens, n_tokens);
      if (k_spec == "f16" && v_spec == "f16") {
        Dense rounded = RoundedToHalf(input);  // f16 pages hold exactly the rounded input
        EXPECT_EQ(stored.k, rounded.k);
        EXPECT_EQ(stored.v, rounded.v);
      }
      auto pages = cache->Pages(seq, 0);
      ASSERT_TRUE(pages.ok());
      const std::vector<double> fused = FusedReference(g, *pages, q);
      EXPECT_LE(MaxRelError(run.out, fused, d), kEngineTol);
      const std::vector<double> ref_stored = Reference(g, q, 1, stored);
      const bool float_kernels = std::max((*pages)[0].k_codec->info().fused_rel_error,
                                          (*pages)[0].v_codec->info().fused_rel_error) <= 1e-5;
      if (float_kernels) {
        EXPECT_LE(MaxRelError(run.out, ref_stored, d), kEngineTol);
      }

      const std::vector<double> bounds = CodecErrorBounds(g, q, input, stored);
      const std::vector<double> errors = RowErrors(run.out, ref_input, d);
      std::vector<float> fused_f(fused.begin(), fused.end());
      const std::vector<double> kernel_errors = RowErrors(fused_f, ref_stored, d);
      for (uint32_t i = 0; i < g.n_q_heads; ++i) {
        EXPECT_LE(errors[i], bounds[i] + kernel_errors[i] + kEngineTol * Norm(&fused[i * d], d))
            << "head " << i;
      }
    }
  }
}

// ---- The engine: shapes, lengths, masks ------------------------------------------------------

// f16 pages against the f16-rounded input and f32 pages (f32 active page) against the input,
// for every head_dim, GQA ratio and page size, at lengths 1, page-1, page, page+1, two pages
// (ending on a boundary) and two pages and 3 (ending mid-page): the cache grows through them.
TEST(AttentionEngine, DecodeMatchesTheReferenceOverHeadDimsGqaPagesAndLengths) {
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  const uint32_t n_kv = 2;
  for (uint32_t page : {16u, 256u}) {
    const uint32_t lengths[] = {1, page - 1, page, page + 1, 2 * page, 2 * page + 3};
    for (uint32_t d : {64u, 80u, 128u, 256u}) {
      const Dense input = RandomDense(Geometry(n_kv, n_kv, d), lengths[5], page + d);
      for (uint32_t gqa : {1u, 4u, 7u, 8u}) {
        const CacheGeometry g = Geometry(gqa * n_kv, n_kv, d);
        for (bool f32 : {false, true}) {
          SCOPED_TRACE("page " + std::to_string(page) + ", head_dim " + std::to_string(d) +
                       ", gqa " + std::to_string(gqa) + (f32 ? ", f32" : ", f16"));
          const char* codec = f32 ? "f32" : "f16";
          auto cache = MakeCache(g, page, codec, codec, codec);
          ASSERT_NE(cache, nullptr);
          SeqId seq = NewSequence(*cache);
          const Dense held = f32 ? input : RoundedToHalf(input);
          uint32_t length = 0;
          for (uint32_t next : lengths) {
            Append(*cache, seq, 0, Tokens(g, input, length, next), 100);
            length = next;
            ExpectMatchesReference(engine, *cache, seq, 0, Tokens(g, held, 0, length), 1,
                                   length * 31 + gqa);
          }
        }
      }
    }
  }
}

// Windows smaller than a page and spanning pages, sinks of 1, 4 and more than a page, both
// together, and a custom scale; decode and prefill blocks. The stats count the pages no query
// reaches and the tiles inside the mask.
TEST(AttentionEngine, WindowsSinksAndScaleMatchTheReference) {
  const uint32_t page = 16, n_tokens = 5 * page + 7;
  const CacheGeometry g = Geometry(4, 2, 64);
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  const Dense input = RandomDense(g, n_tokens, 11);
  Append(*cache, seq, 0, input);
  const Dense held = RoundedToHalf(input);
  for (uint32_t window : {0u, 1u, 5u, 16u, 20u, 40u, 87u, 200u})
    for (uint32_t sinks : {0u, 1u, 4u, 20u})
      for (float scale : {0.0f, 0.3f})
        for (uint32_t n_queries : {1u, 5u, page + 3}) {
          ExpectMatchesReference(engine, *cache, seq, 0, held, n_queries, window + sinks,
                                 {.window = window, .sinks = sinks, .scale = scale});
        }
}

// ---- The engine: prefill ---------------------------------------------------------------------

// Blocks of 1, 5 and page+3 queries (GQA 4: the last is more query rows than one batch holds)
// at the last positions, causal within the block; one query through Prefill is Decode bit for
// bit.
TEST(AttentionEngine, PrefillBlocksMatchTheReferenceAndOneQueryIsDecode) {
  const uint32_t page = 16, n_tokens = 3 * page + 9;
  const CacheGeometry g = Geometry(8, 2, 64);
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  const Dense input = RandomDense(g, n_tokens, 12);
  Append(*cache, seq, 0, input);
  const Dense held = RoundedToHalf(input);
  for (const AttentionOptions& options :
       {AttentionOptions{}, AttentionOptions{.window = 10, .sinks = 2}}) {
    for (uint32_t n_queries : {1u, 5u, page + 3}) {
      ExpectMatchesReference(engine, *cache, seq, 0, held, n_queries, n_queries, options);
    }
    std::vector<float> q = testing::RandomValues(g.n_q_heads * g.head_dim, 13);
    std::vector<float> decoded(q.size()), prefilled(q.size());
    ASSERT_TRUE(engine.Decode(*cache, seq, 0, q.data(), decoded.data(), options).ok());
    ASSERT_TRUE(engine.Prefill(*cache, seq, 0, q.data(), 1, prefilled.data(), options).ok());
    EXPECT_EQ(std::memcmp(decoded.data(), prefilled.data(), q.size() * sizeof(float)), 0);
  }
}

// Layers of one sequence hold their own tokens, of different lengths.
TEST(AttentionEngine, EachLayerDecodesItsOwnData) {
  const uint32_t page = 16;
  const CacheGeometry g = Geometry(4, 2, 64, 3);
  ThreadPool pool(2);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  std::vector<Dense> layers;
  for (uint32_t layer = 0; layer < 3; ++layer) {
    layers.push_back(RandomDense(g, page * (layer + 1) + 3 * layer, 80 + layer));
    Append(*cache, seq, layer, layers.back());
  }
  for (uint32_t layer = 0; layer < 3; ++layer)
    ExpectMatchesReference(engine, *cache, seq, layer, RoundedToHalf(layers[layer]), 2, 90 + layer);
}

// Full pages re-encoded to other codecs, so one sequence mixes codecs page by page: the engine
// reads each page through its own codecs (FusedReference, and the decoded pages where the
// kernels are float).
TEST(AttentionEngine, PagesReencodedToOtherCodecsMatchTheReference) {
  const uint32_t page = 16;
  const CacheGeometry g = Geometry(4, 2, 64);
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  Append(*cache, seq, 0, RandomDense(g, 4 * page + 6, 95));
  std::vector<float> q = testing::RandomValues(g.n_q_heads * g.head_dim, 96);
  const std::pair<const char*, const char*> codecs[] = {
      {"bf16", "fp8_e4m3"}, {"q8_0", "q4_0"}, {"int4:channel", "int8"}, {"int1", "plane8/4"}};
  auto pages = cache->Pages(seq, 0);
  ASSERT_TRUE(pages.ok());
  for (uint32_t p = 0; p < 4; ++p) {
    Status status = cache->Reencode((*pages)[p].id, codecs[p].first, codecs[p].second);
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  pages = cache->Pages(seq, 0);
  ASSERT_TRUE(pages.ok());
  for (uint32_t p = 0; p < 4; ++p) {
    EXPECT_EQ((*pages)[p].k_codec->info().name, testing::MakeCodec(codecs[p].first)->info().name);
    EXPECT_EQ((*pages)[p].v_codec->info().name, testing::MakeCodec(codecs[p].second)->info().name);
  }
  EngineRun run = Attend(engine, *cache, seq, 0, q, 1);
  EXPECT_LE(MaxRelError(run.out, FusedReference(g, *pages, q), g.head_dim), kEngineTol);
  // Only the first page's codecs are float: re-encode the rest back to it and compare densely.
  for (uint32_t p = 1; p < 4; ++p)
    ASSERT_TRUE(cache->Reencode((*pages)[p].id, "bf16", "fp8_e4m3").ok());
  ExpectMatchesReference(engine, *cache, seq, 0, ReadBack(*cache, seq, 0), 1, 97);
}

// ---- The engine: forks and crops -------------------------------------------------------------

// Parent and child share 2.5 pages, then each appends its own tokens across a page boundary;
// each decodes its own data, before and after the other's append.
TEST(AttentionEngine, ForkedSequencesDecodeTheirOwnData) {
  const uint32_t page = 16;
  const CacheGeometry g = Geometry(4, 2, 64);
  ThreadPool pool(2);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId parent = NewSequence(*cache);
  const Dense base = RandomDense(g, 2 * page + 8, 20);
  Append(*cache, parent, 0, base);
  auto child = cache->Fork(parent);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  const Dense a = RandomDense(g, 20, 21), b = RandomDense(g, 30, 22);
  Append(*cache, parent, 0, a);
  ExpectMatchesReference(engine, *cache, parent, 0, RoundedToHalf(Concat(base, a)), 1, 23);
  ExpectMatchesReference(engine, *cache, *child, 0, RoundedToHalf(base), 1, 24);
  Append(*cache, *child, 0, b);
  ExpectMatchesReference(engine, *cache, *child, 0, RoundedToHalf(Concat(base, b)), 1, 25);
  ExpectMatchesReference(engine, *cache, parent, 0, RoundedToHalf(Concat(base, a)), 3, 26);
}

// Crops mid-page and on a page boundary, each followed by new tokens; and a crop of a forked
// child into the shared pages leaves the parent as it was.
TEST(AttentionEngine, CropThenAppendDecodesTheNewData) {
  const uint32_t page = 16;
  const CacheGeometry g = Geometry(4, 2, 64);
  ThreadPool pool(2);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  Dense data = RandomDense(g, 3 * page + 5, 30);
  Append(*cache, seq, 0, data);
  uint64_t salt = 31;
  for (uint32_t keep : {page + 8, 2 * page, 5u}) {
    SCOPED_TRACE("crop to " + std::to_string(keep));
    ASSERT_TRUE(cache->Crop(seq, keep).ok());
    const Dense more = RandomDense(g, page + 3, ++salt);
    Append(*cache, seq, 0, more);
    data = Concat(Tokens(g, data, 0, keep), more);
    ExpectMatchesReference(engine, *cache, seq, 0, RoundedToHalf(data), 1, ++salt);
  }
  auto child = cache->Fork(seq);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_TRUE(cache->Crop(*child, page / 2).ok());
  const Dense more = RandomDense(g, 2 * page, ++salt);
  Append(*cache, *child, 0, more);
  ExpectMatchesReference(engine, *cache, *child, 0,
                         RoundedToHalf(Concat(Tokens(g, data, 0, page / 2), more)), 1, ++salt);
  ExpectMatchesReference(engine, *cache, seq, 0, RoundedToHalf(data), 1, ++salt);
}

// ---- The engine: determinism -----------------------------------------------------------------

// 40 pages of 16 tokens, GQA 4: outputs, stats and recorded masses are the same bytes for 1, 2,
// 4 and 16 threads, exact and with skipping, decode and prefill.
TEST(AttentionEngine, OutputsAreBitIdenticalForEveryThreadCount) {
  const uint32_t page = 16, n_tokens = 40 * page + 5;
  const CacheGeometry g = Geometry(8, 2, 64);
  auto cache = MakeCache(g, page, "q8_0", "q4_0");
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  Append(*cache, seq, 0, RandomDense(g, n_tokens, 40), 64);
  auto pages = cache->Pages(seq, 0);
  ASSERT_TRUE(pages.ok());
  const AttentionOptions option_sets[] = {{}, {.window = 100, .sinks = 4}, {.epsilon = 1e-3}};
  for (const AttentionOptions& options : option_sets) {
    for (uint32_t n_queries : {1u, 5u}) {
      SCOPED_TRACE("window " + std::to_string(options.window) + ", epsilon " +
                   std::to_string(options.epsilon) + ", queries " + std::to_string(n_queries));
      std::vector<float> q =
          testing::RandomValues(size_t{n_queries} * g.n_q_heads * g.head_dim, 41);
      EngineRun first;
      std::vector<float> first_mass;
      for (unsigned n_threads : {1u, 2u, 4u, 16u}) {
        ThreadPool pool(n_threads);
        AttentionEngine engine(pool);
        EngineRun run = Attend(engine, *cache, seq, 0, q, n_queries, options);
        std::vector<float> mass;
        for (const PageView& view : *pages) mass.push_back(PageTableOf(*cache).mass[view.id]);
        if (n_threads == 1) {
          first = run;
          first_mass = mass;
          continue;
        }
        EXPECT_EQ(std::memcmp(run.out.data(), first.out.data(), run.out.size() * sizeof(float)), 0)
            << n_threads << " threads";
        EXPECT_EQ(std::memcmp(mass.data(), first_mass.data(), mass.size() * sizeof(float)), 0);
        EXPECT_EQ(run.stats.n_tiles, first.stats.n_tiles);
        EXPECT_EQ(run.stats.n_tiles_skipped, first.stats.n_tiles_skipped);
        EXPECT_EQ(run.stats.bytes_read, first.stats.bytes_read);
        EXPECT_EQ(run.stats.skipped_mass_bound, first.stats.skipped_mass_bound);
      }
    }
  }
}

// ---- The engine: attention mass --------------------------------------------------------------

constexpr uint32_t kNoGroup = UINT32_MAX;

// Softmax mass of groups of keys per q head, from the reference itself: values one-hot in the
// group index make output channel c the mass of group c. group(t, kv_head) < head_dim, or
// kNoGroup. Returns [n_q_heads, head_dim].
std::vector<double> ReferenceGroupMass(const CacheGeometry& g, const std::vector<float>& q,
                                       const Dense& kv, const AttentionOptions& options,
                                       const std::function<uint32_t(uint32_t, uint32_t)>& group) {
  Dense onehot = kv;
  std::fill(onehot.v.begin(), onehot.v.end(), 0.0f);
  for (uint32_t t = 0; t < kv.n_tokens; ++t)
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      const uint32_t c = group(t, h);
      if (c != kNoGroup) onehot.v[(size_t{t} * g.n_kv_heads + h) * g.head_dim + c] = 1.0f;
    }
  return Reference(g, q, 1, onehot, options);
}

// After a decode, each page's recorded mass is its reference softmax mass averaged over the q
// heads, and the masses of the pages read sum to 1. A decode with record_mass off changes none.
TEST(AttentionEngine, RecordedPageMassIsTheReferenceSoftmaxMass) {
  const uint32_t page = 16, n_tokens = 5 * page + 3, n_pages = 6;
  const CacheGeometry g = Geometry(8, 2, 64);
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  const Dense input = RandomDense(g, n_tokens, 50);
  Append(*cache, seq, 0, input);
  const Dense held = RoundedToHalf(input);
  auto pages = cache->Pages(seq, 0);
  ASSERT_TRUE(pages.ok());
  ASSERT_EQ(pages->size(), n_pages);
  uint64_t salt = 51;
  for (const AttentionOptions& options : {AttentionOptions{}, AttentionOptions{.sinks = 4},
                                          AttentionOptions{.window = 20, .sinks = 4}}) {
    SCOPED_TRACE("window " + std::to_string(options.window) + ", sinks " +
                 std::to_string(options.sinks));
    std::vector<float> q = testing::RandomValues(g.n_q_heads * g.head_dim, ++salt, 2.0f);
    EngineRun run = Attend(engine, *cache, seq, 0, q, 1, options);
    const std::vector<double> ref =
        ReferenceGroupMass(g, q, held, options, [&](uint32_t t, uint32_t) { return t / page; });
    double sum = 0;
    for (uint32_t p = 0; p < n_pages; ++p) {
      double expected = 0;
      for (uint32_t i = 0; i < g.n_q_heads; ++i) expected += ref[i * g.head_dim + p];
      expected /= g.n_q_heads;
      // Pages outside the window are not read; what they hold is from an earlier call.
      if (options.window != 0 && expected == 0) continue;
      const float mass = PageTableOf(*cache).mass[(*pages)[p].id];
      EXPECT_NEAR(mass, expected, 1e-4) << "page " << p;
      sum += mass;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  std::vector<float> before;
  for (const PageView& view : *pages) before.push_back(PageTableOf(*cache).mass[view.id]);
  std::vector<float> q = testing::RandomValues(g.n_q_heads * g.head_dim, ++salt, 2.0f);
  Attend(engine, *cache, seq, 0, q, 1, {.record_mass = false});
  for (uint32_t p = 0; p < n_pages; ++p)
    EXPECT_EQ(PageTableOf(*cache).mass[(*pages)[p].id], before[p]) << "page " << p;
}

// ---- The engine: certified skipping ----------------------------------------------------------

// Keys of one hot page (and a sink token) align with each group's query direction; the other
// keys are small, so the key summaries prove most pages cold. For each epsilon the reported
// bound is within epsilon, the true mass of the skipped tiles (reference softmax over the
// decoded keys, per q head of the tile's group) is within the bound, the output is within
// 2 * bound * max ||v|| of the exact one (skipping mass mu moves o by mu * (o_kept - o_skipped)),
// and the skipped bytes are the skipped tiles' K and V bytes.
TEST(AttentionEngine, CertifiedSkippingStaysWithinItsProvenBound) {
  const uint32_t page = 16, n_pages = 12, n_tokens = n_pages * page + 4, hot = 5;
  const uint32_t n_kv = 2, gqa = 4, d = 64;
  const CacheGeometry g = Geometry(n_kv * gqa, n_kv, d);
  Dense input = RandomDense(g, n_tokens, 60);
  std::vector<float> q(g.n_q_heads * d);
  for (uint32_t h = 0; h < n_kv; ++h) {
    std::vector<float> dir = testing::RandomValues(d, 61 + h);
    std::vector<float> noise = testing::RandomValues(gqa * d, 63 + h, 0.1f);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      float* k = input.k.data() + (size_t{t} * n_kv + h) * d;
      if (t == 0 || t / page == hot) {
        for (uint32_t c = 0; c < d; ++c) k[c] = 0.8f * dir[c] + 0.25f * k[c];
      } else {
        // Every token of a cold page has the page's key, so the page's summary bound is its
        // exact score and the reported bound can be compared tightly with the true mass.
        std::vector<float> key = testing::RandomValues(d, 100 + t / page * n_kv + h, 0.25f);
        std::copy(key.begin(), key.end(), k);
      }
    }
    for (uint32_t i = 0; i < gqa * d; ++i) q[h * gqa * d + i] = dir[i % d] + noise[i];
  }
  ThreadPool pool(4);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, page);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  Append(*cache, seq, 0, input);
  auto views = cache->Pages(seq, 0);
  ASSERT_TRUE(views.ok());
  auto view_of = [&](PageId id) {
    return std::find_if(views->begin(), views->end(),
                        [&](const PageView& v) { return v.id == id; });
  };
  const Dense stored = ReadBack(*cache, seq, 0);
  std::vector<double> v_max(n_kv, 0.0);
  for (uint32_t t = 0; t < n_tokens; ++t)
    for (uint32_t h = 0; h < n_kv; ++h) {
      const float* v = stored.v.data() + (size_t{t} * n_kv + h) * d;
      v_max[h] = std::max(v_max[h], std::sqrt(std::inner_product(v, v + d, v, 0.0)));
    }

  uint64_t most_skipped = 0;
  // Without masks, and with a window that cuts the hot page in two plus the sink.
  for (const AttentionOptions& mask :
       {AttentionOptions{}, AttentionOptions{.window = 120, .sinks = 1}}) {
    const std::vector<double> ref = Reference(g, q, 1, stored, mask);
    const EngineRun exact = Attend(engine, *cache, seq, 0, q, 1, mask);
    AttentionOptions options = mask;
    options.epsilon = 0;
    const EngineRun zero = Attend(engine, *cache, seq, 0, q, 1, options);
    EXPECT_EQ(std::memcmp(exact.out.data(), zero.out.data(), exact.out.size() * sizeof(float)), 0);
    EXPECT_EQ(zero.stats.n_tiles_skipped, 0u);
    EXPECT_LE(MaxRelError(exact.out, ref, d), kEngineTol);
    uint64_t n_tiles = 0, bytes_all = 0;
    for (const PageView& view : *views) {
      if (!PageIsRead(view, n_tokens - 1, n_tokens - 1, mask)) continue;
      n_tiles += n_kv;
      bytes_all += (view.k_tile_bytes + view.v_tile_bytes) * n_kv;
    }

    for (double epsilon : {1e-4, 1e-3, 1e-2}) {
      SCOPED_TRACE("window " + std::to_string(mask.window) + ", epsilon " +
                   std::to_string(epsilon));
      options.epsilon = epsilon;
      const EngineRun run = Attend(engine, *cache, seq, 0, q, 1, options);
      const AttentionStats& s = run.stats;
      most_skipped = std::max(most_skipped, s.n_tiles_skipped);
      EXPECT_LE(s.skipped_mass_bound, epsilon);
      EXPECT_EQ(s.skipped.size(), s.n_tiles_skipped);
      EXPECT_EQ(s.n_tiles, n_tiles);
      uint64_t bytes_skipped = 0;
      for (const SkippedTile& tile : s.skipped) {
        auto view = view_of(tile.page);
        ASSERT_NE(view, views->end()) << "page " << tile.page;
        bytes_skipped += view->k_tile_bytes + view->v_tile_bytes;
      }
      EXPECT_EQ(s.bytes_skipped, bytes_skipped);
      EXPECT_EQ(s.bytes_read + s.bytes_skipped, bytes_all);

      auto in_skipped_tile = [&](uint32_t t, uint32_t h) {
        for (const SkippedTile& tile : s.skipped) {
          auto view = view_of(tile.page);
          if (tile.kv_head == h && t >= view->first_token && t < view->first_token + view->n_tokens)
            return 0u;
        }
        return kNoGroup;
      };
      const std::vector<double> skipped_mass =
          ReferenceGroupMass(g, q, stored, mask, in_skipped_tile);
      const std::vector<double> errors = RowErrors(run.out, ref, d);
      for (uint32_t i = 0; i < g.n_q_heads; ++i) {
        // The engine proves its bound in float arithmetic: allow it a relative 1e-5.
        EXPECT_LE(skipped_mass[i * d], s.skipped_mass_bound * (1 + 1e-5) + 1e-12) << "head " << i;
        EXPECT_LE(errors[i],
                  2 * s.skipped_mass_bound * v_max[i / gqa] + kEngineTol * Norm(&ref[i * d], d))
            << "head " << i;
      }
    }
  }
  EXPECT_GT(most_skipped, 0u) << "no epsilon skipped a tile: the test proves nothing";

  // A prefill block of more query rows than one kernel call holds: each tile is counted once,
  // and every row stays within the bound.
  const uint32_t n_queries = page + 3;
  std::vector<float> q_block;
  for (uint32_t i = 0; i < n_queries; ++i) q_block.insert(q_block.end(), q.begin(), q.end());
  const EngineRun run = Attend(engine, *cache, seq, 0, q_block, n_queries, {.epsilon = 1e-2});
  const AttentionStats& s = run.stats;
  EXPECT_LE(s.skipped_mass_bound, 1e-2);
  EXPECT_EQ(s.skipped.size(), s.n_tiles_skipped);
  EXPECT_LE(s.n_tiles_skipped, s.n_tiles);
  std::set<std::pair<PageId, uint32_t>> distinct;
  for (const SkippedTile& tile : s.skipped) distinct.insert({tile.page, tile.kv_head});
  EXPECT_EQ(distinct.size(), s.skipped.size()) << "a skipped tile is listed more than once";
  const std::vector<double> ref = Reference(g, q_block, n_queries, stored);
  const std::vector<double> errors = RowErrors(run.out, ref, d);
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_LE(errors[r], 2 * s.skipped_mass_bound * v_max[r % g.n_q_heads / gqa] +
                             kEngineTol * Norm(&ref[r * d], d))
        << "query " << r / g.n_q_heads << ", head " << r % g.n_q_heads;
  }
}

// ---- The engine: errors ----------------------------------------------------------------------

// A NaN or Inf query made every score of its head NaN, absorbed into a plausible output: it is
// an error naming the layer and the query's position.
TEST(AttentionEngine, UnknownSequenceLayerOutOfRangeEmptyLayerAndNonFiniteQueryAreErrors) {
  const CacheGeometry g = Geometry(4, 2, 64, 2);
  ThreadPool pool(1);
  AttentionEngine engine(pool);
  auto cache = MakeCache(g, 16);
  ASSERT_NE(cache, nullptr);
  SeqId seq = NewSequence(*cache);
  Append(*cache, seq, 0, RandomDense(g, 20, 70));
  std::vector<float> q(21 * 4 * 64, 1.0f), out(q.size());  // room for 21 queries
  EXPECT_FALSE(engine.Decode(*cache, seq + 100, 0, q.data(), out.data()).ok());
  EXPECT_FALSE(engine.Decode(*cache, seq, 2, q.data(), out.data()).ok());
  EXPECT_FALSE(engine.Decode(*cache, seq, 1, q.data(), out.data()).ok());  // empty layer
  EXPECT_FALSE(engine.Prefill(*cache, seq, 1, q.data(), 3, out.data()).ok());
  EXPECT_FALSE(engine.Prefill(*cache, seq, 0, q.data(), 21, out.data()).ok());  // > length
  EXPECT_TRUE(engine.Prefill(*cache, seq, 0, q.data(), 3, out.data()).ok());
  q[2 * 4 * 64 + 64 + 5] = std::numeric_limits<float>::infinity();  // query 2, head 1
  auto prefill = engine.Prefill(*cache, seq, 0, q.data(), 3, out.data());
  EXPECT_EQ(prefill.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(prefill.status().message(),
            "attention over layer 0 of sequence " + std::to_string(seq) +
                ": query value inf at position 19, head 1 is not finite");
  q[5] = std::numeric_limits<float>::quiet_NaN();
  auto decode = engine.Decode(*cache, seq, 0, q.data(), out.data());
  EXPECT_EQ(decode.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decode.status().message().find("position 19, head 0"), std::string::npos)
      << decode.status().message();
  ASSERT_TRUE(cache->Release(seq).ok());
  EXPECT_FALSE(engine.Decode(*cache, seq, 0, q.data(), out.data()).ok());
}

}  // namespace
}  // namespace argus
