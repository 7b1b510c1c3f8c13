// f32 / f16 / bf16: exact conversions on both kernel paths, for every kind of float.
#include <bit>
#include <cstring>
#include <random>

#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus {
namespace {

// Random bit patterns cover NaNs (with payloads), infinities, subnormals and both zeros.
TEST(FloatCodecs, VectorEncodeIsBitIdenticalToScalarOnEveryKindOfFloat) {
  if (BestKernelPath() != KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
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

}  // namespace
}  // namespace argus
