#include "eval/rate_distortion.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/splitmix.h"

namespace argus {

ReverseWaterFilling::ReverseWaterFilling(std::vector<double> column_variances, size_t n_values,
                                         std::vector<double> weights)
    : column_variances_(std::move(column_variances)),
      n_values_(n_values),
      weights_(std::move(weights)) {
  for (size_t i = 0; i < n_values_; ++i) {
    const double wide = Weight(i) * Variance(i);
    if (wide > 0) sorted_log2_.push_back(std::log2(wide));
  }
  std::sort(sorted_log2_.begin(), sorted_log2_.end(), std::greater<>());
}

std::vector<double> ReverseWaterFilling::Distortions(double bits_per_value) const {
  // With the k widest values above the water, sum over them of log2(w variance / theta) / 2 is
  // the whole rate: log2(theta) = (sum of their log2(w variance) - 2 n R) / k. The right k is the
  // first whose theta stays at or above the next value's w variance.
  const double total_bits = bits_per_value * static_cast<double>(n_values_);
  double log2_theta = HUGE_VAL, log_sum = 0;
  for (size_t k = 1; k <= sorted_log2_.size() && bits_per_value > 0; ++k) {
    log_sum += sorted_log2_[k - 1];
    log2_theta = (log_sum - 2.0 * total_bits) / static_cast<double>(k);
    if (k == sorted_log2_.size() || log2_theta >= sorted_log2_[k]) break;
  }
  const double theta = std::exp2(log2_theta);
  std::vector<double> d(n_values_);
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = Weight(i) > 0 ? std::min(theta / Weight(i), Variance(i)) : Variance(i);
  }
  return d;
}

ColumnStatistics::ColumnStatistics(std::span<const float> values, size_t cols)
    : mean(cols, 0.0), variance(cols, 0.0) {
  const size_t rows = values.size() / cols;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) mean[c] += values[r * cols + c];
  }
  for (double& m : mean) m /= static_cast<double>(rows);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const double x = values[r * cols + c] - mean[c];
      variance[c] += x * x;
    }
  }
  for (double& v : variance) v /= static_cast<double>(rows);
}

void ApplyRateDistortionChannel(std::span<float> values, const ColumnStatistics& columns,
                                std::span<const double> distortion, uint64_t seed) {
  const size_t cols = columns.mean.size();
  SplitMix64 rng(seed);
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t c = i % cols;
    const double s2 = columns.variance[c];
    const double keep = s2 > 0 ? 1.0 - distortion[i] / s2 : 0.0;
    const double x = values[i] - columns.mean[c];
    values[i] = static_cast<float>(columns.mean[c] + keep * x +
                                   std::sqrt(distortion[i] * keep) * rng.Normal());
  }
}

}  // namespace argus
