// int8 / int4 / int2 per token and per channel: names and sizes, the documented byte layout, the
// element error bound derived in affine.cc, what each grouping isolates, and the fused kernels
// of every coded-tile codec (these and plane8's): the channel grouping against decode-then-dot
// (the conformance test covers the registry's per-token instances), data with outlier channels,
// the integer kernels' typical error against their stated bound, the AVX-512 kernels on every
// count of heads and every tail, a head's result independent of the other heads of its call, and
// the scalar fallbacks.
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "argus/codec.h"
#include "argus/core.h"
#include "codec/affine_kernels.h"
#include "test_util.h"

namespace argus {
namespace {

float HalfAt(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

using testing::Norm;

// Keys shaped like a model's: most channels N(0, 1), every 16th channel 20x wider around a mean
// of 8 (the outlier channels that motivate per-channel grouping), plus RandomValues' outliers.
std::vector<float> OutlierChannels(TileShape shape, uint64_t salt) {
  auto x = testing::RandomValues(shape.n_values(), salt);
  for (size_t i = 0; i < x.size(); ++i) {
    if (i % shape.dim % 16 == 3) x[i] = 20.0f * x[i] + 8.0f;
  }
  return x;
}

const char* const kAffineSpecs[] = {"int8",         "int4",         "int2",
                                    "int8:channel", "int4:channel", "int2:channel"};
const char* const kCodedTileSpecs[] = {"int8",         "int4",         "int2",
                                       "int8:channel", "int4:channel", "int2:channel",
                                       "plane8",       "plane8/4",     "plane8/2"};
constexpr TileShape kAffineShapes[] = {{1, 64},    {31, 80}, {33, 96}, {97, 128}, {54, 256},
                                       {256, 128}, {7, 8},   {40, 3},  {9, 5}};

std::string ShapeName(TileShape shape) {
  return std::to_string(shape.tokens) + "x" + std::to_string(shape.dim);
}

TEST(AffineCodec, NamesAlwaysStateTheGrouping) {
  EXPECT_EQ(testing::MakeCodec("int4")->info().name, "int4:token");
  EXPECT_EQ(testing::MakeCodec("int4:token")->info().name, "int4:token");
  EXPECT_EQ(testing::MakeCodec("int8:channel")->info().name, "int8:channel");
  EXPECT_EQ(testing::MakeCodec("int2")->info().code_bits, 2u);
}

TEST(AffineCodec, BitsPerValueAtHeadDim128Are9And5And3) {
  for (std::string grouping : {":token", ":channel"}) {
    EXPECT_DOUBLE_EQ(testing::MakeCodec("int8" + grouping)->info().bits_per_value, 9.0);
    EXPECT_DOUBLE_EQ(testing::MakeCodec("int4" + grouping)->info().bits_per_value, 5.0);
    EXPECT_DOUBLE_EQ(testing::MakeCodec("int2" + grouping)->info().bits_per_value, 3.0);
  }
}

// Values chosen so every block has minimum 0 and scale 1 (code = value) land where
// affine_kernels.h says: panel p at 32 p U, unit u at + 4 m u, byte 4k + c, 8/w chunks a unit;
// scales and minimums in (panel, column, row) order.
TEST(AffineCodec, CodesAndScalesSitWhereTheLayoutSays) {
  const TileShape shape{11, 64};  // panels of 8 and 3 rows, two blocks per row
  for (uint32_t bits : {8u, 4u, 2u}) {
    const uint32_t max_code = (1u << bits) - 1;
    std::vector<float> x(shape.n_values());
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      for (uint32_t c = 0; c < shape.dim; ++c) {
        const uint32_t value = c % 32 == 0   ? 0
                               : c % 32 == 1 ? max_code
                                             : (t * 7 + c * 3) % (max_code + 1);
        x[t * shape.dim + c] = static_cast<float>(value);
      }
    }
    auto tile = testing::EncodeTile(*testing::MakeCodec("int" + std::to_string(bits)), x, shape);
    const size_t n_blocks = shape.n_values() / 32, units = shape.dim / 4 * bits / 8;
    const std::byte* plane = tile.data() + 4 * n_blocks;
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const uint32_t p = t / 8, m = p == 0 ? 8 : 3, k = t % 8;
      for (uint32_t c = 0; c < shape.dim; ++c) {
        const uint32_t chunk = c / 4, per_unit = 8 / bits;
        const size_t at = 32 * p * units + 4 * m * (chunk / per_unit) + 4 * k + c % 4;
        const uint32_t code =
            (std::to_integer<uint32_t>(plane[at]) >> (bits * (chunk % per_unit))) & max_code;
        ASSERT_EQ(code, static_cast<uint32_t>(x[t * shape.dim + c]))
            << bits << " bits, token " << t << ", channel " << c;
      }
      for (uint32_t j = 0; j < 2; ++j) {
        const size_t index = size_t{16} * p + size_t{m} * j + k;
        EXPECT_EQ(index, codec_internal::TokenMetaIndex(shape.tokens, shape.dim, t, j));
        EXPECT_EQ(HalfAt(tile.data() + 2 * index), 1.0f);
        EXPECT_EQ(HalfAt(tile.data() + 2 * (n_blocks + index)), 0.0f);
      }
    }
  }
}

// |x - x'| <= scale / 2 (+ float rounding) with the stored scale, and the stored scale is the
// group's (range + ulp16(min)) / (2^b - 1), rounded up to fp16, nothing more.
TEST(AffineCodec, ErrorIsAtMostHalfAScaleAndTheScaleIsTight) {
  for (const char* spec : kAffineSpecs) {
    auto codec = testing::MakeCodec(spec);
    const bool channel = std::string(spec).find(":channel") != std::string::npos;
    const uint32_t max_code = (1u << codec->info().code_bits) - 1;
    for (TileShape shape : kAffineShapes) {
      SCOPED_TRACE(std::string(spec) + " " + ShapeName(shape));
      auto x = OutlierChannels(shape, shape.tokens * 3 + shape.dim);
      auto tile = testing::EncodeTile(*codec, x, shape);
      auto y = testing::DecodeTile(*codec, tile, shape);
      const size_t n = shape.n_values();
      uint32_t n_rows, row_len;
      codec_internal::TokenRows(shape.tokens, shape.dim, &n_rows, &row_len);
      const size_t n_meta = channel ? size_t{(shape.tokens + 31) / 32} * shape.dim : (n + 31) / 32;
      // Group of each value: its metadata index and its members.
      auto group_of = [&](size_t i) -> size_t {
        const uint32_t t = static_cast<uint32_t>(i / shape.dim),
                       d = static_cast<uint32_t>(i % shape.dim);
        if (channel) return size_t{t / 32} * shape.dim + d;
        return codec_internal::TokenMetaIndex(n_rows, row_len, static_cast<uint32_t>(i / row_len),
                                              static_cast<uint32_t>(i % row_len / 32));
      };
      std::vector<float> lo(n_meta, INFINITY), hi(n_meta, -INFINITY);
      for (size_t i = 0; i < n; ++i) {
        lo[group_of(i)] = std::min(lo[group_of(i)], x[i]);
        hi[group_of(i)] = std::max(hi[group_of(i)], x[i]);
      }
      for (size_t i = 0; i < n; ++i) {
        const size_t g = group_of(i);
        const double scale = HalfAt(tile.data() + 2 * g);
        ASSERT_LE(std::fabs(double{x[i]} - y[i]), scale / 2 * (1 + 1e-4) + 1.2e-7 * std::fabs(y[i]))
            << "value " << i;
        const double ulp_lo = std::fabs(lo[g]) * std::ldexp(1.0, -10) + std::ldexp(1.0, -24);
        ASSERT_LE(scale, (double{hi[g]} - lo[g] + ulp_lo) / max_code * (1 + std::ldexp(1.0, -10)) +
                             std::ldexp(1.0, -24))
            << "group " << g;
      }
    }
  }
}

TEST(AffineCodec, ConstantGroupsDecodeExactly) {
  for (const char* spec : kAffineSpecs) {
    auto codec = testing::MakeCodec(spec);
    const TileShape shape{40, 64};
    std::vector<float> x(shape.n_values(), -2.75f);
    EXPECT_EQ(testing::DecodeTile(*codec, testing::EncodeTile(*codec, x, shape), shape), x) << spec;
  }
}

// A channel with a large offset and range ruins the per-token blocks it shares, and only itself
// when grouped per channel: what KIVI's key grouping is for. Values in [-1, 1], channel 5 at
// 1000 +- 50: per channel, channel 0's step is 2/15; per token, its block's is about 70 and every
// value of channel 0 lands on the block minimum.
TEST(AffineCodec, ChannelGroupingConfinesAnOutlierChannel) {
  const TileShape shape{64, 128};
  std::vector<float> x(shape.n_values());
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    for (uint32_t d = 0; d < shape.dim; ++d) {
      const float wave = std::sin(0.37f * static_cast<float>(t) + 1.3f * static_cast<float>(d));
      x[t * shape.dim + d] = d == 5 ? 1000.0f + 50.0f * wave : wave;
    }
  }
  auto max_error_in_channel = [&](const std::string& spec, uint32_t d) {
    auto codec = testing::MakeCodec(spec);
    auto y = testing::DecodeTile(*codec, testing::EncodeTile(*codec, x, shape), shape);
    double e = 0;
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      e = std::max(e, std::fabs(double{x[t * shape.dim + d]} - y[t * shape.dim + d]));
    }
    return e;
  };
  EXPECT_LT(max_error_in_channel("int4:channel", 0), 0.07);
  EXPECT_GT(max_error_in_channel("int4:token", 0), 1.0);    // shares a block with channel 5
  EXPECT_LT(max_error_in_channel("int4:token", 40), 0.07);  // another block of the same tokens
}

