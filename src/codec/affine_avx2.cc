// AVX2 kernels of the coded-tile codecs (int8/int4/int2 both groupings, plane8 and its
// prefixes): integer multiply-add on codes of 8 bits or fewer, so that time follows bytes.
//
// Scores: the query is quantised to int8 per 32 channels, once (token layouts) or with the
// per-channel scales folded in, once per 32 tokens (channel layout). One 32-byte code
// vector of a panel is 8 rows x 4 channels; vpmaddubsw against the broadcast 4-channel query
// slice gives each row's partial dot in its own lane, sums stay in int16 as long as they cannot
// overflow, vpmaddwd widens them, and one float multiply-add per row and block applies scale and
// minimum. No horizontal reduction at all.
// Accumulate: the weights of 32 rows (p * scale for token layouts, p for the channel layout) are
// quantised to unsigned 8 bits, the codes centred to signed (c - 2^(b-1)), and each pair of code
// vectors is transposed by lane permutes and byte shuffles (shared by all heads) into 8 channels
// x 4 rows, so vpmaddubsw reduces over rows; sums stay in int16 over the 32 rows of a weight
// step and fold into float once per 8 channels and 32 rows, in registers across up to 256 rows.
// A block's pair passes each take 32 bytes of every panel, so the block's codes are prefetched
// first: left to the hardware, that strided walk takes its misses one after another.
// Heads go 4 at a time in scores and up to 8 in accumulate: every code vector is unpacked once
// for all heads of the pass.
#include <immintrin.h>

#include "codec/affine_kernels.h"
#include "core/avx2_reduce.h"

