// AVX2 kernels of the float codecs: loaders for the shared register-blocked row kernels
// (row_kernels_avx2.h), which hold the blocking and the loops.
#include <immintrin.h>

#include "codec/float_kernels.h"
#include "codec/row_kernels_avx2.h"

namespace argus::codec_internal {
namespace {

template <FloatKind kKind>
struct FloatLoader {
  static constexpr bool kScaled = false;
  const void* base;

  __m256 Load8(size_t i) const {
    if constexpr (kKind == FloatKind::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    } else if constexpr (kKind == FloatKind::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
    } else {
      __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }

  void Load16(size_t i, __m256& lo, __m256& hi) const {
    lo = Load8(i);
    hi = Load8(i + 8);
  }

  float Load1(size_t i) const {
    if constexpr (kKind == FloatKind::kF32) {
      return static_cast<const float*>(base)[i];
    } else if constexpr (kKind == FloatKind::kF16) {
      return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
    } else {
      uint32_t bits = uint32_t{static_cast<const uint16_t*>(base)[i]} << 16;
      float f;
      __builtin_memcpy(&f, &bits, 4);
      return f;
    }
  }
};

// bf16 with round to nearest even; NaN keeps its top payload bits and is made quiet.
inline __m128i Bf16From(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Pack the low 16 bits of the eight 32-bit lanes.
  const __m256i packed = _mm256_packus_epi32(_mm256_and_si256(rounded, _mm256_set1_epi32(0xffff)),
                                             _mm256_setzero_si256());
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

template <typename Loader>
void Decode(Loader loader, size_t n, float* x) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, loader.Load8(i));
  for (; i < n; ++i) x[i] = loader.Load1(i);
}

}  // namespace

void EncodeFloatAvx2(FloatKind kind, const float* x, size_t n, void* out) {
  size_t i = 0;
  if (kind == FloatKind::kF32) {
    __builtin_memcpy(out, x, n * 4);
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(out);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m128i h =
        kind == FloatKind::kF16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : Bf16From(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), h);
  }
  for (; i < n; ++i) {
    const __m256 v = _mm256_set1_ps(x[i]);
    const __m128i h =
        kind == FloatKind::kF16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : Bf16From(v);
    o[i] = static_cast<uint16_t>(_mm_extract_epi16(h, 0));
  }
}

void DecodeFloatAvx2(FloatKind kind, const void* in, size_t n, float* x) {
  switch (kind) {
    case FloatKind::kF32:
      __builtin_memcpy(x, in, n * 4);
      break;
    case FloatKind::kF16:
      Decode(FloatLoader<FloatKind::kF16>{in}, n, x);
      break;
    case FloatKind::kBf16:
      Decode(FloatLoader<FloatKind::kBf16>{in}, n, x);
      break;
  }
}

void ScoresFloatAvx2(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                     uint32_t n_q, float* s) {
  switch (kind) {
    case FloatKind::kF32:
      row_avx2::Scores(FloatLoader<FloatKind::kF32>{k}, tokens, dim, q, n_q, s);
      break;
    case FloatKind::kF16:
      row_avx2::Scores(FloatLoader<FloatKind::kF16>{k}, tokens, dim, q, n_q, s);
      break;
    case FloatKind::kBf16:
      row_avx2::Scores(FloatLoader<FloatKind::kBf16>{k}, tokens, dim, q, n_q, s);
      break;
  }
}

void AccumulateFloatAvx2(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                         const float* p, uint32_t n_q, float* acc) {
  switch (kind) {
    case FloatKind::kF32:
      row_avx2::Accumulate(FloatLoader<FloatKind::kF32>{v}, tokens, dim, p, n_q, acc);
      break;
    case FloatKind::kF16:
      row_avx2::Accumulate(FloatLoader<FloatKind::kF16>{v}, tokens, dim, p, n_q, acc);
      break;
    case FloatKind::kBf16:
      row_avx2::Accumulate(FloatLoader<FloatKind::kBf16>{v}, tokens, dim, p, n_q, acc);
      break;
  }
}

}  // namespace argus::codec_internal
