// The ggml block codecs (q8_0, q4_0, iq4_nl): byte-exact encoding against vectors from ggml's
// reference quantisers, decoding as ggml's dequantize_row_*, per-element error bounds, odd
// shapes (blocks spanning tokens), the AVX2 kernels' stated error, and hostile bytes.
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus {
namespace {

const std::vector<std::string> kNames = {"q8_0", "q4_0", "iq4_nl"};
constexpr int8_t kIq4Nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

size_t BlockBytes(const std::string& name) { return name == "q8_0" ? 34 : 18; }

int Nibble(const std::byte* qs, int j) {
  const int b = std::to_integer<int>(qs[j % 16]);
  return j < 16 ? b & 0xf : b >> 4;
}

// The integer code of value j of a block, and its value in units of d, as ggml reads them.
float CodeValue(const std::string& name, const std::byte* block, int j) {
  if (name == "q8_0")
    return static_cast<float>(static_cast<int8_t>(std::to_integer<uint8_t>(block[2 + j])));
  if (name == "q4_0") return static_cast<float>(Nibble(block + 2, j) - 8);
  return static_cast<float>(kIq4Nl[Nibble(block + 2, j)]);
}

float Scale(const std::byte* block) {
  uint16_t h;
  std::memcpy(&h, block, 2);
  return HalfToFloat(h);
}

// ggml's dequantize_row_{q8_0,q4_0,iq4_nl} for one block, written from ggml's definitions.
void GgmlDequantize(const std::string& name, const std::byte* block, float* y) {
  const float d = Scale(block);
  for (int j = 0; j < 32; ++j)
    y[j] = name == "iq4_nl" ? d * CodeValue(name, block, j) : CodeValue(name, block, j) * d;
}

struct OracleBlock {
  std::vector<float> x;
  std::vector<std::byte> bytes;
};

std::vector<OracleBlock> ReadOracle(const std::string& name) {
  std::ifstream in(testing::SharedDir() + "/testdata/ggml-quant/" + name + ".txt");
  EXPECT_TRUE(in.good()) << name;
  std::vector<OracleBlock> blocks;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    OracleBlock block;
    std::string token;
    while (fields >> token && token != ":")
      block.x.push_back(
          std::bit_cast<float>(static_cast<uint32_t>(std::stoul(token, nullptr, 16))));
    while (fields >> token)
      block.bytes.push_back(static_cast<std::byte>(std::stoul(token, nullptr, 16)));
    EXPECT_EQ(block.x.size(), 32u) << line;
    EXPECT_EQ(block.bytes.size(), BlockBytes(name)) << line;
    blocks.push_back(std::move(block));
  }
  return blocks;
}

class GgmlCodecTest : public ::testing::TestWithParam<std::string> {};

// Every oracle block encodes to ggml's bytes. One exception, from ggml itself: an iq4_nl block
// with amax < 1e-15 gets d = 0 and codes that ggml leaves unset (the oracle's show stack
// contents); its scale must match and it must decode to zeros.
TEST_P(GgmlCodecTest, EncodesEveryOracleBlockLikeGgmlReference) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string name = GetParam();
  const auto blocks = ReadOracle(name);
  ASSERT_GE(blocks.size(), 100u);
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(name, path);
    int unset_codes = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto got = testing::EncodeTile(*codec, blocks[i].x, {1, 32});
      float amax = 0;
      for (float v : blocks[i].x) amax = std::max(amax, std::fabs(v));
      if (name == "iq4_nl" && amax < 1e-15f) {
        ++unset_codes;
        EXPECT_EQ(got[0], blocks[i].bytes[0]);
        EXPECT_EQ(got[1], blocks[i].bytes[1]);
        for (float y : testing::DecodeTile(*codec, got, {1, 32})) EXPECT_EQ(y, 0.0f);
        continue;
      }
      ASSERT_EQ(got, blocks[i].bytes)
          << name << " oracle block " << i << " (" << KernelPathName(path) << ")";
    }
    EXPECT_LE(unset_codes, 2);
  }
}

// Decoding follows ggml's dequantize_row_* bit for bit, on the oracle's bytes.
TEST_P(GgmlCodecTest, DecodesOracleBytesLikeGgmlDequantize) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string name = GetParam();
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(name, path);
    for (const OracleBlock& block : ReadOracle(name)) {
      float want[32];
      GgmlDequantize(name, block.bytes.data(), want);
      const auto got = testing::DecodeTile(*codec, block.bytes, {1, 32});
      for (int j = 0; j < 32; ++j) {
        if (std::isnan(want[j])) {
          EXPECT_TRUE(std::isnan(got[j]));
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j]))
              << name << " value " << j;
        }
      }
    }
  }
}

