// The 2- and 3-bit codecs: nl3/nl2 (Lloyd-Max levels, one scale per 64 values) and chan3/chan2
// (keys per channel over 16 tokens). Formats checked against tiles written by hand from
// docs/codecs.md, errors against the Gaussian quantiser theory and per-element bounds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus {
namespace {

std::vector<float> NormalValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

double DecodedMeanSquaredError(const std::string& spec, const std::vector<float>& x,
                               TileShape shape) {
  auto codec = testing::MakeCodec(spec, KernelPath::kScalar);
  const auto tile = testing::EncodeTile(*codec, x, shape);
  std::vector<float> y(x.size());
  EXPECT_TRUE(codec->decode(tile, shape, y.data()).ok());
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
  return sum / static_cast<double>(x.size());
}

TEST(NonUniformCodec, DecodesAHandWrittenBlock) {
  // One 64-value block, d = 0.5 (fp16 0x3800), code j = j % 8: low bits j % 4 at bit 2 (j / 16)
  // of byte j % 16, high bit (j % 8) / 4 at bit j % 8 of byte 16 + j / 8.
  std::vector<std::byte> tile(2 + 24, std::byte{0});
  tile[0] = std::byte{0x00};
  tile[1] = std::byte{0x38};
  for (uint32_t j = 0; j < 64; ++j) {
    const uint32_t code = j % 8;
    tile[2 + j % 16] |= static_cast<std::byte>((code & 3) << (2 * (j / 16)));
    tile[2 + 16 + j / 8] |= static_cast<std::byte>((code >> 2) << (j % 8));
  }
  const int levels[8] = {-127, -79, -45, -14, 14, 45, 79, 127};
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec("nl3", path);
    std::vector<float> x(64);
    ASSERT_TRUE(codec->decode(tile, {1, 64}, x.data()).ok());
    for (uint32_t j = 0; j < 64; ++j) EXPECT_EQ(x[j], 0.5f * levels[j % 8]) << j;
    // Scores of a one-hot query read single values back through the fused kernel.
    std::vector<float> q(64, 0.0f), s(1);
    q[13] = 1.0f;
    ASSERT_TRUE(codec->scores(tile, {1, 64}, q.data(), 1, s.data()).ok());
    EXPECT_EQ(s[0], 0.5f * levels[13 % 8]);
  }
}

// On Gaussian values the error is within 15% of the Lloyd-Max quantiser's (0.0345 and 0.1175
// of the variance at 3 and 2 bits; the per-block scale costs a little), and at 2 bits under 3/4
// of the evenly spaced int2's, which spends 0.75 bits more on a scale and minimum per 32 values.
TEST(NonUniformCodec, GaussianErrorIsNearTheLloydMaxQuantisers) {
  const TileShape shape{256, 64};
  const auto x = NormalValues(shape.n_values(), 5);
  EXPECT_LE(DecodedMeanSquaredError("nl3", x, shape), 0.0345 * 1.15);
  EXPECT_LE(DecodedMeanSquaredError("nl2", x, shape), 0.1175 * 1.15);
  EXPECT_LE(DecodedMeanSquaredError("nl2", x, shape),
            DecodedMeanSquaredError("int2", x, shape) * 3 / 4);
  EXPECT_LT(DecodedMeanSquaredError("nl3", x, shape), DecodedMeanSquaredError("nl2", x, shape) / 3);
}

