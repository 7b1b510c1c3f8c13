// The synthetic KV generator (documented in docs/codecs.md, "Synthetic KV"). It uses a
// splitmix64 stream and Box-Muller normals, not <random>'s distributions, whose outputs differ
// between standard libraries: the same seed gives the same values everywhere.
#include <cmath>

#include "argus/codec.h"
#include "core/splitmix.h"

namespace argus {
namespace {

class Stream : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  // Student's t with 4 degrees of freedom, scaled to unit variance: heavy-tailed values.
  double StudentT4() {
    double chi2 = 0;
    for (int i = 0; i < 4; ++i) {
      double z = Normal();
      chi2 += z * z;
    }
    return Normal() / std::sqrt(chi2 / 4.0) / std::sqrt(2.0);
  }
};

}  // namespace

std::string_view KeyRegimeName(KeyRegime regime) {
  switch (regime) {
    case KeyRegime::kIsotropic:
      return "isotropic";
    case KeyRegime::kModerateOutliers:
      return "moderate-outliers";
    case KeyRegime::kHeavyOutliers:
      return "heavy-outliers";
  }
  return "?";
}

SyntheticKv GenerateSyntheticKv(const SyntheticKvOptions& o, uint32_t tokens) {
  SyntheticKv kv;
  kv.tokens = tokens;
  kv.dim = o.dim;
  kv.n_q = o.n_q;
  Stream rng(o.seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(o.regime));
  const uint32_t d = o.dim;

  // Per-channel key scale and mean. Every regime has small random channel means; the outlier
  // regimes give a few channels a much larger scale, and the heavy one large means too.
  std::vector<double> sigma(d, 1.0), mu(d);
  for (double& m : mu) m = 0.5 * rng.Normal();
  const uint32_t n_outliers =
      o.regime == KeyRegime::kIsotropic ? 0 : (o.regime == KeyRegime::kModerateOutliers ? 4 : 8);
  for (uint32_t j = 0; j < n_outliers && j < d; ++j) {
    uint32_t c = static_cast<uint32_t>(rng.Next() % d);
    if (o.regime == KeyRegime::kModerateOutliers) {
      sigma[c] = 4.0 + 4.0 * rng.Uniform();
    } else {
      sigma[c] = 10.0 + 20.0 * rng.Uniform();
      mu[c] = (rng.Uniform() < 0.5 ? -1.0 : 1.0) * sigma[c] * (2.0 + 3.0 * rng.Uniform());
    }
  }

  // Queries share a common direction (heads of one GQA group attend alike), with a per-head part.
  std::vector<double> common(d);
  for (double& c : common) c = rng.Normal();
  double common_norm = 0;
  for (double c : common) common_norm += c * c;
  common_norm = std::sqrt(common_norm);
  kv.q.resize(size_t{o.n_q} * d);
  for (uint32_t i = 0; i < o.n_q; ++i) {
    for (uint32_t c = 0; c < d; ++c) {
      // Queries are small where keys are wide, as in trained models: each outlier channel then
      // moves logits by about sqrt(sigma), not sigma.
      double q = (common[c] + 0.5 * rng.Normal()) / std::sqrt(sigma[c]);
      kv.q[size_t{i} * d + c] = static_cast<float>(q);
    }
  }

  kv.k.resize(size_t{tokens} * d);
  kv.v.resize(size_t{tokens} * d);
  for (uint32_t t = 0; t < tokens; ++t) {
    // About 1% of tokens are relevant: their keys lean towards the queries' common direction.
    double lean = rng.Uniform() < 0.01 ? 2.0 + 3.0 * rng.Uniform() : 0.0;
    bool sink = o.sink && t == 0;
    if (sink) lean = 8.0;  // scaled logit about 8 above the rest: a large share of the mass
    for (uint32_t c = 0; c < d; ++c) {
      // q . (lean * u) ~ lean * ||common|| ~ lean * sqrt(d): a scaled logit of about `lean`.
      double k = mu[c] + sigma[c] * rng.Normal() + lean * common[c] / common_norm;
      kv.k[size_t{t} * d + c] = static_cast<float>(k);
      double v = rng.StudentT4() * (sink ? 0.1 : 1.0);  // sinks carry little value
      kv.v[size_t{t} * d + c] = static_cast<float>(v);
    }
  }
  return kv;
}

}  // namespace argus
