// Kernels of the plain float codecs (f32, f16, bf16). Scalar versions live in float.cc.
#pragma once

#include <cstddef>
#include <cstdint>

namespace argus::codec_internal {

enum class FloatKind : uint8_t { kF32, kF16, kBf16 };

// kMaxTileDim, for kernel files that include no public header (float.cc checks they agree): the
// AVX-512 scores keep a query table and 16 widened keys of this many channels on the stack.
inline constexpr uint32_t kFloatKernelMaxDim = 1024;

// AVX2 versions (float_avx2.cc). k/v: [tokens, dim] of `kind`; q, p, s, acc as in Codec.
void ScoresFloatAvx2(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                     uint32_t n_q, float* s);
// x: n floats <-> out/in: n values of `kind`. Bit-identical to the scalar conversions in core
// (round to nearest even; NaN stays NaN with its payload's top bits).
void EncodeFloatAvx2(FloatKind kind, const float* x, size_t n, void* out);
void DecodeFloatAvx2(FloatKind kind, const void* in, size_t n, float* x);
void AccumulateFloatAvx2(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                         const float* p, uint32_t n_q, float* acc);

// AVX-512 versions of the fused kernels (float_avx512.cc); encode and decode stay AVX2.
void ScoresFloatAvx512(FloatKind kind, const void* k, uint32_t tokens, uint32_t dim, const float* q,
                       uint32_t n_q, float* s);
void AccumulateFloatAvx512(FloatKind kind, const void* v, uint32_t tokens, uint32_t dim,
                           const float* p, uint32_t n_q, float* acc);

}  // namespace argus::codec_internal
