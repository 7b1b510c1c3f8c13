// 2- and 3-bit codes in blocks of 64 values, shared by the non-uniform codecs (nl3, nl2:
// nonuniform.cc) and the 16-token channel codecs (chan3, chan2: channel16.cc). Raw types only:
// the kernel files (codes64_avx2.cc, codes64_avx512.cc) include this.
//
// A tile's values are cut in row-major order into blocks of 64 (the last one zero-padded). A
// code block is 16 bytes holding the low 2 bits of each code, code j at bit 2 (j / 16) of byte
// j % 16, and for 3-bit codes 8 more bytes holding the high bit, code j at bit j % 8 of byte
// j / 8. Why: one 16-byte load and four shifts give the low bits of codes 0-15, 16-31, 32-47 and
// 48-63 in order, and one byte shuffle spreads the high bits over them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace argus::codec_internal {

inline constexpr uint32_t kCodeBlockValues = 64;
inline constexpr uint32_t CodeBlockBytes(uint32_t bits) { return bits == 3 ? 24 : 16; }

// codes[64] (each < 2^bits) into a zeroed code block, and back; code j (< 64) of a block.
// Defined in codes64.cc.
void PackCodes64(const uint8_t* codes, uint32_t bits, std::byte* block);
void UnpackCodes64(const std::byte* block, uint32_t bits, uint8_t* codes);
uint32_t CodeAt(const std::byte* block, uint32_t bits, uint32_t j);

// ---- nl3, nl2: x' = d * level[code], one fp16 d per block ------------------------------------
// Lloyd-Max levels of a unit Gaussian (±0.2451, ±0.7560, ±1.3440, ±2.1520 for 3 bits; ±0.4528,
// ±1.5104 for 2), scaled so that the outermost is 127 and rounded: the int8 values are the
// definition. Padded with zeros to 16 entries, the table of a byte shuffle by code.
inline constexpr int8_t kNl3Levels[16] = {-127, -79, -45, -14, 14, 45, 79, 127};
inline constexpr int8_t kNl2Levels[16] = {-127, -38, 38, 127};
inline const int8_t* NlLevels(uint32_t bits) { return bits == 3 ? kNl3Levels : kNl2Levels; }
// Bytes of an encoded block: fp16 d, then the code block.
inline constexpr uint32_t NlBlockBytes(uint32_t bits) { return 2 + CodeBlockBytes(bits); }

// ---- chan3, chan2: x' = min_d + step_d * code, per channel d over 16 tokens ------------------
inline constexpr uint32_t kChannelGroupTokens = 16;
// A group's header: fp16 base, unit, top, then 11 bits per channel (little-endian bit stream):
// a 5-bit offset o (min_d = base + o * unit) and a 6-bit exponent e (step_d = top * 2^(-e/8)).
inline constexpr uint32_t kChannelOffsetBits = 5, kChannelExponentBits = 6;
inline constexpr uint32_t ChannelMetaBytes(uint32_t dim) {
  return 6 + (dim * (kChannelOffsetBits + kChannelExponentBits) + 7) / 8;
}
// 2^(-e/8) for e < 64, as decoding uses it.
extern const float kChannelStepFactor[64];

// AVX2 kernels (codes64_avx2.cc) and AVX-512 ones (codes64_avx512.cc); nl's accumulate
// multiplies integers on AVX-512 only (REQUIRES there: finite p >= 0). REQUIRES: 64 | dim; q,
// s, p, acc as in Codec.
// nl: the tile is the blocks in order, NlBlockBytes(bits) each.
void NlScoresAvx2(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                  const float* q, uint32_t n_q, float* s);
void NlAccumulateAvx2(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                      const float* p, uint32_t n_q, float* acc);
// chan: the `count` tokens of one group, whose first code block `codes` starts (64 | dim), with
// the group's decoded min[dim] and step[dim]; s[i * s_stride + t] for t < count.
void ChannelScoresAvx2(const std::byte* codes, uint32_t bits, uint32_t count, uint32_t dim,
                       const float* min, const float* step, const float* q, uint32_t n_q, float* s,
                       uint32_t s_stride);
void NlScoresAvx512(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                    const float* q, uint32_t n_q, float* s);
void NlAccumulateAvx512(const std::byte* tile, uint32_t bits, uint32_t tokens, uint32_t dim,
                        const float* p, uint32_t n_q, float* acc);
// A group header's fields (after base, unit, top) decoded as GroupParams does (8 | dim for AVX2,
// 16 | dim for AVX-512).
void ChannelParamsAvx2(const std::byte* fields, uint32_t dim, float base, float unit, float top,
                       float* min, float* step);
void ChannelParamsAvx512(const std::byte* fields, uint32_t dim, float base, float unit, float top,
                         float* min, float* step);
void ChannelScoresAvx512(const std::byte* codes, uint32_t bits, uint32_t count, uint32_t dim,
                         const float* min, const float* step, const float* q, uint32_t n_q,
                         float* s, uint32_t s_stride);

}  // namespace argus::codec_internal
