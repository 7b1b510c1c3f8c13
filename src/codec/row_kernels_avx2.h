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
// Blocking: scores take 3 tokens x up to 4 heads per pass (each K vector is loaded and widened
// once for all heads of the block) and reduce the dot products with horizontal-add trees;
// accumulate keeps 4 heads x 16 channels of the output in registers while streaming the tokens.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace argus::codec_internal::row_avx2 {

inline size_t Off(int h, uint32_t stride) { return size_t{static_cast<uint32_t>(h)} * stride; }

// A finished dot product of codes, scaled when the loader says so.
template <typename L>
inline float Finish(const L& loader, float dot) {
  if constexpr (L::kScaled) {
    return dot * loader.scale();
  } else {
    return dot;
  }
}

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

// Dot products of NH <= 4 heads with the T <= 3 tokens t0 .. t0+T-1. Always inlined: it runs
// once per three tokens, and a call would spill the accumulators.
template <typename L, int NH, int T>
[[gnu::always_inline]] inline void ScoreBlock(const L& k, uint32_t t0, uint32_t tokens,
                                              uint32_t dim, const float* q, float* s) {
  static_assert(NH >= 1 && NH <= 4 && T >= 1 && T <= 3);
  // a[t][h]: token t0 + t, head h. With NH = 4 and T = 3, twelve accumulators, three K vectors
  // and one query vector fill the sixteen registers: each K vector is widened once for four
  // heads and each query vector loaded once for three tokens (7 loads per 12 FMAs, against 6
  // per 8 with two tokens; on this noisy machine the two measured the same).
  __m256 a[T][NH];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < NH; ++h) a[t][h] = _mm256_setzero_ps();
  size_t row[T];
  for (int t = 0; t < T; ++t) row[t] = size_t{t0 + t} * dim;
  uint32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    __m256 kv[T];
    for (int t = 0; t < T; ++t) kv[t] = k.Load8(row[t] + d);
    for (int h = 0; h < NH; ++h) {
      __m256 qv = _mm256_loadu_ps(q + Off(h, dim) + d);
      for (int t = 0; t < T; ++t) a[t][h] = _mm256_fmadd_ps(qv, kv[t], a[t][h]);
    }
  }
  // Lane 4 * t + h of dots[] is token t0 + t, head h.
  auto at = [&](int t, int h) { return t < T && h < NH ? a[t][h] : _mm256_setzero_ps(); };
  alignas(32) float dots[16];
  _mm256_store_ps(dots, Reduce8(at(0, 0), at(0, 1), at(0, 2), at(0, 3), at(1, 0), at(1, 1),
                                at(1, 2), at(1, 3)));
  if (T == 3) {
    __m256 z = _mm256_setzero_ps();
    _mm256_store_ps(dots + 8, Reduce8(at(2, 0), at(2, 1), at(2, 2), at(2, 3), z, z, z, z));
  }
  for (int h = 0; h < NH; ++h) {
    const float* qh = q + Off(h, dim);
    for (int t = 0; t < T; ++t) {
      float tail = 0;
      for (uint32_t e = d; e < dim; ++e) tail += qh[e] * k.Load1(row[t] + e);
      s[Off(h, tokens) + t0 + t] = Finish(k, dots[4 * t + h] + tail);
    }
  }
}

template <typename L, int NH>
void ScoresHeads(const L& k, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  uint32_t t = 0;
  for (; t + 3 <= tokens; t += 3) ScoreBlock<L, NH, 3>(k, t, tokens, dim, q, s);
  if (tokens - t == 2) ScoreBlock<L, NH, 2>(k, t, tokens, dim, q, s);
  if (tokens - t == 1) ScoreBlock<L, NH, 1>(k, t, tokens, dim, q, s);
}

// Calls block.template operator()<NH>(i) for the heads [i, i + NH) of n_q: blocks of 4, then
// the remainder.
template <typename Block>
inline void ForHeadBlocks(uint32_t n_q, Block&& block) {
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4) block.template operator()<4>(i);
  switch (n_q - i) {
    case 3:
      block.template operator()<3>(i);
      break;
    case 2:
      block.template operator()<2>(i);
      break;
    case 1:
      block.template operator()<1>(i);
      break;
    default:
      break;
  }
}

// s[i][t] = q_i . k_t for the tile behind `k`. q: [n_q, dim], s: [n_q, tokens].
template <typename L>
void Scores(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q, float* s) {
  ForHeadBlocks(n_q, [&]<int NH>(uint32_t i) {
    ScoresHeads<L, NH>(k, tokens, dim, q + size_t{i} * dim, s + size_t{i} * tokens);
  });
}

// acc[h][d0 .. d0+16) += sum_t p[h][t] * v[t][d0 ..], for NH heads.
template <typename L, int NH>
void AccumulateHeads(const L& v, uint32_t tokens, uint32_t dim, const float* p, float* acc) {
  uint32_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    __m256 a0[NH], a1[NH];
    for (int h = 0; h < NH; ++h) {
      a0[h] = StartAcc<L>(acc + Off(h, dim) + d);
      a1[h] = StartAcc<L>(acc + Off(h, dim) + d + 8);
    }
    for (uint32_t t = 0; t < tokens; ++t) {
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
    for (uint32_t t = 0; t < tokens; ++t) {
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
      for (uint32_t t = 0; t < tokens; ++t)
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
  ForHeadBlocks(n_q, [&]<int NH>(uint32_t i) {
    AccumulateHeads<L, NH>(v, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
  });
}

}  // namespace argus::codec_internal::row_avx2
