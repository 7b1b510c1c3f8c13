// Pieces shared by the scalar ggml block codecs (ggml.cc, the specification) and their AVX2 and
// AVX-512 kernels (ggml_avx2.cc, ggml_avx512.cc): the formats, the iq4_nl levels, and the stated
// error of the integer kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "argus/core.h"
#include "codec/head_passes.h"

namespace argus::codec_internal {

enum class GgmlKind : uint8_t { kQ8_0, kQ4_0, kIq4Nl };

// Bytes of one 32-value block: an fp16 scale, then 32 int8 (q8_0) or 16 bytes of nibbles.
inline constexpr size_t GgmlBlockBytes(GgmlKind kind) { return kind == GgmlKind::kQ8_0 ? 34 : 18; }

// ggml's kvalues_iq4nl: the 16 levels of iq4_nl in units of the block scale, ascending.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// The scale of a query block rounded to int8 codes of amax/127 steps, as llama.cpp's q8_0 (the
// type its CPU attention converts queries to for quantised K) stores it: in fp16. Kernels that
// round queries to int8 use it, so their scores are llama.cpp's arithmetic, not only its format.
inline float Int8QueryScale(float amax) { return HalfToFloat(FloatToHalf(amax / 127.0f)); }

// Tokens that share one weight scale in the vector accumulate kernels: 8-bit weights (q4_0; int16
// sums of 32 tokens still hold sum w (code - 8) exactly) and 16-bit weights (q8_0, iq4_nl).
// Larger groups cost less per token and loosen the bounds below in proportion (q4_0 with 16
// tokens: bound 0.063, accumulate about 10% slower).
inline constexpr uint32_t kWeightGroup8 = 32;
inline constexpr uint32_t kWeightGroup16 = 64;

// Extra error of the kernels against decode-then-dot, in CodecInfo::fused_rel_error's terms.
// Scalar kernels: float rounding of sums of up to 1024 terms (dims, or tokens of a tile of up to
// 1024 tokens), 1024 * 2^-24. The vector kernels add integer rounding; their bounds hold for
// tiles this codec encoded, where every non-zero block holds a code of the largest magnitude (-8
// for q4_0, +-127 for q8_0, -127 for iq4_nl):
// scores: the query is rounded per 32-block to int8 (q4_0, and every format on AVX-512) with
//   codes of amax/127 steps and the fp16 rounding of that step as scale (Int8QueryScale), or to
//   int16 (q8_0 and iq4_nl on AVX2) with scale amax/32767, so |dq_j| <= amax/254 + 2^-11 amax
//   (amax/65534); summing |dq_j| |k_j| over a block is at most sqrt(32) (1/254 + 2^-11) amax
//   ||k_block||, and Cauchy-Schwarz over blocks gives sqrt(32) (1/254 + 2^-11) ||q|| ||k|| (0.025;
//   8.6e-5 for int16).
// accumulate: w = p[t] * d[t][b] over a group of G tokens and all block columns b is rounded to
//   int8 (q4_0) or int16 with one scale s = max|w|/127 (/32767). Each token adds at most
//   s/2 * max|code| to an output, while the token holding the largest |w| alone contributes at
//   least 127 s * max|code| (32767 s * max|code|) to sum_t |p_t| ||v_t||, its row containing that
//   block. So the ratio is at most G/254 (G/65534).
// Each bound is the larger of its two kernels' terms.
inline constexpr double kGgmlScalarRelError = 6.2e-5;
inline constexpr double kGgmlVectorRelError8 = kWeightGroup8 / 254.0 + 1e-4;  // q4_0: 0.126
inline constexpr double kGgmlAvx2RelError16 =
    kWeightGroup16 / 65534.0 + 1e-4;  // q8_0, iq4_nl on AVX2: 1.1e-3
inline constexpr double kGgmlAvx512RelError16 =
    5.656854249492381 * (1.0 / 254.0 + 1.0 / 2048.0) +
    1e-4;  // q8_0, iq4_nl on AVX-512: sqrt(32) (1/254 + 2^-11) + 1e-4 = 0.025

// AVX2 versions. REQUIRES: dim % 32 == 0 (rows are whole blocks); k/v hold tokens*dim/32 blocks
// of `kind`; q, p, s, acc as in Codec::scores / Codec::accumulate; 1 <= n_q <= kMaxGroupHeads.
void ScoresGgmlAvx2(GgmlKind kind, const std::byte* k, uint32_t tokens, uint32_t dim,
                    const float* q, uint32_t n_q, float* s);
void AccumulateGgmlAvx2(GgmlKind kind, const std::byte* v, uint32_t tokens, uint32_t dim,
                        const float* p, uint32_t n_q, float* acc);
// AVX-512 VNNI versions, same contract (ggml_avx512.cc).
void ScoresGgmlAvx512(GgmlKind kind, const std::byte* k, uint32_t tokens, uint32_t dim,
                      const float* q, uint32_t n_q, float* s);
void AccumulateGgmlAvx512(GgmlKind kind, const std::byte* v, uint32_t tokens, uint32_t dim,
                          const float* p, uint32_t n_q, float* acc);

// Dispatch helpers of both kernel files. Internal linkage: each file's copy is compiled with that
// file's instruction set and never merged with the other's.
namespace {

template <GgmlKind K>
struct Kind {
  static constexpr GgmlKind kValue = K;
};

// f(Kind<k>{}) with the format as a compile-time constant.
template <typename F>
void ByKind(GgmlKind kind, F f) {
  switch (kind) {
    case GgmlKind::kQ8_0:
      return f(Kind<GgmlKind::kQ8_0>{});
    case GgmlKind::kQ4_0:
      return f(Kind<GgmlKind::kQ4_0>{});
    case GgmlKind::kIq4Nl:
      return f(Kind<GgmlKind::kIq4Nl>{});
  }
}

}  // namespace

}  // namespace argus::codec_internal
