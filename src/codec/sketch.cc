// int1 and jl: keys-only sketches. Both are measured estimators of q.k (their bias, variance and
// top-k recall are measured in tests/unit/codec_sketch_test.cc), meant for pages that receive
// little attention and for choosing pages; neither has an accumulate().
//
// int1 tile, [tokens, dim]:
//   [tokens] fp16 scale_t = mean_d |k_t,d|, the L2-optimal scale of a sign code
//   [tokens, ceil(dim/8)] sign bits, bit d%8 of byte d/8, LSB first; set = negative
//   k'_t,d = +-scale_t.
// jl tile, with r = ceil(dim/8) rows of the projection:
//   u32 seed, u16 r, u16 dim (validated on read)
//   [tokens, r] fp16 y_t = R k_t
//   R[j][d] = -1/sqrt(r) when the top bit of SplitMix64(seed << 32 | j << 16 | d) is set,
//   else +1/sqrt(r). decode gives R^T y_t, and scores give (R q).y_t = q.(R^T y_t).
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "argus/core.h"
#include "codec/codec_internal.h"
#include "core/splitmix.h"

namespace argus::codec_internal {

// The AVX2 kernels (sketch_avx2.cc); only this file calls them. q, n_q, s as in Codec::scores.
// tile: an int1 tile of [tokens, dim].
void ScoresInt1Avx2(const std::byte* tile, uint32_t tokens, uint32_t dim, const float* q,
                    uint32_t n_q, float* s);
// rq: [n_q, r] = R q, bit for bit as the scalar SignedSum computes it (see JlSigns for signs
// and row_stride; norm = 1/sqrt(r)).
void ProjectJlAvx2(const std::byte* signs, size_t row_stride, uint32_t r, uint32_t dim, double norm,
                   const float* q, uint32_t n_q, double* rq);
// y: a jl tile's [tokens, r] fp16 projections; rq: [n_q, r] the projected queries.
void ScoresJlAvx2(const std::byte* y, uint32_t tokens, uint32_t r, const double* rq, uint32_t n_q,
                  float* s);

namespace {

size_t SignBytes(uint32_t dim) { return (dim + 7) / 8; }

bool SignBit(const std::byte* bits, uint32_t d) {
  return (std::to_integer<unsigned>(bits[d / 8]) >> (d % 8)) & 1u;
}

// sum_d (bit d set ? -x_d : x_d) in double: sign flips are exact, so this is the sign code's
// dot product with only the (tiny) rounding of a double sum. The order of the additions is part
// of the contract, because the AVX2 projection (sketch_avx2.cc) repeats it to encode the same
// bytes: four partial sums s[d % 4] over the first 8 * floor(n / 8) values, combined as
// (s0 + s1) + (s2 + s3), then the remaining values one by one.
double SignedSum(const std::byte* bits, const float* x, uint32_t n) {
  auto flipped = [&](uint32_t d) {
    const uint32_t flip = uint32_t{SignBit(bits, d)} << 31;
    return double{std::bit_cast<float>(std::bit_cast<uint32_t>(x[d]) ^ flip)};
  };
  const uint32_t blocked = n / 8 * 8;
  double sum[4] = {0, 0, 0, 0};
  for (uint32_t d = 0; d < blocked; ++d) sum[d % 4] += flipped(d);
  double total = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  for (uint32_t d = blocked; d < n; ++d) total += flipped(d);
  return total;
}

// Rounds a sketch statistic of `token` to fp16, or InvalidArgument when it overflows the format.
Result<uint16_t> ToHalfFinite(const std::string& name, const char* what, double value,
                              uint32_t token) {
  uint16_t h = FloatToHalf(static_cast<float>(value));
  if (!std::isfinite(HalfToFloat(h))) {
    return Status::InvalidArgument(name + ": token " + std::to_string(token) + "'s " + what + " " +
                                   std::to_string(value) + " is beyond the fp16 range");
  }
  return h;
}

class Int1Codec final : public CodecBase {
 public:
  using CodecBase::CodecBase;

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return size_t{shape.tokens} * (2 + SignBytes(shape.dim));
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    // A NaN or Inf would spoil a whole token's statistic: refused, not coded as garbage.
    ARGUS_RETURN_IF_ERROR(CheckFinite(x, shape));
    std::memset(out.data(), 0, out.size());
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const float* row = x + size_t{t} * shape.dim;
      std::byte* bits = SignBits(out.data(), shape, t);
      double sum_abs = 0;
      for (uint32_t d = 0; d < shape.dim; ++d) {
        sum_abs += std::fabs(double{row[d]});
        if (row[d] < 0) bits[d / 8] |= std::byte{static_cast<uint8_t>(1u << (d % 8))};
      }
      ARGUS_ASSIGN_OR_RETURN(uint16_t scale,
                             ToHalfFinite(info_.name, "mean |k|", sum_abs / shape.dim, t));
      StoreU16(out.data() + 2 * size_t{t}, scale);
    }
    return Status::Ok();
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const float scale = HalfToFloat(LoadU16(in.data() + 2 * size_t{t}));
      const std::byte* bits = SignBits(in.data(), shape, t);
      for (uint32_t d = 0; d < shape.dim; ++d) {
        x[size_t{t} * shape.dim + d] = SignBit(bits, d) ? -scale : scale;
      }
    }
    return Status::Ok();
  }

  // s = scale_t * sum_d (+-q_d): one multiply per token instead of one per value.
  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    if (path_ == KernelPath::kAvx2) {
      ScoresInt1Avx2(k.data(), shape.tokens, shape.dim, q, n_q, s);
      return Status::Ok();
    }
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const double scale = HalfToFloat(LoadU16(k.data() + 2 * size_t{t}));
      const std::byte* bits = SignBits(k.data(), shape, t);
      for (uint32_t i = 0; i < n_q; ++i) {
        s[size_t{i} * shape.tokens + t] =
            static_cast<float>(scale * SignedSum(bits, q + size_t{i} * shape.dim, shape.dim));
      }
    }
    return Status::Ok();
  }

  template <typename Byte>
  static Byte* SignBits(Byte* tile, TileShape shape, uint32_t t) {
    return tile + 2 * size_t{shape.tokens} + size_t{t} * SignBytes(shape.dim);
  }
};

