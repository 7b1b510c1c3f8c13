// q8_0, q4_0, iq4_nl: ggml's 32-value block formats, bit-exact with ggml's reference quantisers
// (quantize_row_{q8_0,q4_0,iq4_nl}_ref in llama.cpp's ggml/src/ggml-quants.c) and decoded as
// ggml's dequantize_row_* does.
//
// A [tokens, dim] tile is cut, in row-major order, into ceil(tokens*dim/32) blocks of 32
// consecutive values (the last one zero-padded). When 32 divides dim the encoded tile is the
// row-major concatenation of ggml blocks: a valid ggml tensor of `tokens` rows. Otherwise blocks
// span tokens (stories260K's head_dim is 8), which ggml itself cannot express. Blocks, with
// little-endian fields:
//   q8_0   34 bytes: fp16 d, int8 q[32]            value j = q[j] * d
//   q4_0   18 bytes: fp16 d, uint8 qs[16]          value j = (n_j - 8) * d
//   iq4_nl 18 bytes: fp16 d, uint8 qs[16]          value j = d * kIq4NlValues[n_j]
// where nibble n_j is the low nibble of qs[j] for j < 16 and the high nibble of qs[j - 16].
//
// This file is the specification: the encoders, decoders and scalar fused kernels. Encoding is
// always this scalar code (it runs once per filled page); ggml_avx2.cc and ggml_avx512.cc hold
// the fast kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "argus/core.h"
#include "codec/codec_internal.h"
#include "codec/ggml_kernels.h"

namespace argus::codec_internal {
namespace {

// C's float -> int8_t conversion as ggml's x86-64 build performs it (cvttss2si, then the low
// byte): truncation toward zero, and the "integer indefinite" 0x80000000 (low byte 0) for NaN
// and values outside int32. Only degenerate blocks, whose 1/d overflows, reach that case.
int8_t TruncToInt8(float f) {
  const int32_t i = (f > -2147483904.0f && f < 2147483648.0f) ? static_cast<int32_t>(f) : INT32_MIN;
  return static_cast<int8_t>(i);  // modular (C++20)
}

std::byte Byte(int v) { return static_cast<std::byte>(v & 0xff); }
uint8_t U8(std::byte b) { return std::to_integer<uint8_t>(b); }

// q8_0: d = amax/127, q = roundf(x/d) (quantize_row_q8_0_ref).
struct Q8_0 {
  static constexpr GgmlKind kKind = GgmlKind::kQ8_0;

  static void Encode(const float* x, std::byte* out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(out, FloatToHalf(d));
    for (int j = 0; j < 32; ++j) out[2 + j] = Byte(TruncToInt8(std::round(x[j] * id)));
  }

  static void Decode(const std::byte* in, float* x) {
    const float d = HalfToFloat(LoadU16(in));
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(static_cast<int8_t>(U8(in[2 + j]))) * d;
  }
};

// Writes 32 4-bit codes as ggml packs them: code j in the low nibble of byte j, code j+16 in
// the high nibble. Codes are ints that ggml stores through uint8_t, so out-of-range ones (only
// from degenerate blocks) are kept exactly as ggml's C expression keeps them.
void PackNibbles(const int* codes, std::byte* qs) {
  for (int j = 0; j < 16; ++j) {
    qs[j] = Byte(static_cast<uint8_t>(codes[j]) | (static_cast<uint8_t>(codes[j + 16]) << 4));
  }
}

int Nibble(const std::byte* qs, int j) { return j < 16 ? U8(qs[j]) & 0xf : U8(qs[j - 16]) >> 4; }

// q4_0: d = (the value of largest magnitude) / -8, code = min(15, trunc(x/d + 8.5))
// (quantize_row_q4_0_ref).
struct Q4_0 {
  static constexpr GgmlKind kKind = GgmlKind::kQ4_0;

  static void Encode(const float* x, std::byte* out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(out, FloatToHalf(d));
    int codes[32];
    for (int j = 0; j < 32; ++j) codes[j] = std::min(15, int{TruncToInt8(x[j] * id + 8.5f)});
    PackNibbles(codes, out + 2);
  }

  static void Decode(const std::byte* in, float* x) {
    const float d = HalfToFloat(LoadU16(in));
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(Nibble(in + 2, j) - 8) * d;
  }
};

// The index of the level nearest to x (ggml's best_index_int8): level i is chosen once x reaches
// the midpoint of levels i-1 and i, compared as 2x >= sum so both sides are exact.
int BestIq4NlIndex(float x) {
  const float x2 = x + x;
  int index = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = index + step;
    if (x2 >= static_cast<float>(kIq4NlValues[j - 1] + kIq4NlValues[j])) index = j;
  }
  return index;
}

// iq4_nl as quantize_row_iq4_nl_ref does it (quantize_row_iq4_nl_impl for one 32-value block,
// no importance weights, ntry = -1): codes for the scale that maps the value of largest
// magnitude to -127, then the scale refitted by weighted least squares (weights x^2), in float
// arithmetic summed in index order. Blocks with amax < 1e-15 get d = 0; ggml leaves their codes
// unset, ARGUS writes code 0 (any code decodes to 0 there).
struct Iq4Nl {
  static constexpr GgmlKind kKind = GgmlKind::kIq4Nl;

