// Kernels of the plain float codecs (f32, f16, bf16). Scalar versions live in float.cc.
#pragma once

#include <cstdint>

namespace argus::codec_internal {

enum class FloatKind : uint8_t { kF32, kF16, kBf16 };

// AVX2 versions (float_avx2.cc). k/v: [tokens, dim] of `kind`; q, p, s, acc as in Codec.
void ScoresFloatAvx2(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                     uint32_t n_q, float* s);
void AccumulateFloatAvx2(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                         const float* p, uint32_t n_q, float* acc);

}  // namespace argus::codec_internal
