#include "attention/softmax.h"

#include <cmath>
#include <limits>

#include "argus/core.h"

namespace argus::attention_internal {
namespace {

float MaxScalar(const float* x, size_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float ExpSumScalar(float* x, size_t n, float m) {
  float sum = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  return sum;
}

void ScaleScalar(float* acc, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) acc[i] *= factor;
}

}  // namespace

const SoftmaxKernels& ScalarSoftmaxKernels() {
  static const SoftmaxKernels kernels{MaxScalar, ExpSumScalar, ScaleScalar};
  return kernels;
}

const SoftmaxKernels& BestSoftmaxKernels() {
  static const SoftmaxKernels avx2{MaxAvx2, ExpSumAvx2, ScaleAvx2};
  return GetCpuFeatures().avx2_kernels() ? avx2 : ScalarSoftmaxKernels();
}

}  // namespace argus::attention_internal
