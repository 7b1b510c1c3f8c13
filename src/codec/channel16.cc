// chan3, chan2: keys coded per channel over groups of 16 tokens (KIVI's key grouping, at the
// smallest page ARGUS uses), with an 11-bit offset and step per channel: 3.73 and 2.73 bits per
// value at head_dim 64. A channel's range over 16 tokens is what its codes span, so outlier
// channels and channel means cost no precision elsewhere.
//
// Tile: ceil(tokens / 16) group headers (codes64.h: fp16 base, unit, top, then per channel a
// 5-bit offset o and 6-bit exponent e), then the tile's codes as code blocks of 64 values in
// row-major order. Value of token t, channel d, group g = t / 16:
//   x' = (base_g + o * unit_g) + (top_g * 2^(-e/8)) * code
// computed in float as written, with 2^(-e/8) from kChannelStepFactor.
//
// Encoding, per group: base is the fp16 at or below the least channel minimum and unit the fp16
// at or above (greatest channel minimum - base) / 31; o is the largest offset whose minimum is at
// or below the channel's; top is the fp16 at or above the largest step a channel needs ((max -
// minimum') / (2^bits - 1)); e the largest exponent whose step is at least the channel's need
// (63 when even that is more). Codes round to nearest and clamp at the top code, so
// |x - x'| <= step / 2 (plus float rounding), as for the affine codecs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "argus/core.h"
#include "codec/affine_kernels.h"
#include "codec/codec_internal.h"
#include "codec/codes64.h"

namespace argus::codec_internal {
namespace {

constexpr uint32_t kMaxOffset = (1u << kChannelOffsetBits) - 1;
constexpr uint32_t kMaxExponent = (1u << kChannelExponentBits) - 1;
constexpr uint32_t kParamBits = kChannelOffsetBits + kChannelExponentBits;

void StoreParam(std::byte* params, uint32_t d, uint32_t value) {
  for (uint32_t i = 0; i < kParamBits; ++i) {
    const uint32_t bit = d * kParamBits + i;
    params[bit / 8] |= static_cast<std::byte>(((value >> i) & 1) << (bit % 8));
  }
}

// One 8-byte load: a header's fields are followed by at least the 16 bytes of a code block
// (headers come first, codes last), so the load stays inside the tile.
uint32_t LoadParam(const std::byte* params, uint32_t d) {
  const uint32_t first = d * kParamBits;
  uint64_t window;
  std::memcpy(&window, params + first / 8, 8);
  return static_cast<uint32_t>(window >> (first % 8)) & ((1u << kParamBits) - 1);
}

class Channel16Codec final : public CodecBase {
 public:
  Channel16Codec(CodecInfo info, KernelPath path, uint32_t bits)
      : CodecBase(std::move(info), path, KernelPath::kAvx512), bits_(bits) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return CodesOffset(shape) + NumBlocks64(shape) * CodeBlockBytes(bits_);
  }

 private:
  static size_t NumGroups(TileShape shape) {
    return (shape.tokens + kChannelGroupTokens - 1) / kChannelGroupTokens;
  }
  static size_t NumBlocks64(TileShape shape) {
    return (shape.n_values() + kCodeBlockValues - 1) / kCodeBlockValues;
  }
  static size_t CodesOffset(TileShape shape) {
    return NumGroups(shape) * ChannelMetaBytes(shape.dim);
  }

