// AVX2 kernels of the ggml block codecs (rows of whole 32-value blocks). With GQA every K/V value
// meets n_q query heads and the f16 kernels are FMA-bound; these kernels trade FMAs for integer
// multiply-adds that do 16 (vpmaddwd) or 32 (vpmaddubsw) products each, and load and unpack
// each block once for up to 8 heads. On this project's AVX2 machines the cost is the number of
// vector instructions per token-block, which is what the layouts below minimise.
//
// scores: the query is rounded once per call and per 32-block to int8 (q4_0) or int16 (q8_0,
//   iq4_nl: signed 8-bit values would need a sign fix-up per head before vpmaddubsw) with a scale
//   dq (int8: llama.cpp's q8_0 rounding, fp16 scale included; int16: a float scale). A register
//   holds NH heads x (32/NH) dims of the query; the same dims of the key block are broadcast NH
//   times, so one multiply-add serves all heads and the per-head sums stay in separate lanes. Per
//   block: the integer dot, q4_0's offset (8 * sum q, precomputed), the lanes of 8/NH tokens summed
//   into one vector (exact; a lane per token and head), then acc += (d_k * dq) * dot in float, the
//   same steps whatever NH. Codes and scales of 8 tokens are expanded first, then their scores
//   computed and transposed together.
// accumulate: acc[i] += sum_t p[i][t] v_t is an [n_q x T] . [T x 32] product per block column.
//   The weights p[i][t] * d_t of a group of tokens are rounded to int8 (q4_0) or int16 with one
//   scale per head and group; two tokens' codes are interleaved so that each multiply-add sums a
//   token pair, and the group's integer sums are scaled into acc once per block column. Each head's
//   sums stay in its registers, except from 4 heads on with 16-bit weights: those heads take, one
//   after another, a column of interleaved pairs expanded once for all of them.
// The rounding bounds are stated in ggml_kernels.h.
#include <immintrin.h>

#include <cstring>

#include "argus/codec.h"
#include "codec/ggml_kernels.h"
#include "core/avx2_reduce.h"

namespace argus::codec_internal {
namespace {

using avx2::HorizontalMax;

constexpr uint32_t kQk = 32;                        // values per block
constexpr uint32_t kMaxBlocks = kMaxTileDim / kQk;  // blocks per row
constexpr uint32_t kMaxGroup = kWeightGroup16;      // the larger weight group

inline uint16_t LoadHalfBits(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
inline float LoadHalf(const std::byte* p) { return _cvtsh_ss(LoadHalfBits(p)); }

inline __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// The 32 nibbles of a q4_0 / iq4_nl block (qs: 16 bytes) as bytes, dims in order.
inline __m256i Nibbles(const std::byte* qs) {
  const __m256i b =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_set_epi64x(4, 4, 0, 0)),
                          _mm256_set1_epi8(0x0f));
}

// Dims [16 * half, 16 * half + 16) of a q8_0 / iq4_nl block as int8 values in units of d (iq4_nl:
// dims [0..16) are the low nibbles of its 16 code bytes, [16..32) the high ones).
template <GgmlKind kKind>
inline __m128i Values8(const std::byte* block, int half) {
  if constexpr (kKind == GgmlKind::kQ8_0) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 + 16 * half));
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m128i codes = _mm_and_si128(half ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0f));
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues));
    return _mm_shuffle_epi8(table, codes);
  }
}

// The same dims as int16 values.
template <GgmlKind kKind>
inline __m256i Values16(const std::byte* block, int half) {
  return _mm256_cvtepi8_epi16(Values8<kKind>(block, half));
}

// A chunk of `kBytes` bytes (4, 8, 16 or 32) repeated to fill a register.
template <int kBytes>
inline __m256i Broadcast(const void* p) {
  if constexpr (kBytes == 4) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
  } else if constexpr (kBytes == 8) {
    int64_t x;
    std::memcpy(&x, p, 8);
    return _mm256_set1_epi64x(x);
  } else if constexpr (kBytes == 16) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  } else {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  }
}

// ---- scores ------------------------------------------------------------------------------------

// q4_0 multiplies unsigned codes by int8 queries; q8_0 and iq4_nl multiply int16 by int16.
template <GgmlKind kKind>
constexpr bool kUnsignedCodes = kKind == GgmlKind::kQ4_0;

