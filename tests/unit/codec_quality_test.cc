// The synthetic KV generator and MeasureQuality, against direct computation.
#include <cmath>

#include "argus/codec.h"
#include "argus/core.h"
#include "argus/eval.h"
#include "test_util.h"

namespace argus {
namespace {

TEST(SyntheticKv, SameSeedSameValuesOtherSeedOtherValues) {
  SyntheticKvOptions o{.regime = KeyRegime::kHeavyOutliers, .dim = 64, .n_q = 4, .seed = 7};
  SyntheticKv a = GenerateSyntheticKv(o, 300), b = GenerateSyntheticKv(o, 300);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
  EXPECT_EQ(a.q, b.q);
  o.seed = 8;
  EXPECT_NE(GenerateSyntheticKv(o, 300).k, a.k);
  EXPECT_EQ(a.k.size(), 300u * 64);
  EXPECT_EQ(a.q.size(), 4u * 64);
}

// Largest |channel mean| / median channel std of the keys: the heavy regime's outlier
// channels carry large means, the isotropic regime's do not.
double OutlierMeanRatio(const SyntheticKv& kv) {
  std::vector<double> mean(kv.dim), sd(kv.dim);
  for (uint32_t c = 0; c < kv.dim; ++c) {
    double s = 0, s2 = 0;
    for (uint32_t t = 1; t < kv.tokens; ++t) {
      double x = kv.k[size_t{t} * kv.dim + c];
      s += x;
      s2 += x * x;
    }
    mean[c] = s / (kv.tokens - 1);
    sd[c] = std::sqrt(s2 / (kv.tokens - 1) - mean[c] * mean[c]);
  }
  std::vector<double> sorted = sd;
  std::nth_element(sorted.begin(), sorted.begin() + kv.dim / 2, sorted.end());
  double max_mean = 0;
  for (double m : mean) max_mean = std::max(max_mean, std::fabs(m));
  return max_mean / sorted[kv.dim / 2];
}

TEST(SyntheticKv, RegimesHaveTheirDocumentedStructure) {
  SyntheticKvOptions o{.dim = 128, .n_q = 4, .seed = testing::TestSeed()};
  o.regime = KeyRegime::kIsotropic;
  EXPECT_LT(OutlierMeanRatio(GenerateSyntheticKv(o, 2048)), 3.0);
  o.regime = KeyRegime::kHeavyOutliers;
  EXPECT_GT(OutlierMeanRatio(GenerateSyntheticKv(o, 2048)), 15.0);
}

// Token 0 is a sink: with the generator's queries it takes a large share of attention.
TEST(SyntheticKv, SinkTakesALargeShareOfAttention) {
  SyntheticKvOptions o{.dim = 128, .n_q = 4, .seed = testing::TestSeed()};
  SyntheticKv kv = GenerateSyntheticKv(o, 1024);
  for (uint32_t i = 0; i < kv.n_q; ++i) {
    std::vector<double> s(kv.tokens);
    double m = -1e300;
    for (uint32_t t = 0; t < kv.tokens; ++t) {
      double dot = 0;
      for (uint32_t c = 0; c < kv.dim; ++c)
        dot += double{kv.q[i * kv.dim + c]} * kv.k[size_t{t} * kv.dim + c];
      s[t] = dot / std::sqrt(128.0);
      m = std::max(m, s[t]);
    }
    double z = 0;
    for (double x : s) z += std::exp(x - m);
    EXPECT_GT(std::exp(s[0] - m) / z, 0.2) << "head " << i;
  }
}

TEST(MeasureQuality, ExactCodecHasOnlyFloatRoundingError) {
  auto f32 = std::move(CodecRegistry::Default().Create("f32")).value();
  SyntheticKv kv = GenerateSyntheticKv({.dim = 64, .n_q = 4, .seed = 3}, 700);
  auto q = MeasureQuality(*f32, *f32, kv, 256);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->k_rel_rmse, 0.0);
  EXPECT_EQ(q->v_rel_rmse, 0.0);
  EXPECT_LT(q->logit_max_abs, 1e-4);
  EXPECT_LT(q->out_rel_err, 1e-5);
  EXPECT_LT(q->kl, 1e-9);
  EXPECT_GE(q->kl, -1e-12);
}

// f16 keys: the logit error MeasureQuality reports equals the one computed here directly.
TEST(MeasureQuality, LogitErrorMatchesDirectComputation) {
  auto f16 = std::move(CodecRegistry::Default().Create("f16")).value();
  auto f32 = std::move(CodecRegistry::Default().Create("f32")).value();
  SyntheticKv kv = GenerateSyntheticKv(
      {.regime = KeyRegime::kModerateOutliers, .dim = 64, .n_q = 2, .seed = 5}, 300);
  auto q = MeasureQuality(*f16, *f32, kv, 128);
  ASSERT_TRUE(q.ok());
  double max_abs = 0;
  for (uint32_t i = 0; i < kv.n_q; ++i) {
    for (uint32_t t = 0; t < kv.tokens; ++t) {
      double exact = 0, rounded = 0;
      for (uint32_t c = 0; c < kv.dim; ++c) {
        double qc = kv.q[i * kv.dim + c];
        exact += qc * kv.k[size_t{t} * kv.dim + c];
        rounded += qc * HalfToFloat(FloatToHalf(kv.k[size_t{t} * kv.dim + c]));
      }
      max_abs = std::max(max_abs, std::fabs(rounded - exact) / 8.0);
    }
  }
  EXPECT_NEAR(q->logit_max_abs, max_abs, 1e-4 + 0.01 * max_abs);
  EXPECT_GT(q->k_rel_rmse, 1e-5);
  EXPECT_LT(q->k_rel_rmse, 1e-3);
  EXPECT_EQ(q->v_rel_rmse, 0.0);
}

TEST(MeasureQuality, KeysOnlyValuesCodecIsAnError) {
  auto f16 = std::move(CodecRegistry::Default().Create("f16")).value();
  SyntheticKv kv = GenerateSyntheticKv({.dim = 64, .n_q = 2}, 64);
  EXPECT_FALSE(MeasureQuality(*f16, *f16, kv, 0).ok());
}

}  // namespace
}  // namespace argus