// Per-element bounds, with d32 the float scale ggml computes before rounding it to fp16 (d16):
//   q8_0:   |x - x'| <= |d32|/2 + |d32 - d16| * |code|, d32 = amax/127.
//   q4_0:   |x - x'| <= |d32|/2 + 8 |d32 - d16|, d32 = max/-8; |d32| + 8 |d32 - d16| for
//           x/d32 > 7.5, the one value above the top code (x = -max, clamped to code 7).
//   iq4_nl: |x - d0 v| <= 14 |d0| for d0 = max/-127, the scale that picked the codes (half
//           the widest gap of the levels is 12; x/d0 up to 127 falls 14 above the top level),
//           so |x - x'| <= 14 |d0| + 127 |d0 - d16|; and the refitted d16 does not increase the
//           x^2-weighted squared error over d0 beyond what fp16 rounding adds.
TEST_P(GgmlCodecTest, RandomBlocksStayWithinStatedErrorBounds) {
  const std::string name = GetParam();
  auto codec = testing::MakeCodec(name, BestKernelPath());
  const TileShape shape{200, 64};
  std::mt19937_64 rng(testing::TestSeed() + 17);
  // Block magnitudes over ten decades, inside the range where d fits fp16 (amax up to about
  // 8 * 65504 for q4_0); beyond it ggml's scale, and so ARGUS's, becomes Inf.
  std::lognormal_distribution<float> magnitude(0.0f, 3.0f);
  std::vector<float> x = testing::RandomValues(shape.n_values(), 41);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float m = std::clamp(magnitude(rng), 1e-7f, 1e3f);
    for (int j = 0; j < 32; ++j) x[b * 32 + j] *= m;
  }
  const auto bytes = testing::EncodeTile(*codec, x, shape);
  const auto y = testing::DecodeTile(*codec, bytes, shape);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* xb = &x[b * 32];
    const std::byte* block = &bytes[b * BlockBytes(name)];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
    }
    const double d16 = Scale(block);
    double werr0 = 0, werr16 = 0, wv2 = 0;
    for (int j = 0; j < 32; ++j) {
      const double err = std::fabs(double{xb[j]} - y[b * 32 + j]);
      const double code = CodeValue(name, block, j);
      const double slack = 1e-6 * amax;
      if (name == "q8_0") {
        const double d32 = amax / 127.0f;
        ASSERT_LE(err, d32 / 2 + std::fabs(d32 - d16) * std::fabs(code) + slack)
            << "block " << b << " value " << j;
      } else if (name == "q4_0") {
        const double d32 = max / -8.0f;
        const double step = xb[j] / d32 > 7.5 ? std::fabs(d32) : std::fabs(d32) / 2;
        ASSERT_LE(err, step + 8 * std::fabs(d32 - d16) + slack) << "block " << b << " value " << j;
      } else {
        const double d0 = max / -127.0f;
        ASSERT_LE(std::fabs(xb[j] - d0 * code), 14 * std::fabs(d0) + slack)
            << "block " << b << " value " << j;
        ASSERT_LE(err, 14 * std::fabs(d0) + 127 * std::fabs(d0 - d16) + slack)
            << "block " << b << " value " << j;
        const double w = double{xb[j]} * xb[j];
        werr0 += w * (xb[j] - d0 * code) * (xb[j] - d0 * code);
        werr16 += w * err * err;
        wv2 += w * code * code;
      }
    }
    if (name == "iq4_nl") {
      // The least-squares scale d (exact arithmetic) never loses to d0; d16 adds |d - d16| ||v||_w.
      double wvx = 0;
      for (int j = 0; j < 32; ++j) wvx += double{xb[j]} * xb[j] * CodeValue(name, block, j) * xb[j];
      const double refit = std::sqrt(werr0) + std::fabs(wvx / wv2 - d16) * std::sqrt(wv2);
      ASSERT_LE(std::sqrt(werr16), refit * (1 + 1e-5) + 1e-6 * amax * amax) << "block " << b;
    }
  }
}

