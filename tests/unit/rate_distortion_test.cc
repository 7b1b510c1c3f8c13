// The rate-distortion reference against the closed forms of Cover & Thomas 10.3.3.
#include "eval/rate_distortion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/splitmix.h"

namespace argus {
namespace {

TEST(RateDistortion, OneGaussianLosesAQuarterOfItsVariancePerBit) {
  const ReverseWaterFilling one({2.0}, 1);
  for (double bits : {0.5, 1.0, 3.0, 6.0}) {
    EXPECT_NEAR(one.Distortions(bits)[0], 2.0 * std::exp2(-2.0 * bits), 1e-12);
  }
}

TEST(RateDistortion, WaterFillingGivesNarrowColumnsNoBits) {
  const std::vector<double> variances = {4.0, 1.0, 0.25};
  const ReverseWaterFilling filling(variances, variances.size());
  // One bit a value: three bits in all; theta^3 = 4 * 1 * 0.25 / 2^6, so theta = 0.25 and the
  // narrowest column is just out of the water.
  for (double d : filling.Distortions(1.0)) EXPECT_NEAR(d, 0.25, 1e-9);
  // Half a bit a value: the narrowest keeps its variance; (4 / theta)(1 / theta) = 2^3.
  const std::vector<double> half = filling.Distortions(0.5);
  EXPECT_NEAR(half[0], std::sqrt(0.5), 1e-9);
  EXPECT_NEAR(half[1], std::sqrt(0.5), 1e-9);
  EXPECT_DOUBLE_EQ(half[2], 0.25);
  // No bits: every column its variance.
  EXPECT_EQ(filling.Distortions(0.0), variances);
}

TEST(RateDistortion, WeightsMoveBitsToTheValuesThatCount) {
  // Equal variances, weights 4 and 1, two bits in all: w D = theta on both, (4 / theta)(1 /
  // theta) = 2^4, theta = 1/2: rates 1.5 and 0.5 bits; sum of w D is 1 against 1.25 for D = 1/4 on
  // both (one bit each).
  const std::vector<double> d = ReverseWaterFilling({1.0}, 2, {4.0, 1.0}).Distortions(1.0);
  EXPECT_NEAR(d[0], 0.125, 1e-12);
  EXPECT_NEAR(d[1], 0.5, 1e-12);
  // A value of no weight gets no bits; the other takes both: 2^-4.
  const std::vector<double> z = ReverseWaterFilling({1.0}, 2, {0.0, 1.0}).Distortions(1.0);
  EXPECT_DOUBLE_EQ(z[0], 1.0);
  EXPECT_NEAR(z[1], 0.0625, 1e-12);
}

TEST(RateDistortion, TheTestChannelReachesTheDistortionWithAnErrorIndependentOfItsOutput) {
  constexpr size_t kRows = 200000, kCols = 2;
  const double sigma[kCols] = {3.0, 0.5}, mu[kCols] = {1.0, -2.0};
  SplitMix64 rng(11);
  std::vector<float> x(kRows * kCols);
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t c = 0; c < kCols; ++c) x[r * kCols + c] = mu[c] + sigma[c] * rng.Normal();
  }
  std::vector<float> coded = x;
  constexpr double kBits = 1.5;
  const ColumnStatistics columns(x, kCols);
  EXPECT_NEAR(columns.variance[0], 9.0, 0.1);
  EXPECT_NEAR(columns.variance[1], 0.25, 0.003);
  const std::vector<double> distortion =
      ReverseWaterFilling({9.0, 0.25}, kRows * kCols).Distortions(kBits);
  ApplyRateDistortionChannel(coded, columns, distortion, 5);
  const std::vector<double> d = {distortion[0], distortion[1]};
  for (size_t c = 0; c < kCols; ++c) {
    double mse = 0, error_dot_output = 0, mean_out = 0;
    for (size_t r = 0; r < kRows; ++r) mean_out += coded[r * kCols + c];
    mean_out /= kRows;
    for (size_t r = 0; r < kRows; ++r) {
      const double e = double{x[r * kCols + c]} - coded[r * kCols + c];
      mse += e * e;
      error_dot_output += e * (coded[r * kCols + c] - mean_out);
    }
    mse /= kRows;
    EXPECT_NEAR(mse / d[c], 1.0, 0.02) << "column " << c;
    // Independent: the error's covariance with the output is zero, to sampling noise.
    EXPECT_LT(std::abs(error_dot_output / kRows) / d[c], 0.02) << "column " << c;
    EXPECT_NEAR(mean_out, mu[c], 0.02);
  }
}

}  // namespace
}  // namespace argus