  static void Encode(const float* x, std::byte* out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    int codes[32] = {};
    float d = 0.0f;
    if (amax >= 1e-15f) {
      const float id = 1.0f / (max / kIq4NlValues[0]);
      float sumqx = 0.0f, sumq2 = 0.0f;
      for (int j = 0; j < 32; ++j) {
        codes[j] = BestIq4NlIndex(id * x[j]);
        const float q = kIq4NlValues[codes[j]];
        const float w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
      }
      d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    }
    StoreU16(out, FloatToHalf(d));
    PackNibbles(codes, out + 2);
  }

  static void Decode(const std::byte* in, float* x) {
    const float d = HalfToFloat(LoadU16(in));
    for (int j = 0; j < 32; ++j) x[j] = d * static_cast<float>(kIq4NlValues[Nibble(in + 2, j)]);
  }
};

template <typename Format>
class GgmlCodec final : public CodecBase {
 public:
  static constexpr size_t kBlockBytes = GgmlBlockBytes(Format::kKind);

  using CodecBase::CodecBase;

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return NumBlocks(shape) * kBlockBytes;
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    const size_t n_values = shape.n_values();
    ARGUS_RETURN_IF_ERROR(CheckFinite(x, shape));
    float block[kBlockValues];
    for (size_t b = 0; b < NumBlocks(shape); ++b) {
      const size_t first = b * kBlockValues, n = std::min<size_t>(kBlockValues, n_values - first);
      std::copy_n(x + first, n, block);
      std::fill(block + n, block + kBlockValues, 0.0f);
      Format::Encode(block, out.data() + b * kBlockBytes);
    }
    return Status::Ok();
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    const size_t n_values = shape.n_values();
    float block[kBlockValues];
    for (size_t b = 0; b < NumBlocks(shape); ++b) {
      const size_t first = b * kBlockValues, n = std::min<size_t>(kBlockValues, n_values - first);
      Format::Decode(in.data() + b * kBlockBytes, block);
      std::copy_n(block, n, x + first);
    }
    return Status::Ok();
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    if (UseVector(shape)) {
      (path_ == KernelPath::kAvx512 ? ScoresGgmlAvx512 : ScoresGgmlAvx2)(
          Format::kKind, k.data(), shape.tokens, shape.dim, q, n_q, s);
      return Status::Ok();
    }
    ScoresByBlocks(shape, q, n_q, s,
                   [&](size_t b, float* x) { Format::Decode(k.data() + b * kBlockBytes, x); });
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    if (UseVector(shape)) {
      (path_ == KernelPath::kAvx512 ? AccumulateGgmlAvx512 : AccumulateGgmlAvx2)(
          Format::kKind, v.data(), shape.tokens, shape.dim, p, n_q, acc);
      return Status::Ok();
    }
    AccumulateByBlocks(shape, p, n_q, acc,
                       [&](size_t b, float* x) { Format::Decode(v.data() + b * kBlockBytes, x); });
    return Status::Ok();
  }

  // The vector kernels take whole-block rows; other shapes take the scalar kernels.
  bool UseVector(TileShape shape) const {
    return path_ >= KernelPath::kAvx2 && shape.dim % kBlockValues == 0;
  }
};

template <typename Format>
std::unique_ptr<Codec> Make(CodecInfo info, KernelPath path) {
  auto codec = std::make_unique<GgmlCodec<Format>>(std::move(info), path, KernelPath::kAvx512);
  codec->ComputeBitsPerValue();
  return codec;
}

}  // namespace

Result<std::unique_ptr<Codec>> MakeGgmlCodec(const CodecSpec& spec) {
  CodecInfo info;
  info.name = spec.name;
  info.role = CodecRole::kBoth;
  const bool vector = spec.path >= KernelPath::kAvx2;
  // q8_0 and iq4_nl round the query to int16 on AVX2 but to int8 on AVX-512 (ggml_avx512.cc).
  const double error16 = spec.path >= KernelPath::kAvx512 ? kGgmlAvx512RelError16
                         : vector                         ? kGgmlAvx2RelError16
                                                          : kGgmlScalarRelError;
  if (spec.name == "q8_0") {
    info.code_bits = 8;
    info.summary = "ggml q8_0: 32 int8 per fp16 scale; nearly lossless, a valid ggml tensor";
    info.fused_rel_error = error16;
    return Make<Q8_0>(std::move(info), spec.path);
  }
  if (spec.name == "q4_0") {
    info.code_bits = 4;
    info.summary = "ggml q4_0: 32 4-bit codes per fp16 scale, symmetric; a valid ggml tensor";
    info.fused_rel_error = vector ? kGgmlVectorRelError8 : kGgmlScalarRelError;
    return Make<Q4_0>(std::move(info), spec.path);
  }
  if (spec.name == "iq4_nl") {
    info.code_bits = 4;
    info.summary = "ggml iq4_nl: 32 non-linear 4-bit codes per fp16 scale; a valid ggml tensor";
    info.fused_rel_error = error16;
    return Make<Iq4Nl>(std::move(info), spec.path);
  }
  return Status::NotFound("no ggml codec named '" + spec.name + "'");
}

}  // namespace argus::codec_internal
