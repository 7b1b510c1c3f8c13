// Microbenchmarks of the weight-matrix products (src/model/matmul.h) on Qwen2.5-0.5B shapes:
// [896, 896] (attention q/o), [4864, 896] (ffn gate/up), [896, 4864] (ffn down), per weight type,
// 1 and 2 threads, batch 1 (decode) and 16 (prefill). Bytes/s counts the weight bytes read.
//
// Each product reads the next of a ring of weight copies spanning twice the last-level cache, so
// the weights stream from memory as they do in a model larger than the cache. The machine's
// streaming read bandwidth is probed once per run (ProbeMachine, the figure of `argus info`) and
// reported beside each result: of_read_bw = weight bytes/s / probed read bytes/s at the same
// thread count (1 thread, or all threads for more). A kernel near 1 is bandwidth-bound; one well
// below it at batch 1 is compute-bound.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "argus/codec.h"
#include "argus/core.h"
#include "core/buffer.h"
#include "core/probe.h"
#include "model/matmul.h"

namespace {

using argus::GgmlType;
using argus::model::WeightMatrix;

struct Shape {
  uint32_t n_rows, n_cols;
};
constexpr Shape kShapes[] = {{896, 896}, {4864, 896}, {896, 4864}};

struct TypeCase {
  const char* name;
  GgmlType type;
  size_t block_values, block_bytes;
};
constexpr TypeCase kTypeCases[] = {{"f32", GgmlType::kF32, 1, 4},
                                   {"f16", GgmlType::kF16, 1, 2},
                                   {"bf16", GgmlType::kBF16, 1, 2},
                                   {"q8_0", GgmlType::kQ8_0, 32, 34},
                                   {"q4_0", GgmlType::kQ4_0, 32, 18}};

const argus::MachineProbe& Probe() {
  static const argus::MachineProbe probe = [] {
    argus::ThreadPool pool;
    auto result = argus::ProbeMachine(pool);
    return result.ok() ? *result : argus::MachineProbe{};
  }();
  return probe;
}

// One random matrix encoded in the type: values ~N(0, 0.02) for float types; random codes with
// scales of 0.02/127 for quantised ones (the speed does not depend on the values).
std::vector<std::byte> RandomMatrix(const TypeCase& t, Shape shape) {
  const size_t n = size_t{shape.n_rows} * shape.n_cols;
  std::vector<std::byte> bytes(n / t.block_values * t.block_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (size_t i = 0; i < n / t.block_values; ++i) {
    std::byte* out = &bytes[i * t.block_bytes];
    if (t.type == GgmlType::kF32) {
      const float v = normal(rng);
      std::memcpy(out, &v, 4);
    } else if (t.type == GgmlType::kF16 || t.type == GgmlType::kBF16) {
      const float v = normal(rng);
      const uint16_t h = t.type == GgmlType::kF16 ? argus::FloatToHalf(v) : argus::FloatToBf16(v);
      std::memcpy(out, &h, 2);
    } else {
      const uint16_t d = argus::FloatToHalf(0.02f / 127);
      std::memcpy(out, &d, 2);
      for (size_t j = 2; j < t.block_bytes; ++j) out[j] = static_cast<std::byte>(rng() & 0xff);
    }
  }
  return bytes;
}

void BM_MatMul(benchmark::State& state, TypeCase t, Shape shape, unsigned n_threads,
               uint32_t n_batch) {
  const std::vector<std::byte> encoded = RandomMatrix(t, shape);
  WeightMatrix w;
  w.type = t.type;
  w.n_rows = shape.n_rows;
  w.n_cols = shape.n_cols;
  w.row_bytes = shape.n_cols / t.block_values * t.block_bytes;
  w.data = encoded.data();
  // The layout the model runner reads (q4_0 packed in groups of eight rows; every shape here is
  // whole groups, so the packed matrix is as large as the encoded one).
  auto packed = argus::model::PackForMatMul(w);
  if (!packed.ok()) {
    state.SkipWithError(packed.status().ToString().c_str());
    return;
  }
  w = packed->matrix;
  const std::span<const std::byte> matrix(w.data, encoded.size());
  const size_t matrix_bytes = matrix.size();
  const size_t n_copies = std::max<size_t>(1, 2 * argus::LastLevelCacheBytes() / matrix_bytes + 1);
  auto ring = argus::AlignedBuffer::Allocate(n_copies * matrix_bytes);
  if (!ring.ok()) {
    state.SkipWithError(ring.status().ToString().c_str());
    return;
  }
  for (size_t i = 0; i < n_copies; ++i) {
    std::memcpy(ring->data() + i * matrix_bytes, matrix.data(), matrix_bytes);
  }
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t{n_batch} * shape.n_cols), y(size_t{n_batch} * shape.n_rows);
  for (float& v : x) v = normal(rng);
  argus::ThreadPool pool(n_threads);
  argus::model::MatMulScratch scratch;
  const double read_gbps =
      n_threads == 1 ? Probe().read_gbps_one_thread : Probe().read_gbps_all_threads;

  size_t next = 0;
  for (auto _ : state) {
    w.data = ring->data() + next * matrix_bytes;
    next = next + 1 == n_copies ? 0 : next + 1;
    argus::model::MatMul(w, x.data(), n_batch, y.data(), pool, scratch);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(state.iterations()) * static_cast<double>(matrix_bytes);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["read_bw_GBps"] = read_gbps;
  state.counters["of_read_bw"] =
      benchmark::Counter(bytes / (read_gbps * 1e9), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(argus::KernelPathName(argus::BestKernelPath())));
}

int RegisterAll() {
  for (const TypeCase& t : kTypeCases) {
    for (Shape shape : kShapes) {
      for (unsigned n_threads : {1u, 2u}) {
        for (uint32_t n_batch : {1u, 16u}) {
          const std::string name =
              std::string("matmul/") + t.name + "/" + std::to_string(shape.n_rows) + "x" +
              std::to_string(shape.n_cols) + "/threads:" + std::to_string(n_threads) +
              "/batch:" + std::to_string(n_batch);
          benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, t, shape, n_threads, n_batch)
              ->UseRealTime();
        }
      }
    }
  }
  return 0;
}
const int registered = RegisterAll();

}  // namespace
