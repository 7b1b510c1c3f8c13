// AVX-512 kernels of the float codecs (f32, f16, bf16). On CPUs with two 512-bit FMA ports they
// have twice the FMA width of the AVX2 kernels, and 32 registers.
//
// scores: a block of P = 4 query heads and 16 tokens. The 16 lanes of an
// accumulator hold the P heads x G = 16 / P phases of the dimension: lane h * G + g sums
// q_h[d] * k_t[d] over the d with d mod G = g. Each FMA then serves every head of the block:
// its K operand is G consecutive values of one key broadcast to all heads, its query operand a
// table built once per call. There is no horizontal reduction per dot product. Keys are widened
// to f32 into a 16-row buffer (a broadcast of G floats reads them from memory), and at the end of
// a block permutes sum the G phases and transpose the results, so each head's 16 scores leave in
// one store.
// accumulate: NH heads x C vectors of 16 channels stay in registers while the tokens stream.
#include <immintrin.h>

#include "codec/float_kernels.h"

// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_ps(), which its
// -Wmaybe-uninitialized reports at every use (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace argus::codec_internal {
namespace {

constexpr int kLanes = 16;
constexpr uint32_t kBlockTokens = 16;
// How far ahead the kernels hint tiles into the cache. Streaming a tile from DRAM, hints cut the
// time of accumulate by a quarter (5.9 -> 4.5 us per 256 x 64 f16 tile here); for scores they
// measured within this machine's noise.
constexpr uint32_t kScoresHintBlocks = 2;
constexpr uint32_t kAccumulateHintTokens = 16;

inline __mmask16 FirstLanes(uint32_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}

// Hints the lines of [p, p + n_bytes) into the cache.
inline void Prefetch(const void* p, size_t n_bytes) {
  for (size_t i = 0; i < n_bytes; i += 64)
    _mm_prefetch(static_cast<const char*>(p) + i, _MM_HINT_T0);
}

template <FloatKind kKind>
struct Loader {
  static constexpr size_t kValueBytes = kKind == FloatKind::kF32 ? 4 : 2;
  const void* base;
  const void* At(size_t i) const { return static_cast<const char*>(base) + i * kValueBytes; }
  // Values i .. i+16 in the lanes of `mask`, 0 elsewhere (nothing outside the mask is read).
  __m512 Load(size_t i, __mmask16 mask) const {
    if constexpr (kKind == FloatKind::kF32) {
      return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i);
      if constexpr (kKind == FloatKind::kF16) {
        return _mm512_cvtph_ps(h);
      } else {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
    }
  }
};

// G consecutive floats at p, repeated over the 16 lanes.
template <int G>
inline __m512 BroadcastGroup(const float* p) {
  if constexpr (G == 1) {
    return _mm512_set1_ps(*p);
  } else if constexpr (G == 2) {
    double pair;
    __builtin_memcpy(&pair, p, sizeof pair);
    return _mm512_castpd_ps(_mm512_set1_pd(pair));
  } else if constexpr (G == 4) {
    return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
  } else if constexpr (G == 8) {
    return _mm512_castpd_ps(
        _mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(p))));
  } else {
    return _mm512_loadu_ps(p);
  }
}

// Index vectors for _mm512_permutex2var_ps (0..15: lanes of the first operand, 16..31: of the
// second), built at compile time.
struct LaneIndex {
  int v[kLanes];
  __m512i Load() const { return _mm512_loadu_si512(v); }
};

// Phase reduction, level l of log2(G): x holds tokens [0, 2^(l-1)) of a group, y the next as
// many. In the result, lane h * G + k has token tau = k mod 2^l (bit l-1 says x or y) and the
// phases sigma' = k >> l (first) or (k >> l) + G / 2^l (second) summed so far.
constexpr LaneIndex ReduceIndex(int G, int l, bool second) {
  LaneIndex index{};
  for (int j = 0; j < kLanes; ++j) {
    const int h = j / G, k = j % G;
    const int tau = k & ((1 << l) - 1), sigma = (k >> l) + (second ? G >> l : 0);
    const int from_y = (tau >> (l - 1)) & 1;
    index.v[j] = from_y * kLanes + h * G + ((sigma << (l - 1)) | (tau & ((1 << (l - 1)) - 1)));
  }
  return index;
}