TEST(AffineCodec, NonFiniteOrOutOfHalfRangeInputIsInvalidArgument) {
  for (const char* spec : kAffineSpecs) {
    auto codec = testing::MakeCodec(spec);
    const TileShape shape{4, 32};
    std::vector<std::byte> tile(*codec->encoded_size(shape));
    for (float bad : {INFINITY, NAN, 65600.0f, -1e30f}) {
      std::vector<float> x(shape.n_values(), 1.0f);
      x[77] = bad;
      EXPECT_EQ(codec->encode(x.data(), shape, tile).code(), StatusCode::kInvalidArgument)
          << spec << " " << bad;
    }
    std::vector<float> x(shape.n_values(), 65504.0f);
    x[3] = -65504.0f;
    EXPECT_TRUE(codec->encode(x.data(), shape, tile).ok()) << spec;
  }
}

// What the conformance test checks for registered codecs, here for the channel grouping too and
// on keys with outlier channels: fused kernels against decode-then-dot in double, within the
// stated fused_rel_error, on both kernel paths.
TEST(CodedTileKernels, FusedKernelsMatchDecodeThenDotWithinTheStatedBound) {
  const uint32_t head_counts[] = {1, 4, 7};
  for (const char* spec : kCodedTileSpecs) {
    for (KernelPath path : testing::KernelPaths()) {
      auto codec = testing::MakeCodec(spec, path);
      for (TileShape shape : kAffineShapes) {
        for (bool outliers : {false, true}) {
          SCOPED_TRACE(std::string(spec) + " " + std::string(KernelPathName(path)) + " " +
                       ShapeName(shape) + (outliers ? " outlier channels" : ""));
          auto x = outliers ? OutlierChannels(shape, shape.dim)
                            : testing::RandomValues(shape.n_values(), shape.tokens);
          auto tile = testing::EncodeTile(*codec, x, shape);
          ASSERT_NO_FATAL_FAILURE(
              testing::CheckFusedKernelsAgainstDouble(*codec, tile, shape, head_counts, 50));
        }
      }
    }
  }
}