namespace argus::codec_internal {
namespace {

using avx2::HorizontalMax;
using avx2::HorizontalSum;
using avx2::HorizontalSumI;

constexpr uint32_t kGroupPanels = kAffineGroup / kPanelRows;  // panels per 32 rows
constexpr float kTinyMagnitude =
    1e-36f;  // smaller maxima quantise to zero (the step would overflow)

// ---- small helpers -----------------------------------------------------------------------------

inline __m256i LoadBytes(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline __m256i Broadcast4(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// m <= 8 fp16 values at p (any alignment) as floats, zero beyond m.
inline __m256 LoadHalves(const std::byte* p, uint32_t m) {
  if (m == kPanelRows) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t h[8] = {};
  __builtin_memcpy(h, p, 2 * m);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

inline void StoreRows(float* dst, __m256 v, uint32_t m) {
  if (m == kPanelRows) {
    _mm256_storeu_ps(dst, v);
    return;
  }
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  __builtin_memcpy(dst, tmp, sizeof(float) * m);
}

// Every cache line of [p, p + n), n >= 1, into L1.
inline void PrefetchBytes(const uint8_t* p, size_t n) {
  for (size_t o = 0; o < n; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + n - 1), _MM_HINT_T0);
}

inline __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// Lanes of a 2-step pack (each 128-bit lane packs 4 + 4 values twice) back in order.
inline __m256i UnpackOrder(__m256i v) {
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 16 int32 (in range) to 16 bytes in order, signed.
inline __m128i Pack16(__m256i a, __m256i b) {
  const __m256i w = _mm256_packs_epi32(a, b);
  return _mm256_castsi256_si128(UnpackOrder(_mm256_packs_epi16(w, w)));
}

// 32 int32 (in range) to 32 bytes in order at out, signed or unsigned.
template <bool kUnsigned>
inline void Pack32(const __m256i i[4], uint8_t* out) {
  const __m256i lo = kUnsigned ? _mm256_packus_epi32(i[0], i[1]) : _mm256_packs_epi32(i[0], i[1]);
  const __m256i hi = kUnsigned ? _mm256_packus_epi32(i[2], i[3]) : _mm256_packs_epi32(i[2], i[3]);
  const __m256i v = kUnsigned ? _mm256_packus_epi16(lo, hi) : _mm256_packs_epi16(lo, hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), UnpackOrder(v));
}

// ---- metadata ----------------------------------------------------------------------------------

// Scale and minimum of the `rows` rows of panel p, column j (token layouts; TokenMetaIndex).
template <uint32_t kBits>
inline void TokenMeta(const CodedTile& t, uint32_t p, uint32_t j, uint32_t rows, __m256* scale,
                      __m256* min) {
  const size_t index = size_t{p} * kPanelRows * (t.row_len / kAffineGroup) + size_t{rows} * j;
  const __m256 s = LoadHalves(t.scales + 2 * index, rows);
  if (t.meta == MetaLayout::kTokenStep) {
    *scale = _mm256_mul_ps(s, _mm256_set1_ps(t.step_mul));
    *min = _mm256_mul_ps(*scale, _mm256_set1_ps(-static_cast<float>((1 << kBits) - 1) / 2));
  } else {
    *scale = s;
    *min = LoadHalves(t.mins + 2 * index, rows);
  }
}

// ---- code vectors ------------------------------------------------------------------------------

// Shift of 16-bit lanes by kLeft bits (right when negative); callers mask the bytes after.
template <int kLeft>
inline __m256i Shift16(__m256i v) {
  if constexpr (kLeft > 0) {
    return _mm256_slli_epi16(v, kLeft);
  } else if constexpr (kLeft < 0) {
    return _mm256_srli_epi16(v, -kLeft);
  } else {
    return v;
  }
}

inline __m256i Mask8(__m256i v, int mask) {
  return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(mask)));
}

// Codes<C>::Quad(panel, u, cv): chunks 4u .. 4u+3 of a panel as 4 vectors of 8 rows x 4 codes;
// Pair<E>(panel, u, cv): chunks 4u + 2E and 4u + 2E + 1.
// kSinglePlane: the layout of an affine codec, which may also be grouped per channel.
template <CodeLayout C>
struct Codes;

template <>
struct Codes<CodeLayout::kBits8> {
  static constexpr uint32_t kBits = 8;
  static constexpr bool kSinglePlane = true;
  static void Quad(const PanelView& p, uint32_t u, __m256i cv[4]) {
    for (uint32_t s = 0; s < 4; ++s) cv[s] = LoadBytes(p.plane[0] + 32 * (4 * u + s));
  }
  template <int E>
  static void Pair(const PanelView& p, uint32_t u, __m256i cv[2]) {
    cv[0] = LoadBytes(p.plane[0] + 32 * (4 * u + 2 * E));
    cv[1] = LoadBytes(p.plane[0] + 32 * (4 * u + 2 * E + 1));
  }
};

template <>
struct Codes<CodeLayout::kBits4> {
  static constexpr uint32_t kBits = 4;
  static constexpr bool kSinglePlane = true;
  static void Quad(const PanelView& p, uint32_t u, __m256i cv[4]) {
    const __m256i a = LoadBytes(p.plane[0] + 64 * u), b = LoadBytes(p.plane[0] + 64 * u + 32);
    cv[0] = Mask8(a, 0x0f);
    cv[1] = Mask8(_mm256_srli_epi16(a, 4), 0x0f);
    cv[2] = Mask8(b, 0x0f);
    cv[3] = Mask8(_mm256_srli_epi16(b, 4), 0x0f);
  }
  template <int E>
  static void Pair(const PanelView& p, uint32_t u, __m256i cv[2]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * (2 * u + E));
    cv[0] = Mask8(a, 0x0f);
    cv[1] = Mask8(_mm256_srli_epi16(a, 4), 0x0f);
  }
};

template <>
struct Codes<CodeLayout::kBits2> {
  static constexpr uint32_t kBits = 2;
  static constexpr bool kSinglePlane = true;
  static void Quad(const PanelView& p, uint32_t u, __m256i cv[4]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * u);
    cv[0] = Mask8(a, 0x03);
    cv[1] = Mask8(_mm256_srli_epi16(a, 2), 0x03);
    cv[2] = Mask8(_mm256_srli_epi16(a, 4), 0x03);
    cv[3] = Mask8(_mm256_srli_epi16(a, 6), 0x03);
  }
  template <int E>
  static void Pair(const PanelView& p, uint32_t u, __m256i cv[2]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * u);
    cv[0] = Mask8(Shift16<-4 * E>(a), 0x03);
    cv[1] = Mask8(Shift16<-4 * E - 2>(a), 0x03);
  }
};

// plane8: (a << 6) | (b << 4) | c from 2-bit planes A, B (chunk s at bit 2s) and 4-bit plane C.
template <>
struct Codes<CodeLayout::kPlanes224> {
  static constexpr uint32_t kBits = 8;
  static constexpr bool kSinglePlane = false;
  template <int S>
  static __m256i Code(__m256i a, __m256i b, __m256i c) {
    const __m256i low = S % 2 == 0 ? c : _mm256_srli_epi16(c, 4);
    return _mm256_or_si256(
        _mm256_or_si256(Mask8(Shift16<6 - 2 * S>(a), 0xc0), Mask8(Shift16<4 - 2 * S>(b), 0x30)),
        Mask8(low, 0x0f));
  }
  static void Quad(const PanelView& p, uint32_t u, __m256i cv[4]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * u), b = LoadBytes(p.plane[1] + 32 * u);
    const __m256i c0 = LoadBytes(p.plane[2] + 64 * u), c1 = LoadBytes(p.plane[2] + 64 * u + 32);
    cv[0] = Code<0>(a, b, c0);
    cv[1] = Code<1>(a, b, c0);
    cv[2] = Code<2>(a, b, c1);
    cv[3] = Code<3>(a, b, c1);
  }
  template <int E>
  static void Pair(const PanelView& p, uint32_t u, __m256i cv[2]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * u), b = LoadBytes(p.plane[1] + 32 * u);
    const __m256i c = LoadBytes(p.plane[2] + 32 * (2 * u + E));
    cv[0] = Code<2 * E>(a, b, c);
    cv[1] = Code<2 * E + 1>(a, b, c);
  }
};

