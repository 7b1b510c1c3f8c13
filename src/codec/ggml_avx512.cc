// AVX-512 VNNI kernels of the ggml block codecs (rows of whole 32-value blocks). VNNI's
// multiply-adds sum 4 byte products (vpdpbusd: unsigned x signed) or 2 word products (vpdpwssd)
// into each int32 lane and accumulate in the same instruction. On Intel Xeons 512-bit integer
// multiply-adds issue on one port while float FMAs issue on two, so only the byte form does more
// multiplies per cycle than the f16 kernels: scores use it for every format.
//
// Rounding: accumulate rounds the weights as the AVX2 kernels do (per group of tokens, one scale
// per head: int8 for q4_0, int16 otherwise). Scores round the query per 32-block to q8_0 for
// every format, fp16 scale included, as llama.cpp does for quantised K (the AVX2 kernels keep
// int16 for q8_0 and iq4_nl). ggml_kernels.h states the bounds. The integer sums are exact; what is
// left in float is done per head in a fixed order, so a head's result never depends on how many
// heads share its call or where it sits among them (a prompt in two chunks gives the logits of one
// chunk).
//
// scores: the lanes are 16 tokens. The codes of 16 tokens' block are transposed so that a
//   register holds 4 consecutive dims of each token, biased to unsigned, and each vpdpbusd takes
//   those 4 dims of one query head as a broadcast operand: 8 per head and block, no reduction,
//   then acc_h += (d_t dq_hb) dot_hbt in float. The transposed codes serve every head of the pass.
// accumulate: the lanes are 16 dims. A register holds 4 tokens' codes (q4_0) or 2 tokens' int16
//   values for each dim, and each multiply-add takes those tokens' rounded weights of one head as
//   a broadcast operand, so it sums over tokens within the lane. A group's sums are exact in int32
//   and scaled into acc once per group and block.

#include <cstring>

#include "argus/codec.h"
#include "codec/ggml_kernels.h"
#include "core/avx512.h"

namespace argus::codec_internal {
namespace {

constexpr uint32_t kQk = 32;                        // values per block
constexpr uint32_t kMaxBlocks = kMaxTileDim / kQk;  // blocks per row
constexpr uint32_t kLanes = 16;                     // tokens of a scores step
constexpr int kMaxHeads = 8;                        // heads of a pass: accumulators in registers
constexpr uint32_t kMaxGroup = kWeightGroup16;      // the larger weight group
// How far ahead the kernels hint rows into the cache, spread over the loops (see HintStream).
constexpr uint32_t kScoresHintSteps = 4;       // of 16 tokens
constexpr uint32_t kAccumulateHintGroups = 2;  // of kWeightGroup8 or kWeightGroup16 tokens

// Accumulate: q4_0 multiplies unsigned codes by int8 weights; q8_0 and iq4_nl int16 by int16.
template <GgmlKind kKind>
constexpr bool kByteCodes = kKind == GgmlKind::kQ4_0;

// Stands in for the blocks of tokens past the end of a tile: reads stay inside the tile.
alignas(64) constexpr std::byte kZeroBlock[64] = {};

// The fp16 scales of n rows `row_bytes` apart from `first` (a block's first bytes) into
// bits[0 .. count), count a multiple of 16, zero past n. 16 rows per dword gather (a scale and
// the two code bytes after it, all inside the block): copied one by one, the scales took about a
// seventh of q8_0 accumulate's time.
inline void GatherScales(const std::byte* first, size_t row_bytes, uint32_t n, uint32_t count,
                         uint16_t* bits) {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(row_bytes)));
  for (uint32_t i = 0; i < count; i += 16) {
    __m256i scales = _mm256_setzero_si256();
    if (i < n) {
      scales = _mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32(
          _mm512_setzero_si512(), FirstLanes(n - i), offsets, first + i * row_bytes, 1));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i), scales);
  }
}

