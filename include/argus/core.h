// The foundation a host sees: fp16/bf16 conversions (for AppendF16 and f16 inputs), the
// deterministic thread pool the attention and placement engines run on, and CPU feature
// detection. The library's other foundations (checked arithmetic, buffers, checksums, .npy and
// file I/O, field encoding, probes, build information) are internal, under src/core/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "argus/status.h"

namespace argus {

// ---- Scalar number formats -------------------------------------------------------------------
// All conversions round to nearest even. These scalar versions are the specification; vector
// kernels must agree with them bit for bit.

uint16_t FloatToHalf(float x);  // IEEE binary16; overflow gives Inf, NaN stays NaN
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float x);  // NaN stays NaN (quiet)
float Bf16ToFloat(uint16_t b);

// ---- Thread pool -----------------------------------------------------------------------------

// The most threads a pool may be asked for: beyond it, creating them fails or takes seconds,
// and no machine this runs on has that many hardware threads.
inline constexpr unsigned kMaxThreads = 1024;
// InvalidArgument naming `what` when n_threads exceeds kMaxThreads (0, one per hardware thread,
// is fine).
Status CheckThreadCount(unsigned n_threads, std::string_view what);

// A fixed set of worker threads. ParallelFor splits [0, n_items) into chunks of `chunk` items,
// a split that depends only on n_items and chunk, never on the number of threads, so any
// computation whose chunks write disjoint outputs is bit-identical for every thread count.
// Thread-safe: ParallelFor may be called from several threads; calls are serialised. Idle
// workers spin (yielding) for 50 us after a job before they sleep, so back-to-back calls, one
// per layer, do not pay a sleep and wake each.
class ThreadPool {
 public:
  // n_threads == 0 means one per hardware thread. The calling thread takes part in the work,
  // so n_threads == 1 runs everything inline. REQUIRES: n_threads <= kMaxThreads.
  explicit ThreadPool(unsigned n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned n_threads() const;
  // Calls fn(chunk_index, begin, end) once per chunk; returns when all chunks are done. A call
  // of one chunk runs on the calling thread.
  void ParallelFor(size_t n_items, size_t chunk,
                   const std::function<void(size_t chunk_index, size_t begin, size_t end)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- CPU features ----------------------------------------------------------------------------

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx_vnni = false;
  // AVX2 + FMA + F16C, and the OS saves the YMM state: what ARGUS's vector kernels need.
  bool avx2_kernels() const { return avx2 && fma && f16c; }
  // Those and AVX-512 F/BW/VL/VNNI with the ZMM state saved: what the *_avx512.cc kernels need
  // (the integer kernels multiply-add with VNNI; every AVX-512 CPU since Cascade Lake has it).
  bool avx512_kernels() const {
    return avx2_kernels() && avx512f && avx512bw && avx512vl && avx512vnni;
  }
  std::string ToString() const;  // "avx2 fma f16c bmi2 ..."
};
// Detected once. ARGUS_FORCE_SCALAR=1 in the environment reports no vector features, so the
// scalar kernels can be exercised on any machine; ARGUS_FORCE_AVX2=1 reports no AVX-512, so the
// AVX2 kernels can be measured beside the AVX-512 ones.
const CpuFeatures& GetCpuFeatures();

}  // namespace argus
