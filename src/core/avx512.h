// <immintrin.h> for the *_avx512.cc kernel files, with the helpers they share: FirstLanes,
// ReduceLanes16 and HintStream (prefetch hints). GCC 12's AVX-512 intrinsics start some results
// from undefined values, which its -Wuninitialized and -Wmaybe-uninitialized report at every use
// (GCC bug 105593, fixed in GCC 13), so the including file does without those two warnings.
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

template <bool kMax>
inline __m512 CombineLanes(__m512 a, __m512 b) {
  return kMax ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

// Lane i: the sum (kMax: the maximum) of the 16 lanes of v[i], for i < n <= 16; 0 beyond. The
// vectors are reduced together, two at a time by permutes that pair their lanes (15 steps of 3
// instructions for 16 vectors, against 4 of 2 for each alone, in a chain). Every vector's lanes
// combine in the same order wherever it sits, so a sum does not depend on the other vectors. The
// shape is fixed (missing vectors are zeros, which pair only with zeros), so it unrolls whatever n:
// with a loop per level over a variable count, the reduction took an eighth of int4:channel's
// scores.
template <bool kMax>
[[gnu::always_inline]] inline __m512 ReduceLanes16(const __m512* v, uint32_t n) {
  __m512 a[16];
  for (uint32_t i = 0; i < 16; ++i) a[i] = i < n ? v[i] : _mm512_setzero_ps();
  // Each level halves the vectors, a[i] taking half the partial results of a[2i] and a[2i+1].
  auto level = [&](int m, auto pair) {
    for (int i = 0; i < m; ++i) a[i] = pair(a[2 * i], a[2 * i + 1]);
  };
  // 128-bit lanes l and l + 2 of x, then of y.
  level(8, [](__m512 x, __m512 y) {
    return CombineLanes<kMax>(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
  });
  // 128-bit lanes 0 and 1, 2 and 3 of x, then of y: lane l now holds vector 4i + l.
  level(4, [](__m512 x, __m512 y) {
    return CombineLanes<kMax>(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xdd));
  });
  // Floats f and f + 2 of each lane of x, then of y.
  level(2, [](__m512 x, __m512 y) {
    return CombineLanes<kMax>(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee));
  });
  // Floats 0 and 1, 2 and 3: float f of lane l is vector 4f + l.
  level(1, [](__m512 x, __m512 y) {
    return CombineLanes<kMax>(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xdd));
  });
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), a[0]);
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
