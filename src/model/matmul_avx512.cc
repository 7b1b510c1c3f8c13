// AVX-512 VL + VNNI quantised matrix kernels: the same accumulators as the AVX2 kernels (so
// bit-identical to them and to the specification), with vpdpbusd's exact sums of four
// unsigned-by-signed byte products in place of the vpmaddubsw, vpmaddwd pair. q8_0 at batch 1
// runs the 256-bit tiles of matmul_tiles.h with AVX-512 VL's 32 registers; more batch rows run in
// pairs, two accumulators to a 512-bit register (PairedKernel).
//
// vpdpbusd multiplies unsigned by signed bytes, so the weights take an offset u that makes them
// unsigned, and sum w x = sum (w + u) x - u sum x, where the correction -u sum x, the start value
// of vpdpbusd, is prepared once per activation block for every weight row:
// - q8_0: u = 128, w + 128 being the code with its sign bit flipped;
// - q4_0: u = 8, w + 8 being the stored nibble (matmul_tiles.h's Q4_0GroupKernel, one row per
//   lane of a 256-bit register at any batch).
// Float weights use the AVX2 kernels.
#include "core/avx512.h"
#include "model/matmul_tiles.h"

namespace argus::model {
namespace {

inline __m256i ByteDots(__m256i start, __m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_dpbusd_epi32(start, unsigned_bytes, signed_bytes);
}

// q8_0 weights plus 128 (the sign bit flipped; see the file comment).
struct Q8_0Codes {
  static constexpr size_t kBlockBytes = 34;
  using Weights = __m256i;
  struct Activation {
    __m256i codes, minus_offset_sums;  // lane l: -(128 sum x[4l..4l+3])
  };
  static Weights Load(const std::byte* block) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static Activation Prepare(__m256i qx) {
    const __m256i sums =
        ByteDots(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), qx);
    return {qx, _mm256_sub_epi32(_mm256_setzero_si256(), sums)};
  }
  static __m256i Dot(Weights weights_plus_offset, const Activation& x) {
    return ByteDots(x.minus_offset_sums, weights_plus_offset, x.codes);
  }
};

struct Q4_0Dots {
  static __m256i Add(__m256i acc, __m256i unsigned_bytes, __m256i signed_bytes) {
    return ByteDots(acc, unsigned_bytes, signed_bytes);
  }
};

// Batch rows in pairs: one 512-bit register holds one weight row's accumulators for two batch
// rows (lanes 0-7 the even row's, 8-15 the odd one's), each fed exactly as the 256-bit tiles feed
// it, so the results are the same bits while each instruction does two outputs' work. The
// activations are prepared pair by pair: block k of pair p is its two rows' codes side by side,
// then their corrections side by side; an odd last row pairs with zeros, whose outputs are not
// stored.
template <typename Q>
class PairedKernel {
 public:
  struct PairBlock {
    __m512i codes, minus_offset_sums;
  };
  static_assert(sizeof(PairBlock) + 2 * sizeof(float) <= 2 * kPreparedBlockBytes);

  static void Prepare(const std::byte* xq, uint32_t n_batch, uint32_t n_cols, std::byte* prepared) {
    const size_t n_blocks = n_cols / kQk;
    const size_t n_pair_blocks = size_t{(n_batch + 1) / 2} * n_blocks;
    auto* x = reinterpret_cast<PairBlock*>(prepared);
    auto* dx = reinterpret_cast<float*>(x + n_pair_blocks);
    for (size_t i = 0; i < n_pair_blocks; ++i) {
      const size_t p = i / n_blocks, k = i % n_blocks;
      typename Q::Activation half[2] = {};
      float d[2] = {0.0f, 0.0f};
      for (size_t h = 0; h < 2 && 2 * p + h < n_batch; ++h) {
        half[h] = PrepareBlock<Q>(xq + ((2 * p + h) * n_blocks + k) * kQ8Bytes, d[h]);
      }
      x[i] = {Join(half[0].codes, half[1].codes),
              Join(half[0].minus_offset_sums, half[1].minus_offset_sums)};
      dx[2 * i] = d[0];
      dx[2 * i + 1] = d[1];
    }
  }

  PairedKernel(const WeightMatrix& w, const std::byte* prepared, uint32_t n_batch, float* y)
      : w_(w),
        n_blocks_(w.n_cols / kQk),
        n_batch_(n_batch),
        x_(reinterpret_cast<const PairBlock*>(prepared)),
        dx_(reinterpret_cast<const float*>(x_ + size_t{(n_batch + 1) / 2} * n_blocks_)),
        y_(y) {}

  uint32_t n_pairs() const { return (n_batch_ + 1) / 2; }