// The stated bounds are worst cases; on typical data the integer kernels' error is far below
// them. Relative errors as the bound defines them, on a 256 x 128 tile and 4 heads, with
// softmax-like probabilities that put a third of the mass on one token.
TEST(CodedTileKernels, TypicalIntegerErrorIsFarBelowTheStatedBound) {
  if (BestKernelPath() < KernelPath::kAvx2)
    GTEST_SKIP() << "no AVX2 on this machine: the kernels are exact";
  const TileShape shape{256, 128};
  const uint32_t n_q = 4;
  for (const char* spec : kCodedTileSpecs) {
    auto codec = testing::MakeCodec(spec);
    auto x = OutlierChannels(shape, 8);
    auto tile = testing::EncodeTile(*codec, x, shape);
    auto k = testing::DecodeTile(*codec, tile, shape);
    auto q = testing::RandomValues(size_t{n_q} * shape.dim, 9);
    std::vector<float> s(size_t{n_q} * shape.tokens), p(size_t{n_q} * shape.tokens);
    ASSERT_TRUE(codec->scores(tile, shape, q.data(), n_q, s.data()).ok());
    double score_sq = 0;
    for (uint32_t i = 0; i < n_q; ++i) {
      double l = 0;
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        double ref = 0;
        for (uint32_t d = 0; d < shape.dim; ++d)
          ref += double{q[i * shape.dim + d]} * k[t * shape.dim + d];
        const double rel = (s[i * shape.tokens + t] - ref) / (Norm(&q[i * shape.dim], shape.dim) *
                                                              Norm(&k[t * shape.dim], shape.dim));
        score_sq += rel * rel;
        p[i * shape.tokens + t] = static_cast<float>(std::exp(0.02 * ref));
        l += p[i * shape.tokens + t];
      }
      p[i * shape.tokens] = static_cast<float>(l / 2);  // a sink
      for (uint32_t t = 0; t < shape.tokens; ++t)
        p[i * shape.tokens + t] /= static_cast<float>(1.5 * l);
    }
    std::vector<float> acc(size_t{n_q} * shape.dim, 0.0f);
    ASSERT_TRUE(codec->accumulate(tile, shape, p.data(), n_q, acc.data()).ok());
    double acc_sq = 0;
    for (uint32_t i = 0; i < n_q; ++i) {
      double weight = 0;
      for (uint32_t t = 0; t < shape.tokens; ++t)
        weight += p[i * shape.tokens + t] * Norm(&k[t * shape.dim], shape.dim);
      for (uint32_t d = 0; d < shape.dim; ++d) {
        double ref = 0;
        for (uint32_t t = 0; t < shape.tokens; ++t)
          ref += double{p[i * shape.tokens + t]} * k[t * shape.dim + d];
        acc_sq += std::pow((acc[i * shape.dim + d] - ref) / weight, 2);
      }
    }
    const double score_rms = std::sqrt(score_sq / (n_q * shape.tokens)),
                 acc_rms = std::sqrt(acc_sq / (n_q * shape.dim));
    EXPECT_LT(score_rms, codec->info().fused_rel_error / 10) << spec;
    EXPECT_LT(acc_rms, codec->info().fused_rel_error / 10) << spec;
  }
}

