// Properties every registered codec must have, whatever its format: sizes, round trips,
// fused kernels against decode-then-dot in double, AVX2 against scalar, odd shapes, and
// malformed input. Format-specific tests (oracles, error bounds) live in codec_<family>_test.cc.
#include <cmath>
#include <random>
#include <thread>

#include "argus/codec.h"
#include "test_util.h"

namespace argus {
namespace {

// Every registered codec, its :channel grouping where it has one, and +rot, +center and both
// around every codec that takes transforms.
std::vector<std::string> AllSpecs() {
  std::vector<std::string> specs;
  for (const auto& info : CodecRegistry::Default().List()) {
    std::vector<std::string> bases = {info.name};
    if (info.groupable) bases.push_back(info.name + ":channel");
    for (const std::string& base : bases) {
      specs.push_back(base);
      for (const char* transforms : {"+rot", "+center", "+rot+center"}) {
        if (CodecRegistry::Default().Create(base + transforms).ok())
          specs.push_back(base + transforms);
      }
    }
  }
  return specs;
}

class CodecConformance : public ::testing::TestWithParam<std::string> {};

constexpr TileShape kConformanceShapes[] = {{1, 64},   {31, 80},   {33, 96},  {97, 128},
                                            {54, 256}, {256, 128}, {19, 136}, {7, 8}};

TEST_P(CodecConformance, EncodedSizeMatchesInfoAndOverflowsAreErrors) {
  auto codec = testing::MakeCodec(GetParam(), KernelPath::kScalar);
  auto n = codec->encoded_size({256, 128});
  if (!n.ok()) GTEST_SKIP() << GetParam() << " does not hold 256x128 tiles";
  EXPECT_NEAR(codec->info().bits_per_value, *n * 8.0 / (256 * 128), 1e-9);
  EXPECT_FALSE(codec->encoded_size({0, 128}).ok());
  EXPECT_FALSE(codec->encoded_size({1, kMaxTileDim + 1}).ok());
  EXPECT_FALSE(codec->encoded_size({kMaxTileTokens + 1, 1}).ok());
}

// Fused kernels agree with decode-then-dot in double within the codec's stated bound, on every
// kernel path, for every odd shape the codec supports.
TEST_P(CodecConformance, FusedKernelsMatchDecodeThenDot) {
  const uint32_t head_counts[] = {1, 4, 7, 8};
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(GetParam(), path);
    for (TileShape shape : kConformanceShapes) {
      auto n_bytes = codec->encoded_size(shape);
      if (!n_bytes.ok()) continue;  // e.g. a dim the codec refuses, with an error
      SCOPED_TRACE(GetParam() + " " + std::string(KernelPathName(path)) + " " +
                   std::to_string(shape.tokens) + "x" + std::to_string(shape.dim));
      auto x = testing::RandomValues(shape.n_values(), shape.tokens * 7 + shape.dim);
      std::vector<std::byte> tile(*n_bytes);
      ASSERT_TRUE(codec->encode(x.data(), shape, tile).ok());
      ASSERT_NO_FATAL_FAILURE(
          testing::CheckFusedKernelsAgainstDouble(*codec, tile, shape, head_counts, 99));
    }
  }
}

// A row's accumulation is the same bits alone in its call, among 7 or 8 rows (the engine pads a
// scores call of 7 rows to 8 but accumulates the 7) or among 17, on every path.
TEST_P(CodecConformance, AccumulateGivesEachRowTheSameBitsWhateverItsCall) {
  const TileShape shape{97, 64};
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(GetParam(), path);
    if (codec->info().role == CodecRole::kKeys) GTEST_SKIP() << GetParam() << " holds keys only";
    SCOPED_TRACE(GetParam() + " " + std::string(KernelPathName(path)));
    const auto tile =
        testing::EncodeTile(*codec, testing::RandomValues(shape.n_values(), 3), shape);
    for (uint32_t n_q : {7u, 8u, 17u}) {
      std::vector<float> p(size_t{n_q} * shape.tokens);
      for (size_t j = 0; j < p.size(); ++j)
        p[j] = std::exp(-0.05f * static_cast<float>(j % 41)) / shape.tokens;
      const auto acc0 = testing::RandomValues(size_t{n_q} * shape.dim, n_q);
      auto acc = acc0;
      ASSERT_TRUE(codec->accumulate(tile, shape, p.data(), n_q, acc.data()).ok());
      for (uint32_t h = 0; h < n_q; ++h) {
        std::vector<float> alone(&acc0[size_t{h} * shape.dim], &acc0[size_t{h + 1} * shape.dim]);
        ASSERT_TRUE(
            codec->accumulate(tile, shape, &p[size_t{h} * shape.tokens], 1, alone.data()).ok());
        for (uint32_t d = 0; d < shape.dim; ++d)
          ASSERT_EQ(alone[d], acc[size_t{h} * shape.dim + d]) << "row " << h << " of " << n_q;
      }
    }
  }
}

