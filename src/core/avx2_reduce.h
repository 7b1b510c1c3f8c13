// Horizontal reductions, an 8 x 8 transpose and a partial store of AVX2 registers, shared by the
// AVX2 kernel files. Include only from *_avx2.cc files (compiled with -mavx2 -mfma -mf16c; see
// src/codec/codec_internal.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace argus::avx2 {

inline float HorizontalSum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline float HorizontalMax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline int32_t HorizontalSumI(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
  return _mm_cvtsi128_si32(x);
}

// Transposes the 8 x 8 floats of x in place: x[i] lane j becomes x[j] lane i.
inline void Transpose8(__m256 x[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      u[4 * i + 2 * j] = _mm256_shuffle_ps(t[4 * i + j], t[4 * i + j + 2], 0x44);
      u[4 * i + 2 * j + 1] = _mm256_shuffle_ps(t[4 * i + j], t[4 * i + j + 2], 0xee);
    }
  }
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    x[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Stores the first n <= 8 lanes of x at p. A masked store only when n < 8: on AMD CPUs it costs
// many times a plain store.
inline void StoreLanes(float* p, __m256 x, uint32_t n) {
  if (n == 8) return _mm256_storeu_ps(p, x);
  _mm256_maskstore_ps(p,
                      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                      x);
}

}  // namespace argus::avx2
