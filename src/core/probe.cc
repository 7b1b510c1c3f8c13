// Machine probes: memory read bandwidth and peak FMA rate.
#include "core/probe.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

#include "argus/core.h"
#include "core/buffer.h"
#include "core/measure.h"
#include "core/probe_kernels.h"

namespace argus {

size_t LastLevelCacheBytes() {
  // sysfs reports e.g. "300M" or "32768K" for the highest cache index.
  for (int index = 4; index >= 0; --index) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(f >> text) || text.empty()) continue;
    size_t value = std::strtoull(text.c_str(), nullptr, 10);
    char unit = text.back();
    if (unit == 'K') value <<= 10;
    if (unit == 'M') value <<= 20;
    if (value > 0) return value;
  }
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) : size_t{32} << 20;
}

namespace {

// One streaming read (sums the words so the reads cannot be elided).
uint64_t StreamRead(const std::byte* bytes, size_t n_bytes) {
  if (GetCpuFeatures().avx2_kernels()) return StreamReadAvx2(bytes, n_bytes);
  uint64_t sum = 0;
  for (size_t i = 0; i + 8 <= n_bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    sum += w;
  }
  return sum;
}

// Best of `reps` timed runs of fn(): the least disturbed one is the machine's capability.
template <typename Fn>
double BestSeconds(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    fn();
    best = std::min(best, Seconds(start));
  }
  return best;
}

// A fixed burst of independent scalar FMAs; returns the number done.
uint64_t FmaBurstScalar() {
  constexpr int kChains = 8;
  constexpr uint64_t kIters = 20'000'000;
  volatile float seed = 1.0f;
  float acc[kChains];
  for (float& a : acc) a = seed;
  const float m = 0.999999f, c = 1e-7f;
  for (uint64_t i = 0; i < kIters; ++i) {
    for (float& a : acc) a = std::fma(a, m, c);
  }
  volatile float sink = acc[0];
  (void)sink;
  return kChains * kIters;
}

// The burst of the widest kernels this machine runs, so rooflines stay honest.
uint64_t FmaBurst() {
  if (GetCpuFeatures().avx512_kernels()) return FmaBurstAvx512();
  if (GetCpuFeatures().avx2_kernels()) return FmaBurstAvx2();
  return FmaBurstScalar();
}

}  // namespace

Result<MachineProbe> ProbeMachine(ThreadPool& pool) {
  MachineProbe probe;
  probe.n_threads = pool.n_threads();
  probe.buffer_bytes = std::max<size_t>(4 * LastLevelCacheBytes(), size_t{256} << 20);
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer buffer, AlignedBuffer::Allocate(probe.buffer_bytes));
  std::memset(buffer.data(), 1, buffer.size());  // fault every page in before timing
  volatile uint64_t sink = 0;
  double one = BestSeconds(3, [&] { sink = sink + StreamRead(buffer.data(), buffer.size()); });
  probe.read_gbps_one_thread = static_cast<double>(buffer.size()) / one / 1e9;
  const size_t chunk = 1 << 20;
  double all = BestSeconds(3, [&] {
    pool.ParallelFor(buffer.size(), chunk, [&](size_t, size_t begin, size_t end) {
      sink = sink + StreamRead(buffer.data() + begin, end - begin);
    });
  });
  probe.read_gbps_all_threads = static_cast<double>(buffer.size()) / all / 1e9;
  std::atomic<uint64_t> n_fma{0};
  double fma_one = BestSeconds(3, [&] { n_fma = FmaBurst(); });
  probe.fma_gflops_one_thread = 2.0 * static_cast<double>(n_fma) / fma_one / 1e9;
  // Measured, not the one-thread rate times the threads: hardware threads that share a core, or
  // a host that caps its virtual CPUs, do not add up.
  double fma_all = BestSeconds(3, [&] {
    n_fma = 0;
    pool.ParallelFor(probe.n_threads, 1, [&](size_t, size_t, size_t) { n_fma += FmaBurst(); });
  });
  probe.fma_gflops_all_threads = 2.0 * static_cast<double>(n_fma) / fma_all / 1e9;
  return probe;
}

}  // namespace argus
