// The gated activation of the feed-forward block, gate[i] = silu(gate[i]) * up[i] with
// silu(g) = g sigmoid(g), for a whole batch of rows at once. Not a public header.
//
// It is computed as g / (1 + exp(-g)), as ggml computes it. The scalar kernel in activation.cc is
// the specification; the AVX2 and AVX-512 kernels take exp from core/exp_avx2.h (Cephes' expf,
// about 1 ulp, and no argument above 88), and every kernel is within 3 ulp (of 2^-23, relative) of
// the exact value. Below g = kExpUnderflow (-87.3), where |silu(g)| < 1.1e-36, the vector kernels
// give exactly 0 and the scalar one the denormal or zero quotient.
#pragma once

#include <cstddef>

#include "argus/codec.h"

namespace argus::model {

// REQUIRES: path <= BestKernelPath().
void SiluMul(KernelPath path, float* gate, const float* up, size_t n);

void SiluMulAvx2(float* gate, const float* up, size_t n);
void SiluMulAvx512(float* gate, const float* up, size_t n);

}  // namespace argus::model
