// AVX-512 VNNI kernels of the coded-tile codecs (int8/int4/int2 both groupings, plane8 and its
// prefixes): the design of affine_avx2.cc on 512-bit registers with vpdpbusd, which multiplies
// unsigned by signed bytes and adds each 4 products to an int32 lane in one instruction. Sums
// are int32 throughout and cannot overflow (a lane adds at most 1024 products of 255 x 128), so
// the query is quantised to kQueryMaxAvx512 levels and the weights to kWeightMaxAvx512 at every
// width: affine.cc's bounds with those values.
//
// Scores: a code vector holds one unit of two consecutive panels, 16 rows x 4 channels, and
// vpdpbusd against the chunk's 4 query bytes broadcast from memory adds each row's partial dot
// to its own lane: no horizontal reduction. Two panels rather than two units of one panel: a lane
// is then a row, so the float work that applies scales and minimums (once per 16 rows and 32
// channels) serves 16 rows instead of two halves of 8.
// Accumulate: per panel and 16 channels, lane permutes and byte shuffles shared by all heads turn
// 8 rows x 16 channels into two vectors of 16 channels x 4 rows, and vpdpbusd reduces over rows
// with the 4 rows' weights broadcast. The weights are the unsigned operand, so they have 255
// levels at every width, and the codes are centred to signed. A group's integer sums fold into
// float once per 16 channels, kept in registers down up to 256 rows.
// The quantisation steps and the sums of the float terms are horizontal reductions, done 16
// vectors at a time (ReduceLanes16) rather than one by one.
// Heads go up to 8 at a time (every code vector is unpacked once for all of them), each with its
// own quantisation and sums: a head's result does not depend on how many heads share its call or
// on its place among them (a prompt evaluated in two chunks gives the same logits as in one).
#include <algorithm>

#include "codec/affine_kernels.h"
#include "core/avx512.h"

namespace argus::codec_internal {
namespace {

// Per pass: an int32 and a float accumulator per head, with the code vectors, in 32 registers.
constexpr int kMaxHeads = 8;
constexpr float kQmax = kQueryMaxAvx512, kWmax = kWeightMaxAvx512;
constexpr uint32_t kGroupPanels = kAffineGroup / kPanelRows;  // panels per 32 rows
constexpr uint32_t kMaxCols = kMaxRowLen / kAffineGroup;
constexpr float kTinyMagnitude =
    1e-36f;  // smaller maxima quantise to zero (the step would overflow)

// ---- small helpers -----------------------------------------------------------------------------

inline __m512i Load64(const uint8_t* p) { return _mm512_loadu_si512(p); }

// 32 bytes at lo in the low half, 32 at hi in the high half: one unit of two panels.
inline __m512i Load2(const uint8_t* lo, const uint8_t* hi) {
  const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo));
  return _mm512_inserti64x4(_mm512_castsi256_si512(l),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
}

// The 16 bytes at p in every 128-bit lane.
inline __m512i Broadcast16(const uint8_t* p) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m512i Broadcast4(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __m512i Mask8(__m512i v, int mask) {
  return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(mask)));
}

// The bits of a where the byte mask has them, of b elsewhere.
inline __m512i Select(int mask, __m512i a, __m512i b) {
  return _mm512_ternarylogic_epi32(_mm512_set1_epi8(static_cast<char>(mask)), a, b, 0xca);
}

// Count c_s in every 32-bit lane of 128-bit lane s.
inline __m512i LaneCounts(int c0, int c1, int c2, int c3) {
  return _mm512_setr_epi32(c0, c0, c0, c0, c1, c1, c1, c1, c2, c2, c2, c2, c3, c3, c3, c3);
}

// out[i] = the sum of the lanes of v[i], i < n.
inline void SumsOf(const __m512* v, uint32_t n, float* out) {
  for (uint32_t i = 0; i < n; i += 16) {
    const uint32_t count = n - i < 16 ? n - i : 16;
    _mm512_mask_storeu_ps(out + i, FirstLanes(count), ReduceLanes16<false>(v + i, count));
  }
}

// The quantisation steps of n sets of values, each set the lanes of m[i] (maxima of magnitudes):
// step[i] = max / levels and inv[i] = levels / max, both 0 when the maximum is below
// kTinyMagnitude (the step would overflow) or NaN.
inline void StepsOf(const __m512* m, uint32_t n, float levels, float* inv, float* step) {
  for (uint32_t i = 0; i < n; i += 16) {
    const uint32_t count = n - i < 16 ? n - i : 16;
    const __m512 max = ReduceLanes16<true>(m + i, count);
    const __mmask16 ok = _mm512_cmp_ps_mask(max, _mm512_set1_ps(kTinyMagnitude), _CMP_GE_OQ);
    _mm512_mask_storeu_ps(inv + i, FirstLanes(count),
                          _mm512_maskz_div_ps(ok, _mm512_set1_ps(levels), max));
    _mm512_mask_storeu_ps(step + i, FirstLanes(count),
                          _mm512_maskz_div_ps(ok, max, _mm512_set1_ps(levels)));
  }
}

// ---- code vectors ------------------------------------------------------------------------------
// A field of 2 or 4 bits moves to its place in the code by rotating 32-bit lanes: for the
// distances used here every bit that matters stays within its byte.

// Within each 128-bit lane, 4 rows x 4 channels (byte 4k + c: row k, channel c, as a unit holds
// them) -> 4 channels x 4 rows (byte 4c + k), so that vpdpbusd sums over rows.
inline __m512i Transpose(__m512i v) {
  return _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
                                                                     10, 14, 3, 7, 11, 15)));
}

