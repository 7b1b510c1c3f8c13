// The model runner against independent references: stock llama.cpp's logits and greedy
// continuation for stories260K (../shared/testdata/stories260K), and a double-precision forward
// pass written here from the GGUF tensors for random-weight Qwen2 models of every weight type.
#include "argus/model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "argus/core.h"
#include "model/matmul.h"
#include "test_util.h"

namespace argus {

// GoogleTest prints parameters with PrintTo, found by argument-dependent lookup in GgmlType's
// namespace; ctest names the test cases after what it prints.
void PrintTo(GgmlType type, std::ostream* os) {
  *os << GgmlTypeInfoOf(static_cast<uint32_t>(type))->name;
}

namespace {

struct Oracle {
  std::string prompt;
  std::vector<int32_t> tokens, greedy;
  std::string greedy_text;
  std::vector<std::vector<float>> logits;  // [position][vocab]
};

Oracle ReadOracle(const std::string& name) {
  std::ifstream in(testing::SharedDir() + "/testdata/stories260K/" + name);
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j["prompt"], j["tokens"], j["greedy"], j["greedy_text"], j["logits"]};
}

std::string StoriesPath() { return testing::SharedDir() + "/models/stories260K.gguf"; }

std::unique_ptr<Model> LoadOrFail(const std::string& path) {
  auto model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(model).value() : nullptr;
}

std::unique_ptr<Context> MakeContext(const Model& model, ContextOptions options) {
  auto context = Context::Create(model, options);
  EXPECT_TRUE(context.ok()) << context.status().ToString();
  return context.ok() ? std::move(context).value() : nullptr;
}

std::vector<float> EvalAll(Context& context, std::span<const int32_t> tokens) {
  auto logits = context.Eval(tokens, true);
  EXPECT_TRUE(logits.ok()) << logits.status().ToString();
  return logits.ok() ? std::vector<float>(logits->begin(), logits->end()) : std::vector<float>{};
}

int32_t Argmax(std::span<const float> x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// Options of an exact context: `codec` for the active page and for full K and V pages.
ContextOptions Options(uint32_t n_ctx, uint32_t page_tokens, const char* codec = "f16") {
  ContextOptions o;
  o.n_ctx = n_ctx;
  o.page_tokens = page_tokens;
  o.active_codec = o.k_codec = o.v_codec = codec;
  return o;
}

// max |a[p * n_vocab + t] - b[p][t]| over positions and tokens. a: [positions, n_vocab].
template <typename A, typename B>
double MaxAbsDiff(const A& a, const std::vector<std::vector<B>>& b, uint32_t n_vocab) {
  double max = 0;
  for (size_t p = 0; p < b.size(); ++p) {
    for (uint32_t t = 0; t < n_vocab; ++t) {
      max = std::max(max, std::abs(double{a[p * n_vocab + t]} - double{b[p][t]}));
    }
  }
  return max;
}

struct KvCase {
  const char* oracle;
  const char* codec;  // active, K and V
  uint32_t page_tokens, n_batch;
};

void PrintTo(const KvCase& c, std::ostream* os) {
  *os << c.oracle << " " << c.codec << " page " << c.page_tokens << " batch " << c.n_batch;
}

class StoriesLogits : public ::testing::TestWithParam<KvCase> {};

// Every prompt position's logits against llama.cpp's, with pages of 16 tokens (the 36-token
// prompt crosses two full pages) and of 256 (all in the active page), and prefill chunks that do
// not divide the prompt. The bound is 2e-2, not the folder README's 1e-3: llama.cpp's own logits
// are 1.46e-2 from a double-precision forward pass, ARGUS's 6e-6
// (Stories260K.LogitsMatchDoublePrecisionForward).
TEST_P(StoriesLogits, MatchLlamaCppAtEveryPosition) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const KvCase c = GetParam();
  const Oracle oracle = ReadOracle(c.oracle);
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  ASSERT_EQ(model->tokenizer().Encode(oracle.prompt, true), oracle.tokens);
  ContextOptions options = Options(512, c.page_tokens, c.codec);
  options.n_batch = c.n_batch;
  auto context = MakeContext(*model, options);
  ASSERT_TRUE(context);
  const std::vector<float> logits = EvalAll(*context, oracle.tokens);
  const uint32_t n_vocab = model->config().n_vocab;
  ASSERT_EQ(logits.size(), oracle.tokens.size() * n_vocab);
  const double max_diff = MaxAbsDiff(logits, oracle.logits, n_vocab);
  EXPECT_LE(max_diff, 2e-2);
}

INSTANTIATE_TEST_SUITE_P(KvCodecs, StoriesLogits,
                         ::testing::Values(KvCase{"prompt1-f32.json", "f32", 16, 7},
                                           KvCase{"prompt1-f32.json", "f32", 256, 64},
                                           KvCase{"prompt1-f16.json", "f16", 16, 1},
                                           KvCase{"prompt1-f16.json", "f16", 256, 36}),
                         [](const ::testing::TestParamInfo<KvCase>& param) {
                           const KvCase& c = param.param;
                           return std::string(c.codec) + "_page" + std::to_string(c.page_tokens) +
                                  "_batch" + std::to_string(c.n_batch);
                         });

TEST(Stories260K, GreedyContinuationMatchesLlamaCppTokenForToken) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const Oracle oracle = ReadOracle("prompt1-f16.json");
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  auto context = MakeContext(*model, Options(512, 32));
  ASSERT_TRUE(context);
  auto logits = context->Eval(oracle.tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  Sampler greedy(SamplerOptions{});
  std::vector<int32_t> generated;
  while (generated.size() < oracle.greedy.size()) {
    generated.push_back(greedy.Sample(*logits));
    logits = context->Eval({&generated.back(), 1});
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  }
  EXPECT_EQ(generated, oracle.greedy);
  EXPECT_EQ(model->tokenizer().Decode(generated), oracle.greedy_text);
}

TEST(Stories260K, LogitsAreBitIdenticalForOneTwoAndFourThreads) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const Oracle oracle = ReadOracle("prompt1-f32.json");
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  std::vector<std::vector<float>> runs;
  for (uint32_t threads : {1u, 2u, 4u}) {
    ContextOptions options = Options(64, 16);
    options.n_threads = threads;
    auto context = MakeContext(*model, options);
    ASSERT_TRUE(context);
    runs.push_back(EvalAll(*context, oracle.tokens));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

// Token-by-token decode (the Decode path) against one prefill (the Prefill path): the same
// function, computed in different orders.
TEST(Stories260K, TokenByTokenDecodeAgreesWithPrefill) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const Oracle oracle = ReadOracle("prompt1-f32.json");
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  auto prefill = MakeContext(*model, Options(64, 8, "f32"));
  auto decode = MakeContext(*model, Options(64, 8, "f32"));
  ASSERT_TRUE(prefill && decode);
  const std::vector<float> all = EvalAll(*prefill, oracle.tokens);
  const uint32_t n_vocab = model->config().n_vocab;
  for (size_t p = 0; p < oracle.tokens.size(); ++p) {
    auto one = decode->Eval({&oracle.tokens[p], 1});
    ASSERT_TRUE(one.ok()) << one.status().ToString();
    for (uint32_t t = 0; t < n_vocab; ++t) {
      ASSERT_NEAR((*one)[t], all[p * n_vocab + t], 1e-4) << "position " << p << " token " << t;
    }
  }
}

std::vector<int32_t> StoryTokens(const Model& model) {
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return model.tokenizer().Encode(text, true);
}

// Windows of 256 tokens; pages of 32 by default, so most of each window's context sits in full
// (encoded) pages.
double PerplexityOf(const Model& model, const std::vector<int32_t>& tokens, const char* k,
                    const char* v, uint32_t page_tokens = 32) {
  ContextOptions options = Options(256, page_tokens);
  options.k_codec = k;
  options.v_codec = v;
  auto result = Perplexity(model, options, tokens);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? result->perplexity : NAN;
}

TEST(Stories260K, Q8_0KvPerplexityIsWithinHalfAPercentOfExact) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  const std::vector<int32_t> tokens = StoryTokens(*model);
  ASSERT_GE(tokens.size(), 768u);
  const double exact = PerplexityOf(*model, tokens, "f16", "f16");
  const double q8 = PerplexityOf(*model, tokens, "q8_0", "q8_0");
  const double int2 = PerplexityOf(*model, tokens, "int2", "int2");
  EXPECT_GT(exact, 1.0);
  EXPECT_LT(exact, 20.0);  // a story in the model's own domain
  EXPECT_LE(std::abs(q8 / exact - 1), 0.005);
  // The measurement can see codec error: a 2-bit cache moves perplexity by more than q8_0 does.
  EXPECT_GT(std::abs(int2 / exact - 1), std::abs(q8 / exact - 1));
}

