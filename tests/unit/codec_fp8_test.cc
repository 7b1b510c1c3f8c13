// fp8_e4m3 and fp8_e5m2: the tile layout, the per-element error bound, extreme and non-finite
// input, corrupt scales, and the AVX2 widening trick on every code. The properties shared by all
// codecs (fused vs decode, odd shapes, hostile bytes) are in codec_conformance_test.cc.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "argus/codec.h"
#include "core/fp8.h"
#include "test_util.h"

namespace argus {
namespace {

struct Format {
  const char* name;
  Fp8Format format;
  int mantissa_bits, bias;
};
constexpr Format kFormats[] = {{"fp8_e4m3", Fp8Format::kE4M3, 3, 7},
                               {"fp8_e5m2", Fp8Format::kE5M2, 2, 15}};

float ScaleOf(const std::vector<std::byte>& tile) {
  float scale;
  std::memcpy(&scale, tile.data(), 4);
  return scale;
}

TEST(Fp8Codec, TileIsScaleThenRowMajorCodes) {
  for (const Format& f : kFormats) {
    auto codec = testing::MakeCodec(f.name, KernelPath::kScalar);
    EXPECT_EQ(codec->info().code_bits, 8u);
    EXPECT_FALSE(codec->info().lossless);
    EXPECT_DOUBLE_EQ(codec->info().bits_per_value, 8.0 + 32.0 / (256 * 128));
    TileShape shape{5, 12};
    auto x = testing::RandomValues(shape.n_values(), 11);
    ASSERT_EQ(*codec->encoded_size(shape), 4 + shape.n_values());
    auto tile = testing::EncodeTile(*codec, x, shape);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float scale = amax / Fp8MaxFinite(f.format);
    EXPECT_EQ(ScaleOf(tile), scale) << f.name;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(static_cast<uint8_t>(tile[4 + i]), FloatToFp8(x[i] / scale, f.format))
          << f.name << " value " << i;
    }
    std::vector<float> decoded(x.size());
    ASSERT_TRUE(codec->decode(tile, shape, decoded.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(decoded[i], Fp8ToFloat(static_cast<uint8_t>(tile[4 + i]), f.format) * scale);
    }
  }
}

// |x' - x| <= 2^-(m+1) |x| + 2^-(b+m) scale, on magnitudes spread over 2^-30 .. 2^10 so that
// every binade of the format and its subnormals are hit; and the bound is attained (not loose).
TEST(Fp8Codec, ErrorIsHalfAnUlpOfTheBinadePlusHalfTheSubnormalQuantum) {
  std::mt19937_64 rng(testing::TestSeed());
  std::uniform_real_distribution<double> log2_magnitude(-30, 10);
  for (const Format& f : kFormats) {
    for (KernelPath path : testing::KernelPaths()) {
      auto codec = testing::MakeCodec(f.name, path);
      TileShape shape{64, 128};
      std::vector<float> x(shape.n_values());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<float>(std::exp2(log2_magnitude(rng)) * ((rng() & 1) ? 1 : -1));
      }
      auto tile = testing::EncodeTile(*codec, x, shape);
      const double scale = ScaleOf(tile);
      std::vector<float> decoded(x.size());
      ASSERT_TRUE(codec->decode(tile, shape, decoded.data()).ok());
      const double rel = std::ldexp(1.0, -(f.mantissa_bits + 1));
      const double quantum_half = std::ldexp(1.0, -(f.bias + f.mantissa_bits)) * scale;
      const double smallest_normal = std::ldexp(1.0, 1 - f.bias) * scale;
      double worst_ratio = 0, worst_normal_rel = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double err = std::fabs(double{decoded[i]} - x[i]);
        const double bound = (rel + 0x1p-23) * std::fabs(x[i]) + quantum_half * (1 + 0x1p-23);
        ASSERT_LE(err, bound) << f.name << " x=" << x[i] << " decoded=" << decoded[i];
        worst_ratio = std::max(worst_ratio, err / bound);
        if (std::fabs(x[i]) >= smallest_normal)
          worst_normal_rel = std::max(worst_normal_rel, err / std::fabs(x[i]));
      }
      // The sharp relative bound is rel / (1 + rel), at 2^e (1 + rel) which rounds to 2^e.
      EXPECT_GT(worst_normal_rel, 0.95 * rel / (1 + rel))
          << f.name << ": the relative bound should be tight";
      EXPECT_GT(worst_ratio, 0.5) << f.name;
    }
  }
}

TEST(Fp8Codec, AllZeroTileHasScaleOneAndDecodesToZeros) {
  for (const Format& f : kFormats) {
    auto codec = testing::MakeCodec(f.name, BestKernelPath());
    TileShape shape{3, 16};
    std::vector<float> x(shape.n_values(), 0.0f);
    auto tile = testing::EncodeTile(*codec, x, shape);
    EXPECT_EQ(ScaleOf(tile), 1.0f);
    std::vector<float> decoded(x.size(), 7.0f);
    ASSERT_TRUE(codec->decode(tile, shape, decoded.data()).ok());
    for (float v : decoded) EXPECT_EQ(v, 0.0f);
  }
}