// Low nibbles (chunks 4u, 4u+2) and high nibbles (4u+1, 4u+3) of the 128-bit lanes of units 2u,
// 2u+1 (in either byte order): chunk s in the low 4 bits of lane s, the rest of each byte
// undefined.
inline void NibbleRows(__m512i v, __m512i* x, __m512i* y) {
  const __m512i h = _mm512_srli_epi16(v, 4);
  // v's 128-bit lanes: unit 2u rows 0-3, rows 4-7, unit 2u+1 rows 0-3, rows 4-7.
  *x = _mm512_permutex2var_epi64(v, _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), h);
  *y = _mm512_permutex2var_epi64(v, _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15), h);
}

// Codes<C>::Quad(lo, hi, u, cv): chunks 4u .. 4u+3 of panels lo and hi, cv[s] lane r holding row
// r's 4 codes of chunk 4u + s (rows 0-7 from lo, 8-15 from hi).
// Rows(panel, u, x, y): chunks 4u .. 4u+3 of one panel, rows 0-3 in x and 4-7 in y, transposed:
// 32-bit lane 4s + c holds the 4 rows' codes of channel c of chunk 4u + s.
// kSinglePlane: the layout of an affine codec, which may also be grouped per channel.
template <CodeLayout C>
struct Codes;

template <>
struct Codes<CodeLayout::kBits8> {
  static constexpr uint32_t kBits = 8;
  static constexpr bool kSinglePlane = true;
  static void Quad(const PanelView& lo, const PanelView& hi, uint32_t u, __m512i cv[4]) {
    for (uint32_t s = 0; s < 4; ++s)
      cv[s] = Load2(lo.plane[0] + 32 * (4 * u + s), hi.plane[0] + 32 * (4 * u + s));
  }
  static void Rows(const PanelView& p, uint32_t u, __m512i* x, __m512i* y) {
    // 128-bit lanes: units 4u, 4u+1 (a) and 4u+2, 4u+3 (b), rows 0-3 then 4-7 of each.
    const __m512i a = Load64(p.plane[0] + 128 * u), b = Load64(p.plane[0] + 128 * u + 64);
    *x = Transpose(_mm512_shuffle_i32x4(a, b, 0x88));
    *y = Transpose(_mm512_shuffle_i32x4(a, b, 0xdd));
  }
};

template <>
struct Codes<CodeLayout::kBits4> {
  static constexpr uint32_t kBits = 4;
  static constexpr bool kSinglePlane = true;
  static void Quad(const PanelView& lo, const PanelView& hi, uint32_t u, __m512i cv[4]) {
    const __m512i a = Load2(lo.plane[0] + 64 * u, hi.plane[0] + 64 * u);
    const __m512i b = Load2(lo.plane[0] + 64 * u + 32, hi.plane[0] + 64 * u + 32);
    cv[0] = Mask8(a, 0x0f);
    cv[1] = Mask8(_mm512_srli_epi16(a, 4), 0x0f);
    cv[2] = Mask8(b, 0x0f);
    cv[3] = Mask8(_mm512_srli_epi16(b, 4), 0x0f);
  }
  static void Rows(const PanelView& p, uint32_t u, __m512i* x, __m512i* y) {
    NibbleRows(Transpose(Load64(p.plane[0] + 64 * u)), x, y);  // one shuffle for both nibbles
    *x = Mask8(*x, 0x0f);
    *y = Mask8(*y, 0x0f);
  }
};

template <>
struct Codes<CodeLayout::kBits2> {
  static constexpr uint32_t kBits = 2;
  static constexpr bool kSinglePlane = true;
  static void Quad(const PanelView& lo, const PanelView& hi, uint32_t u, __m512i cv[4]) {
    const __m512i a = Load2(lo.plane[0] + 32 * u, hi.plane[0] + 32 * u);
    cv[0] = Mask8(a, 0x03);
    cv[1] = Mask8(_mm512_srli_epi16(a, 2), 0x03);
    cv[2] = Mask8(_mm512_srli_epi16(a, 4), 0x03);
    cv[3] = Mask8(_mm512_srli_epi16(a, 6), 0x03);
  }
  static void Rows(const PanelView& p, uint32_t u, __m512i* x, __m512i* y) {
    const __m512i down = LaneCounts(0, 30, 28, 26);  // chunk s from bit 2s to bit 0
    const uint8_t* unit = p.plane[0] + 32 * u;
    *x = Transpose(Mask8(_mm512_rolv_epi32(Broadcast16(unit), down), 0x03));
    *y = Transpose(Mask8(_mm512_rolv_epi32(Broadcast16(unit + 16), down), 0x03));
  }
};

// plane8: (a << 6) | (b << 4) | c from 2-bit planes A, B (chunk s at bit 2s of a unit) and 4-bit
// plane C (chunks 2i and 2i+1 in the low and high nibbles of unit i).
template <>
struct Codes<CodeLayout::kPlanes224> {
  static constexpr uint32_t kBits = 8;
  static constexpr bool kSinglePlane = false;
  static __m512i Combine(__m512i a, __m512i b, __m512i c) {
    return Select(0xf0, Select(0xc0, a, b), c);
  }
  template <int S>
  static __m512i Code(__m512i a, __m512i b, __m512i c) {
    return Combine(_mm512_rol_epi32(a, 6 - 2 * S), _mm512_rol_epi32(b, (36 - 2 * S) % 32),
                   S % 2 == 0 ? c : _mm512_srli_epi16(c, 4));
  }
  static void Quad(const PanelView& lo, const PanelView& hi, uint32_t u, __m512i cv[4]) {
    const __m512i a = Load2(lo.plane[0] + 32 * u, hi.plane[0] + 32 * u);
    const __m512i b = Load2(lo.plane[1] + 32 * u, hi.plane[1] + 32 * u);
    const __m512i c0 = Load2(lo.plane[2] + 64 * u, hi.plane[2] + 64 * u);
    const __m512i c1 = Load2(lo.plane[2] + 64 * u + 32, hi.plane[2] + 64 * u + 32);
    cv[0] = Code<0>(a, b, c0);
    cv[1] = Code<1>(a, b, c0);
    cv[2] = Code<2>(a, b, c1);
    cv[3] = Code<3>(a, b, c1);
  }
  static void Rows(const PanelView& p, uint32_t u, __m512i* x, __m512i* y) {
    const __m512i to_a = LaneCounts(6, 4, 2, 0), to_b = LaneCounts(4, 2, 0, 30);
    const uint8_t* a = p.plane[0] + 32 * u;
    const uint8_t* b = p.plane[1] + 32 * u;
    __m512i cx, cy;
    NibbleRows(Load64(p.plane[2] + 64 * u), &cx, &cy);
    *x = Transpose(Combine(_mm512_rolv_epi32(Broadcast16(a), to_a),
                           _mm512_rolv_epi32(Broadcast16(b), to_b), cx));
    *y = Transpose(Combine(_mm512_rolv_epi32(Broadcast16(a + 16), to_a),
                           _mm512_rolv_epi32(Broadcast16(b + 16), to_b), cy));
  }
};

