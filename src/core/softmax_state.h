// Internal: the softmax state of one attention row, the recurrence that the attention engine, the
// reference attention, the codec quality measure and perplexity share (FlashInfer's state_t).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

namespace argus {

// The maximum m of the row's scores seen so far and the denominator d = sum of exp(s - m).
// The row's unnormalised output o = sum of exp(s - m) v stays with the caller (the engine's
// codec kernels accumulate o for many rows at once): each change of m returns the factor that o
// must be scaled by to stay consistent with d.
template <typename T>
struct SoftmaxState {
  T m = -std::numeric_limits<T>::infinity();
  T d = 0;

  // No score seen, or only masked (-inf) ones: the row's output is zero.
  bool empty() const { return m == -std::numeric_limits<T>::infinity(); }
  // exp(score - m): a score's weight in o and d.
  T Weight(T score) const { return std::exp(score - m); }
  // Raises m to m_new and rescales d; returns exp(m - m_new), 0 for an empty state.
  // REQUIRES: m_new >= m, finite.
  T Raise(T m_new) {
    const T factor = std::exp(m - m_new);
    d *= factor;
    m = m_new;
    return factor;
  }
  // The scale factors of the two outputs that Merge combines: o = o * self + other.o * other.
  struct MergeFactors {
    T self, other;
  };
  // Folds in the state of the same row over other scores. REQUIRES: !other.empty().
  MergeFactors Merge(const SoftmaxState& other) {
    const T m_new = std::max(m, other.m);
    const MergeFactors f{std::exp(m - m_new), std::exp(other.m - m_new)};
    d = d * f.self + other.d * f.other;
    m = m_new;
    return f;
  }
  // The factor that normalises o into the row's output: 1 / d, or 0 for an empty row.
  T Normalizer() const { return d > 0 ? T{1} / d : T{0}; }
  // This state's share of the mass of `total`, the same row over a superset of the scores (in
  // double whatever T). REQUIRES: total.d > 0.
  template <typename U>
  double ShareOf(const SoftmaxState<U>& total) const {
    return double{d} * std::exp(double{m} - double{total.m}) / double{total.d};
  }
};

// The state of a whole row of scores, in double whatever their type: the maximum, then the sum
// (two passes, so no rescaling). Masked (-inf) scores add nothing.
template <typename Score>
SoftmaxState<double> RowSoftmax(std::span<const Score> scores) {
  SoftmaxState<double> state;
  for (const Score s : scores) state.m = std::max(state.m, double{s});
  if (state.empty()) return state;
  for (const Score s : scores) state.d += state.Weight(double{s});
  return state;
}

}  // namespace argus
