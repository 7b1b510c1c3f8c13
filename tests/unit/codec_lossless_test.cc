// Lossless coding of 16-bit floats: bit-exact round trips on every pattern and on adversarial
// inputs, corrupt or truncated encodings as Corruption, the codec wrappers' tiles, and the
// compression achieved on KV-like data beside the Shannon bound of the exponent stream.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus {
namespace {

constexpr Half16 kKinds[] = {Half16::kF16, Half16::kBf16};

const char* Name(Half16 kind) { return kind == Half16::kF16 ? "f16" : "bf16"; }
unsigned ExponentBits(Half16 kind) { return kind == Half16::kF16 ? 5 : 8; }

void ExpectRoundTrip(const std::vector<uint16_t>& bits, Half16 kind, const std::string& what) {
  const std::vector<std::byte> bytes = LosslessEncode16(bits, kind);
  auto decoded = LosslessDecode16(bytes);
  ASSERT_TRUE(decoded.ok()) << what << " " << Name(kind) << ": " << decoded.status().ToString();
  ASSERT_EQ(*decoded, bits) << what << " " << Name(kind);
}

std::vector<uint16_t> ToBits(const std::vector<float>& x, Half16 kind) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = kind == Half16::kF16 ? FloatToHalf(x[i]) : FloatToBf16(x[i]);
  }
  return bits;
}

TEST(Lossless16, EveryBitPatternRoundTripsInOrderAndShuffled) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  auto shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(testing::TestSeed()));
  for (Half16 kind : kKinds) {
    ExpectRoundTrip(all, kind, "all patterns");
    ExpectRoundTrip(shuffled, kind, "all patterns, shuffled");
  }
}

TEST(Lossless16, RandomBitPatternsRoundTripAtOddLengths) {
  std::mt19937_64 rng(testing::TestSeed() + 1);
  for (size_t n : {1, 2, 3, 7, 8, 9, 31, 1000, 4097, 100001}) {
    std::vector<uint16_t> bits(n);
    for (auto& b : bits) b = static_cast<uint16_t>(rng());
    for (Half16 kind : kKinds) ExpectRoundTrip(bits, kind, "random n=" + std::to_string(n));
  }
}

TEST(Lossless16, AdversarialInputsRoundTrip) {
  for (Half16 kind : kKinds) {
    const unsigned e_bits = ExponentBits(kind), m_bits = 15 - e_bits;
    const uint16_t exp_mask = static_cast<uint16_t>(((1u << e_bits) - 1) << m_bits);
    const uint16_t man_mask = static_cast<uint16_t>((1u << m_bits) - 1);
    ExpectRoundTrip({}, kind, "empty");
    ExpectRoundTrip({0x8000}, kind, "one -0");
    ExpectRoundTrip({0x3c00}, kind, "one value");
    // NaNs with every payload, quiet (top mantissa bit set) and signalling, both signs.
    std::vector<uint16_t> nans;
    for (uint16_t m = 1; m <= man_mask; ++m) {
      nans.push_back(exp_mask | m);
      nans.push_back(static_cast<uint16_t>(0x8000 | exp_mask | m));
    }
    ExpectRoundTrip(nans, kind, "all NaNs");
    std::vector<uint16_t> subnormals;
    for (uint16_t m = 0; m <= man_mask; ++m) {
      subnormals.push_back(m);
      subnormals.push_back(static_cast<uint16_t>(0x8000 | m));
    }
    ExpectRoundTrip(subnormals, kind, "all subnormals and zeros");
    // Alternating extremes: +-0, +-Inf, +-largest finite, +-smallest subnormal, a NaN.
    const uint16_t largest = static_cast<uint16_t>(exp_mask - (1u << m_bits) + man_mask);
    const uint16_t extremes[] = {0x0000,   0x8000,
                                 exp_mask, static_cast<uint16_t>(0x8000 | exp_mask),
                                 largest,  static_cast<uint16_t>(0x8000 | largest),
                                 0x0001,   0x8001,
                                 0xffff};
    std::vector<uint16_t> alternating;
    for (int i = 0; i < 5000; ++i) alternating.push_back(extremes[i % std::size(extremes)]);
    ExpectRoundTrip(alternating, kind, "alternating extremes");
    // A single exponent: the exponent stream is constant.
    std::mt19937_64 rng(testing::TestSeed() + 2);
    std::vector<uint16_t> one_exponent(50000);
    for (auto& b : one_exponent) {
      b = static_cast<uint16_t>((15u << m_bits) | (rng() & man_mask) | (rng() & 1) << 15);
    }
    ExpectRoundTrip(one_exponent, kind, "one exponent");
    const auto bytes = LosslessEncode16(one_exponent, kind);
    EXPECT_LT(bytes.size(), 32 + (one_exponent.size() * (1 + m_bits) + 7) / 8 + 64)
        << "a constant stream costs ~0";
    ExpectRoundTrip(std::vector<uint16_t>(70000, 0x7fff), kind, "one repeated NaN");
  }
}

