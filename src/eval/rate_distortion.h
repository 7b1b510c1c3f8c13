// Internal: Shannon's rate-distortion bound for Gaussian sources, as the reference a codec's error
// is measured against (Cover & Thomas, Elements of Information Theory, 10.3.3). Each value is a
// Gaussian of its column's mean and variance; spending an average of R bits a value to minimise
// the weighted squared error sum_i w_i D_i, reverse water-filling gives value i the distortion
// min(theta / w_i, variance_i); the test channel that reaches it gives the values an ideal codec at
// that rate would return.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace argus {

class ReverseWaterFilling {
 public:
  // The n_values values of a row-major matrix whose column c has variance column_variances[c]
  // (value i: column i % cols), and one weight (≥ 0) per value (none: all 1).
  ReverseWaterFilling(std::vector<double> column_variances, size_t n_values,
                      std::vector<double> weights = {});
  // Each value's distortion at `bits_per_value` bits a value on average: min(theta / w, variance)
  // with theta such that the rates, max(0, log2(w variance / theta)) / 2, average to it. Values of
  // zero weight or variance get no bits.
  std::vector<double> Distortions(double bits_per_value) const;

 private:
  double Weight(size_t i) const { return weights_.empty() ? 1.0 : weights_[i]; }
  double Variance(size_t i) const { return column_variances_[i % column_variances_.size()]; }

  std::vector<double> column_variances_;
  size_t n_values_;
  std::vector<double> weights_;
  std::vector<double> sorted_log2_;  // log2(w variance) of the values above zero, widest first
};

// A row-major [rows, cols] matrix's column means and variances (population).
struct ColumnStatistics {
  std::vector<double> mean, variance;
  ColumnStatistics(std::span<const float> values, size_t cols);
};

// Replaces each value x of column c by what the Gaussian test channel of distortion D (one per
// value) returns: mu + (1 - D/s2) (x - mu) + w with w ~ N(0, D (1 - D/s2)), mu and s2 the column's
// mean and variance, so that x - x' has variance D and is independent of x' (the backward channel
// of the bound). Deterministic in `seed`.
void ApplyRateDistortionChannel(std::span<float> values, const ColumnStatistics& columns,
                                std::span<const double> distortion, uint64_t seed);

}  // namespace argus
