// Helpers shared by the unit tests: the shared oracle folder, seeds, random tiles.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

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
#define ARGUS_SKIP_WITHOUT_SHARED()                                                      \
  do {                                                                                   \
    if (::argus::testing::SharedDir().empty()) {                                         \
      if (std::getenv("ARGUS_REQUIRE_SHARED") != nullptr)                                \
        FAIL() << "../shared/testdata is absent and ARGUS_REQUIRE_SHARED is set";        \
      GTEST_SKIP() << "../shared/testdata is absent: oracle comparison skipped";         \
    }                                                                                    \
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

}  // namespace argus::testing
