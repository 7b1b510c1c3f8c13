// Internal: machine probes, the denominators of every benchmark: what this machine can read
// and compute, measured now.
#pragma once

#include <cstddef>

#include "argus/core.h"
#include "argus/status.h"

namespace argus {

size_t LastLevelCacheBytes();  // from sysfs / sysconf; 32 MiB when unknown

struct MachineProbe {
  double read_gbps_one_thread = 0;  // streaming read of a buffer 4x the last-level cache
  double read_gbps_all_threads = 0;
  double fma_gflops_one_thread = 0;   // peak fp32 FMA rate (2 flops per lane), widest path
  double fma_gflops_all_threads = 0;  // the same, every thread of the pool at once
  size_t buffer_bytes = 0;
  unsigned n_threads = 0;
};
// Takes about a second. Returns ResourceExhausted when the probe buffer cannot be allocated.
Result<MachineProbe> ProbeMachine(ThreadPool& pool);

}  // namespace argus