// A block's integer dot product for one token holds head h in lanes [h 8/NH, (h + 1) 8/NH).
// PackDots sums those lanes (exactly) for 8/NH tokens at once into one vector: lane l holds head
// HeadOfLane<NH>(l) of token 0 (NH 8), l / 2 % 2 (NH 4), l % 4 (NH 2) or l (NH 1). Every
// (token, head) then gets the same float steps whatever NH, and so does its score.
template <int NH>
constexpr int HeadOfLane(int l) {
  return NH == 8 ? l : NH == 4 ? 2 * (l / 4) + l % 2 : NH == 2 ? l / 4 : 0;
}
template <int NH>
inline __m256i PackDots(const __m256i* d) {
  if constexpr (NH == 8) {
    return d[0];
  } else if constexpr (NH == 4) {
    return _mm256_hadd_epi32(d[0], d[1]);
  } else if constexpr (NH == 2) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
  } else {  // each half holds tokens 0..3 of half the lanes: add the halves
    const __m256i x =
        _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
    const __m256i y =
        _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20),
                            _mm256_permute2x128_si256(x, y, 0x31));
  }
}

// The key scales d[0 .. 8/NH) of PackDots' tokens in its lane layout (scalar loads: a wide load
// of narrow stores would stall).
template <int NH>
inline __m256 LaneScales(const float* d) {
  if constexpr (NH == 8) {
    return _mm256_broadcast_ss(d);
  } else if constexpr (NH == 4) {
    return _mm256_blend_ps(_mm256_broadcast_ss(d), _mm256_broadcast_ss(d + 1), 0xcc);
  } else if constexpr (NH == 2) {
    const __m128 x = _mm_setr_ps(d[0], d[1], d[2], d[3]);
    return _mm256_set_m128(x, x);
  } else {
    return _mm256_setr_ps(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
  }
}

// The query of NH heads in the layout of the multiply-adds. Block b takes `kSteps` registers;
// register s holds, for each head h, the chunk of 32/NH bytes starting at byte s*32/NH of the
// head's rounded block (int8 or int16 values). dq: the query scale of head HeadOfLane<NH>(l) in
// lane l.
template <GgmlKind kKind, int NH>
struct QueryBlocks {
  static constexpr int kValueBytes = kUnsignedCodes<kKind> ? 1 : 2;
  static constexpr int kSteps = NH * kValueBytes;
  static constexpr int kChunk = 32 / NH;
  alignas(32) int8_t q[kMaxBlocks][kSteps][32];
  alignas(32) float dq[kMaxBlocks][8];
  alignas(32) int32_t offset[kMaxBlocks][8];  // q4_0: the multiply-add of code 8, subtracted

  // Heads from n_heads on are zero (a padded group). A block's 8 head maxima are reduced at
  // once (a transpose, then maxima down the columns) and its scales computed in one vector: one
  // by one, the dependent reductions and scalar conversions took about a tenth of scores' time.
  void Build(const float* query, uint32_t dim, int n_heads) {
    const __m256 limit = _mm256_set1_ps(kValueBytes == 1 ? 127.0f : 32767.0f);
    const __m256i lane_heads = _mm256_setr_epi32(
        HeadOfLane<NH>(0), HeadOfLane<NH>(1), HeadOfLane<NH>(2), HeadOfLane<NH>(3),
        HeadOfLane<NH>(4), HeadOfLane<NH>(5), HeadOfLane<NH>(6), HeadOfLane<NH>(7));
    for (uint32_t b = 0; b < dim / kQk; ++b) {
      auto values = [&](int h, int i) {
        return h < n_heads ? _mm256_loadu_ps(query + size_t{static_cast<uint32_t>(h)} * dim +
                                             b * kQk + 8 * i)
                           : _mm256_setzero_ps();
      };
      __m256 m[8] = {};  // m[h]: lane maxima of head h's |values|; zero for missing heads
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < 4; ++i) m[h] = _mm256_max_ps(m[h], Abs(values(h, i)));
      avx2::Transpose8(m);
      __m256 amax = m[0];  // lane h: head h's maximum
      for (int i = 1; i < 8; ++i) amax = _mm256_max_ps(amax, m[i]);
      alignas(32) float inv[8];
      _mm256_store_ps(inv, _mm256_and_ps(_mm256_cmp_ps(amax, _mm256_setzero_ps(), _CMP_GT_OQ),
                                         _mm256_div_ps(limit, amax)));
      // int8: Int8QueryScale, the step rounded to fp16 (to nearest even, as FloatToHalf).
      const __m256 step = _mm256_div_ps(amax, limit);
      const __m256 dq_heads = kValueBytes == 1
                                  ? _mm256_cvtph_ps(_mm256_cvtps_ph(
                                        step, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
                                  : step;
      _mm256_store_ps(dq[b], _mm256_permutevar8x32_ps(dq_heads, lane_heads));
      for (int h = 0; h < NH; ++h) {
        const __m256 scale = _mm256_set1_ps(inv[h]);
        __m256i n[4];
        for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(values(h, i), scale));
        // Packs work within 128-bit lanes; the permutes restore dim order.
        const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(n[0], n[1]), 0xd8);
        const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(n[2], n[3]), 0xd8);
        alignas(32) int8_t bytes[64];
        if constexpr (kValueBytes == 1) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(bytes),
                             _mm256_permute4x64_epi64(_mm256_packs_epi16(lo, hi), 0xd8));
        } else {
          _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), lo);
          _mm256_store_si256(reinterpret_cast<__m256i*>(bytes + 32), hi);
        }
        for (int s = 0; s < kSteps; ++s)
          std::memcpy(&q[b][s][h * kChunk], bytes + s * kChunk, kChunk);
      }
      if constexpr (kUnsignedCodes<kKind>) {
        __m256i sum = _mm256_setzero_si256();
        for (int s = 0; s < kSteps; ++s)
          sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(_mm256_set1_epi8(8), Step(b, s)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(offset[b]),
                           _mm256_madd_epi16(sum, _mm256_set1_epi16(1)));
      }
    }
  }

  __m256i Step(uint32_t b, int s) const {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(q[b][s]));
  }
};

