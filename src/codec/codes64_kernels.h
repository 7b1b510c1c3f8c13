// The scores loop of the nl kernels, shared by codes64_avx2.cc and codes64_avx512.cc. Each
// instantiates it with a struct Isa, in its anonymous namespace, of the pieces that depend on
// the vector width:
//   NlRows(tile, bits, dim, first, count, x)   rows [first, first + count) of an nl tile as
//                                              floats, x[count][dim]
//   Dot8Rows(rows, q, dim, out)                out[r] = rows[r] . q for rows[8][dim], each row
//                                              with its own sum and the same reduction
// The template has internal linkage: each file's copy is compiled with its own instructions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/codes64.h"

namespace argus::codec_internal {
namespace {

// Rows are decoded kChunkTokens at a time, then every head runs over them.
constexpr uint32_t kChunkTokens = 16;

template <typename Isa>
void NlScores(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim, const float* q,
              uint32_t n_q, float* s) {
  alignas(64) float x[kChunkTokens * kMaxTileDim];
  for (uint32_t first = 0; first < tokens; first += kChunkTokens) {
    const uint32_t count = tokens - first < kChunkTokens ? tokens - first : kChunkTokens;
    Isa::NlRows(tile, bits, dim, first, count, x);
    // Rows past count are zero, so every block of 8 is whole.
    const uint32_t padded = (count + 7) / 8 * 8;
    for (size_t e = size_t{count} * dim; e < size_t{padded} * dim; ++e) x[e] = 0.0f;
    for (uint32_t i = 0; i < n_q; ++i) {
      for (uint32_t t = 0; t < padded; t += 8) {
        alignas(32) float out[8];
        Isa::Dot8Rows(x + size_t{t} * dim, q + size_t{i} * dim, dim, out);
        for (uint32_t r = 0; r < 8 && t + r < count; ++r)
          s[size_t{i} * tokens + first + t + r] = out[r];
      }
    }
  }
}

}  // namespace
}  // namespace argus::codec_internal
