// Row kernels of the online softmax: the maximum of a score row, and exponentiation with the
// row sum. Not a public header. The scalar versions in softmax.cc are the specification; the
// AVX2 and AVX-512 versions (softmax_avx2.cc, softmax_avx512.cc) agree with them to within 2 ulp
// of float.
#pragma once

#include <cstddef>

#include "argus/codec.h"

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

// The kernels of `path`. REQUIRES: path <= BestKernelPath().
const SoftmaxKernels& SoftmaxKernelsFor(KernelPath path);
// Those of BestKernelPath(): the widest the CPU has, within the environment's limits.
const SoftmaxKernels& BestSoftmaxKernels();

float MaxAvx2(const float* x, size_t n);
float ExpSumAvx2(float* x, size_t n, float m);
void ScaleAvx2(float* acc, size_t n, float factor);
float MaxAvx512(const float* x, size_t n);
float ExpSumAvx512(float* x, size_t n, float m);
void ScaleAvx512(float* acc, size_t n, float factor);

}  // namespace argus::attention_internal
