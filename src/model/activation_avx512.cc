// AVX-512 kernel of model/activation.h: 16 values at a time, the tail in masked lanes.
#include "core/exp_avx512.h"
#include "model/activation.h"

namespace argus::model {

void SiluMulAvx512(float* gate, const float* up, size_t n) {
  const __m512 limit = _mm512_set1_ps(-kExpUnderflow);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = FirstLanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(lanes, gate + i);
    const __m512 minus_g = _mm512_sub_ps(_mm512_setzero_ps(), g);
    const __m512 e = avx512::Exp16(_mm512_min_ps(minus_g, limit));
    const __mmask16 kept = _mm512_cmp_ps_mask(minus_g, limit, _CMP_NGT_UQ);  // NaNs kept
    const __m512 silu = _mm512_maskz_div_ps(kept, g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(gate + i, lanes,
                          _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(lanes, up + i)));
  }
}

}  // namespace argus::model
