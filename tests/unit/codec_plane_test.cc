// plane8 and its prefixes plane8/4, plane8/2: sizes, the prefix property (a shorter codec's tile
// is the first bytes of a longer one's, and decodes as the sliced codes at the midpoint of the
// dropped bits), and the error bounds d / 2 and 2^(7-k) d. The fused kernels, shared with the
// affine codecs, are tested in codec_affine_test.cc (CodedTileKernels) and by the conformance test.
#include <cmath>
#include <cstring>

#include "argus/codec.h"
#include "argus/core.h"
#include "codec/affine_kernels.h"
#include "test_util.h"

namespace argus {
namespace {

// The step d of value i's block, read from the tile's first 2 n_blocks bytes.
float StepOf(const std::vector<std::byte>& tile, TileShape shape, size_t i) {
  uint32_t n_rows, row_len;
  codec_internal::TokenRows(shape.tokens, shape.dim, &n_rows, &row_len);
  const size_t index = codec_internal::TokenMetaIndex(
      n_rows, row_len, static_cast<uint32_t>(i / row_len), static_cast<uint32_t>(i % row_len / 32));
  uint16_t h;
  std::memcpy(&h, tile.data() + 2 * index, 2);
  return HalfToFloat(h);
}

constexpr TileShape kPlaneShapes[] = {{1, 64},   {31, 80},   {33, 96}, {97, 128},
                                 {54, 256}, {256, 128}, {7, 8},   {40, 3}};
constexpr uint32_t kPrefixBits[] = {8, 4, 2};

std::string SpecOf(uint32_t bits) {
  return bits == 8 ? "plane8" : "plane8/" + std::to_string(bits);
}

TEST(PlaneCodec, BitsPerValueAre8p5And4p5And2p5) {
  EXPECT_DOUBLE_EQ(testing::MakeCodec("plane8")->info().bits_per_value, 8.5);
  EXPECT_DOUBLE_EQ(testing::MakeCodec("plane8/4")->info().bits_per_value, 4.5);
  EXPECT_DOUBLE_EQ(testing::MakeCodec("plane8/2")->info().bits_per_value, 2.5);
  EXPECT_EQ(CodecRegistry::Default().Create("plane8:channel").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PlaneCodec, ShorterTilesAreThePrefixesOfLongerOnes) {
  auto full = testing::MakeCodec("plane8");
  for (TileShape shape : kPlaneShapes) {
    auto x = testing::RandomValues(shape.n_values(), shape.tokens + 13 * shape.dim);
    auto tile8 = testing::EncodeTile(*full, x, shape);
    for (uint32_t bits : {4u, 2u}) {
      auto tile = testing::EncodeTile(*testing::MakeCodec(SpecOf(bits)), x, shape);
      ASSERT_LE(tile.size(), tile8.size());
      EXPECT_TRUE(std::equal(tile.begin(), tile.end(), tile8.begin()))
          << SpecOf(bits) << " " << shape.tokens << "x" << shape.dim;
    }
  }
}

// Demoting by truncation decodes exactly as slicing the full codes, c >> (8 - k), and putting
// each at the midpoint of the codes it stands for: c' = (p << (8 - k)) + (2^(8-k) - 1) / 2.
TEST(PlaneCodec, APrefixDecodesAsTheSlicedCodesAtTheirMidpoint) {
  auto full = testing::MakeCodec("plane8");
  for (TileShape shape : kPlaneShapes) {
    auto x = testing::RandomValues(shape.n_values(), 3 * shape.tokens + shape.dim);
    auto tile8 = testing::EncodeTile(*full, x, shape);
    auto y8 = testing::DecodeTile(*full, tile8, shape);
    for (uint32_t bits : {4u, 2u}) {
      auto codec = testing::MakeCodec(SpecOf(bits));
      const size_t n_bytes = *codec->encoded_size(shape);
      auto y = testing::DecodeTile(*codec, std::span<const std::byte>(tile8).first(n_bytes), shape);
      const uint32_t dropped = 8 - bits;
      for (size_t i = 0; i < shape.n_values(); ++i) {
        const float d = StepOf(tile8, shape, i);
        if (d == 0) {
          ASSERT_EQ(y[i], 0.0f);
          continue;
        }
        const int code = static_cast<int>(y8[i] / d + 127.5f);  // exact: y8 = (c - 127.5) d
        ASSERT_EQ((static_cast<float>(code) - 127.5f) * d, y8[i]);
        const float midpoint =
            static_cast<float>((code >> dropped) << dropped) + ((1 << dropped) - 1) / 2.0f;
        ASSERT_EQ(y[i], (midpoint - 127.5f) * d) << SpecOf(bits) << " value " << i;
      }
    }
  }
}

TEST(PlaneCodec, ErrorIsAtMostHalfAStepAndAPrefixsHalfCode) {
  for (uint32_t bits : kPrefixBits) {
    auto codec = testing::MakeCodec(SpecOf(bits));
    for (TileShape shape : kPlaneShapes) {
      auto x = testing::RandomValues(shape.n_values(), shape.tokens * 5 + shape.dim, 3.0f);
      auto tile = testing::EncodeTile(*codec, x, shape);
      auto y = testing::DecodeTile(*codec, tile, shape);
      for (size_t i = 0; i < shape.n_values(); ++i) {
        const double d = StepOf(tile, shape, i);
        ASSERT_LE(std::fabs(double{x[i]} - y[i]),
                  std::ldexp(d, 7 - static_cast<int>(bits)) * (1 + 1e-4))
            << SpecOf(bits) << " " << shape.tokens << "x" << shape.dim << " value " << i;
      }
      // d is amax / 127.5 rounded up to fp16: never more than one fp16 step above.
      for (size_t b = 0; b * 32 < shape.n_values(); ++b) {
        float amax = 0;
        for (size_t i = b * 32; i < std::min(shape.n_values(), b * 32 + 32); ++i)
          amax = std::max(amax, std::fabs(x[i]));
        const double d = StepOf(tile, shape, b * 32);
        EXPECT_GE(d, amax / 127.5);
        EXPECT_LE(d, amax / 127.5 * (1 + std::ldexp(1.0, -10)) + std::ldexp(1.0, -24));
      }
    }
  }
}

TEST(PlaneCodec, ZeroBlocksDecodeToZeroAndCodesAreSymmetric) {
  const TileShape shape{4, 64};
  std::vector<float> x(shape.n_values(), 0.0f);
  for (size_t i = 128; i < x.size(); ++i)
    x[i] = (i % 2 ? 1.0f : -1.0f) * static_cast<float>(i % 13);
  for (uint32_t bits : kPrefixBits) {
    auto codec = testing::MakeCodec(SpecOf(bits));
    auto y = testing::DecodeTile(*codec, testing::EncodeTile(*codec, x, shape), shape);
    for (size_t i = 0; i < 128; ++i) ASSERT_EQ(y[i], 0.0f);
    // +-v decode to +-v', except at exact ties such as 0 (x / d + 127.5 = 127.5 rounds up to 128).
    std::vector<float> neg(x.size());
    for (size_t i = 0; i < x.size(); ++i) neg[i] = -x[i];
    auto yn = testing::DecodeTile(*codec, testing::EncodeTile(*codec, neg, shape), shape);
    for (size_t i = 128; i < x.size(); ++i) {
      if (x[i] != 0) {
        ASSERT_EQ(yn[i], -y[i]) << SpecOf(bits) << " value " << i;
      }
    }
  }
}

TEST(PlaneCodec, NonFiniteOrOutOfHalfRangeInputIsInvalidArgument) {
  auto codec = testing::MakeCodec("plane8");
  const TileShape shape{2, 32};
  std::vector<std::byte> tile(*codec->encoded_size(shape));
  std::vector<float> x(shape.n_values(), 1.0f);
  x[9] = NAN;
  EXPECT_EQ(codec->encode(x.data(), shape, tile).code(), StatusCode::kInvalidArgument);
  x[9] = 1e6f;
  EXPECT_EQ(codec->encode(x.data(), shape, tile).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace argus