// A row's scores are the same bits alone in its call or among 7, 8 or 17 rows, on every path and
// for tiles that end mid-block (a prompt evaluated in two chunks gives the logits of one), short
// rows and long ones (kernels may block them differently).
TEST_P(CodecConformance, ScoresGiveEachRowTheSameBitsWhateverItsCall) {
  const std::string& spec = GetParam();
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(spec, path);
    for (TileShape shape : {TileShape{97, 64}, TileShape{13, 20}, TileShape{19, 136}}) {
      if (!codec->encoded_size(shape).ok()) continue;  // a dim the codec refuses
      SCOPED_TRACE(spec + " " + std::string(KernelPathName(path)) + " " +
                   std::to_string(shape.tokens) + "x" + std::to_string(shape.dim));
      const auto tile =
          testing::EncodeTile(*codec, testing::RandomValues(shape.n_values(), 3), shape);
      for (uint32_t n_q : {7u, 8u, 17u}) {
        const auto q = testing::RandomValues(size_t{n_q} * shape.dim, n_q);
        std::vector<float> s(size_t{n_q} * shape.tokens);
        ASSERT_TRUE(codec->scores(tile, shape, q.data(), n_q, s.data()).ok());
        for (uint32_t h = 0; h < n_q; ++h) {
          std::vector<float> alone(shape.tokens);
          ASSERT_TRUE(codec->scores(tile, shape, &q[size_t{h} * shape.dim], 1, alone.data()).ok());
          for (uint32_t t = 0; t < shape.tokens; ++t)
            ASSERT_EQ(alone[t], s[size_t{h} * shape.tokens + t]) << "row " << h << " of " << n_q;
        }
      }
    }
  }
}

// The AVX2 path encodes the same bytes and decodes the same floats as the scalar path.
TEST_P(CodecConformance, VectorPathEncodesAndDecodesLikeScalar) {
  if (BestKernelPath() < KernelPath::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  auto scalar = testing::MakeCodec(GetParam(), KernelPath::kScalar);
  auto vector = testing::MakeCodec(GetParam(), KernelPath::kAvx2);
  for (TileShape shape : kConformanceShapes) {
    auto n_bytes = scalar->encoded_size(shape);
    if (!n_bytes.ok()) continue;
    auto x = testing::RandomValues(shape.n_values(), shape.tokens + shape.dim);
    std::vector<std::byte> a(*n_bytes), b(*n_bytes);
    ASSERT_TRUE(scalar->encode(x.data(), shape, a).ok());
    ASSERT_TRUE(vector->encode(x.data(), shape, b).ok());
    ASSERT_EQ(a, b) << GetParam() << " " << shape.tokens << "x" << shape.dim;
    std::vector<float> da(shape.n_values()), db(shape.n_values());
    ASSERT_TRUE(scalar->decode(a, shape, da.data()).ok());
    ASSERT_TRUE(vector->decode(a, shape, db.data()).ok());
    ASSERT_EQ(da, db);
  }
}

// Wrong sizes are errors; hostile bytes of the right size never crash or read out of bounds
// (the sanitizer build checks the latter). Half the trials keep a valid first half (headers,
// means) so the hostile bytes reach the inner layers too.
TEST_P(CodecConformance, MalformedInputIsAnErrorNeverACrash) {
  for (KernelPath path : testing::KernelPaths()) {
    auto codec = testing::MakeCodec(GetParam(), path);
    TileShape shape{33, 64};
    auto n_bytes = codec->encoded_size(shape);
    ASSERT_TRUE(n_bytes.ok()) << n_bytes.status().ToString();
    std::vector<float> out(shape.n_values() * 2 + 64), q(4 * 64, 0.5f), p(4 * 33, 0.01f),
        acc(4 * 64);
    for (size_t wrong : {size_t{0}, *n_bytes - 1, *n_bytes + 1}) {
      std::vector<std::byte> tile(wrong);
      EXPECT_FALSE(codec->decode(tile, shape, out.data()).ok());
      EXPECT_FALSE(codec->scores(tile, shape, q.data(), 4, out.data()).ok());
      EXPECT_FALSE(codec->accumulate(tile, shape, p.data(), 4, acc.data()).ok());
      std::vector<float> x(shape.n_values(), 1.0f);
      EXPECT_FALSE(codec->encode(x.data(), shape, tile).ok());
    }
    EXPECT_FALSE(
        codec->scores(std::vector<std::byte>(*n_bytes), shape, q.data(), 0, out.data()).ok());
    EXPECT_FALSE(codec->decode(std::vector<std::byte>(*n_bytes), {0, 64}, out.data()).ok());
    std::vector<std::byte> good(*n_bytes);
    ASSERT_TRUE(codec->encode(testing::RandomValues(shape.n_values(), 6).data(), shape, good).ok());
    std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::byte> hostile = good;
      for (size_t i = trial % 2 ? 0 : hostile.size() / 2; i < hostile.size(); ++i) {
        hostile[i] =
            static_cast<std::byte>(trial < 2 ? 0xff * trial : static_cast<int>(rng() & 0xff));
      }
      (void)codec->decode(hostile, shape, out.data());
      (void)codec->scores(hostile, shape, q.data(), 4, out.data());
      (void)codec->accumulate(hostile, shape, p.data(), 4, acc.data());
    }
  }
}