// stories-distill-3M (head_dim 64) over the first 32 windows of its held-out text, pages of 16
// tokens as in docs/eval.md: the 3.5- and 2.5-bit pairs stay within 1% and 3% of f16, and the
// measurement sees their difference.
// A measurement of quality, not of memory safety (the codecs' conformance tests run under the
// sanitizers): it took 150 s there, so the sanitizer build skips it.
TEST(StoriesDistill, LowBitPairsStayWithinTheirPerplexityBounds) {
#ifdef ARGUS_SANITIZE
  GTEST_SKIP() << "a quality measurement: the release suite runs it";
#endif
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = LoadOrFail(testing::SharedDir() + "/models/stories-distill-3M.gguf");
  ASSERT_TRUE(model);
  std::ifstream in(testing::SharedDir() + "/models/stories-distill-heldout.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> tokens = model->tokenizer().Encode(text, true);
  ASSERT_GE(tokens.size(), 8192u);
  tokens.resize(8192);
  const double exact = PerplexityOf(*model, tokens, "f16", "f16", 16);
  const double bits35 = PerplexityOf(*model, tokens, "chan3", "nl3", 16);
  const double bits25 = PerplexityOf(*model, tokens, "chan2", "nl2", 16);
  EXPECT_LE(bits35 / exact - 1, 0.01);
  EXPECT_LE(bits25 / exact - 1, 0.03);
  EXPECT_GT(bits25, bits35);
  EXPECT_GT(bits35, exact);
}

// ---- Random-weight models against a double-precision forward pass ----------------------------

std::vector<double> Row(const model::WeightMatrix& w, uint32_t r) {
  std::vector<float> f(w.n_cols);
  model::DequantizeRow(w, r, f.data());
  return {f.begin(), f.end()};
}

// y = W x in double over the dequantised weights.
std::vector<double> MatVec(const GgufFile& file, const std::string& name,
                           const std::vector<double>& x) {
  auto w = model::MatrixOf(*file.FindTensor(name));
  EXPECT_TRUE(w.ok());
  std::vector<double> y(w->n_rows);
  for (uint32_t r = 0; r < w->n_rows; ++r) {
    const std::vector<double> row = Row(*w, r);
    y[r] = std::inner_product(row.begin(), row.end(), x.begin(), 0.0);
  }
  return y;
}

std::vector<double> Vec(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  std::vector<float> f(t->n_values);
  std::memcpy(f.data(), t->data.data(), f.size() * 4);
  return {f.begin(), f.end()};
}

std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<double>& w,
                            double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// Rotates pairs (x[i], x[i + d/2]) (NeoX) or (x[2i], x[2i+1]) by pos * theta^(-2i/d).
void Rope(std::vector<double>& x, uint32_t n_heads, uint32_t d, uint32_t pos, double theta,
          bool neox) {
  for (uint32_t h = 0; h < n_heads; ++h) {
    for (uint32_t i = 0; i < d / 2; ++i) {
      const double a = pos * std::pow(theta, -2.0 * i / d);
      double& x0 = x[h * d + (neox ? i : 2 * i)];
      double& x1 = x[h * d + (neox ? i + d / 2 : 2 * i + 1)];
      const double u = x0, v = x1;
      x0 = u * std::cos(a) - v * std::sin(a);
      x1 = u * std::sin(a) + v * std::cos(a);
    }
  }
}

double RoundToHalf(double x) { return HalfToFloat(FloatToHalf(static_cast<float>(x))); }

// One query head's attention as ggml's CPU flash attention computes it for an F16 cache: q, k, v
// rounded to f16, and the output accumulated online in an f16 vector (each update rounded).
std::vector<double> GgmlF16Attention(const double* q, const std::vector<std::vector<double>>& keys,
                                     const std::vector<std::vector<double>>& values, uint32_t hk,
                                     uint32_t d) {
  std::vector<double> acc(d, 0.0);
  double max = -INFINITY, sum = 0;
  for (size_t t = 0; t < keys.size(); ++t) {
    double s = 0;
    for (uint32_t i = 0; i < d; ++i) s += RoundToHalf(q[i]) * RoundToHalf(keys[t][hk * d + i]);
    s = static_cast<float>(s / std::sqrt(double(d)));
    double scale_old = 1, weight = 1;
    if (s > max) {
      scale_old = std::exp(max - s);
      max = s;
      for (double& a : acc) a = RoundToHalf(a * scale_old);
    } else {
      weight = std::exp(s - max);
    }
    for (uint32_t i = 0; i < d; ++i) {
      acc[i] = RoundToHalf(acc[i] + RoundToHalf(values[t][hk * d + i]) * weight);
    }
    sum = sum * scale_old + weight;
  }
  for (double& a : acc) a /= sum;
  return acc;
}

// Logits of every position of `tokens` for a Llama or Qwen2 model, in double; with
// ggml_f16_attention, attention follows GgmlF16Attention instead.
std::vector<std::vector<double>> ReferenceForward(const GgufFile& f, const ModelConfig& c,
                                                  const std::vector<int32_t>& tokens,
                                                  bool ggml_f16_attention = false) {
  const uint32_t d = c.head_dim, g = c.n_heads / c.n_kv_heads;
  std::vector<std::vector<std::vector<double>>> keys(c.n_layers), values(c.n_layers);
  std::vector<std::vector<double>> logits;
  auto embd = model::MatrixOf(*f.FindTensor("token_embd.weight"));
  for (uint32_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<double> x = Row(*embd, static_cast<uint32_t>(tokens[pos]));
    for (uint32_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const auto add = [](std::vector<double> a, const std::vector<double>& b) {
        for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
        return a;
      };
      const std::vector<double> h = RmsNorm(x, Vec(f, p + "attn_norm.weight"), c.rms_eps);
      // y = W h (+ bias when the file has one: Qwen2 does, Llama does not).
      const auto project = [&](const std::string& name) {
        std::vector<double> y = MatVec(f, p + name + ".weight", h);
        return f.FindTensor(p + name + ".bias") ? add(y, Vec(f, p + name + ".bias")) : y;
      };
      std::vector<double> q = project("attn_q"), k = project("attn_k");
      const std::vector<double> v = project("attn_v");
      Rope(q, c.n_heads, d, pos, c.rope_theta, c.rope_neox);
      Rope(k, c.n_kv_heads, d, pos, c.rope_theta, c.rope_neox);
      keys[l].push_back(k);
      values[l].push_back(v);
      std::vector<double> attn(c.n_heads * d, 0.0);
      for (uint32_t hq = 0; hq < c.n_heads; ++hq) {
        const uint32_t hk = hq / g;
        if (ggml_f16_attention) {
          const std::vector<double> o = GgmlF16Attention(&q[hq * d], keys[l], values[l], hk, d);
          std::copy(o.begin(), o.end(), attn.begin() + hq * d);
          continue;
        }
        std::vector<double> s(pos + 1);
        for (uint32_t t = 0; t <= pos; ++t) {
          for (uint32_t i = 0; i < d; ++i) s[t] += q[hq * d + i] * keys[l][t][hk * d + i];
          s[t] /= std::sqrt(double(d));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += e = std::exp(e - m);
        for (uint32_t t = 0; t <= pos; ++t) {
          for (uint32_t i = 0; i < d; ++i) attn[hq * d + i] += s[t] / z * values[l][t][hk * d + i];
        }
      }
      x = add(x, MatVec(f, p + "attn_output.weight", attn));
      const std::vector<double> h2 = RmsNorm(x, Vec(f, p + "ffn_norm.weight"), c.rms_eps);
      std::vector<double> gate = MatVec(f, p + "ffn_gate.weight", h2);
      const std::vector<double> up = MatVec(f, p + "ffn_up.weight", h2);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      x = add(x, MatVec(f, p + "ffn_down.weight", gate));
    }
    logits.push_back(MatVec(f, c.tied_output ? "token_embd.weight" : "output.weight",
                            RmsNorm(x, Vec(f, "output_norm.weight"), c.rms_eps)));
  }
  return logits;
}

class RandomQwen2 : public ::testing::TestWithParam<GgmlType> {};

// A tied-output Qwen2 (NeoX RoPE, QKV biases) of each weight type: logits at every position
// against the double-precision forward pass over the same dequantised weights. The bound covers
// f32 accumulation and, for Q8_0/Q4_0 weights, the Q8_0 quantisation of the activations.
TEST_P(RandomQwen2, LogitsMatchDoublePrecisionForward) {
  const GgmlType type = GetParam();
  RandomModelOptions options;
  options.config.arch = ModelArch::kQwen2;
  options.config.name = "tiny-qwen2";
  options.config.n_layers = 2;
  options.config.n_embd = 64;
  options.config.n_heads = 4;
  options.config.n_kv_heads = 2;
  options.config.head_dim = 16;
  options.config.n_ff = 96;
  options.config.n_ctx_train = 128;
  options.config.rope_theta = 10000;
  options.config.rms_eps = 1e-6f;
  options.config.rope_neox = true;
  options.config.tied_output = true;
  options.type = type;
  options.seed = testing::TestSeed();
  const std::string path = ::testing::TempDir() + "/tiny-qwen2-" +
                           std::to_string(static_cast<int>(type)) + "-" + std::to_string(getpid()) +
                           ".gguf";
  ASSERT_TRUE(WriteRandomModel(options, path).ok());
  auto model = LoadOrFail(path);
  ASSERT_TRUE(model);
  EXPECT_TRUE(model->config().rope_neox);
  EXPECT_TRUE(model->config().tied_output);

  const std::vector<int32_t> tokens = model->tokenizer().Encode("Hello, ARGUS! 123", true);
  ContextOptions co = Options(64, 4, "f32");
  co.n_batch = 5;
  auto context = MakeContext(*model, co);
  ASSERT_TRUE(context);
  const std::vector<float> logits = EvalAll(*context, tokens);
  const auto reference = ReferenceForward(model->file(), model->config(), tokens);
  const uint32_t n_vocab = model->config().n_vocab;
  const bool quantised = type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0;
  const double max_diff = MaxAbsDiff(logits, reference, n_vocab);
  double max_ref = 0;
  for (const std::vector<double>& row : reference) {
    for (double l : row) max_ref = std::max(max_ref, std::abs(l));
  }
  EXPECT_LE(max_diff, (quantised ? 5e-2 : 1e-4) * max_ref);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, RandomQwen2,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0, GgmlType::kQ4_0),
                         [](const ::testing::TestParamInfo<GgmlType>& param) {
                           return std::string(
                               GgmlTypeInfoOf(static_cast<uint32_t>(param.param))->name);
                         });

// The same double-precision forward pass over stories260K: how far ARGUS and llama.cpp each are
// from exact arithmetic.
TEST(Stories260K, LogitsMatchDoublePrecisionForward) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const Oracle oracle = ReadOracle("prompt1-f32.json");
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  auto context = MakeContext(*model, Options(64, 16, "f32"));
  ASSERT_TRUE(context);
  const std::vector<float> logits = EvalAll(*context, oracle.tokens);
  const auto reference = ReferenceForward(model->file(), model->config(), oracle.tokens);
  const auto emulated = ReferenceForward(model->file(), model->config(), oracle.tokens, true);
  const uint32_t n_vocab = model->config().n_vocab;
  // Oracle logits flattened, to compare with both references.
  std::vector<float> llama_cpp;
  for (const std::vector<float>& row : oracle.logits)
    llama_cpp.insert(llama_cpp.end(), row.begin(), row.end());
  const double argus_diff = MaxAbsDiff(logits, reference, n_vocab);
  const double llama_cpp_diff = MaxAbsDiff(llama_cpp, reference, n_vocab);
  const double emulated_diff = MaxAbsDiff(llama_cpp, emulated, n_vocab);
  EXPECT_LE(argus_diff, 1e-4);
  // llama.cpp's recorded logits are ~1.5e-2 from exact arithmetic (the folder README expects
  // 1e-3 of an exact cache, which exact arithmetic cannot meet); ggml's f16 attention numerics
  // account for part of that distance.
  EXPECT_LT(emulated_diff, llama_cpp_diff);
}

