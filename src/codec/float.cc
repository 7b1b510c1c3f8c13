// f32, f16, bf16: plain row-major tiles, [tokens, dim] of 4 or 2 bytes per value.
#include "argus/core.h"
#include "codec/codec_internal.h"
#include "codec/float_kernels.h"

namespace argus::codec_internal {
namespace {

static_assert(kFloatKernelMaxDim == kMaxTileDim);

class FloatCodec final : public CodecBase {
 public:
  FloatCodec(CodecInfo info, KernelPath path, FloatKind kind)
      : CodecBase(std::move(info), path, KernelPath::kAvx512), kind_(kind) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return shape.n_values() * value_bytes();
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    if (path_ >= KernelPath::kAvx2) {
      EncodeFloatAvx2(kind_, x, shape.n_values(), out.data());
      return Status::Ok();
    }
    for (size_t i = 0; i < shape.n_values(); ++i) {
      switch (kind_) {
        case FloatKind::kF32:
          StoreF32(out.data() + 4 * i, x[i]);
          break;
        case FloatKind::kF16:
          StoreU16(out.data() + 2 * i, FloatToHalf(x[i]));
          break;
        case FloatKind::kBf16:
          StoreU16(out.data() + 2 * i, FloatToBf16(x[i]));
          break;
      }
    }
    return Status::Ok();
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    if (path_ >= KernelPath::kAvx2) {
      DecodeFloatAvx2(kind_, in.data(), shape.n_values(), x);
      return Status::Ok();
    }
    for (size_t i = 0; i < shape.n_values(); ++i) x[i] = Load(in.data(), i);
    return Status::Ok();
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    if (path_ == KernelPath::kAvx512) {
      ScoresFloatAvx512(kind_, k.data(), shape.tokens, shape.dim, q, n_q, s);
      return Status::Ok();
    }
    if (path_ == KernelPath::kAvx2) {
      ScoresFloatAvx2(kind_, k.data(), shape.tokens, shape.dim, q, n_q, s);
      return Status::Ok();
    }
    ScoresByRows(shape, q, n_q, s,
                 [&](uint32_t t, float* row) { DecodeRow(k.data(), shape, t, row); });
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    if (path_ == KernelPath::kAvx512) {
      AccumulateFloatAvx512(kind_, v.data(), shape.tokens, shape.dim, p, n_q, acc);
      return Status::Ok();
    }
    if (path_ == KernelPath::kAvx2) {
      AccumulateFloatAvx2(kind_, v.data(), shape.tokens, shape.dim, p, n_q, acc);
      return Status::Ok();
    }
    AccumulateByRows(shape, p, n_q, acc,
                     [&](uint32_t t, float* row) { DecodeRow(v.data(), shape, t, row); });
    return Status::Ok();
  }

  size_t value_bytes() const { return kind_ == FloatKind::kF32 ? 4 : 2; }
  float Load(const std::byte* base, size_t i) const {
    switch (kind_) {
      case FloatKind::kF32:
        return LoadF32(base + 4 * i);
      case FloatKind::kF16:
        return HalfToFloat(LoadU16(base + 2 * i));
      case FloatKind::kBf16:
        return Bf16ToFloat(LoadU16(base + 2 * i));
    }
    return 0;
  }
  void DecodeRow(const std::byte* base, TileShape shape, uint32_t t, float* row) const {
    for (uint32_t d = 0; d < shape.dim; ++d) row[d] = Load(base, size_t{t} * shape.dim + d);
  }

  FloatKind kind_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeFloatCodec(const CodecSpec& spec) {
  CodecInfo info;
  info.name = spec.name;
  info.role = CodecRole::kBoth;
  FloatKind kind;
  if (spec.name == "f32") {
    kind = FloatKind::kF32;
    info.code_bits = 32;
    info.lossless = true;
    info.summary = "IEEE float32; the input format, exact";
  } else if (spec.name == "f16") {
    kind = FloatKind::kF16;
    info.code_bits = 16;
    info.summary = "IEEE binary16; the default active and hot form";
  } else if (spec.name == "bf16") {
    kind = FloatKind::kBf16;
    info.code_bits = 16;
    info.summary = "bfloat16; float32's range with 8 bits of precision";
  } else {
    return Status::NotFound("no float codec named '" + spec.name + "'");
  }
  auto codec = std::make_unique<FloatCodec>(std::move(info), spec.path, kind);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
