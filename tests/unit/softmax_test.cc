// The online-softmax row kernels against double precision.
#include "attention/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

namespace argus {
namespace {

using attention_internal::SoftmaxKernels;
using attention_internal::SoftmaxKernelsFor;

// Every path the machine has.
std::vector<const SoftmaxKernels*> AllKernels() {
  std::vector<const SoftmaxKernels*> kernels;
  for (KernelPath path : testing::KernelPaths()) kernels.push_back(&SoftmaxKernelsFor(path));
  return kernels;
}

TEST(Softmax, ExpSumMatchesDoubleWithinTwoUlp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (const SoftmaxKernels* k : AllKernels()) {
    for (size_t n : {1, 7, 8, 9, 15, 16, 17, 31, 256, 1000}) {
      std::vector<float> x = testing::RandomValues(n, n, 8.0f);
      if (n > 1) x[n / 2] = kNegInf;  // a masked score (not all: m must be finite)
      float m = k->max(x.data(), n);
      double m_ref = -INFINITY;
      for (float v : x) m_ref = std::max(m_ref, double{v});
      ASSERT_EQ(m, m_ref) << "n=" << n;
      std::vector<float> y = x;
      float sum = k->exp_sum(y.data(), n, m);
      double sum_ref = 0;
      for (size_t i = 0; i < n; ++i) {
        double e = std::exp(double{x[i] - m});  // the kernel's argument, rounded to float
        sum_ref += e;
        if (x[i] == kNegInf) {
          EXPECT_EQ(y[i], 0.0f) << "masked score must give exactly 0";
        } else if (e > 1e-30) {
          EXPECT_NEAR(y[i], e, 2.5e-7 * e) << "n=" << n << " i=" << i << " x-m=" << x[i] - m;
        }
      }
      EXPECT_NEAR(sum, sum_ref, 1e-6 * sum_ref * std::sqrt(double(n))) << "n=" << n;
    }
  }
}

TEST(Softmax, VeryNegativeArgumentsUnderflowToZeroNotGarbage) {
  for (const SoftmaxKernels* k : AllKernels()) {
    std::vector<float> x = {0.0f, -80.0f, -87.0f, -88.0f, -100.0f, -1e30f, -3e38f, -1.0f, -0.5f};
    std::vector<float> y = x;
    float sum = k->exp_sum(y.data(), y.size(), 0.0f);
    for (size_t i = 0; i < x.size(); ++i) {
      double e = std::exp(double{x[i]});
      EXPECT_GE(y[i], 0.0f);
      EXPECT_NEAR(y[i], e, 2.5e-7 * e + 1.2e-38) << "x=" << x[i];
    }
    EXPECT_NEAR(sum, 1.0 + std::exp(-1.0) + std::exp(-0.5), 1e-6);
  }
}

TEST(Softmax, ScaleMultipliesEveryElement) {
  for (const SoftmaxKernels* k : AllKernels()) {
    std::vector<float> acc = testing::RandomValues(37, 3);
    std::vector<float> expected = acc;
    for (float& v : expected) v *= 0.375f;
    k->scale(acc.data(), acc.size(), 0.375f);
    EXPECT_EQ(acc, expected);
  }
}

}  // namespace
}  // namespace argus