// Scores of the first n_heads of NH heads for the n <= 8 tokens from t0 -> s[h][t0 ..]; acc[v]
// holds tokens v 8/NH .. in PackDots' lane layout.
template <int NH>
inline void StoreScores(const __m256* acc, uint32_t n, int n_heads, float* s, uint32_t tokens,
                        uint32_t t0) {
  __m256 x[8];
  if constexpr (NH == 8) {  // acc[t] lane h: one transpose
    for (int i = 0; i < 8; ++i) x[i] = acc[i];
    avx2::Transpose8(x);
  } else if constexpr (NH == 4) {  // acc[v] = [t h0, t h1, t' h0, t' h1 | t h2, t h3, t' h2, t' h3]
    const __m256 e0 = _mm256_shuffle_ps(acc[0], acc[1], 0x88),
                 e1 = _mm256_shuffle_ps(acc[0], acc[1], 0xdd);
    const __m256 f0 = _mm256_shuffle_ps(acc[2], acc[3], 0x88),
                 f1 = _mm256_shuffle_ps(acc[2], acc[3], 0xdd);
    x[0] = _mm256_permute2f128_ps(e0, f0, 0x20);
    x[1] = _mm256_permute2f128_ps(e1, f1, 0x20);
    x[2] = _mm256_permute2f128_ps(e0, f0, 0x31);
    x[3] = _mm256_permute2f128_ps(e1, f1, 0x31);
  } else if constexpr (NH == 2) {  // acc[v] = [4 tokens of h0 | the same of h1]
    x[0] = _mm256_permute2f128_ps(acc[0], acc[1], 0x20);
    x[1] = _mm256_permute2f128_ps(acc[0], acc[1], 0x31);
  } else {
    x[0] = acc[0];
  }
  for (int h = 0; h < n_heads; ++h)
    avx2::StoreLanes(s + size_t{static_cast<uint32_t>(h)} * tokens + t0, x[h], n);
}

// The integer dot products of one token's expanded block (codes c) with block b of NH heads'
// query, head h in lanes [h 8/NH, (h + 1) 8/NH).
template <GgmlKind kKind, int NH>
inline __m256i BlockDot(const QueryBlocks<kKind, NH>& query, const int8_t* c, uint32_t b) {
  using Query = QueryBlocks<kKind, NH>;
  if constexpr (kUnsignedCodes<kKind>) {
    __m256i sum = _mm256_maddubs_epi16(Broadcast<Query::kChunk>(c), query.Step(b, 0));
    for (int st = 1; st < Query::kSteps; ++st) {
      sum = _mm256_add_epi16(sum,
                             _mm256_maddubs_epi16(Broadcast<Query::kChunk>(c + st * Query::kChunk),
                                                  query.Step(b, st)));
    }
    return _mm256_sub_epi32(_mm256_madd_epi16(sum, _mm256_set1_epi16(1)),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(query.offset[b])));
  } else {
    __m256i dot = _mm256_madd_epi16(Broadcast<Query::kChunk>(c), query.Step(b, 0));
    for (int st = 1; st < Query::kSteps; ++st) {
      dot = _mm256_add_epi32(
          dot,
          _mm256_madd_epi16(Broadcast<Query::kChunk>(c + st * Query::kChunk), query.Step(b, st)));
    }
    return dot;
  }
}

