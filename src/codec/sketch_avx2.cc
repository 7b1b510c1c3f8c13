// AVX2 kernels of the sketches. Each handles the heads of a group 4 at a time (ByHeadGroups),
// so every sign byte or projected key is loaded once and meets 4 heads from registers.
//
// int1: a token's sign byte for 8 channels becomes 8 floats of +-1 and is applied with an FMA
// (q * +-1 is exact, so the only rounding is in the float sums). 2 tokens x 4 heads per pass
// (8 independent sums) and one horizontal reduction per head and token pair.
//
// jl: the projection R x flips the sign bits of x widened to double (exact) and sums in double
// in the scalar path's order, so keys encode to the same bytes on both paths; the scores widen
// each token's r fp16 values to double 4 at a time and sum in double (the order differs from
// the scalar path's, which changes only the last bits of a double).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace argus::codec_internal {
namespace {

// Calls kernel.operator()<NH>(first_head) for the n_q heads in groups of at most 4.
template <typename Kernel>
inline void ByHeadGroups(uint32_t n_q, const Kernel& kernel) {
  uint32_t i = 0;
  for (; i + 4 <= n_q; i += 4) kernel.template operator()<4>(i);
  switch (n_q - i) {
    case 3:
      kernel.template operator()<3>(i);
      break;
    case 2:
      kernel.template operator()<2>(i);
      break;
    case 1:
      kernel.template operator()<1>(i);
      break;
    default:
      break;
  }
}

inline size_t Off(int h, uint32_t stride) { return size_t{static_cast<uint32_t>(h)} * stride; }

// Lane l holds -1.0f when bit l of `byte` is set, else +1.0f (bit l shifted to the sign bit).
inline __m256 Signs(uint8_t byte) {
  const __m256i to_top = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  __m256i bits = _mm256_sllv_epi32(_mm256_set1_epi8(static_cast<char>(byte)), to_top);
  return _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_castsi256_ps(_mm256_and_si256(bits, sign)));
}

// Lane l holds the double sign bit when bit (l + first) of `byte` is set; first is 0 or 4.
inline __m256d SignBits4(uint8_t byte, int first) {
  const __m256i to_top =
      first == 0 ? _mm256_setr_epi64x(63, 62, 61, 60) : _mm256_setr_epi64x(59, 58, 57, 56);
  const __m256i sign = _mm256_set1_epi64x(static_cast<long long>(0x8000000000000000ull));
  __m256i bits = _mm256_sllv_epi64(_mm256_set1_epi8(static_cast<char>(byte)), to_top);
  return _mm256_castsi256_pd(_mm256_and_si256(bits, sign));
}

// {sum of a0's lanes, ..., sum of a3's lanes}.
inline __m128 Sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

inline __m256d Sum4(__m256d a0, __m256d a1, __m256d a2, __m256d a3) {
  __m256d h01 = _mm256_hadd_pd(a0, a1), h23 = _mm256_hadd_pd(a2, a3);
  return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20),
                       _mm256_permute2f128_pd(h01, h23, 0x31));
}

inline bool Bit(const uint8_t* bits, uint32_t d) { return (bits[d / 8] >> (d % 8)) & 1u; }

// int1 scores of NH heads (q: [NH, dim], s: [NH, tokens]) with tokens t0 and t0 + 1 (or t0
// alone when kTwo is false).
template <int NH, bool kTwo>
inline void Int1Block(const std::byte* tile, uint32_t t0, uint32_t tokens, uint32_t dim,
                      const float* q, float* s) {
  const size_t row_bytes = (dim + 7) / 8;
  const uint8_t* rows[2];
  rows[0] = reinterpret_cast<const uint8_t*>(tile) + 2 * size_t{tokens} + t0 * row_bytes;
  rows[1] = rows[0] + row_bytes;
  __m256 a[2][4];
  for (int h = 0; h < 4; ++h) a[0][h] = a[1][h] = _mm256_setzero_ps();
  const uint32_t full = dim / 8;
  for (uint32_t c = 0; c < full; ++c) {
    const __m256 m0 = Signs(rows[0][c]);
    const __m256 m1 = kTwo ? Signs(rows[1][c]) : m0;
    for (int h = 0; h < NH; ++h) {
      const __m256 qv = _mm256_loadu_ps(q + Off(h, dim) + 8 * c);
      a[0][h] = _mm256_fmadd_ps(qv, m0, a[0][h]);
      if (kTwo) a[1][h] = _mm256_fmadd_ps(qv, m1, a[1][h]);
    }
  }
  for (uint32_t k = 0; k < (kTwo ? 2u : 1u); ++k) {
    alignas(16) float sums[4];
    _mm_store_ps(sums, Sum4(a[k][0], a[k][1], a[k][2], a[k][3]));
    uint16_t scale_code;
    __builtin_memcpy(&scale_code, tile + 2 * size_t{t0 + k}, 2);
    const float scale = _cvtsh_ss(scale_code);
    for (int h = 0; h < NH; ++h) {
      const float* qh = q + Off(h, dim);
      for (uint32_t d = 8 * full; d < dim; ++d) sums[h] += Bit(rows[k], d) ? -qh[d] : qh[d];
      s[Off(h, tokens) + t0 + k] = scale * sums[h];
    }
  }
}

