// Scalar number formats: the specification the vector kernels are tested against.
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "argus/core.h"
#include "core/checked.h"
#include "core/fp8.h"

namespace argus {

Result<size_t> CheckedMul(size_t a, size_t b, std::string_view what) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    return Status::InvalidArgument(std::string(what) + ": size overflow (" + std::to_string(a) +
                                   " x " + std::to_string(b) + ")");
  }
  return r;
}

Result<size_t> CheckedAdd(size_t a, size_t b, std::string_view what) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    return Status::InvalidArgument(std::string(what) + ": size overflow (" + std::to_string(a) +
                                   " + " + std::to_string(b) + ")");
  }
  return r;
}

namespace {

// Rounds `value >> shift` to nearest, ties to even. REQUIRES: 1 <= shift <= 31.
uint32_t ShiftRoundEven(uint32_t value, uint32_t shift) {
  uint32_t kept = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1))) ++kept;
  return kept;
}

}  // namespace

uint16_t FloatToHalf(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00 | ((a >> 13) & 0x3ff);  // NaN, quiet, payload kept
  if (a >= 0x38800000u) {                                           // normal in half, or overflow
    uint32_t h = ShiftRoundEven(a - 0x38000000u, 13);               // rebias 127 -> 15
    return sign | static_cast<uint16_t>(h >= 0x7c00 ? 0x7c00 : h);
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
  uint32_t exponent = a >> 23;
  uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  // Units of 2^-24 (the half subnormal quantum); a carry into bit 10 is the smallest normal.
  return sign | static_cast<uint16_t>(ShiftRoundEven(mantissa, 126 - exponent));
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

uint16_t FloatToBf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

namespace {

struct Fp8Params {
  uint32_t mantissa_bits, bias, max_code;
};

Fp8Params ParamsOf(Fp8Format format) {
  // E4M3 has no infinities: 0x7f is NaN, 0x7e (448) the largest finite. E5M2 is IEEE-like:
  // 0x7c is Inf, 0x7b (57344) the largest finite.
  return format == Fp8Format::kE4M3 ? Fp8Params{3, 7, 0x7e} : Fp8Params{2, 15, 0x7b};
}

}  // namespace

uint8_t FloatToFp8(float x, Fp8Format format) {
  const Fp8Params p = ParamsOf(format);
  uint32_t bits = std::bit_cast<uint32_t>(x);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN (sign dropped, as CUDA's conversion does)
  if (a >= 0x7f800000u) return sign | static_cast<uint8_t>(p.max_code);
  int exponent = static_cast<int>(a >> 23) - 127;
  uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const int min_exponent = 1 - static_cast<int>(p.bias);
  uint32_t code;
  if (exponent >= min_exponent) {
    // Rebias and round the mantissa to p.mantissa_bits; a carry moves into the exponent field.
    uint32_t rebiased =
        (static_cast<uint32_t>(exponent + static_cast<int>(p.bias)) << 23) | (a & 0x7fffffu);
    code = ShiftRoundEven(rebiased, 23 - p.mantissa_bits);
  } else {
    // Subnormal: count quanta of 2^(min_exponent - mantissa_bits).
    int shift = 23 + min_exponent - static_cast<int>(p.mantissa_bits) - exponent;
    code = shift > 31 ? 0 : ShiftRoundEven(mantissa, static_cast<uint32_t>(shift));
  }
  if (code > p.max_code) code = p.max_code;  // saturate to the largest finite value
  return sign | static_cast<uint8_t>(code);
}

float Fp8ToFloat(uint8_t code, Fp8Format format) {
  const Fp8Params p = ParamsOf(format);
  bool negative = code & 0x80;
  uint32_t magnitude = code & 0x7fu;
  uint32_t exponent = magnitude >> p.mantissa_bits;
  uint32_t mantissa = magnitude & ((1u << p.mantissa_bits) - 1);
  float value;
  if (format == Fp8Format::kE4M3 && magnitude == 0x7f) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (format == Fp8Format::kE5M2 && exponent == 0x1f) {
    value =
        mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa),
                       1 - static_cast<int>(p.bias) - static_cast<int>(p.mantissa_bits));
  } else {
    value = std::ldexp(
        1.0f + std::ldexp(static_cast<float>(mantissa), -static_cast<int>(p.mantissa_bits)),
        static_cast<int>(exponent) - static_cast<int>(p.bias));
  }
  return negative ? -value : value;
}

float Fp8MaxFinite(Fp8Format format) { return format == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

}  // namespace argus