// The channel layout's integer kernels against their rigorous absolute bounds (affine.cc) on keys
// with outlier channels, where a bound relative to ||q|| ||k'|| is only empirical. Each vector
// path with its own integer ranges.
TEST(CodedTileKernels, ChannelKernelsStayWithinTheirAbsoluteBounds) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  using codec_internal::kQueryMax;
  using codec_internal::kWeightMax;
  for (KernelPath path : testing::KernelPaths()) {
    if (path == KernelPath::kScalar) continue;
    for (uint32_t bits : {8u, 4u, 2u}) {
      auto codec = testing::MakeCodec("int" + std::to_string(bits) + ":channel", path);
      const bool avx512 = path == KernelPath::kAvx512;
      const double q_max = avx512      ? codec_internal::kQueryMaxAvx512
                           : bits == 8 ? kQueryMax<8>
                                       : kQueryMax<4>;
      const double w_max = avx512      ? codec_internal::kWeightMaxAvx512
                           : bits == 8 ? kWeightMax<8>
                                       : kWeightMax<4>;
      const double o = ((1u << bits) - 1) / 2.0, centre = 1u << (bits - 1);
      for (TileShape shape : {TileShape{97, 128}, TileShape{40, 80}, TileShape{256, 64}}) {
        SCOPED_TRACE(std::to_string(bits) + " bits " + std::string(KernelPathName(path)) + " " +
                     ShapeName(shape));
        const uint32_t n_q = 4, dim = shape.dim;
        auto x = OutlierChannels(shape, bits);
        auto tile = testing::EncodeTile(*codec, x, shape);
        auto k = testing::DecodeTile(*codec, tile, shape);
        const size_t n_meta = size_t{(shape.tokens + 31) / 32} * dim;
        std::vector<double> code(shape.n_values()), scale(shape.n_values());
        for (size_t i = 0; i < shape.n_values(); ++i) {
          const size_t meta = (i / dim / 32) * dim + i % dim;
          scale[i] = HalfAt(tile.data() + 2 * meta);
          const double min = HalfAt(tile.data() + 2 * (n_meta + meta));
          code[i] = scale[i] > 0 ? std::round((k[i] - min) / scale[i]) : 0;
        }
        auto q = testing::RandomValues(size_t{n_q} * dim, 77);
        std::vector<float> s(size_t{n_q} * shape.tokens);
        ASSERT_TRUE(codec->scores(tile, shape, q.data(), n_q, s.data()).ok());
        for (uint32_t h = 0; h < n_q; ++h) {
          for (uint32_t t = 0; t < shape.tokens; ++t) {
            double ref = 0, magnitude = 0, bound = 0;
            for (uint32_t d0 = 0; d0 < dim; d0 += 32) {
              double q_step = 0, spread = 0;
              for (uint32_t d = d0; d < std::min(dim, d0 + 32); ++d) {
                q_step = std::max(q_step, std::fabs(q[h * dim + d] * scale[t * dim + d]) / q_max);
                spread += std::fabs(code[t * dim + d] - o);
              }
              bound += q_step / 2 * spread;
            }
            for (uint32_t d = 0; d < dim; ++d) {
              ref += double{q[h * dim + d]} * k[t * dim + d];
              magnitude += std::fabs(double{q[h * dim + d]} * k[t * dim + d]);
            }
            ASSERT_LE(std::fabs(s[h * shape.tokens + t] - ref), bound + 1e-5 * magnitude + 1e-6)
                << "head " << h << " token " << t;
          }
        }
        std::vector<float> p(size_t{n_q} * shape.tokens), acc(size_t{n_q} * dim, 0.0f);
        for (size_t j = 0; j < p.size(); ++j) p[j] = std::exp(-0.1f * static_cast<float>(j % 53));
        ASSERT_TRUE(codec->accumulate(tile, shape, p.data(), n_q, acc.data()).ok());
        for (uint32_t h = 0; h < n_q; ++h) {
          for (uint32_t d = 0; d < dim; ++d) {
            double ref = 0, magnitude = 0, bound = 0;
            for (uint32_t t0 = 0; t0 < shape.tokens; t0 += 32) {
              double p_max = 0, spread = 0;
              for (uint32_t t = t0; t < std::min(shape.tokens, t0 + 32); ++t) {
                p_max = std::max(p_max, double{p[h * shape.tokens + t]});
                spread += std::fabs(code[t * dim + d] - centre) * scale[t * dim + d];
              }
              bound += p_max / (2 * w_max) * spread;
            }
            for (uint32_t t = 0; t < shape.tokens; ++t) {
              ref += double{p[h * shape.tokens + t]} * k[t * dim + d];
              magnitude += std::fabs(double{p[h * shape.tokens + t]} * k[t * dim + d]);
            }
            ASSERT_LE(std::fabs(acc[h * dim + d] - ref), bound + 1e-5 * magnitude + 1e-6)
                << "head " << h << " channel " << d;
          }
        }
      }
    }
  }
}