// plane8/4: (a << 2) | b.
template <>
struct Codes<CodeLayout::kPlanes22> {
  static constexpr uint32_t kBits = 4;
  static constexpr bool kSinglePlane = false;
  template <int S>
  static __m256i Code(__m256i a, __m256i b) {
    return _mm256_or_si256(Mask8(Shift16<2 - 2 * S>(a), 0x0c), Mask8(Shift16<-2 * S>(b), 0x03));
  }
  static void Quad(const PanelView& p, uint32_t u, __m256i cv[4]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * u), b = LoadBytes(p.plane[1] + 32 * u);
    cv[0] = Code<0>(a, b);
    cv[1] = Code<1>(a, b);
    cv[2] = Code<2>(a, b);
    cv[3] = Code<3>(a, b);
  }
  template <int E>
  static void Pair(const PanelView& p, uint32_t u, __m256i cv[2]) {
    const __m256i a = LoadBytes(p.plane[0] + 32 * u), b = LoadBytes(p.plane[1] + 32 * u);
    cv[0] = Code<2 * E>(a, b);
    cv[1] = Code<2 * E + 1>(a, b);
  }
};

// Centred signed codes c - 2^(b-1), one instruction: x' = scale c~ + (min + 2^(b-1) scale).
template <uint32_t kBits>
inline __m256i Centre(__m256i c) {
  if constexpr (kBits == 8) {
    return _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    return _mm256_sub_epi8(c, _mm256_set1_epi8(static_cast<char>(kCentre<kBits>)));
  }
}

// ---- scores ------------------------------------------------------------------------------------

// out[h] = per-row sums over quads [u0, u1) of codes x q[h] (int8 per channel of the coded row).
template <CodeLayout C, int NH>
inline void DotQuads(const PanelView& panel, uint32_t u0, uint32_t u1, const int8_t* const q[NH],
                     __m256i out[NH]) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  // Quads whose int16 sums cannot overflow: 4 maddubs pairs of (2^b - 1) * kQueryMax each.
  constexpr uint32_t kFlushQuads = 32767 / (8 * ((1 << kBits) - 1) * kQueryMax<kBits>);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum16[NH];
  for (int h = 0; h < NH; ++h) out[h] = sum16[h] = _mm256_setzero_si256();
  uint32_t pending = 0;
  for (uint32_t u = u0; u < u1; ++u) {
    __m256i cv[4];
    Codes<C>::Quad(panel, u, cv);
    for (uint32_t s = 0; s < 4; ++s) {
      for (int h = 0; h < NH; ++h) {
        const __m256i prod = _mm256_maddubs_epi16(cv[s], Broadcast4(q[h] + 16 * u + 4 * s));
        if constexpr (kFlushQuads == 0) {
          out[h] = _mm256_add_epi32(out[h], _mm256_madd_epi16(prod, ones));
        } else {
          sum16[h] = _mm256_add_epi16(sum16[h], prod);
        }
      }
    }
    if constexpr (kFlushQuads > 0) {
      if (++pending == kFlushQuads || u + 1 == u1) {
        for (int h = 0; h < NH; ++h) {
          out[h] = _mm256_add_epi32(out[h], _mm256_madd_epi16(sum16[h], ones));
          sum16[h] = _mm256_setzero_si256();
        }
        pending = 0;
      }
    }
  }
}

// Token layouts: s = sum_j scale_j qs_j (Q . c)_j + min_j qs_j sum(Q_j), i.e. q^ . k' exactly.
template <CodeLayout C, int NH>
void ScoresToken(const CodedTile& t, const PanelGeometry& g, const float* q, float* s) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  constexpr float kQmax = kQueryMax<kBits>;
  const uint32_t n_cols = t.dim / kAffineGroup;
  alignas(32) int8_t qi[NH][kMaxRowLen];
  float q_step[NH][kMaxRowLen / kAffineGroup], q_min[NH][kMaxRowLen / kAffineGroup];
  const int8_t* qh[NH];
  for (int h = 0; h < NH; ++h) {
    qh[h] = qi[h];
    for (uint32_t j = 0; j < n_cols; ++j) {
      const float* x = q + size_t{static_cast<uint32_t>(h)} * t.dim + kAffineGroup * j;
      __m256 v[4], amax = _mm256_setzero_ps();
      for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, Abs(v[k]));
      }
      const float m = HorizontalMax(amax);
      const bool tiny = !(m >= kTinyMagnitude);
      const __m256 inv = _mm256_set1_ps(tiny ? 0.0f : kQmax / m);
      __m256i codes[4];
      for (int k = 0; k < 4; ++k) codes[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv));
      Pack32<false>(codes, reinterpret_cast<uint8_t*>(qi[h]) + kAffineGroup * j);
      const int32_t sum = HorizontalSumI(_mm256_add_epi32(_mm256_add_epi32(codes[0], codes[1]),
                                                          _mm256_add_epi32(codes[2], codes[3])));
      q_step[h][j] = tiny ? 0.0f : m / kQmax;
      q_min[h][j] = q_step[h][j] * static_cast<float>(sum);
    }
  }
  for (uint32_t p = 0; p < g.n_panels; ++p) {
    PanelView panel;
    PanelAt(t, g, p, &panel);
    __m256 acc[NH];
    for (int h = 0; h < NH; ++h) acc[h] = _mm256_setzero_ps();
    for (uint32_t j = 0; j < n_cols; ++j) {
      __m256i dots[NH];
      DotQuads<C, NH>(panel, 2 * j, 2 * j + 2, qh, dots);
      __m256 scale, min;
      TokenMeta<kBits>(t, p, j, panel.rows, &scale, &min);
      for (int h = 0; h < NH; ++h) {
        acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h]),
                                 _mm256_mul_ps(scale, _mm256_set1_ps(q_step[h][j])), acc[h]);
        acc[h] = _mm256_fmadd_ps(min, _mm256_set1_ps(q_min[h][j]), acc[h]);
      }
    }
    for (int h = 0; h < NH; ++h)
      StoreRows(s + size_t{static_cast<uint32_t>(h)} * t.tokens + p * kPanelRows, acc[h],
                panel.rows);
  }
}

