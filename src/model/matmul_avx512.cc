// AVX-512 VL + VNNI quantised matrix kernels over the tiles of matmul_tiles.h: the same 8-lane
// accumulators as the AVX2 kernels (so bit-identical to them and to the specification), with
// vpdpbusd's exact sums of four unsigned-by-signed byte products in place of the vpmaddubsw,
// vpmaddwd pair, and the 32 vector registers AVX-512 VL gives 256-bit code.
//
// vpdpbusd adds its products to a start value, which carries each block's correction:
// - q8_0: x + 128 (the code with its sign bit flipped) is unsigned, so sum x w = sum (x + 128) w
//   - 128 sum w, the correction computed once per weight block for every batch row;
// - q4_0: sum (n - 8) x = sum n x - 8 sum x, the correction once per activation block.
// Float weights use the AVX2 kernels.
#include "model/matmul_tiles.h"

namespace argus::model {
namespace {

inline __m256i ByteDots(__m256i start, __m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_dpbusd_epi32(start, unsigned_bytes, signed_bytes);
}

// -(u sum of each lane's 4 signed bytes), u an unsigned byte.
inline __m256i MinusScaledSums(uint8_t u, __m256i signed_bytes) {
  return _mm256_sub_epi32(
      _mm256_setzero_si256(),
      ByteDots(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(u)), signed_bytes));
}

struct Q8_0Codes {
  static constexpr size_t kBlockBytes = 34;
  struct Weights {
    __m256i codes, minus_128_sum;
  };
  using Activation = __m256i;  // x + 128, unsigned
  static Weights Load(const std::byte* block) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    return {q, MinusScaledSums(128, q)};
  }
  static Activation Prepare(__m256i qx) {
    return _mm256_xor_si256(qx, _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static __m256i Dot(const Weights& w, Activation x_plus_128) {
    return ByteDots(w.minus_128_sum, x_plus_128, w.codes);
  }
};

struct Q4_0Codes {
  static constexpr size_t kBlockBytes = 18;
  using Weights = __m256i;  // the nibbles
  struct Activation {
    __m256i codes, minus_8_sum;
  };
  static Weights Load(const std::byte* block) { return LoadNibbles(block); }
  static Activation Prepare(__m256i qx) { return {qx, MinusScaledSums(8, qx)}; }
  static __m256i Dot(Weights nibbles, const Activation& x) {
    return ByteDots(x.minus_8_sum, nibbles, x.codes);
  }
};

}  // namespace

void MatMulRowsAvx512(const WeightMatrix& w, const float* x, const std::byte* xq, uint32_t n_batch,
                      uint32_t begin, uint32_t end, float* y) {
  switch (w.type) {
    case GgmlType::kQ8_0:
      return RunTiles(QuantisedKernel<Q8_0Codes>(w, xq, y), n_batch, begin, end);
    case GgmlType::kQ4_0:
      return RunTiles(QuantisedKernel<Q4_0Codes>(w, xq, y), n_batch, begin, end);
    default:
      return MatMulRowsAvx2(w, x, xq, n_batch, begin, end, y);
  }
}

}  // namespace argus::model
