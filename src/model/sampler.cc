// Token sampling: greedy, or temperature with top-k and top-p cuts, from a seeded generator whose
// output is the same on every machine (splitmix64, not a std:: distribution).
#include <algorithm>
#include <cmath>

#include "argus/model.h"
#include "core/splitmix.h"

namespace argus {

namespace {

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

Sampler::Sampler(const SamplerOptions& options) : options_(options), state_(options.seed) {}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (options_.temperature <= 0.0f || logits.size() == 1) return Argmax(logits);
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_.emplace_back(logits[i] / options_.temperature, static_cast<int32_t>(i));
  }
  // Highest logit first; the lower id first on ties, so the order is total.
  const auto higher = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = candidates_.size();
  if (options_.top_k > 0 && options_.top_k < n) n = options_.top_k;
  std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), higher);
  candidates_.resize(n);

  std::vector<double> p(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += p[i] = std::exp(double{candidates_[i].first} - candidates_[0].first);
  if (options_.top_p < 1.0f) {
    double kept = 0;
    size_t n_kept = 0;
    while (n_kept < n && kept < options_.top_p * sum) kept += p[n_kept++];
    n = std::max<size_t>(n_kept, 1);
    sum = kept > 0 ? kept : p[0];
  }
  const double u = static_cast<double>(SplitMix64Next(state_) >> 11) * 0x1.0p-53 * sum;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += p[i];
    if (u < cumulative) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

}  // namespace argus
