// ReferenceAttention: the oracle the engine is tested against. Dense, double precision, one
// query row at a time, written to be obviously correct rather than fast.
#include <cmath>
#include <limits>
#include <vector>

#include "argus/attention.h"
#include "core/softmax_state.h"

namespace argus {

std::vector<double> ReferenceAttention(const CacheGeometry& geometry, const float* q,
                                       uint32_t n_queries, uint32_t first_position, const float* k,
                                       const float* v, uint32_t n_tokens,
                                       const AttentionOptions& options) {
  const size_t d = geometry.head_dim, n_q_heads = geometry.n_q_heads;
  const size_t n_kv_heads = geometry.n_kv_heads;
  // A geometry whose heads do not group has no meaning here: nothing is computed.
  if (d == 0 || n_kv_heads == 0 || n_q_heads % n_kv_heads != 0) return {};
  const size_t gqa = n_q_heads / n_kv_heads;
  const double scale =
      options.scale != 0 ? double{options.scale} : 1.0 / std::sqrt(static_cast<double>(d));

  std::vector<double> out(size_t{n_queries} * n_q_heads * d, 0.0);
  std::vector<double> score(n_tokens);
  for (uint32_t i = 0; i < n_queries; ++i) {
    const uint32_t position = first_position + i;
    for (size_t h = 0; h < n_q_heads; ++h) {
      const float* q_row = q + (size_t{i} * n_q_heads + h) * d;
      const size_t kv_head = h / gqa;
      for (uint32_t t = 0; t < n_tokens; ++t) {
        score[t] = -std::numeric_limits<double>::infinity();  // masked
        if (!Attends(position, t, options)) continue;
        const float* k_row = k + (size_t{t} * n_kv_heads + kv_head) * d;
        double dot = 0;
        for (size_t c = 0; c < d; ++c) dot += double{q_row[c]} * double{k_row[c]};
        score[t] = dot * scale;
      }
      // Softmax relative to the row maximum, so no exponent overflows.
      const SoftmaxState<double> row = RowSoftmax<double>(score);
      if (row.empty()) continue;  // no key: zero row

      double* o = out.data() + (size_t{i} * n_q_heads + h) * d;
      for (uint32_t t = 0; t < n_tokens; ++t) {
        if (!Attends(position, t, options)) continue;
        const double weight = row.Weight(score[t]);
        const float* v_row = v + (size_t{t} * n_kv_heads + kv_head) * d;
        for (size_t c = 0; c < d; ++c) o[c] += weight * double{v_row[c]};
      }
      for (size_t c = 0; c < d; ++c) o[c] /= row.d;
    }
  }
  return out;
}

}  // namespace argus
