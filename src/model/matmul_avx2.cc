// AVX2 + FMA + F16C matrix kernels over the tiles of matmul_tiles.h.
//
// Float weights: float dot products, each weight vector loaded once per tile.
//
// Quantised weights use integer dots like ggml's (ggml_vec_dot_{q8_0,q4_0}_q8_0): vpmaddubsw
// multiplies unsigned by signed bytes into pair sums (at most 2 * 128 * 127 in magnitude here, so
// never saturated), vpmaddwd with ones sums pairs into 8 int32 lanes of 4 products each. q8_0
// uses ggml's sign trick (|w| times sign(w) * x; the activation codes are never -128, so sign()
// cannot overflow); q4_0 multiplies its unsigned nibbles and subtracts 8 sum x, prepared with the
// activation block (matmul_tiles.h's Q4_0GroupKernel).
#include "model/matmul_tiles.h"

namespace argus::model {
namespace {

// 8 consecutive weights of a float-type row as floats.
struct F32Weights {
  static constexpr size_t kBytes = 4;
  static __m256 Load(const std::byte* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
};
struct F16Weights {
  static constexpr size_t kBytes = 2;
  static __m256 Load(const std::byte* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct Bf16Weights {
  static constexpr size_t kBytes = 2;
  static __m256 Load(const std::byte* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
};

template <typename W>
class FloatKernel {
 public:
  FloatKernel(const WeightMatrix& w, const float* x, float* y) : w_(w), x_(x), y_(y) {}

  // One FMA per 8 values is on a row's chain: long rows are read four at a time, the others as two
  // streams (matmul_tiles.h).
  bool InterleavesDecodeRows() const { return w_.row_bytes >= kLongFloatRowBytes; }

  // Rows r0, r0 + row_step, ... (matmul_tiles.h); the next tile is prefetched when they are
  // consecutive.
  template <int NR, int NB>
  void Tile(uint32_t r0, uint32_t b0, uint32_t row_step = 1) const {
    const uint32_t n = w_.n_cols;
    const std::byte* rows[NR];
    const float* xs[NB];
    for (int r = 0; r < NR; ++r) rows[r] = w_.data + size_t{r0 + r * row_step} * w_.row_bytes;
    for (int b = 0; b < NB; ++b) xs[b] = x_ + size_t{b0 + b} * n;
    const size_t ahead = NR * w_.row_bytes;
    __m256 acc[NR][NB];
    for (auto& a : acc) {
      for (auto& v : a) v = _mm256_setzero_ps();
    }
    auto step = [&](const __m256* wv, const __m256* xv) {
      for (int b = 0; b < NB; ++b) {
        for (int r = 0; r < NR; ++r) acc[r][b] = _mm256_fmadd_ps(wv[r], xv[b], acc[r][b]);
      }
    };
    uint32_t c = 0;
    for (; c + 8 <= n; c += 8) {
      __m256 wv[NR], xv[NB];
      for (int r = 0; r < NR; ++r) {
        if (NR > 1 && row_step == 1) Prefetch(rows[r] + c * W::kBytes + ahead);
        wv[r] = W::Load(rows[r] + c * W::kBytes);
      }
      for (int b = 0; b < NB; ++b) xv[b] = _mm256_loadu_ps(xs[b] + c);
      step(wv, xv);
    }
    if (c < n) {  // the zero-padded last 8 columns, as the specification pads them
      __m256 wv[NR], xv[NB];
      for (int r = 0; r < NR; ++r) {
        alignas(32) std::byte pad[8 * W::kBytes] = {};
        std::memcpy(pad, rows[r] + c * W::kBytes, (n - c) * W::kBytes);
        wv[r] = W::Load(pad);
      }
      for (int b = 0; b < NB; ++b) {
        alignas(32) float pad[8] = {};
        std::memcpy(pad, xs[b] + c, (n - c) * sizeof(float));
        xv[b] = _mm256_load_ps(pad);
      }
      step(wv, xv);
    }
    for (int r = 0; r < NR; ++r) {
      for (int b = 0; b < NB; ++b) {
        y_[size_t{b0 + b} * w_.n_rows + r0 + r * row_step] = avx2::HorizontalSum(acc[r][b]);
      }
    }
  }

 private:
  const WeightMatrix& w_;
  const float* x_;
  float* y_;
};

inline __m256i PairSums(__m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes),
                           _mm256_set1_epi16(1));
}

struct Q8_0Codes {
  static constexpr size_t kBlockBytes = 34;
  struct Weights {
    __m256i codes, magnitudes;
  };
  using Activation = __m256i;
  static Weights Load(const std::byte* block) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    return {q, _mm256_sign_epi8(q, q)};
  }
  static Activation Prepare(__m256i qx) { return qx; }
  static __m256i Dot(const Weights& w, Activation qx) {
    return PairSums(w.magnitudes, _mm256_sign_epi8(qx, w.codes));
  }
};

// The q4_0 group kernel's dots: vpmaddubsw, then vpmaddwd with ones (pair sums of at most
// 2 * 15 * 128 in magnitude: never saturated).
struct Q4_0Dots {
  static __m256i Add(__m256i acc, __m256i unsigned_bytes, __m256i signed_bytes) {
    return _mm256_add_epi32(acc, PairSums(unsigned_bytes, signed_bytes));
  }
};

// One Q8_0 block of the 32 floats at v, as QuantizeBlockQ8_0 writes it.
void QuantizeBlock(const float* v, std::byte* block) {
  __m256 x[4], nan = _mm256_setzero_ps(), amax = _mm256_setzero_ps();
  const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x[i], x[i], _CMP_UNORD_Q));
    amax = _mm256_max_ps(amax, _mm256_and_ps(x[i], magnitude_bits));
  }
  if (_mm256_movemask_ps(nan) != 0) return QuantizeBlockQ8_0(v, block);
  const float d = avx2::HorizontalMax(amax) / 127;  // max is exact in any order without NaNs
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = FloatToHalf(d);
  std::memcpy(block, &h, 2);
  // std::round (half away from zero): the truncation, plus the sign where the dropped part is at
  // least a half. Out-of-range and NaN products convert to INT32_MIN as cvttss2si does, and the
  // low byte of each code is kept as TruncToInt8 keeps it.
  __m256i codes[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 p = _mm256_mul_ps(x[i], _mm256_set1_ps(id));
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 half_or_more = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(p, t), magnitude_bits),
                                              _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 sign_one = _mm256_or_ps(_mm256_andnot_ps(magnitude_bits, p), _mm256_set1_ps(1.0f));
    const __m256 rounded = _mm256_add_ps(t, _mm256_and_ps(half_or_more, sign_one));
    codes[i] = _mm256_and_si256(_mm256_cvttps_epi32(rounded), _mm256_set1_epi32(0xff));
  }
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(codes[0], codes[1]),
                                            _mm256_packus_epi32(codes[2], codes[3]));
  // The packs work within 128-bit lanes; the permutation puts the code dwords back in order.
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(block + 2),
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

}  // namespace

