// Cephes' expf on the vector units, for the *_avx2.cc kernel files (softmax rows, the feed-forward
// gate); core/exp_avx512.h has it 16 lanes wide with these constants. x = n ln2 + r with a
// two-constant Cody-Waite split, |r| <= ln2/2, and a degree-6 polynomial for e^r (relative error
// about 1 ulp), scaled by 2^n. Arguments below kExpUnderflow (e^x under float's normal range, -inf
// included) give exactly 0. REQUIRES: x <= 88.
#pragma once

#include <immintrin.h>

namespace argus {

inline constexpr float kExpUnderflow = -87.3f;

namespace exp_constants {
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
// e^r = 1 + r + r^2 (c0 r^5 + c1 r^4 + ... + c5), by Horner's rule from c0.
inline constexpr float kPolynomial[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_constants

namespace avx2 {

inline __m256 Exp8(__m256 x) {
  using namespace exp_constants;
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(kExpUnderflow), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpUnderflow));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPolynomial[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n through the exponent field.
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace avx2
}  // namespace argus
