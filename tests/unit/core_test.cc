#include "argus/core.h"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/checked.h"
#include "core/checksum.h"
#include "core/files.h"
#include "core/fp8.h"
#include "core/npy.h"
#include "test_util.h"

namespace argus {
namespace {

TEST(CheckedArithmetic, OverflowIsInvalidArgumentNamingTheThing) {
  auto r = CheckedMul(SIZE_MAX / 2, 3, "tile bytes");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tile bytes"), std::string::npos);
  EXPECT_EQ(*CheckedMul(1000, 1000, "x"), 1000000u);
  EXPECT_FALSE(CheckedAdd(SIZE_MAX, 1, "x").ok());
}

// Every half value converts to float and back to itself (NaNs stay NaN).
TEST(Half, AllBitPatternsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
}

// Against double precision: the result is the nearest half, ties to the even code.
TEST(Half, RoundsToNearestEvenAgainstDoubleReference) {
  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  for (int i = 0; i < 200000; ++i) {
    float x = std::bit_cast<float>(static_cast<uint32_t>(rng() & 0x7fffffffu));
    if (std::isnan(x) || std::isinf(x)) continue;
    uint16_t h = FloatToHalf(x);
    double got = HalfToFloat(h);
    if (x >= 65520.0f) {
      EXPECT_TRUE(std::isinf(got));
      continue;
    }
    // No other half is nearer; on a tie the code is even.
    double below = HalfToFloat(static_cast<uint16_t>(h - (h > 0 ? 1 : 0)));
    double above = HalfToFloat(static_cast<uint16_t>(h + 1));
    double err = std::fabs(got - x);
    ASSERT_LE(err, std::fabs(below - x)) << x;
    if (!std::isinf(above)) {
      ASSERT_LE(err, std::fabs(above - x)) << x;
    }
    if (err == std::fabs(above - x) && h != 0x7bff) {
      ASSERT_EQ(h & 1, 0) << x;
    }
  }
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even kept
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, rounds to even
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(
      Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));  // payload in low bits
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(3.4e38f))));
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBf16(f), b);
    }
  }
}

// ---- FP8 against CUDA's cuda_fp8.h (../shared/testdata/fp8) -------------------------------

std::vector<std::vector<std::string>> ReadColumns(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<std::string> row;
    std::string f;
    while (fields >> f) row.push_back(f);
    rows.push_back(row);
  }
  return rows;
}

void CheckDecodeTable(const std::string& file, Fp8Format format) {
  auto rows = ReadColumns(testing::SharedDir() + "/testdata/fp8/" + file);
  ASSERT_EQ(rows.size(), 256u);
  for (const auto& row : rows) {
    auto code = static_cast<uint8_t>(std::stoul(row[0], nullptr, 16));
    float expected = std::bit_cast<float>(static_cast<uint32_t>(std::stoul(row[1], nullptr, 16)));
    float got = Fp8ToFloat(code, format);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << file << " code " << row[0];
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected))
          << file << " code " << row[0];
    }
  }
}

TEST(Fp8Oracle, AllE4M3CodesDecodeToCudaTable) {
  ARGUS_SKIP_WITHOUT_SHARED();
  CheckDecodeTable("e4m3_decode.txt", Fp8Format::kE4M3);
}

TEST(Fp8Oracle, AllE5M2CodesDecodeToCudaTable) {
  ARGUS_SKIP_WITHOUT_SHARED();
  CheckDecodeTable("e5m2_decode.txt", Fp8Format::kE5M2);
}