// Encoding a tile is encoding its row-major values in blocks of 32: with 32 | dim every row is a
// ggml row of dim/32 blocks; otherwise blocks span tokens. Both kernel paths give the same bytes.
TEST_P(GgmlCodecTest, TileIsRowMajorBlocksForOddShapes) {
  const std::string name = GetParam();
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(name, path);
    for (uint32_t tokens : {1u, 31u, 33u, 97u}) {
      for (uint32_t dim : {8u, 64u, 80u, 96u, 128u, 256u}) {
        const TileShape shape{tokens, dim};
        SCOPED_TRACE(name + " " + std::to_string(tokens) + "x" + std::to_string(dim));
        const auto x = testing::RandomValues(shape.n_values(), tokens * 1000 + dim);
        const auto bytes = testing::EncodeTile(*codec, x, shape);
        const size_t n_blocks = (shape.n_values() + 31) / 32;
        ASSERT_EQ(bytes.size(), n_blocks * BlockBytes(name));
        for (size_t b = 0; b < n_blocks; ++b) {
          std::vector<float> block(32, 0.0f);
          std::copy(x.begin() + b * 32, x.begin() + std::min(x.size(), b * 32 + 32), block.begin());
          const auto one = testing::EncodeTile(*codec, block, {1, 32});
          ASSERT_TRUE(std::equal(one.begin(), one.end(), bytes.begin() + b * BlockBytes(name)))
              << "block " << b;
        }
        const auto y = testing::DecodeTile(*codec, bytes, shape);
        double err = 0, norm = 0;
        for (size_t i = 0; i < x.size(); ++i)
          err += (x[i] - y[i]) * double{x[i] - y[i]}, norm += x[i] * double{x[i]};
        EXPECT_LT(std::sqrt(err / norm), name == "q8_0" ? 0.015 : 0.25);
      }
    }
  }
}

double Norm(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double{x[i]} * x[i];
  return std::sqrt(s);
}

// Checks both fused kernels against decode-then-dot in double within fused_rel_error, for
// queries and weights given by the caller.
void CheckFused(const Codec& codec, TileShape shape, const std::vector<float>& x,
                const std::vector<float>& q, const std::vector<float>& p, uint32_t n_q) {
  const double tol = codec.info().fused_rel_error;
  const auto bytes = testing::EncodeTile(codec, x, shape);
  const auto k = testing::DecodeTile(codec, bytes, shape);
  std::vector<float> s(size_t{n_q} * shape.tokens);
  ASSERT_TRUE(codec.scores(bytes, shape, q.data(), n_q, s.data()).ok());
  for (uint32_t i = 0; i < n_q; ++i) {
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      double ref = 0;
      for (uint32_t d = 0; d < shape.dim; ++d)
        ref += double{q[i * shape.dim + d]} * k[size_t{t} * shape.dim + d];
      const double bound =
          tol * Norm(&q[i * shape.dim], shape.dim) * Norm(&k[size_t{t} * shape.dim], shape.dim);
      ASSERT_LE(std::fabs(s[i * shape.tokens + t] - ref), bound + 1e-30)
          << "scores head " << i << " token " << t;
    }
  }
  std::vector<float> acc(size_t{n_q} * shape.dim, 0.0f);
  ASSERT_TRUE(codec.accumulate(bytes, shape, p.data(), n_q, acc.data()).ok());
  for (uint32_t i = 0; i < n_q; ++i) {
    double weight = 0;
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      weight += std::fabs(p[i * shape.tokens + t]) * Norm(&k[size_t{t} * shape.dim], shape.dim);
    }
    for (uint32_t d = 0; d < shape.dim; ++d) {
      double ref = 0;
      for (uint32_t t = 0; t < shape.tokens; ++t)
        ref += double{p[i * shape.tokens + t]} * k[size_t{t} * shape.dim + d];
      ASSERT_LE(std::fabs(acc[i * shape.dim + d] - ref), tol * weight + 1e-30)
          << "accumulate head " << i << " dim " << d;
    }
  }
}

