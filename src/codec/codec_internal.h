// Pieces shared by the codec implementations. Not a public header.
//
// Rules for kernel files: *_avx2.cc files are compiled with -mavx2 -mfma -mf16c, *_avx512.cc
// files with AVX-512 F/BW/VL/VNNI as well, and each is only called when BestKernelPath() says
// the CPU has them. They take raw pointers and use no std:: templates (an inline template
// instantiated with AVX2 flags could be picked by the linker for the scalar build too).
#pragma once

#include <cstring>
#include <memory>
#include <string>

#include "argus/codec.h"

namespace argus::codec_internal {

// Common state and checks of the built-in codecs.
class CodecBase : public Codec {
 public:
  // `path` as asked, capped at the widest path the codec has kernels for: kernel_path() says
  // what runs.
  CodecBase(CodecInfo info, KernelPath path, KernelPath widest = KernelPath::kAvx2)
      : info_(std::move(info)), path_(path < widest ? path : widest) {}
  const CodecInfo& info() const override { return info_; }
  KernelPath kernel_path() const override { return path_; }

  // The public entry points validate the shape, the group size and the byte count here, once,
  // so that no codec can forget to; the *Checked hooks run on validated arguments only.
  Status encode(const float* x, TileShape shape, std::span<std::byte> out) const final {
    ARGUS_RETURN_IF_ERROR(CheckEncoded(out.size(), shape));
    return EncodeChecked(x, shape, out);
  }
  Status decode(std::span<const std::byte> in, TileShape shape, float* x) const final {
    ARGUS_RETURN_IF_ERROR(CheckEncoded(in.size(), shape));
    return DecodeChecked(in, shape, x);
  }
  Status scores(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                float* s) const final {
    ARGUS_RETURN_IF_ERROR(CheckGroup(shape, n_q));
    ARGUS_RETURN_IF_ERROR(CheckEncoded(k.size(), shape));
    return ScoresChecked(k, shape, q, n_q, s);
  }
  Status accumulate(std::span<const std::byte> v, TileShape shape, const float* p, uint32_t n_q,
                    float* acc) const final {
    ARGUS_RETURN_IF_ERROR(CheckGroup(shape, n_q));
    ARGUS_RETURN_IF_ERROR(CheckEncoded(v.size(), shape));
    if (info_.role == CodecRole::kKeys) return KeysOnly();
    return AccumulateChecked(v, shape, p, n_q, acc);
  }

  // Sets info_.bits_per_value from encoded_size of a 256 x 128 tile. Factories call it once.
  void ComputeBitsPerValue();

 protected:
  virtual Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const = 0;
  virtual Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const = 0;
  virtual Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q,
                               uint32_t n_q, float* s) const = 0;
  // Keys-only codecs (CodecRole::kKeys) never reach this.
  virtual Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                                   uint32_t n_q, float* acc) const {
    (void)v, (void)shape, (void)p, (void)n_q, (void)acc;
    return Status::Internal(info_.name + ": accumulate is not implemented");
  }

  // Validates the shape and that `n_bytes` is exactly the encoded size of a tile of it.
  Status CheckEncoded(size_t n_bytes, TileShape shape) const;
  Status CheckGroup(TileShape shape, uint32_t n_q) const;  // shape and 1 <= n_q <= kMaxGroupHeads
  Status KeysOnly() const;  // the Unsupported error of accumulate() for keys-only codecs
  // InvalidArgument naming the first NaN or Inf of x [tokens, dim] by token and channel.
  Status CheckFinite(const float* x, TileShape shape) const;

  CodecInfo info_;
  KernelPath path_;
};

// Little-endian loads and stores of encoded fields (tiles are byte strings, not structs, so
// they can sit at any alignment in a page).
inline uint16_t LoadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LoadF32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void StoreU16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void StoreU32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void StoreF32(std::byte* p, float v) { std::memcpy(p, &v, 4); }

// Codecs whose tile is ceil(tokens*dim / 32) blocks of 32 consecutive values in row-major
// order (the last block zero-padded) share these. When 32 divides dim, a block never crosses a
// token and the tile is the row-major concatenation of per-row blocks.
inline constexpr uint32_t kBlockValues = 32;
inline size_t NumBlocks(TileShape shape) {
  return (shape.n_values() + kBlockValues - 1) / kBlockValues;
}

