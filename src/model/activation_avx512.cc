// AVX-512 kernel of model/activation.h: 16 values at a time, the tail in masked lanes.
#include <cstdint>

#include "core/exp_avx512.h"
#include "model/activation.h"

namespace argus::model {

void SiluMulAvx512(float* gate, const float* up, size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = FirstLanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(lanes, gate + i);
    const __m512 minus_abs =
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN)));
    const __m512 e = avx512::Exp16(minus_abs);
    const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 numerator = _mm512_mask_blend_ps(negative, one, e);
    const __m512 sigmoid = _mm512_div_ps(numerator, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(
        gate + i, lanes,
        _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_maskz_loadu_ps(lanes, up + i)));
  }
}

}  // namespace argus::model
