// core/exp_avx2.h's expf, 16 lanes, for the *_avx512.cc kernel files; 2^n applied by vscalefps.
#pragma once

#include "core/avx512.h"
#include "core/exp_avx2.h"

namespace argus::avx512 {

inline __m512 Exp16(__m512 x) {
  using namespace exp_constants;
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpUnderflow), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpUnderflow));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPolynomial[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);
}

}  // namespace argus::avx512