inline __m512i Broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __m128i Load16(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// Low and high nibbles of every byte.
inline __m512i LowNibbles(__m512i x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0f)); }
inline __m512i HighNibbles(__m512i x) {
  return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0f));
}

// iq4_nl's levels plus 128 for nibble codes (the levels lie in [-127, 113]).
inline __m512i Iq4NlBiasedLevels(__m512i codes) {
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues));
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8(-128))),
                             codes);
}

// 16 bytes of each of 16 rows (row(t) points at token t's) -> c[j], j < 4: lane t holds bytes
// 4j .. 4j+3 of row t. Register i first holds rows i, 4+i, 8+i, 12+i in its 128-bit lanes; a
// 4 x 4 transpose of dwords within the lanes then leaves rows in lane order.
template <typename Row>
[[gnu::always_inline]] inline void Transpose16(Row row, __m512i* c) {
  __m512i r[4];
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_castsi128_si512(Load16(row(i)));
    r[i] = _mm512_inserti32x4(r[i], Load16(row(4 + i)), 1);
    r[i] = _mm512_inserti32x4(r[i], Load16(row(8 + i)), 2);
    r[i] = _mm512_inserti32x4(r[i], Load16(row(12 + i)), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
  c[0] = _mm512_unpacklo_epi64(t0, t2);
  c[1] = _mm512_unpackhi_epi64(t0, t2);
  c[2] = _mm512_unpacklo_epi64(t1, t3);
  c[3] = _mm512_unpackhi_epi64(t1, t3);
}

// ---- scores ------------------------------------------------------------------------------------

// vpdpbusd multiplies unsigned bytes by signed ones, so codes go in as unsigned: q4_0's nibbles
// as they are, q8_0's and iq4_nl's signed values plus 128; dot = sum q c' - kBias sum q.
template <GgmlKind kKind>
constexpr int32_t kBias = kKind == GgmlKind::kQ4_0 ? 8 : 128;

// limit / amax lane by lane: the inverse of a rounding step of amax / limit; 0 where amax is not
// above 0 (a zero block, or NaN).
inline __m512 InverseSteps(__m512 amax, __m512 limit) {
  return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), limit,
                             amax);
}

// out[i] = factor * (the sum of x[i]'s lanes) for i < count <= 16, modulo 2^32 like the int32
// sums it offsets; out[count .. 16) = 0. The lanes hold integers whose sums stay below 2^24, so
// the float reduction is exact.
inline void StoreScaledSums(const __m512* x, uint32_t count, int32_t factor, int32_t* out) {
  const __m512i sums = _mm512_cvtps_epi32(ReduceLanes16<false>(x, count));
  _mm512_store_si512(out, _mm512_mullo_epi32(sums, _mm512_set1_epi32(factor)));
}

// The query of NH heads rounded per block to int8 (q4_0's rounding in the AVX2 kernels, and
// llama.cpp's for every quantised K), in dim order: dword j of a block is dims 4j .. 4j+3. Block
// i = h * n_blocks + b is query block b of head h, as the heads' rows lie in memory; 16 blocks'
// maxima and sums are reduced at once (ReduceLanes16; the sums are integers below 2^24).
template <GgmlKind kKind, int NH>
struct QueryTable {
  static constexpr uint32_t kBlocks = NH * kMaxBlocks;  // a multiple of 16
  alignas(64) int8_t q[kBlocks][kQk];
  alignas(64) float dq[kBlocks];
  alignas(64) int32_t offset[kBlocks];  // -kBias * sum q: takes off what the code bias adds

