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
// Blocking: scores take 2 tokens x up to 4 heads per pass (each K vector is loaded and widened
// once for all heads of the block) and reduce the 8 dot products with one horizontal-add tree;
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
inline __m256 Reduce8(const __m256 x[8]) {
  __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
  __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Dot products of NH <= 4 heads with tokens t0 and t0+1 (or t0 alone when kTwo is false).
// Always inlined: it runs once per two tokens, and a call would spill the accumulators.
template <typename L, int NH, bool kTwo>
[[gnu::always_inline]] inline void ScoreBlock(const L& k, uint32_t t0, uint32_t tokens,
                                              uint32_t dim, const float* q, float* s) {
  static_assert(NH >= 1 && NH <= 4);
  // a[h] for token t0, a[4 + h] for token t0 + 1; unused lanes stay zero.
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
  const size_t row0 = size_t{t0} * dim, row1 = row0 + dim;
  uint32_t d = 0;
  // Two 8-channel steps per iteration (Load16 lets a codec widen 16 codes at once), then one.
  for (; d + 16 <= dim; d += 16) {
    __m256 k0[2], k1[2];
    k.Load16(row0 + d, k0[0], k0[1]);
    if (kTwo) k.Load16(row1 + d, k1[0], k1[1]);
    for (uint32_t half = 0; half < 2; ++half) {
      for (int h = 0; h < NH; ++h) {
        __m256 qv = _mm256_loadu_ps(q + Off(h, dim) + d + 8 * half);
        a[h] = _mm256_fmadd_ps(qv, k0[half], a[h]);
        if (kTwo) a[4 + h] = _mm256_fmadd_ps(qv, k1[half], a[4 + h]);
      }
    }
  }
  for (; d + 8 <= dim; d += 8) {
    __m256 k0 = k.Load8(row0 + d);
    __m256 k1 = kTwo ? k.Load8(row1 + d) : k0;
    for (int h = 0; h < NH; ++h) {
      __m256 qv = _mm256_loadu_ps(q + Off(h, dim) + d);
      a[h] = _mm256_fmadd_ps(qv, k0, a[h]);
      if (kTwo) a[4 + h] = _mm256_fmadd_ps(qv, k1, a[4 + h]);
    }
  }
  alignas(32) float dots[8];
  _mm256_store_ps(dots, Reduce8(a));
  for (int h = 0; h < NH; ++h) {
    const float* qh = q + Off(h, dim);
    float tail0 = 0, tail1 = 0;
    for (uint32_t e = d; e < dim; ++e) {
      tail0 += qh[e] * k.Load1(row0 + e);
      if (kTwo) tail1 += qh[e] * k.Load1(row1 + e);
    }
    s[Off(h, tokens) + t0] = Finish(k, dots[h] + tail0);
    if (kTwo) s[Off(h, tokens) + t0 + 1] = Finish(k, dots[4 + h] + tail1);
  }
}

template <typename L, int NH>
void ScoresHeads(const L& k, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  uint32_t t = 0;
  for (; t + 2 <= tokens; t += 2) ScoreBlock<L, NH, true>(k, t, tokens, dim, q, s);
  if (t < tokens) ScoreBlock<L, NH, false>(k, t, tokens, dim, q, s);
}

// s[i][t] = q_i . k_t for the tile behind `k`. q: [n_q, dim], s: [n_q, tokens].
template <typename L>
void Scores(const L& k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q, float* s) {
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4)
    ScoresHeads<L, 4>(k, tokens, dim, q + size_t{i} * dim, s + size_t{i} * tokens);
  const float* qi = q + size_t{i} * dim;
  float* si = s + size_t{i} * tokens;
  switch (n_q - i) {
    case 3:
      ScoresHeads<L, 3>(k, tokens, dim, qi, si);
      break;
    case 2:
      ScoresHeads<L, 2>(k, tokens, dim, qi, si);
      break;
    case 1:
      ScoresHeads<L, 1>(k, tokens, dim, qi, si);
      break;
    default:
      break;
  }
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
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4)
    AccumulateHeads<L, 4>(v, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
  const float* pi = p + size_t{i} * tokens;
  float* ai = acc + size_t{i} * dim;
  switch (n_q - i) {
    case 3:
      AccumulateHeads<L, 3>(v, tokens, dim, pi, ai);
      break;
    case 2:
      AccumulateHeads<L, 2>(v, tokens, dim, pi, ai);
      break;
    case 1:
      AccumulateHeads<L, 1>(v, tokens, dim, pi, ai);
      break;
    default:
      break;
  }
}

}  // namespace argus::codec_internal::row_avx2