  // Encodes group g's header; its channels' minimums and steps into min[dim], step[dim].
  void EncodeGroup(const float* x, TileShape shape, uint32_t g, std::byte* meta, float* min,
                   float* step) const {
    const uint32_t first = g * kChannelGroupTokens,
                   count = std::min(kChannelGroupTokens, shape.tokens - first);
    std::vector<float> lo(shape.dim), hi(shape.dim);
    for (uint32_t d = 0; d < shape.dim; ++d) {
      FoldRange(x + size_t{first} * shape.dim + d, count, shape.dim, &lo[d], &hi[d]);
    }
    const auto [least, most] = std::minmax_element(lo.begin(), lo.end());
    const uint16_t base_h = HalfRoundDown(*least);
    const float base = HalfToFloat(base_h);
    const uint16_t unit_h = HalfRoundUp((double{*most} - base) / kMaxOffset);
    const float unit = HalfToFloat(unit_h);
    const float levels = static_cast<float>((1u << bits_) - 1);
    std::vector<uint32_t> offset(shape.dim);
    double top_need = 0;
    for (uint32_t d = 0; d < shape.dim; ++d) {
      uint32_t o = unit > 0 ? static_cast<uint32_t>(std::min<double>(
                                  kMaxOffset, std::floor((double{lo[d]} - base) / unit)))
                            : 0;
      while (o > 0 && base + static_cast<float>(o) * unit > lo[d]) --o;
      offset[d] = o;
      min[d] = base + static_cast<float>(o) * unit;
      top_need = std::max(top_need, (double{hi[d]} - min[d]) / levels);
    }
    const uint16_t top_h = HalfRoundUp(top_need);
    const float top = HalfToFloat(top_h);
    StoreU16(meta, base_h);
    StoreU16(meta + 2, unit_h);
    StoreU16(meta + 4, top_h);
    for (uint32_t d = 0; d < shape.dim; ++d) {
      const double need = (double{hi[d]} - min[d]) / levels;
      uint32_t e = kMaxExponent;
      while (e > 0 && top * kChannelStepFactor[e] < need) --e;
      step[d] = top * kChannelStepFactor[e];
      StoreParam(meta + 6, d, offset[d] | e << kChannelOffsetBits);
    }
  }

  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    if (!WithinHalfRange(x, shape.n_values())) {
      return Status::InvalidArgument(info_.name +
                                     ": input values must be finite and within +-65504 "
                                     "(the range of its fp16 headers)");
    }
    std::fill(out.begin(), out.end(), std::byte{0});
    std::vector<float> min(shape.dim), step(shape.dim);
    std::vector<uint8_t> codes(NumBlocks64(shape) * kCodeBlockValues, 0);
    const float top_code = static_cast<float>((1u << bits_) - 1);
    for (uint32_t g = 0; g < NumGroups(shape); ++g) {
      EncodeGroup(x, shape, g, out.data() + g * ChannelMetaBytes(shape.dim), min.data(),
                  step.data());
      const uint32_t first = g * kChannelGroupTokens,
                     count = std::min(kChannelGroupTokens, shape.tokens - first);
      for (size_t e = size_t{first} * shape.dim; e < (size_t{first} + count) * shape.dim; ++e) {
        const uint32_t d = static_cast<uint32_t>(e % shape.dim);
        const float c = step[d] > 0 ? std::floor((x[e] - min[d]) / step[d] + 0.5f) : 0.0f;
        codes[e] = static_cast<uint8_t>(std::clamp(c, 0.0f, top_code));
      }
    }
    std::byte* blocks = out.data() + CodesOffset(shape);
    for (size_t b = 0; b < NumBlocks64(shape); ++b) {
      PackCodes64(&codes[b * kCodeBlockValues], bits_, blocks + b * CodeBlockBytes(bits_));
    }
    return Status::Ok();
  }

  // Group g's channel minimums and steps, min[dim] and step[dim]; Corruption when its header
  // holds a non-finite or negative field.
  Status GroupParams(const std::byte* tile, TileShape shape, uint32_t g, float* min,
                     float* step) const {
    const std::byte* meta = tile + g * ChannelMetaBytes(shape.dim);
    const float base = HalfToFloat(LoadU16(meta)), unit = HalfToFloat(LoadU16(meta + 2)),
                top = HalfToFloat(LoadU16(meta + 4));
    if (!std::isfinite(base) || !(unit >= 0 && unit <= kHalfMax) ||
        !(top >= 0 && top <= kHalfMax)) {
      return Status::Corruption(info_.name + ": group " + std::to_string(g) +
                                " has a non-finite or negative header field");
    }
    if (path_ == KernelPath::kAvx512 && shape.dim % 16 == 0) {
      ChannelParamsAvx512(meta + 6, shape.dim, base, unit, top, min, step);
      return Status::Ok();
    }
    if (path_ == KernelPath::kAvx2 && shape.dim % 8 == 0) {
      ChannelParamsAvx2(meta + 6, shape.dim, base, unit, top, min, step);
      return Status::Ok();
    }
    for (uint32_t d = 0; d < shape.dim; ++d) {
      const uint32_t param = LoadParam(meta + 6, d);
      min[d] = base + static_cast<float>(param & kMaxOffset) * unit;
      step[d] = top * kChannelStepFactor[param >> kChannelOffsetBits];
    }
    return Status::Ok();
  }