// Scalar fused kernels over flat blocks of kValues (32 unless a codec says otherwise):
// decode_block(b, float out[kValues]) gives block b's values. The specification for every
// blocked codec; fast paths are tested against it.
template <uint32_t kValues = kBlockValues, typename DecodeBlock>
void ScoresByBlocks(TileShape shape, const float* q, uint32_t n_q, float* s,
                    DecodeBlock decode_block) {
  std::memset(s, 0, sizeof(float) * n_q * shape.tokens);
  float x[kValues];
  const size_t n_values = shape.n_values();
  for (size_t b = 0; b < (n_values + kValues - 1) / kValues; ++b) {
    decode_block(b, x);
    for (size_t j = 0; j < kValues && b * kValues + j < n_values; ++j) {
      size_t e = b * kValues + j, t = e / shape.dim, d = e % shape.dim;
      for (uint32_t i = 0; i < n_q; ++i) s[i * shape.tokens + t] += q[i * shape.dim + d] * x[j];
    }
  }
}

template <uint32_t kValues = kBlockValues, typename DecodeBlock>
void AccumulateByBlocks(TileShape shape, const float* p, uint32_t n_q, float* acc,
                        DecodeBlock decode_block) {
  float x[kValues];
  const size_t n_values = shape.n_values();
  for (size_t b = 0; b < (n_values + kValues - 1) / kValues; ++b) {
    decode_block(b, x);
    for (size_t j = 0; j < kValues && b * kValues + j < n_values; ++j) {
      size_t e = b * kValues + j, t = e / shape.dim, d = e % shape.dim;
      for (uint32_t i = 0; i < n_q; ++i) acc[i * shape.dim + d] += p[i * shape.tokens + t] * x[j];
    }
  }
}

// Scalar fused kernels for codecs that decode one token's row at a time.
// decode_row(t, float out[dim]).
template <typename DecodeRow>
void ScoresByRows(TileShape shape, const float* q, uint32_t n_q, float* s, DecodeRow decode_row) {
  float x[kMaxTileDim];
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    decode_row(t, x);
    for (uint32_t i = 0; i < n_q; ++i) {
      float dot = 0;
      for (uint32_t d = 0; d < shape.dim; ++d) dot += q[i * shape.dim + d] * x[d];
      s[i * shape.tokens + t] = dot;
    }
  }
}

template <typename DecodeRow>
void AccumulateByRows(TileShape shape, const float* p, uint32_t n_q, float* acc,
                      DecodeRow decode_row) {
  float x[kMaxTileDim];
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    decode_row(t, x);
    for (uint32_t i = 0; i < n_q; ++i) {
      const float w = p[i * shape.tokens + t];
      for (uint32_t d = 0; d < shape.dim; ++d) acc[i * shape.dim + d] += w * x[d];
    }
  }
}

// Factories of the built-in codec families (one per source file).
Result<std::unique_ptr<Codec>> MakeFloatCodec(const CodecSpec& spec);  // f32 f16 bf16
Result<std::unique_ptr<Codec>> MakeAffineCodec(
    const CodecSpec& spec);  // int8 int4 int2 (:token, :channel)
Result<std::unique_ptr<Codec>> MakePlaneCodec(const CodecSpec& spec);   // plane8 plane8/4 plane8/2
Result<std::unique_ptr<Codec>> MakeGgmlCodec(const CodecSpec& spec);    // q8_0 q4_0 iq4_nl
Result<std::unique_ptr<Codec>> MakeSketchCodec(const CodecSpec& spec);  // int1 jl
Result<std::unique_ptr<Codec>> MakeLosslessCodec(const CodecSpec& spec);  // lossless_{f16,bf16}
Result<std::unique_ptr<Codec>> MakeNonUniformCodec(const CodecSpec& spec);  // nl3 nl2
Result<std::unique_ptr<Codec>> MakeChannel16Codec(const CodecSpec& spec);    // chan3 chan2
Result<std::unique_ptr<Codec>> MakeFp8Codec(const CodecSpec& spec);       // fp8_e4m3 fp8_e5m2

// Applies +rot / +center around a base codec (transforms.cc).
Result<std::unique_ptr<Codec>> WrapTransforms(std::unique_ptr<Codec> base, const CodecSpec& spec);
// x <- H x over one row of `dim` values, H the rotation of +rot: the block diagonal of
// normalised Sylvester Hadamards whose sizes are dim's binary digits, largest first (80 = 64 +
// 16). H is symmetric and orthonormal, hence its own inverse. O(dim log dim).
void HadamardRotate(float* x, uint32_t dim);

// Registers every built-in codec into `registry`.
Status RegisterBuiltinCodecs(CodecRegistry& registry);

}  // namespace argus::codec_internal
