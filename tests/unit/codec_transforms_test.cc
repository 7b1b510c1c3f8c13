// +rot and +center: the Hadamard rotation itself, round trips against the base codec's bound,
// centring as an exact shift of the scores, the recorded header, which bases they accept, and
// (since wrapped codecs are not in the registry's list, which the conformance test walks) the
// conformance properties for every wrapped codec that can be built from the registered ones.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "argus/codec.h"
#include "argus/core.h"
#include "codec/codec_internal.h"
#include "test_util.h"

namespace argus {
namespace {

using codec_internal::HadamardRotate;

constexpr size_t kHeaderBytes = 12;

Result<std::unique_ptr<Codec>> Create(const std::string& spec, KernelPath path) {
  ARGUS_ASSIGN_OR_RETURN(CodecSpec parsed, CodecSpec::Parse(spec));
  parsed.path = path;
  return CodecRegistry::Default().Create(parsed);
}

bool Registered(const std::string& name) {
  for (const auto& info : CodecRegistry::Default().List()) {
    if (info.name == name) return true;
  }
  return false;
}

using testing::Dot;
using testing::Norm;

std::vector<double> Softmax(const float* s, size_t n) {
  const double top = *std::max_element(s, s + n);
  std::vector<double> p(n);
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += p[i] = std::exp(s[i] - top);
  for (double& v : p) v /= z;
  return p;
}

// ---- The rotation ----------------------------------------------------------------------------

// Column j of H (H e_j), as the library computes it.
std::vector<float> HadamardColumn(uint32_t dim, uint32_t j) {
  std::vector<float> e(dim, 0.0f);
  e[j] = 1.0f;
  HadamardRotate(e.data(), dim);
  return e;
}

// The documented H in double: Sylvester blocks of dim's binary digits, largest first.
double ExpectedEntry(uint32_t dim, uint32_t i, uint32_t j) {
  uint32_t offset = 0;
  for (uint32_t n = 1u << 31; n > 0; n >>= 1) {
    if (!(dim & n)) continue;
    if (i >= offset && i < offset + n) {
      if (j < offset || j >= offset + n) return 0;
      return (std::popcount((i - offset) & (j - offset)) % 2 ? -1.0 : 1.0) /
             std::sqrt(static_cast<double>(n));
    }
    offset += n;
  }
  return 0;
}

TEST(Hadamard, IsTheDocumentedSymmetricOrthonormalMatrixForEveryDim) {
  for (uint32_t dim : {1u, 3u, 7u, 8u, 16u, 32u, 64u, 80u, 96u, 112u, 128u, 200u, 256u}) {
    std::vector<std::vector<float>> h(dim);
    for (uint32_t j = 0; j < dim; ++j) h[j] = HadamardColumn(dim, j);  // h[j][i] = H(i, j)
    for (uint32_t i = 0; i < dim; ++i) {
      for (uint32_t j = 0; j < dim; ++j) {
        ASSERT_NEAR(h[j][i], ExpectedEntry(dim, i, j), 1e-7)
            << "dim " << dim << " H(" << i << "," << j << ")";
        ASSERT_EQ(h[j][i], h[i][j]) << "dim " << dim << ": not symmetric at " << i << "," << j;
      }
    }
    for (uint32_t a = 0; a < dim; ++a) {
      for (uint32_t b = 0; b < dim; ++b) {
        ASSERT_NEAR(Dot(h[a].data(), h[b].data(), dim), a == b ? 1.0 : 0.0, 1e-6) << "dim " << dim;
      }
    }
  }
}

TEST(Hadamard, PreservesDotProductsAndUndoesItselfToFloatRounding) {
  for (uint32_t dim : {64u, 80u, 96u, 128u, 256u, 1024u}) {
    auto q = testing::RandomValues(dim, dim), k = testing::RandomValues(dim, dim + 1);
    auto hq = q, hk = k;
    HadamardRotate(hq.data(), dim);
    HadamardRotate(hk.data(), dim);
    const double nq = Norm(q.data(), dim), nk = Norm(k.data(), dim);
    EXPECT_NEAR(Dot(hq.data(), hk.data(), dim), Dot(q.data(), k.data(), dim), 1e-6 * nq * nk)
        << "dim " << dim;
    EXPECT_NEAR(Norm(hq.data(), dim), nq, 1e-6 * nq);
    HadamardRotate(hq.data(), dim);
    for (uint32_t d = 0; d < dim; ++d) ASSERT_NEAR(hq[d], q[d], 1e-6 * nq) << "dim " << dim;
  }
}

// ---- Round trips and centring on real codecs -------------------------------------------------

// Rotation is orthonormal, so ||x' - x|| = ||y' - y|| for y = H x: the round-trip error of each
// token is the base codec's error on the rotated row.
TEST(Transforms, RotatedRoundTripStaysWithinTheBaseCodecsBound) {
  for (TileShape shape : {TileShape{16, 128}, TileShape{9, 80}}) {
    auto x = testing::RandomValues(shape.n_values(), 21);
    std::vector<float> y = x;
    for (uint32_t t = 0; t < shape.tokens; ++t)
      HadamardRotate(&y[size_t{t} * shape.dim], shape.dim);

    // fp8_e4m3: |y' - y| <= |y| / 16 + scale / 1024 per element (see fp8.cc).
    auto fp8 = testing::MakeCodec("fp8_e4m3+rot", BestKernelPath());
    auto tile = testing::EncodeTile(*fp8, x, shape);
    float scale;
    std::memcpy(&scale, tile.data() + kHeaderBytes, 4);
    auto decoded = testing::DecodeTile(*fp8, tile, shape);
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const float* xt = &x[size_t{t} * shape.dim];
      double err = 0;
      for (uint32_t d = 0; d < shape.dim; ++d)
        err += std::pow(double{decoded[size_t{t} * shape.dim + d]} - xt[d], 2);
      const double bound =
          Norm(&y[size_t{t} * shape.dim], shape.dim) / 16 + std::sqrt(shape.dim) * scale / 1024;
      EXPECT_LE(std::sqrt(err), bound + 1e-5 * Norm(xt, shape.dim)) << "fp8_e4m3+rot token " << t;
    }

    // int8 (affine, 255 steps over a group's range): |y' - y| <= range / 255 per element, a full
    // step, which covers its fp16 scale and minimum; the tile's range bounds every group's.
    if (!Registered("int8")) continue;
    auto int8 = testing::MakeCodec("int8+rot", BestKernelPath());
    decoded = testing::DecodeTile(*int8, testing::EncodeTile(*int8, x, shape), shape);
    const double range =
        *std::max_element(y.begin(), y.end()) - *std::min_element(y.begin(), y.end());
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const float* yt = &y[size_t{t} * shape.dim];
      double err = 0;
      for (uint32_t d = 0; d < shape.dim; ++d)
        err +=
            std::pow(double{decoded[size_t{t} * shape.dim + d]} - x[size_t{t} * shape.dim + d], 2);
      EXPECT_LE(std::sqrt(err), std::sqrt(shape.dim) * range / 255 + 1e-5 * Norm(yt, shape.dim))
          << "int8+rot token " << t;
    }
  }
}

