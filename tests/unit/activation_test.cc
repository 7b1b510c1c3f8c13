// The feed-forward gate kernels (model/activation.h) against double precision and each other.
#include "model/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

namespace argus::model {
namespace {

double SiluMulReference(float g, float up) {
  return double{g} / (1.0 + std::exp(-double{g})) * double{up};
}

// What the vector kernels may flush to zero below g = -87.3: |g| e^g |up| is at most this there.
double FlushedBound(float up) { return 1.1e-36 * std::fabs(double{up}); }

std::vector<float> Gated(KernelPath path, std::vector<float> gate, const std::vector<float>& up) {
  SiluMul(path, gate.data(), up.data(), gate.size());
  return gate;
}

TEST(Activation, SiluMulMatchesDoubleOnEveryPath) {
  for (KernelPath path : testing::KernelPaths()) {
    for (size_t n : {1, 7, 8, 9, 15, 16, 17, 100, 4864}) {
      const std::vector<float> gate = testing::RandomValues(n, n, 12.0f);
      const std::vector<float> up = testing::RandomValues(n, n + 1);
      const std::vector<float> y = Gated(path, gate, up);
      for (size_t i = 0; i < n; ++i) {
        const double ref = SiluMulReference(gate[i], up[i]);
        // exp's ulp, the division's and two products' roundings: 3 ulp of 2^-23.
        EXPECT_NEAR(y[i], ref, 3.6e-7 * std::fabs(ref) + FlushedBound(up[i]))
            << KernelPathName(path) << " n=" << n << " g=" << gate[i] << " up=" << up[i];
      }
    }
  }
}

TEST(Activation, VectorPathsAgreeWithTheScalarSpecification) {
  const size_t n = 4864;
  const std::vector<float> gate = testing::RandomValues(n, 7, 30.0f);
  const std::vector<float> up = testing::RandomValues(n, 8);
  const std::vector<float> spec = Gated(KernelPath::kScalar, gate, up);
  for (KernelPath path : testing::KernelPaths()) {
    const std::vector<float> y = Gated(path, gate, up);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(y[i], spec[i], 4.8e-7 * std::fabs(spec[i]) + FlushedBound(up[i]))
          << KernelPathName(path) << " g=" << gate[i];
    }
  }
}

// Each value depends on its own inputs only, wherever it sits in a call: the model splits a
// batch's rows over threads and relies on it.
TEST(Activation, AValueDoesNotDependOnWhereItsCallEnds) {
  const size_t n = 37;
  const std::vector<float> gate = testing::RandomValues(n, 3, 10.0f);
  const std::vector<float> up = testing::RandomValues(n, 4);
  for (KernelPath path : testing::KernelPaths()) {
    const std::vector<float> all = Gated(path, gate, up);
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float> alone = Gated(path, {gate[i]}, {up[i]});
      EXPECT_EQ(alone[0], all[i]) << KernelPathName(path) << " i=" << i;
    }
  }
}

TEST(Activation, ExtremeGatesGiveTheLimitsNotGarbage) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> gate = {0.0f,   -0.0f,  1e-30f, -1e-30f, 20.0f,  -20.0f, 87.0f,
                                   -87.0f, 88.0f,  -88.0f, 89.0f,   -89.0f, 100.0f, -100.0f,
                                   1e30f,  -1e30f, 3e38f,  -3e38f,  kInf};
  const std::vector<float> up(gate.size(), 2.0f);
  for (KernelPath path : testing::KernelPaths()) {
    const std::vector<float> y = Gated(path, gate, up);
    for (size_t i = 0; i < gate.size(); ++i) {
      const double ref = SiluMulReference(gate[i], up[i]);
      if (gate[i] > 80.0f) {
        EXPECT_EQ(y[i], 2.0f * gate[i]) << KernelPathName(path) << " g=" << gate[i];
      } else {
        EXPECT_NEAR(y[i], ref, 3.6e-7 * std::fabs(ref) + FlushedBound(up[i]))
            << KernelPathName(path) << " g=" << gate[i];
      }
    }
    const std::vector<float> nan = Gated(path, {std::nanf("")}, {1.0f});
    EXPECT_TRUE(std::isnan(nan[0])) << KernelPathName(path);
  }
}

}  // namespace
}  // namespace argus::model