// The stated fused_rel_error holds on both paths for the inputs that stress the integer
// kernels: a query with one outlier per block, and weights spanning many orders of magnitude
// (each group's largest weight sets its scale; the others round coarsely).
TEST_P(GgmlCodecTest, FusedKernelsStayWithinStatedBoundOnHardInputs) {
  const std::string name = GetParam();
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(name, path);
    SCOPED_TRACE(name + " " + std::string(KernelPathName(path)));
    for (TileShape shape :
         {TileShape{97, 128}, TileShape{70, 64}, TileShape{33, 8}, TileShape{130, 32}}) {
      for (uint32_t n_q : {1u, 3u, 4u, 5u, 6u, 7u, 8u, 9u}) {
        SCOPED_TRACE(std::to_string(shape.tokens) + "x" + std::to_string(shape.dim) + " n_q " +
                     std::to_string(n_q));
        const auto x = testing::RandomValues(shape.n_values(), shape.tokens + n_q);
        auto q = testing::RandomValues(size_t{n_q} * shape.dim, 7 + n_q);
        for (size_t j = 0; j < q.size(); j += 32) q[j] *= 50.0f;
        std::vector<float> p(size_t{n_q} * shape.tokens);
        std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()) + n_q);
        std::uniform_real_distribution<float> exponent(-12.0f, 0.0f);
        for (float& w : p) w = std::exp2(exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
        CheckFused(*codec, shape, x, q, p, n_q);
      }
    }
  }
}

// The AVX2 kernels agree with the scalar specification within the stated bound, including the
// fallback for rows that are not whole blocks (head_dim 8, as in stories260K).
TEST_P(GgmlCodecTest, VectorKernelsAgreeWithScalarKernels) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  const std::string name = GetParam();
  auto scalar = testing::MakeCodec(name, KernelPath::kScalar);
  auto vector = testing::MakeCodec(name, KernelPath::kAvx2);
  EXPECT_LT(scalar->info().fused_rel_error, vector->info().fused_rel_error);
  for (TileShape shape : {TileShape{256, 128}, TileShape{7, 8}, TileShape{65, 96}}) {
    const uint32_t n_q = 5;
    const auto x = testing::RandomValues(shape.n_values(), 3);
    const auto q = testing::RandomValues(size_t{n_q} * shape.dim, 4);
    std::vector<float> p(size_t{n_q} * shape.tokens, 1.0f / shape.tokens);
    const auto bytes = testing::EncodeTile(*scalar, x, shape);
    std::vector<float> s0(size_t{n_q} * shape.tokens), s1(s0.size());
    ASSERT_TRUE(scalar->scores(bytes, shape, q.data(), n_q, s0.data()).ok());
    ASSERT_TRUE(vector->scores(bytes, shape, q.data(), n_q, s1.data()).ok());
    std::vector<float> a0(size_t{n_q} * shape.dim, 1.0f), a1(a0);
    ASSERT_TRUE(scalar->accumulate(bytes, shape, p.data(), n_q, a0.data()).ok());
    ASSERT_TRUE(vector->accumulate(bytes, shape, p.data(), n_q, a1.data()).ok());
    if (shape.dim % 32 != 0) {  // the same scalar code ran
      EXPECT_EQ(s0, s1);
      EXPECT_EQ(a0, a1);
      continue;
    }
    double s_err = 0, s_norm = 0, a_err = 0, a_norm = 0;
    for (size_t i = 0; i < s0.size(); ++i)
      s_err += (s1[i] - s0[i]) * double{s1[i] - s0[i]}, s_norm += s0[i] * double{s0[i]};
    for (size_t i = 0; i < a0.size(); ++i)
      a_err += (a1[i] - a0[i]) * double{a1[i] - a0[i]}, a_norm += (a0[i] - 1) * double{a0[i] - 1};
    // Typical errors are far below the worst-case bounds: 8-bit rounding of q or p gives about
    // 1e-2 relative on uncorrelated data, 16-bit about 1e-4.
    const double typical = name == "q4_0" ? 3e-2 : 3e-4;
    EXPECT_LT(std::sqrt(s_err / s_norm), typical) << name << " scores";
    EXPECT_LT(std::sqrt(a_err / a_norm), typical) << name << " accumulate";
  }
}

