// AVX-512 kernels of the float codecs (f32, f16, bf16). On CPUs with two 512-bit FMA ports they
// have twice the FMA width of the AVX2 kernels, and 32 registers.
//
// scores: a block of 4 query heads and 16 tokens. The 16 lanes of an accumulator hold the 4 heads
// x 4 phases of the dimension: lane 4 h + g sums q_h[d] * k_t[d] over the d with d mod 4 = g.
// Each FMA then serves every head of the block: its K operand is 4 consecutive values of one key
// broadcast to all heads, its query operand a table built once per call. There is no horizontal
// reduction per dot product. Keys are widened to f32 into a 16-row buffer (the broadcasts read
// them from memory), and at the end of a block permutes sum the phases and transpose the results,
// so each head's 16 scores leave in one store. The block is 4 heads whatever the call's count
// (the last block padded): the block fixes the order of a head's sums, and a head's score must
// not depend on how many heads share its call (a prompt evaluated in two chunks gives the same
// logits as in one). Four serves GQA 4 and 8 without idle lanes.
// Rows of kLongRowDim values or more (head_dim 128 and up) take another design: the lanes hold 16
// channels of one head and one token, and a block's 16 tokens reduce at once (ReduceLanes16).
// Its reduction costs a share of the FMAs that falls with the row's length, while the 4-value
// broadcasts above cost a shuffle beside each FMA on CPUs whose 512-bit broadcasts from memory
// are not free (AMD Zen 4: at head_dim 128 with 4 heads the lanes-per-channel design takes about
// two thirds of the time in cache; at 64 with 7 heads the broadcasts, shared by two blocks, win).
// accumulate: NH heads x C vectors of 16 channels stay in registers while the tokens stream.

#include <type_traits>

#include "codec/float_kernels.h"
#include "codec/head_passes.h"
#include "core/avx512.h"

