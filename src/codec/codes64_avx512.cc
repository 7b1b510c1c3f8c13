// AVX-512 kernels of the nl and chan codecs (codes64.h). A code block unpacks in one register (a
// variable shift per 128-bit lane for the low bits, a byte test into a mask for the high bit).
// nl's scores multiply in float, 16 per instruction; nl's accumulate and chan's scores multiply
// integers with VNNI.
#include <cstring>

#include "argus/codec.h"
#include "codec/codes64.h"
#include "codec/codes64_kernels.h"
#include "core/avx512.h"

namespace argus::codec_internal {
namespace {

// The 64 codes of a block as bytes, in order.
inline __m512i UnpackBytes(const std::byte* block, uint32_t bits) {
  const __m512i low =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  // 128-bit lane L holds codes 16L .. 16L + 15: the low bits shifted right by 2L.
  const __m512i shifts =
      _mm512_set_epi64(0x0006000600060006, 0x0006000600060006, 0x0004000400040004,
                       0x0004000400040004, 0x0002000200020002, 0x0002000200020002, 0, 0);
  __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(low, shifts), _mm512_set1_epi8(3));
  if (bits != 3) return codes;
  long long high;
  std::memcpy(&high, block + 16, 8);
  // Code j takes bit j % 8 of high byte j / 8; each lane holds the 8 high bytes twice.
  const __m512i select = _mm512_set_epi64(
      0x0707070707070707, 0x0606060606060606, 0x0505050505050505, 0x0404040404040404,
      0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m512i bit = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ULL));
  const __mmask64 set =
      _mm512_test_epi8_mask(_mm512_shuffle_epi8(_mm512_set1_epi64(high), select), bit);
  return _mm512_or_si512(codes, _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(4)));
}

// 64 signed (kSigned) or unsigned bytes as four vectors of 16 floats, in order.
template <bool kSigned>
inline void BytesToFloats(__m512i v, __m512* f) {
  const __m128i q[4] = {_mm512_castsi512_si128(v), _mm512_extracti32x4_epi32(v, 1),
                        _mm512_extracti32x4_epi32(v, 2), _mm512_extracti32x4_epi32(v, 3)};
  for (int k = 0; k < 4; ++k)
    f[k] = _mm512_cvtepi32_ps(kSigned ? _mm512_cvtepi8_epi32(q[k]) : _mm512_cvtepu8_epi32(q[k]));
}

// The sums of the eight vectors sum[0..7], in order: one transposing reduction, the same for
// every vector.
inline __m256 Reduce8(const __m512* sum) {
  __m256 half[8];
  for (int r = 0; r < 8; ++r) {
    half[r] = _mm256_add_ps(_mm512_castps512_ps256(sum[r]),
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum[r]), 1)));
  }
  const __m256 s01 = _mm256_hadd_ps(half[0], half[1]), s23 = _mm256_hadd_ps(half[2], half[3]);
  const __m256 s45 = _mm256_hadd_ps(half[4], half[5]), s67 = _mm256_hadd_ps(half[6], half[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// v[0..3] as a 4x4 matrix of 128-bit lanes, transposed: lane L of v[k] becomes lane k of v[L].
inline void TransposeLanes(__m512i* v) {
  const __m512i a = _mm512_shuffle_i32x4(v[0], v[1], 0x44),
                b = _mm512_shuffle_i32x4(v[2], v[3], 0x44);
  const __m512i c = _mm512_shuffle_i32x4(v[0], v[1], 0xee),
                e = _mm512_shuffle_i32x4(v[2], v[3], 0xee);
  v[0] = _mm512_shuffle_i32x4(a, b, 0x88);
  v[1] = _mm512_shuffle_i32x4(a, b, 0xdd);
  v[2] = _mm512_shuffle_i32x4(c, e, 0x88);
  v[3] = _mm512_shuffle_i32x4(c, e, 0xdd);
}

// rows[t] holds 16 dwords of row t; afterwards rows[k] holds dword k of every row, lane t.
inline void Transpose16(__m512i* rows) {
  __m512i t[16];
  for (int g = 0; g < 4; ++g) {
    const __m512i* a = rows + 4 * g;
    const __m512i lo01 = _mm512_unpacklo_epi32(a[0], a[1]),
                  hi01 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(a[2], a[3]),
                  hi23 = _mm512_unpackhi_epi32(a[2], a[3]);
    t[4 * g + 0] = _mm512_unpacklo_epi64(lo01, lo23);
    t[4 * g + 1] = _mm512_unpackhi_epi64(lo01, lo23);
    t[4 * g + 2] = _mm512_unpacklo_epi64(hi01, hi23);
    t[4 * g + 3] = _mm512_unpackhi_epi64(hi01, hi23);
  }
  // t[4g + m], 128-bit lane L: dword 4L + m of rows 4g .. 4g + 3; dword k = 4L + m of every
  // row is lane L of t[m], t[4 + m], t[8 + m], t[12 + m].
  for (int m = 0; m < 4; ++m) {
    __m512i v[4] = {t[m], t[4 + m], t[8 + m], t[12 + m]};
    TransposeLanes(v);
    for (int L = 0; L < 4; ++L) rows[4 * L + m] = v[L];
  }
}

// nl's int8 levels in every 128-bit lane, for a byte shuffle by code.
inline __m512i LevelTable(uint32_t bits) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(NlLevels(bits))));
}