// plane8/4: (a << 2) | b.
template <>
struct Codes<CodeLayout::kPlanes22> {
  static constexpr uint32_t kBits = 4;
  static constexpr bool kSinglePlane = false;
  // Bits 2-3 of a, 0-1 of b, the others zero: (0x0c & a) | (b & 0x03).
  static __m512i Combine(__m512i a, __m512i b) {
    return _mm512_ternarylogic_epi32(_mm512_set1_epi8(0x0c), a, Mask8(b, 0x03), 0xea);
  }
  template <int S>
  static __m512i Code(__m512i a, __m512i b) {
    return Combine(_mm512_rol_epi32(a, (34 - 2 * S) % 32), _mm512_rol_epi32(b, (32 - 2 * S) % 32));
  }
  static void Quad(const PanelView& lo, const PanelView& hi, uint32_t u, __m512i cv[4]) {
    const __m512i a = Load2(lo.plane[0] + 32 * u, hi.plane[0] + 32 * u);
    const __m512i b = Load2(lo.plane[1] + 32 * u, hi.plane[1] + 32 * u);
    cv[0] = Code<0>(a, b);
    cv[1] = Code<1>(a, b);
    cv[2] = Code<2>(a, b);
    cv[3] = Code<3>(a, b);
  }
  static void Rows(const PanelView& p, uint32_t u, __m512i* x, __m512i* y) {
    const __m512i to_a = LaneCounts(2, 0, 30, 28), to_b = LaneCounts(0, 30, 28, 26);
    const uint8_t* a = p.plane[0] + 32 * u;
    const uint8_t* b = p.plane[1] + 32 * u;
    *x = Transpose(
        Combine(_mm512_rolv_epi32(Broadcast16(a), to_a), _mm512_rolv_epi32(Broadcast16(b), to_b)));
    *y = Transpose(Combine(_mm512_rolv_epi32(Broadcast16(a + 16), to_a),
                           _mm512_rolv_epi32(Broadcast16(b + 16), to_b)));
  }
};

// Centred signed codes c - 2^(b-1), one instruction: x' = scale c~ + (min + 2^(b-1) scale).
template <uint32_t kBits>
inline __m512i Centre(__m512i c) {
  if constexpr (kBits == 8) {
    return _mm512_xor_si512(c, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    return _mm512_sub_epi8(c, _mm512_set1_epi8(static_cast<char>(kCentre<kBits>)));
  }
}

// ---- panels and metadata -----------------------------------------------------------------------

// Panels p and p + 1 (16 rows). A missing second panel repeats the first: its rows are never
// stored, and rows[1] = 0 keeps its metadata at zero.
struct PanelPair {
  PanelView lo, hi;
  uint32_t rows[2] = {};
};

[[gnu::always_inline]] inline void PairAt(const CodedTile& t, const PanelGeometry& g, uint32_t p,
                                          PanelPair* pair) {
  const bool has_hi = p + 1 < g.n_panels;
  PanelAt(t, g, p, &pair->lo);
  PanelAt(t, g, has_hi ? p + 1 : p, &pair->hi);
  pair->rows[0] = pair->lo.rows;
  pair->rows[1] = has_hi ? pair->hi.rows : 0;
}

// m <= 8 fp16 values at p, zero beyond m (nothing beyond is read).
[[gnu::always_inline]] inline __m128i LoadHalves(const std::byte* p, uint32_t m) {
  if (m == kPanelRows) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << m) - 1), p);
}

// rows[0] fp16 values at lo in lanes 0-7 and rows[1] at hi in lanes 8-15, as floats, zero beyond.
[[gnu::always_inline]] inline __m512 LoadPairHalves(const std::byte* lo, const std::byte* hi,
                                                    const uint32_t rows[2]) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(LoadHalves(lo, rows[0])),
                                                 LoadHalves(hi, rows[1]), 1));
}

// Scale and minimum (unless min is null) of the rows of panels p and p + 1 (rows[0] >= 1 and
// rows[1] of them), column j (token layouts; TokenMetaIndex).
template <uint32_t kBits>
[[gnu::always_inline]] inline void TokenMeta(const CodedTile& t, uint32_t p, uint32_t j,
                                             const uint32_t rows[2], __m512* scale, __m512* min) {
  const size_t per_panel = size_t{kPanelRows} * (t.row_len / kAffineGroup), first = p * per_panel;
  const size_t lo = first + size_t{rows[0]} * j;
  const size_t hi = rows[1] > 0 ? first + per_panel + size_t{rows[1]} * j : lo;
  const __m512 s = LoadPairHalves(t.scales + 2 * lo, t.scales + 2 * hi, rows);
  if (t.meta == MetaLayout::kTokenStep) {
    *scale = _mm512_mul_ps(s, _mm512_set1_ps(t.step_mul));
    if (min)
      *min = _mm512_mul_ps(*scale, _mm512_set1_ps(-static_cast<float>((1 << kBits) - 1) / 2));
  } else {
    *scale = s;
    if (min) *min = LoadPairHalves(t.mins + 2 * lo, t.mins + 2 * hi, rows);
  }
}