  void Build(const float* query, uint32_t dim) {
    const uint32_t n = static_cast<uint32_t>(NH) * (dim / kQk);
    for (uint32_t i0 = 0; i0 < n; i0 += 16) {
      const uint32_t count = n - i0 < 16 ? n - i0 : 16;
      auto half = [&](uint32_t j, int k) {
        return _mm512_loadu_ps(query + (i0 + j) * kQk + 16 * k);
      };
      __m512 x[16];
      for (uint32_t j = 0; j < count; ++j)
        x[j] = _mm512_max_ps(_mm512_abs_ps(half(j, 0)), _mm512_abs_ps(half(j, 1)));
      const __m512 amax = ReduceLanes16<true>(x, count);
      const __m512 limit = _mm512_set1_ps(127.0f);
      alignas(64) float inv[16];
      _mm512_store_ps(inv, InverseSteps(amax, limit));
      // Int8QueryScale: the step amax/127 rounded to fp16 (to nearest even, as FloatToHalf).
      _mm512_store_ps(dq + i0, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_div_ps(amax, limit),
                                                               _MM_FROUND_TO_NEAREST_INT)));
      for (uint32_t j = 0; j < count; ++j) {
        const __m512 scale = _mm512_set1_ps(inv[j]);
        const __m512i n0 = _mm512_cvtps_epi32(_mm512_mul_ps(half(j, 0), scale));
        const __m512i n1 = _mm512_cvtps_epi32(_mm512_mul_ps(half(j, 1), scale));
        _mm_store_si128(reinterpret_cast<__m128i*>(q[i0 + j]), _mm512_cvtsepi32_epi8(n0));
        _mm_store_si128(reinterpret_cast<__m128i*>(q[i0 + j] + 16), _mm512_cvtsepi32_epi8(n1));
        x[j] = _mm512_cvtepi32_ps(_mm512_add_epi32(n0, n1));  // |sum| <= 32 * 127
      }
      StoreScaledSums(x, count, -kBias<kKind>, offset + i0);
    }
  }
};

// Block b's codes of 16 tokens, transposed and biased to unsigned: code[j], lane t = dims
// 4j .. 4j+3 of token t.
template <GgmlKind kKind, typename Row>
[[gnu::always_inline]] inline void TransposedCodes(Row block, __m512i* code) {
  if constexpr (kKind == GgmlKind::kQ8_0) {
    Transpose16([&](int t) { return block(t) + 2; }, code);
    Transpose16([&](int t) { return block(t) + 18; }, code + 4);
    for (int j = 0; j < 8; ++j) code[j] = _mm512_xor_si512(code[j], _mm512_set1_epi8(-128));
  } else {
    __m512i packed[4];  // byte i: dims i (low nibble) and 16 + i (high nibble)
    Transpose16([&](int t) { return block(t) + 2; }, packed);
    for (int j = 0; j < 4; ++j) {
      code[j] = LowNibbles(packed[j]);
      code[4 + j] = HighNibbles(packed[j]);
      if constexpr (kKind == GgmlKind::kIq4Nl) {
        code[j] = Iq4NlBiasedLevels(code[j]);
        code[4 + j] = Iq4NlBiasedLevels(code[4 + j]);
      }
    }
  }
}

