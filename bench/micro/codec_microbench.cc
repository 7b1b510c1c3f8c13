// Microbenchmarks of the codec kernels on one L2-resident tile (256 tokens). System-level
// figures (tiles larger than the last-level cache, ratios to f16 and to the machine's probes)
// come from `argus-bench codecs`.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "argus/codec.h"

namespace {

constexpr argus::TileShape kShape{256, 128};
constexpr uint32_t kGroup = 4;

struct Fixture {
  std::unique_ptr<argus::Codec> codec;
  std::vector<std::byte> tile;
  std::vector<float> q, p, out;
  explicit Fixture(const std::string& spec) {
    codec = std::move(argus::CodecRegistry::Default().Create(spec)).value();
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    std::vector<float> x(kShape.n_values());
    for (float& v : x) v = normal(rng);
    tile.resize(*codec->encoded_size(kShape));
    (void)codec->encode(x.data(), kShape, tile);
    q.resize(kGroup * kShape.dim);
    for (float& v : q) v = normal(rng);
    p.assign(kGroup * kShape.tokens, 1.0f / kShape.tokens);
    out.resize(kGroup * std::max(kShape.tokens, kShape.dim));
  }
};

void BM_Scores(benchmark::State& state, const std::string& spec) {
  Fixture f(spec);
  for (auto _ : state) {
    (void)f.codec->scores(f.tile, kShape, f.q.data(), kGroup, f.out.data());
    benchmark::DoNotOptimize(f.out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.tile.size()));
}

void BM_Accumulate(benchmark::State& state, const std::string& spec) {
  Fixture f(spec);
  for (auto _ : state) {
    (void)f.codec->accumulate(f.tile, kShape, f.p.data(), kGroup, f.out.data());
    benchmark::DoNotOptimize(f.out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.tile.size()));
}

int RegisterAll() {
  for (const auto& info : argus::CodecRegistry::Default().List()) {
    benchmark::RegisterBenchmark(("scores/" + info.name).c_str(), BM_Scores, info.name);
    if (info.role != argus::CodecRole::kKeys) {
      benchmark::RegisterBenchmark(("accumulate/" + info.name).c_str(), BM_Accumulate, info.name);
    }
  }
  return 0;
}
const int registered = RegisterAll();

}  // namespace
