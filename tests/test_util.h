// Helpers shared by the unit tests: the shared oracle folder, seeds, random tiles.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "argus/codec.h"

namespace argus::testing {

// ../shared beside the checkout, or "" when it is absent (tests then skip, saying so).
inline std::string SharedDir() {
  std::filesystem::path dir(ARGUS_SHARED_DIR);
  return std::filesystem::is_directory(dir / "testdata") ? dir.string() : "";
}

// Skips, saying so, when ../shared is absent; fails instead where ARGUS_REQUIRE_SHARED is set
// (CI, where it is always present: a skip there would pass without testing).
#define ARGUS_SKIP_WITHOUT_SHARED()                                               \
  do {                                                                            \
    if (::argus::testing::SharedDir().empty()) {                                  \
      if (std::getenv("ARGUS_REQUIRE_SHARED") != nullptr)                         \
        FAIL() << "../shared/testdata is absent and ARGUS_REQUIRE_SHARED is set"; \
      GTEST_SKIP() << "../shared/testdata is absent: oracle comparison skipped";  \
    }                                                                             \
  } while (0)

// A fresh directory under the system's temporary directory (ext4 here: O_DIRECT works), removed
// with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "argus-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp: " << std::strerror(errno);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Randomised tests take their seed from ARGUS_TEST_SEED when set, and print it.
inline uint64_t TestSeed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("ARGUS_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 10) : 20261129;
    std::fprintf(stderr, "ARGUS_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline bool ContainsText(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The dot product and Euclidean norm of n values, summed in double.
template <typename T>
double Dot(const T* a, const T* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double{a[i]} * double{b[i]};
  return s;
}
template <typename T>
double Norm(const T* x, size_t n) {
  return std::sqrt(Dot(x, x, n));
}

// Gaussian values with a few larger outliers: the shape of real K/V rows.
inline std::vector<float> RandomValues(size_t n, uint64_t salt, float scale = 1.0f) {
  std::mt19937_64 rng(TestSeed() ^ (salt * 0x9e3779b97f4a7c15ull));
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * ((i % 37 == 5) ? 6.0f : 1.0f);
  return x;
}

// Every kernel path this machine runs, scalar first.
inline std::vector<KernelPath> KernelPaths() {
  std::vector<KernelPath> paths{KernelPath::kScalar};
  for (KernelPath path : {KernelPath::kAvx2, KernelPath::kAvx512})
    if (path <= BestKernelPath()) paths.push_back(path);
  return paths;
}

// The codec a spec names, built for `path`; a test failure (and nullptr) when it cannot be made.
inline std::unique_ptr<Codec> MakeCodec(const std::string& spec,
                                        KernelPath path = BestKernelPath()) {
  auto parsed = CodecSpec::Parse(spec);
  EXPECT_TRUE(parsed.ok()) << spec << ": " << parsed.status().ToString();
  if (!parsed.ok()) return nullptr;
  parsed->path = path;
  auto codec = CodecRegistry::Default().Create(*parsed);
  EXPECT_TRUE(codec.ok()) << spec << ": " << codec.status().ToString();
  return codec.ok() ? std::move(codec).value() : nullptr;
}

// x [tokens, dim] encoded; a test failure when encoding fails.
inline std::vector<std::byte> EncodeTile(const Codec& codec, const std::vector<float>& x,
                                         TileShape shape) {
  std::vector<std::byte> tile(codec.encoded_size(shape).value());
  Status status = codec.encode(x.data(), shape, tile);
  EXPECT_TRUE(status.ok()) << codec.info().name << ": " << status.ToString();
  return tile;
}

inline std::vector<float> DecodeTile(const Codec& codec, std::span<const std::byte> tile,
                                     TileShape shape) {
  std::vector<float> x(shape.n_values());
  Status status = codec.decode(tile, shape, x.data());
  EXPECT_TRUE(status.ok()) << codec.info().name << ": " << status.ToString();
  return x;
}

// The fused kernels over an encoded tile against decode-then-dot in double, within the codec's
// stated bound (fused_rel_error): scores, and accumulate unless the codec holds keys only (then
// accumulate must refuse). For each count n in head_counts the first n of max(head_counts) heads
// run in one call; probabilities are positive (as the integer kernels take) and acc starts
// non-zero. Fails through ASSERT: call inside ASSERT_NO_FATAL_FAILURE.
inline void CheckFusedKernelsAgainstDouble(const Codec& codec, std::span<const std::byte> tile,
                                           TileShape shape, std::span<const uint32_t> head_counts,
                                           uint64_t salt) {
  const double tol = codec.info().fused_rel_error;
  const uint32_t tokens = shape.tokens, dim = shape.dim;
  uint32_t n_heads = 0;
  for (uint32_t n : head_counts) n_heads = std::max(n_heads, n);
  const std::vector<float> k = DecodeTile(codec, tile, shape);
  const std::vector<float> q = RandomValues(size_t{n_heads} * dim, salt);
  const std::vector<float> acc0 = RandomValues(size_t{n_heads} * dim, salt + 1);
  std::vector<float> p(size_t{n_heads} * tokens);
  for (size_t j = 0; j < p.size(); ++j)
    p[j] = std::exp(-0.05f * static_cast<float>(j % 41)) / static_cast<float>(tokens);
  // A head's reference does not depend on how many heads share its call: computed once per head.
  std::vector<double> k_norm(tokens), score_ref(size_t{n_heads} * tokens),
      score_bound(score_ref.size()), acc_ref(size_t{n_heads} * dim), acc_weight(n_heads);
  for (uint32_t t = 0; t < tokens; ++t) k_norm[t] = Norm(k.data() + size_t{t} * dim, dim);
  for (uint32_t h = 0; h < n_heads; ++h) {
    const float* qh = q.data() + size_t{h} * dim;
    const float* ph = p.data() + size_t{h} * tokens;
    const double q_norm = Norm(qh, dim);
    double* acc_h = acc_ref.data() + size_t{h} * dim;
    for (uint32_t d = 0; d < dim; ++d) acc_h[d] = acc0[size_t{h} * dim + d];
    for (uint32_t t = 0; t < tokens; ++t) {
      const float* kt = k.data() + size_t{t} * dim;
      double ref = 0;
      for (uint32_t d = 0; d < dim; ++d) ref += double{qh[d]} * kt[d];
      score_ref[size_t{h} * tokens + t] = ref;
      score_bound[size_t{h} * tokens + t] = tol * q_norm * k_norm[t] + 1e-30;
      acc_weight[h] += ph[t] * k_norm[t];
      for (uint32_t d = 0; d < dim; ++d) acc_h[d] += double{ph[t]} * kt[d];
    }
  }
  for (uint32_t n_q : head_counts) {
    SCOPED_TRACE(std::to_string(n_q) + " heads");
    std::vector<float> s(size_t{n_q} * tokens, -1.0f), acc(acc0.begin(), acc0.begin() + n_q * dim);
    ASSERT_TRUE(codec.scores(tile, shape, q.data(), n_q, s.data()).ok());
    for (size_t i = 0; i < s.size(); ++i) {
      ASSERT_LE(std::fabs(s[i] - score_ref[i]), score_bound[i])
          << "head " << i / tokens << " token " << i % tokens;
    }
    if (codec.info().role == CodecRole::kKeys) {
      ASSERT_EQ(codec.accumulate(tile, shape, p.data(), n_q, acc.data()).code(),
                StatusCode::kUnsupported);
      continue;
    }
    ASSERT_TRUE(codec.accumulate(tile, shape, p.data(), n_q, acc.data()).ok());
    for (size_t i = 0; i < acc.size(); ++i) {
      ASSERT_LE(std::fabs(acc[i] - acc_ref[i]),
                tol * acc_weight[i / dim] + 1e-6 * std::fabs(acc_ref[i]))
          << "head " << i / dim << " channel " << i % dim;
    }
  }
}

}  // namespace argus::testing