// The AVX-512 kernels against decode-then-dot in double within the stated bound, for every count of
// heads up to two full passes and one more (passes of up to 8 heads) and every tail: short panels
// and panel pairs (tokens 1 .. 17, 31, 33, 57) and every remainder of dim modulo 64 that the
// vector kernels take (32 | dim per token, 16 | dim per channel), up to the largest dim; and many
// groups and a tail (257 tokens) at the smallest dim, where it cost the sanitizer run least.
// Every count of heads from 1 to 17 (two full passes of up to 8 heads and one more) over a tile of
// random values.
void CheckEveryHeadCount(const Codec& codec, TileShape shape) {
  SCOPED_TRACE(ShapeName(shape));
  std::vector<uint32_t> head_counts(17);
  for (uint32_t i = 0; i < head_counts.size(); ++i) head_counts[i] = i + 1;
  const auto tile = testing::EncodeTile(
      codec, testing::RandomValues(shape.n_values(), shape.tokens + shape.dim), shape);
  testing::CheckFusedKernelsAgainstDouble(codec, tile, shape, head_counts, 3 * shape.dim);
}

TEST(CodedTileKernels, Avx512KernelsMatchDoubleOnEveryHeadBlockAndTail) {
  if (BestKernelPath() < KernelPath::kAvx512) GTEST_SKIP() << "no AVX-512 VNNI on this machine";
  const uint32_t token_counts[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 57};
  for (const char* spec : kCodedTileSpecs) {
    auto codec = testing::MakeCodec(spec, KernelPath::kAvx512);
    ASSERT_EQ(codec->kernel_path(), KernelPath::kAvx512) << spec;
    const bool channel = std::string(spec).find(":channel") != std::string::npos;
    std::vector<uint32_t> dims = channel ? std::vector<uint32_t>{16, 32, 48, 64, 80, 112}
                                         : std::vector<uint32_t>{32, 64, 96};
    for (uint32_t tokens : token_counts) {
      for (uint32_t dim : dims) {
        ASSERT_NO_FATAL_FAILURE(CheckEveryHeadCount(*codec, TileShape{tokens, dim})) << spec;
      }
    }
    ASSERT_NO_FATAL_FAILURE(CheckEveryHeadCount(*codec, TileShape{257, dims[0]})) << spec;
    ASSERT_NO_FATAL_FAILURE(CheckEveryHeadCount(*codec, TileShape{33, kMaxTileDim})) << spec;
  }
}