TEST_P(CodecConformance, NonFiniteInputDoesNotCrashAndIsRejectedOrKept) {
  auto codec = testing::MakeCodec(GetParam(), BestKernelPath());
  TileShape shape{32, 64};
  auto n_bytes = codec->encoded_size(shape);
  ASSERT_TRUE(n_bytes.ok());
  auto x = testing::RandomValues(shape.n_values(), 3);
  x[5] = std::numeric_limits<float>::infinity();
  x[70] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> tile(*n_bytes);
  Status status = codec->encode(x.data(), shape, tile);
  if (!status.ok()) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecConformance, ::testing::ValuesIn(AllSpecs()),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(CodecRegistry, FindsByNameAndCapabilityAndAcceptsApplicationCodecs) {
  CodecRegistry& r = CodecRegistry::Default();
  EXPECT_TRUE(r.Create("f16").ok());
  EXPECT_EQ(r.Create("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.Create("f16:channel").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Create("f16+spin").status().code(), StatusCode::kInvalidArgument);
  for (const auto& info : r.Find({.lossless_only = true})) EXPECT_TRUE(info.lossless) << info.name;
  for (const auto& info : r.Find({.max_bits_per_value = 9}))
    EXPECT_LE(info.bits_per_value, 9) << info.name;

  CodecRegistry mine;
  EXPECT_TRUE(mine.Register("my_f16", r.Find({})[0],
                            [](const CodecSpec&) { return CodecRegistry::Default().Create("f16"); })
                  .ok());
  EXPECT_EQ(mine.Register("my_f16", {},
                          [](const CodecSpec&) { return CodecRegistry::Default().Create("f16"); })
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(mine.Register("Bad Name", {},
                          [](const CodecSpec&) { return CodecRegistry::Default().Create("f16"); })
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(mine.Create("my_f16").ok());
  EXPECT_EQ(mine.List().size(), 1u);
  EXPECT_TRUE(mine.Unregister("my_f16").ok());
  EXPECT_EQ(mine.Unregister("my_f16").code(), StatusCode::kNotFound);
  EXPECT_FALSE(mine.Create("my_f16").ok());
}

TEST(CodecSpec, ParsesGroupingAndTransforms) {
  auto spec = CodecSpec::Parse("int4:channel+rot+center");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->name, "int4");
  EXPECT_EQ(spec->grouping, Grouping::kChannel);
  EXPECT_TRUE(spec->rotate && spec->center);
  EXPECT_EQ(spec->ToString(), "int4:channel+rot+center");
  EXPECT_FALSE(CodecSpec::Parse("int4:row").ok());
  EXPECT_FALSE(CodecSpec::Parse(":token").ok());
}

}  // namespace
}  // namespace argus

namespace argus {
namespace {

// Codecs are immutable and thread-safe: four threads sharing one instance compute exactly what
// one thread does.
TEST(CodecThreadSafety, SharedInstanceGivesIdenticalResultsFromManyThreads) {
  const TileShape shape{256, 128};
  const uint32_t n_q = 4;
  auto x = testing::RandomValues(shape.n_values(), 77);
  auto q = testing::RandomValues(size_t{n_q} * shape.dim, 78);
  std::vector<float> p(size_t{n_q} * shape.tokens, 1.0f / shape.tokens);
  for (const auto& info : CodecRegistry::Default().List()) {
    auto codec = testing::MakeCodec(info.name);
    ASSERT_NE(codec, nullptr);
    auto tile = testing::EncodeTile(*codec, x, shape);
    auto run = [&](std::vector<float>& out) {
      std::vector<std::byte> mine(tile.size());
      if (!codec->encode(x.data(), shape, mine).ok()) return;
      out.assign(size_t{n_q} * (shape.tokens + shape.dim), 0.0f);
      if (!codec->scores(mine, shape, q.data(), n_q, out.data()).ok()) return;
      (void)codec->accumulate(mine, shape, p.data(), n_q, out.data() + size_t{n_q} * shape.tokens);
    };
    std::vector<float> expected;
    run(expected);
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> threads;
    for (auto& g : got)
      threads.emplace_back([&run, &g] {
        for (int i = 0; i < 3; ++i) run(g);
      });
    for (auto& t : threads) t.join();
    for (const auto& g : got) ASSERT_EQ(g, expected) << info.name;
  }
}

}  // namespace
}  // namespace argus