TEST(Lossless16, ExponentEntropyCountsTheExponentField) {
  EXPECT_EQ(ExponentEntropyBits({}, Half16::kF16), 0.0);
  EXPECT_EQ(ExponentEntropyBits(std::vector<uint16_t>{0x3c00, 0x3c01, 0xbc00}, Half16::kF16), 0.0);
  // f16 exponents 15, 16, 16, 16; as bf16 the same patterns have exponents 120, 128, 128, 128.
  const std::vector<uint16_t> bits = {0x3c00, 0x4000, 0x4001, 0x4002};
  const double h = -(0.25 * std::log2(0.25) + 0.75 * std::log2(0.75));
  EXPECT_DOUBLE_EQ(ExponentEntropyBits(bits, Half16::kF16), h);
  EXPECT_DOUBLE_EQ(ExponentEntropyBits(bits, Half16::kBf16), h);
  EXPECT_DOUBLE_EQ(ExponentEntropyBits(std::vector<uint16_t>{0x0000, 0x7fff}, Half16::kBf16), 1.0);
}

// Every encoding shorter than the real one is Corruption; so is one with bytes appended. Each
// single-bit flip is Corruption or, where the bit does not matter (a zstd frame field that does
// not change the content), decodes to exactly the original values: never to other values.
TEST(Lossless16, TruncatedExtendedOrFlippedEncodingsAreCorruption) {
  auto gaussian = testing::RandomValues(600, 11);
  std::mt19937_64 rng(testing::TestSeed() + 3);
  std::vector<uint16_t> random(600);
  for (auto& b : random) b = static_cast<uint16_t>(rng());
  for (Half16 kind : kKinds) {
    for (const auto& bits : {ToBits(gaussian, kind), random}) {
      const auto good = LosslessEncode16(bits, kind);
      for (size_t n = 0; n < good.size(); ++n) {
        auto r = LosslessDecode16(std::span(good).first(n));
        ASSERT_EQ(r.status().code(), StatusCode::kCorruption)
            << Name(kind) << " truncated to " << n;
      }
      auto longer = good;
      longer.push_back(std::byte{0});
      EXPECT_EQ(LosslessDecode16(longer).status().code(), StatusCode::kCorruption);
      for (size_t at = 0; at < good.size(); ++at) {
        for (int bit = 0; bit < 8; ++bit) {
          auto bad = good;
          bad[at] ^= static_cast<std::byte>(1 << bit);
          auto r = LosslessDecode16(bad);
          if (r.ok()) {
            ASSERT_EQ(*r, bits) << Name(kind) << " byte " << at << " bit " << bit
                                << " decoded to other values";
          } else {
            ASSERT_EQ(r.status().code(), StatusCode::kCorruption);
          }
        }
      }
    }
  }
}

TEST(Lossless16, HeaderDeclaringHugeCountsIsCorruptionWithoutAllocating) {
  auto good = LosslessEncode16(std::vector<uint16_t>(100, 0x3c00), Half16::kBf16);
  for (uint64_t count : {uint64_t{101}, uint64_t{1} << 40, ~uint64_t{0}, ~uint64_t{0} / 8 + 1}) {
    auto bad = good;
    std::memcpy(bad.data() + 8, &count, 8);
    auto r = LosslessDecode16(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << count;
    EXPECT_FALSE(r.status().message().empty()) << count;
  }
  auto bad = good;
  const uint64_t huge_section = uint64_t{1} << 62;
  std::memcpy(bad.data() + 16, &huge_section, 8);
  EXPECT_EQ(LosslessDecode16(bad).status().code(), StatusCode::kCorruption);
  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::byte> hostile(good.size());
    for (auto& b : hostile) b = static_cast<std::byte>(rng() & 0xff);
    if (trial % 2) std::memcpy(hostile.data(), good.data(), 8);  // a valid magic and version
    EXPECT_EQ(LosslessDecode16(hostile).status().code(), StatusCode::kCorruption);
  }
}