// The AVX-512 encoder writes the scalar encoder's bytes, at every width and grouping, with tails
// of tokens and channels, constant groups, and groups whose minimum or maximum is a zero of
// either sign (where a tree of minimums could pick the other zero than the in-order fold).
TEST(AffineCodec, Avx512EncoderWritesTheScalarBytes) {
  if (BestKernelPath() < KernelPath::kAvx512) GTEST_SKIP() << "no AVX-512 VNNI on this machine";
  const TileShape shapes[] = {{1, 8}, {31, 20}, {33, 64}, {256, 128}, {40, 130}};
  for (const char* spec :
       {"int8:token", "int4:token", "int2:token", "int8:channel", "int4:channel", "int2:channel"}) {
    auto scalar = testing::MakeCodec(spec, KernelPath::kScalar);
    auto vector = testing::MakeCodec(spec, KernelPath::kAvx512);
    for (const TileShape& shape : shapes) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<float> x = testing::RandomValues(shape.n_values(), 41 + pattern);
        for (size_t i = 0; i < x.size(); ++i) {
          // The group of x[i]: 32 consecutive values (token grouping), or its channel (channel
          // grouping, pattern 2).
          const size_t group = pattern == 2 ? i % shape.dim : i / 32;
          const float zero = i % 2 ? 0.0f : -0.0f;
          if (group % 4 == 0) x[i] = i % 5 == 0 ? zero : std::fabs(x[i]);   // min is a zero
          if (group % 4 == 1) x[i] = i % 5 == 0 ? zero : -std::fabs(x[i]);  // max is a zero
          if (group % 4 == 2 && pattern == 1) x[i] = 0.75f;                 // constant
        }
        std::vector<std::byte> a(*scalar->encoded_size(shape)), b(a.size());
        ASSERT_TRUE(scalar->encode(x.data(), shape, a).ok());
        ASSERT_TRUE(vector->encode(x.data(), shape, b).ok());
        EXPECT_EQ(a, b) << spec << " " << shape.tokens << "x" << shape.dim << " pattern "
                        << pattern;
      }
    }
  }
}

