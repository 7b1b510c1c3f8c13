// nl3, nl2: 3- and 2-bit codes on the Lloyd-Max levels of a Gaussian, one fp16 scale per block
// of 64 values (3.25 and 2.25 bits per value). A token's values in one head are close to
// Gaussian, and on Gaussian values nl2's squared error is 0.7x that of int2, which spends 0.75
// bits more per value on evenly spaced levels between a minimum and a scale.
//
// A [tokens, dim] tile is ceil(tokens * dim / 64) blocks of 64 consecutive values in row-major
// order (the last zero-padded), each fp16 d then a code block (codes64.h); value j = d *
// level[code j] with the int8 levels of codes64.h.
//
// Encoding searches d: from each of 3 starting points rms(x) * (0.85, 1.00, 1.15) / (the
// levels' scale of a unit Gaussian) it takes the nearest codes, then twice the least-squares d
// for the codes (rounded to fp16) and the nearest codes for that d; the d of least squared error
// wins. (Thirteen starting points from 0.70 to 1.30 encoded 4x slower and moved stories-distill's
// perplexity by under 0.1%, in both directions.)
// Decoding is exact in float (an fp16 times an int8), so the float kernels' products are exact
// and their sums round as f16's do; the AVX-512 accumulate rounds its weights (below).
#include <algorithm>
#include <cmath>

#include "argus/core.h"
#include "codec/affine_kernels.h"
#include "codec/codec_internal.h"
#include "codec/codes64.h"

namespace argus::codec_internal {
namespace {

// The int8 levels are a unit Gaussian's Lloyd-Max levels times these.
constexpr float kLevelsPerUnit3 = 127.0f / 2.1520f, kLevelsPerUnit2 = 127.0f / 1.5104f;

// The code of the level nearest v: how many midpoints between consecutive levels lie below it
// (a tie goes to the lower level).
uint8_t NearestLevel(const int8_t* levels, uint32_t n_levels, float v) {
  uint32_t code = 0;
  for (uint32_t c = 1; c < n_levels; ++c)
    code += v > 0.5f * static_cast<float>(levels[c - 1] + levels[c]) ? 1 : 0;
  return static_cast<uint8_t>(code);
}

class NonUniformCodec final : public CodecBase {
 public:
  NonUniformCodec(CodecInfo info, KernelPath path, uint32_t bits)
      : CodecBase(std::move(info), path, KernelPath::kAvx512), bits_(bits) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    return NumBlocks64(shape) * NlBlockBytes(bits_);
  }

 private:
  static size_t NumBlocks64(TileShape shape) {
    return (shape.n_values() + kCodeBlockValues - 1) / kCodeBlockValues;
  }

  // Squared error of x[0..n) coded with step d (nearest levels); their codes into `codes`.
  double Fit(const float* x, uint32_t n, float d, uint8_t* codes) const {
    const int8_t* levels = NlLevels(bits_);
    const float inv = d > 0 ? 1.0f / d : 0.0f;
    double err = 0;
    for (uint32_t i = 0; i < n; ++i) {
      codes[i] = NearestLevel(levels, 1u << bits_, x[i] * inv);
      const double e = double{x[i]} - double{d} * levels[codes[i]];
      err += e * e;
    }
    return err;
  }

  // The fp16 step of least squared error for x[0..n) (the search above).
  uint16_t SearchStep(const float* x, uint32_t n, uint8_t* codes) const {
    double sum_sq = 0;
    for (uint32_t i = 0; i < n; ++i) sum_sq += double{x[i]} * x[i];
    if (sum_sq == 0) return 0;
    const int8_t* levels = NlLevels(bits_);
    const double rms = std::sqrt(sum_sq / n);
    const double per_unit = bits_ == 3 ? kLevelsPerUnit3 : kLevelsPerUnit2;
    uint16_t best = 0;
    double best_err = sum_sq;  // d = 0
    for (int k = 0; k < 3; ++k) {
      Fit(x, n, static_cast<float>(rms * (0.85 + 0.15 * k) / per_unit), codes);
      for (int iteration = 0; iteration < 2; ++iteration) {
        double num = 0, den = 0;
        for (uint32_t i = 0; i < n; ++i) {
          num += double{x[i]} * levels[codes[i]];
          den += static_cast<double>(levels[codes[i]]) * levels[codes[i]];
        }
        const uint16_t d_h = FloatToHalf(static_cast<float>(num / den));
        const double err = Fit(x, n, HalfToFloat(d_h), codes);
        if (err < best_err) best_err = err, best = d_h;
      }
    }
    return best;
  }

  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    if (!WithinHalfRange(x, shape.n_values())) {
      return Status::InvalidArgument(info_.name +
                                     ": input values must be finite and within +-65504 "
                                     "(the range of its fp16 scales)");
    }
    std::fill(out.begin(), out.end(), std::byte{0});
    const size_t n = shape.n_values();
    uint8_t codes[kCodeBlockValues];
    for (size_t b = 0; b < NumBlocks64(shape); ++b) {
      const size_t first = b * kCodeBlockValues;
      const uint32_t count = static_cast<uint32_t>(std::min<size_t>(kCodeBlockValues, n - first));
      std::byte* block = out.data() + b * NlBlockBytes(bits_);
      const uint16_t d_h = SearchStep(x + first, count, codes);
      Fit(x + first, count, HalfToFloat(d_h), codes);
      std::fill(codes + count, codes + kCodeBlockValues, uint8_t{0});
      StoreU16(block, d_h);
      PackCodes64(codes, bits_, block + 2);
    }
    return Status::Ok();
  }