// Transpose of a P x P matrix of G-float elements held one row per vector: rows c and c + step
// swap their off-diagonal blocks of width `step` elements (`upper`: the new row c + step).
constexpr LaneIndex TransposeIndex(int G, int step, bool upper) {
  LaneIndex index{};
  for (int j = 0; j < kLanes; ++j) {
    const int e = j / G, tau = j % G;
    if (!upper) {
      index.v[j] = (e & step) ? kLanes + (e - step) * G + tau : e * G + tau;
    } else {
      index.v[j] = (e & step) ? kLanes + e * G + tau : (e + step) * G + tau;
    }
  }
  return index;
}

template <int G, int l>
inline void ReduceLevel(__m512* a, int n) {
  static constexpr LaneIndex kFirst = ReduceIndex(G, l, false), kSecond = ReduceIndex(G, l, true);
  const __m512i first = kFirst.Load(), second = kSecond.Load();
  for (int i = 0; i < n / 2; ++i) {
    a[i] = _mm512_add_ps(_mm512_permutex2var_ps(a[2 * i], first, a[2 * i + 1]),
                         _mm512_permutex2var_ps(a[2 * i], second, a[2 * i + 1]));
  }
}

template <int G, int step>
inline void TransposeLevel(__m512* a, int n) {
  static constexpr LaneIndex kLower = TransposeIndex(G, step, false),
                             kUpper = TransposeIndex(G, step, true);
  const __m512i lower = kLower.Load(), upper = kUpper.Load();
  for (int c = 0; c < n; ++c) {
    if (c & step) continue;
    const __m512 x = a[c], y = a[c + step];
    a[c] = _mm512_permutex2var_ps(x, lower, y);
    a[c + step] = _mm512_permutex2var_ps(x, upper, y);
  }
}

// a[b], b < 16: lane h * G + g is the phase-g partial score of head h and token b. Afterwards
// a[h], h < P: lane t is the score of head h and token t.
template <int G>
[[gnu::always_inline]] inline void ReduceAndTranspose(__m512* a) {
  constexpr int P = kLanes / G;
  if constexpr (G >= 2) ReduceLevel<G, 1>(a, 16);
  if constexpr (G >= 4) ReduceLevel<G, 2>(a, 8);
  if constexpr (G >= 8) ReduceLevel<G, 3>(a, 4);
  if constexpr (G >= 16) ReduceLevel<G, 4>(a, 2);
  if constexpr (P >= 16) TransposeLevel<G, 8>(a, P);
  if constexpr (P >= 8) TransposeLevel<G, 4>(a, P);
  if constexpr (P >= 4) TransposeLevel<G, 2>(a, P);
  if constexpr (P >= 2) TransposeLevel<G, 1>(a, P);
}

// Keys t0 .. t0+16 as f32 rows of `stride` floats (0 past dim and past the tile), and a hint for
// a block further on.
template <typename L>
[[gnu::always_inline]] inline void WidenBlock(const L& k, uint32_t t0, uint32_t tokens,
                                              uint32_t dim, uint32_t stride, float* out) {
  const uint32_t ahead = t0 + kScoresHintBlocks * kBlockTokens;
  if (ahead < tokens)
    Prefetch(k.At(size_t{ahead} * dim), size_t{kBlockTokens} * dim * L::kValueBytes);
  for (uint32_t b = 0; b < kBlockTokens; ++b) {
    for (uint32_t d = 0; d < stride; d += kLanes) {
      const __m512 x = t0 + b < tokens ? k.Load(size_t{t0 + b} * dim + d, FirstLanes(dim - d))
                                       : _mm512_setzero_ps();
      _mm512_store_ps(out + b * stride + d, x);
    }
  }
}