// Scores of NH heads (q: [NH, dim], s: [NH, tokens]) 16 tokens at a time. Block scales are
// gathered one step ahead: a wide load right after the narrow stores would stall on store
// forwarding.
template <GgmlKind kKind, int NH>
void ScoresHeads(const std::byte* k, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  QueryTable<kKind, NH> query;
  query.Build(q, dim);
  const uint32_t n_blocks = dim / kQk;
  const size_t block_bytes = GgmlBlockBytes(kKind), row_bytes = n_blocks * block_bytes;
  alignas(64) uint16_t scale_bits[2][kMaxBlocks][kLanes];
  auto gather_scales = [&](uint32_t t0, uint16_t(*bits)[kLanes]) {
    const uint32_t n = tokens - t0 < kLanes ? tokens - t0 : kLanes;
    for (uint32_t b = 0; b < n_blocks; ++b)
      GatherScales(k + size_t{t0} * row_bytes + b * block_bytes, row_bytes, n, kLanes, bits[b]);
  };
  gather_scales(0, scale_bits[0]);
  for (uint32_t t0 = 0, step = 0; t0 < tokens; t0 += kLanes, ++step) {
    const uint32_t n = tokens - t0 < kLanes ? tokens - t0 : kLanes;
    if (t0 + kLanes < tokens) gather_scales(t0 + kLanes, scale_bits[(step + 1) % 2]);
    HintStream hints = HintStream::Rows(k, row_bytes, t0 + kScoresHintSteps * kLanes, kLanes,
                                        tokens, n_blocks * NH);
    __m512 acc[NH];
    for (int h = 0; h < NH; ++h) acc[h] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < n_blocks; ++b) {
      const std::byte* first = k + size_t{t0} * row_bytes + b * block_bytes;
      __m512i code[8];
      if (n == kLanes) {
        TransposedCodes<kKind>([&](uint32_t t) { return first + t * row_bytes; }, code);
      } else {
        TransposedCodes<kKind>(
            [&](uint32_t t) { return t < n ? first + t * row_bytes : kZeroBlock; }, code);
      }
      const __m512 d = _mm512_cvtph_ps(
          _mm256_load_si256(reinterpret_cast<const __m256i*>(scale_bits[step % 2][b])));
      // Unrolled, so that acc[] stays in registers.
#pragma GCC unroll 8
      for (int h = 0; h < NH; ++h) {
        const uint32_t i = static_cast<uint32_t>(h) * n_blocks + b;
        hints.Step();
        __m512i dot = _mm512_set1_epi32(query.offset[i]);
        for (int j = 0; j < 8; ++j)
          dot = _mm512_dpbusd_epi32(dot, code[j], Broadcast32(query.q[i] + 4 * j));
        acc[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                 _mm512_mul_ps(d, _mm512_set1_ps(query.dq[i])), acc[h]);
      }
    }
    for (int h = 0; h < NH; ++h)
      _mm512_mask_storeu_ps(s + size_t{static_cast<uint32_t>(h)} * tokens + t0, FirstLanes(n),
                            acc[h]);
  }
}

// ---- accumulate --------------------------------------------------------------------------------

// Rounded weights of one group of tokens for NH heads, as the AVX2 kernels round them:
// wq[h][b][t] = round(p[h][t] * d[t][b] / scale[h]) as int8 (q4_0) or int16, one scale per head
// for every block column. Tokens are consecutive, so one dword holds the weights of the 4 (2)
// tokens a multiply-add sums. q4_0 also needs Bias(h, b) = -8 * sum_t wq[h][b][t]
// (mod 2^32). The heads' maxima and the bias sums are reduced 16 vectors at a time (ReduceLanes16;
// the sums are integers below 2^24): one by one, their dependent shuffles took about 40% of q4_0
// accumulate's time.
template <int NH, int kValueBytes, uint32_t kGroup>
struct GroupWeights {
  alignas(64) int8_t wq[NH][kMaxBlocks][kGroup * kValueBytes];
  alignas(64) int32_t bias[kMaxBlocks * NH];  // [b * NH + h]; a multiple of 16
  alignas(64) float scale[16];

  int32_t Bias(int h, uint32_t b) const { return bias[b * NH + static_cast<uint32_t>(h)]; }

