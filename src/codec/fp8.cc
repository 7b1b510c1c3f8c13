// fp8_e4m3, fp8_e5m2: OCP FP8 codes (round to nearest even, saturating; see FloatToFp8) under
// one fp32 scale per tile.
//
// Tile layout (little-endian, any alignment), n = tokens * dim:
//   [0, 4)      f32  scale: amax / Fp8MaxFinite(format), at least FLT_MIN; 1 for an all-zero
//                    tile
//   [4, 4 + n)  u8   codes, row-major [tokens, dim]; value = Fp8ToFloat(code) * scale
//
// Error per element, with m mantissa bits and exponent bias b (E4M3: m = 3, b = 7; E5M2: m = 2,
// b = 15): values at or above the smallest normal (2^(1-b) * scale) round to half an ulp of
// their binade, below it to half the subnormal quantum 2^(1-b-m) * scale, so
//   |x' - x| <= 2^-(m+1) |x| + 2^-(b+m) scale      (E4M3: |x|/16 + scale/1024,
//                                                    E5M2: |x|/8 + scale/131072)
// up to float rounding of x / scale and code * scale (2^-23 |x|). Saturation adds no more than
// that rounding: |x| / scale <= Fp8MaxFinite up to it, by the choice of scale.
//
// Non-finite input is refused (InvalidArgument): a NaN or Inf would become the tile's scale.
#include "core/fp8.h"

#include <array>
#include <cmath>
#include <limits>

#include "codec/codec_internal.h"
#include "codec/fp8_kernels.h"

namespace argus::codec_internal {
namespace {

constexpr size_t kScaleBytes = 4;

// Fp8ToFloat of every code, per format (the specification, tabulated).
const float* ValueTable(Fp8Format format) {
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (int c = 0; c < 256; ++c)
        t[static_cast<size_t>(f)][c] = Fp8ToFloat(static_cast<uint8_t>(c), f);
    }
    return t;
  }();
  return tables[static_cast<size_t>(format)].data();
}

class Fp8Codec final : public CodecBase {
 public:
  Fp8Codec(CodecInfo info, KernelPath path, Fp8Format format)
      : CodecBase(std::move(info), path),
        format_(format),
        max_finite_(Fp8MaxFinite(format)),
        table_(ValueTable(format)) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return kScaleBytes + shape.n_values();
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    ARGUS_RETURN_IF_ERROR(CheckFinite(x, shape));
    float amax = 0;
    for (size_t i = 0; i < shape.n_values(); ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = TileScale(amax);
    StoreF32(out.data(), scale);
    uint8_t* codes = reinterpret_cast<uint8_t*>(out.data() + kScaleBytes);
    for (size_t i = 0; i < shape.n_values(); ++i) codes[i] = FloatToFp8(x[i] / scale, format_);
    return Status::Ok();
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    ARGUS_ASSIGN_OR_RETURN(const float scale, ReadScale(in));
    const uint8_t* codes = Codes(in);
    for (size_t i = 0; i < shape.n_values(); ++i) x[i] = table_[codes[i]] * scale;
    return Status::Ok();
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    ARGUS_ASSIGN_OR_RETURN(const float scale, ReadScale(k));
    if (path_ == KernelPath::kAvx2) {
      ScoresFp8Avx2(format_ == Fp8Format::kE4M3, Codes(k), scale, shape.tokens, shape.dim, q, n_q,
                    s);
      return Status::Ok();
    }
    ScoresByRows(shape, q, n_q, s,
                 [&](uint32_t t, float* row) { DecodeRow(Codes(k), scale, shape, t, row); });
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    ARGUS_ASSIGN_OR_RETURN(const float scale, ReadScale(v));
    if (path_ == KernelPath::kAvx2) {
      AccumulateFp8Avx2(format_ == Fp8Format::kE4M3, Codes(v), scale, shape.tokens, shape.dim, p,
                        n_q, acc);
      return Status::Ok();
    }
    AccumulateByRows(shape, p, n_q, acc,
                     [&](uint32_t t, float* row) { DecodeRow(Codes(v), scale, shape, t, row); });
    return Status::Ok();
  }

  // amax / max_finite, kept normal (a tiny tile then uses the subnormal codes) and such that the
  // largest decoded value, max_finite * scale, stays finite (amax near FLT_MAX).
  float TileScale(float amax) const {
    if (amax == 0) return 1.0f;
    float scale = std::max(amax / max_finite_, std::numeric_limits<float>::min());
    while (!std::isfinite(scale * max_finite_)) scale = std::nextafter(scale, 0.0f);
    return scale;
  }

  // The scale field, checked to be one that encode can write (so the AVX2 kernels' folded
  // scale 2^8 * scale and every decoded value are finite).
  Result<float> ReadScale(std::span<const std::byte> tile) const {
    const float scale = LoadF32(tile.data());
    if (!(scale >= std::numeric_limits<float>::min()) || !std::isfinite(scale * max_finite_)) {
      return Status::Corruption(info_.name + " tile: scale " + std::to_string(scale) +
                                " is not a positive normal float with a finite largest value");
    }
    return scale;
  }

  static const uint8_t* Codes(std::span<const std::byte> tile) {
    return reinterpret_cast<const uint8_t*>(tile.data() + kScaleBytes);
  }

  void DecodeRow(const uint8_t* codes, float scale, TileShape shape, uint32_t t, float* row) const {
    const uint8_t* c = codes + size_t{t} * shape.dim;
    for (uint32_t d = 0; d < shape.dim; ++d) row[d] = table_[c[d]] * scale;
  }

  Fp8Format format_;
  float max_finite_;
  const float* table_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeFp8Codec(const CodecSpec& spec) {
  CodecInfo info;
  info.name = spec.name;
  info.code_bits = 8;
  info.role = CodecRole::kBoth;
  // Float accumulation as in the float codecs; the scale is applied once per dot product or
  // output block (one more rounding), so the stated bound is theirs.
  info.fused_rel_error = 1e-5;
  Fp8Format format;
  if (spec.name == "fp8_e4m3") {
    format = Fp8Format::kE4M3;
    info.summary = "OCP FP8 E4M3 with an fp32 scale per tile; relative error <= 1/16";
  } else if (spec.name == "fp8_e5m2") {
    format = Fp8Format::kE5M2;
    info.summary =
        "OCP FP8 E5M2 (wider range, 2 mantissa bits) with an fp32 scale per tile; relative error "
        "<= 1/8";
  } else {
    return Status::NotFound("no FP8 codec named '" + spec.name + "'");
  }
  auto codec = std::make_unique<Fp8Codec>(std::move(info), spec.path, format);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
