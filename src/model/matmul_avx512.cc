// AVX-512 VL + VNNI quantised matrix kernels over the tiles of matmul_tiles.h: the same 8-lane
// accumulators as the AVX2 kernels (so bit-identical to them and to the specification), with
// vpdpbusd's exact sums of four unsigned-by-signed byte products in place of the vpmaddubsw,
// vpmaddwd pair, and the 32 vector registers AVX-512 VL gives 256-bit code.
//
// vpdpbusd multiplies unsigned by signed bytes, so the weights take an offset u that makes them
// unsigned, and sum w x = sum (w + u) x - u sum x, where the correction -u sum x, the start value
// of vpdpbusd, is prepared once per activation block for every weight row:
// - q8_0: u = 128, w + 128 being the code with its sign bit flipped;
// - q4_0: u = 8, w + 8 being the stored nibble.
// Float weights use the AVX2 kernels.
#include "model/matmul_tiles.h"

namespace argus::model {
namespace {

inline __m256i ByteDots(__m256i start, __m256i unsigned_bytes, __m256i signed_bytes) {
  return _mm256_dpbusd_epi32(start, unsigned_bytes, signed_bytes);
}

// The activations of weights stored with the offset kOffset (see the file comment).
template <uint8_t kOffset>
struct OffsetCodes {
  struct Activation {
    __m256i codes, minus_offset_sums;  // lane l: -(kOffset sum x[4l..4l+3])
  };
  static Activation Prepare(__m256i qx) {
    const __m256i sums =
        ByteDots(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(kOffset)), qx);
    return {qx, _mm256_sub_epi32(_mm256_setzero_si256(), sums)};
  }
  static __m256i Dot(__m256i weights_plus_offset, const Activation& x) {
    return ByteDots(x.minus_offset_sums, weights_plus_offset, x.codes);
  }
};

struct Q8_0Codes : OffsetCodes<128> {
  static constexpr size_t kBlockBytes = 34;
  using Weights = __m256i;
  static Weights Load(const std::byte* block) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

struct Q4_0Codes : OffsetCodes<8> {
  static constexpr size_t kBlockBytes = 18;
  using Weights = __m256i;
  static Weights Load(const std::byte* block) { return LoadNibbles(block); }
};

}  // namespace

void PrepareActivationsAvx512(GgmlType type, const std::byte* xq, uint32_t n_batch, uint32_t n_cols,
                              std::byte* prepared) {
  PrepareQuantised<Q8_0Codes, Q4_0Codes>(type, xq, n_batch, n_cols, prepared);
}

void MatMulRowsAvx512(const WeightMatrix& w, const float* x, const std::byte* prepared,
                      uint32_t n_batch, uint32_t begin, uint32_t end, float* y) {
  switch (w.type) {
    case GgmlType::kQ8_0:
      return RunTiles(QuantisedKernel<Q8_0Codes>(w, prepared, n_batch, y), n_batch, begin, end);
    case GgmlType::kQ4_0:
      return RunTiles(QuantisedKernel<Q4_0Codes>(w, prepared, n_batch, y), n_batch, begin, end);
    default:
      return MatMulRowsAvx2(w, x, prepared, n_batch, begin, end, y);
  }
}

}  // namespace argus::model