// Scores of n_heads <= NH heads (q: [n_heads, dim], s: [n_heads, tokens]; the rest of the group
// computed as zero heads and dropped), 8 tokens at a time: their codes are first
// expanded to bytes (q4_0) or int16 and their scales to float in scratch, so the dot products
// broadcast-load both from memory (load ports) instead of shuffling registers (port 5). Then
// 8/NH tokens at a time: their block dot products packed into one vector (PackDots), scaled and
// summed over the blocks in float.
template <GgmlKind kKind, int NH>
void ScoresHeads(const std::byte* k, uint32_t tokens, uint32_t dim, const float* q, int n_heads,
                 float* s) {
  using Query = QueryBlocks<kKind, NH>;
  constexpr int kCodeBytes = 32 * Query::kValueBytes, kPack = 8 / NH;
  Query query;
  query.Build(q, dim, n_heads);
  const size_t block_bytes = GgmlBlockBytes(kKind);
  const uint32_t n_blocks = dim / kQk;
  alignas(32) int8_t codes[8][kMaxBlocks][kCodeBytes];
  alignas(32) float scales[kMaxBlocks * 8];  // [block][token]
  __m256 acc[NH];
  for (uint32_t t0 = 0; t0 < tokens; t0 += 8) {
    const uint32_t n = tokens - t0 < 8 ? tokens - t0 : 8;
    for (uint32_t i = 0; i < 8; ++i) {
      if (i >= n) {  // a partial block: zeros, which no store keeps
        std::memset(codes[i], 0, n_blocks * sizeof(codes[i][0]));
        for (uint32_t b = 0; b < n_blocks; ++b) scales[8 * b + i] = 0.0f;
        continue;
      }
      const std::byte* row = k + size_t{t0 + i} * n_blocks * block_bytes;
      for (uint32_t b = 0; b < n_blocks; ++b) {
        const std::byte* block = row + b * block_bytes;
        scales[8 * b + i] = LoadHalf(block);
        __m256i* out = reinterpret_cast<__m256i*>(codes[i][b]);
        if constexpr (kUnsignedCodes<kKind>) {
          _mm256_store_si256(out, Nibbles(block + 2));
        } else {
          _mm256_store_si256(out, Values16<kKind>(block, 0));
          _mm256_store_si256(out + 1, Values16<kKind>(block, 1));
        }
      }
    }
    for (int v = 0; v < NH; ++v) {
      __m256 sum = _mm256_setzero_ps();
      const bool any = static_cast<uint32_t>(v * kPack) < n;  // else a pack past the tile
      for (uint32_t b = 0; any && b < n_blocks; ++b) {
        __m256i dots[kPack];
        for (int j = 0; j < kPack; ++j) dots[j] = BlockDot(query, codes[v * kPack + j][b], b);
        const __m256 scale =
            _mm256_mul_ps(LaneScales<NH>(&scales[8 * b + v * kPack]), _mm256_load_ps(query.dq[b]));
        sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(PackDots<NH>(dots)), scale, sum);
      }
      acc[v] = sum;
    }
    StoreScores<NH>(acc, n, n_heads, s, tokens, t0);
  }
}

// ---- accumulate --------------------------------------------------------------------------------

// acc[0..16) += scale * sums, from int32 sums of dims [0..8) and [8..16).
inline void AddScaled(float* acc, __m256 scale, __m256i sums0_7, __m256i sums8_15) {
  _mm256_storeu_ps(acc, _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums0_7), _mm256_loadu_ps(acc)));
  _mm256_storeu_ps(acc + 8,
                   _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums8_15), _mm256_loadu_ps(acc + 8)));
}

// Rounded weights of one group of tokens for NH heads: wq[h][b] holds round(p[h][t] * d[t][b] /
// scale[h]) for the group's tokens in order, as int8 (q4_0) or int16; one scale per head
// covers every block column (the bound in ggml_kernels.h holds for it, as the largest |w|
// alone bounds its token's whole row). q4_0 also needs offset[h][b] = 8 * sum_t wq[h][b][t].
template <int NH, int kValueBytes, uint32_t kGroup>
struct GroupWeights {
  alignas(32) int8_t wq[NH][kMaxBlocks][kGroup * kValueBytes];
  alignas(32) int16_t offset[NH][kMaxBlocks];
  float scale[NH];