// Tiles at the ends of float's range keep a normal scale whose largest value is finite: tiny
// tiles use the subnormal codes (within the absolute term of the bound), huge ones do not
// overflow on decode.
TEST(Fp8Codec, ExtremeMagnitudesKeepTheScaleNormalAndDecodedValuesFinite) {
  for (const Format& f : kFormats) {
    auto codec = testing::MakeCodec(f.name, BestKernelPath());
    TileShape shape{2, 8};
    for (float top : {std::numeric_limits<float>::max(), 1e30f, 1e-30f,
                      std::numeric_limits<float>::denorm_min()}) {
      std::vector<float> x(shape.n_values());
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = top * (i % 2 ? -1.0f : 1.0f) / static_cast<float>(1 + i % 5);
      auto tile = testing::EncodeTile(*codec, x, shape);
      const float scale = ScaleOf(tile);
      EXPECT_GE(scale, std::numeric_limits<float>::min()) << f.name << " top " << top;
      std::vector<float> decoded(x.size());
      ASSERT_TRUE(codec->decode(tile, shape, decoded.data()).ok()) << f.name << " top " << top;
      const double rel = std::ldexp(1.0, -(f.mantissa_bits + 1));
      const double quantum_half = std::ldexp(1.0, -(f.bias + f.mantissa_bits)) * scale;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(decoded[i])) << f.name << " top " << top;
        ASSERT_LE(std::fabs(double{decoded[i]} - x[i]),
                  (rel + 0x1p-22) * std::fabs(x[i]) + quantum_half * 1.001)
            << f.name << " top " << top << " value " << i;
      }
    }
  }
}

TEST(Fp8Codec, NonFiniteInputIsInvalidArgumentNamingThePosition) {
  for (const Format& f : kFormats) {
    auto codec = testing::MakeCodec(f.name, BestKernelPath());
    TileShape shape{4, 8};
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      auto x = testing::RandomValues(shape.n_values(), 2);
      x[2 * 8 + 5] = bad;
      std::vector<std::byte> tile(*codec->encoded_size(shape));
      Status status = codec->encode(x.data(), shape, tile);
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(status.message().find("token 2, channel 5 of a 4x8 tile"), std::string::npos)
          << status.ToString();
    }
  }
}

// Scales that encode never writes (zero, negative, subnormal, non-finite, or so large that the
// largest code overflows) are Corruption on every reading method.
TEST(Fp8Codec, ImpossibleScaleIsCorruption) {
  for (const Format& f : kFormats) {
    for (KernelPath path : testing::KernelPaths()) {
      auto codec = testing::MakeCodec(f.name, path);
      TileShape shape{3, 16};
      auto tile = testing::EncodeTile(*codec, testing::RandomValues(shape.n_values(), 4), shape);
      for (float bad :
           {0.0f, -1.0f, 1e-40f, std::numeric_limits<float>::quiet_NaN(),
            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max()}) {
        std::memcpy(tile.data(), &bad, 4);
        std::vector<float> out(shape.n_values()), q(16, 1.0f), p(3, 1.0f), acc(16);
        EXPECT_EQ(codec->decode(tile, shape, out.data()).code(), StatusCode::kCorruption)
            << f.name << " " << bad;
        EXPECT_EQ(codec->scores(tile, shape, q.data(), 1, out.data()).code(),
                  StatusCode::kCorruption);
        EXPECT_EQ(codec->accumulate(tile, shape, p.data(), 1, acc.data()).code(),
                  StatusCode::kCorruption);
      }
    }
  }
}

// The AVX2 kernels widen codes through fp16 bit patterns (E5M2 << 8; E4M3 to 2^-8 times its
// value). One-hot queries and weights make the fused results equal single decoded values
// exactly, so this checks the widening on every finite code of both formats.
TEST(Fp8Codec, VectorWideningIsExactForEveryFiniteCode) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  for (const Format& f : kFormats) {
    auto codec = testing::MakeCodec(f.name, KernelPath::kAvx2);
    std::vector<uint8_t> codes;
    for (int c = 0; c < 256; ++c) {
      if (std::isfinite(Fp8ToFloat(static_cast<uint8_t>(c), f.format)))
        codes.push_back(static_cast<uint8_t>(c));
    }
    // Rows of 24 channels: 16 go through the 8-wide loads, the last 8 through the 16-wide
    // accumulate blocks' remainder; a dim of 27 adds scalar tails.
    for (uint32_t dim : {24u, 27u}) {
      TileShape shape{static_cast<uint32_t>((codes.size() + dim - 1) / dim), dim};
      std::vector<std::byte> tile(*codec->encoded_size(shape));
      const float scale = 0.75f;
      std::memcpy(tile.data(), &scale, 4);
      for (size_t i = 0; i < shape.n_values(); ++i)
        tile[4 + i] = static_cast<std::byte>(codes[i % codes.size()]);
      auto expect = [&](size_t i) { return Fp8ToFloat(codes[i % codes.size()], f.format) * scale; };
      for (uint32_t d = 0; d < dim; ++d) {
        std::vector<float> q(dim, 0.0f), s(shape.tokens);
        q[d] = 1.0f;
        ASSERT_TRUE(codec->scores(tile, shape, q.data(), 1, s.data()).ok());
        for (uint32_t t = 0; t < shape.tokens; ++t) {
          ASSERT_EQ(s[t], expect(size_t{t} * dim + d))
              << f.name << " code " << int{codes[(t * dim + d) % codes.size()]};
        }
      }
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        std::vector<float> p(shape.tokens, 0.0f), acc(dim, 0.0f);
        p[t] = 1.0f;
        ASSERT_TRUE(codec->accumulate(tile, shape, p.data(), 1, acc.data()).ok());
        for (uint32_t d = 0; d < dim; ++d) ASSERT_EQ(acc[d], expect(size_t{t} * dim + d)) << f.name;
      }
    }
  }
}

TEST(Fp8Codec, GroupingOptionIsRefused) {
  EXPECT_EQ(CodecRegistry::Default().Create("fp8_e4m3:channel").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace argus
