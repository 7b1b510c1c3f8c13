// Perplexity as llama.cpp's perplexity tool computes it: consecutive windows of n_ctx tokens,
// BOS first, the second half of each window scored.
#include <cmath>

#include "argus/model.h"
#include "core/softmax_state.h"

namespace argus {

namespace {

// -log softmax(logits)[target], in double.
double NegativeLogLikelihood(std::span<const float> logits, int32_t target) {
  const SoftmaxState<double> row = RowSoftmax(logits);
  return std::log(row.d) + row.m - logits[static_cast<size_t>(target)];
}

}  // namespace

Result<PerplexityResult> Perplexity(const Model& model, const ContextOptions& options,
                                    std::span<const int32_t> tokens,
                                    const std::function<void(uint32_t, uint32_t)>& progress) {
  const uint32_t n_ctx = options.n_ctx ? options.n_ctx : model.config().n_ctx_train;
  if (n_ctx < 4 || tokens.size() < n_ctx) {
    return Status::InvalidArgument(
        "perplexity needs at least one window of n_ctx = " + std::to_string(n_ctx) +
        " tokens (n_ctx >= 4); the text has " + std::to_string(tokens.size()));
  }
  ContextOptions o = options;
  o.n_ctx = n_ctx;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(model, o));
  const TokenizerVocab& vocab = model.tokenizer().vocab();
  const uint32_t n_vocab = model.config().n_vocab, first_scored = n_ctx / 2;

  PerplexityResult result;
  result.n_windows = static_cast<uint32_t>(tokens.size() / n_ctx);
  double nll = 0;
  std::vector<int32_t> window(n_ctx);
  for (uint32_t w = 0; w < result.n_windows; ++w) {
    std::copy_n(tokens.begin() + size_t{w} * n_ctx, n_ctx, window.begin());
    if (vocab.add_bos && vocab.bos >= 0) window[0] = vocab.bos;
    ARGUS_RETURN_IF_ERROR(context->Truncate(0));
    for (uint32_t first = 0; first < n_ctx; first += o.n_batch) {
      const uint32_t n = std::min(o.n_batch, n_ctx - first);
      ARGUS_ASSIGN_OR_RETURN(std::span<const float> logits,
                             context->Eval({window.data() + first, n}, true));
      for (uint32_t t = 0; t < n; ++t) {
        const uint32_t j = first + t;  // logits at j predict token j + 1
        if (j < first_scored || j + 1 >= n_ctx) continue;
        nll += NegativeLogLikelihood(logits.subspan(size_t{t} * n_vocab, n_vocab), window[j + 1]);
        ++result.n_scored;
      }
    }
    result.cache = context->cache().stats();
    if (progress) progress(w + 1, result.n_windows);
  }
  result.mean_nll = nll / static_cast<double>(result.n_scored);
  result.perplexity = std::exp(result.mean_nll);
  result.times = context->times();
  result.placement = context->placement_stats();
  return result;
}

}  // namespace argus
