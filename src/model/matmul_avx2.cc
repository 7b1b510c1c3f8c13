// AVX2 + FMA + F16C matrix kernels, bit-identical to the scalar specification in matmul.cc: each
// output keeps one 8-lane accumulator fed in the specification's order, so tiling rows and batch
// rows changes only how many accumulators are live, never a result.
//
// A tile of NR weight rows x NB batch rows loads each weight vector once and uses it NB times:
// at batch 1 four rows run side by side (four independent FMA chains); in prefill two rows meet
// four batch rows at a time, so the weights, the big stream, are read from memory once per two
// rows while the activations come from cache.
//
// Quantised weights use integer dots like ggml's (ggml_vec_dot_{q8_0,q4_0}_q8_0): vpmaddubsw
// multiplies unsigned by signed bytes into pair sums (at most 2 * 128 * 127 in magnitude here, so
// never saturated), vpmaddwd with ones sums pairs into 8 int32 lanes of 4 products each, then one
// FMA per block with the two scales. q8_0 uses ggml's sign trick (|w| times sign(w) * x; the
// activation codes are never -128, so sign() cannot overflow); q4_0 multiplies its unsigned
// nibbles and subtracts 8 sum x, computed once per activation block.
//
// Each tile prefetches the next tile's weights: the rows of a tile are short streams that the
// hardware prefetcher picks up too late.
#include <immintrin.h>

#include <cstring>

#include "core/avx2_reduce.h"
#include "model/matmul.h"

namespace argus::model {
namespace {

constexpr uint32_t kQk = 32;
constexpr size_t kQ8Bytes = 34;

inline float LoadHalf(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Fetches the next tile's weights (see the file comment).
inline void Prefetch(const std::byte* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

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

  template <int NR, int NB>
  void Tile(uint32_t r0, uint32_t b0) const {
    const uint32_t n = w_.n_cols;
    const std::byte* rows[NR];
    const float* xs[NB];
    for (int r = 0; r < NR; ++r) rows[r] = w_.data + (r0 + r) * w_.row_bytes;
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
        Prefetch(rows[r] + c * W::kBytes + ahead);
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
        y_[size_t{b0 + b} * w_.n_rows + r0 + r] = avx2::HorizontalSum(acc[r][b]);
      }
    }
  }

 private:
  const WeightMatrix& w_;
  const float* x_;
  float* y_;
};

// The integer dot of a weight block with an activation block: 8 int32 lanes, lane l the exact
// sum of products 4l..4l+3. Load() prepares a weight block once for every activation row;
// Offset() prepares an activation block once for every weight row.
inline __m256i PairSums(__m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_bytes, signed_bytes),
                           _mm256_set1_epi16(1));
}

// q8_0: ggml's sign trick, |w| times sign(w) * x.
struct Q8_0Codes {
  static constexpr size_t kBlockBytes = 34;
  struct Weights {
    __m256i codes, magnitudes;
  };
  static Weights Load(const std::byte* block) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    return {q, _mm256_sign_epi8(q, q)};
  }
  static __m256i Offset(__m256i) { return _mm256_setzero_si256(); }
  static __m256i Dot(const Weights& w, __m256i qx, __m256i) {
    return PairSums(w.magnitudes, _mm256_sign_epi8(qx, w.codes));
  }
};

// q4_0: sum (n - 8) x = sum n x - 8 sum x. The unsigned nibbles n multiply x directly and 8 sum x
// comes once per activation block, two vector operations fewer per block than the sign trick
// (this kernel is compute-bound at batch 1).
struct Q4_0Codes {
  static constexpr size_t kBlockBytes = 18;
  struct Weights {
    __m256i nibbles;
  };
  static Weights Load(const std::byte* block) {
    // The load broadcasts the 16 bytes to both halves; the high half shifts down by 4.
    const __m256i qs =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
    return {_mm256_and_si256(_mm256_srlv_epi64(qs, _mm256_set_epi64x(4, 4, 0, 0)),
                             _mm256_set1_epi8(0x0f))};
  }
  static __m256i Offset(__m256i qx) { return PairSums(_mm256_set1_epi8(8), qx); }
  static __m256i Dot(const Weights& w, __m256i qx, __m256i offset) {
    return _mm256_sub_epi32(PairSums(w.nibbles, qx), offset);
  }
};

