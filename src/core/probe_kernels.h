// Vector halves of the machine probes (probe_avx2.cc, probe_avx512.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace argus {

uint64_t StreamReadAvx2(const std::byte* bytes, size_t n_bytes);
// Runs a fixed burst of independent 8-lane FMAs; returns the number of lane-FMAs done.
uint64_t FmaBurstAvx2();
// The same with 16-lane FMAs: the peak of the AVX-512 kernels.
uint64_t FmaBurstAvx512();

}  // namespace argus