// The codecs take floats: exact for values of their format, tiles zero-padded to the raw bound.
TEST(LosslessCodec, TilesAreExactForValuesOfTheFormatAndStrictAboutTheirBytes) {
  for (Half16 kind : kKinds) {
    const std::string name = std::string("lossless_") + Name(kind);
    auto codec = CodecRegistry::Default().Create(name);
    ASSERT_TRUE(codec.ok());
    EXPECT_TRUE((*codec)->info().lossless);
    EXPECT_EQ((*codec)->info().code_bits, 0u);
    const TileShape shape{97, 128};
    auto bits = ToBits(testing::RandomValues(shape.n_values(), 21), kind);
    bits[3] = kind == Half16::kF16 ? 0x7d01 : 0x7f81;  // signalling NaNs
    bits[4] = 0x8000;
    bits[5] = 0x0001;
    std::vector<float> x(bits.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = kind == Half16::kF16 ? HalfToFloat(bits[i]) : Bf16ToFloat(bits[i]);
    }
    const size_t n_bytes = (*codec)->encoded_size(shape).value();
    EXPECT_EQ(n_bytes, 32 + shape.n_values() * 2);  // the raw size plus the header
    std::vector<std::byte> tile(n_bytes);
    ASSERT_TRUE((*codec)->encode(x.data(), shape, tile).ok());
    std::vector<float> y(x.size());
    ASSERT_TRUE((*codec)->decode(tile, shape, y.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t b = kind == Half16::kF16 ? FloatToHalf(y[i]) : FloatToBf16(y[i]);
      if (i == 3) continue;  // the float -> 16-bit conversion quiets a NaN; the tile keeps that
      ASSERT_EQ(b, bits[i]) << name << " value " << i;
    }
    // The compact encoding leads the tile; the rest is zero and must stay so.
    const auto compact = LosslessEncode16(ToBits(x, kind), kind);
    ASSERT_TRUE(std::equal(compact.begin(), compact.end(), tile.begin()));
    auto bad = tile;
    bad.back() = std::byte{1};
    EXPECT_EQ((*codec)->decode(bad, shape, y.data()).code(), StatusCode::kCorruption);
    // A tile of the other kind is Corruption.
    auto other = CodecRegistry::Default().Create(
        std::string("lossless_") + Name(kind == Half16::kF16 ? Half16::kBf16 : Half16::kF16));
    ASSERT_TRUE(other.ok());
    Status wrong_kind = (*other)->decode(tile, shape, y.data());
    EXPECT_EQ(wrong_kind.code(), StatusCode::kCorruption);
    EXPECT_FALSE(wrong_kind.message().empty());
  }
}

// Compression on KV-like values beside the Shannon bound of the exponent histogram: sign and
// mantissa cost 16 - E bits, the exponent stream at best its entropy H, so the ratio is at most
// 16 / (16 - E + H). Huffman coding alone loses ~0.04 bits/value on these histograms and the
// encoder measures ~0.06 over H; 0.15 bits leaves room for other seeds and data.
TEST(Lossless16, CompressionIsNearTheShannonBoundOfTheExponents) {
  struct Source {
    std::string name;
    std::vector<float> values;
  };
  std::vector<Source> sources;
  sources.push_back({"N(0,1) with outliers", testing::RandomValues(size_t{4096} * 128, 31)});
  for (KeyRegime regime : {KeyRegime::kIsotropic, KeyRegime::kHeavyOutliers}) {
    SyntheticKvOptions options;
    options.regime = regime;
    options.seed = testing::TestSeed();
    SyntheticKv kv = GenerateSyntheticKv(options, 4096);
    sources.push_back({"synthetic K, " + std::string(KeyRegimeName(regime)), kv.k});
    if (regime == KeyRegime::kIsotropic) sources.push_back({"synthetic V", kv.v});
  }
  for (const Source& source : sources) {
    for (Half16 kind : kKinds) {
      const auto bits = ToBits(source.values, kind);
      const auto bytes = LosslessEncode16(bits, kind);
      const double n = static_cast<double>(bits.size());
      const double entropy = ExponentEntropyBits(bits, kind);
      const double bits_per_value = static_cast<double>(bytes.size()) * 8 / n;
      const double exponent_bits = bits_per_value - (16 - ExponentBits(kind));  // incl. the header
      EXPECT_LE(exponent_bits, entropy + 0.15) << source.name << " " << Name(kind);
      ExpectRoundTrip(bits, kind, source.name);
    }
  }
}

}  // namespace
}  // namespace argus
