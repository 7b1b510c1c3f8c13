// RecordTrace (argus/eval.h): a model's own K/V and queries over a text, as a trace the placement
// profiles replay like the synthetic ones.
#include <algorithm>
#include <string>

#include "argus/core.h"
#include "argus/eval.h"
#include "argus/model.h"

namespace argus {

Result<Trace> RecordTrace(const Model& model, std::span<const int32_t> tokens,
                          uint32_t n_prefix_tokens, uint32_t n_steps, uint32_t n_batch,
                          uint32_t n_threads) {
  const uint64_t n_tokens = uint64_t{n_prefix_tokens} + n_steps;
  if (n_prefix_tokens == 0 || n_steps == 0 || n_batch == 0) {
    return Status::InvalidArgument("record trace: prefix tokens, steps and n_batch must be > 0");
  }
  if (tokens.size() < n_tokens) {
    return Status::InvalidArgument("record trace: the text has " + std::to_string(tokens.size()) +
                                   " tokens, fewer than " + std::to_string(n_tokens) +
                                   " (prefix and steps)");
  }
  Trace trace;
  TraceOptions& o = trace.options;
  o.kind = TraceKind::kRecorded;
  o.geometry = model.config().geometry();
  o.n_prefix_tokens = n_prefix_tokens;
  o.n_steps = n_steps;
  o.seed = 0;
  o.n_sinks = 0;
  const CacheGeometry& g = o.geometry;
  const size_t kv_row = size_t{g.n_kv_heads} * g.head_dim, q_row = size_t{g.n_q_heads} * g.head_dim;
  trace.k.resize(g.n_layers * n_tokens * kv_row);
  trace.v.resize(trace.k.size());
  trace.q.resize(size_t{n_steps} * g.n_layers * q_row);
  trace.target.assign(n_steps, -1);

  ContextOptions options;
  options.n_ctx = static_cast<uint32_t>(n_tokens);
  options.n_batch = n_batch;
  options.n_threads = n_threads;
  options.qkv_observer = [&](uint32_t layer, uint32_t first, uint32_t n, const float* q,
                             const float* k, const float* v) {
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t t = first + i;
      const size_t at = (size_t{layer} * n_tokens + t) * kv_row;
      std::transform(k + i * kv_row, k + (i + 1) * kv_row, trace.k.begin() + at, FloatToHalf);
      std::transform(v + i * kv_row, v + (i + 1) * kv_row, trace.v.begin() + at, FloatToHalf);
      if (t >= n_prefix_tokens) {
        const size_t step = t - n_prefix_tokens;
        std::copy(q + i * q_row, q + (i + 1) * q_row,
                  trace.q.begin() + (step * g.n_layers + layer) * q_row);
      }
    }
  };
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(model, options));
  for (uint32_t first = 0; first < n_prefix_tokens; first += n_batch) {
    const uint32_t n = std::min(n_batch, n_prefix_tokens - first);
    ARGUS_RETURN_IF_ERROR(context->Eval(tokens.subspan(first, n)).status());
  }
  for (uint32_t s = 0; s < n_steps; ++s) {
    ARGUS_RETURN_IF_ERROR(context->Eval(tokens.subspan(n_prefix_tokens + s, 1)).status());
  }
  return trace;
}

}  // namespace argus