  // pg: [NH][kGroup] weights, dk: [n_blocks][kGroup] block scales; both zero past the tile.
  void Build(const float (*pg)[kMaxGroup], const float (*dk)[kMaxGroup], uint32_t n_blocks) {
    constexpr float kLimit = kValueBytes == 1 ? 127.0f : 32767.0f;
    __m256 row_max[kGroup / 8];  // max_b |d[t][b]|: with it, max |p d| costs one pass per head
    for (uint32_t c = 0; c < kGroup / 8; ++c) row_max[c] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < n_blocks; ++b) {
      for (uint32_t c = 0; c < kGroup / 8; ++c)
        row_max[c] = _mm256_max_ps(row_max[c], Abs(_mm256_load_ps(dk[b] + 8 * c)));
    }
    // All heads' scales first, so their reductions and divisions overlap.
    __m256 inv[NH];
    for (int h = 0; h < NH; ++h) {
      __m256 m = _mm256_setzero_ps();
      for (uint32_t c = 0; c < kGroup / 8; ++c)
        m = _mm256_max_ps(m, Abs(_mm256_mul_ps(_mm256_load_ps(pg[h] + 8 * c), row_max[c])));
      const float amax = HorizontalMax(m);
      scale[h] = amax / kLimit;
      inv[h] = _mm256_set1_ps(amax > 0.0f ? kLimit / amax : 0.0f);
    }
    for (int h = 0; h < NH; ++h) {
      __m256 p[kGroup / 8];
      for (uint32_t c = 0; c < kGroup / 8; ++c)
        p[c] = _mm256_mul_ps(_mm256_load_ps(pg[h] + 8 * c), inv[h]);
      alignas(32) int32_t sums[kMaxBlocks][8];  // q4_0: per block column, lanes of sum(wq)
      for (uint32_t b = 0; b < n_blocks; ++b) {
        __m256i sum = _mm256_setzero_si256();
        for (uint32_t c = 0; c < kGroup / 8; c += 2) {
          const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(p[c], _mm256_load_ps(dk[b] + 8 * c)));
          const __m256i hi =
              _mm256_cvtps_epi32(_mm256_mul_ps(p[c + 1], _mm256_load_ps(dk[b] + 8 * c + 8)));
          // Packs work within 128-bit lanes; the permute restores token order.
          const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8);
          if constexpr (kValueBytes == 1) {
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(lo, hi));
            const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(words, words), 0x08);
            _mm_store_si128(reinterpret_cast<__m128i*>(wq[h][b] + 8 * c),
                            _mm256_castsi256_si128(bytes));
          } else {
            _mm256_store_si256(reinterpret_cast<__m256i*>(wq[h][b] + 16 * c), words);
          }
        }
        if constexpr (kValueBytes == 1)
          _mm256_store_si256(reinterpret_cast<__m256i*>(sums[b]), sum);
      }
      if constexpr (kValueBytes == 1) {
        // Horizontal sums of four block columns at once: [b0 b1 b2 b3] in each 128-bit lane.
        for (uint32_t b = 0; b < n_blocks; b += 4) {
          auto lanes = [&](uint32_t i) {
            return b + i < n_blocks
                       ? _mm256_load_si256(reinterpret_cast<const __m256i*>(sums[b + i]))
                       : _mm256_setzero_si256();
          };
          const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(lanes(0), lanes(1)),
                                              _mm256_hadd_epi32(lanes(2), lanes(3)));
          alignas(16) int32_t total[4];
          _mm_store_si128(
              reinterpret_cast<__m128i*>(total),
              _mm_slli_epi32(
                  _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)), 3));
          for (uint32_t i = 0; i < 4 && b + i < n_blocks; ++i)
            offset[h][b + i] = static_cast<int16_t>(total[i]);
        }
      }
    }
  }
};