// rq[h][j] = norm * sum_d (bit set ? -q_h,d : q_h,d) for NH heads, rows j of R (signs: row j
// at j * row_stride bytes). rq: [NH, r]. The additions follow SignedSum in sketch.cc exactly:
// lane l of one accumulator sums the values d = l (mod 4) of the 8-aligned part in order, Sum4
// combines the lanes as (s0 + s1) + (s2 + s3), and the tail is added one by one.
template <int NH>
void JlProject(const std::byte* signs, size_t row_stride, uint32_t r, uint32_t dim, double norm,
               const float* q, double* rq) {
  const uint32_t full = dim / 8;
  for (uint32_t j = 0; j < r; ++j) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(signs) + j * row_stride;
    __m256d acc[4];
    for (int h = 0; h < 4; ++h) acc[h] = _mm256_setzero_pd();
    for (uint32_t c = 0; c < full; ++c) {
      const __m256d m_lo = SignBits4(row[c], 0), m_hi = SignBits4(row[c], 4);
      for (int h = 0; h < NH; ++h) {
        const float* qc = q + Off(h, dim) + 8 * c;
        acc[h] = _mm256_add_pd(acc[h], _mm256_xor_pd(_mm256_cvtps_pd(_mm_loadu_ps(qc)), m_lo));
        acc[h] = _mm256_add_pd(acc[h], _mm256_xor_pd(_mm256_cvtps_pd(_mm_loadu_ps(qc + 4)), m_hi));
      }
    }
    alignas(32) double sums[4];
    _mm256_store_pd(sums, Sum4(acc[0], acc[1], acc[2], acc[3]));
    for (int h = 0; h < NH; ++h) {
      const float* qh = q + Off(h, dim);
      for (uint32_t d = 8 * full; d < dim; ++d) {
        sums[h] += Bit(row, d) ? -double{qh[d]} : double{qh[d]};
      }
      rq[Off(h, r) + j] = norm * sums[h];
    }
  }
}

// jl scores of NH heads: y: [tokens, r] fp16, rq: [NH, r], s: [NH, tokens].
template <int NH>
void JlScores(const std::byte* y, uint32_t tokens, uint32_t r, const double* rq, float* s) {
  const uint16_t* codes = reinterpret_cast<const uint16_t*>(y);
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint16_t* yt = codes + size_t{t} * r;
    __m256d acc[4];
    for (int h = 0; h < 4; ++h) acc[h] = _mm256_setzero_pd();
    uint32_t j = 0;
    for (; j + 4 <= r; j += 4) {
      const __m256d yv =
          _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(yt + j))));
      for (int h = 0; h < NH; ++h)
        acc[h] = _mm256_fmadd_pd(_mm256_loadu_pd(rq + Off(h, r) + j), yv, acc[h]);
    }
    alignas(32) double sums[4];
    _mm256_store_pd(sums, Sum4(acc[0], acc[1], acc[2], acc[3]));
    for (int h = 0; h < NH; ++h) {
      for (uint32_t e = j; e < r; ++e) sums[h] += rq[Off(h, r) + e] * double{_cvtsh_ss(yt[e])};
      s[Off(h, tokens) + t] = static_cast<float>(sums[h]);
    }
  }
}

}  // namespace

void ScoresInt1Avx2(const std::byte* tile, uint32_t tokens, uint32_t dim, const float* q,
                    uint32_t n_q, float* s) {
  ByHeadGroups(n_q, [&]<int NH>(uint32_t i) {
    const float* qi = q + size_t{i} * dim;
    float* si = s + size_t{i} * tokens;
    uint32_t t = 0;
    for (; t + 2 <= tokens; t += 2) Int1Block<NH, true>(tile, t, tokens, dim, qi, si);
    if (t < tokens) Int1Block<NH, false>(tile, t, tokens, dim, qi, si);
  });
}

void ProjectJlAvx2(const std::byte* signs, size_t row_stride, uint32_t r, uint32_t dim, double norm,
                   const float* q, uint32_t n_q, double* rq) {
  ByHeadGroups(n_q, [&]<int NH>(uint32_t i) {
    JlProject<NH>(signs, row_stride, r, dim, norm, q + size_t{i} * dim, rq + size_t{i} * r);
  });
}

void ScoresJlAvx2(const std::byte* y, uint32_t tokens, uint32_t r, const double* rq, uint32_t n_q,
                  float* s) {
  ByHeadGroups(n_q, [&]<int NH>(uint32_t i) {
    JlScores<NH>(y, tokens, r, rq + size_t{i} * r, s + size_t{i} * tokens);
  });
}

}  // namespace argus::codec_internal