// Scores of n_heads <= P heads (q: [n_heads, dim], s: rows of `tokens`); missing heads are 0 in
// the table and never stored.
template <typename L, int P>
void ScoresHeads(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_heads,
                 float* s) {
  constexpr int G = kLanes / P;
  const uint32_t stride = (dim + kLanes - 1) / kLanes * kLanes;  // a widened key row, 0-padded
  const uint32_t n_phases = (dim + G - 1) / G;
  // table[ph][h * G + g] = q[h][ph * G + g], 0 past dim.
  alignas(64) float table[kFloatKernelMaxDim * P];
  __builtin_memset(table, 0, sizeof(float) * kLanes * n_phases);
  for (uint32_t h = 0; h < n_heads; ++h) {
    for (uint32_t ph = 0; ph < n_phases; ++ph) {
      const uint32_t d = ph * G, n = dim - d < uint32_t{G} ? dim - d : uint32_t{G};
      __builtin_memcpy(table + ph * kLanes + h * G, q + size_t{h} * dim + d, sizeof(float) * n);
    }
  }
  alignas(64) float keys[kBlockTokens * kFloatKernelMaxDim];
  for (uint32_t t0 = 0; t0 < tokens; t0 += kBlockTokens) {
    const uint32_t n_tokens = tokens - t0 < kBlockTokens ? tokens - t0 : kBlockTokens;
    WidenBlock(k, t0, tokens, dim, stride, keys);
    __m512 a[kBlockTokens];
    for (uint32_t b = 0; b < kBlockTokens; ++b) a[b] = _mm512_setzero_ps();
    for (uint32_t ph = 0; ph < n_phases; ++ph) {
      const __m512 qv = _mm512_load_ps(table + ph * kLanes);
      for (uint32_t b = 0; b < kBlockTokens; ++b)
        a[b] = _mm512_fmadd_ps(qv, BroadcastGroup<G>(keys + b * stride + ph * G), a[b]);
    }
    ReduceAndTranspose<G>(a);
    const __mmask16 mask = FirstLanes(n_tokens);
    for (uint32_t h = 0; h < n_heads; ++h)
      _mm512_mask_storeu_ps(s + size_t{h} * tokens + t0, mask, a[h]);
  }
}

// acc[h][d0 .. d0 + 16 C) += sum_t p[h][t] v[t][d0 ..] for NH heads; the last vector's channels
// under last_mask.
template <typename L, int NH, int C>
void AccumulateVectors(const L& v, uint32_t tokens, uint32_t dim, const float* p, float* acc,
                       uint32_t d0, __mmask16 last_mask) {
  __mmask16 mask[C];
  for (int c = 0; c < C; ++c) mask[c] = c == C - 1 ? last_mask : __mmask16{0xffff};
  __m512 a[NH][C];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < C; ++c)
      a[h][c] = _mm512_maskz_loadu_ps(
          mask[c], acc + size_t{static_cast<uint32_t>(h)} * dim + d0 + kLanes * c);
  for (uint32_t t = 0; t < tokens; ++t) {
    if (t % 8 == 0 && t + kAccumulateHintTokens < tokens)
      Prefetch(v.At(size_t{t + kAccumulateHintTokens} * dim + d0),
               size_t{8} * dim * L::kValueBytes);
    __m512 x[C];
    for (int c = 0; c < C; ++c) x[c] = v.Load(size_t{t} * dim + d0 + kLanes * c, mask[c]);
    for (int h = 0; h < NH; ++h) {
      const __m512 w = _mm512_set1_ps(p[size_t{static_cast<uint32_t>(h)} * tokens + t]);
      for (int c = 0; c < C; ++c) a[h][c] = _mm512_fmadd_ps(w, x[c], a[h][c]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < C; ++c)
      _mm512_mask_storeu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d0 + kLanes * c, mask[c],
                            a[h][c]);
}

