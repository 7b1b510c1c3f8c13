// Pieces shared by the scalar ggml block codecs (ggml.cc, the specification) and their AVX2
// kernels (ggml_avx2.cc): the formats, the iq4_nl levels, and the stated error of the integer
// kernels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace argus::codec_internal {

enum class GgmlKind : uint8_t { kQ8_0, kQ4_0, kIq4Nl };

// Bytes of one 32-value block: an fp16 scale, then 32 int8 (q8_0) or 16 bytes of nibbles.
inline constexpr size_t GgmlBlockBytes(GgmlKind kind) { return kind == GgmlKind::kQ8_0 ? 34 : 18; }

// ggml's kvalues_iq4nl: the 16 levels of iq4_nl in units of the block scale, ascending.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Tokens that share one weight scale in the AVX2 accumulate kernels: 8-bit weights (q4_0) and
// 16-bit weights (q8_0, iq4_nl). They set the bounds below.
inline constexpr uint32_t kWeightGroup8 = 32;
inline constexpr uint32_t kWeightGroup16 = 64;

// Extra error of the AVX2 kernels against decode-then-dot, in CodecInfo::fused_rel_error's
// terms, for tiles this codec encoded (each non-zero block then holds a code of the largest
// magnitude: -8 for q4_0, +-127 for q8_0, -127 for iq4_nl).
// scores: the query is rounded per 32-block to int8 (q4_0) or int16 with scale amax/127 or
//   amax/32767, so |dq_j| <= amax/254 (amax/65534); summing |dq_j| |k_j| over a block is at most
//   sqrt(32) amax/254 ||k_block||, and Cauchy-Schwarz over blocks gives sqrt(32)/254 ||q|| ||k||.
// accumulate: p[t] * d_t of a group of G tokens is rounded to int8 (int16) with scale
//   s = max|p d|/127 (/32767); each token adds at most s/2 * max|code| to an output, while the
//   group's largest token alone contributes 127 s (32767 s) * ||codes|| >= 127 s * max|code| to
//   sum_t |p_t| ||v_t||. So the ratio is at most G/254 (G/65534).
inline constexpr double kGgmlScalarRelError = 6.2e-5;  // float sums of up to kMaxTileDim terms
inline constexpr double kGgmlAvx2RelError8 = kWeightGroup8 / 254.0 + 1e-4;     // q4_0: accumulate dominates
inline constexpr double kGgmlAvx2RelError16 = kWeightGroup16 / 65534.0 + 1e-4;  // q8_0, iq4_nl

// AVX2 versions. REQUIRES: dim % 32 == 0 (rows are whole blocks); k/v hold tokens*dim/32 blocks
// of `kind`; q, p, s, acc as in Codec::scores / Codec::accumulate; 1 <= n_q <= kMaxGroupHeads.
void ScoresGgmlAvx2(GgmlKind kind, const std::byte* k, uint32_t tokens, uint32_t dim, const float* q,
                    uint32_t n_q, float* s);
void AccumulateGgmlAvx2(GgmlKind kind, const std::byte* v, uint32_t tokens, uint32_t dim,
                        const float* p, uint32_t n_q, float* acc);

}  // namespace argus::codec_internal
