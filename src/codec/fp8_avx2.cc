// AVX2 kernels of the FP8 codecs: loaders that widen FP8 codes to fp16 bit patterns with one to
// three integer instructions and convert with F16C, for the shared row kernels.
//
// E5M2 is the top byte of binary16: c << 8 is the fp16 pattern of the same value (Inf and NaN
// included). An E4M3 code c = s eeee mmm maps to the fp16 pattern s 0eeee mmm0000000, which is
// 2^-8 times the E4M3 value for every finite code, subnormals included (E4M3's bias 7 against
// fp16's 15); only the NaN code 0x7f differs, and encode never writes it. The pattern is c
// sign-extended to 16 bits, shifted left by 7 (s s eeee mmm 0000000), with bit 14 cleared. The
// 2^8 is folded into the scale.
#include <immintrin.h>

#include "codec/fp8_kernels.h"
#include "codec/row_kernels_avx2.h"

namespace argus::codec_internal {
namespace {

constexpr short kE4M3HalfMask = static_cast<short>(0xbf80);  // s 0 eeee mmm 0000000

template <bool kE4M3>
struct Fp8Loader {
  static constexpr bool kScaled = true;
  const uint8_t* codes;
  float folded_scale;  // the tile's scale, times 2^8 for E4M3

  float scale() const { return folded_scale; }

  __m256 Load8(size_t i) const {
    __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    if constexpr (kE4M3) {
      return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7),
                                           _mm_set1_epi16(kE4M3HalfMask)));
    } else {
      return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), bytes));
    }
  }

  // 16 codes at once: E4M3 widens them in one 256-bit register (measured faster than two
  // Load8), E5M2 interleaves them with zero bytes.
  void Load16(size_t i, __m256& lo, __m256& hi) const {
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    if constexpr (kE4M3) {
      __m256i half = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                                      _mm256_set1_epi16(kE4M3HalfMask));
      lo = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
      hi = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
    } else {
      lo = _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), bytes));
      hi = _mm256_cvtph_ps(_mm_unpackhi_epi8(_mm_setzero_si128(), bytes));
    }
  }

  float Load1(size_t i) const {
    const uint32_t c = codes[i];
    return _cvtsh_ss(
        static_cast<uint16_t>(kE4M3 ? ((c & 0x80u) << 8) | ((c & 0x7fu) << 7) : c << 8));
  }
};

}  // namespace

void ScoresFp8Avx2(bool e4m3, const uint8_t* codes, float scale, uint32_t tokens, uint32_t dim,
                   const float* q, uint32_t n_q, float* s) {
  if (e4m3) {
    row_avx2::Scores(Fp8Loader<true>{codes, scale * 256.0f}, tokens, dim, q, n_q, s);
  } else {
    row_avx2::Scores(Fp8Loader<false>{codes, scale}, tokens, dim, q, n_q, s);
  }
}

void AccumulateFp8Avx2(bool e4m3, const uint8_t* codes, float scale, uint32_t tokens, uint32_t dim,
                       const float* p, uint32_t n_q, float* acc) {
  if (e4m3) {
    row_avx2::Accumulate(Fp8Loader<true>{codes, scale * 256.0f}, tokens, dim, p, n_q, acc);
  } else {
    row_avx2::Accumulate(Fp8Loader<false>{codes, scale}, tokens, dim, p, n_q, acc);
  }
}

}  // namespace argus::codec_internal