// s[h][first .. first + rows) = acc[h] for each head (rows of s `tokens` apart).
template <int NH>
inline void StoreScores(float* s, uint32_t tokens, uint32_t first, uint32_t rows,
                        const __m512 acc[NH]) {
  for (int h = 0; h < NH; ++h) {
    _mm512_mask_storeu_ps(s + size_t{static_cast<uint32_t>(h)} * tokens + first, FirstLanes(rows),
                          acc[h]);
  }
}

// ---- scores ------------------------------------------------------------------------------------

// Byte offset of chunk ch's 4 query bytes in a quantised query row: PackQuery's order.
inline uint32_t QueryOffset(uint32_t ch) {
  return 64 * (ch / 16) + 16 * (ch % 4) + 4 * (ch / 4 % 4);
}

// codes[0 .. 4), 64 channels as int32 within int8, to bytes at out. Two packs per 128-bit lane
// and no permute: lane l takes channels 4l .. 4l+3 of each vector, hence QueryOffset.
inline void PackQuery(const __m512i codes[4], int8_t* out) {
  _mm512_storeu_si512(out, _mm512_packs_epi16(_mm512_packs_epi32(codes[0], codes[1]),
                                              _mm512_packs_epi32(codes[2], codes[3])));
}

// Quantises the queries of NH heads, x(h, d) giving the 16 values of head h from channel d (zero
// beyond dim): segment i = h n_seg + k, channels 32k .. 32k+31, gets the step step[i] =
// max |x| / kQmax and the codes round(x / step) in qi[h] (PackQuery's order); sums[i] holds the
// segment's codes in lanes still to be added.
template <int NH, class X>
inline void QuantizeQueries(uint32_t dim, X x, int8_t (*qi)[kMaxRowLen], float* step,
                            __m512* sums) {
  const uint32_t n_seg = (dim + kAffineGroup - 1) / kAffineGroup;
  __m512 amax[kMaxHeads * kMaxCols];
  for (int h = 0; h < NH; ++h) {
    for (uint32_t k = 0; k < n_seg; ++k) {
      const uint32_t d = kAffineGroup * k;
      __m512 a = _mm512_abs_ps(x(h, d));
      if (d + 16 < dim) a = _mm512_max_ps(a, _mm512_abs_ps(x(h, d + 16)));
      amax[static_cast<uint32_t>(h) * n_seg + k] = a;
    }
  }
  float inv[kMaxHeads * kMaxCols];
  StepsOf(amax, NH * n_seg, kQmax, inv, step);
  for (int h = 0; h < NH; ++h) {
    for (uint32_t d0 = 0; d0 < dim; d0 += 64) {
      __m512i codes[4] = {};  // zero beyond dim
      for (uint32_t k = 0; k < 2 && d0 + kAffineGroup * k < dim; ++k) {
        const uint32_t i = static_cast<uint32_t>(h) * n_seg + d0 / kAffineGroup + k;
        for (uint32_t v = 0; v < 2 && d0 + kAffineGroup * k + 16 * v < dim; ++v) {
          codes[2 * k + v] = _mm512_cvtps_epi32(
              _mm512_mul_ps(x(h, d0 + kAffineGroup * k + 16 * v), _mm512_set1_ps(inv[i])));
        }
        sums[i] = _mm512_cvtepi32_ps(_mm512_add_epi32(codes[2 * k], codes[2 * k + 1]));
      }
      PackQuery(codes, qi[h] + d0);
    }
  }
}

// out[h] = per-row sums over quads [u0, u1) of codes x q[h] (int8 per channel, PackQuery's
// order): lane r is row r of the pair.
template <CodeLayout C, int NH>
[[gnu::always_inline]] inline void DotQuads(const PanelPair& pair, uint32_t u0, uint32_t u1,
                                            const int8_t (*q)[kMaxRowLen], __m512i out[NH]) {
  for (int h = 0; h < NH; ++h) out[h] = _mm512_setzero_si512();
  for (uint32_t u = u0; u < u1; ++u) {
    __m512i cv[4];
    Codes<C>::Quad(pair.lo, pair.hi, u, cv);
    for (uint32_t s = 0; s < 4; ++s) {
      for (int h = 0; h < NH; ++h)
        out[h] = _mm512_dpbusd_epi32(out[h], cv[s], Broadcast4(q[h] + QueryOffset(4 * u + s)));
    }
  }
}

// How many panel pairs ahead the scores kernels hint a tile's code planes into the cache.
constexpr uint32_t kScoresHintPairs = 2;

// Hints for the pair of panels at p of every plane (none past the full panels), spread over
// n_steps calls of Step.
class PairHints {
 public:
  PairHints(const CodedTile& t, const PanelGeometry& g, uint32_t p, uint32_t n_steps) {
    const uint32_t n_full = g.last.rows == kPanelRows ? g.n_panels : g.n_panels - 1;
    const uint32_t end = std::min(p + 2, n_full);
    for (uint32_t i = 0; i < g.n_planes && p < end; ++i)
      planes_[i] = HintStream(t.planes[i] + size_t{32} * p * g.units[i],
                              size_t{32} * (end - p) * g.units[i], n_steps);
  }
  void Step() {
    for (HintStream& plane : planes_) plane.Step();
  }

 private:
  HintStream planes_[3];
};