template <typename L, int NH>
void AccumulateHeads(const L& v, uint32_t tokens, uint32_t dim, const float* p, float* acc) {
  // Accumulators and the widened values fill at most 25 of the 32 registers.
  constexpr int C = NH == 1 ? 8 : kLanes / NH;
  const uint32_t n_vectors = (dim + kLanes - 1) / kLanes;
  const __mmask16 last = FirstLanes(dim - (n_vectors - 1) * kLanes);
  uint32_t i = 0;
  for (; i + C <= n_vectors; i += C)
    AccumulateVectors<L, NH, C>(v, tokens, dim, p, acc, i * kLanes,
                                i + C == n_vectors ? last : __mmask16{0xffff});
  for (; i < n_vectors; ++i)
    AccumulateVectors<L, NH, 1>(v, tokens, dim, p, acc, i * kLanes,
                                i + 1 == n_vectors ? last : __mmask16{0xffff});
}

// Calls block.template operator()<NH>(i) for the heads [i, i + NH) of n_q: blocks of 16, then
// the remainder as 8, 4, 2, 1.
template <typename Block>
inline void ForHeadBlocks(uint32_t n_q, Block&& block) {
  uint32_t i = 0;
  for (; i + 16 <= n_q; i += 16) block.template operator()<16>(i);
  if (n_q - i >= 8) block.template operator()<8>(i), i += 8;
  if (n_q - i >= 4) block.template operator()<4>(i), i += 4;
  if (n_q - i >= 2) block.template operator()<2>(i), i += 2;
  if (n_q - i >= 1) block.template operator()<1>(i);
}

// Heads in blocks of 4, the last one padded: a head's score must not depend on how many heads
// share its call (a prompt evaluated in two chunks gives the same logits as in one), and the
// block size fixes the order of its sums. Four serves GQA 4 and 8 without idle lanes.
template <typename L>
void Scores(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q, float* s) {
  constexpr uint32_t kHeads = 4;
  for (uint32_t i = 0; i < n_q; i += kHeads) {
    const uint32_t n = n_q - i < kHeads ? n_q - i : kHeads;
    ScoresHeads<L, kHeads>(k, tokens, dim, q + size_t{i} * dim, n, s + size_t{i} * tokens);
  }
}

template <typename L>
void Accumulate(const L& v, uint32_t tokens, uint32_t dim, const float* p, uint32_t n_q,
                float* acc) {
  ForHeadBlocks(n_q, [&]<int NH>(uint32_t i) {
    AccumulateHeads<L, NH>(v, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
  });
}

}  // namespace

void ScoresFloatAvx512(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                       uint32_t n_q, float* s) {
  switch (kind) {
    case FloatKind::kF32:
      Scores(Loader<FloatKind::kF32>{k}, tokens, dim, q, n_q, s);
      break;
    case FloatKind::kF16:
      Scores(Loader<FloatKind::kF16>{k}, tokens, dim, q, n_q, s);
      break;
    case FloatKind::kBf16:
      Scores(Loader<FloatKind::kBf16>{k}, tokens, dim, q, n_q, s);
      break;
  }
}

void AccumulateFloatAvx512(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                           const float* p, uint32_t n_q, float* acc) {
  switch (kind) {
    case FloatKind::kF32:
      Accumulate(Loader<FloatKind::kF32>{v}, tokens, dim, p, n_q, acc);
      break;
    case FloatKind::kF16:
      Accumulate(Loader<FloatKind::kF16>{v}, tokens, dim, p, n_q, acc);
      break;
    case FloatKind::kBf16:
      Accumulate(Loader<FloatKind::kBf16>{v}, tokens, dim, p, n_q, acc);
      break;
  }
}

}  // namespace argus::codec_internal