  // Block b's 64 values; a non-finite or negative d (hostile bytes) decodes as given.
  void DecodeBlock(const std::byte* tile, size_t b, float* x) const {
    const std::byte* block = tile + b * NlBlockBytes(bits_);
    const float d = HalfToFloat(LoadU16(block));
    uint8_t codes[kCodeBlockValues];
    UnpackCodes64(block + 2, bits_, codes);
    const int8_t* levels = NlLevels(bits_);
    for (uint32_t j = 0; j < kCodeBlockValues; ++j) x[j] = d * levels[codes[j]];
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    const size_t n = shape.n_values();
    float block[kCodeBlockValues];
    for (size_t b = 0; b < NumBlocks64(shape); ++b) {
      DecodeBlock(in.data(), b, block);
      const size_t first = b * kCodeBlockValues;
      std::copy_n(block, std::min<size_t>(kCodeBlockValues, n - first), x + first);
    }
    return Status::Ok();
  }

  bool Vector(TileShape shape) const {
    return path_ >= KernelPath::kAvx2 && shape.dim % kCodeBlockValues == 0;
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    if (Vector(shape)) {
      (path_ == KernelPath::kAvx512 ? NlScoresAvx512 : NlScoresAvx2)(k.data(), bits_, shape.tokens,
                                                                     shape.dim, q, n_q, s);
    } else {
      ScoresByBlocks<kCodeBlockValues>(shape, q, n_q, s,
                                       [&](size_t b, float* x) { DecodeBlock(k.data(), b, x); });
    }
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    if (Vector(shape)) {
      // The integer path rounds p * d to unsigned bytes: p must be finite and non-negative.
      const bool integer = path_ == KernelPath::kAvx512 &&
                           AllWithinAvx512(p, size_t{n_q} * shape.tokens, 0.0f, 1e30f);
      (integer ? NlAccumulateAvx512 : NlAccumulateAvx2)(v.data(), bits_, shape.tokens, shape.dim, p,
                                                        n_q, acc);
    } else {
      AccumulateByBlocks<kCodeBlockValues>(
          shape, p, n_q, acc, [&](size_t b, float* x) { DecodeBlock(v.data(), b, x); });
    }
    return Status::Ok();
  }

  uint32_t bits_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeNonUniformCodec(const CodecSpec& spec) {
  uint32_t bits;
  if (spec.name == "nl3") {
    bits = 3;
  } else if (spec.name == "nl2") {
    bits = 2;
  } else {
    return Status::NotFound("no non-uniform codec named '" + spec.name + "'");
  }
  CodecInfo info;
  info.name = spec.name;
  info.code_bits = bits;
  info.role = CodecRole::kBoth;
  info.summary = std::to_string(bits) +
                 "-bit codes on a Gaussian's Lloyd-Max levels, one fp16 scale per 64 values";
  // The AVX-512 accumulate rounds each 16 tokens' p * d to 8 bits: per output element the error
  // is at most (max p d / 510) * 16 * 127, and max p d <= p ||v|| / (14 sqrt(64)) for the token
  // that has it (|level| >= 14, 64 | dim): 0.036 of sum_t p_t ||v_t||. Scores round as f16's.
  info.fused_rel_error = 0.036;
  auto codec = std::make_unique<NonUniformCodec>(std::move(info), spec.path, bits);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
