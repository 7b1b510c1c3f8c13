// Internal: what every measurement uses: a wall clock and the relative L2 error.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <span>

namespace argus {

using Clock = std::chrono::steady_clock;
// Wall seconds since `since`.
inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// ||x - ref|| / ||ref|| in double precision (||x - ref|| when ref is all zero). ref holds float
// or double values, as many as x.
template <typename Ref>
double RelativeL2Error(std::span<const float> x, std::span<const Ref> ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double{x[i]} - double{ref[i]};
    err += d * d;
    norm += double{ref[i]} * double{ref[i]};
  }
  return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
}

}  // namespace argus
