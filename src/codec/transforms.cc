// +rot and +center: transforms around a lossy base codec of 8 bits or fewer, recorded in the
// tile so that a tile is never read with the wrong inverse.
//
// Tile layout (little-endian, any alignment):
//   [0, 4)               u32  magic 0x58545241 ("ARTX")
//   [4]                  u8   flags: bit 0 = +rot, bit 1 = +center, other bits zero
//   [5]                  u8   reserved, zero
//   [6, 8)               u16  dim
//   [8, 12)              u32  tokens
//   [12, 12 + 2 dim)     f16  mu[dim], the per-channel mean of the tile (only with +center)
//   [12 (+ 2 dim), end)       the base codec's tile of y_t = H (x_t - mu), [tokens, dim]
// (H = I without +rot, mu = 0 without +center.) Every reading method checks the header against
// the codec and the shape, and that mu is finite: a mismatch is Corruption.
//
// Rotation: H is applied to each token's row over the head dimension. It is the block diagonal
// of normalised Sylvester Hadamard matrices whose sizes are the binary digits of dim, largest
// first: 128 = H_128, 80 = diag(H_64, H_16), 96 = diag(H_64, H_32), 7 = diag(H_4, H_2, H_1),
// with H_n(i, j) = (-1)^popcount(i & j) / sqrt(n). H is symmetric and orthonormal, so it is its
// own inverse and q . k = (H q) . (H k): scores rotate the queries once per call and call the
// base codec; accumulate collects sum_t p_t y'_t in the rotated space and rotates that back.
// Applied with the fast Walsh-Hadamard transform, O(dim log dim) per row.
//
// Centring: k_t - mu is encoded, and scores add q . mu (in float, from the stored mu, which is
// the very value subtracted before encoding) to every token's score; accumulate adds
// (sum_t p_t) mu. mu is stored as fp16: its precision only decides how well the residual is
// centred (to 2^-11 of the mean), never the correction, which adds back exactly what was
// subtracted. Means beyond fp16's range are clamped to +-65504, which is just a smaller shift.
//
// Non-finite input is refused (InvalidArgument): rotation and the mean would spread it over a
// whole row or channel.
#include <algorithm>
#include <bit>
#include <cmath>

#include "argus/core.h"
#include "codec/codec_internal.h"
#include "core/buffer.h"