TEST(Fp8Oracle, EveryRoundingVectorEncodesToCudaSaturatingCode) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto rows = ReadColumns(testing::SharedDir() + "/testdata/fp8/encode_vectors.txt");
  ASSERT_GT(rows.size(), 4000u);
  int mismatches = 0;
  for (const auto& row : rows) {
    float x = std::bit_cast<float>(static_cast<uint32_t>(std::stoul(row[0], nullptr, 16)));
    auto e4m3 = static_cast<uint8_t>(std::stoul(row[1], nullptr, 16));
    auto e5m2 = static_cast<uint8_t>(std::stoul(row[3], nullptr, 16));
    if (FloatToFp8(x, Fp8Format::kE4M3) != e4m3 && ++mismatches < 10)
      ADD_FAILURE() << "e4m3 input " << row[0];
    if (FloatToFp8(x, Fp8Format::kE5M2) != e5m2 && ++mismatches < 10)
      ADD_FAILURE() << "e5m2 input " << row[0];
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- Thread pool ---------------------------------------------------------------------------

TEST(ThreadPool, ChunksAreFixedAndEveryItemRunsOnce) {
  for (unsigned threads : {1u, 2u, 4u, 16u}) {
    ThreadPool pool(threads);
    std::vector<int> hits(1003, 0);
    std::vector<std::pair<size_t, size_t>> chunks(11);
    pool.ParallelFor(1003, 100, [&](size_t c, size_t begin, size_t end) {
      chunks[c] = {begin, end};
      for (size_t i = begin; i < end; ++i) ++hits[i];
    });
    for (int h : hits) ASSERT_EQ(h, 1);
    for (size_t c = 0; c < 11; ++c) {
      EXPECT_EQ(chunks[c].first, c * 100);
      EXPECT_EQ(chunks[c].second, std::min<size_t>(c * 100 + 100, 1003));
    }
  }
}

TEST(ThreadPool, ChunkedFloatSumIsBitIdenticalForAnyThreadCount) {
  auto x = testing::RandomValues(100000, 1);
  auto sum_with = [&](unsigned threads) {
    ThreadPool pool(threads);
    std::vector<float> partial((x.size() + 999) / 1000);
    pool.ParallelFor(x.size(), 1000, [&](size_t c, size_t b, size_t e) {
      float s = 0;
      for (size_t i = b; i < e; ++i) s += x[i];
      partial[c] = s;
    });
    float total = 0;
    for (float p : partial) total += p;
    return std::bit_cast<uint32_t>(total);
  };
  uint32_t one = sum_with(1);
  EXPECT_EQ(sum_with(2), one);
  EXPECT_EQ(sum_with(4), one);
  EXPECT_EQ(sum_with(16), one);
}

// ---- Checksums, CPU --------------------------------------------------------------------------

TEST(Checksum, Xxh3OfKnownInputs) {
  // XXH3_64bits of the empty input with seed 0 (from the xxHash specification's test vectors).
  EXPECT_EQ(Checksum64({}), 0x2D06800538D394C2ull);
  std::vector<std::byte> a(100, std::byte{7}), b = a;
  b[50] ^= std::byte{1};
  EXPECT_NE(Checksum64(a), Checksum64(b));
}

TEST(CpuFeatures, ReportsConsistentFlags) {
  const CpuFeatures& f = GetCpuFeatures();
  EXPECT_EQ(f.avx2_kernels(), f.avx2 && f.fma && f.f16c);
  EXPECT_FALSE(f.ToString().empty());
}

// ---- .npy ------------------------------------------------------------------------------------

class NpyTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("argus_npy_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return (dir / name).string();
  }
  void TearDown() override {
    std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                ("argus_npy_" + std::to_string(::getpid())));
  }
};

TEST_F(NpyTest, Float32RoundTrip) {
  auto values = testing::RandomValues(3 * 5, 2);
  ASSERT_TRUE(WriteNpy(Path("a.npy"), NpyArray::FromFloat({3, 5}, values)).ok());
  auto back = ReadNpy(Path("a.npy"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->shape, (std::vector<size_t>{3, 5}));
  EXPECT_EQ(back->ToFloat(), values);
}

TEST_F(NpyTest, Float16AndUint8AreConvertedToFloat) {
  NpyArray h;
  h.type = NpyType::kFloat16;
  h.shape = {2};
  uint16_t bits[2] = {FloatToHalf(1.5f), FloatToHalf(-2.0f)};
  h.data.resize(4);
  std::memcpy(h.data.data(), bits, 4);
  ASSERT_TRUE(WriteNpy(Path("h.npy"), h).ok());
  EXPECT_EQ(ReadNpy(Path("h.npy"))->ToFloat(), (std::vector<float>{1.5f, -2.0f}));
  NpyArray u;
  u.type = NpyType::kUint8;
  u.shape = {3};
  u.data = {std::byte{0}, std::byte{7}, std::byte{255}};
  ASSERT_TRUE(WriteNpy(Path("u.npy"), u).ok());
  EXPECT_EQ(ReadNpy(Path("u.npy"))->ToFloat(), (std::vector<float>{0, 7, 255}));
}

TEST_F(NpyTest, TruncatedDataIsCorruptionNamingTheFile) {
  ASSERT_TRUE(
      WriteNpy(Path("t.npy"), NpyArray::FromFloat({4}, std::vector<float>{1, 2, 3, 4})).ok());
  auto bytes = *ReadFileBytes(Path("t.npy"));
  bytes.resize(bytes.size() - 3);
  auto r = ParseNpy(bytes, "t.npy");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("t.npy"), std::string::npos);
}

TEST_F(NpyTest, HostileHeadersAreErrors) {
  auto make = [](const std::string& header) {
    std::string s = std::string("\x93NUMPY\x01\x00", 8);
    s += static_cast<char>(header.size() & 0xff);
    s += static_cast<char>(header.size() >> 8);
    s += header;
    std::vector<std::byte> b(s.size());
    std::memcpy(b.data(), s.data(), s.size());
    return b;
  };
  EXPECT_FALSE(
      ParseNpy(make("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"), "x").ok());
  EXPECT_FALSE(
      ParseNpy(make("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }"), "x").ok());
  EXPECT_FALSE(
      ParseNpy(make("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
               "x")
          .ok());
  EXPECT_FALSE(
      ParseNpy(
          make("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }"),
          "x")
          .ok());
  EXPECT_FALSE(ParseNpy(make("{'descr': '<f4', 'fortran_order': False, 'shape': (2,"), "x").ok());
  EXPECT_FALSE(ParseNpy(make("{'descr'"), "x").ok());
  auto huge_len = make("{}");
  huge_len[8] = std::byte{0xff};
  EXPECT_FALSE(ParseNpy(huge_len, "x").ok());
  EXPECT_FALSE(ParseNpy(std::vector<std::byte>(3), "x").ok());
}

}  // namespace
}  // namespace argus