// A centred tile is the base codec's tile of x - mu, byte for byte; decode adds mu back; and the
// scores are the base codec's scores of the centred tile plus q . mu, one constant per head, so
// the softmax over the tile is unchanged. Some channels have means in fp16's subnormal range, of
// zero, and beyond its range (clamped), so the stored means are read back exactly in every case.
TEST(Transforms, CentringShiftsEachHeadsScoresByTheConstantQDotMu) {
  const std::string base_name = Registered("q8_0") ? "q8_0" : "fp8_e4m3";
  for (KernelPath path : testing::KernelPaths()) {
    auto base = testing::MakeCodec(base_name, path);
    auto centred = testing::MakeCodec(base_name + "+center", path);
    TileShape shape{40, 96};
    auto x = testing::RandomValues(shape.n_values(), 31);
    const std::pair<uint32_t, float> constant_channels[] = {
        {7, 1e-6f}, {8, -3e-5f}, {9, 0.0f}, {10, -7e4f}};
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] += 3.0f * static_cast<float>(i % shape.dim % 5);  // channel means
      for (auto [d, value] : constant_channels) {
        if (i % shape.dim == d) x[i] = value;
      }
    }
    auto tile = testing::EncodeTile(*centred, x, shape);
    const size_t prefix = kHeaderBytes + 2 * shape.dim;
    std::span<const std::byte> base_tile(tile.data() + prefix, tile.size() - prefix);

    std::vector<float> mu(shape.dim), residual(x.size());
    for (uint32_t d = 0; d < shape.dim; ++d) {
      uint16_t h;
      std::memcpy(&h, tile.data() + kHeaderBytes + 2 * d, 2);
      mu[d] = HalfToFloat(h);
      double mean = 0;
      for (uint32_t t = 0; t < shape.tokens; ++t)
        mean += x[size_t{t} * shape.dim + d] / shape.tokens;
      mean = std::clamp(mean, -65504.0, 65504.0);
      EXPECT_NEAR(mu[d], mean, std::ldexp(std::fabs(mean), -11) + 3e-8) << "channel " << d;
    }
    for (size_t i = 0; i < x.size(); ++i) residual[i] = x[i] - mu[i % shape.dim];
    auto expected_tile = testing::EncodeTile(*base, residual, shape);
    ASSERT_TRUE(
        std::equal(base_tile.begin(), base_tile.end(), expected_tile.begin(), expected_tile.end()));

    auto decoded = testing::DecodeTile(*centred, tile, shape),
         base_decoded = testing::DecodeTile(*base, base_tile, shape);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(decoded[i], base_decoded[i] + mu[i % shape.dim]);

    const uint32_t n_q = 3;
    auto q = testing::RandomValues(n_q * shape.dim, 32);
    std::vector<float> s(n_q * shape.tokens), s_base(n_q * shape.tokens);
    ASSERT_TRUE(centred->scores(tile, shape, q.data(), n_q, s.data()).ok());
    ASSERT_TRUE(base->scores(base_tile, shape, q.data(), n_q, s_base.data()).ok());
    for (uint32_t i = 0; i < n_q; ++i) {
      const double q_mu = Dot(&q[i * shape.dim], mu.data(), shape.dim);
      const double slack = 1e-5 * Norm(&q[i * shape.dim], shape.dim) * Norm(mu.data(), shape.dim);
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        const size_t it = size_t{i} * shape.tokens + t;
        ASSERT_NEAR(double{s[it]} - s_base[it], q_mu, slack + 1e-6 * std::fabs(s[it]))
            << "head " << i << " token " << t;
      }
      auto p = Softmax(&s[size_t{i} * shape.tokens], shape.tokens);
      auto p_base = Softmax(&s_base[size_t{i} * shape.tokens], shape.tokens);
      for (uint32_t t = 0; t < shape.tokens; ++t)
        ASSERT_NEAR(p[t], p_base[t], 1e-5) << "head " << i << " token " << t;
    }
  }
}

