// The keys-only sketches int1 and jl: their byte layouts, and their score estimators measured
// against exact scores (bias, variance, top-k recall) with bounds derived from theory. Sizes,
// round trips and fused-vs-decode agreement are covered for every codec by
// codec_conformance_test.cc.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus {
namespace {

std::vector<float> Gaussian(size_t n, uint64_t salt) {
  std::mt19937_64 rng(testing::TestSeed() ^ (salt * 0x9e3779b97f4a7c15ull));
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

using testing::Dot;

// The little-endian field of n_bytes (<= 4) at `at`.
uint32_t LoadLe(const std::vector<std::byte>& b, size_t at, size_t n_bytes) {
  uint32_t v = 0;
  for (size_t i = n_bytes; i-- > 0;) v = v << 8 | std::to_integer<uint32_t>(b[at + i]);
  return v;
}

// Keys [tokens, dim] and queries [n_q, dim], scored exactly (double) and through a codec.
struct Scored {
  uint32_t tokens = 0, dim = 0, n_q = 0;
  std::vector<float> k, q;
  std::vector<double> exact;  // [n_q, tokens]
  std::vector<float> sketch;  // [n_q, tokens]
};

Scored Score(const Codec& codec, std::vector<float> k, std::vector<float> q, uint32_t dim) {
  Scored r;
  r.dim = dim;
  r.tokens = static_cast<uint32_t>(k.size() / dim);
  r.n_q = static_cast<uint32_t>(q.size() / dim);
  r.k = std::move(k);
  r.q = std::move(q);
  const TileShape shape{r.tokens, dim};
  const auto tile = testing::EncodeTile(codec, r.k, shape);
  r.sketch.resize(size_t{r.n_q} * r.tokens);
  r.exact.resize(r.sketch.size());
  // kMaxGroupHeads heads per call at most.
  for (uint32_t i0 = 0; i0 < r.n_q; i0 += kMaxGroupHeads) {
    const uint32_t n = std::min(kMaxGroupHeads, r.n_q - i0);
    Status status =
        codec.scores(tile, shape, &r.q[size_t{i0} * dim], n, &r.sketch[size_t{i0} * r.tokens]);
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
  for (uint32_t i = 0; i < r.n_q; ++i) {
    for (uint32_t t = 0; t < r.tokens; ++t) {
      r.exact[size_t{i} * r.tokens + t] = Dot(&r.q[size_t{i} * dim], &r.k[size_t{t} * dim], dim);
    }
  }
  return r;
}

struct ErrorStats {
  double bias = 0;     // mean(s' - s) / rms(s)
  double bias_se = 0;  // its standard error
  double mse = 0;      // mean (s' - s)^2
  double rel_var = 0;  // mse / mean(s^2)
};

ErrorStats Errors(const Scored& r) {
  double sum = 0, sum2 = 0, s2 = 0;
  const double n = static_cast<double>(r.exact.size());
  for (size_t j = 0; j < r.exact.size(); ++j) {
    const double e = r.sketch[j] - r.exact[j];
    sum += e;
    sum2 += e * e;
    s2 += r.exact[j] * r.exact[j];
  }
  ErrorStats st;
  const double rms = std::sqrt(s2 / n), mean = sum / n;
  st.bias = mean / rms;
  st.bias_se = std::sqrt(std::max(0.0, sum2 / n - mean * mean) / n) / rms;
  st.mse = sum2 / n;
  st.rel_var = st.mse / (s2 / n);
  return st;
}

// Mean over queries of |top-k by sketch ∩ top-k exact| / k.
double Recall(const Scored& r, uint32_t k) {
  double total = 0;
  std::vector<uint32_t> a(r.tokens), b(r.tokens);
  for (uint32_t i = 0; i < r.n_q; ++i) {
    const double* exact = &r.exact[size_t{i} * r.tokens];
    const float* sketch = &r.sketch[size_t{i} * r.tokens];
    for (uint32_t t = 0; t < r.tokens; ++t) a[t] = b[t] = t;
    std::partial_sort(a.begin(), a.begin() + k, a.end(),
                      [&](uint32_t x, uint32_t y) { return exact[x] > exact[y]; });
    std::partial_sort(b.begin(), b.begin() + k, b.end(),
                      [&](uint32_t x, uint32_t y) { return sketch[x] > sketch[y]; });
    std::sort(a.begin(), a.begin() + k);
    std::sort(b.begin(), b.begin() + k);
    std::vector<uint32_t> both;
    std::set_intersection(a.begin(), a.begin() + k, b.begin(), b.begin() + k,
                          std::back_inserter(both));
    total += static_cast<double>(both.size()) / k;
  }
  return total / r.n_q;
}

constexpr uint32_t kTokens = 256, kQueries = 256, kDim = 128;

// ---- int1 ------------------------------------------------------------------------------------

TEST(Int1, TileIsScalesThenSignBitsAndDecodesToSignTimesMeanAbs) {
  auto codec = testing::MakeCodec("int1");
  const TileShape shape{2, 10};
  std::vector<float> x = {
      1,     -2,   3,    -4,   0,    5,    -6,   7,    8,    -9,  // mean |x| 4.5
      -0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, -0.5f};
  const auto tile = testing::EncodeTile(*codec, x, shape);
  ASSERT_EQ(tile.size(), 2u * (2 + 2));
  EXPECT_EQ(LoadLe(tile, 0, 2), FloatToHalf(4.5f));
  EXPECT_EQ(LoadLe(tile, 2, 2), FloatToHalf(0.5f));
  // Set bits mark negative values, LSB first; padding bits are zero.
  EXPECT_EQ(std::to_integer<int>(tile[4]), 0b01001010);
  EXPECT_EQ(std::to_integer<int>(tile[5]), 0b10);
  EXPECT_EQ(std::to_integer<int>(tile[6]), 0b00000001);
  EXPECT_EQ(std::to_integer<int>(tile[7]), 0b10);
  std::vector<float> y(x.size());
  ASSERT_TRUE(codec->decode(tile, shape, y.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], (x[i] < 0 ? -1.0f : 1.0f) * (i < 10 ? 4.5f : 0.5f)) << i;
  }
  EXPECT_NEAR(codec->info().bits_per_value, 1.125, 1e-12);  // 16 sign bytes + 2 scale bytes per 128
}

TEST(Int1, NonFiniteKeysAndScalesBeyondFp16AreInvalidArgument) {
  auto codec = testing::MakeCodec("int1");
  const TileShape shape{1, 4};
  std::vector<std::byte> tile(codec->encoded_size(shape).value());
  std::vector<float> x = {1, std::nanf(""), 2, 3};
  EXPECT_EQ(codec->encode(x.data(), shape, tile).code(), StatusCode::kInvalidArgument);
  x = {1e5f, -1e5f, 1e5f, 1e5f};
  EXPECT_EQ(codec->encode(x.data(), shape, tile).code(), StatusCode::kInvalidArgument);
}

// For q = k the sketch gives scale * ||k||_1 = ||k||_1^2 / dim instead of ||k||^2: a shrinkage
// by ||k||_1^2 / (dim ||k||^2), whose mean over Gaussian keys is 2/pi (+ O(1/dim)). int1 scores
// are biased towards zero for queries aligned with the key.
TEST(Int1, ScoreOfAKeyWithItselfShrinksByTwoOverPi) {
  auto codec = testing::MakeCodec("int1");
  auto k = Gaussian(size_t{kTokens} * kDim, 1);
  Scored r = Score(*codec, k, k, kDim);
  double ratio = 0;
  for (uint32_t t = 0; t < kTokens; ++t) {
    ratio += r.sketch[size_t{t} * kTokens + t] / r.exact[size_t{t} * kTokens + t];
  }
  ratio /= kTokens;
  EXPECT_NEAR(ratio, 2 / std::numbers::pi, 0.02);
}

// With queries independent of the keys, E_q[q.(k' - k)] = 0 and E_q[(q.(k' - k))^2] =
// ||k - k'||^2 for unit-variance q; for Gaussian keys ||k - k'||^2 / ||k||^2 -> 1 - 2/pi.
TEST(Int1, ScoresOnIndependentQueriesAreUnbiasedWithErrorOneMinusTwoOverPi) {
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec("int1", path);
    Scored r = Score(*codec, Gaussian(size_t{kTokens} * kDim, 2),
                     Gaussian(size_t{kQueries} * kDim, 3), kDim);
    const ErrorStats e = Errors(r);
    SCOPED_TRACE(std::string(KernelPathName(path)));
    EXPECT_LE(std::fabs(e.bias), 5 * e.bias_se + 1e-3);
    EXPECT_NEAR(e.rel_var, 1 - 2 / std::numbers::pi, 0.15 * (1 - 2 / std::numbers::pi));
    // Top-k recall of a Gaussian pair with correlation sqrt(2/pi) = 0.798, large-N limit:
    // 0.453 (top 1/32) and 0.585 (top 1/8); random choice gives 0.031 and 0.125.
    EXPECT_GE(Recall(r, 8), 0.6 * 0.453);
    EXPECT_GE(Recall(r, 32), 0.6 * 0.585);
  }
}

// ---- jl --------------------------------------------------------------------------------------

uint64_t SplitMix64(uint64_t state) {
  uint64_t z = state + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The projection is the documented one: R[j][d] = -+1/sqrt(r), negative when the top bit of
// SplitMix64(seed << 32 | j << 16 | d) is set; a basis vector e_d encodes to column d of R.
TEST(Jl, TileHoldsTheDocumentedProjectionOfEachKey) {
  auto codec = testing::MakeCodec("jl");
  const uint32_t dim = kDim, r = kDim / 8;
  std::vector<float> identity(size_t{dim} * dim);
  for (uint32_t d = 0; d < dim; ++d) identity[size_t{d} * dim + d] = 1;
  const auto tile = testing::EncodeTile(*codec, identity, {dim, dim});
  ASSERT_EQ(tile.size(), 8 + size_t{dim} * r * 2);
  const uint32_t seed = LoadLe(tile, 0, 4);
  EXPECT_EQ(LoadLe(tile, 4, 4), r | dim << 16);
  for (uint32_t d = 0; d < dim; ++d) {
    for (uint32_t j = 0; j < r; ++j) {
      const bool negative = SplitMix64(uint64_t{seed} << 32 | uint64_t{j} << 16 | d) >> 63;
      const size_t at = 8 + (size_t{d} * r + j) * 2;
      const uint16_t h = static_cast<uint16_t>(LoadLe(tile, at, 2));
      ASSERT_EQ(HalfToFloat(h), negative ? -0.25f : 0.25f) << "row " << j << " column " << d;
    }
  }
  EXPECT_NEAR(codec->info().bits_per_value, 2.0 + 64.0 / (256 * 128), 1e-12);
}

TEST(Jl, HeaderThatDisagreesWithTheTileIsCorruption) {
  auto codec = testing::MakeCodec("jl");
  const TileShape shape{5, 64};
  const auto good = testing::EncodeTile(*codec, Gaussian(shape.n_values(), 4), shape);
  std::vector<float> out(shape.n_values()), q(64, 1.0f), s(5);
  for (size_t at : {0, 3, 4, 6}) {  // seed (low and high byte), r, dim
    auto bad = good;
    bad[at] ^= std::byte{1};
    Status d = codec->decode(bad, shape, out.data());
    EXPECT_EQ(d.code(), StatusCode::kCorruption) << at;
    EXPECT_EQ(codec->scores(bad, shape, q.data(), 1, s.data()).code(), StatusCode::kCorruption)
        << at;
    EXPECT_FALSE(d.message().empty()) << at;
  }
  // A 64-dim tile is not a 60-dim one, although r and so the sizes agree.
  EXPECT_EQ(codec->decode(good, {5, 60}, out.data()).code(), StatusCode::kCorruption);
}

TEST(Jl, NonFiniteKeysAreInvalidArgument) {
  auto codec = testing::MakeCodec("jl");
  const TileShape shape{1, 8};
  std::vector<std::byte> tile(codec->encoded_size(shape).value());
  std::vector<float> x(8, 1.0f);
  x[3] = INFINITY;
  EXPECT_EQ(codec->encode(x.data(), shape, tile).code(), StatusCode::kInvalidArgument);
}

// decode(e_d) = R^T R e_d exactly (entries of R are +-1/4 at dim 128, exact in fp16), so the
// decoded identity is R^T R: its diagonal is exactly 1 and each off-diagonal entry is a mean of
// r independent +-1, with variance 1/r. Hence E[R^T R] = I: the estimator is unbiased.
TEST(Jl, ProjectionGramHasUnitDiagonalAndOffDiagonalVarianceOneOverR) {
  auto codec = testing::MakeCodec("jl");
  const uint32_t dim = kDim, r = kDim / 8;
  std::vector<float> identity(size_t{dim} * dim);
  for (uint32_t d = 0; d < dim; ++d) identity[size_t{d} * dim + d] = 1;
  const auto tile = testing::EncodeTile(*codec, identity, {dim, dim});
  std::vector<float> gram(identity.size());
  ASSERT_TRUE(codec->decode(tile, {dim, dim}, gram.data()).ok());
  double off2 = 0, off = 0;
  for (uint32_t a = 0; a < dim; ++a) {
    for (uint32_t b = 0; b < dim; ++b) {
      const double g = gram[size_t{a} * dim + b];
      if (a == b) {
        ASSERT_EQ(g, 1.0);
      } else {
        ASSERT_EQ(g, gram[size_t{b} * dim + a]);
        off += g;
        off2 += g * g;
      }
    }
  }
  const double n_off = static_cast<double>(dim) * (dim - 1);
  EXPECT_NEAR(off / n_off, 0, 4 * std::sqrt(1.0 / r / n_off * dim));  // rows are shared: generous
  EXPECT_NEAR(off2 / n_off, 1.0 / r, 0.1 / r);
}

// For a Rademacher R with entries +-1/sqrt(r), (Rq).(Rk) is unbiased with variance
// (||q||^2 ||k||^2 + (q.k)^2 - 2 sum_d q_d^2 k_d^2) / r. Measured over independent Gaussian keys
// and queries with one fixed R, at three dims (r = dim / 8).
TEST(Jl, ScoresAreUnbiasedWithTheRademacherVariance) {
  auto codec = testing::MakeCodec("jl");
  for (uint32_t dim : {64u, 128u, 256u}) {
    const uint32_t r = dim / 8;
    Scored sc = Score(*codec, Gaussian(size_t{kTokens} * dim, 5 + dim),
                      Gaussian(size_t{kQueries} * dim, 6 + dim), dim);
    double predicted = 0;
    for (uint32_t i = 0; i < sc.n_q; ++i) {
      const float* q = &sc.q[size_t{i} * dim];
      for (uint32_t t = 0; t < sc.tokens; ++t) {
        const float* k = &sc.k[size_t{t} * dim];
        double qq = Dot(q, q, dim), kk = Dot(k, k, dim), qk = Dot(q, k, dim), cross = 0;
        for (uint32_t d = 0; d < dim; ++d) cross += double{q[d]} * q[d] * k[d] * k[d];
        predicted += (qq * kk + qk * qk - 2 * cross) / r;
      }
    }
    predicted /= static_cast<double>(sc.exact.size());
    const ErrorStats e = Errors(sc);
    SCOPED_TRACE("dim " + std::to_string(dim));
    EXPECT_LE(std::fabs(e.bias), 5 * e.bias_se + 1e-3);
    EXPECT_NEAR(e.mse / predicted, 1.0, 0.2);
  }
}

// For isotropic keys the estimator's error (variance ~ dim/r times the score variance) swamps
// the spread of the scores: the correlation is 1/sqrt(1 + (dim-1)/r) = 0.334 at dim 128, and a
// Gaussian pair of that correlation has top-k recall 0.121 (top 1/32) and 0.264 (top 1/8) in
// the large-N limit, against 0.031 and 0.125 at random.
TEST(Jl, TopKRecallOnIsotropicKeysMatchesItsCorrelation) {
  auto codec = testing::MakeCodec("jl");
  Scored r = Score(*codec, Gaussian(size_t{kTokens} * kDim, 7),
                   Gaussian(size_t{kQueries} * kDim, 8), kDim);
  EXPECT_GE(Recall(r, 8), 0.6 * 0.121);
  EXPECT_GE(Recall(r, 32), 0.6 * 0.264);
}

// The conformance shapes have dims that are multiples of 8; the kernels also handle tails of 1
// to 7 channels and r not a multiple of 4. The AVX2 jl projection adds in the scalar order, so
// both paths encode identical bytes; scores agree within the stated fused_rel_error.
TEST(Sketch, VectorPathsMatchScalarAtOddDims) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  for (const char* spec : {"int1", "jl"}) {
    auto scalar = testing::MakeCodec(spec, KernelPath::kScalar),
         vector = testing::MakeCodec(spec, KernelPath::kAvx2);
    for (uint32_t dim : {1u, 2u, 7u, 9u, 13u, 31u, 100u, 1023u, kMaxTileDim}) {
      SCOPED_TRACE(std::string(spec) + " dim " + std::to_string(dim));
      const TileShape shape{37, dim};
      const uint32_t n_q = 5;
      auto x = testing::RandomValues(shape.n_values(), dim);
      auto q = testing::RandomValues(size_t{n_q} * dim, dim + 1);
      const auto tile = testing::EncodeTile(*scalar, x, shape);
      ASSERT_EQ(tile, testing::EncodeTile(*vector, x, shape));
      std::vector<float> decoded(shape.n_values()), a(size_t{n_q} * shape.tokens), b(a.size());
      ASSERT_TRUE(scalar->decode(tile, shape, decoded.data()).ok());
      ASSERT_TRUE(scalar->scores(tile, shape, q.data(), n_q, a.data()).ok());
      ASSERT_TRUE(vector->scores(tile, shape, q.data(), n_q, b.data()).ok());
      for (uint32_t i = 0; i < n_q; ++i) {
        const float* qi = &q[size_t{i} * dim];
        for (uint32_t t = 0; t < shape.tokens; ++t) {
          const float* kt = &decoded[size_t{t} * dim];
          const double bound =
              2 * scalar->info().fused_rel_error * std::sqrt(Dot(qi, qi, dim) * Dot(kt, kt, dim));
          ASSERT_LE(std::fabs(a[size_t{i} * shape.tokens + t] - b[size_t{i} * shape.tokens + t]),
                    bound)
              << "head " << i << " token " << t;
        }
      }
    }
  }
}

// Both sketches on GenerateSyntheticKv keys and queries (the structure real models show: channel
// means, outlier channels, a sink, a few relevant tokens). What theory guarantees here is only
// that a positively correlated estimator beats random choice at every k. (With one
// fixed R, jl's error q^T (R^T R - I) k has a nonzero mean over keys that share a large mean:
// jl is unbiased over the choice of R, not for every R and every key distribution.)
TEST(Sketch, EstimatorsOnSyntheticKv) {
  for (const char* spec : {"int1", "jl"}) {
    auto codec = testing::MakeCodec(spec);
    for (KeyRegime regime :
         {KeyRegime::kIsotropic, KeyRegime::kModerateOutliers, KeyRegime::kHeavyOutliers}) {
      // One context per seed, scored together: every context has its own keys.
      Scored all;
      for (uint64_t seed = 1; seed <= 16; ++seed) {
        SyntheticKvOptions options;
        options.regime = regime;
        options.dim = kDim;
        options.seed = testing::TestSeed() + seed;
        SyntheticKv kv = GenerateSyntheticKv(options, kTokens);
        Scored one = Score(*codec, kv.k, kv.q, kDim);
        all.tokens = one.tokens;
        all.dim = kDim;
        all.n_q += one.n_q;
        all.exact.insert(all.exact.end(), one.exact.begin(), one.exact.end());
        all.sketch.insert(all.sketch.end(), one.sketch.begin(), one.sketch.end());
      }
      EXPECT_GT(Recall(all, 8), 8.0 / kTokens) << spec << " " << KeyRegimeName(regime);
      EXPECT_GT(Recall(all, 32), 32.0 / kTokens) << spec << " " << KeyRegimeName(regime);
    }
  }
}

}  // namespace
}  // namespace argus