// The AVX-512 kernels stay within the stated bound for every count of heads (passes of 8 and
// each remainder), token counts around their 16-token steps and 4-token groups, and rows of 1 to
// 32 blocks.
TEST_P(GgmlCodecTest, Avx512KernelsStayWithinBoundOnEveryHeadCountAndTail) {
  if (BestKernelPath() < KernelPath::kAvx512) GTEST_SKIP() << "no AVX-512 VNNI on this machine";
  const std::string name = GetParam();
  auto codec = testing::MakeCodec(name, KernelPath::kAvx512);
  ASSERT_EQ(codec->kernel_path(), KernelPath::kAvx512);
  for (TileShape shape : {TileShape{1, 32}, TileShape{15, 64}, TileShape{16, 32}, TileShape{17, 96},
                          TileShape{71, 64}, TileShape{130, 128}, TileShape{33, 1024}}) {
    const auto x = testing::RandomValues(shape.n_values(), shape.tokens + shape.dim);
    for (uint32_t n_q : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 16u, 17u}) {
      SCOPED_TRACE(std::to_string(shape.tokens) + "x" + std::to_string(shape.dim) + ", " +
                   std::to_string(n_q) + " heads");
      const auto q = testing::RandomValues(size_t{n_q} * shape.dim, n_q);
      std::vector<float> p(size_t{n_q} * shape.tokens);
      std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()) + n_q);
      std::uniform_real_distribution<float> weight(0.0f, 1.0f);
      for (float& w : p) w = weight(rng);
      CheckFused(*codec, shape, x, q, p, n_q);
    }
  }
}

// A query block as llama.cpp's CPU attention rounds it for quantised K (ggml's quantize_row_q8_0:
// codes round(x * 127 / amax), scale amax / 127 stored in fp16), and the score of one token's
// row of K blocks against it: per block the integer dot times both fp16 scales, in double.
double LlamaCppScore(const std::string& name, const float* q, const std::byte* row, uint32_t dim) {
  double score = 0;
  for (uint32_t b = 0; b < dim / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(q[b * 32 + j]));
    const float dq = HalfToFloat(FloatToHalf(amax / 127.0f));
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    const std::byte* block = row + b * BlockBytes(name);
    double dot = 0;
    for (int j = 0; j < 32; ++j)
      dot += std::nearbyint(q[b * 32 + j] * id) * CodeValue(name, block, j);
    score += double{dq} * Scale(block) * dot;
  }
  return score;
}

// The kernels that round queries to int8 (every format on AVX-512, q4_0 on AVX2) compute
// llama.cpp's score: its q8_0 query, fp16 scale included, times the K codes, to float rounding.
// A float query scale (amax / 127 unrounded) misses by up to 2^-11 of a block's part.
TEST_P(GgmlCodecTest, Int8QueryKernelsScoreAsLlamaCpp) {
  const std::string name = GetParam();
  std::vector<KernelPath> paths;
  if (BestKernelPath() >= KernelPath::kAvx512) paths.push_back(KernelPath::kAvx512);
  if (BestKernelPath() >= KernelPath::kAvx2 && name == "q4_0") paths.push_back(KernelPath::kAvx2);
  if (paths.empty()) GTEST_SKIP() << "no int8-query kernel for " << name << " on this machine";
  const TileShape shape{37, 128};
  const uint32_t n_q = 7;
  const auto x = testing::RandomValues(shape.n_values(), 11);
  const auto q = testing::RandomValues(size_t{n_q} * shape.dim, 12);
  for (KernelPath path : paths) {
    SCOPED_TRACE(KernelPathName(path));
    auto codec = testing::MakeCodec(name, path);
    const auto bytes = testing::EncodeTile(*codec, x, shape);
    const size_t row_bytes = shape.dim / 32 * BlockBytes(name);
    std::vector<float> s(size_t{n_q} * shape.tokens);
    ASSERT_TRUE(codec->scores(bytes, shape, q.data(), n_q, s.data()).ok());
    for (uint32_t h = 0; h < n_q; ++h) {
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        const double want =
            LlamaCppScore(name, &q[size_t{h} * shape.dim], &bytes[t * row_bytes], shape.dim);
        EXPECT_NEAR(s[h * shape.tokens + t], want, 1e-6 * (1 + std::fabs(want)))
            << "head " << h << " token " << t;
      }
    }
  }
}

// Scales that are NaN or +-Inf, and any codes, decode to whatever they mean and never crash or
// read out of bounds, on both paths and for whole-block and token-spanning rows.
TEST_P(GgmlCodecTest, NonFiniteScalesAndRandomCodesNeverCrash) {
  const std::string name = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(name, path);
    for (TileShape shape : {TileShape{19, 128}, TileShape{5, 8}, TileShape{3, 96}}) {
      const size_t n_bytes = *codec->encoded_size(shape);
      for (uint16_t scale : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e00}, uint16_t{0xffff},
                             uint16_t{0x7bff}}) {
        std::vector<std::byte> tile(n_bytes);
        for (auto& b : tile) b = static_cast<std::byte>(rng() & 0xff);
        for (size_t off = 0; off < n_bytes; off += BlockBytes(name))
          std::memcpy(&tile[off], &scale, 2);
        std::vector<float> out(shape.n_values()), q(4 * shape.dim, 0.25f), s(4 * shape.tokens),
            acc(4 * shape.dim);
        std::vector<float> p(4 * shape.tokens, 0.5f);
        EXPECT_TRUE(codec->decode(tile, shape, out.data()).ok());
        EXPECT_TRUE(codec->scores(tile, shape, q.data(), 4, s.data()).ok());
        EXPECT_TRUE(codec->accumulate(tile, shape, p.data(), 4, acc.data()).ok());
        if (scale == 0x7e00) {
          for (float v : out) EXPECT_TRUE(std::isnan(v));
        }
      }
    }
  }
}

