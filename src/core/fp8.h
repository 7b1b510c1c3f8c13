// Internal: OCP FP8 scalar conversions (the FP8 codecs' specification; vector kernels must agree
// with them bit for bit). Implemented in numbers.cc beside fp16 and bf16 (argus/core.h).
#pragma once

#include <cstdint>

namespace argus {

enum class Fp8Format : uint8_t { kE4M3 = 0, kE5M2 = 1 };  // append only: reaches encoded tiles
// OCP FP8, saturating: finite values beyond the largest finite code (and +-Inf) give that
// largest finite code with the input's sign; NaN gives a NaN code.
uint8_t FloatToFp8(float x, Fp8Format format);
float Fp8ToFloat(uint8_t code, Fp8Format format);
float Fp8MaxFinite(Fp8Format format);  // 448 (E4M3), 57344 (E5M2)

}  // namespace argus