// Adds one token pair's products at a block column to the accumulators of NH heads. r0, r1:
// the two tokens' blocks; w points at head 0's rounded weights of the pair (two int8 for q4_0,
// two int16 otherwise), the next head's `stride` bytes on. q4_0: lo/hi[h] are int16 sums of
// dims [0..16) and [16..32). Otherwise lo/hi[h] are int32 sums of dims [0..4 | 8..12] and
// [4..8 | 12..16] of dims [16 half, 16 half + 16).
template <GgmlKind kKind, int NH>
inline void AddPair(const std::byte* r0, const std::byte* r1, int half, const int8_t* w,
                    size_t stride, __m256i* lo, __m256i* hi) {
  if constexpr (kUnsignedCodes<kKind>) {
    const __m256i x0 = Broadcast<16>(r0 + 2), x1 = Broadcast<16>(r1 + 2);
    // [bytes 0..7 of both tokens interleaved | bytes 8..15 interleaved]
    const __m256i both =
        _mm256_blend_epi32(_mm256_unpacklo_epi8(x0, x1), _mm256_unpackhi_epi8(x0, x1), 0xf0);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i low = _mm256_and_si256(both, mask),
                  high = _mm256_and_si256(_mm256_srli_epi16(both, 4), mask);
    for (int h = 0; h < NH; ++h) {
      int16_t pair;
      std::memcpy(&pair, w + h * stride, 2);
      const __m256i wh = _mm256_set1_epi16(pair);
      lo[h] = _mm256_add_epi16(_mm256_maddubs_epi16(low, wh), lo[h]);
      hi[h] = _mm256_add_epi16(_mm256_maddubs_epi16(high, wh), hi[h]);
    }
  } else {
    const __m256i x0 = Values16<kKind>(r0, half), x1 = Values16<kKind>(r1, half);
    const __m256i first = _mm256_unpacklo_epi16(x0, x1), second = _mm256_unpackhi_epi16(x0, x1);
    for (int h = 0; h < NH; ++h) {
      int32_t pair;
      std::memcpy(&pair, w + h * stride, 4);
      const __m256i wh = _mm256_set1_epi32(pair);
      lo[h] = _mm256_add_epi32(_mm256_madd_epi16(first, wh), lo[h]);
      hi[h] = _mm256_add_epi32(_mm256_madd_epi16(second, wh), hi[h]);
    }
  }
}

// All pairs of the group's n tokens at block column b (first: the first token's block). An odd
// last token is paired with itself, its partner's weight being zero.
template <GgmlKind kKind, int NH, typename Weights>
inline void AddGroup(const std::byte* first, size_t row_bytes, uint32_t n, uint32_t b, int half,
                     const Weights& weights, __m256i* lo, __m256i* hi) {
  constexpr size_t kPairBytes = kUnsignedCodes<kKind> ? 2 : 4;
  const size_t stride = sizeof(weights.wq[0]);
  const int8_t* w = weights.wq[0][b];
  const std::byte* r = first;
  uint32_t k = 0;
  for (; 2 * k + 1 < n; ++k, r += 2 * row_bytes, w += kPairBytes)
    AddPair<kKind, NH>(r, r + row_bytes, half, w, stride, lo, hi);
  if (2 * k < n) AddPair<kKind, NH>(r, r, half, w, stride, lo, hi);
}

// With 16-bit products AddPair keeps two accumulators per head beside the interleaved values:
// from 4 heads on the registers run short (at 7 and 8 accumulators spill at every token pair).
// There the group's codes at a block column are instead expanded once into token pairs
// (PairColumn), and the heads take the column one after another, each in four accumulators
// (AddColumn): the same integer sums, so the same bits. Below 4 heads the register path is
// faster; q4_0, whose 8-bit pairs fit, keeps the register path at every head count.
constexpr int kMaxRegisterHeads16 = 3;

// A group's q8_0 / iq4_nl values at one block column: pair[k][j] holds dims [8j, 8j + 8) of
// tokens 2k and 2k + 1 as interleaved int16 values. An odd last token is paired with itself, its
// partner's weight being zero.
template <GgmlKind kKind>
struct PairColumn {
  alignas(32) __m256i pair[kMaxGroup / 2][4];

  // first: the group's first block at this column; returns the number of pairs of n tokens.
  uint32_t Expand(const std::byte* first, size_t row_bytes, uint32_t n) {
    const uint32_t n_pairs = (n + 1) / 2;
    for (uint32_t k = 0; k < n_pairs; ++k) {
      const std::byte* r0 = first + 2 * k * row_bytes;
      const std::byte* r1 = 2 * k + 1 < n ? r0 + row_bytes : r0;
      for (int half = 0; half < 2; ++half) {
        const __m128i x0 = Values8<kKind>(r0, half), x1 = Values8<kKind>(r1, half);
        pair[k][2 * half] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x0, x1));
        pair[k][2 * half + 1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(x0, x1));
      }
    }
    return n_pairs;
  }
};