TEST_P(GgmlCodecTest, NonFiniteInputIsInvalidArgument) {
  auto codec = testing::MakeCodec(GetParam(), BestKernelPath());
  const TileShape shape{2, 64};
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto x = testing::RandomValues(shape.n_values(), 1);
    x[77] = bad;
    std::vector<std::byte> out(*codec->encoded_size(shape));
    EXPECT_EQ(codec->encode(x.data(), shape, out).code(), StatusCode::kInvalidArgument);
  }
}

TEST_P(GgmlCodecTest, InfoDescribesTheFormat) {
  auto codec = testing::MakeCodec(GetParam(), KernelPath::kScalar);
  const CodecInfo& info = codec->info();
  EXPECT_EQ(info.name, GetParam());
  EXPECT_DOUBLE_EQ(info.bits_per_value, GetParam() == "q8_0" ? 8.5 : 4.5);
  EXPECT_EQ(info.code_bits, GetParam() == "q8_0" ? 8u : 4u);
  EXPECT_FALSE(info.lossless);
  EXPECT_EQ(info.role, CodecRole::kBoth);
  EXPECT_EQ(CodecRegistry::Default().Create(GetParam() + ":channel").status().code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Ggml, GgmlCodecTest, ::testing::ValuesIn(kNames),
                         [](const auto& param_info) { return std::string(param_info.param); });

// ggml's own test pattern and the q4_0 all-zero block: d = 0 / -8 is -0, stored as 0x8000.
TEST(GgmlQ4_0, AllZeroBlockHasNegativeZeroScale) {
  auto codec = testing::MakeCodec("q4_0", KernelPath::kScalar);
  const auto bytes = testing::EncodeTile(*codec, std::vector<float>(32, 0.0f), {1, 32});
  EXPECT_EQ(bytes[0], std::byte{0x00});
  EXPECT_EQ(bytes[1], std::byte{0x80});
  for (size_t i = 2; i < bytes.size(); ++i) EXPECT_EQ(bytes[i], std::byte{0x88});
}

// q4_0's AVX2 accumulate sums 8-bit products of 32 tokens in int16: with every code 15 and
// every weight at the top of its range, sum w * code (60960) wraps, and the result is exact only
// because 8 sum(w) is subtracted modulo 2^16 as well. Equal weights round without error, so the
// result must match decode-then-dot to float precision.
TEST(GgmlQ4_0, AccumulateOfExtremeCodesIsExactDespiteInt16Wrap) {
  const TileShape shape{64, 64};
  std::vector<float> x(shape.n_values(), 0.875f);
  for (size_t b = 0; b < x.size(); b += 32) x[b] = -1.0f;  // d = 1/8: code 0 here, 15 elsewhere
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec("q4_0", path);
    const auto bytes = testing::EncodeTile(*codec, x, shape);
    const auto v = testing::DecodeTile(*codec, bytes, shape);
    ASSERT_EQ(v[1], 0.875f);
    for (uint32_t n_q : {1u, 4u}) {
      std::vector<float> p(size_t{n_q} * shape.tokens, 0.25f), acc(size_t{n_q} * shape.dim, 0.0f);
      ASSERT_TRUE(codec->accumulate(bytes, shape, p.data(), n_q, acc.data()).ok());
      for (uint32_t i = 0; i < n_q; ++i) {
        for (uint32_t d = 0; d < shape.dim; ++d) {
          double ref = 0;
          for (uint32_t t = 0; t < shape.tokens; ++t) ref += 0.25 * v[size_t{t} * shape.dim + d];
          ASSERT_NEAR(acc[i * shape.dim + d], ref, 1e-5 * std::fabs(ref))
              << KernelPathName(path) << " dim " << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace argus
