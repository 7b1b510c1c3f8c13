// <immintrin.h> for the *_avx512.cc kernel files, with the helpers they share: FirstLanes and
// HintStream (prefetch hints). GCC 12's AVX-512 intrinsics start some results from undefined
// values, which its -Wuninitialized and -Wmaybe-uninitialized report at every use (GCC bug 105593,
// fixed in GCC 13), so the including file does without those two warnings.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace argus {

// The mask of the first min(n, 16) lanes.
inline __mmask16 FirstLanes(size_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}

// Hints the lines of [p, p + n_bytes) into the cache a few at a time, spread over n_steps calls
// of Step: a burst of hints beyond the core's line fill buffers stalls the loads behind it.
class HintStream {
 public:
  HintStream() = default;  // hints nothing
  // Rows [first, first + count) of a tile of n_rows rows `row_bytes` apart, none past its end.
  static HintStream Rows(const void* tile, size_t row_bytes, uint32_t first, uint32_t count,
                         uint32_t n_rows, uint32_t n_steps) {
    const uint32_t begin = first < n_rows ? first : n_rows;
    const uint32_t end = n_rows - begin < count ? n_rows : begin + count;
    return HintStream(static_cast<const char*>(tile) + begin * row_bytes,
                      size_t{end - begin} * row_bytes, n_steps);
  }
  HintStream(const void* p, size_t n_bytes, uint32_t n_steps)
      : next_(static_cast<const char*>(p)),
        end_(next_ + n_bytes),
        per_step_((n_bytes + 63) / 64 / n_steps + 1) {}
  void Step() {
    for (uint32_t i = 0; i < per_step_ && next_ < end_; ++i, next_ += 64)
      _mm_prefetch(next_, _MM_HINT_T0);
  }

 private:
  const char* next_ = nullptr;
  const char* end_ = nullptr;
  uint32_t per_step_ = 0;
};

}  // namespace argus
