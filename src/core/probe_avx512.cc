#include <immintrin.h>

#include "core/probe_kernels.h"

namespace argus {

uint64_t FmaBurstAvx512() {
  // 10 independent chains cover the FMA latency (4 cycles) on two 512-bit ports.
  constexpr int kIters = 10'000'000;
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  __m512 a[10];
  for (__m512& x : a) x = _mm512_set1_ps(1.0f);
  for (int i = 0; i < kIters; ++i) {
#pragma GCC unroll 10
    for (__m512& x : a) x = _mm512_fmadd_ps(x, m, c);
  }
  __m512 s = a[0];
  for (int j = 1; j < 10; ++j) s = _mm512_add_ps(s, a[j]);
  // The result feeds a volatile so the chains cannot be removed.
  volatile float sink = _mm512_cvtss_f32(s);
  (void)sink;
  return uint64_t{kIters} * 10 * 16;
}

}  // namespace argus
