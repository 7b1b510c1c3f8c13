// f32 / f16 / bf16: exact conversions on every kernel path, for every kind of float; the AVX-512
// fused kernels on every head block and tail.
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "argus/codec.h"
#include "test_util.h"

namespace argus {
namespace {

// Random bit patterns cover NaNs (with payloads), infinities, subnormals and both zeros.
TEST(FloatCodecs, VectorEncodeIsBitIdenticalToScalarOnEveryKindOfFloat) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  const TileShape shape{257, 64};
  std::vector<float> x(shape.n_values());
  for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  const float specials[] = {0.0f,
                            -0.0f,
                            65504.0f,
                            65520.0f,
                            -65520.0f,
                            5.96e-8f,
                            2.98e-8f,
                            1e-45f,
                            std::numeric_limits<float>::infinity(),
                            std::bit_cast<float>(0x7f800001u),
                            std::bit_cast<float>(0xffc01234u),
                            3.4028235e38f};
  std::memcpy(x.data(), specials, sizeof specials);
  for (const char* name : {"f16", "bf16", "f32"}) {
    CodecSpec spec = *CodecSpec::Parse(name);
    spec.path = KernelPath::kScalar;
    auto scalar = std::move(CodecRegistry::Default().Create(spec)).value();
    spec.path = KernelPath::kAvx2;
    auto vector = std::move(CodecRegistry::Default().Create(spec)).value();
    std::vector<std::byte> a(*scalar->encoded_size(shape)), b(a.size());
    ASSERT_TRUE(scalar->encode(x.data(), shape, a).ok());
    ASSERT_TRUE(vector->encode(x.data(), shape, b).ok());
    ASSERT_EQ(a, b) << name;
    std::vector<float> da(x.size()), db(x.size());
    ASSERT_TRUE(scalar->decode(a, shape, da.data()).ok());
    ASSERT_TRUE(vector->decode(a, shape, db.data()).ok());
    ASSERT_EQ(std::memcmp(da.data(), db.data(), da.size() * 4), 0) << name;
  }
}

// Per-element error: half an ulp of the format (relative 2^-11 for f16 normals, 2^-8 for bf16).
TEST(FloatCodecs, RoundingErrorIsHalfAnUlp) {
  const TileShape shape{97, 80};
  auto x = testing::RandomValues(shape.n_values(), 4);
  for (auto [name, rel] : {std::pair{"f16", 0x1p-11}, std::pair{"bf16", 0x1p-8}}) {
    auto codec = std::move(CodecRegistry::Default().Create(name)).value();
    std::vector<std::byte> tile(*codec->encoded_size(shape));
    std::vector<float> back(x.size());
    ASSERT_TRUE(codec->encode(x.data(), shape, tile).ok());
    ASSERT_TRUE(codec->decode(tile, shape, back.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      // f16 subnormals (|x| < 2^-14) have an absolute quantum of 2^-24.
      ASSERT_LE(std::fabs(back[i] - x[i]), rel * std::fabs(x[i]) + 0x1p-25) << name << " " << x[i];
    }
  }
}

// The AVX-512 kernels cut the heads into blocks (scores: of 4, the last padded; accumulate: of
// 16, 8, 4, 2 and 1), the tokens into blocks of 16 and the channels into vectors of 16 under a
// mask: every cut, against double precision on the decoded values.
TEST(FloatCodecs, Avx512KernelsMatchDoubleOnEveryHeadBlockAndTail) {
  if (BestKernelPath() < KernelPath::kAvx512) GTEST_SKIP() << "no AVX-512 on this machine";
  for (const char* name : {"f16", "bf16", "f32"}) {
    auto codec = testing::MakeCodec(name, KernelPath::kAvx512);
    ASSERT_EQ(codec->kernel_path(), KernelPath::kAvx512);
    const double tol = codec->info().fused_rel_error;
    for (TileShape shape : {TileShape{1, 1}, TileShape{17, 7}, TileShape{16, 16}, TileShape{40, 33},
                            TileShape{15, 200}, TileShape{33, 1024}}) {
      auto x = testing::RandomValues(shape.n_values(), shape.tokens + shape.dim);
      std::vector<std::byte> tile(*codec->encoded_size(shape));
      ASSERT_TRUE(codec->encode(x.data(), shape, tile).ok());
      std::vector<float> k(shape.n_values());
      ASSERT_TRUE(codec->decode(tile, shape, k.data()).ok());
      for (uint32_t n_q : {1u, 2u, 3u, 5u, 8u, 12u, 16u, 31u}) {
        SCOPED_TRACE(std::string(name) + " " + std::to_string(shape.tokens) + "x" +
                     std::to_string(shape.dim) + ", " + std::to_string(n_q) + " heads");
        auto q = testing::RandomValues(size_t{n_q} * shape.dim, n_q);
        std::vector<float> s(size_t{n_q} * shape.tokens, -1.0f);
        ASSERT_TRUE(codec->scores(tile, shape, q.data(), n_q, s.data()).ok());
        auto acc = testing::RandomValues(size_t{n_q} * shape.dim, n_q + 1);
        const auto acc0 = acc;
        ASSERT_TRUE(codec->accumulate(tile, shape, s.data(), n_q, acc.data()).ok());
        for (uint32_t h = 0; h < n_q; ++h) {
          const float* qh = &q[size_t{h} * shape.dim];
          for (uint32_t t = 0; t < shape.tokens; ++t) {
            const float* kt = &k[size_t{t} * shape.dim];
            double dot = 0, qq = 0, kk = 0;
            for (uint32_t d = 0; d < shape.dim; ++d) {
              dot += double{qh[d]} * kt[d];
              qq += double{qh[d]} * qh[d];
              kk += double{kt[d]} * kt[d];
            }
            ASSERT_NEAR(s[size_t{h} * shape.tokens + t], dot, tol * std::sqrt(qq * kk) + 1e-30)
                << "head " << h << " token " << t;
          }
          for (uint32_t d = 0; d < shape.dim; ++d) {
            double sum = acc0[size_t{h} * shape.dim + d], weight = 0;
            for (uint32_t t = 0; t < shape.tokens; ++t) {
              const double p = s[size_t{h} * shape.tokens + t];
              sum += p * k[size_t{t} * shape.dim + d];
              weight += std::fabs(p) * std::fabs(k[size_t{t} * shape.dim + d]);
            }
            ASSERT_NEAR(acc[size_t{h} * shape.dim + d], sum,
                        tol * weight + 1e-6 * std::fabs(acc0[size_t{h} * shape.dim + d]))
                << "head " << h << " channel " << d;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace argus
