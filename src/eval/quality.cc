// Quality of a codec pair: attention through the fused kernels against double precision.
#include <algorithm>
#include <cmath>
#include <string>

#include "argus/eval.h"
#include "core/softmax_state.h"

namespace argus {
namespace {

// Encodes every tile of x [tokens, dim]; accumulates ||x - x'||^2 and ||x||^2.
Result<std::vector<std::vector<std::byte>>> EncodeTiles(const Codec& codec,
                                                        const std::vector<float>& x,
                                                        uint32_t tokens, uint32_t dim,
                                                        uint32_t tile_tokens, double& err2,
                                                        double& ref2) {
  std::vector<std::vector<std::byte>> tiles;
  std::vector<float> back;
  for (uint32_t t0 = 0; t0 < tokens; t0 += tile_tokens) {
    TileShape shape{std::min(tile_tokens, tokens - t0), dim};
    ARGUS_ASSIGN_OR_RETURN(size_t n_bytes, codec.encoded_size(shape));
    std::vector<std::byte> tile(n_bytes);
    const float* src = x.data() + size_t{t0} * dim;
    ARGUS_RETURN_IF_ERROR(codec.encode(src, shape, tile));
    back.resize(shape.n_values());
    ARGUS_RETURN_IF_ERROR(codec.decode(tile, shape, back.data()));
    for (size_t i = 0; i < shape.n_values(); ++i) {
      double e = double{back[i]} - src[i];
      err2 += e * e;
      ref2 += double{src[i]} * src[i];
    }
    tiles.push_back(std::move(tile));
  }
  return tiles;
}

}  // namespace

Result<CodecQuality> MeasureQuality(const Codec& k_codec, const Codec& v_codec,
                                    const SyntheticKv& kv, uint32_t tile_tokens) {
  if (tile_tokens == 0 || kv.tokens == 0 || kv.n_q == 0 || kv.n_q > kMaxGroupHeads) {
    return Status::InvalidArgument("MeasureQuality: empty context, tile or query group");
  }
  const uint32_t d = kv.dim, n_q = kv.n_q, n = kv.tokens;
  CodecQuality quality;
  double k_err2 = 0, k_ref2 = 0, v_err2 = 0, v_ref2 = 0;
  ARGUS_ASSIGN_OR_RETURN(auto k_tiles,
                         EncodeTiles(k_codec, kv.k, n, d, tile_tokens, k_err2, k_ref2));
  ARGUS_ASSIGN_OR_RETURN(auto v_tiles,
                         EncodeTiles(v_codec, kv.v, n, d, tile_tokens, v_err2, v_ref2));
  quality.k_rel_rmse = k_ref2 > 0 ? std::sqrt(k_err2 / k_ref2) : 0;
  quality.v_rel_rmse = v_ref2 > 0 ? std::sqrt(v_err2 / v_ref2) : 0;

  // Logits of every head over the whole context: exact in double, and through the codec.
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> exact(size_t{n_q} * n);
  std::vector<float> approx(size_t{n_q} * n), tile_scores;
  for (uint32_t i = 0; i < n_q; ++i) {
    for (uint32_t t = 0; t < n; ++t) {
      double s = 0;
      for (uint32_t c = 0; c < d; ++c)
        s += double{kv.q[size_t{i} * d + c]} * kv.k[size_t{t} * d + c];
      exact[size_t{i} * n + t] = s * scale;
    }
  }
  for (size_t tile = 0; tile < k_tiles.size(); ++tile) {
    uint32_t t0 = static_cast<uint32_t>(tile) * tile_tokens;
    TileShape shape{std::min(tile_tokens, n - t0), d};
    tile_scores.resize(size_t{n_q} * shape.tokens);
    ARGUS_RETURN_IF_ERROR(
        k_codec.scores(k_tiles[tile], shape, kv.q.data(), n_q, tile_scores.data()));
    for (uint32_t i = 0; i < n_q; ++i) {
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        approx[size_t{i} * n + t0 + t] =
            static_cast<float>(tile_scores[size_t{i} * shape.tokens + t] * scale);
      }
    }
  }

  // Softmax of both, KL(p || p'); the exact output o uses p and the exact V in double, the
  // codec's output o' uses p' (as float, as an engine would) and the V codec's accumulate().
  double sq_sum = 0, kl_sum = 0;
  std::vector<double> p_exact(size_t{n_q} * n);
  std::vector<float> p_approx(size_t{n_q} * n);
  for (uint32_t i = 0; i < n_q; ++i) {
    const double* e = &exact[size_t{i} * n];
    const float* a = &approx[size_t{i} * n];
    for (uint32_t t = 0; t < n; ++t) {
      double diff = std::fabs(double{a[t]} - e[t]);
      quality.logit_max_abs = std::max(quality.logit_max_abs, diff);
      sq_sum += diff * diff;
    }
    const SoftmaxState<double> s_e = RowSoftmax(std::span(e, n));
    const SoftmaxState<double> s_a = RowSoftmax(std::span(a, n));
    for (uint32_t t = 0; t < n; ++t) {
      double log_p = e[t] - s_e.m - std::log(s_e.d), log_q = double{a[t]} - s_a.m - std::log(s_a.d);
      p_exact[size_t{i} * n + t] = std::exp(log_p);
      p_approx[size_t{i} * n + t] = static_cast<float>(std::exp(log_q));
      kl_sum += std::exp(log_p) * (log_p - log_q);
    }
  }
  quality.logit_rms = std::sqrt(sq_sum / (double(n_q) * n));
  quality.kl = kl_sum / n_q;

  std::vector<float> acc(size_t{n_q} * d, 0.0f), tile_p;
  for (size_t tile = 0; tile < v_tiles.size(); ++tile) {
    uint32_t t0 = static_cast<uint32_t>(tile) * tile_tokens;
    TileShape shape{std::min(tile_tokens, n - t0), d};
    tile_p.resize(size_t{n_q} * shape.tokens);
    for (uint32_t i = 0; i < n_q; ++i) {
      for (uint32_t t = 0; t < shape.tokens; ++t)
        tile_p[size_t{i} * shape.tokens + t] = p_approx[size_t{i} * n + t0 + t];
    }
    ARGUS_RETURN_IF_ERROR(v_codec.accumulate(v_tiles[tile], shape, tile_p.data(), n_q, acc.data()));
  }
  double out_err_sum = 0;
  std::vector<double> o(d);
  for (uint32_t i = 0; i < n_q; ++i) {
    std::fill(o.begin(), o.end(), 0.0);
    for (uint32_t t = 0; t < n; ++t) {
      for (uint32_t c = 0; c < d; ++c) o[c] += p_exact[size_t{i} * n + t] * kv.v[size_t{t} * d + c];
    }
    double err2 = 0, ref2 = 0;
    for (uint32_t c = 0; c < d; ++c) {
      double diff = double{acc[size_t{i} * d + c]} - o[c];
      err2 += diff * diff;
      ref2 += o[c] * o[c];
    }
    out_err_sum += ref2 > 0 ? std::sqrt(err2 / ref2) : 0;
  }
  quality.out_rel_err = out_err_sum / n_q;
  return quality;
}

}  // namespace argus
