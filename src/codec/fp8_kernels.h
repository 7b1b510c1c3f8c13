// Kernels of the FP8 codecs (fp8_e4m3, fp8_e5m2). Scalar versions live in fp8.cc.
#pragma once

#include <cstdint>

namespace argus::codec_internal {

// AVX2 versions (fp8_avx2.cc). codes: [tokens, dim] FP8 codes (E4M3 when `e4m3`, else E5M2),
// each value code * scale; q, p, s, acc as in Codec. A bool rather than Fp8Format keeps
// argus/core.h (and its std:: templates) out of the AVX2 translation unit.
void ScoresFp8Avx2(bool e4m3, const uint8_t* codes, float scale, uint32_t tokens, uint32_t dim,
                   const float* q, uint32_t n_q, float* s);
void AccumulateFp8Avx2(bool e4m3, const uint8_t* codes, float scale, uint32_t tokens, uint32_t dim,
                       const float* p, uint32_t n_q, float* acc);

}  // namespace argus::codec_internal