TEST(Channel16Codec, DecodesAHandWrittenGroup) {
  // One token of 64 channels: base -1 (fp16 0xbc00), unit 0.5 (0x3800), top 0.25 (0x3400);
  // channel d has offset d % 32 and exponent d % 64 (11-bit fields, little-endian), code d % 8.
  const uint32_t dim = 64, meta = 6 + (dim * 11 + 7) / 8;
  std::vector<std::byte> tile(meta + 24, std::byte{0});
  const uint16_t header[3] = {0xbc00, 0x3800, 0x3400};
  std::memcpy(tile.data(), header, 6);
  for (uint32_t d = 0; d < dim; ++d) {
    const uint32_t field = (d % 32) | (d % 64) << 5;
    for (uint32_t i = 0; i < 11; ++i) {
      const uint32_t bit = d * 11 + i;
      tile[6 + bit / 8] |= static_cast<std::byte>(((field >> i) & 1) << (bit % 8));
    }
    const uint32_t code = d % 8;
    tile[meta + d % 16] |= static_cast<std::byte>((code & 3) << (2 * (d / 16)));
    tile[meta + 16 + d / 8] |= static_cast<std::byte>((code >> 2) << (d % 8));
  }
  auto codec = testing::MakeCodec("chan3", KernelPath::kScalar);
  std::vector<float> x(dim);
  ASSERT_TRUE(codec->decode(tile, {1, dim}, x.data()).ok());
  for (uint32_t d = 0; d < dim; ++d) {
    const float min = -1.0f + static_cast<float>(d % 32) * 0.5f;
    const float step = 0.25f * static_cast<float>(std::exp2(-static_cast<double>(d % 64) / 8));
    EXPECT_NEAR(x[d], min + step * static_cast<float>(d % 8), 1e-6f * (1 + std::fabs(x[d])))
        << "channel " << d;
  }
}

// Every value is within half its channel's step of the input: the step spans the channel's range
// over its 16 tokens plus at most one unit of the offset grid ((greatest - least channel minimum)
// / 31), widened by at most 2^(1/8) by the exponent grid. A channel 30x wider than the others,
// with a mean of 40, widens their steps only through that unit.
TEST(Channel16Codec, ErrorsStayWithinEachChannelsStep) {
  const TileShape shape{40, 64};
  auto x = NormalValues(shape.n_values(), 9);
  for (uint32_t t = 0; t < shape.tokens; ++t)
    x[size_t{t} * 64 + 5] = 30 * x[size_t{t} * 64 + 5] + 40;
  for (const char* spec : {"chan3", "chan2"}) {
    auto codec = testing::MakeCodec(spec, KernelPath::kScalar);
    const double top_code = std::string(spec) == "chan3" ? 7 : 3;
    const auto tile = testing::EncodeTile(*codec, x, shape);
    std::vector<float> y(x.size());
    ASSERT_TRUE(codec->decode(tile, shape, y.data()).ok());
    for (uint32_t first = 0; first < shape.tokens; first += 16) {
      const uint32_t last = std::min(first + 16, shape.tokens);
      std::vector<float> lo(64, INFINITY), hi(64, -INFINITY);
      for (uint32_t t = first; t < last; ++t) {
        for (uint32_t d = 0; d < 64; ++d) {
          lo[d] = std::min(lo[d], x[size_t{t} * 64 + d]);
          hi[d] = std::max(hi[d], x[size_t{t} * 64 + d]);
        }
      }
      const double unit =
          (*std::max_element(lo.begin(), lo.end()) - *std::min_element(lo.begin(), lo.end())) /
          31.0 * 1.002;
      for (uint32_t d = 0; d < 64; ++d) {
        const double bound = (hi[d] - lo[d] + unit) / top_code * std::exp2(0.125) / 2 * 1.002;
        for (uint32_t t = first; t < last; ++t) {
          const size_t i = size_t{t} * 64 + d;
          ASSERT_LE(std::fabs(x[i] - y[i]), bound) << spec << " token " << t << " channel " << d;
        }
      }
    }
  }
}

TEST(Channel16Codec, HoldsKeysOnlyAndRejectsBadHeaders) {
  auto codec = testing::MakeCodec("chan2", KernelPath::kScalar);
  const TileShape shape{16, 64};
  auto tile = testing::EncodeTile(*codec, NormalValues(shape.n_values(), 1), shape);
  std::vector<float> p(16, 0.1f), acc(64), x(shape.n_values());
  EXPECT_EQ(codec->accumulate(tile, shape, p.data(), 1, acc.data()).code(),
            StatusCode::kUnsupported);
  const uint16_t nan = 0x7e00;
  std::memcpy(tile.data() + 4, &nan, 2);  // top
  const Status status = codec->decode(tile, shape, x.data());
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
}

}  // namespace
}  // namespace argus
