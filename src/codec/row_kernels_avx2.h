// Register-blocked AVX2 kernels shared by the codecs whose tile is a row-major [tokens, dim]
// array of per-value codes that widen to 8 floats at a time (f32, f16, bf16, fp8). Include only
// from *_avx2.cc files (see codec_internal.h on why kernel files use no std:: templates).
//
// A codec supplies a Loader, a small value type with
//   void Load16(size_t i, __m256& lo, __m256& hi) const;  // values i .. i+16, row-major index
//   __m256 Load8(size_t i) const;   // values i .. i+8
//   float Load1(size_t i) const;    // value i
//   static constexpr bool kScaled;  // true: every value is further multiplied by scale(),
//   float scale() const;            // applied once per dot product and per output block
// With kScaled true scores are scale * (q . codes) and accumulate adds scale * (p . codes) to
// acc, so the scale costs nothing in the inner loops.
//
// Blocking: scores take up to 4 heads and 3 tokens per pass (4 with 1 or 2 heads; each K vector
// is loaded and widened once for all heads of the block), reduce each token's dot products with
// one horizontal-add tree and transpose 8 tokens' results into one store per head; accumulate
// keeps 4 heads x 16 channels of the output in registers while streaming a block of 32 tokens.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/avx2_reduce.h"

namespace argus::codec_internal::row_avx2 {

inline size_t Off(int h, uint32_t stride) { return size_t{static_cast<uint32_t>(h)} * stride; }

// Accumulator registers start from acc itself (unscaled) or from zero (scaled: acc += scale *
// sum is applied when they are stored).
template <typename L>
inline __m256 StartAcc(const float* acc) {
  if constexpr (L::kScaled) {
    return _mm256_setzero_ps();
  } else {
    return _mm256_loadu_ps(acc);
  }
}

template <typename L>
inline void StoreAcc(const L& loader, float* acc, __m256 sum) {
  if constexpr (L::kScaled) {
    _mm256_storeu_ps(acc,
                     _mm256_fmadd_ps(_mm256_set1_ps(loader.scale()), sum, _mm256_loadu_ps(acc)));
  } else {
    _mm256_storeu_ps(acc, sum);
  }
}

// The sums of eight vectors as the eight lanes of one: [sum x[0], ..., sum x[7]]. One
// horizontal-add tree for eight dot products instead of eight separate reductions.
// Takes values, not an array: an array whose address is taken can keep the accumulators in
// memory through the whole loop that fills them.
inline __m256 Reduce8(__m256 x0, __m256 x1, __m256 x2, __m256 x3, __m256 x4, __m256 x5, __m256 x6,
                      __m256 x7) {
  __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(x0, x1), _mm256_hadd_ps(x2, x3));
  __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(x4, x5), _mm256_hadd_ps(x6, x7));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// out[t] lane h += the dot product of head h with token t over the channels [d, dim).
template <typename L>
[[gnu::noinline]] void AddTails(const L& k, size_t row0, uint32_t dim, uint32_t d,
                                const float* const* q, int n_heads, int n_tokens, __m256* out) {
  for (int t = 0; t < n_tokens; ++t) {
    alignas(32) float tail[8] = {};
    for (int h = 0; h < n_heads; ++h) {
      for (uint32_t e = d; e < dim; ++e) tail[h] += q[h][e] * k.Load1(row0 + Off(t, dim) + e);
    }
    out[t] = _mm256_add_ps(out[t], _mm256_load_ps(tail));
  }
}

// The dot products of NH <= 4 heads with the T tokens from row0: out[t] lane h is head h's
// (zero for h >= NH). Lane j of an accumulator sums the channels d = j mod 8 in order and
// Reduce8 adds the lanes by one fixed tree, so a head's dot product has the same bits whatever
// T, NH or the head's place in the block (a prompt evaluated in two chunks gives the logits of
// one). Always inlined: a call would spill the accumulators.
template <typename L, int NH, int T>
[[gnu::always_inline]] inline void DotBlock(const L& k, size_t row0, uint32_t dim,
                                            const float* const q[NH], __m256* out) {
  static_assert(NH >= 1 && NH <= 4 && T * NH <= 12);
  __m256 a[T][NH];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < NH; ++h) a[t][h] = _mm256_setzero_ps();
  uint32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    __m256 kv[T];
    for (int t = 0; t < T; ++t) kv[t] = k.Load8(row0 + Off(t, dim) + d);
    for (int h = 0; h < NH; ++h) {
      const __m256 qv = _mm256_loadu_ps(q[h] + d);
      for (int t = 0; t < T; ++t) a[t][h] = _mm256_fmadd_ps(qv, kv[t], a[t][h]);
    }
  }
  const __m256 z = _mm256_setzero_ps();
  for (int t = 0; t < T; ++t) {
    auto at = [&](int h) { return h < NH ? a[t][h] : z; };
    out[t] = Reduce8(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
  }
  if (d < dim) AddTails(k, row0, dim, d, q, NH, T, out);
}