template <typename Q>
class QuantisedKernel {
 public:
  QuantisedKernel(const WeightMatrix& w, const std::byte* xq, float* y) : w_(w), xq_(xq), y_(y) {}

  template <int NR, int NB>
  void Tile(uint32_t r0, uint32_t b0) const {
    const size_t xq_row_bytes = QuantizedRowBytes(w_.n_cols);
    const std::byte* rows[NR];
    const std::byte* xs[NB];
    for (int r = 0; r < NR; ++r) rows[r] = w_.data + (r0 + r) * w_.row_bytes;
    for (int b = 0; b < NB; ++b) xs[b] = xq_ + (b0 + b) * xq_row_bytes;
    __m256 acc[NR][NB];
    for (auto& a : acc) {
      for (auto& v : a) v = _mm256_setzero_ps();
    }
    const size_t ahead = NR * w_.row_bytes;
    for (uint32_t k = 0; k < w_.n_cols / kQk; ++k) {
      typename Q::Weights qw[NR];
      float dw[NR];
      for (int r = 0; r < NR; ++r) {
        const std::byte* block = rows[r] + k * Q::kBlockBytes;
        Prefetch(block + ahead);
        qw[r] = Q::Load(block);
        dw[r] = LoadHalf(block);
      }
      for (int b = 0; b < NB; ++b) {
        const std::byte* block = xs[b] + k * kQ8Bytes;
        const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
        const __m256i offset = Q::Offset(qx);
        const float dx = LoadHalf(block);
        for (int r = 0; r < NR; ++r) {
          const __m256 sums = _mm256_cvtepi32_ps(Q::Dot(qw[r], qx, offset));
          acc[r][b] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dx), sums, acc[r][b]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int b = 0; b < NB; ++b) {
        y_[size_t{b0 + b} * w_.n_rows + r0 + r] = avx2::HorizontalSum(acc[r][b]);
      }
    }
  }

 private:
  const WeightMatrix& w_;
  const std::byte* xq_;
  float* y_;
};

// Rows [begin, end) x all batch rows in tiles; see the file comment for the shapes.
template <int NR, typename Kernel>
void BatchTiles(const Kernel& kernel, uint32_t r, uint32_t n_batch) {
  uint32_t b = 0;
  for (; b + 4 <= n_batch; b += 4) kernel.template Tile<NR, 4>(r, b);
  switch (n_batch - b) {
    case 3:
      kernel.template Tile<NR, 3>(r, b);
      break;
    case 2:
      kernel.template Tile<NR, 2>(r, b);
      break;
    case 1:
      kernel.template Tile<NR, 1>(r, b);
      break;
    default:
      break;
  }
}

template <typename Kernel>
void RunTiles(const Kernel& kernel, uint32_t n_batch, uint32_t begin, uint32_t end) {
  uint32_t r = begin;
  if (n_batch == 1) {
    for (; r + 4 <= end; r += 4) kernel.template Tile<4, 1>(r, 0);
  } else {
    for (; r + 2 <= end; r += 2) BatchTiles<2>(kernel, r, n_batch);
  }
  for (; r < end; ++r) BatchTiles<1>(kernel, r, n_batch);
}

}  // namespace

void MatMulRowsAvx2(const WeightMatrix& w, const float* x, const std::byte* xq, uint32_t n_batch,
                    uint32_t begin, uint32_t end, float* y) {
  switch (w.type) {
    case GgmlType::kF32:
      return RunTiles(FloatKernel<F32Weights>(w, x, y), n_batch, begin, end);
    case GgmlType::kF16:
      return RunTiles(FloatKernel<F16Weights>(w, x, y), n_batch, begin, end);
    case GgmlType::kBF16:
      return RunTiles(FloatKernel<Bf16Weights>(w, x, y), n_batch, begin, end);
    case GgmlType::kQ8_0:
      return RunTiles(QuantisedKernel<Q8_0Codes>(w, xq, y), n_batch, begin, end);
    case GgmlType::kQ4_0:
      return RunTiles(QuantisedKernel<Q4_0Codes>(w, xq, y), n_batch, begin, end);
    default:
      return;  // MatrixOf admits no other type
  }
}

}  // namespace argus::model
