// AVX2 softmax row kernels, exp by core/exp_avx2.h (exactly 0 for the -inf of masked scores).
#include <immintrin.h>

#include <cmath>

#include "attention/softmax.h"
#include "core/avx2_reduce.h"
#include "core/exp_avx2.h"

namespace argus::attention_internal {

using avx2::Exp8;
using avx2::HorizontalMax;
using avx2::HorizontalSum;

float MaxAvx2(const float* x, size_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  float result = HorizontalMax(m);
  for (; i < n; ++i) result = x[i] > result ? x[i] : result;
  return result;
}

float ExpSumAvx2(float* x, size_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 y = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, y);
    sum = _mm256_add_ps(sum, y);
  }
  if (i < n) {
    // The tail through the same polynomial, so a row's values do not depend on where it ends.
    alignas(32) float tail[8];
    for (size_t j = 0; j < 8; ++j) tail[j] = i + j < n ? x[i + j] : -INFINITY;
    __m256 y = Exp8(_mm256_sub_ps(_mm256_load_ps(tail), vm));
    _mm256_store_ps(tail, y);
    sum = _mm256_add_ps(sum, y);
    for (size_t j = 0; i + j < n; ++j) x[i + j] = tail[j];
  }
  return HorizontalSum(sum);
}

void ScaleAvx2(float* acc, size_t n, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), f));
  for (; i < n; ++i) acc[i] *= factor;
}

}  // namespace argus::attention_internal
