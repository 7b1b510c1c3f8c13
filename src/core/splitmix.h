// Internal: splitmix64 (Steele, Lea and Flood, 2014), the library's one pseudo-random generator.
// Its outputs are the same on every machine and standard library (std:: distributions are not),
// so a seed reproduces synthetic KV, traces, random weights and sampled tokens everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace argus {

// The stream's increment: 2^64 divided by the golden ratio, odd.
inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;

// The output function: a bijection that mixes every bit of z into every bit of the result.
constexpr uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Output `n` of the stream seeded with `seed`, without stepping through the ones before it
// (SplitMix64Next returns n = 1, 2, ...).
constexpr uint64_t SplitMix64At(uint64_t seed, uint64_t n) {
  return SplitMix64Mix(seed + n * kSplitMixGamma);
}

// Advances `state` one step and returns that step's output.
constexpr uint64_t SplitMix64Next(uint64_t& state) {
  return SplitMix64Mix(state += kSplitMixGamma);
}

// A splitmix64 stream with the draws its users take from it. Not thread-safe.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64Next(state_); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // A standard normal value (Box-Muller, cosine branch: one normal per two uniforms).
  double Normal() {
    const double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace argus