struct Isa {
  // Rows [first, first + count) of an nl tile (64 | dim) into x[count][dim], d * level.
  static void NlRows(const std::byte* tile, uint32_t bits, uint32_t dim, uint32_t first,
                     uint32_t count, float* x) {
    const __m512i lut = LevelTable(bits);
    const uint32_t blocks_per_row = dim / kCodeBlockValues;
    for (uint32_t b = 0; b < count * blocks_per_row; ++b) {
      const std::byte* block = tile + (size_t{first} * blocks_per_row + b) * NlBlockBytes(bits);
      uint16_t d_bits;
      std::memcpy(&d_bits, block, 2);
      const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(d_bits)));
      __m512 f[4];
      BytesToFloats<true>(_mm512_shuffle_epi8(lut, UnpackBytes(block + 2, bits)), f);
      for (int k = 0; k < 4; ++k)
        _mm512_store_ps(x + size_t{b} * kCodeBlockValues + 16 * k, _mm512_mul_ps(f[k], d));
    }
  }

  // out[r] = rows[r] . q for rows[8][dim]: eight sums (one chain would wait on each FMA's
  // latency), then one transposing reduction, the same for every row, so a row's score does not
  // depend on its neighbours.
  static void Dot8Rows(const float* rows, const float* q, uint32_t dim, float* out) {
    __m512 sum[8];
    for (uint32_t r = 0; r < 8; ++r) sum[r] = _mm512_setzero_ps();
    for (uint32_t d = 0; d < dim; d += 16) {
      const __m512 qd = _mm512_loadu_ps(q + d);
      for (uint32_t r = 0; r < 8; ++r)
        sum[r] = _mm512_fmadd_ps(_mm512_load_ps(rows + size_t{r} * dim + d), qd, sum[r]);
    }
    _mm256_store_ps(out, Reduce8(sum));
  }
};

}  // namespace

void NlScoresAvx512(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                    const float* q, uint32_t n_q, float* s) {
  NlScores<Isa>(tile, bits, tokens, dim, q, n_q, s);
}