// Float scales and midpoints mid = min + o scale (o = (2^b - 1) / 2) of channel group g.
inline void ChannelMeta(const CodedTile& t, uint32_t g, float offset, float* scale, float* mid) {
  const std::byte* s = t.scales + size_t{2} * g * t.dim;
  const std::byte* m = t.mins + size_t{2} * g * t.dim;
  for (uint32_t d = 0; d < t.dim; d += 8) {
    const __m256 sv = LoadHalves(s + 2 * d, 8);
    _mm256_storeu_ps(scale + d, sv);
    _mm256_storeu_ps(mid + d,
                     _mm256_fmadd_ps(sv, _mm256_set1_ps(offset), LoadHalves(m + 2 * d, 8)));
  }
}

// Channel layout: Q'_d = q_d scale_d / qs_k per 32 tokens, one step qs_k per segment k of 32
// channels (so an outlier channel coarsens only its own segment);
// s = sum_k qs_k (Q' . c)_k + sum_d q_d mid_d - o sum_k qs_k sum(Q'_k), which centres the codes
// (error sum_d delta_d (c - o)).
template <CodeLayout C, int NH>
void ScoresChannel(const CodedTile& t, const PanelGeometry& g, const float* q, float* s) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  constexpr float kQmax = kQueryMax<kBits>;
  constexpr uint32_t kMaxSegments = kMaxRowLen / kAffineGroup;
  const float offset = static_cast<float>((1 << kBits) - 1) / 2;
  const uint32_t n_quads = t.dim / 16, n_segments = (n_quads + 1) / 2;
  alignas(32) float scale[kMaxRowLen], mid[kMaxRowLen];
  alignas(32) int8_t qi[NH][kMaxRowLen];
  const int8_t* qh[NH];
  for (int h = 0; h < NH; ++h) qh[h] = qi[h];
  for (uint32_t group = 0; group * kGroupPanels < g.n_panels; ++group) {
    ChannelMeta(t, group, offset, scale, mid);
    float q_step[NH][kMaxSegments], constant[NH];
    for (int h = 0; h < NH; ++h) {
      const float* qv = q + size_t{static_cast<uint32_t>(h)} * t.dim;
      // By lanes: sum_d q_d mid_d and sum_k qs_k sum(Q'_k), reduced once per head instead of
      // twice per segment.
      __m256 dot_mid = _mm256_setzero_ps(), code_sum = _mm256_setzero_ps();
      for (uint32_t k = 0; k < n_segments; ++k) {
        const uint32_t d0 = 32 * k, n = (t.dim - d0 < 32 ? t.dim - d0 : 32) / 8;  // 4 or 2
        __m256 x[4], amax = _mm256_setzero_ps();
        for (uint32_t i = 0; i < n; ++i) {
          const __m256 qd = _mm256_loadu_ps(qv + d0 + 8 * i);
          x[i] = _mm256_mul_ps(qd, _mm256_load_ps(scale + d0 + 8 * i));
          amax = _mm256_max_ps(amax, Abs(x[i]));
          dot_mid = _mm256_fmadd_ps(qd, _mm256_load_ps(mid + d0 + 8 * i), dot_mid);
        }
        const float m = HorizontalMax(amax);
        const bool tiny = !(m >= kTinyMagnitude);
        const __m256 inv = _mm256_set1_ps(tiny ? 0.0f : kQmax / m);
        __m256i codes[4], sum = _mm256_setzero_si256();
        for (uint32_t i = 0; i < n; ++i) {
          codes[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], inv));
          sum = _mm256_add_epi32(sum, codes[i]);
        }
        if (n == 4) {
          Pack32<false>(codes, reinterpret_cast<uint8_t*>(qi[h] + d0));
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qi[h] + d0), Pack16(codes[0], codes[1]));
        }
        q_step[h][k] = tiny ? 0.0f : m / kQmax;
        code_sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(q_step[h][k]), code_sum);
      }
      constant[h] = HorizontalSum(_mm256_fnmadd_ps(_mm256_set1_ps(offset), code_sum, dot_mid));
    }
    for (uint32_t p = group * kGroupPanels; p < g.n_panels && p < (group + 1) * kGroupPanels; ++p) {
      PanelView panel;
      PanelAt(t, g, p, &panel);
      __m256 acc[NH];
      for (int h = 0; h < NH; ++h) acc[h] = _mm256_set1_ps(constant[h]);
      for (uint32_t k = 0; k < n_segments; ++k) {
        __m256i dots[NH];
        DotQuads<C, NH>(panel, 2 * k, 2 * k + 2 < n_quads ? 2 * k + 2 : n_quads, qh, dots);
        for (int h = 0; h < NH; ++h) {
          acc[h] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h]), _mm256_set1_ps(q_step[h][k]), acc[h]);
        }
      }
      for (int h = 0; h < NH; ++h) {
        StoreRows(s + size_t{static_cast<uint32_t>(h)} * t.tokens + p * kPanelRows, acc[h],
                  panel.rows);
      }
    }
  }
}

