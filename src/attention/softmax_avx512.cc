// AVX-512 softmax row kernels: the AVX2 kernels' Cephes expf 16 lanes at a time, tails through
// masked lanes (so a row's values do not depend on where it ends), and 2^n applied by vscalefps.

#include <cmath>

#include "attention/softmax.h"
#include "core/avx512.h"

namespace argus::attention_internal {
namespace {

inline __m512 Exp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);
}

}  // namespace

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
