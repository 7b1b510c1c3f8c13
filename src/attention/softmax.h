// Row kernels of the online softmax: the maximum of a score row, and exponentiation with the
// row sum. Not a public header. The scalar versions in softmax.cc are the specification; the
// AVX2 versions (softmax_avx2.cc) agree with them to within 2 ulp of float.
#pragma once

#include <cstddef>

namespace argus::attention_internal {

struct SoftmaxKernels {
  // max of x[0..n), -inf for n == 0 or an all -inf row.
  float (*max)(const float* x, size_t n);
  // x[i] = exp(x[i] - m) (exactly 0 where x[i] is -inf, a masked score); returns the sum of the
  // new x. REQUIRES: m finite and m >= every x[i].
  float (*exp_sum)(float* x, size_t n, float m);
  // acc[i] *= factor.
  void (*scale)(float* acc, size_t n, float factor);
};

// AVX2 when the CPU has it (and ARGUS_FORCE_SCALAR is unset), else scalar.
const SoftmaxKernels& BestSoftmaxKernels();
const SoftmaxKernels& ScalarSoftmaxKernels();

// AVX2 versions.
float MaxAvx2(const float* x, size_t n);
float ExpSumAvx2(float* x, size_t n, float m);
void ScaleAvx2(float* acc, size_t n, float factor);

}  // namespace argus::attention_internal