namespace argus::codec_internal {
namespace {

constexpr uint32_t kMagic = 0x58545241;  // "ARTX"
constexpr uint8_t kRotateFlag = 1, kCenterFlag = 2;
constexpr size_t kHeaderBytes = 12;
// Float rounding the transforms add to the fused kernels (rotating q or the accumulator, q . mu
// and (sum p) mu in float): about one more float dot product, stated as the float codecs do.
constexpr double kTransformRelError = 1e-5;

// In-place Walsh-Hadamard transform of n (a power of two) values: x <- H_n x, Sylvester order.
// The three narrowest butterfly levels run on groups of 8 values in registers; the wider levels'
// inner loops are contiguous, so the compiler vectorises them.
void Fwht(float* x, uint32_t n) {
  uint32_t h = 1;
  if (n >= 8) {
    for (uint32_t g = 0; g < n; g += 8) {
      float* v = x + g;
      const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
      const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
      const float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
      const float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
      v[0] = b0 + b4, v[1] = b1 + b5, v[2] = b2 + b6, v[3] = b3 + b7;
      v[4] = b0 - b4, v[5] = b1 - b5, v[6] = b2 - b6, v[7] = b3 - b7;
    }
    h = 8;
  }
  for (; h < n; h <<= 1) {
    for (uint32_t i = 0; i < n; i += 2 * h) {
      float* __restrict lo = x + i;  // the halves never overlap: tells the vectoriser so
      float* __restrict hi = x + i + h;
      for (uint32_t j = 0; j < h; ++j) {
        const float a = lo[j], b = hi[j];
        lo[j] = a + b;
        hi[j] = a - b;
      }
    }
  }
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (uint32_t j = 0; j < n; ++j) x[j] *= norm;
}

// A stored channel mean (finite fp16) as a float, exactly as HalfToFloat gives it, but branch-free
// so that the loop over dim vectorises (HalfToFloat is a call per value), and without subnormal float arithmetic, which flush-to-zero modes would
// change. Encode and every reader use this one function, so the correction is exact regardless.
float MeanToFloat(uint16_t half) {
  const uint32_t magnitude = half & 0x7fffu;
  const uint32_t normal = (magnitude << 13) + ((127u - 15u) << 23);  // rebias the exponent
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(magnitude) * 0x1p-24f);
  const uint32_t is_normal = 0u - static_cast<uint32_t>(magnitude >= 0x400u);  // all ones or zero
  return std::bit_cast<float>((normal & is_normal) | (subnormal & ~is_normal) |
                              (uint32_t{half & 0x8000u} << 16));
}

// sum_j a[j] * b[j] (b == nullptr: sum_j a[j]) in 8 independent partial sums, which the
// compiler vectorises; a single running sum would wait on the add latency at every step.
float Dot(const float* a, const float* b, uint32_t n) {
  float part[8] = {};
  uint32_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (uint32_t l = 0; l < 8; ++l) part[l] += a[j + l] * (b ? b[j + l] : 1.0f);
  }
  for (; j < n; ++j) part[j % 8] += a[j] * (b ? b[j] : 1.0f);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

class TransformCodec final : public CodecBase {
 public:
  TransformCodec(CodecInfo info, std::unique_ptr<Codec> base, bool rotate, bool center)
      : CodecBase(std::move(info), base->kernel_path()),
        base_(std::move(base)),
        rotate_(rotate),
        center_(center) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    ARGUS_ASSIGN_OR_RETURN(size_t base_bytes, base_->encoded_size(shape));
    return PrefixBytes(shape) + base_bytes;
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    ARGUS_RETURN_IF_ERROR(CheckFinite(x, shape));
    ARGUS_ASSIGN_OR_RETURN(AlignedBuffer buffer,
                           AlignedBuffer::Allocate(shape.n_values() * sizeof(float)));
    float* y = buffer.as<float>();
    StoreU32(out.data(), kMagic);
    out[4] = static_cast<std::byte>(Flags());
    out[5] = std::byte{0};
    StoreU16(out.data() + 6, static_cast<uint16_t>(shape.dim));
    StoreU32(out.data() + 8, shape.tokens);
    float mu[kMaxTileDim] = {};
    if (center_) {
      double sum[kMaxTileDim] = {};
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        for (uint32_t d = 0; d < shape.dim; ++d) sum[d] += x[size_t{t} * shape.dim + d];
      }
      for (uint32_t d = 0; d < shape.dim; ++d) {
        const double mean = std::clamp(sum[d] / shape.tokens, -65504.0, 65504.0);
        const uint16_t half = FloatToHalf(static_cast<float>(mean));
        StoreU16(out.data() + kHeaderBytes + 2 * d, half);
        mu[d] = MeanToFloat(half);
      }
    }
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      float* row = y + size_t{t} * shape.dim;
      for (uint32_t d = 0; d < shape.dim; ++d) row[d] = x[size_t{t} * shape.dim + d] - mu[d];
      if (rotate_) HadamardRotate(row, shape.dim);
    }
    return base_->encode(y, shape, out.subspan(PrefixBytes(shape))).WithContext(info_.name);
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    float mu[kMaxTileDim];
    ARGUS_RETURN_IF_ERROR(ReadPrefix(in, shape, mu));
    ARGUS_RETURN_IF_ERROR(
        base_->decode(in.subspan(PrefixBytes(shape)), shape, x).WithContext(info_.name));
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      float* row = x + size_t{t} * shape.dim;
      if (rotate_) HadamardRotate(row, shape.dim);
      if (center_) {
        for (uint32_t d = 0; d < shape.dim; ++d) row[d] += mu[d];
      }
    }
    return Status::Ok();
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    float mu[kMaxTileDim];
    ARGUS_RETURN_IF_ERROR(ReadPrefix(k, shape, mu));
    const size_t n_q_values = size_t{n_q} * shape.dim;
    AlignedBuffer rotated;
    const float* q_base = q;
    if (rotate_) {
      ARGUS_ASSIGN_OR_RETURN(rotated, AlignedBuffer::Allocate(n_q_values * sizeof(float)));
      float* hq = rotated.as<float>();
      std::copy(q, q + n_q_values, hq);
      for (uint32_t i = 0; i < n_q; ++i) HadamardRotate(hq + size_t{i} * shape.dim, shape.dim);
      q_base = hq;
    }
    ARGUS_RETURN_IF_ERROR(base_->scores(k.subspan(PrefixBytes(shape)), shape, q_base, n_q, s)
                              .WithContext(info_.name));
    if (center_) {
      for (uint32_t i = 0; i < n_q; ++i) {
        const float* qi = q + size_t{i} * shape.dim;
        const float q_mu = Dot(qi, mu, shape.dim);
        for (uint32_t t = 0; t < shape.tokens; ++t) s[size_t{i} * shape.tokens + t] += q_mu;
      }
    }
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    float mu[kMaxTileDim];
    ARGUS_RETURN_IF_ERROR(ReadPrefix(v, shape, mu));
    std::span<const std::byte> base_tile = v.subspan(PrefixBytes(shape));
    if (rotate_) {
      // sum_t p_t H y'_t = H sum_t p_t y'_t: accumulate in the rotated space, rotate once.
      ARGUS_ASSIGN_OR_RETURN(AlignedBuffer scratch,
                             AlignedBuffer::Allocate(size_t{n_q} * shape.dim * sizeof(float)));
      float* rotated = scratch.as<float>();  // zeroed by Allocate
      ARGUS_RETURN_IF_ERROR(
          base_->accumulate(base_tile, shape, p, n_q, rotated).WithContext(info_.name));
      for (uint32_t i = 0; i < n_q; ++i) {
        float* ri = rotated + size_t{i} * shape.dim;
        HadamardRotate(ri, shape.dim);
        for (uint32_t d = 0; d < shape.dim; ++d) acc[size_t{i} * shape.dim + d] += ri[d];
      }
    } else {
      ARGUS_RETURN_IF_ERROR(
          base_->accumulate(base_tile, shape, p, n_q, acc).WithContext(info_.name));
    }
    if (center_) {
      for (uint32_t i = 0; i < n_q; ++i) {
        const float weight = Dot(p + size_t{i} * shape.tokens, nullptr, shape.tokens);
        for (uint32_t d = 0; d < shape.dim; ++d) acc[size_t{i} * shape.dim + d] += weight * mu[d];
      }
    }
    return Status::Ok();
  }

  uint8_t Flags() const { return (rotate_ ? kRotateFlag : 0) | (center_ ? kCenterFlag : 0); }
  size_t PrefixBytes(TileShape shape) const {
    return kHeaderBytes + (center_ ? 2 * size_t{shape.dim} : 0);
  }

  // Checks the header against this codec and `shape`; fills mu[dim] under +center.
  // REQUIRES: tile.size() == encoded_size(shape).
  Status ReadPrefix(std::span<const std::byte> tile, TileShape shape, float* mu) const {
    const std::byte* h = tile.data();
    auto corrupt = [&](const std::string& what) {
      return Status::Corruption(info_.name + " tile of " + std::to_string(shape.tokens) + "x" +
                                std::to_string(shape.dim) + ": " + what);
    };
    if (LoadU32(h) != kMagic)
      return corrupt("transform header magic " + std::to_string(LoadU32(h)) + " is not ARTX");
    if (static_cast<uint8_t>(h[4]) != Flags() || h[5] != std::byte{0}) {
      return corrupt("header flags " + std::to_string(static_cast<int>(h[4])) + "/" +
                     std::to_string(static_cast<int>(h[5])) + " do not match the codec (expected " +
                     std::to_string(static_cast<int>(Flags())) + "/0)");
    }
    if (LoadU16(h + 6) != shape.dim || LoadU32(h + 8) != shape.tokens) {
      return corrupt("header records a " + std::to_string(LoadU32(h + 8)) + "x" +
                     std::to_string(LoadU16(h + 6)) + " tile");
    }
    if (center_) {
      uint32_t non_finite = 0;
      for (uint32_t d = 0; d < shape.dim; ++d) {
        const uint16_t half = LoadU16(h + kHeaderBytes + 2 * d);
        non_finite |= static_cast<uint32_t>((half & 0x7c00u) == 0x7c00u);
        mu[d] = MeanToFloat(half);
      }
      if (non_finite != 0) return corrupt("a channel mean is not finite");
    }
    return Status::Ok();
  }

  std::unique_ptr<Codec> base_;
  bool rotate_, center_;
};

}  // namespace