constexpr uint32_t kJlSeed = 0x41524755;  // arbitrary and fixed; recorded in every tile
constexpr size_t kJlHeaderBytes = 8;
constexpr uint32_t kJlMaxRows = (kMaxTileDim + 7) / 8;
constexpr size_t kJlRowBytes = kMaxTileDim / 8;

uint32_t JlRows(uint32_t dim) { return (dim + 7) / 8; }
double JlNorm(uint32_t r) { return 1.0 / std::sqrt(static_cast<double>(r)); }  // |R[j][d]|

// The sign bits of R for the largest shape, row j at j * kJlRowBytes. R[j][d] depends only on
// (seed, j, d), so a smaller tile uses the top-left r x dim corner. Built once (16 KiB).
const std::vector<std::byte>& JlSigns() {
  static const std::vector<std::byte> signs = [] {
    std::vector<std::byte> bits(kJlMaxRows * kJlRowBytes);
    for (uint32_t j = 0; j < kJlMaxRows; ++j) {
      for (uint32_t d = 0; d < kMaxTileDim; ++d) {
        if (SplitMix64At(uint64_t{kJlSeed} << 32 | uint64_t{j} << 16 | d, 1) >> 63) {
          bits[j * kJlRowBytes + d / 8] |= std::byte{static_cast<uint8_t>(1u << (d % 8))};
        }
      }
    }
    return bits;
  }();
  return signs;
}