// The readers convert stored means with their own branch-free code: a crafted fp8_e4m3+center
// tile whose base codes are all zero decodes to exactly its means, for every finite fp16 pattern.
TEST(Transforms, StoredMeansReadBackExactlyForEveryFiniteHalf) {
  auto codec = testing::MakeCodec("fp8_e4m3+center", BestKernelPath());
  const TileShape shape{1, kMaxTileDim};
  auto tile = testing::EncodeTile(*codec, std::vector<float>(shape.n_values(), 0.0f), shape);
  const float one = 1.0f;
  std::memcpy(tile.data() + kHeaderBytes + 2 * shape.dim, &one, 4);  // fp8 scale; codes are 0
  std::vector<uint16_t> finite;
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00u) != 0x7c00u) finite.push_back(static_cast<uint16_t>(h));
  }
  for (size_t first = 0; first < finite.size(); first += shape.dim) {
    for (uint32_t d = 0; d < shape.dim; ++d) {
      std::memcpy(tile.data() + kHeaderBytes + 2 * d, &finite[(first + d) % finite.size()], 2);
    }
    auto decoded = testing::DecodeTile(*codec, tile, shape);
    for (uint32_t d = 0; d < shape.dim; ++d) {
      const float expected =
          0.0f + HalfToFloat(finite[(first + d) % finite.size()]);  // x' = y' + mu
      ASSERT_EQ(std::bit_cast<uint32_t>(decoded[d]), std::bit_cast<uint32_t>(expected))
          << "fp16 pattern " << finite[(first + d) % finite.size()];
    }
  }
}

// ---- Header, naming and acceptance -----------------------------------------------------------