// Token layouts: s = sum_j scale_j qs_j (Q . c)_j + min_j qs_j sum(Q_j), i.e. q^ . k' exactly.
template <CodeLayout C, int NH>
void ScoresToken(const CodedTile& t, const PanelGeometry& g, const float* q, float* s) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  const uint32_t n_cols = t.dim / kAffineGroup;
  alignas(64) int8_t qi[NH][kMaxRowLen];
  float q_step[NH * kMaxCols], q_min[NH * kMaxCols];
  __m512 sums[NH * kMaxCols];
  QuantizeQueries<NH>(
      t.dim,
      [&](int h, uint32_t d) {
        return _mm512_loadu_ps(q + size_t{static_cast<uint32_t>(h)} * t.dim + d);
      },
      qi, q_step, sums);
  SumsOf(sums, NH * n_cols, q_min);
  for (uint32_t i = 0; i < NH * n_cols; ++i) q_min[i] *= q_step[i];
  for (uint32_t p = 0; p < g.n_panels; p += 2) {
    PanelPair pair;
    PairAt(t, g, p, &pair);
    PairHints hints(t, g, p + 2 * kScoresHintPairs, n_cols);
    __m512 acc[NH];
    for (int h = 0; h < NH; ++h) acc[h] = _mm512_setzero_ps();
    for (uint32_t j = 0; j < n_cols; ++j) {
      hints.Step();
      __m512i dots[NH];
      DotQuads<C, NH>(pair, 2 * j, 2 * j + 2, qi, dots);
      __m512 scale, min;
      TokenMeta<kBits>(t, p, j, pair.rows, &scale, &min);
      for (int h = 0; h < NH; ++h) {
        const uint32_t i = static_cast<uint32_t>(h) * n_cols + j;
        acc[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[h]),
                                 _mm512_mul_ps(scale, _mm512_set1_ps(q_step[i])), acc[h]);
        acc[h] = _mm512_fmadd_ps(min, _mm512_set1_ps(q_min[i]), acc[h]);
      }
    }
    StoreScores<NH>(s, t.tokens, p * kPanelRows, pair.rows[0] + pair.rows[1], acc);
  }
}

// Float scales and midpoints mid = min + o scale (o = (2^b - 1) / 2) of channel group g.
inline void ChannelMeta(const CodedTile& t, uint32_t g, float offset, float* scale, float* mid) {
  const std::byte* s = t.scales + size_t{2} * g * t.dim;
  const std::byte* m = t.mins + size_t{2} * g * t.dim;
  for (uint32_t d = 0; d < t.dim; d += 16) {
    const __m512 sv =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * d)));
    const __m512 mv =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 2 * d)));
    _mm512_store_ps(scale + d, sv);
    _mm512_store_ps(mid + d, _mm512_fmadd_ps(sv, _mm512_set1_ps(offset), mv));
  }
}

// Channel layout: Q'_d = q_d scale_d / qs_k per 32 tokens, one step qs_k per segment k of 32
// channels (so an outlier channel coarsens only its own segment);
// s = sum_k qs_k (Q' . c)_k + sum_d q_d mid_d - o sum_k qs_k sum(Q'_k), which centres the codes
// (error sum_d delta_d (c - o)).
template <CodeLayout C, int NH>
void ScoresChannel(const CodedTile& t, const PanelGeometry& g, const float* q, float* s) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  const float offset = static_cast<float>((1 << kBits) - 1) / 2;
  const uint32_t n_quads = t.dim / 16, n_segments = (n_quads + 1) / 2;
  alignas(64) float scale[kMaxRowLen], mid[kMaxRowLen];
  alignas(64) int8_t qi[NH][kMaxRowLen];
  float q_step[NH * kMaxCols], constant[kMaxHeads];
  __m512 sums[NH * kMaxCols];
  for (uint32_t group = 0; group * kGroupPanels < g.n_panels; ++group) {
    ChannelMeta(t, group, offset, scale, mid);
    QuantizeQueries<NH>(
        t.dim,
        [&](int h, uint32_t d) {
          return _mm512_mul_ps(_mm512_loadu_ps(q + size_t{static_cast<uint32_t>(h)} * t.dim + d),
                               _mm512_load_ps(scale + d));
        },
        qi, q_step, sums);
    __m512 partial[NH];
    for (int h = 0; h < NH; ++h) {
      const float* qh = q + size_t{static_cast<uint32_t>(h)} * t.dim;
      __m512 dot_mid = _mm512_setzero_ps(), code_sum = _mm512_setzero_ps();
      for (uint32_t d = 0; d < t.dim; d += 16)
        dot_mid = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d), _mm512_load_ps(mid + d), dot_mid);
      for (uint32_t k = 0; k < n_segments; ++k) {
        const uint32_t i = static_cast<uint32_t>(h) * n_segments + k;
        code_sum = _mm512_fmadd_ps(sums[i], _mm512_set1_ps(q_step[i]), code_sum);
      }
      partial[h] = _mm512_fnmadd_ps(_mm512_set1_ps(offset), code_sum, dot_mid);
    }
    SumsOf(partial, NH, constant);
    for (uint32_t p = group * kGroupPanels; p < g.n_panels && p < (group + 1) * kGroupPanels;
         p += 2) {
      PanelPair pair;
      PairAt(t, g, p, &pair);
      PairHints hints(t, g, p + 2 * kScoresHintPairs, n_segments);
      __m512 acc[NH];
      for (int h = 0; h < NH; ++h) acc[h] = _mm512_set1_ps(constant[h]);
      for (uint32_t k = 0; k < n_segments; ++k) {
        hints.Step();
        __m512i dots[NH];
        DotQuads<C, NH>(pair, 2 * k, 2 * k + 2 < n_quads ? 2 * k + 2 : n_quads, qi, dots);
        for (int h = 0; h < NH; ++h) {
          acc[h] = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(dots[h]),
              _mm512_set1_ps(q_step[static_cast<uint32_t>(h) * n_segments + k]), acc[h]);
        }
      }
      StoreScores<NH>(s, t.tokens, p * kPanelRows, pair.rows[0] + pair.rows[1], acc);
    }
  }
}

// ---- accumulate --------------------------------------------------------------------------------