void HadamardRotate(float* x, uint32_t dim) {
  uint32_t offset = 0;
  for (uint32_t n = std::bit_floor(dim); n > 0; n >>= 1) {
    if (dim & n) {
      Fwht(x + offset, n);
      offset += n;
    }
  }
}

Result<std::unique_ptr<Codec>> WrapTransforms(std::unique_ptr<Codec> base, const CodecSpec& spec) {
  const CodecInfo& b = base->info();
  if (b.lossless || b.code_bits < 1 || b.code_bits > 8) {
    return Status::InvalidArgument(
        "codec spec '" + spec.ToString() +
        "': +rot and +center apply to lossy codecs of 8 bits or fewer, and " + b.name +
        (b.lossless ? " is lossless" : " has " + std::to_string(b.code_bits) + "-bit codes"));
  }
  CodecInfo info;
  info.name = spec.ToString();
  info.code_bits = b.code_bits;
  info.lossless = false;
  info.role = b.role;
  info.summary = b.summary + (spec.rotate ? "; Hadamard-rotated head_dim" : "") +
                 (spec.center ? "; per-tile channel means subtracted" : "");
  // Scores: ||H q|| = ||q|| and ||y'_t|| = ||k'_t - mu||, so the base's bound carries over, with
  // ||k'_t|| read as ||k'_t - mu|| under +center (the same unless a token nearly cancels the
  // mean). Accumulate: H mixes the base's per-channel errors; it keeps their sum of squares, and
  // their maximum within 2x unless they line up with a row of H (worst case sqrt(dim)x).
  info.fused_rel_error = (spec.rotate ? 2.0 : 1.0) * b.fused_rel_error + kTransformRelError;
  auto codec =
      std::make_unique<TransformCodec>(std::move(info), std::move(base), spec.rotate, spec.center);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
