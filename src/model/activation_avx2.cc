// AVX2 kernel of model/activation.h: 8 values at a time, the tail through the same arithmetic.
#include <immintrin.h>

#include <algorithm>

#include "core/exp_avx2.h"
#include "model/activation.h"

namespace argus::model {
namespace {

inline __m256 SiluMul8(__m256 g, __m256 up) {
  const __m256 minus_g = _mm256_sub_ps(_mm256_setzero_ps(), g);
  const __m256 e = avx2::Exp8(_mm256_min_ps(minus_g, _mm256_set1_ps(-kExpUnderflow)));
  const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 flushed = _mm256_cmp_ps(g, _mm256_set1_ps(kExpUnderflow), _CMP_LT_OQ);
  return _mm256_mul_ps(_mm256_andnot_ps(flushed, silu), up);
}

}  // namespace

void SiluMulAvx2(float* gate, const float* up, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(gate + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i == n) return;
  alignas(32) float g[8] = {}, u[8] = {};
  std::copy(gate + i, gate + n, g);
  std::copy(up + i, up + n, u);
  _mm256_store_ps(g, SiluMul8(_mm256_load_ps(g), _mm256_load_ps(u)));
  std::copy(g, g + (n - i), gate + i);
}

}  // namespace argus::model