// ---- accumulate --------------------------------------------------------------------------------

// The sum over a group's panels of w[h] (an unsigned byte per row of the group) times the centred
// codes of chunks 4u + 2E and 4u + 2E + 1: channel lanes 16u + 8E .. +8, as int32.
template <CodeLayout C, int NH, int E>
inline void WeightPair(const PanelView* panels, uint32_t n_panels, uint32_t u,
                       const uint8_t* const w[NH], __m256i out[NH]) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  // Below 8 bits the 8 vpmaddubsw results of a group (each at most 2 kWeightMax 2^(b-1)) fit an
  // int16 sum; 8-bit ones are widened one by one.
  static_assert(kBits == 8 || 8 * 2 * kWeightMax<kBits> * kCentre<kBits> <= 32767);
  // Within each 128-bit lane: 4 rows x 4 channels -> 4 channels x 4 rows.
  const __m256i transpose = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[NH];
  for (int h = 0; h < NH; ++h) sum[h] = _mm256_setzero_si256();
  for (uint32_t pp = 0; pp < n_panels; ++pp) {
    __m256i cv[2];
    Codes<C>::template Pair<E>(panels[pp], u, cv);
    const __m256i a = Centre<kBits>(cv[0]), b = Centre<kBits>(cv[1]);
    // Rows 0-3 (lo) and 4-7 (hi) of 8 consecutive channels, 4 rows per 32-bit lane.
    const __m256i lo = _mm256_shuffle_epi8(_mm256_permute2x128_si256(a, b, 0x20), transpose);
    const __m256i hi = _mm256_shuffle_epi8(_mm256_permute2x128_si256(a, b, 0x31), transpose);
    for (int h = 0; h < NH; ++h) {
      const __m256i x = _mm256_maddubs_epi16(Broadcast4(w[h] + kPanelRows * pp), lo);
      const __m256i y = _mm256_maddubs_epi16(Broadcast4(w[h] + kPanelRows * pp + 4), hi);
      if constexpr (kBits == 8) {
        sum[h] = _mm256_add_epi32(
            sum[h], _mm256_add_epi32(_mm256_madd_epi16(x, ones), _mm256_madd_epi16(y, ones)));
      } else {
        sum[h] = _mm256_add_epi16(sum[h], _mm256_add_epi16(x, y));
      }
    }
  }
  for (int h = 0; h < NH; ++h) out[h] = kBits == 8 ? sum[h] : _mm256_madd_epi16(sum[h], ones);
}

// Rows are taken in blocks of up to kBlockGroups groups of 32: the weights of a block are
// quantised first, then each pair of chunks runs down the whole block with its float sums in
// registers, so acc is read and written once per block.
constexpr uint32_t kBlockGroups = 8;

// What the integer pass needs of one group of 32 rows.
struct RowGroup {
  PanelView panels[kGroupPanels];
  uint32_t n_panels = 0;
};