TEST(Transforms, MalformedHeaderIsCorruption) {
  auto codec = testing::MakeCodec("fp8_e4m3+rot+center", BestKernelPath());
  TileShape shape{6, 32};
  const auto good = testing::EncodeTile(*codec, testing::RandomValues(shape.n_values(), 41), shape);
  const uint16_t inf_half = 0x7c00, nan_half = 0x7e01;
  const std::vector<std::pair<size_t, std::vector<uint8_t>>> damage = {
      {0, {'X'}},                                            // magic
      {4, {1}},                                              // flags: +rot only
      {4, {7}},                                              // flags: unknown bit
      {5, {1}},                                              // reserved
      {6, {64, 0}},                                          // dim
      {8, {5, 0, 0, 0}},                                     // tokens
      {kHeaderBytes + 6, {inf_half & 0xff, inf_half >> 8}},  // a channel mean
      {kHeaderBytes + 20, {nan_half & 0xff, nan_half >> 8}},
  };
  std::vector<float> out(shape.n_values()), q(2 * 32, 1.0f), p(2 * 6, 0.1f), acc(2 * 32);
  for (const auto& [offset, bytes] : damage) {
    auto tile = good;
    for (size_t i = 0; i < bytes.size(); ++i) tile[offset + i] = static_cast<std::byte>(bytes[i]);
    EXPECT_EQ(codec->decode(tile, shape, out.data()).code(), StatusCode::kCorruption)
        << "offset " << offset;
    EXPECT_EQ(codec->scores(tile, shape, q.data(), 2, out.data()).code(), StatusCode::kCorruption);
    EXPECT_EQ(codec->accumulate(tile, shape, p.data(), 2, acc.data()).code(),
              StatusCode::kCorruption);
  }
  // 6x32 and 2x64 tiles have the same size: the recorded shape tells them apart.
  ASSERT_EQ(*codec->encoded_size({2, 64}), good.size());
  EXPECT_EQ(codec->decode(good, {2, 64}, out.data()).code(), StatusCode::kCorruption);
}

TEST(Transforms, InfoComesFromTheSpecAndTheBase) {
  auto codec = testing::MakeCodec("fp8_e4m3+rot+center", KernelPath::kScalar);
  const CodecInfo& info = codec->info();
  EXPECT_EQ(info.name, "fp8_e4m3+rot+center");
  EXPECT_EQ(info.code_bits, 8u);
  EXPECT_FALSE(info.lossless);
  EXPECT_EQ(info.role, CodecRole::kBoth);
  EXPECT_DOUBLE_EQ(info.bits_per_value,
                   (kHeaderBytes + 2 * 128 + 4 + 256 * 128) * 8.0 / (256 * 128));
  auto base = testing::MakeCodec("fp8_e4m3", KernelPath::kScalar);
  EXPECT_DOUBLE_EQ(info.fused_rel_error, 2 * base->info().fused_rel_error + 1e-5);
  EXPECT_EQ(testing::MakeCodec("fp8_e5m2+center", KernelPath::kScalar)->info().name,
            "fp8_e5m2+center");
  EXPECT_EQ(codec->kernel_path(), KernelPath::kScalar);
}

TEST(Transforms, RefusedAroundLosslessOrWiderCodecs) {
  for (const auto& info : CodecRegistry::Default().List()) {
    if (!info.lossless && info.code_bits >= 1 && info.code_bits <= 8) continue;
    for (const char* transform : {"+rot", "+center"}) {
      auto codec = Create(info.name + transform, BestKernelPath());
      ASSERT_FALSE(codec.ok()) << info.name << transform;
      EXPECT_EQ(codec.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(codec.status().message().find(info.name + transform), std::string::npos)
          << codec.status().ToString();
    }
  }
}

TEST(Transforms, NonFiniteInputIsInvalidArgument) {
  auto codec = testing::MakeCodec("fp8_e4m3+rot", BestKernelPath());
  TileShape shape{4, 16};
  auto x = testing::RandomValues(shape.n_values(), 5);
  x[3 * 16 + 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> tile(*codec->encoded_size(shape));
  Status status = codec->encode(x.data(), shape, tile);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token 3, channel 2"), std::string::npos) << status.ToString();
}

}  // namespace
}  // namespace argus