// acc[0 .. 32) += scale * the column's products with one head's rounded weights w (two int16 a
// pair). Unrolled by two pairs: rolled, GCC 12 copies the four accumulators at every pair.
template <GgmlKind kKind>
inline void AddColumn(const PairColumn<kKind>& column, uint32_t n_pairs, const int8_t* w,
                      float scale, float* acc) {
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256(),
          s3 = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (uint32_t k = 0; k < n_pairs; ++k) {
    int32_t pair;
    std::memcpy(&pair, w + 4 * k, 4);
    const __m256i wh = _mm256_set1_epi32(pair);
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(column.pair[k][0], wh));
    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(column.pair[k][1], wh));
    s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(column.pair[k][2], wh));
    s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(column.pair[k][3], wh));
  }
  const __m256 scale_h = _mm256_set1_ps(scale);
  AddScaled(acc, scale_h, s0, s1);
  AddScaled(acc + 16, scale_h, s2, s3);
}

// Accumulate of NH heads (p: [NH, tokens], acc: [NH, dim]) in groups of G tokens. Codes of
// token pairs are interleaved so that each multiply-add sums a pair. q4_0 sums 8-bit products
// in int16: sum w (code - 8) over 32 tokens fits (|w| <= 127, |code - 8| <= 8), so the wrapping
// of the sums of unsigned codes cancels when 8 sum(w) is subtracted. 16-bit products sum in
// int32 (64 tokens of |w| <= 32767, |value| <= 128).
template <GgmlKind kKind, int NH>
void AccumulateHeads(const std::byte* v, uint32_t tokens, uint32_t dim, const float* p,
                     float* acc) {
  constexpr bool kBytes = kUnsignedCodes<kKind>;
  constexpr uint32_t kGroup = kBytes ? kWeightGroup8 : kWeightGroup16;
  const uint32_t n_blocks = dim / kQk;
  const size_t block_bytes = GgmlBlockBytes(kKind), row_bytes = n_blocks * block_bytes;
  alignas(32) float pg[NH][kMaxGroup];
  alignas(32) float dk[kMaxBlocks][kMaxGroup];
  // Scales are gathered one group ahead: converting them 16 bytes at a time right after their
  // 2-byte stores would stall on store forwarding.
  alignas(32) uint16_t dk_bits[2][kMaxBlocks][kMaxGroup];
  GroupWeights<NH, kBytes ? 1 : 2, kGroup> weights;
  auto gather_scales = [&](uint32_t t0, uint16_t(*bits)[kMaxGroup]) {
    const uint32_t n = tokens - t0 < kGroup ? tokens - t0 : kGroup;
    for (uint32_t b = 0; b < n_blocks; ++b) {
      const std::byte* scale = v + size_t{t0} * row_bytes + b * block_bytes;
      for (uint32_t i = 0; i < n; ++i, scale += row_bytes) bits[b][i] = LoadHalfBits(scale);
      for (uint32_t i = n; i < kGroup; ++i) bits[b][i] = 0;
    }
  };
  gather_scales(0, dk_bits[0]);
  for (uint32_t t0 = 0, g = 0; t0 < tokens; t0 += kGroup, ++g) {
    const uint32_t n = tokens - t0 < kGroup ? tokens - t0 : kGroup;
    if (t0 + kGroup < tokens) gather_scales(t0 + kGroup, dk_bits[(g + 1) % 2]);
    for (int h = 0; h < NH; ++h) {
      const float* ph = p + size_t{static_cast<uint32_t>(h)} * tokens + t0;
      for (uint32_t i = 0; i < kGroup; i += 8) {
        _mm256_store_ps(pg[h] + i, i + 8 <= n ? _mm256_loadu_ps(ph + i) : _mm256_setzero_ps());
      }
      for (uint32_t i = n & ~7u; i < n; ++i) pg[h][i] = ph[i];
    }
    const std::byte* group = v + size_t{t0} * row_bytes;
    for (uint32_t b = 0; b < n_blocks; ++b) {
      for (uint32_t i = 0; i < kGroup; i += 8) {
        _mm256_store_ps(dk[b] + i, _mm256_cvtph_ps(_mm_load_si128(
                                       reinterpret_cast<const __m128i*>(dk_bits[g % 2][b] + i))));
      }
    }
    weights.Build(pg, dk, n_blocks);
    for (uint32_t b = 0; b < n_blocks; ++b) {
      const std::byte* first_row = group + b * block_bytes;
      if constexpr (kBytes) {
        __m256i lo[NH], hi[NH];
        for (int h = 0; h < NH; ++h) lo[h] = hi[h] = _mm256_setzero_si256();
        AddGroup<kKind, NH>(first_row, row_bytes, n, b, 0, weights, lo, hi);
        for (int h = 0; h < NH; ++h) {
          float* out = acc + size_t{static_cast<uint32_t>(h)} * dim + b * kQk;
          const __m256i offset = _mm256_set1_epi16(weights.offset[h][b]);
          const __m256i l = _mm256_sub_epi16(lo[h], offset), u = _mm256_sub_epi16(hi[h], offset);
          const __m256 scale = _mm256_set1_ps(weights.scale[h]);
          AddScaled(out, scale, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(l)),
                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256(l, 1)));
          AddScaled(out + 16, scale, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(u)),
                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256(u, 1)));
        }
      } else if constexpr (NH > kMaxRegisterHeads16) {
        PairColumn<kKind> column;
        const uint32_t n_pairs = column.Expand(first_row, row_bytes, n);
        for (int h = 0; h < NH; ++h) {
          AddColumn(column, n_pairs, weights.wq[h][b], weights.scale[h],
                    acc + size_t{static_cast<uint32_t>(h)} * dim + b * kQk);
        }
      } else {
        for (int half = 0; half < 2; ++half) {
          __m256i a[NH], c[NH];  // dims [0..4 | 8..12] and [4..8 | 12..16] of this half
          for (int h = 0; h < NH; ++h) a[h] = c[h] = _mm256_setzero_si256();
          AddGroup<kKind, NH>(first_row, row_bytes, n, b, half, weights, a, c);
          for (int h = 0; h < NH; ++h) {
            AddScaled(acc + size_t{static_cast<uint32_t>(h)} * dim + b * kQk + 16 * half,
                      _mm256_set1_ps(weights.scale[h]), _mm256_permute2x128_si256(a[h], c[h], 0x20),
                      _mm256_permute2x128_si256(a[h], c[h], 0x31));
          }
        }
      }
    }
  }
}