// Integer products, 16 tokens at a time: per head and 64-channel block, the weights p_t * d_t
// round to unsigned 8 bits with one step over the 16 tokens, and vpdpbusd multiplies 4 tokens'
// weights by their int8 levels, interleaved so that a dword holds one channel of 4 tokens.
void NlAccumulateAvx512(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                        const float* p, uint32_t n_q, float* acc) {
  const uint32_t n_cols = dim / kCodeBlockValues;
  const __m512i lut = LevelTable(bits);
  // levels[j][g][k]: block j, tokens 4g .. 4g + 3; 128-bit lane L, dword m holds channel
  // 16 L + 4 k + m of the 4 tokens.
  __m512i levels[kMaxTileDim / kCodeBlockValues][4][4];
  alignas(64) float d[kMaxTileDim / kCodeBlockValues][16];
  for (uint32_t first = 0; first < tokens; first += kChunkTokens) {
    const uint32_t count = tokens - first < kChunkTokens ? tokens - first : kChunkTokens;
    for (uint32_t j = 0; j < n_cols; ++j) {
      __m512i row[16];
      for (uint32_t t = 0; t < 16; ++t) {
        if (t >= count) {
          row[t] = _mm512_setzero_si512();
          d[j][t] = 0.0f;
          continue;
        }
        const std::byte* block = tile + ((size_t{first} + t) * n_cols + j) * NlBlockBytes(bits);
        uint16_t d_bits;
        std::memcpy(&d_bits, block, 2);
        d[j][t] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(d_bits))));
        row[t] = _mm512_shuffle_epi8(lut, UnpackBytes(block + 2, bits));
      }
      for (uint32_t g = 0; g < 4; ++g) {
        const __m512i* r = row + 4 * g;
        const __m512i lo01 = _mm512_unpacklo_epi8(r[0], r[1]),
                      hi01 = _mm512_unpackhi_epi8(r[0], r[1]);
        const __m512i lo23 = _mm512_unpacklo_epi8(r[2], r[3]),
                      hi23 = _mm512_unpackhi_epi8(r[2], r[3]);
        levels[j][g][0] = _mm512_unpacklo_epi16(lo01, lo23);
        levels[j][g][1] = _mm512_unpackhi_epi16(lo01, lo23);
        levels[j][g][2] = _mm512_unpacklo_epi16(hi01, hi23);
        levels[j][g][3] = _mm512_unpackhi_epi16(hi01, hi23);
      }
    }
    for (uint32_t i = 0; i < n_q; ++i) {
      const __m512 pi = _mm512_maskz_loadu_ps(FirstLanes(count), p + size_t{i} * tokens + first);
      for (uint32_t j = 0; j < n_cols; ++j) {
        const __m512 w = _mm512_mul_ps(pi, _mm512_load_ps(d[j]));
        const float top = _mm512_reduce_max_ps(w);
        if (!(top > 0)) continue;   // nothing to add (p is finite and non-negative here)
        alignas(64) int32_t w8[4];  // 16 unsigned bytes, 4 tokens per dword
        _mm_store_si128(reinterpret_cast<__m128i*>(w8),
                        _mm512_cvtusepi32_epi8(
                            _mm512_cvtps_epu32(_mm512_mul_ps(w, _mm512_set1_ps(255.0f / top)))));
        __m512i sum[4];
        for (uint32_t k = 0; k < 4; ++k) sum[k] = _mm512_setzero_si512();
        for (uint32_t g = 0; g < 4; ++g) {
          const __m512i weights = _mm512_set1_epi32(w8[g]);
          for (uint32_t k = 0; k < 4; ++k)
            sum[k] = _mm512_dpbusd_epi32(sum[k], weights, levels[j][g][k]);
        }
        // sum[k], lane L holds channels 16 L + 4 k .. + 3; transposed, sum[L] holds 16 L ..
        TransposeLanes(sum);
        const __m512 unit = _mm512_set1_ps(top / 255.0f);
        float* out = acc + size_t{i} * dim + j * kCodeBlockValues;
        for (uint32_t k = 0; k < 4; ++k) {
          _mm512_storeu_ps(out + 16 * k, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[k]), unit,
                                                         _mm512_loadu_ps(out + 16 * k)));
        }
      }
    }
  }
}

