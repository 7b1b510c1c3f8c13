// AVX-512 softmax row kernels: exp by core/exp_avx512.h, tails through masked lanes (so a row's
// values do not depend on where it ends).

#include <cmath>

#include "attention/softmax.h"
#include "core/avx512.h"
#include "core/exp_avx512.h"

namespace argus::attention_internal {

using avx512::Exp16;

float MaxAvx512(const float* x, size_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (size_t i = 0; i < n; i += 16)
    m = _mm512_mask_max_ps(m, FirstLanes(n - i), m,
                           _mm512_maskz_loadu_ps(FirstLanes(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}

float ExpSumAvx512(float* x, size_t n, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = FirstLanes(n - i);
    const __m512 y = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), vm));
    _mm512_mask_storeu_ps(x + i, lanes, y);
    sum = _mm512_mask_add_ps(sum, lanes, sum, y);
  }
  return _mm512_reduce_add_ps(sum);
}

void ScaleAvx512(float* acc, size_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = FirstLanes(n - i);
    _mm512_mask_storeu_ps(acc + i, lanes, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, acc + i), f));
  }
}

}  // namespace argus::attention_internal
