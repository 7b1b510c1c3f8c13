// The gated activation of the feed-forward block, gate[i] = silu(gate[i]) * up[i] with
// silu(g) = g sigmoid(g), for a whole batch of rows at once. Not a public header.
//
// sigmoid is computed from e = exp(-|g|), which never overflows: 1 / (1 + e) for g >= 0, e / (1 +
// e) below. The scalar kernel in activation.cc is the specification; the AVX2 and AVX-512 kernels
// take exp from core/exp_avx2.h (Cephes' expf, about 1 ulp); every kernel is within 3 ulp (of
// 2^-23, relative) of the exact value.
// Below g = -87.3 they give exactly -0 (e^g under float's normal range), where the scalar
// kernel gives the denormal or zero product.
#pragma once

#include <cstddef>

#include "argus/codec.h"

namespace argus::model {

// REQUIRES: path <= BestKernelPath().
void SiluMul(KernelPath path, float* gate, const float* up, size_t n);

void SiluMulAvx2(float* gate, const float* up, size_t n);
void SiluMulAvx512(float* gate, const float* up, size_t n);

}  // namespace argus::model
