// AVX2 kernels of the nl and chan codecs (codes64.h): each code block is unpacked once into
// eight vectors of floats and multiplied in float, so the kernels round as the f16 ones do.
#include <immintrin.h>

#include <cstring>

#include "argus/codec.h"
#include "codec/codes64.h"
#include "codec/codes64_kernels.h"

namespace argus::codec_internal {
namespace {

// The 64 codes of a block as bytes: *c0 holds codes 0-31, *c1 codes 32-63.
inline void UnpackBytes(const std::byte* block, uint32_t bits, __m256i* c0, __m256i* c1) {
  const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  const __m128i three = _mm_set1_epi8(3);
  *c0 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(low, 2), three), _mm_and_si128(low, three));
  *c1 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(low, 6), three),
                         _mm_and_si128(_mm_srli_epi16(low, 4), three));
  if (bits != 3) return;
  long long high;
  std::memcpy(&high, block + 16, 8);
  const __m256i h = _mm256_set1_epi64x(high);
  // Code j takes bit j % 8 of high byte j / 8.
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i four = _mm256_set1_epi8(4);
  const __m256i select0 = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i select1 = _mm256_add_epi8(select0, four);
  const auto high_bits = [&](__m256i select) {
    const __m256i spread = _mm256_and_si256(_mm256_shuffle_epi8(h, select), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(spread, bit), four);
  };
  *c0 = _mm256_or_si256(*c0, high_bits(select0));
  *c1 = _mm256_or_si256(*c1, high_bits(select1));
}

// 32 signed (kSigned) or unsigned bytes as four vectors of 8 floats, in order.
template <bool kSigned>
inline void BytesToFloats(__m256i v, __m256* f) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const auto widen = [](__m128i x) {
    return _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(x) : _mm256_cvtepu8_epi32(x));
  };
  f[0] = widen(lo);
  f[1] = widen(_mm_srli_si128(lo, 8));
  f[2] = widen(hi);
  f[3] = widen(_mm_srli_si128(hi, 8));
}

// Block b of an nl tile as 64 floats, d * level.
inline void NlBlock(const std::byte* tile, uint32_t bits, size_t b, __m256* x) {
  const std::byte* block = tile + b * NlBlockBytes(bits);
  uint16_t d_bits;
  std::memcpy(&d_bits, block, 2);
  const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(d_bits)));
  const int8_t* l = NlLevels(bits);
  const __m128i table =
      bits == 3
          ? _mm_setr_epi8(l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], 0, 0, 0, 0, 0, 0, 0, 0)
          : _mm_setr_epi8(l[0], l[1], l[2], l[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i lut = _mm256_broadcastsi128_si256(table);
  __m256i c0, c1;
  UnpackBytes(block + 2, bits, &c0, &c1);
  BytesToFloats<true>(_mm256_shuffle_epi8(lut, c0), x);
  BytesToFloats<true>(_mm256_shuffle_epi8(lut, c1), x + 4);
  for (int k = 0; k < 8; ++k) x[k] = _mm256_mul_ps(x[k], d);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sums of the eight vectors sum[0..7], in order: one transposing reduction, the same for
// every vector.
inline __m256 Reduce8(const __m256* sum) {
  const __m256 s01 = _mm256_hadd_ps(sum[0], sum[1]), s23 = _mm256_hadd_ps(sum[2], sum[3]);
  const __m256 s45 = _mm256_hadd_ps(sum[4], sum[5]), s67 = _mm256_hadd_ps(sum[6], sum[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // s0123 = [sums 0-3 of the low halves | sums 0-3 of the high halves], likewise s4567.
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

struct Isa {
  // Rows [first, first + count) of an nl tile (64 | dim) into x[count][dim].
  static void NlRows(const std::byte* tile, uint32_t bits, uint32_t dim, uint32_t first,
                     uint32_t count, float* x) {
    const uint32_t blocks_per_row = dim / kCodeBlockValues;
    __m256 v[8];
    for (uint32_t b = 0; b < count * blocks_per_row; ++b) {
      NlBlock(tile, bits, size_t{first} * blocks_per_row + b, v);
      for (int k = 0; k < 8; ++k) _mm256_store_ps(x + size_t{b} * kCodeBlockValues + 8 * k, v[k]);
    }
  }

  static void CodeFloats(const std::byte* codes, uint32_t bits, uint32_t n_blocks, float* c) {
    for (uint32_t b = 0; b < n_blocks; ++b) {
      __m256i c0, c1;
      UnpackBytes(codes + size_t{b} * CodeBlockBytes(bits), bits, &c0, &c1);
      __m256 f[8];
      BytesToFloats<false>(c0, f);
      BytesToFloats<false>(c1, f + 4);
      for (int k = 0; k < 8; ++k) _mm256_store_ps(c + size_t{b} * kCodeBlockValues + 8 * k, f[k]);
    }
  }

  static float ScaleQuery(const float* q, const float* min, const float* step, uint32_t dim,
                          float* scaled) {
    __m256 bias = _mm256_setzero_ps();
    for (uint32_t d = 0; d < dim; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      bias = _mm256_fmadd_ps(qd, _mm256_loadu_ps(min + d), bias);
      _mm256_store_ps(scaled + d, _mm256_mul_ps(qd, _mm256_loadu_ps(step + d)));
    }
    return HorizontalSum(bias);
  }

  // Eight sums (one chain would wait on each FMA's latency), then one transposing reduction.
  static void Dot8Rows(const float* rows, const float* q, uint32_t dim, float* out) {
    __m256 sum[8];
    for (uint32_t r = 0; r < 8; ++r) sum[r] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < dim; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      for (uint32_t r = 0; r < 8; ++r)
        sum[r] = _mm256_fmadd_ps(_mm256_load_ps(rows + size_t{r} * dim + d), qd, sum[r]);
    }
    _mm256_store_ps(out, Reduce8(sum));
  }

  // 64 channels at a time in eight registers, over the rows.
  static void AccumulateRows(const float* x, uint32_t count, uint32_t dim, const float* p,
                             float* acc) {
    for (uint32_t d0 = 0; d0 < dim; d0 += kCodeBlockValues) {
      __m256 sum[8];
      for (int k = 0; k < 8; ++k) sum[k] = _mm256_loadu_ps(acc + d0 + 8 * k);
      for (uint32_t t = 0; t < count; ++t) {
        const __m256 w = _mm256_set1_ps(p[t]);
        const float* xt = x + size_t{t} * dim + d0;
        for (int k = 0; k < 8; ++k) sum[k] = _mm256_fmadd_ps(w, _mm256_load_ps(xt + 8 * k), sum[k]);
      }
      for (int k = 0; k < 8; ++k) _mm256_storeu_ps(acc + d0 + 8 * k, sum[k]);
    }
  }
};

}  // namespace

void NlScoresAvx2(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                  const float* q, uint32_t n_q, float* s) {
  NlScores<Isa>(tile, bits, tokens, dim, q, n_q, s);
}

void NlAccumulateAvx2(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                      const float* p, uint32_t n_q, float* acc) {
  NlAccumulate<Isa>(tile, bits, tokens, dim, p, n_q, acc);
}

void ChannelScoresAvx2(const std::byte* codes, uint32_t bits, uint32_t count, uint32_t dim,
                       const float* min, const float* step, const float* q, uint32_t n_q, float* s,
                       uint32_t s_stride) {
  ChannelScores<Isa>(codes, bits, count, dim, min, step, q, n_q, s, s_stride);
}

}  // namespace argus::codec_internal
