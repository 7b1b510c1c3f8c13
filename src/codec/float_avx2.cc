// AVX2 kernels of the float codecs. Register blocking: scores take 2 tokens x up to 4 heads
// per pass (each K vector is loaded and converted once for all heads of the block) and reduce
// the 8 dot products with one horizontal-add tree; accumulate keeps 4 heads x 16 channels of
// the output in registers while streaming the tokens.
#include <immintrin.h>

#include "codec/float_kernels.h"

namespace argus::codec_internal {
namespace {

template <FloatKind kKind>
inline __m256 Load8(const void* base, size_t i) {
  if constexpr (kKind == FloatKind::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (kKind == FloatKind::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <FloatKind kKind>
inline float Load1(const void* base, size_t i) {
  if constexpr (kKind == FloatKind::kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (kKind == FloatKind::kF16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
  } else {
    uint32_t bits = uint32_t{static_cast<const uint16_t*>(base)[i]} << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// Dot products of NH heads with tokens t0 and t0+1 (or t0 alone when kTwo is false).
template <FloatKind kKind, int NH, bool kTwo>
inline void ScoreBlock(const void* k, uint32_t t0, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  __m256 a0[NH], a1[NH];
  for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
  const size_t row0 = size_t{t0} * dim, row1 = row0 + dim;
  uint32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    __m256 k0 = Load8<kKind>(k, row0 + d);
    __m256 k1 = kTwo ? Load8<kKind>(k, row1 + d) : k0;
    for (int h = 0; h < NH; ++h) {
      __m256 qv = _mm256_loadu_ps(q + size_t{static_cast<uint32_t>(h)} * dim + d);
      a0[h] = _mm256_fmadd_ps(qv, k0, a0[h]);
      if (kTwo) a1[h] = _mm256_fmadd_ps(qv, k1, a1[h]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    const float* qh = q + size_t{static_cast<uint32_t>(h)} * dim;
    float tail0 = 0, tail1 = 0;
    for (uint32_t e = d; e < dim; ++e) {
      tail0 += qh[e] * Load1<kKind>(k, row0 + e);
      if (kTwo) tail1 += qh[e] * Load1<kKind>(k, row1 + e);
    }
    s[size_t{static_cast<uint32_t>(h)} * tokens + t0] = HorizontalSum(a0[h]) + tail0;
    if (kTwo) s[size_t{static_cast<uint32_t>(h)} * tokens + t0 + 1] = HorizontalSum(a1[h]) + tail1;
  }
}

template <FloatKind kKind, int NH>
void ScoresHeads(const void* k, uint32_t tokens, uint32_t dim, const float* q, float* s) {
  uint32_t t = 0;
  for (; t + 2 <= tokens; t += 2) ScoreBlock<kKind, NH, true>(k, t, tokens, dim, q, s);
  if (t < tokens) ScoreBlock<kKind, NH, false>(k, t, tokens, dim, q, s);
}

template <FloatKind kKind>
void Scores(const void* k, uint32_t tokens, uint32_t dim, const float* q, uint32_t n_q, float* s) {
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4) ScoresHeads<kKind, 4>(k, tokens, dim, q + size_t{i} * dim, s + size_t{i} * tokens);
  const float* qi = q + size_t{i} * dim;
  float* si = s + size_t{i} * tokens;
  switch (n_q - i) {
    case 3: ScoresHeads<kKind, 3>(k, tokens, dim, qi, si); break;
    case 2: ScoresHeads<kKind, 2>(k, tokens, dim, qi, si); break;
    case 1: ScoresHeads<kKind, 1>(k, tokens, dim, qi, si); break;
    default: break;
  }
}

// acc[h][d0 .. d0+16) += sum_t p[h][t] * v[t][d0 ..], for NH heads.
template <FloatKind kKind, int NH>
void AccumulateHeads(const void* v, uint32_t tokens, uint32_t dim, const float* p, float* acc) {
  uint32_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    __m256 a0[NH], a1[NH];
    for (int h = 0; h < NH; ++h) {
      a0[h] = _mm256_loadu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d);
      a1[h] = _mm256_loadu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d + 8);
    }
    for (uint32_t t = 0; t < tokens; ++t) {
      __m256 v0 = Load8<kKind>(v, size_t{t} * dim + d);
      __m256 v1 = Load8<kKind>(v, size_t{t} * dim + d + 8);
      for (int h = 0; h < NH; ++h) {
        __m256 w = _mm256_broadcast_ss(p + size_t{static_cast<uint32_t>(h)} * tokens + t);
        a0[h] = _mm256_fmadd_ps(w, v0, a0[h]);
        a1[h] = _mm256_fmadd_ps(w, v1, a1[h]);
      }
    }
    for (int h = 0; h < NH; ++h) {
      _mm256_storeu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d, a0[h]);
      _mm256_storeu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d + 8, a1[h]);
    }
  }
  for (; d + 8 <= dim; d += 8) {
    __m256 a0[NH];
    for (int h = 0; h < NH; ++h) a0[h] = _mm256_loadu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d);
    for (uint32_t t = 0; t < tokens; ++t) {
      __m256 v0 = Load8<kKind>(v, size_t{t} * dim + d);
      for (int h = 0; h < NH; ++h) {
        a0[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + size_t{static_cast<uint32_t>(h)} * tokens + t), v0, a0[h]);
      }
    }
    for (int h = 0; h < NH; ++h) _mm256_storeu_ps(acc + size_t{static_cast<uint32_t>(h)} * dim + d, a0[h]);
  }
  for (; d < dim; ++d) {
    for (int h = 0; h < NH; ++h) {
      float sum = acc[size_t{static_cast<uint32_t>(h)} * dim + d];
      for (uint32_t t = 0; t < tokens; ++t) {
        sum += p[size_t{static_cast<uint32_t>(h)} * tokens + t] * Load1<kKind>(v, size_t{t} * dim + d);
      }
      acc[size_t{static_cast<uint32_t>(h)} * dim + d] = sum;
    }
  }
}

template <FloatKind kKind>
void Accumulate(const void* v, uint32_t tokens, uint32_t dim, const float* p, uint32_t n_q, float* acc) {
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4) AccumulateHeads<kKind, 4>(v, tokens, dim, p + size_t{i} * tokens, acc + size_t{i} * dim);
  const float* pi = p + size_t{i} * tokens;
  float* ai = acc + size_t{i} * dim;
  switch (n_q - i) {
    case 3: AccumulateHeads<kKind, 3>(v, tokens, dim, pi, ai); break;
    case 2: AccumulateHeads<kKind, 2>(v, tokens, dim, pi, ai); break;
    case 1: AccumulateHeads<kKind, 1>(v, tokens, dim, pi, ai); break;
    default: break;
  }
}

}  // namespace

void ScoresFloatAvx2(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                     uint32_t n_q, float* s) {
  switch (kind) {
    case FloatKind::kF32: Scores<FloatKind::kF32>(k, tokens, dim, q, n_q, s); break;
    case FloatKind::kF16: Scores<FloatKind::kF16>(k, tokens, dim, q, n_q, s); break;
    case FloatKind::kBf16: Scores<FloatKind::kBf16>(k, tokens, dim, q, n_q, s); break;
  }
}

void AccumulateFloatAvx2(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                         const float* p, uint32_t n_q, float* acc) {
  switch (kind) {
    case FloatKind::kF32: Accumulate<FloatKind::kF32>(v, tokens, dim, p, n_q, acc); break;
    case FloatKind::kF16: Accumulate<FloatKind::kF16>(v, tokens, dim, p, n_q, acc); break;
    case FloatKind::kBf16: Accumulate<FloatKind::kBf16>(v, tokens, dim, p, n_q, acc); break;
  }
}

}  // namespace argus::codec_internal