// Scores of NH <= 4 heads, 8 tokens at a time: T tokens per DotBlock (with 4 heads, 3 tokens:
// twelve accumulators and three keys fill the registers, each key widened once for all heads and
// each query vector loaded once for three tokens), then one transpose turns the 8 tokens' head
// vectors into a vector of 8 scores per head, stored at once, instead of a scalar store per dot
// product (which costs most where dot products are short, at head_dim 64).
template <typename L, int NH>
void ScoresHeads(const L& k, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  constexpr int T = NH >= 3 ? 3 : 4;
  // Each head's own pointer: left to the loop, the addresses form a chain of adds longer than
  // the FMAs'.
  const float* qh[NH];
  for (int h = 0; h < NH; ++h) qh[h] = q + Off(h, dim);
  for (uint32_t t0 = 0; t0 < tokens; t0 += 8) {
    const uint32_t n = tokens - t0 < 8 ? tokens - t0 : 8;
    const size_t row0 = size_t{t0} * dim;
    __m256 dots[8];
    if (n == 8) {
      int i = 0;
      for (; i + T <= 8; i += T) DotBlock<L, NH, T>(k, row0 + Off(i, dim), dim, qh, dots + i);
      if constexpr (8 % T != 0) DotBlock<L, NH, 8 % T>(k, row0 + Off(i, dim), dim, qh, dots + i);
    } else {
      for (uint32_t i = 0; i < 8; ++i) {
        dots[i] = _mm256_setzero_ps();
        if (i < n) DotBlock<L, NH, 1>(k, row0 + size_t{i} * dim, dim, qh, dots + i);
      }
    }
    avx2::Transpose8(dots);
    for (int h = 0; h < NH; ++h) {
      __m256 out = dots[h];
      if constexpr (L::kScaled) out = _mm256_mul_ps(out, _mm256_set1_ps(k.scale()));
      avx2::StoreLanes(s + Off(h, tokens) + t0, out, n);
    }
  }
}

// Calls fn.template operator()<n>() for a runtime n in [1, kMax].
template <int kMax, typename Fn>
inline void WithCount(uint32_t n, Fn&& fn) {
  if constexpr (kMax >= 1) {
    if (n == kMax) return fn.template operator()<kMax>();
    WithCount<kMax - 1>(n, fn);
  }
}

// Calls block.template operator()<NH>(i) for the heads [i, i + NH) of n_q: blocks of 4, then
// the remainder.
template <typename Block>
inline void ForHeadBlocks(uint32_t n_q, Block&& block) {
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4) block.template operator()<4>(i);
  if (i < n_q) WithCount<3>(n_q - i, [&]<int NH>() { block.template operator()<NH>(i); });
}

// s[i][t] = q_i . k_t for the tile behind `k`. q: [n_q, dim], s: [n_q, tokens].
template <typename L>
void Scores(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q, float* s) {
  ForHeadBlocks(n_q, [&]<int NH>(uint32_t i) {
    ScoresHeads<L, NH>(k, tokens, dim, q + size_t{i} * dim, s + size_t{i} * tokens);
  });
}

// acc[h] += sum_t p[h][t] * v[t] over the tokens [t0, t1), for NH heads (p's rows `tokens` apart).
template <typename L, int NH>
void AccumulateHeads(const L& v, uint32_t t0, uint32_t t1, uint32_t tokens, uint32_t dim,
                     const float* p, float* acc) {
  uint32_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    __m256 a0[NH], a1[NH];
    for (int h = 0; h < NH; ++h) {
      a0[h] = StartAcc<L>(acc + Off(h, dim) + d);
      a1[h] = StartAcc<L>(acc + Off(h, dim) + d + 8);
    }
    for (uint32_t t = t0; t < t1; ++t) {
      __m256 v0, v1;
      v.Load16(size_t{t} * dim + d, v0, v1);
      for (int h = 0; h < NH; ++h) {
        __m256 w = _mm256_broadcast_ss(p + Off(h, tokens) + t);
        a0[h] = _mm256_fmadd_ps(w, v0, a0[h]);
        a1[h] = _mm256_fmadd_ps(w, v1, a1[h]);
      }
    }
    for (int h = 0; h < NH; ++h) {
      StoreAcc(v, acc + Off(h, dim) + d, a0[h]);
      StoreAcc(v, acc + Off(h, dim) + d + 8, a1[h]);
    }
  }
  for (; d + 8 <= dim; d += 8) {
    __m256 a0[NH];
    for (int h = 0; h < NH; ++h) a0[h] = StartAcc<L>(acc + Off(h, dim) + d);
    for (uint32_t t = t0; t < t1; ++t) {
      __m256 v0 = v.Load8(size_t{t} * dim + d);
      for (int h = 0; h < NH; ++h) {
        a0[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + Off(h, tokens) + t), v0, a0[h]);
      }
    }
    for (int h = 0; h < NH; ++h) StoreAcc(v, acc + Off(h, dim) + d, a0[h]);
  }
  for (; d < dim; ++d) {
    for (int h = 0; h < NH; ++h) {
      float sum = L::kScaled ? 0.0f : acc[Off(h, dim) + d];
      for (uint32_t t = t0; t < t1; ++t)
        sum += p[Off(h, tokens) + t] * v.Load1(size_t{t} * dim + d);
      if constexpr (L::kScaled) {
        acc[Off(h, dim) + d] += v.scale() * sum;
      } else {
        acc[Off(h, dim) + d] = sum;
      }
    }
  }
}

// acc[i] += sum_t p[i][t] * v_t for the tile behind `v`. p: [n_q, tokens], acc: [n_q, dim].
template <typename L>
void Accumulate(const L& v, uint32_t tokens, uint32_t dim, const float* p, uint32_t n_q,
                float* acc) {
  // Blocks of 32 tokens, so that each pass over 16 channels finds the block's rows in L1 (blocks
  // of 16 or 64 are no better). A scaled loader takes the tile in one block: its scale is
  // applied once per sum.
  const uint32_t block = L::kScaled ? tokens : 32;
  for (uint32_t t0 = 0; t0 < tokens; t0 += block) {
    const uint32_t t1 = tokens - t0 < block ? tokens : t0 + block;
    ForHeadBlocks(n_q, [&]<int NH>(uint32_t i) {
      AccumulateHeads<L, NH>(v, t0, t1, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
    });
  }
}

}  // namespace argus::codec_internal::row_avx2
