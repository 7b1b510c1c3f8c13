// plane8, plane8/4, plane8/2: an 8-bit symmetric code stored as bit planes, most significant
// first (2 + 2 + 4 bits), with one fp16 step d per block of 32 values in row-major order.
//
// Layout: [fp16 d x n_blocks][plane A: code bits 7-6][plane B: bits 5-4][plane C: bits 3-0].
// Blocks, the d order (TokenMetaIndex) and the coded matrix are those of the affine token codecs;
// each plane is in the panel layout of affine_kernels.h (2, 2 and 4 bits wide). plane8/4 is
// [d][A][B] and plane8/2 is [d][A]: each tile is the first bytes of the longer one, so demoting
// a page drops its last planes and re-quantises nothing. 8.5, 4.5 and 2.5 bits per value.
//
// Code: d = the fp16 at or above amax / 127.5, c = clamp(round(x / d + 127.5), 0, 255),
// x' = (c - 127.5) d. A k-bit prefix p = c >> (8 - k) decodes at the midpoint of the dropped
// bits, c' = p 2^(8-k) + (2^(8-k) - 1) / 2, that is x' = (p - (2^k - 1) / 2) 2^(8-k) d; the
// codes are symmetric around 0. Rounding d up keeps every x / d within +-127.5, so no code is
// clamped: |x - x'| <= d / 2 for the full code and <= 2^(7-k) d for a k-bit prefix (the encoder's
// division adds at most 2^-15 d; decoding is exact). The fused kernels are the affine token ones
// with scale 2^(8-k) d and minimum -(2^k - 1) / 2 times that (see affine.cc for their error).
#include <algorithm>
#include <cmath>
#include <vector>

#include "argus/core.h"
#include "codec/affine_kernels.h"
#include "codec/codec_internal.h"
#include "codec/panel_codec.h"

namespace argus::codec_internal {
namespace {

constexpr uint32_t kPlaneWidths[] = {2, 2, 4};  // A, B, C: most significant first

class PlaneCodec final : public PanelCodec {
 public:
  PlaneCodec(CodecInfo info, KernelPath path, uint32_t prefix_bits)
      : PanelCodec(std::move(info), path), prefix_bits_(prefix_bits) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    uint32_t n_rows, row_len;
    TokenRows(shape.tokens, shape.dim, &n_rows, &row_len);
    size_t n_bytes = 2 * NumBlocks(shape);
    for (uint32_t i = 0, bits = 0; bits < prefix_bits_; bits += kPlaneWidths[i++]) {
      n_bytes += PlaneBytes(n_rows, row_len, kPlaneWidths[i]);
    }
    return n_bytes;
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    if (!WithinHalfRange(x, shape.n_values())) {
      return Status::InvalidArgument(info_.name +
                                     ": input values must be finite and within +-65504 "
                                     "(the range of its fp16 steps)");
    }
    uint32_t n_rows, row_len;
    TokenRows(shape.tokens, shape.dim, &n_rows, &row_len);
    std::fill(out.begin(), out.end(), std::byte{0});
    std::vector<uint8_t> codes(size_t{n_rows} * row_len, 0);
    const size_t n = shape.n_values(), n_blocks = NumBlocks(shape);
    const uint32_t blocks_per_row = row_len / kAffineGroup;
    for (size_t b = 0; b < n_blocks; ++b) {
      const size_t first = b * kAffineGroup, count = std::min<size_t>(kAffineGroup, n - first);
      float amax = 0;
      for (size_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[first + i]));
      const uint16_t d_h = HalfRoundUp(amax / 127.5);
      const float d = HalfToFloat(d_h), inv = d > 0 ? 1.0f / d : 0.0f;
      StoreU16(out.data() + 2 * TokenMetaIndex(n_rows, row_len,
                                               static_cast<uint32_t>(b / blocks_per_row),
                                               static_cast<uint32_t>(b % blocks_per_row)),
               d_h);
      for (size_t i = 0; i < count; ++i) {
        codes[first + i] =
            static_cast<uint8_t>(std::clamp(std::floor(x[first + i] * inv + 128.0f), 0.0f, 255.0f));
      }
    }
    std::byte* plane = out.data() + 2 * n_blocks;
    for (uint32_t i = 0, bits = 0; bits < prefix_bits_; bits += kPlaneWidths[i++]) {
      StorePanelPlane(codes.data(), n_rows, row_len, kPlaneWidths[i], 8 - bits - kPlaneWidths[i],
                      plane);
      plane += PlaneBytes(n_rows, row_len, kPlaneWidths[i]);
    }
    return Status::Ok();
  }

 public:
  static CodeLayout Layout(uint32_t prefix_bits) {
    return prefix_bits == 8   ? CodeLayout::kPlanes224
           : prefix_bits == 4 ? CodeLayout::kPlanes22
                              : CodeLayout::kBits2;
  }

 private:
  CodedTile View(const std::byte* bytes, TileShape shape) const override {
    CodedTile t;
    t.code = Layout(prefix_bits_);
    t.meta = MetaLayout::kTokenStep;
    t.tokens = shape.tokens;
    t.dim = shape.dim;
    TokenRows(shape.tokens, shape.dim, &t.n_rows, &t.row_len);
    t.scales = bytes;
    const std::byte* plane = bytes + 2 * NumBlocks(shape);
    for (uint32_t i = 0, bits = 0; bits < prefix_bits_; bits += kPlaneWidths[i++]) {
      t.planes[i] = plane;
      plane += PlaneBytes(t.n_rows, t.row_len, kPlaneWidths[i]);
    }
    t.step_mul = static_cast<float>(1u << (8 - prefix_bits_));
    return t;
  }

  uint32_t prefix_bits_;  // 8, 4 or 2
};

}  // namespace

Result<std::unique_ptr<Codec>> MakePlaneCodec(const CodecSpec& spec) {
  uint32_t bits;
  if (spec.name == "plane8") {
    bits = 8;
  } else if (spec.name == "plane8/4") {
    bits = 4;
  } else if (spec.name == "plane8/2") {
    bits = 2;
  } else {
    return Status::NotFound("no bit-plane codec named '" + spec.name + "'");
  }
  CodecInfo info;
  info.name = spec.name;
  info.code_bits = bits;
  info.role = CodecRole::kBoth;
  info.summary = bits == 8 ? "8-bit symmetric codes in MSB-first bit planes; demotes to plane8/4, "
                             "plane8/2 by truncation"
                           : "the " + std::to_string(bits) +
                                 "-bit prefix of plane8: its first bytes, decoded at the midpoint";
  info.fused_rel_error = PanelFusedRelError(PlaneCodec::Layout(bits), MetaLayout::kTokenStep);
  auto codec = std::make_unique<PlaneCodec>(std::move(info), spec.path, bits);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