void ChannelParamsAvx512(const std::byte* fields, uint32_t dim, float base, float unit, float top,
                         float* min, float* step) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 factor_lo = _mm512_loadu_ps(kChannelStepFactor),
               factor_mid = _mm512_loadu_ps(kChannelStepFactor + 16),
               factor_hi = _mm512_loadu_ps(kChannelStepFactor + 32),
               factor_top = _mm512_loadu_ps(kChannelStepFactor + 48);
  const int field_bits = static_cast<int>(kChannelOffsetBits + kChannelExponentBits);
  for (uint32_t d = 0; d < dim; d += 16) {
    const __m512i bit =
        _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(d))),
                           _mm512_set1_epi32(field_bits));
    // Four bytes from each field's first byte hold it (it starts within the first 8 bits).
    const __m512i word = _mm512_i32gather_epi32(_mm512_srli_epi32(bit, 3), fields, 1);
    const __m512i field =
        _mm512_and_si512(_mm512_srlv_epi32(word, _mm512_and_si512(bit, _mm512_set1_epi32(7))),
                         _mm512_set1_epi32((1 << field_bits) - 1));
    const __m512i offset =
        _mm512_and_si512(field, _mm512_set1_epi32((1 << kChannelOffsetBits) - 1));
    const __m512i exponent = _mm512_srli_epi32(field, static_cast<int>(kChannelOffsetBits));
    // min = base + o * unit and step = top * 2^(-e/8), rounded as the scalar decoder rounds them.
    _mm512_storeu_ps(
        min + d, _mm512_add_ps(_mm512_set1_ps(base),
                               _mm512_mul_ps(_mm512_cvtepi32_ps(offset), _mm512_set1_ps(unit))));
    const __m512 low = _mm512_permutex2var_ps(factor_lo, exponent, factor_mid);
    const __m512 high = _mm512_permutex2var_ps(factor_hi, exponent, factor_top);
    const __mmask16 upper = _mm512_cmpge_epi32_mask(exponent, _mm512_set1_epi32(32));
    _mm512_storeu_ps(step + d,
                     _mm512_mul_ps(_mm512_set1_ps(top), _mm512_mask_blend_ps(upper, low, high)));
  }
}

// Integer products, channel-major: the group's code bytes go through a 16x16 dword transpose,
// so a dword holds 4 channels of one token and each lane is a token; per head, q * step rounds to
// int8 with one step per 64 channels and VNNI sums its products with the codes for the 16
// tokens at once, with no sum across lanes.
void ChannelScoresAvx512(const std::byte* codes, uint32_t bits, uint32_t count, uint32_t dim,
                         const float* min, const float* step, const float* q, uint32_t n_q,
                         float* s, uint32_t s_stride) {
  const uint32_t n_cols = dim / kCodeBlockValues;
  __m512i cols[kMaxTileDim / kCodeBlockValues][16];
  for (uint32_t j = 0; j < n_cols; ++j) {
    for (uint32_t t = 0; t < 16; ++t) {
      cols[j][t] = t < count
                       ? UnpackBytes(codes + (size_t{t} * n_cols + j) * CodeBlockBytes(bits), bits)
                       : _mm512_setzero_si512();
    }
    Transpose16(cols[j]);  // cols[j][k]: dword of channels 64j + 4k .. + 3, lane t = token t
  }
  for (uint32_t i = 0; i < n_q; ++i) {
    const float* qi = q + size_t{i} * dim;
    __m512 total = _mm512_setzero_ps(), bias = _mm512_setzero_ps();
    for (uint32_t j = 0; j < n_cols; ++j) {
      __m512 scaled[4];
      __m512 amax = _mm512_setzero_ps();
      for (uint32_t k = 0; k < 4; ++k) {
        const uint32_t d = j * kCodeBlockValues + 16 * k;
        const __m512 qd = _mm512_loadu_ps(qi + d);
        bias = _mm512_fmadd_ps(qd, _mm512_loadu_ps(min + d), bias);
        scaled[k] = _mm512_mul_ps(qd, _mm512_loadu_ps(step + d));
        amax = _mm512_max_ps(amax, _mm512_abs_ps(scaled[k]));
      }
      const float top = _mm512_reduce_max_ps(amax);
      const __m512 inv = _mm512_set1_ps(top > 0 ? 127.0f / top : 0.0f);
      alignas(64) int32_t q8[16];  // 64 int8, 4 per dword
      for (uint32_t k = 0; k < 4; ++k) {
        _mm_store_si128(reinterpret_cast<__m128i*>(q8) + k,
                        _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(scaled[k], inv))));
      }
      __m512i acc = _mm512_setzero_si512();
      for (uint32_t k = 0; k < 16; ++k)
        acc = _mm512_dpbusd_epi32(acc, cols[j][k], _mm512_set1_epi32(q8[k]));
      total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(top / 127.0f), total);
    }
    const __m512 out = _mm512_add_ps(total, _mm512_set1_ps(_mm512_reduce_add_ps(bias)));
    _mm512_mask_storeu_ps(s + size_t{i} * s_stride, FirstLanes(count), out);
  }
}

}  // namespace argus::codec_internal