// ---- Errors and budgets ----------------------------------------------------------------------

TEST(Context, TokenOutsideTheVocabularyIsInvalidArgument) {
  ARGUS_SKIP_WITHOUT_SHARED();
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  auto context = MakeContext(*model, ContextOptions{.n_ctx = 16});
  ASSERT_TRUE(context);
  const int32_t bad[] = {1, 512};
  EXPECT_EQ(context->Eval(bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(context->n_past(), 0u);
  const int32_t too_many[17] = {};
  EXPECT_EQ(context->Eval(too_many).status().code(), StatusCode::kInvalidArgument);
}

// A budget reached mid-call leaves the context as it was before the call: the next call that
// fits gives the same logits as a context that never failed.
TEST(Context, BudgetExhaustedMidEvalRollsBackTheWholeCall) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const Oracle oracle = ReadOracle("prompt1-f32.json");
  auto model = LoadOrFail(StoriesPath());
  ASSERT_TRUE(model);
  ContextOptions options = Options(64, 8);
  CacheOptions cache;
  cache.geometry = model->config().geometry();
  cache.page_tokens = 8;
  auto need = KvCache::RequiredRamBytes(cache, 20);
  ASSERT_TRUE(need.ok());
  options.ram_budget_bytes = *need;
  auto context = MakeContext(*model, options);
  ASSERT_TRUE(context);
  const std::span<const int32_t> prompt(oracle.tokens);
  ASSERT_TRUE(context->Eval(prompt.first(10)).ok());
  const auto stats_before = context->cache().stats();
  EXPECT_EQ(context->Eval(prompt.subspan(10, 20)).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(context->n_past(), 10u);
  EXPECT_EQ(context->cache().stats().page_bytes, stats_before.page_bytes);
  auto after = context->Eval(prompt.subspan(10, 10), true);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  const std::vector<float> resumed(after->end() - model->config().n_vocab, after->end());

  auto fresh = MakeContext(*model, options);
  ASSERT_TRUE(fresh);
  auto direct = fresh->Eval(prompt.first(20));
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(resumed, std::vector<float>(direct->begin(), direct->end()));
}

// A one-layer random model, rewritten with `edit` applied to its metadata, without the
// tensor `drop` and with every value of the tensor `poison` NaN; Model::Load's result on it.
Result<std::unique_ptr<Model>> LoadEdited(const std::function<void(GgufWriter&)>& edit,
                                          const std::string& drop = "",
                                          const std::string& poison = "") {
  RandomModelOptions options;
  auto config = ModelPreset("stories260k");
  EXPECT_TRUE(config.ok());
  options.config = *config;
  options.config.n_layers = 1;
  options.type = GgmlType::kF32;
  const std::string path = ::testing::TempDir() + "/edited-" + std::to_string(getpid());
  EXPECT_TRUE(WriteRandomModel(options, path + ".gguf").ok());
  auto file = GgufFile::Open(path + ".gguf");
  EXPECT_TRUE(file.ok());
  GgufWriter writer;
  for (const GgufKeyValue& kv : (*file)->metadata()) writer.Set(kv.key, kv.value);
  edit(writer);
  std::vector<float> nans;
  for (const GgufTensor& t : (*file)->tensors()) {
    if (t.name == poison) {
      nans.assign(t.data.size() / sizeof(float), std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(writer.AddTensor(t.name, t.type, t.dims, std::as_bytes(std::span(nans))).ok());
    } else if (t.name != drop) {
      EXPECT_TRUE(writer.AddTensor(t.name, t.type, t.dims, t.data).ok());
    }
  }
  EXPECT_TRUE(writer.Write(path + "-edited.gguf").ok());
  auto model = Model::Load(path + "-edited.gguf");
  std::filesystem::remove(path + ".gguf");
  std::filesystem::remove(path + "-edited.gguf");
  return model;
}

TEST(Model, UneditedRandomModelLoads) {
  auto model = LoadEdited([](GgufWriter&) {});
  EXPECT_TRUE(model.ok()) << model.status().ToString();
}

// NaN query weights made every query NaN, which attention absorbed: the run printed text as if
// the model were intact. The attention call refuses the query, naming the layer.
TEST(Model, NonFiniteQueriesAreInvalidArgumentNamingTheLayer) {
  auto model = LoadEdited([](GgufWriter&) {}, "", "blk.0.attn_q.weight");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto context = MakeContext(**model, Options(64, 16));
  ASSERT_NE(context, nullptr);
  const std::vector<int32_t> tokens = {1, 5, 9};
  auto logits = context->Eval(tokens);
  ASSERT_FALSE(logits.ok());
  EXPECT_EQ(logits.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(logits.status().message().find("attention over layer 0"), std::string::npos)
      << logits.status().message();
  EXPECT_NE(logits.status().message().find("is not finite"), std::string::npos)
      << logits.status().message();
  EXPECT_EQ(context->n_past(), 0u);  // rolled back
}

TEST(Model, MissingTensorIsNotFoundNamingIt) {
  auto model = LoadEdited([](GgufWriter&) {}, "blk.0.ffn_up.weight");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("blk.0.ffn_up.weight"), std::string::npos);
}

TEST(Model, HyperparametersThatDoNotFitTheTensorsNameTheTensor) {
  // 8 KV heads of 8 need a [64, 64] attn_k; the file's is [32, 64].
  auto model = LoadEdited([](GgufWriter& w) { w.SetU32("llama.attention.head_count_kv", 8); });
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("blk.0.attn_k.weight"), std::string::npos)
      << model.status().ToString();
}

TEST(Model, UnknownArchitectureAndAbsurdCountsAreErrors) {
  auto mamba = LoadEdited([](GgufWriter& w) { w.SetString("general.architecture", "mamba"); });
  EXPECT_EQ(mamba.status().code(), StatusCode::kUnsupported);
  auto zero = LoadEdited([](GgufWriter& w) { w.SetU32("llama.attention.head_count", 0); });
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  auto huge = LoadEdited([](GgufWriter& w) { w.SetU32("llama.block_count", 4000000000u); });
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
}

// ---- Sampling --------------------------------------------------------------------------------

TEST(Sampler, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  Sampler greedy(SamplerOptions{});
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(greedy.Sample(logits), 1);
}

TEST(Sampler, SameSeedSameTokensAndCutsAreHonoured) {
  const std::vector<float> logits = testing::RandomValues(300, 7);
  const int32_t best = Argmax(logits);
  SamplerOptions o{.temperature = 1.5f, .top_k = 0, .top_p = 1.0f, .seed = 42};
  Sampler a(o), b(o);
  std::vector<int> counts(logits.size());
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = a.Sample(logits);
    EXPECT_EQ(t, b.Sample(logits));
    ++counts[t];
  }
  EXPECT_GT(std::count_if(counts.begin(), counts.end(), [](int c) { return c > 0; }), 5);
  // top_k = 3: only the three largest logits ever come out.
  std::vector<float> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  Sampler top3({.temperature = 1.0f, .top_k = 3, .top_p = 1.0f, .seed = 1});
  for (int i = 0; i < 500; ++i) EXPECT_GE(logits[top3.Sample(logits)], sorted[2]);
  // A tiny nucleus keeps only the most likely token.
  Sampler nucleus({.temperature = 1.0f, .top_k = 0, .top_p = 1e-6f, .seed = 1});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(nucleus.Sample(logits), best);
}

// With no cuts, sampled frequencies follow softmax(logits / T) (a loose 5-sigma band).
TEST(Sampler, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f};
  const float temperature = 0.8f;
  Sampler sampler({.temperature = temperature, .top_k = 0, .top_p = 1.0f, .seed = 9});
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i] / temperature);
  const int n = 20000;
  std::vector<int> counts(logits.size());
  for (int i = 0; i < n; ++i) ++counts[sampler.Sample(logits)];
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] / z * n, sigma = std::sqrt(expected);
    EXPECT_NEAR(counts[i], expected, 5 * sigma + 1) << "token " << i;
  }
}

}  // namespace
}  // namespace argus