// Byte offset of the weights of rows 4i .. 4i+3 of a group (i < 8): PackWeights' order.
inline uint32_t WeightOffset(uint32_t i) { return 16 * (i % 4) + 4 * (i / 4); }

// round(x[0 .. 2)), the 32 weights of a group (in [0, kWmax]), to bytes at out[64]. Two packs and
// no permute: 128-bit lane l takes rows 4l .. 4l+3 of each vector, hence WeightOffset (the second
// 8 bytes of each lane repeat the first).
inline void PackWeights(const __m512 x[2], uint8_t* out) {
  const __m512i w = _mm512_packus_epi32(_mm512_cvtps_epi32(x[0]), _mm512_cvtps_epi32(x[1]));
  _mm512_store_si512(out, _mm512_packus_epi16(w, w));
}

// What the integer pass needs of one group of 32 rows.
struct RowGroup {
  PanelView panels[kGroupPanels];
  uint32_t n_panels = 0;
};

// out[h] = sum over the group's panels of w[h] (PackWeights' bytes) times the centred codes of
// quad u: int32 per channel 16u .. 16u+15.
template <CodeLayout C, int NH>
[[gnu::always_inline]] inline void GroupQuad(const RowGroup& group, uint32_t u,
                                             const uint8_t* const w[NH], __m512i out[NH]) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  for (int h = 0; h < NH; ++h) out[h] = _mm512_setzero_si512();
  for (uint32_t pp = 0; pp < group.n_panels; ++pp) {
    __m512i x, y;
    Codes<C>::Rows(group.panels[pp], u, &x, &y);
    x = Centre<kBits>(x);
    y = Centre<kBits>(y);
    for (int h = 0; h < NH; ++h) {
      out[h] = _mm512_dpbusd_epi32(out[h], Broadcast4(w[h] + WeightOffset(2 * pp)), x);
      out[h] = _mm512_dpbusd_epi32(out[h], Broadcast4(w[h] + WeightOffset(2 * pp + 1)), y);
    }
  }
}

// Rows are taken in blocks of up to kBlockGroups groups of 32; each 16 channels run down a whole
// block with their float sums in registers, so acc is read and written once per block.
constexpr uint32_t kBlockGroups = 8;

// The panels of groups [g0, g0 + n) and each head's probabilities of their rows, 2 vectors of 16
// a group, zero beyond the tile.
template <int NH>
inline void LoadBlock(const CodedTile& t, const PanelGeometry& g, uint32_t g0, uint32_t n,
                      const float* p, RowGroup groups[kBlockGroups],
                      __m512 probs[kBlockGroups][NH][2]) {
  for (uint32_t k = 0; k < n; ++k) {
    RowGroup& rg = groups[k];
    rg.n_panels = 0;
    for (uint32_t q = (g0 + k) * kGroupPanels; q < g.n_panels && rg.n_panels < kGroupPanels; ++q)
      PanelAt(t, g, q, &rg.panels[rg.n_panels++]);
    const uint32_t first = (g0 + k) * kAffineGroup, rows = t.tokens - first;
    for (int h = 0; h < NH; ++h) {
      const float* ph = p + size_t{static_cast<uint32_t>(h)} * t.tokens + first;
      probs[k][h][0] = _mm512_maskz_loadu_ps(FirstLanes(rows), ph);
      probs[k][h][1] =
          rows > 16 ? _mm512_maskz_loadu_ps(FirstLanes(rows - 16), ph + 16) : _mm512_setzero_ps();
    }
  }
}

// Scale and minimum (unless min is null) of the rows of group k (panels 4k ..), column j: two
// vectors of 16 rows.
template <uint32_t kBits>
[[gnu::always_inline]] inline void GroupTokenMeta(const CodedTile& t, uint32_t k,
                                                  const RowGroup& rg, uint32_t j, __m512 scale[2],
                                                  __m512 min[2]) {
  for (uint32_t i = 0; i < 2; ++i) {
    const uint32_t rows[2] = {2 * i < rg.n_panels ? rg.panels[2 * i].rows : 0,
                              2 * i + 1 < rg.n_panels ? rg.panels[2 * i + 1].rows : 0};
    scale[i] = _mm512_setzero_ps();
    if (min) min[i] = _mm512_setzero_ps();
    if (rows[0] > 0) {
      TokenMeta<kBits>(t, k * kGroupPanels + 2 * i, j, rows, &scale[i], min ? &min[i] : nullptr);
    }
  }
}

// acc[h][d .. d+16) += facc[h] + add[h] for each head (rows of acc `dim` apart).
template <int NH>
inline void AddToAcc(float* acc, uint32_t dim, uint32_t d, const __m512 facc[NH],
                     const float add[NH]) {
  for (int h = 0; h < NH; ++h) {
    float* a = acc + size_t{static_cast<uint32_t>(h)} * dim + d;
    _mm512_storeu_ps(
        a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_add_ps(facc[h], _mm512_set1_ps(add[h]))));
  }
}