// A head's scores and accumulation are the same bits whether it is computed alone, among 16 heads
// or at any place among 7 (prefill in chunks must give the logits of one pass), on every path.
TEST(CodedTileKernels, AHeadsResultDoesNotDependOnTheOtherHeadsOfItsCall) {
  constexpr uint32_t kHeads = 16, kGroup = 7;
  for (const char* spec : kCodedTileSpecs) {
    const bool channel = std::string(spec).find(":channel") != std::string::npos;
    const TileShape shape = channel ? TileShape{45, 80} : TileShape{97, 64};
    const uint32_t tokens = shape.tokens, dim = shape.dim;
    for (KernelPath path : testing::KernelPaths()) {
      SCOPED_TRACE(std::string(spec) + " " + std::string(KernelPathName(path)));
      auto codec = testing::MakeCodec(spec, path);
      auto tile = testing::EncodeTile(*codec, OutlierChannels(shape, 11), shape);
      auto q = testing::RandomValues(size_t{kHeads} * dim, 12);
      auto acc0 = testing::RandomValues(size_t{kHeads} * dim, 13);
      std::vector<float> p(size_t{kHeads} * tokens);
      for (size_t j = 0; j < p.size(); ++j) p[j] = std::exp(-0.05f * static_cast<float>(j % 37));
      // Heads [first, first + n_q) in one call: their scores and accumulators.
      auto run = [&](uint32_t first, uint32_t n_q) {
        std::vector<float> s(size_t{n_q} * tokens);
        std::vector<float> acc(acc0.begin() + first * dim, acc0.begin() + (first + n_q) * dim);
        EXPECT_TRUE(codec->scores(tile, shape, &q[size_t{first} * dim], n_q, s.data()).ok());
        EXPECT_TRUE(
            codec->accumulate(tile, shape, &p[size_t{first} * tokens], n_q, acc.data()).ok());
        return std::make_pair(s, acc);
      };
      const auto all = run(0, kHeads);
      for (uint32_t h = 0; h < kHeads; ++h) {
        const auto alone = run(h, 1);
        ASSERT_EQ(std::memcmp(alone.first.data(), &all.first[size_t{h} * tokens], 4 * tokens), 0)
            << "scores of head " << h << " alone and among " << kHeads;
        ASSERT_EQ(std::memcmp(alone.second.data(), &all.second[size_t{h} * dim], 4 * dim), 0)
            << "accumulation of head " << h << " alone and among " << kHeads;
      }
      for (uint32_t first = 0; first + kGroup <= kHeads; ++first) {
        const auto some = run(first, kGroup);
        for (uint32_t i = 0; i < kGroup; ++i) {
          const uint32_t h = first + i;
          ASSERT_EQ(std::memcmp(&some.first[size_t{i} * tokens], &all.first[size_t{h} * tokens],
                                4 * tokens),
                    0)
              << "scores of head " << h << " at place " << i << " of " << kGroup;
          ASSERT_EQ(
              std::memcmp(&some.second[size_t{i} * dim], &all.second[size_t{h} * dim], 4 * dim), 0)
              << "accumulation of head " << h << " at place " << i << " of " << kGroup;
        }
      }
    }
  }
}
// Negative weights and huge queries leave the integer kernels' domain: the scalar kernels answer.
TEST(CodedTileKernels, InputsOutsideTheIntegerDomainFallBackToScalar) {
  const TileShape shape{40, 64};
  for (const char* spec : kCodedTileSpecs) {
    auto vector = testing::MakeCodec(spec), scalar = testing::MakeCodec(spec, KernelPath::kScalar);
    auto tile = testing::EncodeTile(*scalar, testing::RandomValues(shape.n_values(), 4), shape);
    std::vector<float> p(2 * shape.tokens, 0.01f), q = testing::RandomValues(2 * shape.dim, 6);
    p[7] = -0.5f;
    q[3] = 3e30f;
    std::vector<float> a(2 * shape.dim, 1.0f), b = a, sa(2 * shape.tokens), sb(2 * shape.tokens);
    ASSERT_TRUE(vector->accumulate(tile, shape, p.data(), 2, a.data()).ok());
    ASSERT_TRUE(scalar->accumulate(tile, shape, p.data(), 2, b.data()).ok());
    EXPECT_EQ(a, b) << spec;
    ASSERT_TRUE(vector->scores(tile, shape, q.data(), 2, sa.data()).ok());
    ASSERT_TRUE(scalar->scores(tile, shape, q.data(), 2, sb.data()).ok());
    EXPECT_EQ(sa, sb) << spec;
  }
}