// The panels of groups [g0, g0 + n), prefetched, and each head's probabilities of their rows, 4
// vectors of 8 a group, zero beyond the tile.
template <int NH>
inline void LoadBlock(const CodedTile& t, const PanelGeometry& g, uint32_t g0, uint32_t n,
                      const float* p, RowGroup groups[kBlockGroups],
                      __m256 probs[kBlockGroups][NH][kGroupPanels]) {
  for (uint32_t k = 0; k < n; ++k) {
    RowGroup& rg = groups[k];
    rg.n_panels = 0;
    for (uint32_t q = (g0 + k) * kGroupPanels; q < g.n_panels && rg.n_panels < kGroupPanels; ++q) {
      PanelAt(t, g, q, &rg.panels[rg.n_panels++]);
    }
    for (uint32_t pp = 0; pp < rg.n_panels; ++pp) {
      for (uint32_t i = 0; i < g.n_planes; ++i)
        PrefetchBytes(rg.panels[pp].plane[i], size_t{32} * g.units[i]);
    }
    const uint32_t first = (g0 + k) * kAffineGroup;
    const uint32_t rows = t.tokens - first < kAffineGroup ? t.tokens - first : kAffineGroup;
    for (int h = 0; h < NH; ++h) {
      const float* ph = p + size_t{static_cast<uint32_t>(h)} * t.tokens + first;
      alignas(32) float tmp[kAffineGroup];
      if (rows < kAffineGroup) {
        __builtin_memcpy(tmp, ph, sizeof(float) * rows);
        __builtin_memset(tmp + rows, 0, sizeof(float) * (kAffineGroup - rows));
        ph = tmp;
      }
      for (uint32_t pp = 0; pp < kGroupPanels; ++pp)
        probs[k][h][pp] = _mm256_loadu_ps(ph + kPanelRows * pp);
    }
  }
}

// round(x * inv) of 4 vectors of 8 to 32 unsigned bytes at out.
inline void QuantizeWeights(const __m256 x[kGroupPanels], __m256 inv, uint8_t* out) {
  __m256i w[kGroupPanels];
  for (uint32_t pp = 0; pp < kGroupPanels; ++pp)
    w[pp] = _mm256_cvtps_epi32(_mm256_mul_ps(x[pp], inv));
  Pack32<true>(w, out);
}

// One pair of chunks (channels d = 16u + 8E .. +8) run down the groups of a block:
// fold(k, d, sums, facc) folds group k's integer sums into the float sums facc[NH].
template <CodeLayout C, int NH, int E, class WeightsOf, class Fold>
inline void PairDownBlock(const RowGroup* groups, uint32_t n, uint32_t u, WeightsOf weights_of,
                          Fold fold, __m256 facc[NH]) {
  for (int h = 0; h < NH; ++h) facc[h] = _mm256_setzero_ps();
  for (uint32_t k = 0; k < n; ++k) {
    const uint8_t* w[NH];
    for (int h = 0; h < NH; ++h) w[h] = weights_of(k, h);
    __m256i sums[NH];
    WeightPair<C, NH, E>(groups[k].panels, groups[k].n_panels, u, w, sums);
    fold(k, 16 * u + 8 * E, sums, facc);
  }
}

// acc[h][d .. d+8) += facc[h] + add[h] for each head (rows of acc `dim` apart).
template <int NH>
inline void AddToAcc(float* acc, uint32_t dim, uint32_t d, const __m256 facc[NH],
                     const __m256 add[NH]) {
  for (int h = 0; h < NH; ++h) {
    float* a = acc + size_t{static_cast<uint32_t>(h)} * dim + d;
    _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), _mm256_add_ps(facc[h], add[h])));
  }
}