// Token layouts: the weights w_tj = p_t scale_tj of all columns j of a group are quantised with
// one step ws per head (max_tj w_tj = max_t p_t max_j scale_tj, p being >= 0);
// acc_d += sum over groups of ws (W . c~)_d, plus sum_t p_t mid_tj, mid = min + 2^(b-1) scale.
// Column by column: a column's weights are quantised just before its 32 channels run down the
// block.
template <CodeLayout C, int NH>
void AccumulateToken(const CodedTile& t, const PanelGeometry& g, const float* p, float* acc) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  const uint32_t n_cols = t.dim / kAffineGroup,
                 n_groups = (g.n_panels + kGroupPanels - 1) / kGroupPanels;
  alignas(64) uint8_t weights[kBlockGroups][NH][64];
  RowGroup groups[kBlockGroups];
  __m512 probs[kBlockGroups][NH][2], scaled[kBlockGroups][NH][2];  // p and p / ws
  __m512 amax[kBlockGroups * NH];
  float inv[kBlockGroups * NH], step[kBlockGroups * NH], add[kMaxHeads];
  for (uint32_t g0 = 0; g0 < n_groups; g0 += kBlockGroups) {
    const uint32_t n = n_groups - g0 < kBlockGroups ? n_groups - g0 : kBlockGroups;
    LoadBlock<NH>(t, g, g0, n, p, groups, probs);
    for (uint32_t k = 0; k < n; ++k) {
      __m512 scale_max[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
      for (uint32_t j = 0; j < n_cols; ++j) {
        __m512 scale[2];
        GroupTokenMeta<kBits>(t, g0 + k, groups[k], j, scale, nullptr);
        for (int i = 0; i < 2; ++i) scale_max[i] = _mm512_max_ps(scale_max[i], scale[i]);
      }
      for (int h = 0; h < NH; ++h) {
        amax[k * NH + h] = _mm512_max_ps(_mm512_mul_ps(probs[k][h][0], scale_max[0]),
                                         _mm512_mul_ps(probs[k][h][1], scale_max[1]));
      }
    }
    StepsOf(amax, n * NH, kWmax, inv, step);
    for (uint32_t k = 0; k < n; ++k) {
      for (int h = 0; h < NH; ++h) {
        for (int i = 0; i < 2; ++i)
          scaled[k][h][i] = _mm512_mul_ps(probs[k][h][i], _mm512_set1_ps(inv[k * NH + h]));
      }
    }
    for (uint32_t j = 0; j < n_cols; ++j) {
      __m512 shift[NH];
      for (int h = 0; h < NH; ++h) shift[h] = _mm512_setzero_ps();
      for (uint32_t k = 0; k < n; ++k) {
        __m512 scale[2], min[2];
        GroupTokenMeta<kBits>(t, g0 + k, groups[k], j, scale, min);
        for (int i = 0; i < 2; ++i)
          min[i] = _mm512_fmadd_ps(scale[i], _mm512_set1_ps(kCentre<kBits>), min[i]);  // mid
        for (int h = 0; h < NH; ++h) {
          const __m512 w[2] = {_mm512_mul_ps(scaled[k][h][0], scale[0]),
                               _mm512_mul_ps(scaled[k][h][1], scale[1])};
          PackWeights(w, weights[k][h]);
          shift[h] = _mm512_fmadd_ps(probs[k][h][1], min[1],
                                     _mm512_fmadd_ps(probs[k][h][0], min[0], shift[h]));
        }
      }
      SumsOf(shift, NH, add);
      for (uint32_t u = 2 * j; u < 2 * j + 2; ++u) {
        __m512 facc[NH];
        for (int h = 0; h < NH; ++h) facc[h] = _mm512_setzero_ps();
        for (uint32_t k = 0; k < n; ++k) {
          const uint8_t* w[NH];
          for (int h = 0; h < NH; ++h) w[h] = weights[k][h];
          __m512i sums[NH];
          GroupQuad<C, NH>(groups[k], u, w, sums);
          for (int h = 0; h < NH; ++h) {
            facc[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[h]), _mm512_set1_ps(step[k * NH + h]),
                                      facc[h]);
          }
        }
        AddToAcc<NH>(acc, t.dim, 16 * u, facc, add);
      }
    }
  }
}

// Channel layout: p is quantised over the 32 rows of a group with one step ws per head;
// acc_d += sum over groups of scale_gd ws (W . c~)_d + mid_gd sum_t p_t.
template <CodeLayout C, int NH>
void AccumulateChannel(const CodedTile& t, const PanelGeometry& g, const float* p, float* acc) {
  constexpr uint32_t kBits = Codes<C>::kBits;
  const uint32_t n_groups = (g.n_panels + kGroupPanels - 1) / kGroupPanels;
  alignas(64) uint8_t weights[kBlockGroups][NH][64];
  RowGroup groups[kBlockGroups];
  __m512 probs[kBlockGroups][NH][2], amax[kBlockGroups * NH], sum[kBlockGroups * NH];
  float inv[kBlockGroups * NH], step[kBlockGroups * NH], total[kBlockGroups * NH];
  const float zero[NH] = {};
  for (uint32_t g0 = 0; g0 < n_groups; g0 += kBlockGroups) {
    const uint32_t n = n_groups - g0 < kBlockGroups ? n_groups - g0 : kBlockGroups;
    LoadBlock<NH>(t, g, g0, n, p, groups, probs);
    for (uint32_t k = 0; k < n; ++k) {
      for (int h = 0; h < NH; ++h) {
        amax[k * NH + h] = _mm512_max_ps(probs[k][h][0], probs[k][h][1]);
        sum[k * NH + h] = _mm512_add_ps(probs[k][h][0], probs[k][h][1]);
      }
    }
    StepsOf(amax, n * NH, kWmax, inv, step);
    SumsOf(sum, n * NH, total);
    for (uint32_t k = 0; k < n; ++k) {
      for (int h = 0; h < NH; ++h) {
        const __m512 w[2] = {_mm512_mul_ps(probs[k][h][0], _mm512_set1_ps(inv[k * NH + h])),
                             _mm512_mul_ps(probs[k][h][1], _mm512_set1_ps(inv[k * NH + h]))};
        PackWeights(w, weights[k][h]);
      }
    }
    for (uint32_t u = 0; u < t.dim / 16; ++u) {
      __m512 facc[NH];
      for (int h = 0; h < NH; ++h) facc[h] = _mm512_setzero_ps();
      for (uint32_t k = 0; k < n; ++k) {
        const uint8_t* w[NH];
        for (int h = 0; h < NH; ++h) w[h] = weights[k][h];
        __m512i sums[NH];
        GroupQuad<C, NH>(groups[k], u, w, sums);
        const size_t at = 2 * (size_t{g0 + k} * t.dim + 16 * u);
        const __m512 scale =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.scales + at)));
        const __m512 mid = _mm512_fmadd_ps(
            scale, _mm512_set1_ps(kCentre<kBits>),
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.mins + at))));
        for (int h = 0; h < NH; ++h) {
          facc[h] = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(sums[h]), _mm512_mul_ps(scale, _mm512_set1_ps(step[k * NH + h])),
              _mm512_fmadd_ps(mid, _mm512_set1_ps(total[k * NH + h]), facc[h]));
        }
      }
      AddToAcc<NH>(acc, t.dim, 16 * u, facc, zero);
    }
  }
}

