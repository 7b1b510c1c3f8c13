#include "attention/softmax.h"

#include <cmath>
#include <limits>

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

const SoftmaxKernels& SoftmaxKernelsFor(KernelPath path) {
  static const SoftmaxKernels scalar{MaxScalar, ExpSumScalar, ScaleScalar};
  static const SoftmaxKernels avx2{MaxAvx2, ExpSumAvx2, ScaleAvx2};
  static const SoftmaxKernels avx512{MaxAvx512, ExpSumAvx512, ScaleAvx512};
  switch (path) {
    case KernelPath::kAvx512:
      return avx512;
    case KernelPath::kAvx2:
      return avx2;
    case KernelPath::kScalar:
      break;
  }
  return scalar;
}

const SoftmaxKernels& BestSoftmaxKernels() { return SoftmaxKernelsFor(BestKernelPath()); }

}  // namespace argus::attention_internal