  // pg: [NH][kGroup] weights, dk: [n_blocks][kGroup] block scales; both zero past the tile.
  void Build(const float (*pg)[kMaxGroup], const float (*dk)[kMaxGroup], uint32_t n_blocks) {
    constexpr float kLimit = kValueBytes == 1 ? 127.0f : 32767.0f;
    constexpr uint32_t kVectors = kGroup / 16;
    __m512 row_max[kVectors];  // max_b |d[t][b]|: with it, max |p d| costs one pass per head
    for (uint32_t c = 0; c < kVectors; ++c) row_max[c] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < n_blocks; ++b) {
      for (uint32_t c = 0; c < kVectors; ++c)
        row_max[c] = _mm512_max_ps(row_max[c], _mm512_abs_ps(_mm512_load_ps(dk[b] + 16 * c)));
    }
    __m512 head_max[NH];
    for (int h = 0; h < NH; ++h) {
      __m512 m = _mm512_setzero_ps();
      for (uint32_t c = 0; c < kVectors; ++c)
        m = _mm512_max_ps(m,
                          _mm512_abs_ps(_mm512_mul_ps(_mm512_load_ps(pg[h] + 16 * c), row_max[c])));
      head_max[h] = m;
    }
    const __m512 amax = ReduceLanes16<true>(head_max, NH);
    const __m512 limit = _mm512_set1_ps(kLimit);
    _mm512_store_ps(scale, _mm512_div_ps(amax, limit));
    alignas(64) float inv[16];
    _mm512_store_ps(inv, InverseSteps(amax, limit));
    __m512 sums[kMaxBlocks * NH];  // q4_0: [b * NH + h], sum_t wq[h][b][t] in lanes
    for (int h = 0; h < NH; ++h) {
      __m512 p[kVectors];
      for (uint32_t c = 0; c < kVectors; ++c)
        p[c] = _mm512_mul_ps(_mm512_load_ps(pg[h] + 16 * c), _mm512_set1_ps(inv[h]));
      for (uint32_t b = 0; b < n_blocks; ++b) {
        __m512i sum = _mm512_setzero_si512();
        for (uint32_t c = 0; c < kVectors; ++c) {
          const __m512i w = _mm512_cvtps_epi32(_mm512_mul_ps(p[c], _mm512_load_ps(dk[b] + 16 * c)));
          if constexpr (kValueBytes == 1) {
            sum = _mm512_add_epi32(sum, w);
            _mm_store_si128(reinterpret_cast<__m128i*>(wq[h][b] + 16 * c),
                            _mm512_cvtsepi32_epi8(w));
          } else {
            _mm256_store_si256(reinterpret_cast<__m256i*>(wq[h][b] + 32 * c),
                               _mm512_cvtsepi32_epi16(w));
          }
        }
        if constexpr (kValueBytes == 1)
          sums[b * NH + static_cast<uint32_t>(h)] = _mm512_cvtepi32_ps(sum);
      }
    }
    if constexpr (kValueBytes == 1) {
      const uint32_t n = n_blocks * NH;
      for (uint32_t i = 0; i < n; i += 16)
        StoreScaledSums(sums + i, n - i < 16 ? n - i : 16, -kBias<GgmlKind::kQ4_0>, bias + i);
    }
  }
};

// The 32 codes of 4 tokens' q4_0 blocks (block(t), t < 4) for the multiply-adds: low[i], lane
// d = the 4 tokens' codes of dim d (byte t), high: the same for dims 16 + d.
template <typename Block>
[[gnu::always_inline]] inline void FourTokens(Block block, __m512i* low, __m512i* high) {
  __m512i x = _mm512_castsi128_si512(Load16(block(0) + 2));
  x = _mm512_inserti32x4(x, Load16(block(1) + 2), 1);
  x = _mm512_inserti32x4(x, Load16(block(2) + 2), 2);
  x = _mm512_inserti32x4(x, Load16(block(3) + 2), 3);
  // Lane L of 128 bits takes dword L of each token, then its bytes go token-minor.
  const __m512i dwords = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), x);
  const __m512i bytes = _mm512_shuffle_epi8(
      dwords,
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)));
  *low = LowNibbles(bytes);
  *high = HighNibbles(bytes);
}

// Token t's block as 32 int16 values in dim order.
template <GgmlKind kKind>
inline __m512i Values16(const std::byte* block) {
  if constexpr (kKind == GgmlKind::kQ8_0) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)));
  } else {
    const __m128i b = Load16(block + 2);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues));
    const __m128i low = _mm_shuffle_epi8(table, _mm_and_si128(b, mask));
    const __m128i high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
    return _mm512_cvtepi8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1));
  }
}

