// AVX2 softmax row kernels. exp is Cephes' expf: x = n ln2 + r with a two-constant Cody-Waite
// split, |r| <= ln2/2, and a degree-6 polynomial for e^r (relative error about 1 ulp), scaled by
// 2^n through the exponent field. Arguments below -87.3 (e^x under float's normal range,
// including the -inf of masked scores) give exactly 0.
#include <immintrin.h>

#include <cmath>

#include "attention/softmax.h"
#include "core/avx2_reduce.h"

namespace argus::attention_internal {
namespace {

using avx2::HorizontalMax;
using avx2::HorizontalSum;

inline __m256 Exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, y);
}

}  // namespace

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