// Token layouts: the weights w_tj = p_t scale_tj of all columns j of a group are quantised with
// one step ws per head (max_tj w_tj = max_t p_t max_j scale_tj, p being >= 0);
// acc_d += sum over groups of ws (W . c~)_d, plus sum_t p_t mid_tj, mid = min + 2^(b-1) scale.
template <CodeLayout C, int NH>
void AccumulateToken(const CodedTile& t, const PanelGeometry& g, const float* p, float* acc) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  constexpr float kWmax = kWeightMax<kBits>;
  constexpr uint32_t kMaxCols = kMaxRowLen / kAffineGroup;
  const uint32_t n_cols = t.dim / kAffineGroup,
                 n_groups = (g.n_panels + kGroupPanels - 1) / kGroupPanels;
  alignas(32) uint8_t weights[kBlockGroups][NH][kMaxCols][kAffineGroup];
  __m256 step[kBlockGroups][NH];
  // sum_t p_t mid_tj of a block, by lanes: reduced once per block, not once per group.
  __m256 mid_sum[NH][kMaxCols];
  RowGroup groups[kBlockGroups];
  __m256 probs[kBlockGroups][NH][kGroupPanels];
  for (uint32_t g0 = 0; g0 < n_groups; g0 += kBlockGroups) {
    const uint32_t n = n_groups - g0 < kBlockGroups ? n_groups - g0 : kBlockGroups;
    LoadBlock<NH>(t, g, g0, n, p, groups, probs);
    for (int h = 0; h < NH; ++h) {
      for (uint32_t j = 0; j < n_cols; ++j) mid_sum[h][j] = _mm256_setzero_ps();
    }
    for (uint32_t k = 0; k < n; ++k) {
      __m256 scale[kMaxCols][kGroupPanels], mid[kMaxCols][kGroupPanels], scale_max[kGroupPanels];
      for (uint32_t pp = 0; pp < kGroupPanels; ++pp) scale_max[pp] = _mm256_setzero_ps();
      for (uint32_t j = 0; j < n_cols; ++j) {
        for (uint32_t pp = 0; pp < kGroupPanels; ++pp) {
          scale[j][pp] = mid[j][pp] = _mm256_setzero_ps();
          if (pp >= groups[k].n_panels) continue;
          __m256 min;
          TokenMeta<kBits>(t, (g0 + k) * kGroupPanels + pp, j, groups[k].panels[pp].rows,
                           &scale[j][pp], &min);
          mid[j][pp] = _mm256_fmadd_ps(scale[j][pp], _mm256_set1_ps(kCentre<kBits>), min);
          scale_max[pp] = _mm256_max_ps(scale_max[pp], scale[j][pp]);
        }
      }
      for (int h = 0; h < NH; ++h) {
        const __m256* ph = probs[k][h];
        __m256 amax = _mm256_setzero_ps();
        for (uint32_t pp = 0; pp < kGroupPanels; ++pp)
          amax = _mm256_max_ps(amax, _mm256_mul_ps(ph[pp], scale_max[pp]));
        for (uint32_t j = 0; j < n_cols; ++j) {
          for (uint32_t pp = 0; pp < kGroupPanels; ++pp)
            mid_sum[h][j] = _mm256_fmadd_ps(ph[pp], mid[j][pp], mid_sum[h][j]);
        }
        const float m = HorizontalMax(amax);
        const bool tiny = !(m >= kTinyMagnitude);
        const __m256 inv = _mm256_set1_ps(tiny ? 0.0f : kWmax / m);
        for (uint32_t j = 0; j < n_cols; ++j) {
          __m256 w[kGroupPanels];
          for (uint32_t pp = 0; pp < kGroupPanels; ++pp)
            w[pp] = _mm256_mul_ps(ph[pp], scale[j][pp]);
          QuantizeWeights(w, inv, weights[k][h][j]);
        }
        step[k][h] = _mm256_set1_ps(tiny ? 0.0f : m / kWmax);
      }
    }
    float shift[NH][kMaxCols];
    for (int h = 0; h < NH; ++h) {
      for (uint32_t j = 0; j < n_cols; ++j) shift[h][j] = HorizontalSum(mid_sum[h][j]);
    }
    for (uint32_t u = 0; u < t.dim / 16; ++u) {
      const uint32_t j = u / 2;
      auto weights_of = [&](uint32_t k, int h) -> const uint8_t* { return weights[k][h][j]; };
      auto fold = [&](uint32_t k, uint32_t, const __m256i* sums, __m256* facc) {
        for (int h = 0; h < NH; ++h)
          facc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[h]), step[k][h], facc[h]);
      };
      __m256 facc[NH], add[NH];
      for (int h = 0; h < NH; ++h) add[h] = _mm256_set1_ps(shift[h][j]);
      PairDownBlock<C, NH, 0>(groups, n, u, weights_of, fold, facc);
      AddToAcc<NH>(acc, t.dim, 16 * u, facc, add);
      PairDownBlock<C, NH, 1>(groups, n, u, weights_of, fold, facc);
      AddToAcc<NH>(acc, t.dim, 16 * u + 8, facc, add);
    }
  }
}

// Channel layout: p is quantised over the 32 rows of a group with one step ws per head;
// acc_d += sum over groups of scale_gd ws (W . c~)_d + mid_gd sum_t p_t.
template <CodeLayout C, int NH>
void AccumulateChannel(const CodedTile& t, const PanelGeometry& g, const float* p, float* acc) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  constexpr float kWmax = kWeightMax<kBits>;
  const uint32_t n_groups = (g.n_panels + kGroupPanels - 1) / kGroupPanels;
  alignas(32) uint8_t weights[kBlockGroups][NH][kAffineGroup];
  __m256 step[kBlockGroups][NH], total[kBlockGroups][NH];
  RowGroup groups[kBlockGroups];
  __m256 probs[kBlockGroups][NH][kGroupPanels];
  for (uint32_t g0 = 0; g0 < n_groups; g0 += kBlockGroups) {
    const uint32_t n = n_groups - g0 < kBlockGroups ? n_groups - g0 : kBlockGroups;
    LoadBlock<NH>(t, g, g0, n, p, groups, probs);
    for (uint32_t k = 0; k < n; ++k) {
      for (int h = 0; h < NH; ++h) {
        __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
        for (uint32_t pp = 0; pp < kGroupPanels; ++pp) {
          amax = _mm256_max_ps(amax, probs[k][h][pp]);
          sum = _mm256_add_ps(sum, probs[k][h][pp]);
        }
        const float m = HorizontalMax(amax);
        const bool tiny = !(m >= kTinyMagnitude);
        QuantizeWeights(probs[k][h], _mm256_set1_ps(tiny ? 0.0f : kWmax / m), weights[k][h]);
        step[k][h] = _mm256_set1_ps(tiny ? 0.0f : m / kWmax);
        total[k][h] = _mm256_set1_ps(HorizontalSum(sum));
      }
    }
    auto weights_of = [&](uint32_t k, int h) -> const uint8_t* { return weights[k][h]; };
    auto fold = [&](uint32_t k, uint32_t d, const __m256i* sums, __m256* facc) {
      const size_t at = 2 * (size_t{g0 + k} * t.dim + d);
      const __m256 scale = LoadHalves(t.scales + at, 8);
      const __m256 mid =
          _mm256_fmadd_ps(scale, _mm256_set1_ps(kCentre<kBits>), LoadHalves(t.mins + at, 8));
      for (int h = 0; h < NH; ++h) {
        facc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[h]), _mm256_mul_ps(scale, step[k][h]),
                                  _mm256_fmadd_ps(mid, total[k][h], facc[h]));
      }
    };
    __m256 facc[NH], zero[NH];
    for (int h = 0; h < NH; ++h) zero[h] = _mm256_setzero_ps();
    for (uint32_t u = 0; u < t.dim / 16; ++u) {
      PairDownBlock<C, NH, 0>(groups, n, u, weights_of, fold, facc);
      AddToAcc<NH>(acc, t.dim, 16 * u, facc, zero);
      PairDownBlock<C, NH, 1>(groups, n, u, weights_of, fold, facc);
      AddToAcc<NH>(acc, t.dim, 16 * u + 8, facc, zero);
    }
  }
}

