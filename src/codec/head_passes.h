// How the kernel files split a call's query heads into compile-time head counts. Internal
// linkage: each kernel file's copy is compiled with that file's instruction set and never merged
// with another's.
#pragma once

#include <cstdint>
#include <utility>

namespace argus::codec_internal {
namespace {

template <int N>
struct Heads {
  static constexpr int kCount = N;
};

// run(Heads<NH>{}, first) for the n_q heads in passes of kMax, then the rest in one pass.
template <int kMax, typename Run>
void ByHeadPasses(uint32_t n_q, Run run) {
  uint32_t i = 0;
  for (; i + kMax <= n_q; i += kMax) run(Heads<kMax>{}, i);
  const uint32_t rest = n_q - i;
  [&]<int... N>(std::integer_sequence<int, N...>) {
    ((rest == N + 1 ? run(Heads<N + 1>{}, i) : void()), ...);
  }
  (std::make_integer_sequence<int, kMax - 1>{});
}

}  // namespace
}  // namespace argus::codec_internal
