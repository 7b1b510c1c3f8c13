// Decode attention of one Llama-3-8B layer (32 query heads, 8 KV heads, head_dim 128) through
// the C++ API, one thread, at the depth of the benchmark's argument (16 tokens: the call itself;
// 4K and 32K: reading the pages): the denominator of the Python package's per-call overhead
// (python/benchmarks/attend_overhead.py runs both).
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "argus/attention.h"
#include "argus/cache.h"

namespace {

constexpr argus::CacheGeometry kGeometry{1, 32, 8, 128};

void BM_DecodeAttention(benchmark::State& state, const std::string& codec) {
  const auto n_tokens = static_cast<uint32_t>(state.range(0));
  argus::CacheOptions options;
  options.geometry = kGeometry;
  options.k_codec = options.v_codec = codec;
  options.ram_budget_bytes = size_t{1} << 34;
  auto cache = std::move(argus::KvCache::Create(options)).value();
  const argus::SeqId seq = cache->CreateSequence().value();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const size_t row = size_t{kGeometry.n_kv_heads} * kGeometry.head_dim;
  std::vector<float> k(size_t{4096} * row), v(k.size());
  for (uint32_t done = 0; done < n_tokens; done += 4096) {
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    const size_t n = std::min<size_t>(4096, n_tokens - done) * row;
    if (!cache->Append(seq, 0, {k.data(), n}, {v.data(), n}).ok()) state.SkipWithError("append");
  }
  std::vector<float> q(size_t{kGeometry.n_q_heads} * kGeometry.head_dim), out(q.size());
  for (float& x : q) x = normal(rng);
  argus::ThreadPool pool(1);
  argus::AttentionEngine engine(pool);
  for (auto _ : state) {
    auto stats = engine.Decode(*cache, seq, 0, q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    if (!stats.ok()) state.SkipWithError("decode");
  }
}

BENCHMARK_CAPTURE(BM_DecodeAttention, f16, std::string("f16"))
    ->Arg(16)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeAttention, q4_0, std::string("q4_0"))
    ->Arg(16)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