  // Calls f(g, first, count, min, step) for every group with its decoded parameters.
  template <typename F>
  Status ForEachGroup(const std::byte* tile, TileShape shape, F f) const {
    float min[kMaxTileDim], step[kMaxTileDim];
    for (uint32_t g = 0; g < NumGroups(shape); ++g) {
      ARGUS_RETURN_IF_ERROR(GroupParams(tile, shape, g, min, step));
      const uint32_t first = g * kChannelGroupTokens;
      f(first, std::min(kChannelGroupTokens, shape.tokens - first), min, step);
    }
    return Status::Ok();
  }

  // Token t's row from its group's parameters: the specification of every kernel.
  void DecodeRow(const std::byte* tile, TileShape shape, uint32_t t, const float* min,
                 const float* step, float* row) const {
    const std::byte* blocks = tile + CodesOffset(shape);
    for (uint32_t d = 0; d < shape.dim; ++d) {
      const size_t e = size_t{t} * shape.dim + d;
      const uint32_t code = CodeAt(blocks + e / kCodeBlockValues * CodeBlockBytes(bits_), bits_,
                                   static_cast<uint32_t>(e % kCodeBlockValues));
      row[d] = min[d] + step[d] * static_cast<float>(code);
    }
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    return ForEachGroup(in.data(), shape,
                        [&](uint32_t first, uint32_t count, const float* min, const float* step) {
                          for (uint32_t t = first; t < first + count; ++t)
                            DecodeRow(in.data(), shape, t, min, step, x + size_t{t} * shape.dim);
                        });
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    const bool vector = path_ >= KernelPath::kAvx2 && shape.dim % kCodeBlockValues == 0;
    float row[kMaxTileDim];
    return ForEachGroup(
        k.data(), shape, [&](uint32_t first, uint32_t count, const float* min, const float* step) {
          if (vector) {
            const std::byte* codes =
                k.data() + CodesOffset(shape) +
                size_t{first} * shape.dim / kCodeBlockValues * CodeBlockBytes(bits_);
            (path_ == KernelPath::kAvx512 ? ChannelScoresAvx512 : ChannelScoresAvx2)(
                codes, bits_, count, shape.dim, min, step, q, n_q, s + first, shape.tokens);
            return;
          }
          for (uint32_t t = first; t < first + count; ++t) {
            DecodeRow(k.data(), shape, t, min, step, row);
            for (uint32_t i = 0; i < n_q; ++i) {
              float dot = 0;
              for (uint32_t d = 0; d < shape.dim; ++d) dot += q[size_t{i} * shape.dim + d] * row[d];
              s[size_t{i} * shape.tokens + t] = dot;
            }
          }
        });
  }

  uint32_t bits_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeChannel16Codec(const CodecSpec& spec) {
  uint32_t bits;
  if (spec.name == "chan3") {
    bits = 3;
  } else if (spec.name == "chan2") {
    bits = 2;
  } else {
    return Status::NotFound("no 16-token channel codec named '" + spec.name + "'");
  }
  CodecInfo info;
  info.name = spec.name;
  info.code_bits = bits;
  info.role = CodecRole::kKeys;
  info.summary = std::to_string(bits) +
                 "-bit keys per channel over 16 tokens, an 11-bit offset and step per channel";
  // The vector scores round q * step to int8 per 64 channels; as for int*:channel no bound
  // relative to ||q|| ||k'|| exists, so this is about twice the largest error measured on the
  // conformance tiles (0.021). The scalar path sums in float.
  info.fused_rel_error = 0.05;
  auto codec = std::make_unique<Channel16Codec>(std::move(info), spec.path, bits);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