// ---- dispatch ----------------------------------------------------------------------------------

struct ScoresKernel {
  template <CodeLayout C, int NH>
  static void Run(const CodedTile& t, const PanelGeometry& g, const float* q, float* s) {
    if constexpr (Codes<C>::kSinglePlane) {
      if (t.meta == MetaLayout::kChannelScaleMin) return ScoresChannel<C, NH>(t, g, q, s);
    }
    ScoresToken<C, NH>(t, g, q, s);
  }
};

struct AccumulateKernel {
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
  ByHeadPasses<kMaxHeads>(n_q, [&](auto heads, uint32_t i) {
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

bool AllWithinAvx512(const float* x, size_t n, float lo, float hi) {
  const __m512 l = _mm512_set1_ps(lo), h = _mm512_set1_ps(hi);
  // Two masks of lanes out of range (or NaN), so that consecutive vectors do not wait on each
  // other's compares.
  __mmask16 out[2] = {0, 0};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 2; ++k) {
      const __m512 v = _mm512_loadu_ps(x + i + 16 * k);
      out[k] |= static_cast<__mmask16>(
          ~_mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(v, l, _CMP_GE_OQ), v, h, _CMP_LE_OQ));
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 lanes = FirstLanes(static_cast<uint32_t>(n - i < 16 ? n - i : 16));
    const __m512 v = _mm512_maskz_loadu_ps(lanes, x + i);
    out[0] |= static_cast<__mmask16>(
        lanes & ~_mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(v, l, _CMP_GE_OQ), v, h, _CMP_LE_OQ));
  }
  return (out[0] | out[1]) == 0;
}

namespace {

// AffineFit::Code of 16 values, as bytes: vminps/vmaxps (first operand if it wins, else the
// second) and a separate multiply and add round as the scalar code does.
__m128i Codes16(__m512 x, __m512 min, __m512 inv_scale, __m512 max_code) {
  const __m512 y =
      _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(x, min), inv_scale), _mm512_set1_ps(0.5f));
  const __m512 f = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 c = _mm512_min_ps(_mm512_max_ps(f, _mm512_setzero_ps()), max_code);
  return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(c));
}

}  // namespace

void RangeAvx512(const float* x, size_t count, float* lo, float* hi) {
  const __m512 first = _mm512_set1_ps(x[0]);
  __m512 l = first, h = first;
  for (size_t i = 0; i < count; i += 16) {
    const __m512 v = _mm512_mask_loadu_ps(first, FirstLanes(count - i), x + i);
    l = _mm512_min_ps(v, l);
    h = _mm512_max_ps(v, h);
  }
  *lo = _mm512_reduce_min_ps(l);
  *hi = _mm512_reduce_max_ps(h);
  // The tree's order shows only between -0 and +0, which compare equal: redo those in order.
  if (*lo == 0.0f || *hi == 0.0f) FoldRange(x, count, 1, lo, hi);
}

void ColumnRangesAvx512(const float* x, uint32_t count, uint32_t dim, float* lo, float* hi) {
  for (uint32_t d = 0; d < dim; d += 16) {
    const __mmask16 lanes = FirstLanes(dim - d);
    __m512 l = _mm512_maskz_loadu_ps(lanes, x + d), h = l;
    for (uint32_t t = 1; t < count; ++t) {  // in order, as the scalar fold
      const __m512 v = _mm512_maskz_loadu_ps(lanes, x + size_t{t} * dim + d);
      l = _mm512_min_ps(v, l);
      h = _mm512_max_ps(v, h);
    }
    _mm512_mask_storeu_ps(lo + d, lanes, l);
    _mm512_mask_storeu_ps(hi + d, lanes, h);
  }
}

void CodesAvx512(const float* x, size_t n, float min, float inv_scale, float max_code,
                 uint8_t* codes) {
  const __m512 m = _mm512_set1_ps(min), s = _mm512_set1_ps(inv_scale), c = _mm512_set1_ps(max_code);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = FirstLanes(n - i);
    _mm_mask_storeu_epi8(codes + i, lanes, Codes16(_mm512_maskz_loadu_ps(lanes, x + i), m, s, c));
  }
}

void RowCodesAvx512(const float* x, uint32_t dim, const float* min, const float* inv_scale,
                    float max_code, uint8_t* codes) {
  const __m512 c = _mm512_set1_ps(max_code);
  for (uint32_t d = 0; d < dim; d += 16) {
    const __mmask16 lanes = FirstLanes(dim - d);
    _mm_mask_storeu_epi8(
        codes + d, lanes,
        Codes16(_mm512_maskz_loadu_ps(lanes, x + d), _mm512_maskz_loadu_ps(lanes, min + d),
                _mm512_maskz_loadu_ps(lanes, inv_scale + d), c));
  }
}

void PanelScoresAvx512(const CodedTile& tile, const float* q, uint32_t n_q, float* s) {
  Dispatch<ScoresKernel>(tile, q, tile.dim, s, tile.tokens, n_q);
}

void PanelAccumulateAvx512(const CodedTile& tile, const float* p, uint32_t n_q, float* acc) {
  Dispatch<AccumulateKernel>(tile, p, tile.tokens, acc, tile.dim, n_q);
}

}  // namespace argus::codec_internal