class JlCodec final : public CodecBase {
 public:
  JlCodec(CodecInfo info, KernelPath path)
      : CodecBase(std::move(info), path), signs_(JlSigns().data()) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return kJlHeaderBytes + size_t{shape.tokens} * JlRows(shape.dim) * 2;
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    // A NaN or Inf would spoil every projection of its token: refused, not coded as garbage.
    ARGUS_RETURN_IF_ERROR(CheckFinite(x, shape));
    const uint32_t r = JlRows(shape.dim);
    StoreU32(out.data(), kJlSeed);
    StoreU16(out.data() + 4, static_cast<uint16_t>(r));
    StoreU16(out.data() + 6, static_cast<uint16_t>(shape.dim));
    constexpr uint32_t kChunk = 64;  // tokens projected at a time: bounded scratch
    std::vector<double> y(size_t{kChunk} * r);
    for (uint32_t t0 = 0; t0 < shape.tokens; t0 += kChunk) {
      const uint32_t n = std::min(kChunk, shape.tokens - t0);
      Project(x + size_t{t0} * shape.dim, n, shape.dim, y.data());
      for (uint32_t t = t0; t < t0 + n; ++t) {
        for (uint32_t j = 0; j < r; ++j) {
          ARGUS_ASSIGN_OR_RETURN(
              uint16_t h, ToHalfFinite(info_.name, "projection", y[size_t{t - t0} * r + j], t));
          StoreU16(Projected(out.data(), t, r) + 2 * j, h);
        }
      }
    }
    return Status::Ok();
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    ARGUS_RETURN_IF_ERROR(CheckHeader(in.data(), shape));
    const uint32_t r = JlRows(shape.dim);
    const double norm = JlNorm(r);
    double row[kMaxTileDim];
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      std::fill(row, row + shape.dim, 0.0);
      for (uint32_t j = 0; j < r; ++j) {
        const double y = norm * HalfToFloat(LoadU16(Projected(in.data(), t, r) + 2 * j));
        const std::byte* signs = signs_ + j * kJlRowBytes;
        for (uint32_t d = 0; d < shape.dim; ++d) row[d] += SignBit(signs, d) ? -y : y;
      }
      for (uint32_t d = 0; d < shape.dim; ++d) {
        x[size_t{t} * shape.dim + d] = static_cast<float>(row[d]);
      }
    }
    return Status::Ok();
  }

  // Projects each query once (R q_i: n_q * r * dim additions), then each score is an r-term dot
  // product. Double sums keep (R q).y equal to q.(R^T y) up to the final rounding to float.
  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    ARGUS_RETURN_IF_ERROR(CheckHeader(k.data(), shape));
    const uint32_t r = JlRows(shape.dim);
    std::vector<double> rq(size_t{n_q} * r);  // [n_q, r]
    Project(q, n_q, shape.dim, rq.data());
    if (path_ == KernelPath::kAvx2) {
      ScoresJlAvx2(Projected(k.data(), 0, r), shape.tokens, r, rq.data(), n_q, s);
      return Status::Ok();
    }
    double y[kJlMaxRows];
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      for (uint32_t j = 0; j < r; ++j) {
        y[j] = HalfToFloat(LoadU16(Projected(k.data(), t, r) + 2 * j));
      }
      for (uint32_t i = 0; i < n_q; ++i) {
        double dot = 0;
        for (uint32_t j = 0; j < r; ++j) dot += rq[size_t{i} * r + j] * y[j];
        s[size_t{i} * shape.tokens + t] = static_cast<float>(dot);
      }
    }
    return Status::Ok();
  }

  // out: [n, r] = R x for x: [n, dim], in double; both paths give the same bits.
  void Project(const float* x, uint32_t n, uint32_t dim, double* out) const {
    const uint32_t r = JlRows(dim);
    const double norm = JlNorm(r);
    if (path_ == KernelPath::kAvx2) {
      ProjectJlAvx2(signs_, kJlRowBytes, r, dim, norm, x, n, out);
      return;
    }
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t j = 0; j < r; ++j) {
        out[size_t{i} * r + j] =
            norm * SignedSum(signs_ + j * kJlRowBytes, x + size_t{i} * dim, dim);
      }
    }
  }

  template <typename Byte>
  static Byte* Projected(Byte* tile, uint32_t t, uint32_t r) {
    return tile + kJlHeaderBytes + size_t{t} * r * 2;
  }

  Status CheckHeader(const std::byte* tile, TileShape shape) const {
    const uint32_t seed = LoadU32(tile);
    const uint32_t r = LoadU16(tile + 4), dim = LoadU16(tile + 6);
    if (seed != kJlSeed || r != JlRows(shape.dim) || dim != shape.dim) {
      return Status::Corruption(info_.name + " tile header says seed " + std::to_string(seed) +
                                ", r " + std::to_string(r) + ", dim " + std::to_string(dim) +
                                "; expected seed " + std::to_string(kJlSeed) + ", r " +
                                std::to_string(JlRows(shape.dim)) + ", dim " +
                                std::to_string(shape.dim));
    }
    return Status::Ok();
  }

  const std::byte* signs_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeSketchCodec(const CodecSpec& spec) {
  CodecInfo info;
  info.name = spec.name;
  info.role = CodecRole::kKeys;
  std::unique_ptr<CodecBase> codec;
  if (spec.name == "int1") {
    info.code_bits = 1;
    info.summary =
        "keys only: sign bits and an fp16 mean |k| per token; a biased (shrunk) score sketch";
    // AVX2 sums the sign-flipped query in float over 8 lanes: <= (dim/8 + 3) roundings of
    // 2^-24 relative to sum |q_d| scale <= ||q|| ||k'||, under 1e-5 for dim <= 1024.
    info.fused_rel_error = 1e-5;
    codec = std::make_unique<Int1Codec>(std::move(info), spec.path);
  } else if (spec.name == "jl") {
    info.code_bits = 2;  // one fp16 per 8 channels
    info.summary =
        "keys only: seeded +-1 projection to dim/8 fp16 values; an unbiased score sketch";
    // Sums in double; the only rounding that matters is the final one to float.
    info.fused_rel_error = 1e-6;
    codec = std::make_unique<JlCodec>(std::move(info), spec.path);
  } else {
    return Status::NotFound("no sketch codec named '" + spec.name + "'");
  }
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