namespace argus::codec_internal {
namespace {

constexpr int kLanes = 16;
constexpr uint32_t kBlockTokens = 16;
constexpr int kHeads = 4, kPhases = kLanes / kHeads;  // the scores' block (see above)
constexpr uint32_t kLongRowDim = 128;                 // rows this long or longer: LongRowScores

// How far ahead the kernels hint tiles into the cache. The hardware prefetcher alone leaves tiles
// streamed from DRAM waiting on their loads; the hints are spread over the consuming loop (one
// block's lines over the block's FMAs, one row per token), because issued in bursts they stall
// the loop they serve.
constexpr uint32_t kScoresHintBlocks = 4;
constexpr uint32_t kAccumulateHintTokens = 32;

template <FloatKind kKind>
struct Loader {
  static constexpr size_t kValueBytes = kKind == FloatKind::kF32 ? 4 : 2;
  const void* base;
  const void* At(size_t i) const { return static_cast<const char*>(base) + i * kValueBytes; }
  // Values i .. i+16 (unmasked loads fold into the FMA that uses them).
  __m512 Load(size_t i) const {
    if constexpr (kKind == FloatKind::kF32) {
      return _mm512_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      return Widen(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i)));
    }
  }
  // Values i .. i+16 in the lanes of `mask`, 0 elsewhere (nothing outside the mask is read).
  __m512 Load(size_t i, __mmask16 mask) const {
    if constexpr (kKind == FloatKind::kF32) {
      return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
    } else {
      return Widen(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i));
    }
  }
  // 16 f16 or bf16 values as floats (exact).
  static __m512 Widen(__m256i h) {
    if constexpr (kKind == FloatKind::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
};

// The 4 floats at p, repeated over the 16 lanes.
inline __m512 Broadcast4(const float* p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }

// Index vectors for _mm512_permutex2var_ps (0..15: lanes of the first operand, 16..31: of the
// second), built at compile time.
struct LaneIndex {
  int v[kLanes];
  __m512i Load() const { return _mm512_loadu_si512(v); }
};

// Phase reduction, level l of 2: x holds tokens [0, 2^(l-1)) of a group, y the next as many. In
// the result, lane 4 h + k has token tau = k mod 2^l (bit l-1 says x or y) and the phases
// sigma' = k >> l (first) or (k >> l) + 4 / 2^l (second) summed so far.
constexpr LaneIndex ReduceIndex(int l, bool second) {
  LaneIndex index{};
  for (int j = 0; j < kLanes; ++j) {
    const int h = j / kPhases, k = j % kPhases;
    const int tau = k & ((1 << l) - 1), sigma = (k >> l) + (second ? kPhases >> l : 0);
    const int from_y = (tau >> (l - 1)) & 1;
    index.v[j] =
        from_y * kLanes + h * kPhases + ((sigma << (l - 1)) | (tau & ((1 << (l - 1)) - 1)));
  }
  return index;
}

// Transpose of a 4 x 4 matrix of 4-float elements held one row per vector: rows c and c + step
// swap their off-diagonal blocks of width `step` elements (`upper`: the new row c + step).
constexpr LaneIndex TransposeIndex(int step, bool upper) {
  LaneIndex index{};
  for (int j = 0; j < kLanes; ++j) {
    const int e = j / kPhases, tau = j % kPhases;
    if (!upper) {
      index.v[j] = (e & step) ? kLanes + (e - step) * kPhases + tau : e * kPhases + tau;
    } else {
      index.v[j] = (e & step) ? kLanes + e * kPhases + tau : (e + step) * kPhases + tau;
    }
  }
  return index;
}

// a[0 .. n) -> a[0 .. n/2): pairs summed over half their phases, their tokens interleaved.
template <int l>
inline void ReduceLevel(__m512* a, int n) {
  static constexpr LaneIndex kFirst = ReduceIndex(l, false), kSecond = ReduceIndex(l, true);
  const __m512i first = kFirst.Load(), second = kSecond.Load();
  for (int i = 0; i < n / 2; ++i) {
    a[i] = _mm512_add_ps(_mm512_permutex2var_ps(a[2 * i], first, a[2 * i + 1]),
                         _mm512_permutex2var_ps(a[2 * i], second, a[2 * i + 1]));
  }
}

template <int step>
inline void TransposeLevel(__m512* a) {
  static constexpr LaneIndex kLower = TransposeIndex(step, false),
                             kUpper = TransposeIndex(step, true);
  const __m512i lower = kLower.Load(), upper = kUpper.Load();
  for (int c = 0; c < kHeads; ++c) {
    if (c & step) continue;
    const __m512 x = a[c], y = a[c + step];
    a[c] = _mm512_permutex2var_ps(x, lower, y);
    a[c + step] = _mm512_permutex2var_ps(x, upper, y);
  }
}

// a[b], b < n (a multiple of 4): lane 4 h + g is the phase-g partial score of head h and token b.
// Afterwards a[c], c < n / 4: lane 4 h + tau is the score of head h and token 4 c + tau.
[[gnu::always_inline]] inline void ReducePhases(__m512* a, int n) {
  ReduceLevel<1>(a, n);
  ReduceLevel<2>(a, n / 2);
}

// a[c], c < 4: lane 4 h + tau is the score of head h and token 4 c + tau. Afterwards a[h]: lane t
// is the score of head h and token t.
[[gnu::always_inline]] inline void TransposeBlocks(__m512* a) {
  TransposeLevel<2>(a);
  TransposeLevel<1>(a);
}

// Keys t0 .. t0+16 as f32 rows of `stride` floats (0 past dim and past the tile).
template <typename L>
[[gnu::always_inline]] inline void WidenBlock(const L& k, uint32_t t0, uint32_t tokens,
                                              uint32_t dim, uint32_t stride, float* out) {
  if (stride == dim && t0 + kBlockTokens <= tokens) {  // the block's keys are one contiguous run
    const size_t first = size_t{t0} * dim;
    for (uint32_t i = 0; i < kBlockTokens * dim; i += kLanes)
      _mm512_store_ps(out + i, k.Load(first + i, __mmask16{0xffff}));
    return;
  }
  for (uint32_t b = 0; b < kBlockTokens; ++b) {
    for (uint32_t d = 0; d < stride; d += kLanes) {
      const __m512 x = t0 + b < tokens ? k.Load(size_t{t0 + b} * dim + d, FirstLanes(dim - d))
                                       : _mm512_setzero_ps();
      _mm512_store_ps(out + b * stride + d, x);
    }
  }
}

// Query table of n_heads <= 4 heads: table[ph][4 h + g] = q[h][4 ph + g], 0 past dim and for the
// missing heads, for every phase of the dim's 16-float vectors. Each vector of the 4 heads is a
// 4 x 4 matrix of 4-float blocks to transpose (the copy it replaced, a small memcpy per head and
// phase, took 12% of the scores kernel's time at 256-token tiles).
inline void FillTable(const float* q, uint32_t n_heads, uint32_t dim, float* table) {
  for (uint32_t d = 0; d < dim; d += kLanes) {
    __m512 x[kHeads];
    for (uint32_t h = 0; h < uint32_t{kHeads}; ++h)
      x[h] = h < n_heads ? _mm512_maskz_loadu_ps(FirstLanes(dim - d), q + size_t{h} * dim + d)
                         : _mm512_setzero_ps();
    const __m512 low01 = _mm512_shuffle_f32x4(x[0], x[1], 0x44),  // x0 b0 b1, x1 b0 b1
        low23 = _mm512_shuffle_f32x4(x[2], x[3], 0x44),           // x2 b0 b1, x3 b0 b1
        high01 = _mm512_shuffle_f32x4(x[0], x[1], 0xee),          // x0 b2 b3, x1 b2 b3
        high23 = _mm512_shuffle_f32x4(x[2], x[3], 0xee);          // x2 b2 b3, x3 b2 b3
    float* out = table + size_t{d / kPhases} * kLanes;
    _mm512_store_ps(out, _mm512_shuffle_f32x4(low01, low23, 0x88));  // block 0 of x0 .. x3
    _mm512_store_ps(out + kLanes, _mm512_shuffle_f32x4(low01, low23, 0xdd));
    _mm512_store_ps(out + 2 * kLanes, _mm512_shuffle_f32x4(high01, high23, 0x88));
    _mm512_store_ps(out + 3 * kLanes, _mm512_shuffle_f32x4(high01, high23, 0xdd));
  }
}

// Scores of NB blocks of 4 heads (n_heads <= 4 NB; q: [n_heads, dim], s: rows of `tokens`). The
// blocks share each widened key and each broadcast: with two, a 16-token block runs as two
// passes of 8 tokens (16 accumulators). A head's sums are the same whatever NB: the phase
// reduction pairs the same tokens in the same order.
template <typename L, int NB>
void ScoresBlocks(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_heads,
                  float* s) {
  constexpr uint32_t kPass = kBlockTokens / NB;                  // tokens per pass
  const uint32_t stride = (dim + kLanes - 1) / kLanes * kLanes;  // a widened key row, 0-padded
  const uint32_t n_phases = (dim + kPhases - 1) / kPhases;
  alignas(64) float tables[NB][kFloatKernelMaxDim * kHeads];
  for (int i = 0; i < NB; ++i) {
    const uint32_t first = uint32_t{kHeads} * i, left = n_heads > first ? n_heads - first : 0;
    FillTable(q + size_t{first} * dim, left < uint32_t{kHeads} ? left : kHeads, dim, tables[i]);
  }
  alignas(64) float keys[kBlockTokens * kFloatKernelMaxDim];
  for (uint32_t t0 = 0; t0 < tokens; t0 += kBlockTokens) {
    WidenBlock(k, t0, tokens, dim, stride, keys);
    HintStream hints = HintStream::Rows(k.At(0), size_t{dim} * L::kValueBytes,
                                        t0 + kScoresHintBlocks * kBlockTokens, kBlockTokens, tokens,
                                        NB * n_phases);
    __m512 reduced[NB][kHeads];  // [block][c]: lane 4 h + tau is token 4 c + tau
    for (uint32_t pass = 0; pass < uint32_t{NB}; ++pass) {
      const float* rows = keys + pass * kPass * stride;
      __m512 a[NB][kPass];
      for (int i = 0; i < NB; ++i)
        for (uint32_t b = 0; b < kPass; ++b) a[i][b] = _mm512_setzero_ps();
      for (uint32_t ph = 0; ph < n_phases; ++ph) {
        __m512 qv[NB];
        for (int i = 0; i < NB; ++i) qv[i] = _mm512_load_ps(tables[i] + ph * kLanes);
        hints.Step();
        for (uint32_t b = 0; b < kPass; ++b) {
          const __m512 kv = Broadcast4(rows + b * stride + ph * kPhases);
          for (int i = 0; i < NB; ++i) a[i][b] = _mm512_fmadd_ps(qv[i], kv, a[i][b]);
        }
      }
      for (int i = 0; i < NB; ++i) {
        ReducePhases(a[i], kPass);
        for (uint32_t c = 0; c < kPass / kPhases; ++c)
          reduced[i][pass * (kPass / kPhases) + c] = a[i][c];
      }
    }
    const __mmask16 mask = FirstLanes(tokens - t0);
    for (int i = 0; i < NB; ++i) {
      TransposeBlocks(reduced[i]);
      for (uint32_t h = 0; h < uint32_t{kHeads} && kHeads * i + h < n_heads; ++h)
        _mm512_mask_storeu_ps(s + size_t{kHeads * i + h} * tokens + t0, mask, reduced[i][h]);
    }
  }
}

// acc[h][d0 .. d0 + 16 C) += sum_t p[h][t] v[t][d0 ..] for NH heads; the last vector's channels
// under last_mask.
template <typename L, int NH, int C>
void AccumulateVectors(const L& v, uint32_t tokens, uint32_t dim, const float* p, float* acc,
                       uint32_t d0, __mmask16 last_mask) {
  // Every loop over heads and vectors is unrolled by pragma: without it GCC 12 keeps `a` in
  // memory as well and stores all NH x C accumulators at every token, more stores than FMAs.
  __mmask16 mask[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) mask[c] = c == C - 1 ? last_mask : __mmask16{0xffff};
  __m512 a[NH][C];
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      a[h][c] = _mm512_maskz_loadu_ps(
          mask[c], acc + size_t{static_cast<uint32_t>(h)} * dim + d0 + kLanes * c);
  // The first pass hints one whole row ahead per token, so later passes find their lines in
  // cache (each pass hinting only its own lines is slower from DRAM).
  const size_t hint_bytes = d0 == 0 ? size_t{dim} * L::kValueBytes : 0;
  for (uint32_t t = 0; t < tokens; ++t) {
    if (t + kAccumulateHintTokens < tokens) {
      const char* row = static_cast<const char*>(v.At(size_t{t + kAccumulateHintTokens} * dim));
      for (size_t i = 0; i < hint_bytes; i += 64) _mm_prefetch(row + i, _MM_HINT_T0);
    }
    __m512 x[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) x[c] = v.Load(size_t{t} * dim + d0 + kLanes * c, mask[c]);
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const __m512 w = _mm512_set1_ps(p[size_t{static_cast<uint32_t>(h)} * tokens + t]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[h][c] = _mm512_fmadd_ps(w, x[c], a[h][c]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      _mm512_mask_storeu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d0 + kLanes * c, mask[c],
                            a[h][c]);
}

// The largest power of two of vectors that NH heads' accumulators may hold per pass: NH x C
// accumulators and C widened vectors fill at most 24 of the 32 registers.
template <int NH>
constexpr int kMaxVectors = NH <= 2   ? 8
                            : NH <= 4 ? 4
                                      : 2;

// The dim's vectors in passes of kMaxVectors<NH>, then the rest as 4, 2, 1: each pass streams
// every token again, so passes of one vector where one pass could take several cost dearly.
// Passes stream whole tiles: blocking the tokens so a block's rows stay in L1 across the passes
// helps at head_dim 64 with 7 heads but loses at 128 with 4.
template <typename L, int NH>
void AccumulateHeads(const L& v, uint32_t tokens, uint32_t dim, const float* p, float* acc) {
  constexpr int kMax = kMaxVectors<NH>;
  const uint32_t n_vectors = (dim + kLanes - 1) / kLanes;
  const __mmask16 last = FirstLanes(dim - (n_vectors - 1) * kLanes);
  uint32_t i = 0;
  auto pass = [&]<int C>() {
    AccumulateVectors<L, NH, C>(v, tokens, dim, p, acc, i * kLanes,
                                i + C == n_vectors ? last : __mmask16{0xffff});
    i += C;
  };
  while (n_vectors - i >= uint32_t{kMax}) pass.template operator()<kMax>();
  if constexpr (kMax > 4)
    if (n_vectors - i >= 4) pass.template operator()<4>();
  if constexpr (kMax > 2)
    if (n_vectors - i >= 2) pass.template operator()<2>();
  if constexpr (kMax > 1)
    if (n_vectors - i >= 1) pass.template operator()<1>();
}

// Scores of long rows (see the file comment) for NH <= 4 heads: T tokens at a time hold T x NH
// accumulators, each key vector widened once for every head; a block's 16 dot-product vectors per
// head then reduce together into one vector of 16 scores. Lane j of an accumulator sums the
// channels d = j mod 16 in order (the last vector masked), and ReduceLanes16 adds the lanes by
// one fixed tree, so a head's score has the same bits whatever NH, T or its place.
template <typename L, int NH>
void LongRowScores(const L& k, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  constexpr uint32_t T = NH >= 3 ? 4 : 8;
  static_assert(kBlockTokens % T == 0);
  const uint32_t n_vectors = (dim + kLanes - 1) / kLanes;
  const __mmask16 last = FirstLanes(dim - (n_vectors - 1) * kLanes);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kBlockTokens) {
    const uint32_t n = tokens - t0 < kBlockTokens ? tokens - t0 : kBlockTokens;
    __m512 dots[NH][kBlockTokens];
    for (uint32_t b = 0; b < n; b += T) {
      __m512 a[T][NH];
      for (auto& row : a)
        for (auto& v : row) v = _mm512_setzero_ps();
      // Unmasked loads where the vector is whole: a masked load does not fold into the FMA.
      auto step = [&](uint32_t i, auto masked) {
        __m512 kv[T];
        for (uint32_t t = 0; t < T; ++t) {
          const size_t at = size_t{t0 + b + t} * dim + i * kLanes;
          if (b + t >= n) {
            kv[t] = _mm512_setzero_ps();
          } else if constexpr (decltype(masked)::value) {
            kv[t] = k.Load(at, last);
          } else {
            kv[t] = k.Load(at);
          }
        }
        for (int h = 0; h < NH; ++h) {
          const float* qh = q + size_t{static_cast<uint32_t>(h)} * dim + i * kLanes;
          __m512 qv;
          if constexpr (decltype(masked)::value) {
            qv = _mm512_maskz_loadu_ps(last, qh);
          } else {
            qv = _mm512_loadu_ps(qh);
          }
          for (uint32_t t = 0; t < T; ++t) a[t][h] = _mm512_fmadd_ps(qv, kv[t], a[t][h]);
        }
      };
      for (uint32_t i = 0; i + 1 < n_vectors; ++i) step(i, std::false_type{});
      if (last == __mmask16{0xffff}) {
        step(n_vectors - 1, std::false_type{});
      } else {
        step(n_vectors - 1, std::true_type{});
      }
      for (uint32_t t = 0; t < T; ++t)
        for (int h = 0; h < NH; ++h) dots[h][b + t] = a[t][h];
    }
    for (int h = 0; h < NH; ++h) {
      _mm512_mask_storeu_ps(s + size_t{static_cast<uint32_t>(h)} * tokens + t0, FirstLanes(n),
                            ReduceLanes16<false>(dots[h], n));
    }
  }
}

// Heads in passes of 4, then the rest.
template <typename L>
void LongRowScores(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q,
                   float* s) {
  ByHeadPasses<4>(n_q, [&](auto heads, uint32_t i) {
    LongRowScores<L, decltype(heads)::kCount>(k, tokens, dim, q + size_t{i} * dim,
                                              s + size_t{i} * tokens);
  });
}

// Heads in blocks of 4, the last padded (see the file comment), two blocks at a time; long rows
// as LongRowScores.
template <typename L>
void Scores(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q, float* s) {
  if (dim >= kLongRowDim) return LongRowScores(k, tokens, dim, q, n_q, s);
  for (uint32_t i = 0; i < n_q; i += 2 * kHeads) {
    const uint32_t n = n_q - i;
    if (n > uint32_t{kHeads}) {
      ScoresBlocks<L, 2>(k, tokens, dim, q + size_t{i} * dim, n < 2 * kHeads ? n : 2 * kHeads,
                         s + size_t{i} * tokens);
    } else {
      ScoresBlocks<L, 1>(k, tokens, dim, q + size_t{i} * dim, n, s + size_t{i} * tokens);
    }
  }
}

// Heads in passes of 8, then the rest in one pass: each token's widened values serve as many
// heads as the registers allow. A head's sums do not depend on its pass (each lane adds the
// tokens in order).
template <typename L>
void Accumulate(const L& v, uint32_t tokens, uint32_t dim, const float* p, uint32_t n_q,
                float* acc) {
  ByHeadPasses<8>(n_q, [&](auto heads, uint32_t i) {
    AccumulateHeads<L, decltype(heads)::kCount>(v, tokens, dim, p + size_t{i} * tokens,
                                                acc + size_t{i} * dim);
  });
}

// fn(loader) with the loader of `kind`.
template <typename Fn>
void WithLoader(FloatKind kind, const void* base, Fn&& fn) {
  switch (kind) {
    case FloatKind::kF32:
      return fn(Loader<FloatKind::kF32>{base});
    case FloatKind::kF16:
      return fn(Loader<FloatKind::kF16>{base});
    case FloatKind::kBf16:
      return fn(Loader<FloatKind::kBf16>{base});
  }
}

}  // namespace

void ScoresFloatAvx512(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                       uint32_t n_q, float* s) {
  WithLoader(kind, k, [&](const auto& loader) { Scores(loader, tokens, dim, q, n_q, s); });
}

void AccumulateFloatAvx512(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                           const float* p, uint32_t n_q, float* acc) {
  WithLoader(kind, v, [&](const auto& loader) { Accumulate(loader, tokens, dim, p, n_q, acc); });
}

}  // namespace argus::codec_internal
