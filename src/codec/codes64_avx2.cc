// AVX2 kernels of the nl and chan codecs (codes64.h). nl's unpack each code block once into
// floats and multiply in float, rounding as the f16 ones do; chan's scores multiply integers over
// channel-major code bytes.
#include <immintrin.h>

#include <cstring>

#include "argus/codec.h"
#include "codec/codes64.h"
#include "codec/codes64_kernels.h"
#include "codec/row_kernels_avx2.h"

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

// Transposes 8 rows of 8 dwords in place (rows[i] lane j becomes rows[j] lane i): the float
// transpose on the same bits.
inline void Transpose8(__m256i* rows) {
  __m256 x[8];
  for (int r = 0; r < 8; ++r) x[r] = _mm256_castsi256_ps(rows[r]);
  avx2::Transpose8(x);
  for (int r = 0; r < 8; ++r) rows[r] = _mm256_castps_si256(x[r]);
}

inline __m128i LevelTable(uint32_t bits) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(NlLevels(bits)));
}

// 32 signed bytes as four vectors of 8 floats, in order.
inline void BytesToFloats(__m256i v, __m256* f) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

struct Isa {
  // Rows [first, first + count) of an nl tile (64 | dim) into x[count][dim], d * level: each
  // code block is unpacked once for every head (widening 8 codes at a time inside the shared row
  // kernels' loads instead took 2.4x their time at GQA 7).
  static void NlRows(const std::byte* tile, uint32_t bits, uint32_t dim, uint32_t first,
                     uint32_t count, float* x) {
    const __m256i lut = _mm256_broadcastsi128_si256(LevelTable(bits));
    const uint32_t blocks_per_row = dim / kCodeBlockValues;
    for (uint32_t b = 0; b < count * blocks_per_row; ++b) {
      const std::byte* block = tile + (size_t{first} * blocks_per_row + b) * NlBlockBytes(bits);
      uint16_t d_bits;
      std::memcpy(&d_bits, block, 2);
      const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(d_bits)));
      __m256i c0, c1;
      UnpackBytes(block + 2, bits, &c0, &c1);
      __m256 f[8];
      BytesToFloats(_mm256_shuffle_epi8(lut, c0), f);
      BytesToFloats(_mm256_shuffle_epi8(lut, c1), f + 4);
      for (int k = 0; k < 8; ++k)
        _mm256_store_ps(x + size_t{b} * kCodeBlockValues + 8 * k, _mm256_mul_ps(f[k], d));
    }
  }

  // out[r] = rows[r] . q for rows[8][dim]: eight sums (one chain would wait on each FMA's
  // latency), then the row kernels' reduction tree, the same for every row.
  static void Dot8Rows(const float* rows, const float* q, uint32_t dim, float* out) {
    __m256 sum[8];
    for (uint32_t r = 0; r < 8; ++r) sum[r] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < dim; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      for (uint32_t r = 0; r < 8; ++r)
        sum[r] = _mm256_fmadd_ps(_mm256_load_ps(rows + size_t{r} * dim + d), qd, sum[r]);
    }
    _mm256_store_ps(
        out, row_avx2::Reduce8(sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7]));
  }
};

}  // namespace

void NlScoresAvx2(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                  const float* q, uint32_t n_q, float* s) {
  NlScores<Isa>(tile, bits, tokens, dim, q, n_q, s);
}

void NlAccumulateAvx2(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                      const float* p, uint32_t n_q, float* acc) {
  alignas(32) float x[kChunkTokens * kMaxTileDim];
  for (uint32_t first = 0; first < tokens; first += kChunkTokens) {
    const uint32_t count = tokens - first < kChunkTokens ? tokens - first : kChunkTokens;
    Isa::NlRows(tile, bits, dim, first, count, x);
    for (uint32_t i = 0; i < n_q; ++i) {
      const float* pi = p + size_t{i} * tokens + first;
      // 64 channels at a time in eight registers, over the chunk's rows.
      for (uint32_t d0 = 0; d0 < dim; d0 += kCodeBlockValues) {
        float* a = acc + size_t{i} * dim + d0;
        __m256 sum[8];
        for (int k = 0; k < 8; ++k) sum[k] = _mm256_loadu_ps(a + 8 * k);
        for (uint32_t t = 0; t < count; ++t) {
          const __m256 w = _mm256_set1_ps(pi[t]);
          const float* xt = x + size_t{t} * dim + d0;
          for (int k = 0; k < 8; ++k)
            sum[k] = _mm256_fmadd_ps(w, _mm256_load_ps(xt + 8 * k), sum[k]);
        }
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(a + 8 * k, sum[k]);
      }
    }
  }
}