// acc[0 .. 32) += scale * (lo, hi), int32 sums of dims in the order `order` gives.
inline void AddScaled(float* acc, float scale, __m512i lo, __m512i hi) {
  const __m512 f = _mm512_set1_ps(scale);
  _mm512_storeu_ps(acc, _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(lo), _mm512_loadu_ps(acc)));
  _mm512_storeu_ps(acc + 16, _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(hi), _mm512_loadu_ps(acc + 16)));
}

// The integer sums of block column b over a group of tokens, token t's block at block(t), with
// the group's weights (zero past the tile): lo[h], hi[h] hold dims 0..15 and 16..31 (q4_0) or the
// halves unpack leaves (int16 formats). q4_0's start from the codes' bias, so they sum
// w (code - 8). Full groups pass a block() without the tile's bound.
template <GgmlKind kKind, typename Weights, int NH, typename Block>
[[gnu::always_inline]] inline void ColumnSums(const Weights& weights, uint32_t b, HintStream& hints,
                                              __m512i (&lo)[NH], __m512i (&hi)[NH], Block block) {
  constexpr bool kBytes = kByteCodes<kKind>;
  constexpr uint32_t kGroup = kBytes ? kWeightGroup8 : kWeightGroup16;
  for (int h = 0; h < NH; ++h) {
    lo[h] = hi[h] = kBytes ? _mm512_set1_epi32(weights.Bias(h, b)) : _mm512_setzero_si512();
  }
  for (uint32_t t = 0; t < kGroup; t += kBytes ? 4 : 2) {
    hints.Step();
    if constexpr (kBytes) {
      __m512i low, high;
      FourTokens([&](uint32_t i) { return block(t + i); }, &low, &high);
      for (int h = 0; h < NH; ++h) {
        const __m512i w = Broadcast32(weights.wq[h][b] + t);
        lo[h] = _mm512_dpbusd_epi32(lo[h], low, w);
        hi[h] = _mm512_dpbusd_epi32(hi[h], high, w);
      }
    } else {
      const __m512i x0 = Values16<kKind>(block(t)), x1 = Values16<kKind>(block(t + 1));
      const __m512i first = _mm512_unpacklo_epi16(x0, x1), second = _mm512_unpackhi_epi16(x0, x1);
      for (int h = 0; h < NH; ++h) {
        const __m512i w = Broadcast32(weights.wq[h][b] + 2 * t);
        lo[h] = _mm512_dpwssd_epi32(lo[h], first, w);
        hi[h] = _mm512_dpwssd_epi32(hi[h], second, w);
      }
    }
  }
}