void QuantizeRowsQ8_0Avx2(const float* x, uint32_t n_batch, uint32_t n_cols, std::byte* out) {
  const size_t n_blocks = size_t{n_batch} * (n_cols / kQk);
  for (size_t i = 0; i < n_blocks; ++i) QuantizeBlock(x + i * kQk, out + i * kQ8Bytes);
}

void PrepareActivationsAvx2(GgmlType type, const std::byte* xq, uint32_t n_batch, uint32_t n_cols,
                            std::byte* prepared) {
  switch (type) {
    case GgmlType::kQ8_0:
      return QuantisedKernel<Q8_0Codes>::Prepare(xq, n_batch, n_cols, prepared);
    case GgmlType::kQ4_0:
      return Q4_0GroupKernel<Q4_0Dots>::Prepare(xq, n_batch, n_cols, prepared);
    default:
      return;  // float weights read x
  }
}

void MatMulRowsAvx2(const WeightMatrix& w, const float* x, const std::byte* prepared,
                    uint32_t n_batch, uint32_t begin, uint32_t end, float* y) {
  switch (w.type) {
    case GgmlType::kF32:
      return RunTiles(FloatKernel<F32Weights>(w, x, y), n_batch, begin, end);
    case GgmlType::kF16:
      return RunTiles(FloatKernel<F16Weights>(w, x, y), n_batch, begin, end);
    case GgmlType::kBF16:
      return RunTiles(FloatKernel<Bf16Weights>(w, x, y), n_batch, begin, end);
    case GgmlType::kQ8_0:
      return RunTiles(QuantisedKernel<Q8_0Codes>(w, prepared, n_batch, y), n_batch, begin, end);
    case GgmlType::kQ4_0:
      return RunQ4_0Groups<Q4_0Dots>(w, prepared, n_batch, begin, end, y);
    default:
      return;  // MatrixOf admits no other type
  }
}

}  // namespace argus::model