void ChannelParamsAvx2(const std::byte* fields, uint32_t dim, float base, float unit, float top,
                       float* min, float* step) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int field_bits = static_cast<int>(kChannelOffsetBits + kChannelExponentBits);
  for (uint32_t d = 0; d < dim; d += 8) {
    const __m256i bit =
        _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(d))),
                           _mm256_set1_epi32(field_bits));
    // Four bytes from each field's first byte hold it (it starts within the first 8 bits).
    const __m256i word =
        _mm256_i32gather_epi32(reinterpret_cast<const int*>(fields), _mm256_srli_epi32(bit, 3), 1);
    const __m256i field =
        _mm256_and_si256(_mm256_srlv_epi32(word, _mm256_and_si256(bit, _mm256_set1_epi32(7))),
                         _mm256_set1_epi32((1 << field_bits) - 1));
    const __m256i offset =
        _mm256_and_si256(field, _mm256_set1_epi32((1 << kChannelOffsetBits) - 1));
    const __m256i exponent = _mm256_srli_epi32(field, static_cast<int>(kChannelOffsetBits));
    // Rounded as the scalar decoder rounds them: a product, then a sum.
    _mm256_storeu_ps(
        min + d, _mm256_add_ps(_mm256_set1_ps(base),
                               _mm256_mul_ps(_mm256_cvtepi32_ps(offset), _mm256_set1_ps(unit))));
    _mm256_storeu_ps(step + d, _mm256_mul_ps(_mm256_set1_ps(top),
                                             _mm256_i32gather_ps(kChannelStepFactor, exponent, 4)));
  }
}

// Integer products over channel-major code bytes, 8 tokens per vector: the group's code bytes go
// through 8x8 dword transposes so that a dword holds 4 channels of one token; per head, q * step
// rounds to int8 with one step per 64 channels and vpmaddubsw + vpmaddwd sum its products with
// the codes (at most 2 * 7 * 127 per pair: no saturation), with no sum across lanes.
void ChannelScoresAvx2(const std::byte* codes, uint32_t bits, uint32_t count, uint32_t dim,
                       const float* min, const float* step, const float* q, uint32_t n_q, float* s,
                       uint32_t s_stride) {
  const uint32_t n_cols = dim / kCodeBlockValues;
  // cols[j][half][k]: block j, tokens 8 half .. + 7, dword k (channels 64j + 4k .. + 3).
  __m256i cols[kMaxTileDim / kCodeBlockValues][2][16];
  for (uint32_t j = 0; j < n_cols; ++j) {
    for (uint32_t half = 0; half < 2; ++half) {
      __m256i* c = cols[j][half];
      for (uint32_t r = 0; r < 8; ++r) {
        const uint32_t t = 8 * half + r;
        if (t < count) {
          UnpackBytes(codes + (size_t{t} * n_cols + j) * CodeBlockBytes(bits), bits, &c[r],
                      &c[8 + r]);
        } else {
          c[r] = c[8 + r] = _mm256_setzero_si256();
        }
      }
      Transpose8(c);
      Transpose8(c + 8);
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (uint32_t i = 0; i < n_q; ++i) {
    const float* qi = q + size_t{i} * dim;
    __m256 total[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, bias = _mm256_setzero_ps();
    for (uint32_t j = 0; j < n_cols; ++j) {
      __m256 scaled[8];
      __m256 amax = _mm256_setzero_ps();
      for (uint32_t k = 0; k < 8; ++k) {
        const uint32_t d = j * kCodeBlockValues + 8 * k;
        const __m256 qd = _mm256_loadu_ps(qi + d);
        bias = _mm256_fmadd_ps(qd, _mm256_loadu_ps(min + d), bias);
        scaled[k] = _mm256_mul_ps(qd, _mm256_loadu_ps(step + d));
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), scaled[k]));
      }
      const float top = avx2::HorizontalMax(amax);
      const __m256 inv = _mm256_set1_ps(top > 0 ? 127.0f / top : 0.0f);
      alignas(32) int32_t q8[16];  // 64 int8, 4 per dword
      for (uint32_t k = 0; k < 8; k += 2) {
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(scaled[k], inv));
        const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(scaled[k + 1], inv));
        // int32 -> int16 -> int8 with the order restored (the packs work per 128-bit half).
        const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
        const __m128i bytes =
            _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
        _mm_store_si128(reinterpret_cast<__m128i*>(q8) + k / 2, bytes);
      }
      const __m256 unit = _mm256_set1_ps(top / 127.0f);
      for (uint32_t half = 0; half < 2; ++half) {
        __m256i acc = _mm256_setzero_si256();
        for (uint32_t k = 0; k < 16; ++k) {
          const __m256i pairs = _mm256_maddubs_epi16(cols[j][half][k], _mm256_set1_epi32(q8[k]));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
        }
        total[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), unit, total[half]);
      }
    }
    const __m256 offset = _mm256_set1_ps(avx2::HorizontalSum(bias));
    for (uint32_t half = 0; half < 2 && 8 * half < count; ++half) {
      avx2::StoreLanes(s + size_t{i} * s_stride + 8 * half, _mm256_add_ps(total[half], offset),
                       count - 8 * half < 8 ? count - 8 * half : 8);
    }
  }
}

}  // namespace argus::codec_internal