// The vector kernels' domain check finds one bad value (NaN, out of range, on either side) at
// every position of every length, the tails included, and takes -0 and the bounds themselves.
TEST(CodedTileKernels, DomainChecksFindABadValueAnywhere) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  const bool avx512 = BestKernelPath() >= KernelPath::kAvx512;
  for (size_t n = 0; n <= 70; ++n) {
    std::vector<float> x(n, 0.5f);
    if (n > 0) {
      x[0] = -0.0f;
      x[n - 1] = 1.0f;
    }
    EXPECT_TRUE(codec_internal::AllWithinAvx2(x.data(), n, 0.0f, 1.0f)) << n;
    if (avx512) {
      EXPECT_TRUE(codec_internal::AllWithinAvx512(x.data(), n, 0.0f, 1.0f)) << n;
    }
    for (size_t i = 0; i < n; ++i) {
      for (float bad : {NAN, -1e-30f, 1.0001f}) {
        std::vector<float> y = x;
        y[i] = bad;
        EXPECT_FALSE(codec_internal::AllWithinAvx2(y.data(), n, 0.0f, 1.0f)) << n << " " << i;
        if (avx512) {
          EXPECT_FALSE(codec_internal::AllWithinAvx512(y.data(), n, 0.0f, 1.0f))
              << n << " " << i << " " << bad;
        }
      }
    }
  }
}

// Zero weights and queries give exactly nothing and exact minimum terms.
TEST(CodedTileKernels, ZeroQueryAndZeroWeightsGiveZero) {
  const TileShape shape{33, 64};
  for (const char* spec : kCodedTileSpecs) {
    auto codec = testing::MakeCodec(spec);
    auto tile = testing::EncodeTile(*codec, testing::RandomValues(shape.n_values(), 2), shape);
    std::vector<float> q(shape.dim, 0.0f), s(shape.tokens, 1.0f), p(shape.tokens, 0.0f),
        acc(shape.dim, 0.5f);
    ASSERT_TRUE(codec->scores(tile, shape, q.data(), 1, s.data()).ok());
    EXPECT_EQ(s, std::vector<float>(shape.tokens, 0.0f)) << spec;
    ASSERT_TRUE(codec->accumulate(tile, shape, p.data(), 1, acc.data()).ok());
    EXPECT_EQ(acc, std::vector<float>(shape.dim, 0.5f)) << spec;
  }
}

// The conformance test's hostile-bytes check, for the channel grouping and short panels.
TEST(CodedTileKernels, HostileBytesNeverCrash) {
  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  for (const char* spec : kCodedTileSpecs) {
    for (KernelPath path : testing::KernelPaths()) {
      auto codec = testing::MakeCodec(spec, path);
      for (TileShape shape : {TileShape{33, 64}, TileShape{5, 80}, TileShape{70, 3}}) {
        std::vector<std::byte> tile(*codec->encoded_size(shape));
        std::vector<float> out(std::max<size_t>(shape.n_values(), 3 * shape.tokens)),
            q(3 * shape.dim, 0.5f), p(3 * shape.tokens, 0.01f), acc(3 * shape.dim);
        for (int trial = 0; trial < 4; ++trial) {
          for (auto& b : tile)
            b = static_cast<std::byte>(trial == 0 ? 0xff : static_cast<int>(rng() & 0xff));
          EXPECT_TRUE(codec->decode(tile, shape, out.data()).ok());
          EXPECT_TRUE(codec->scores(tile, shape, q.data(), 3, out.data()).ok());
          EXPECT_TRUE(codec->accumulate(tile, shape, p.data(), 3, acc.data()).ok());
        }
      }
    }
  }
}

}  // namespace
}  // namespace argus