// ---- dispatch ----------------------------------------------------------------------------------

// Scores: run(Heads<NH>{}, first, n) for the n_q heads, the first n <= NH of a group being real:
// groups of 8, 4, 2, then 1 (their register layout gives each head 8/NH lanes; one group of 8
// instead of two of 4 widens each key once and needs no horizontal add). A rest of 3 or 7 runs
// as one group of 4 or 8 with a zero head, because as 2 + 1 or 4 + 2 + 1 it loads and unpacks
// each block two or three times.
template <typename Run>
void ByScoreGroups(uint32_t n_q, Run run) {
  uint32_t i = 0;
  for (; i + 8 <= n_q; i += 8) run(Heads<8>{}, i, 8);
  if (n_q - i == 7) return run(Heads<8>{}, i, 7);
  for (; i + 4 <= n_q; i += 4) run(Heads<4>{}, i, 4);
  if (n_q - i == 3) return run(Heads<4>{}, i, 3);
  if (i + 2 <= n_q) {
    run(Heads<2>{}, i, 2);
    i += 2;
  }
  if (i < n_q) run(Heads<1>{}, i, 1);
}

// Accumulate takes up to 8 heads a pass (ByHeadPasses), so a group's codes are loaded and
// interleaved, and its scales gathered, once for all of them.
constexpr int kMaxAccumulateHeads = 8;

}  // namespace

void ScoresGgmlAvx2(GgmlKind kind, const std::byte* k, uint32_t tokens, uint32_t dim,
                    const float* q, uint32_t n_q, float* s) {
  ByKind(kind, [&](auto format) {
    ByScoreGroups(n_q, [&](auto heads, uint32_t i, int n) {
      ScoresHeads<decltype(format)::kValue, decltype(heads)::kCount>(
          k, tokens, dim, q + size_t{i} * dim, n, s + size_t{i} * tokens);
    });
  });
}

void AccumulateGgmlAvx2(GgmlKind kind, const std::byte* v, uint32_t tokens, uint32_t dim,
                        const float* p, uint32_t n_q, float* acc) {
  ByKind(kind, [&](auto format) {
    ByHeadPasses<kMaxAccumulateHeads>(n_q, [&](auto heads, uint32_t i) {
      AccumulateHeads<decltype(format)::kValue, decltype(heads)::kCount>(
          v, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
    });
  });
}

}  // namespace argus::codec_internal