  template <int NR, int NP>
  void Tile(uint32_t r0, uint32_t p0) const {
    const std::byte* rows[NR];
    for (int r = 0; r < NR; ++r) rows[r] = w_.data + (r0 + r) * w_.row_bytes;
    __m512 acc[NR][NP];
    for (auto& a : acc) {
      for (auto& v : a) v = _mm512_setzero_ps();
    }
    // Lanes 0-7 take the even row's scale, 8-15 the odd row's.
    const __m512i pair_scales = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const size_t ahead = NR * w_.row_bytes;
    for (uint32_t k = 0; k < n_blocks_; ++k) {
      __m512i qw[NR];
      __m512 dw[NR];
      for (int r = 0; r < NR; ++r) {
        const std::byte* block = rows[r] + k * Q::kBlockBytes;
        Prefetch(block + ahead);
        const __m256i codes = Q::Load(block);
        qw[r] = _mm512_inserti64x4(_mm512_castsi256_si512(codes), codes, 1);
        dw[r] = _mm512_broadcastss_ps(_mm256_castps256_ps128(BroadcastHalf(block)));
      }
      for (int p = 0; p < NP; ++p) {
        const size_t i = size_t{p0 + p} * n_blocks_ + k;
        const PairBlock& qx = x_[i];
        double two_scales;
        std::memcpy(&two_scales, dx_ + 2 * i, sizeof two_scales);
        const __m512 dx = _mm512_permutexvar_ps(
            pair_scales, _mm512_castps128_ps512(_mm_castpd_ps(_mm_set_sd(two_scales))));
        for (int r = 0; r < NR; ++r) {
          const __m512 sums =
              _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(qx.minus_offset_sums, qw[r], qx.codes));
          acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], dx), sums, acc[r][p]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int p = 0; p < NP; ++p) {
        const uint32_t b = 2 * (p0 + p);
        y_[size_t{b} * w_.n_rows + r0 + r] = avx2::HorizontalSum(_mm512_castps512_ps256(acc[r][p]));
        if (b + 1 < n_batch_) {
          y_[size_t{b + 1} * w_.n_rows + r0 + r] = avx2::HorizontalSum(
              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][p]), 1)));
        }
      }
    }
  }

 private:
  static __m512i Join(__m256i low, __m256i high) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }

  const WeightMatrix& w_;
  uint32_t n_blocks_, n_batch_;
  const PairBlock* x_;
  const float* dx_;
  float* y_;
};

// Rows [begin, end) x all pairs of batch rows: tiles of four weight rows and four pairs, 16
// accumulators (so each weight block is read once for eight batch rows, each activation block once
// for four weight rows); the rows a chunk leaves over one at a time.
template <typename Q>
void RunPairTiles(const PairedKernel<Q>& kernel, uint32_t begin, uint32_t end) {
  uint32_t r = begin;
  for (; r + 4 <= end; r += 4) BatchTiles<4>(kernel, r, kernel.n_pairs());
  for (; r < end; ++r) BatchTiles<1>(kernel, r, kernel.n_pairs());
}

// One batch row (decode) runs the 256-bit tiles; more run in pairs.
template <typename Q>
void Prepare(const std::byte* xq, uint32_t n_batch, uint32_t n_cols, std::byte* prepared) {
  if (n_batch == 1) return QuantisedKernel<Q>::Prepare(xq, 1, n_cols, prepared);
  PairedKernel<Q>::Prepare(xq, n_batch, n_cols, prepared);
}

template <typename Q>
void Rows(const WeightMatrix& w, const std::byte* prepared, uint32_t n_batch, uint32_t begin,
          uint32_t end, float* y) {
  if (n_batch == 1) return RunDecodeRows(QuantisedKernel<Q>(w, prepared, 1, y), begin, end);
  RunPairTiles(PairedKernel<Q>(w, prepared, n_batch, y), begin, end);
}

}  // namespace

void PrepareActivationsAvx512(GgmlType type, const std::byte* xq, uint32_t n_batch, uint32_t n_cols,
                              std::byte* prepared) {
  switch (type) {
    case GgmlType::kQ8_0:
      return Prepare<Q8_0Codes>(xq, n_batch, n_cols, prepared);
    case GgmlType::kQ4_0:
      return Q4_0GroupKernel<Q4_0Dots>::Prepare(xq, n_batch, n_cols, prepared);
    default:
      return;  // float weights read x
  }
}

void MatMulRowsAvx512(const WeightMatrix& w, const float* x, const std::byte* prepared,
                      uint32_t n_batch, uint32_t begin, uint32_t end, float* y) {
  switch (w.type) {
    case GgmlType::kQ8_0:
      return Rows<Q8_0Codes>(w, prepared, n_batch, begin, end, y);
    case GgmlType::kQ4_0:
      return RunQ4_0Groups<Q4_0Dots>(w, prepared, n_batch, begin, end, y);
    default:
      return MatMulRowsAvx2(w, x, prepared, n_batch, begin, end, y);
  }
}

}  // namespace argus::model