// Accumulate of NH heads (p: [NH, tokens], acc: [NH, dim]) in groups of G tokens, block column
// by block column: the group's integer sums of a column stay in registers.
template <GgmlKind kKind, int NH>
void AccumulateHeads(const std::byte* v, uint32_t tokens, uint32_t dim, const float* p,
                     float* acc) {
  constexpr bool kBytes = kByteCodes<kKind>;
  constexpr uint32_t kGroup = kBytes ? kWeightGroup8 : kWeightGroup16;
  constexpr uint32_t kStep = kBytes ? 4 : 2;  // tokens a multiply-add sums
  const uint32_t n_blocks = dim / kQk;
  const size_t block_bytes = GgmlBlockBytes(kKind), row_bytes = n_blocks * block_bytes;
  alignas(64) float pg[NH][kMaxGroup];
  alignas(64) float dk[kMaxBlocks][kMaxGroup];
  // Scales are gathered one group ahead, as in scores.
  alignas(64) uint16_t dk_bits[2][kMaxBlocks][kMaxGroup];
  GroupWeights<NH, kBytes ? 1 : 2, kGroup> weights;
  auto gather_scales = [&](uint32_t t0, uint16_t(*bits)[kMaxGroup]) {
    const uint32_t n = tokens - t0 < kGroup ? tokens - t0 : kGroup;
    for (uint32_t b = 0; b < n_blocks; ++b)
      GatherScales(v + size_t{t0} * row_bytes + b * block_bytes, row_bytes, n, kGroup, bits[b]);
  };
  // unpacklo/hi_epi16 of two tokens' values leave dims 8L .. 8L+3 (lo) and 8L+4 .. 8L+7 (hi) in
  // 128-bit lane L; these put them back in order.
  const __m512i order_lo =
      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i order_hi =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  gather_scales(0, dk_bits[0]);
  for (uint32_t t0 = 0, g = 0; t0 < tokens; t0 += kGroup, ++g) {
    const uint32_t n = tokens - t0 < kGroup ? tokens - t0 : kGroup;
    if (t0 + kGroup < tokens) gather_scales(t0 + kGroup, dk_bits[(g + 1) % 2]);
    HintStream hints = HintStream::Rows(v, row_bytes, t0 + kAccumulateHintGroups * kGroup, kGroup,
                                        tokens, n_blocks * (kGroup / kStep));
    for (int h = 0; h < NH; ++h) {
      const float* ph = p + size_t{static_cast<uint32_t>(h)} * tokens + t0;
      for (uint32_t i = 0; i < kGroup; i += 16)
        _mm512_store_ps(pg[h] + i, _mm512_maskz_loadu_ps(FirstLanes(n > i ? n - i : 0), ph + i));
    }
    for (uint32_t b = 0; b < n_blocks; ++b) {
      for (uint32_t i = 0; i < kGroup; i += 16) {
        _mm512_store_ps(dk[b] + i, _mm512_cvtph_ps(_mm256_load_si256(
                                       reinterpret_cast<const __m256i*>(dk_bits[g % 2][b] + i))));
      }
    }
    weights.Build(pg, dk, n_blocks);
    for (uint32_t b = 0; b < n_blocks; ++b) {
      const std::byte* first = v + size_t{t0} * row_bytes + b * block_bytes;
      __m512i lo[NH], hi[NH];
      if (n == kGroup) {
        ColumnSums<kKind>(weights, b, hints, lo, hi,
                          [&](uint32_t t) { return first + t * row_bytes; });
      } else {
        ColumnSums<kKind>(weights, b, hints, lo, hi,
                          [&](uint32_t t) { return t < n ? first + t * row_bytes : kZeroBlock; });
      }
      for (int h = 0; h < NH; ++h) {
        float* out = acc + size_t{static_cast<uint32_t>(h)} * dim + b * kQk;
        if constexpr (kBytes) {
          AddScaled(out, weights.scale[h], lo[h], hi[h]);
        } else {
          AddScaled(out, weights.scale[h], _mm512_permutex2var_epi32(lo[h], order_lo, hi[h]),
                    _mm512_permutex2var_epi32(lo[h], order_hi, hi[h]));
        }
      }
    }
  }
}

// ---- dispatch ----------------------------------------------------------------------------------

}  // namespace

void ScoresGgmlAvx512(GgmlKind kind, const std::byte* k, uint32_t tokens, uint32_t dim,
                      const float* q, uint32_t n_q, float* s) {
  ByKind(kind, [&](auto format) {
    ByHeadPasses<kMaxHeads>(n_q, [&](auto heads, uint32_t i) {
      ScoresHeads<decltype(format)::kValue, decltype(heads)::kCount>(
          k, tokens, dim, q + size_t{i} * dim, s + size_t{i} * tokens);
    });
  });
}

void AccumulateGgmlAvx512(GgmlKind kind, const std::byte* v, uint32_t tokens, uint32_t dim,
                          const float* p, uint32_t n_q, float* acc) {
  ByKind(kind, [&](auto format) {
    ByHeadPasses<kMaxHeads>(n_q, [&](auto heads, uint32_t i) {
      AccumulateHeads<decltype(format)::kValue, decltype(heads)::kCount>(
          v, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
    });
  });
}

}  // namespace argus::codec_internal