// ---- dispatch ----------------------------------------------------------------------------------

struct ScoresKernel {
  static constexpr int kMaxHeads = 4;  // each head holds int16 and int32 sums in registers
  template <CodeLayout C, int NH>
  static void Run(const CodedTile& t, const PanelGeometry& g, const float* q, float* s) {
    if constexpr (Codes<C>::kSinglePlane) {
      if (t.meta == MetaLayout::kChannelScaleMin) return ScoresChannel<C, NH>(t, g, q, s);
    }
    ScoresToken<C, NH>(t, g, q, s);
  }
};

struct AccumulateKernel {
  // GQA 7 in one pass instead of 4 + 3, so the unpacking and transposes serve 7 heads (a gain
  // only together with the block prefetch above).
  static constexpr int kMaxHeads = 8;
  template <CodeLayout C, int NH>
  static void Run(const CodedTile& t, const PanelGeometry& g, const float* p, float* acc) {
    if constexpr (Codes<C>::kSinglePlane) {
      if (t.meta == MetaLayout::kChannelScaleMin) return AccumulateChannel<C, NH>(t, g, p, acc);
    }
    AccumulateToken<C, NH>(t, g, p, acc);
  }
};

// Runs Kernel::Run<C, NH> over the heads (ByHeadPasses); in_stride and out_stride are the
// per-head strides of the input (q or p) and of the output (s or acc).
template <class Kernel, CodeLayout C>
void ForHeads(const CodedTile& t, const float* in, size_t in_stride, float* out, size_t out_stride,
              uint32_t n_q) {
  alignas(64) uint8_t pad[kPadBytes];
  const PanelGeometry g = GeometryOf(t, pad);
  ByHeadPasses<Kernel::kMaxHeads>(n_q, [&](auto heads, uint32_t i) {
    Kernel::template Run<C, decltype(heads)::kCount>(t, g, in + i * in_stride,
                                                     out + i * out_stride);
  });
}

template <class Kernel>
void Dispatch(const CodedTile& t, const float* in, size_t in_stride, float* out, size_t out_stride,
              uint32_t n_q) {
  ByCodeLayout(t.code, [&](auto layout) {
    ForHeads<Kernel, decltype(layout)::kValue>(t, in, in_stride, out, out_stride, n_q);
  });
}

}  // namespace

bool AllWithinAvx2(const float* x, size_t n, float lo, float hi) {
  const __m256 l = _mm256_set1_ps(lo), h = _mm256_set1_ps(hi);
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    ok = _mm256_and_ps(
        ok, _mm256_and_ps(_mm256_cmp_ps(v, l, _CMP_GE_OQ), _mm256_cmp_ps(v, h, _CMP_LE_OQ)));
  }
  bool all = _mm256_movemask_ps(ok) == 0xff;
  for (; i < n; ++i) all &= x[i] >= lo && x[i] <= hi;
  return all;
}

void PanelScoresAvx2(const CodedTile& tile, const float* q, uint32_t n_q, float* s) {
  Dispatch<ScoresKernel>(tile, q, tile.dim, s, tile.tokens, n_q);
}

void PanelAccumulateAvx2(const CodedTile& tile, const float* p, uint32_t n_q, float* acc) {
  Dispatch<AccumulateKernel>(tile, p, tile.tokens, acc, tile.dim, n_q);
}

}  // namespace argus::codec_internal
