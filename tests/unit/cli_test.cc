// The argus program as a user runs it: exit codes, stdout/stderr, files it writes.
#include <fmt/core.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "argus/attention.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "argus/eval.h"
#include "argus/store.h"
#include "cli_run.h"
#include "core/files.h"
#include "core/npy.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::CliRun;
using testing::RunArgus;
using testing::RunArgusBench;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("argus_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(CliTest, CodecsTableListsEveryRegisteredCodecWithItsKernelPath) {
  CliRun r = RunArgus("codecs");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const CodecInfo& info : CodecRegistry::Default().List()) {
    EXPECT_NE(r.out.find(info.name), std::string::npos) << info.name;
  }
  EXPECT_NE(r.out.find(std::string(KernelPathName(BestKernelPath()))), std::string::npos);
}

TEST_F(CliTest, EncodeDecodeRoundTripThroughFiles) {
  auto x = testing::RandomValues(33 * 64, 11);
  ASSERT_TRUE(WriteNpy(Path("k.npy"), NpyArray::FromFloat({33, 64}, x)).ok());
  CliRun enc = RunArgus("codec encode --codec f16 " + Path("k.npy") + " " + Path("k.bin"));
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  EXPECT_TRUE(enc.out.empty());  // statistics go to stderr
  EXPECT_NE(enc.err.find("bits/value"), std::string::npos);
  EXPECT_EQ(std::filesystem::file_size(Path("k.bin")), 33u * 64 * 2);
  CliRun dec =
      RunArgus("codec decode --codec f16 --shape 33,64 " + Path("k.bin") + " " + Path("out.npy"));
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  auto back = ReadNpy(Path("out.npy"));
  ASSERT_TRUE(back.ok());
  auto values = back->ToFloat();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(values[i], HalfToFloat(FloatToHalf(x[i])));
}

TEST_F(CliTest, WrongShapeAndUnknownCodecAreClearErrors) {
  ASSERT_TRUE(
      WriteNpy(Path("k.npy"), NpyArray::FromFloat({4, 8}, testing::RandomValues(32, 1))).ok());
  ASSERT_EQ(RunArgus("codec encode --codec f16 " + Path("k.npy") + " " + Path("k.bin")).exit_code,
            0);
  CliRun wrong =
      RunArgus("codec decode --codec f16 --shape 5,8 " + Path("k.bin") + " " + Path("o.npy"));
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("needs 80 bytes, got 64"), std::string::npos) << wrong.err;
  EXPECT_FALSE(std::filesystem::exists(Path("o.npy")));
  CliRun unknown = RunArgus("codec encode --codec nope " + Path("k.npy") + " " + Path("x.bin"));
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("'nope' is not registered"), std::string::npos) << unknown.err;
  CliRun bad_shape =
      RunArgus("codec decode --codec f16 --shape 5x8 " + Path("k.bin") + " " + Path("o.npy"));
  EXPECT_EQ(bad_shape.exit_code, 1);
  EXPECT_NE(bad_shape.err.find("is not T,D"), std::string::npos) << bad_shape.err;
}

// A finite value beyond a codec's range used to give a tile decoding to Inf/NaN, exit 0.
TEST_F(CliTest, EncodeOfFiniteValuesBeyondTheCodecsRangeIsRefused) {
  std::vector<float> x = testing::RandomValues(32 * 32, 12);
  x[3 * 32 + 7] = 1e30f;
  ASSERT_TRUE(WriteNpy(Path("big.npy"), NpyArray::FromFloat({32, 32}, x)).ok());
  for (const char* codec : {"f16", "q8_0", "q4_0", "iq4_nl", "bf16"}) {
    SCOPED_TRACE(codec);
    const bool in_range = std::string(codec) == "bf16";  // bf16 reaches 3.4e38
    CliRun r = RunArgus(std::string("codec encode --codec ") + codec + " " + Path("big.npy") + " " +
                        Path("big.bin"));
    EXPECT_EQ(r.exit_code, in_range ? 0 : 1) << r.err;
    if (in_range) continue;
    EXPECT_NE(r.err.find("value 1e+30 at token 3, channel 7 is beyond the range of codec"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(std::filesystem::exists(Path("big.bin")));
  }
}

// Option values that make no sense are errors naming the option, with exit status 1 (CLI11's
// own codes were 104 to 109); -t 100000 used to abort creating threads.
TEST_F(CliTest, NonsenseOptionValuesExitOneNamingTheCause) {
  std::ofstream(Path("m.gguf")) << "x";  // parsing fails before the model is read
  const std::string run = "run -m " + Path("m.gguf") + " -p hi ";
  const std::pair<std::string, std::string> cases[] = {
      {"-t 100000", "100000 threads; at most 1024"},
      {"--ram-budget -1", "a size is not negative"},
      {"-n -1", "-n"},
      {"--temp nan", "nan is not a finite number"},
      {"--top-p 2", "2 is not a finite number in [0, 1]"},
      {"--no-such-option", "no-such-option"},
      {"-c abc", "abc"},
  };
  for (const auto& [args, why] : cases) {
    SCOPED_TRACE(args);
    CliRun r = RunArgus(run + args);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  }
  EXPECT_EQ(RunArgus("run --help").exit_code, 0);
}

TEST_F(CliTest, ThreeDimensionalInputIsRefused) {
  ASSERT_TRUE(
      WriteNpy(Path("k3.npy"), NpyArray::FromFloat({2, 2, 8}, testing::RandomValues(32, 1))).ok());
  CliRun r = RunArgus("codec encode --codec f16 " + Path("k3.npy") + " " + Path("k.bin"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("expected a 2-D array"), std::string::npos) << r.err;
}

TEST_F(CliTest, BenchIsNoLongerACommandOfArgusAndNamesArgusBench) {
  CliRun r = RunArgus("bench codecs --quick");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("argus-bench codecs"), std::string::npos) << r.err;
  CliRun help = RunArgus("--help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  EXPECT_EQ(help.out.find("bench"), std::string::npos) << help.out;
}

TEST_F(CliTest, BenchCodecsWritesJsonWithRatiosToF16) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun r = RunArgusBench(
      "codecs --quick --codecs f16,bf16 --dims 64 --gqa 4 --quality-tokens 256 --reps 1 "
      "--json " +
      Path("b.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto bytes = ReadFileBytes(Path("b.json"));
  ASSERT_TRUE(bytes.ok());
  std::string text(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  EXPECT_NE(text.find("\"time_ratio_to_f16\": 1.0"), std::string::npos);  // f16 against itself
  EXPECT_NE(text.find("\"codec\": \"bf16\""), std::string::npos);
  EXPECT_NE(text.find("heavy-outliers"), std::string::npos);
}

// ---- argus attend ----------------------------------------------------------------------------

// Values rounded to float16, and written as a float16 .npy.
std::vector<float> RoundToHalf(std::vector<float> x) {
  for (float& value : x) value = HalfToFloat(FloatToHalf(value));
  return x;
}
Status WriteHalfNpy(const std::string& path, std::vector<size_t> shape,
                    const std::vector<float>& x) {
  NpyArray array{.type = NpyType::kFloat16, .shape = std::move(shape)};
  array.data.resize(x.size() * 2);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(array.data.data() + 2 * i, &h, 2);
  }
  return WriteNpy(path, array);
}

// Per head: max |out - ref| / max |ref|.
double MaxHeadRelativeError(const std::vector<float>& out, const std::vector<double>& ref,
                            uint32_t head_dim) {
  double worst = 0;
  for (size_t h = 0; h * head_dim < ref.size(); ++h) {
    double max_err = 0, max_ref = 0;
    for (size_t i = h * head_dim; i < (h + 1) * head_dim; ++i) {
      max_err = std::max(max_err, std::fabs(out[i] - ref[i]));
      max_ref = std::max(max_ref, std::fabs(ref[i]));
    }
    worst = std::max(worst, max_err / max_ref);
  }
  return worst;
}

class AttendCliTest : public CliTest {
 protected:
  // 300 tokens in pages of 64: four full pages and a partly filled active one.
  static constexpr uint32_t kTokens = 300, kQHeads = 6, kKvHeads = 2, kDim = 80;
  void SetUp() override {
    CliTest::SetUp();
    q_ = testing::RandomValues(size_t{kQHeads} * kDim, 31);
    k_ = RoundToHalf(testing::RandomValues(size_t{kTokens} * kKvHeads * kDim, 32));
    v_ = RoundToHalf(testing::RandomValues(size_t{kTokens} * kKvHeads * kDim, 33));
    ASSERT_TRUE(WriteNpy(Path("q.npy"), NpyArray::FromFloat({kQHeads, kDim}, q_)).ok());
    ASSERT_TRUE(WriteHalfNpy(Path("k.npy"), {kTokens, kKvHeads, kDim}, k_).ok());
    ASSERT_TRUE(WriteHalfNpy(Path("v.npy"), {kTokens, kKvHeads, kDim}, v_).ok());
  }
  std::string Inputs() const {
    return "attend --q " + Path("q.npy") + " --k " + Path("k.npy") + " --v " + Path("v.npy") +
           " --page-tokens 64 ";
  }
  std::vector<double> Reference(const AttentionOptions& options) const {
    const CacheGeometry g{
        .n_layers = 1, .n_q_heads = kQHeads, .n_kv_heads = kKvHeads, .head_dim = kDim};
    return ReferenceAttention(g, q_.data(), 1, kTokens - 1, k_.data(), v_.data(), kTokens, options);
  }
  std::vector<float> ReadOut(const std::string& name) const {
    auto out = ReadNpy(Path(name));
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    if (!out.ok()) return {};
    EXPECT_EQ(out->shape, (std::vector<size_t>{kQHeads, kDim}));
    return out->ToFloat();
  }
  std::vector<float> q_, k_, v_;
};

TEST_F(AttendCliTest, F16CacheMatchesDoubleReferenceOnHalfInputs) {
  CliRun r = RunArgus(Inputs() + "--codec-k f16 --codec-v f16 --reference " + Path("out.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.empty());  // statistics go to stderr
  EXPECT_NE(r.err.find("pages 5 (0 masked)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("max relative error per head"), std::string::npos) << r.err;
  std::vector<float> out = ReadOut("out.npy");
  ASSERT_EQ(out.size(), size_t{kQHeads} * kDim);
  EXPECT_LE(MaxHeadRelativeError(out, Reference({}), kDim), 2e-4);
}

TEST_F(AttendCliTest, WindowAndSinksReachTheEngineAndJsonReportsTheStep) {
  CliRun r = RunArgus(Inputs() + "--window 100 --sinks 4 --threads 2 --json --reference " +
                      Path("out.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<float> out = ReadOut("out.npy");
  ASSERT_EQ(out.size(), size_t{kQHeads} * kDim);
  EXPECT_LE(MaxHeadRelativeError(out, Reference({.window = 100, .sinks = 4}), kDim), 2e-4);
  nlohmann::json j = nlohmann::json::parse(r.out);
  // Query at 299: window keys 200..299 (pages 3 and 4) and sinks 0..3 (page 0); pages 1 and 2
  // are masked.
  EXPECT_EQ(j["stats"]["n_pages"], 5);
  EXPECT_EQ(j["stats"]["n_pages_masked"], 2);
  EXPECT_EQ(j["stats"]["n_tiles"], 3 * kKvHeads);
  EXPECT_GT(j["stats"]["bytes_read"].get<uint64_t>(), 0u);
  EXPECT_GT(j["cache"]["page_bytes"].get<size_t>(), 0u);
  EXPECT_LE(j["reference"]["max_rel_error"].get<double>(), 2e-4);
  EXPECT_EQ(j["reference"]["max_rel_error_per_head"].size(), kQHeads);
}

TEST_F(AttendCliTest, MismatchedShapesAreErrorsNamingTheFile) {
  auto expect_error = [](const CliRun& run, const std::string& message) {
    EXPECT_EQ(run.exit_code, 1);
    EXPECT_NE(run.err.find(message), std::string::npos) << run.err;
  };
  ASSERT_TRUE(WriteHalfNpy(Path("v64.npy"), {kTokens, kKvHeads, 64},
                           std::vector<float>(size_t{kTokens} * kKvHeads * 64, 0.5f))
                  .ok());
  expect_error(RunArgus("attend --q " + Path("q.npy") + " --k " + Path("k.npy") + " --v " +
                        Path("v64.npy") + " " + Path("out.npy")),
               Path("v64.npy") + ": shape [300, 2, 64] differs from");
  ASSERT_TRUE(
      WriteNpy(Path("q5.npy"), NpyArray::FromFloat({5, kDim}, std::span(q_).first(5 * kDim))).ok());
  expect_error(RunArgus("attend --q " + Path("q5.npy") + " --k " + Path("k.npy") + " --v " +
                        Path("v.npy") + " " + Path("out.npy")),
               Path("q5.npy") + ": 5 query heads is not a multiple");
  expect_error(RunArgus(Inputs() + "--kv-heads 3 " + Path("out.npy")),
               Path("k.npy") + ": shape [300, 2, 80] has 2 kv heads");
  EXPECT_FALSE(std::filesystem::exists(Path("out.npy")));
}

// ---- argus-bench attention -------------------------------------------------------------------

TEST_F(CliTest, BenchAttentionJsonHasEveryFigureBesideF16) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun r = RunArgusBench(
      "attention --quick --contexts 1024 --models qwen2.5-0.5b --pairs f16/f16,q8_0/q8_0 "
      "--layers 1 --reps 1 --json " +
      Path("a.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("qwen2.5-0.5b"), std::string::npos) << r.out;
  auto bytes = ReadFileBytes(Path("a.json"));
  ASSERT_TRUE(bytes.ok());
  nlohmann::json j = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  ASSERT_EQ(j["results"].size(), 2u);
  const nlohmann::json& f16 = j["results"][0];
  const nlohmann::json& q8 = j["results"][1];
  EXPECT_EQ(f16["pair"], "f16/f16");
  EXPECT_EQ(q8["pair"], "q8_0/q8_0");
  EXPECT_EQ(f16["time_ratio_to_f16"], 1.0);  // f16 against itself
  // 1024 tokens fill 4 pages of 256: per layer 2 KV heads x 2 planes x 1024 x 64 f16 values.
  const double f16_bytes_per_layer = 2.0 * 2 * 1024 * 64 * 2;
  EXPECT_EQ(f16["bytes_read_per_token_model"].get<double>(), 24 * f16_bytes_per_layer);
  EXPECT_EQ(f16["fmas_per_token_model"].get<double>(), 24 * 2.0 * 14 * 1024 * 64);
  EXPECT_LT(q8["kv_bytes_model"].get<double>(), 0.6 * f16["kv_bytes_model"].get<double>());
  for (const nlohmann::json& row : j["results"]) {
    EXPECT_GT(row["ms_per_token_per_layer"].get<double>(), 0);
    EXPECT_NEAR(row["ms_per_token_model"].get<double>(),
                24 * row["ms_per_token_per_layer"].get<double>(), 1e-9);
    EXPECT_GT(row["speedup_vs_f16"].get<double>(), 0);
    EXPECT_GT(row["bandwidth_fraction"].get<double>(), 0);
    EXPECT_GT(row["fma_fraction"].get<double>(), 0);
    EXPECT_GE(row["roofline_ratio"].get<double>(), 0);
    EXPECT_GT(row["peak_rss_bytes"].get<double>(), 0);
    EXPECT_GT(row["accounted_bytes"].get<double>(), row["overhead_rss_bytes"].get<double>());
    EXPECT_GT(row["rss_to_accounted"].get<double>(), 0);
    EXPECT_TRUE(row.contains("cache_rss_to_accounted"));
  }
  // The fractions use the FMA rate measured with the run's threads, not one thread's times n.
  const nlohmann::json& m = j["machine"];
  EXPECT_GT(m["fma_gflops_all_threads"].get<double>(), 0);
  EXPECT_EQ(j["config"]["fma_gflops_used"],
            j["config"]["threads"] == 1 ? m["fma_gflops_one_thread"] : m["fma_gflops_all_threads"]);
  EXPECT_EQ(j["slopes"].size(), 2u);
  EXPECT_FALSE(j["slopes"][0].contains("r2"));  // one context: no line to fit
  EXPECT_EQ(j["ordering"]["by_context"].size(), 1u);
  EXPECT_FALSE(j.contains("roofline_target"));  // measured figures only, no verdicts
}

TEST_F(CliTest, BenchAttentionRefusesUnknownPairsAndModels) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun pair = RunArgusBench("attention --pairs f16/nope --contexts 16");
  EXPECT_EQ(pair.exit_code, 1);
  EXPECT_NE(pair.err.find("codec pair 'f16/nope'"), std::string::npos) << pair.err;
  CliRun model = RunArgusBench("attention --models gpt-9 --contexts 16");
  EXPECT_EQ(model.exit_code, 1);
  EXPECT_NE(model.err.find("model 'gpt-9' is not one of"), std::string::npos) << model.err;
}

// A report bound for a directory that is not there is refused as the options are parsed, by every
// subcommand that writes one, not after a run of minutes; nothing is created. The options after
// --json end a run at once should the check be missing (unknown codecs, a missing model or --dir).
TEST_F(CliTest, BenchJsonIntoAMissingDirectoryIsRefusedBeforeTheRun) {
  ARGUS_SKIP_WITHOUT_BENCH();
  const std::string missing = (dir_ / "missing").string();
  const std::pair<std::string, std::string> commands[] = {
      {"codecs", "--codecs nope"},
      {"attention", "--pairs f16/nope --contexts 16"},
      {"e2e", "-m /nonexistent.gguf"},
      {"store", ""},
      {"placement", ""},
      {"capacity", ""},
      {"remote", ""},
      {"serve", ""}};
  for (const auto& [command, rest] : commands) {
    CliRun r = RunArgusBench(command + " --json " + missing + "/report.json " + rest);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.err;
    EXPECT_NE(r.err.find("--json: the directory " + missing + " does not exist"), std::string::npos)
        << command << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(missing));
}

// ---- bench codecs / bench attention on real activations (--kv-dir) ---------------------------

// A dump as `argus eval --dump-kv` writes it, of random activations: every query row is zero but
// the last one, which the benchmarks must use.
class KvDirCliTest : public CliTest {
 protected:
  static constexpr uint32_t kLayers = 2, kQHeads = 4, kKvHeads = 2, kDim = 32, kTokens = 64;
  static constexpr uint32_t kGqa = kQHeads / kKvHeads;
  void SetUp() override {
    CliTest::SetUp();
    dump_ = Path("dump");
    std::filesystem::create_directories(dump_);
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      std::vector<float> q(size_t{kTokens} * kQHeads * kDim, 0.0f);
      const std::vector<float> last = testing::RandomValues(size_t{kQHeads} * kDim, 100 + layer);
      std::copy(last.begin(), last.end(), q.end() - last.size());
      k_.push_back(testing::RandomValues(size_t{kTokens} * kKvHeads * kDim, 200 + layer));
      v_.push_back(testing::RandomValues(size_t{kTokens} * kKvHeads * kDim, 300 + layer));
      last_q_.push_back(last);
      ASSERT_TRUE(Write(layer, 'q', {kTokens, kQHeads, kDim}, q).ok());
      ASSERT_TRUE(Write(layer, 'k', {kTokens, kKvHeads, kDim}, k_.back()).ok());
      ASSERT_TRUE(Write(layer, 'v', {kTokens, kKvHeads, kDim}, v_.back()).ok());
    }
  }
  std::string File(uint32_t layer, char plane) const {
    return dump_ + "/layer0" + std::to_string(layer) + "_" + plane + ".npy";
  }
  Status Write(uint32_t layer, char plane, std::vector<size_t> shape,
               const std::vector<float>& x) const {
    return WriteNpy(File(layer, plane), NpyArray::FromFloat(std::move(shape), x));
  }
  nlohmann::json ReadJson(const std::string& name) const {
    auto bytes = ReadFileBytes(Path(name));
    EXPECT_TRUE(bytes.ok());
    if (!bytes.ok()) return {};
    return nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  }
  // The (layer, KV head) group as the test slices it: the head's K/V, its query heads' last row.
  SyntheticKv Group(uint32_t layer, uint32_t h) const {
    SyntheticKv kv{.tokens = kTokens, .dim = kDim, .n_q = kGqa};
    for (uint32_t t = 0; t < kTokens; ++t) {
      for (uint32_t c = 0; c < kDim; ++c) {
        kv.k.push_back(k_[layer][(size_t{t} * kKvHeads + h) * kDim + c]);
        kv.v.push_back(v_[layer][(size_t{t} * kKvHeads + h) * kDim + c]);
      }
    }
    kv.q.assign(last_q_[layer].begin() + h * kGqa * kDim,
                last_q_[layer].begin() + (h + 1) * kGqa * kDim);
    return kv;
  }
  std::string dump_;
  std::vector<std::vector<float>> k_, v_, last_q_;
};

TEST_F(KvDirCliTest, BenchCodecsReportsRealRowsBesideSyntheticOnes) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun r = RunArgusBench(
      "codecs --quick --codecs f16,q8_0,int4 --dims 32 --gqa 2 --quality-tokens 256 "
      "--reps 1 --kv-dir " +
      dump_ + " --json " + Path("c.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("quality on real activations, real:dump"), std::string::npos) << r.out;
  const nlohmann::json j = ReadJson("c.json");
  EXPECT_EQ(j["config"]["real_kv"]["n_groups"], kLayers * kKvHeads);
  EXPECT_EQ(j["config"]["real_kv"]["tile_tokens"], kTokens);  // min(256, the dump's tokens)
  std::map<std::string, nlohmann::json> real;
  for (const nlohmann::json& c : j["codecs"]) {
    for (const nlohmann::json& row : c["quality"]) {
      if (row["regime"] == "real:dump") real[c["codec"].get<std::string>()] = row;
    }
    EXPECT_EQ(c["quality"].size(), 4u) << c["codec"];  // three synthetic regimes and the dump
  }
  ASSERT_EQ(real.size(), 3u);
  for (const auto& [codec, row] : real) {
    EXPECT_EQ(row["dim"], kDim);
    EXPECT_EQ(row["n_groups"], kLayers * kKvHeads);
    for (const char* field : {"k_rel_rmse", "v_rel_rmse", "logit_rms", "out_rel_err", "kl"}) {
      const double mean = row[field], max = row["max"][field];
      EXPECT_TRUE(std::isfinite(mean) && mean > 0) << codec << " " << field << " " << mean;
      EXPECT_GE(max, mean) << codec << " " << field;
    }
  }
  for (const char* field : {"logit_rms", "out_rel_err", "kl"}) {
    EXPECT_LT(real["f16"][field].get<double>(), real["q8_0"][field].get<double>()) << field;
    EXPECT_LT(real["q8_0"][field].get<double>(), real["int4"][field].get<double>()) << field;
  }
  // The CLI's groups and aggregation against the test's own slicing of the files.
  auto q8 = testing::MakeCodec("q8_0");
  ASSERT_NE(q8, nullptr);
  double mean_logit = 0, max_out = 0;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint32_t h = 0; h < kKvHeads; ++h) {
      auto q = MeasureQuality(*q8, *q8, Group(layer, h), kTokens);
      ASSERT_TRUE(q.ok()) << q.status().ToString();
      mean_logit += q->logit_rms / (kLayers * kKvHeads);
      max_out = std::max(max_out, q->out_rel_err);
    }
  }
  EXPECT_NEAR(real["q8_0"]["logit_rms"].get<double>(), mean_logit, 1e-12 * mean_logit);
  EXPECT_NEAR(real["q8_0"]["max"]["out_rel_err"].get<double>(), max_out, 1e-12 * max_out);
}

TEST_F(KvDirCliTest, BenchAttentionDecodesTheDumpAndReportsErrorsAgainstDouble) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun r = RunArgusBench(
      "attention --kv-dir " + dump_ +
      " --pairs f16/f16,q8_0/q8_0 --page-tokens 16 --reps 1 --threads 2 --json " + Path("a.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("real:dump"), std::string::npos) << r.out;
  const nlohmann::json j = ReadJson("a.json");
  ASSERT_EQ(j["results"].size(), 2u);
  const nlohmann::json& f16 = j["results"][0];
  const nlohmann::json& q8 = j["results"][1];
  EXPECT_EQ(f16["pair"], "f16/f16");
  EXPECT_EQ(q8["pair"], "q8_0/q8_0");
  for (const nlohmann::json& row : j["results"]) {
    EXPECT_EQ(row["model"], "real:dump");
    EXPECT_EQ(row["model_layers"], kLayers);
    EXPECT_EQ(row["context"], kTokens);
    EXPECT_GT(row["ms_per_token_model"].get<double>(), 0);
    ASSERT_EQ(row["max_rel_error_by_layer"].size(), kLayers);
    const double max = row["max_rel_error"], mean = row["mean_rel_error"];
    EXPECT_TRUE(std::isfinite(max) && mean > 0 && mean <= max) << row.dump();
    EXPECT_EQ(max, std::max(row["max_rel_error_by_layer"][0].get<double>(),
                            row["max_rel_error_by_layer"][1].get<double>()));
  }
  // Every layer's K/V in f16: per layer 2 KV heads x 2 planes x 64 tokens x 32 x 2 bytes.
  EXPECT_EQ(f16["bytes_read_per_token_model"].get<double>(), kLayers * 2.0 * 2 * 64 * 32 * 2);
  // f16 rounding of K/V alone: about 2^-11 relative.
  EXPECT_LT(f16["max_rel_error"].get<double>(), 5e-3);
  EXPECT_GT(q8["mean_rel_error"].get<double>(), f16["mean_rel_error"].get<double>());
  EXPECT_GT(q8["max_rel_error"].get<double>(), f16["max_rel_error"].get<double>());
}

TEST_F(KvDirCliTest, BadDumpDirectoriesAreErrorsNamingTheFile) {
  ARGUS_SKIP_WITHOUT_BENCH();
  auto expect_error = [](const CliRun& run, const std::string& message) {
    EXPECT_NE(run.exit_code, 0);
    EXPECT_NE(run.err.find(message), std::string::npos) << run.err;
  };
  expect_error(RunArgusBench("codecs --kv-dir " + Path("nope")),
               Path("nope") + ": no such directory");
  std::filesystem::create_directories(Path("empty"));
  expect_error(RunArgusBench("attention --kv-dir " + Path("empty")),
               Path("empty") + ": no layerNN_k.npy files");
  expect_error(RunArgusBench("attention --kv-dir " + dump_ + " --contexts 64"), "excludes");

  // Layer 1's V with another head_dim; then layer 1 with fewer tokens than layer 0.
  std::vector<float> x(size_t{kTokens} * kKvHeads * 16, 0.5f);
  ASSERT_TRUE(Write(1, 'v', {kTokens, kKvHeads, 16}, x).ok());
  expect_error(RunArgusBench("codecs --kv-dir " + dump_),
               File(1, 'v') + ": shape [64, 2, 16] differs from layer01_k.npy's [64, 2, 32]");
  x.assign(size_t{10} * kKvHeads * kDim, 0.5f);
  ASSERT_TRUE(Write(1, 'k', {10, kKvHeads, kDim}, x).ok());
  ASSERT_TRUE(Write(1, 'v', {10, kKvHeads, kDim}, x).ok());
  expect_error(RunArgusBench("attention --kv-dir " + dump_),
               File(1, 'k') + ": shape [10, 2, 32] differs from layer00_k.npy's [64, 2, 32]");
  // A layer missing between others.
  std::filesystem::rename(File(1, 'k'), dump_ + "/layer02_k.npy");
  expect_error(RunArgusBench("attention --kv-dir " + dump_), File(1, 'k') + ": missing");
  std::filesystem::remove(dump_ + "/layer02_k.npy");

  // Queries of another token count; a float16 file; a missing one.
  std::filesystem::remove(File(1, 'v'));
  x.assign(size_t{kTokens - 1} * kQHeads * kDim, 0.5f);
  ASSERT_TRUE(Write(0, 'q', {kTokens - 1, kQHeads, kDim}, x).ok());
  expect_error(RunArgusBench("attention --kv-dir " + dump_),
               File(0, 'q') + ": shape [63, 4, 32]; expected [64, n_q_heads, 32]");
  NpyArray half{.type = NpyType::kFloat16, .shape = {kTokens, kQHeads, kDim}};
  half.data.resize(size_t{kTokens} * kQHeads * kDim * 2);
  ASSERT_TRUE(WriteNpy(File(0, 'q'), half).ok());
  expect_error(RunArgusBench("codecs --kv-dir " + dump_),
               File(0, 'q') + ": dtype float16; a dump holds float32");
  std::filesystem::remove(File(0, 'q'));
  expect_error(RunArgusBench("codecs --kv-dir " + dump_), File(0, 'q'));
}

TEST_F(AttendCliTest, NonFiniteQueryIsAnErrorNotAnOutput) {
  std::vector<float> q = q_;
  q[kDim + 3] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(WriteNpy(Path("q.npy"), NpyArray::FromFloat({kQHeads, kDim}, q)).ok());
  CliRun r = RunArgus(Inputs() + "--reference " + Path("out.npy"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("query value inf at position 299, head 1 is not finite"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(Path("out.npy")));
}

// ---- argus run / eval / make-model ------------------------------------------------------------

std::string StoriesModel() { return testing::SharedDir() + "/models/stories260K.gguf"; }

// The first 1500 bytes of tests/data/story.txt: 684 tokens, 10 full pages of 64.
void WriteStoryPrompt(const std::string& path) {
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path) << text.substr(0, 1500);
}

// stdout is exactly the continuation: llama.cpp's greedy 64 tokens for the recorded prompt.
TEST_F(CliTest, RunStreamsExactlyTheGreedyContinuation) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::ifstream in(testing::SharedDir() + "/testdata/stories260K/prompt1-f16.json");
  const nlohmann::json oracle = nlohmann::json::parse(in);
  const std::string prompt = oracle["prompt"];
  CliRun r = RunArgus("run -m " + StoriesModel() + " -p '" + prompt + "' -n 64 --stats");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, oracle["greedy_text"].get<std::string>());
  EXPECT_NE(r.err.find("time to first token"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("matmul"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("KV cache"), std::string::npos) << r.err;
}

// The exact profile under a RAM budget of about half what the run needs, its pages' masters
// on disk: the same greedy continuation, while the placement engine moved pages (--stats).
TEST_F(CliTest, RunUnderAPlacementBudgetContinuesExactlyAsTheExactCache) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::ifstream in(testing::SharedDir() + "/testdata/stories260K/prompt1-f16.json");
  const nlohmann::json oracle = nlohmann::json::parse(in);
  const std::string prompt = oracle["prompt"];
  // The built-in exact profile, pinning one page of recent tokens instead of 256 tokens.
  std::ofstream(Path("exact16.json")) << R"({"name": "exact16", "base": "exact",
                                            "pins": {"sinks": 4, "recent": 16}})";
  // stories260K: 5 layers x 4 KV heads x 8 dims x K and V x 2 bytes = 640 bytes per token, a
  // page of 16 tokens 10 KiB over the layers; the run holds about 80 tokens (6 pages with the
  // active one, 60 KiB); 36000 bytes hold 3.5 pages: the pins (sink, recent, active) and half
  // a page more per layer.
  CliRun r = RunArgus("run -m " + StoriesModel() + " -p '" + prompt +
                      "' -n 64 --page-tokens 16 --ram-budget 36000 --profile " +
                      Path("exact16.json") + " --disk-dir " + Path("disk") + " --stats");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, oracle["greedy_text"].get<std::string>());
  EXPECT_NE(r.err.find("placement: active"), std::string::npos) << r.err;
  std::smatch demotions;
  ASSERT_TRUE(std::regex_search(r.err, demotions, std::regex(R"(\), (\d+) demotions)"))) << r.err;
  EXPECT_GT(std::stoi(demotions[1]), 0) << r.err;
}

// A second run with the same prompt loads the prompt's full pages from the prompt cache and
// continues exactly as the first; another model's pages are never used.
TEST_F(CliTest, RunPromptCacheReusesThePrefixAndContinuesIdentically) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  const std::string args =
      " -p '" + prompt + "' -n 24 --page-tokens 16 --stats --prompt-cache " + Path("prompt-cache");
  CliRun first = RunArgus("run -m " + StoriesModel() + args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("prompt cache: 0 of"), std::string::npos) << first.err;
  CliRun second = RunArgus("run -m " + StoriesModel() + args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out, first.out);
  EXPECT_NE(second.err.find("prompt cache: 16 of"), std::string::npos) << second.err;
  CliRun make =
      RunArgus("make-model --arch llama --preset stories260k --type f32 -o " + Path("other.gguf"));
  ASSERT_EQ(make.exit_code, 0) << make.err;
  CliRun other = RunArgus("run -m " + Path("other.gguf") + args);
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(other.err.find("prompt cache: 0 of"), std::string::npos) << other.err;
}

// A prompt cache serves only pages an exact run computes: runs that attended with an epsilon
// or under an active placement ladder store no page past their first inexact token, so a plain
// run reusing the cache samples exactly what it samples without one.
TEST_F(CliTest, PromptCacheFilledByApproximateRunsServesOnlyExactPages) {
  ARGUS_SKIP_WITHOUT_SHARED();
  WriteStoryPrompt(Path("prompt.txt"));
  const std::string run = "run -m " + StoriesModel() + " -f " + Path("prompt.txt") +
                          " --page-tokens 64 --temp 1.0 --seed 3 -n 40 --stats";
  CliRun plain = RunArgus(run);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  // 684 tokens, 10 full pages: the balanced profile's ladder is active under 300K and demotes
  // pages that later chunks attend.
  for (const std::string fill : {" --epsilon 0.9", " --profile balanced --ram-budget 300K"}) {
    SCOPED_TRACE(fill);
    const std::string cache = " --prompt-cache " + Path("pc" + std::to_string(fill.size()));
    CliRun filled = RunArgus(run + fill + cache);
    ASSERT_EQ(filled.exit_code, 0) << filled.err;
    std::smatch inexact;
    ASSERT_TRUE(std::regex_search(filled.err, inexact, std::regex(R"((\d+) computed inexactly)")))
        << filled.err;
    EXPECT_GT(std::stoi(inexact[1]), 0) << filled.err;
    CliRun reused = RunArgus(run + cache);
    ASSERT_EQ(reused.exit_code, 0) << reused.err;
    EXPECT_EQ(reused.out, plain.out) << reused.err;
  }
}

// A store that fills part way (its budget or the disk) keeps the pages written before: --stats
// counted them as 0 when the store failed.
TEST_F(CliTest, PromptCacheThatFillsPartWayCountsThePagesItStored) {
  ARGUS_SKIP_WITHOUT_SHARED();
  WriteStoryPrompt(Path("prompt.txt"));
  // Pages of 64 tokens: 8 KiB of f16 K/V per layer, 8.5 KiB slots; 30000 bytes hold 3.
  CliRun r = RunArgus("run -m " + StoriesModel() + " -f " + Path("prompt.txt") +
                      " --page-tokens 64 -n 4 --stats --prompt-cache " + Path("pc") +
                      " --prompt-cache-budget 30000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("run: prompt pages not stored"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reused, 3 pages stored"), std::string::npos) << r.err;
}

// Runs under an active placement ladder keep masters in the prompt cache's store and erase
// them at the end: the journal grew by about 2 KB a run with nothing new stored. It stays
// within twice the records of its live pages (plus a few).
TEST_F(CliTest, PromptCacheJournalStaysBoundedOverRepeatedProfiledRuns) {
  ARGUS_SKIP_WITHOUT_SHARED();
  WriteStoryPrompt(Path("prompt.txt"));
  const std::string run = "run -m " + StoriesModel() + " -f " + Path("prompt.txt") +
                          " --page-tokens 64 -n 8 --profile balanced --ram-budget 300K "
                          "--prompt-cache " +
                          Path("pc");
  for (int i = 0; i < 8; ++i) {
    CliRun r = RunArgus(run);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  CliRun check = RunArgus("store check --json " + Path("pc"));
  ASSERT_EQ(check.exit_code, 0) << check.err;
  const nlohmann::json j = nlohmann::json::parse(check.out);
  EXPECT_GT(j["pages"].get<size_t>(), 0u);
  EXPECT_LE(j["journal_records"].get<size_t>(), 2 * j["pages"].get<size_t>() + 17) << j.dump();
}

// Opening the prompt cache reads no page: a run whose prompt shares nothing with the stored
// pages reads none (each page is verified when it is read). It used to read the whole store.
TEST_F(CliTest, PromptCacheOpenReadsNoPage) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string run = "run -m " + StoriesModel() +
                          " -n 4 --page-tokens 16 --stats --prompt-cache " + Path("pc") + " -p ";
  CliRun first = RunArgus(run +
                          "'Once upon a time, there was a little girl named Lily. She "
                          "loved to play outside.'");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  CliRun other = RunArgus(run + "'A cat sat on the mat.'");  // under one page
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(other.err.find("prompt cache: store of 5 pages, 0 pages read"), std::string::npos)
      << other.err;
}

// A prompt cache never fails a run. One damaged byte in the middle of the journal: the store
// is moved aside (kept for `store check`), an empty one started, the output unchanged.
TEST_F(CliTest, DamagedPromptCacheJournalIsSetAsideAndTheRunContinues) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string run = "run -m " + StoriesModel() +
                          " -p 'Once upon a time, there was a little girl named Lily. She loved to "
                          "play outside.' -n 24 --page-tokens 16 --stats --prompt-cache " +
                          Path("pc");
  CliRun first = RunArgus(run);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string journal = Path("pc") + "/journal";
  std::vector<std::byte> bytes = ReadFileBytes(journal).value();
  ASSERT_GT(bytes.size(), 200u);
  bytes[40] ^= std::byte{0x5a};  // inside the first record: valid records follow it
  ASSERT_TRUE(WriteFileBytes(journal, bytes).ok());
  CliRun damaged = RunArgus(run);
  ASSERT_EQ(damaged.exit_code, 0) << damaged.err;
  EXPECT_EQ(damaged.out, first.out);
  EXPECT_NE(damaged.err.find("moved it to " + Path("pc") + ".damaged-1"), std::string::npos)
      << damaged.err;
  EXPECT_TRUE(std::filesystem::exists(Path("pc.damaged-1") + "/journal"));
  CliRun again = RunArgus(run);  // the new store serves
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("prompt cache: 16 of"), std::string::npos) << again.err;
  EXPECT_EQ(again.out, first.out);
}

// A store in use by another process, a path that is a file, a symlinked journal, a missing
// parent directory and a read-only directory: the run goes on without the cache and says why,
// truly.
TEST_F(CliTest, PromptCacheThatCannotServeIsSkippedWithAWarning) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string run =
      "run -m " + StoriesModel() + " -p 'Once upon a time' -n 12 --page-tokens 16 --prompt-cache ";
  CliRun plain = RunArgus("run -m " + StoriesModel() + " -p 'Once upon a time' -n 12");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto expect_skipped = [&](const std::string& dir, const std::string& why) {
    SCOPED_TRACE(dir);
    CliRun r = RunArgus(run + dir);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);
    EXPECT_NE(r.err.find("running without the prompt cache"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  };
  {
    DiskTierOptions o;
    o.dir = Path("held");
    o.disk_budget_bytes = size_t{1} << 20;
    auto held = DiskTier::Open(o);
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    expect_skipped(Path("held"), "in use by another DiskTier");
  }
  std::ofstream(Path("a-file")) << "not a directory";
  expect_skipped(Path("a-file"), "File exists");
  // A journal planted as a link to another file: refused, the file untouched.
  std::filesystem::create_directories(Path("linked"));
  std::filesystem::create_symlink(Path("a-file"), Path("linked") + "/journal");
  expect_skipped(Path("linked"), "a symbolic link, refused in a store");
  EXPECT_EQ(std::filesystem::file_size(Path("a-file")), std::string("not a directory").size());
  expect_skipped(Path("missing/pc"), "No such file or directory");
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directories(Path("ro"));
    std::filesystem::permissions(
        Path("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    expect_skipped(Path("ro"), "Permission denied");
  }
}

TEST_F(CliTest, EvalPrintsPerplexityAndDumpsEveryLayersQkv) {
  ARGUS_SKIP_WITHOUT_SHARED();
  // The story's first seven lines, 611 tokens: two windows of 256, a third of the sanitizer's
  // time of the whole story's six.
  std::ifstream story(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  std::string text, line;
  for (int i = 0; i < 7 && std::getline(story, line); ++i) text += line + "\n";
  ASSERT_EQ(text.size(), 1347u);
  ASSERT_TRUE(WriteFileBytes(Path("story.txt"), std::as_bytes(std::span(text))).ok());
  CliRun r = RunArgus("eval -m " + StoriesModel() + " -f " + Path("story.txt") +
                      " -c 256 --dump-kv " + Path("dump") + " --json " + Path("eval.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("perplexity ", 0), 0u) << r.out;
  auto report = ReadFileBytes(Path("eval.json"));
  ASSERT_TRUE(report.ok());
  const nlohmann::json j = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(report->data()), report->size()));
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
  EXPECT_LT(j["perplexity"].get<double>(), 20.0);
  EXPECT_EQ(j["n_windows"], 2);  // 512 of the 611 tokens in windows of 256
  for (const char* plane : {"q", "k", "v"}) {
    auto npy = ReadNpy(Path("dump") + "/layer04_" + plane + ".npy");
    ASSERT_TRUE(npy.ok()) << plane << ": " << npy.status().ToString();
    const size_t heads = plane[0] == 'q' ? 8 : 4;
    EXPECT_EQ(npy->shape, (std::vector<size_t>{256, heads, 8})) << plane;
  }
}

// --cache-type-active f32 keeps each sequence's partly filled page in f32 (its pages are then
// quantised from the model's values, not their fp16 rounding): the cache's budget grows by that
// page's second half, 5 layers x 4 KV heads x 8 dims x K and V x 16 tokens x 2 bytes. Other
// codecs are refused by name.
TEST_F(CliTest, EvalKeepsThePartlyFilledPageInTheActiveTypeItIsGiven) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::ifstream story(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  std::string text((std::istreambuf_iterator<char>(story)), std::istreambuf_iterator<char>());
  text.resize(1347);
  ASSERT_TRUE(WriteFileBytes(Path("story.txt"), std::as_bytes(std::span(text))).ok());
  auto budget = [&](const std::string& active) {
    CliRun r = RunArgus("eval -m " + StoriesModel() + " -f " + Path("story.txt") +
                        " -c 256 --page-tokens 16 --cache-type-k q4_0 --cache-type-v q4_0 "
                        "--cache-type-active " +
                        active + " --json " + Path(active + ".json"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto report = ReadFileBytes(Path(active + ".json"));
    EXPECT_TRUE(report.ok());
    if (!report.ok()) return int64_t{0};
    return nlohmann::json::parse(
               std::string(reinterpret_cast<const char*>(report->data()), report->size()))
        .at("ram_budget_bytes")
        .get<int64_t>();
  };
  EXPECT_EQ(budget("f32") - budget("f16"), 5 * 4 * 8 * 2 * 16 * 2);
  CliRun bad = RunArgus("eval -m " + StoriesModel() + " -f " + Path("story.txt") +
                        " --cache-type-active q4_0");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--cache-type-active"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("q4_0"), std::string::npos) << bad.err;
}

// argus trace record lays the model's K/V and queries out as docs/traces.md says: each token's
// rows where `eval --dump-kv` (another writer of the same activations) puts them, the queries of
// the decode steps after the prefix. Layers after the first may differ in the last bits: the
// dump's window runs as one prefill, the recording decodes its steps one by one.
TEST_F(CliTest, TraceRecordLaysOutTheModelsQkvAsTheDumpHasThem) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::ifstream story(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  std::string text, line;
  for (int i = 0; i < 3 && std::getline(story, line); ++i) text += line + "\n";
  ASSERT_TRUE(WriteFileBytes(Path("story.txt"), std::as_bytes(std::span(text))).ok());
  CliRun dump = RunArgus("eval -m " + StoriesModel() + " -f " + Path("story.txt") +
                         " -c 64 --dump-kv " + Path("dump"));
  ASSERT_EQ(dump.exit_code, 0) << dump.err;
  CliRun record = RunArgus("trace record -m " + StoriesModel() + " -f " + Path("story.txt") +
                           " --prefix-tokens 48 --steps 16 -b 16 -o " + Path("rec.trace"));
  ASSERT_EQ(record.exit_code, 0) << record.err;
  Result<Trace> trace = ReadTrace(Path("rec.trace"));
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->options.kind, TraceKind::kRecorded);
  EXPECT_EQ(trace->options.geometry.ToString(), CacheGeometry({5, 8, 4, 8}).ToString());
  EXPECT_EQ(trace->target, std::vector<int64_t>(16, -1));
  const size_t kv_row = 4 * 8, q_row = 8 * 8;
  for (uint32_t layer = 0; layer < 5; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    const auto read = [&](const char* plane) {
      Result<NpyArray> npy =
          ReadNpy(Path("dump") + fmt::format("/layer{:02}_{}.npy", layer, plane));
      EXPECT_TRUE(npy.ok()) << npy.status().ToString();
      return npy.ok() ? npy->ToFloat() : std::vector<float>();
    };
    const std::vector<float> k = read("k"), v = read("v"), q = read("q");
    ASSERT_EQ(k.size(), 64 * kv_row);
    const float tolerance = layer == 0 ? 0.0f : 2e-3f;
    for (uint32_t t = 0; t < 64; ++t) {
      const std::span<const uint16_t> k_row = trace->K(layer, t, 1), v_row = trace->V(layer, t, 1);
      for (size_t i = 0; i < kv_row; ++i) {
        ASSERT_NEAR(HalfToFloat(k_row[i]), HalfToFloat(FloatToHalf(k[t * kv_row + i])),
                    tolerance * (1 + std::fabs(k[t * kv_row + i])))
            << "token " << t << " value " << i;
        ASSERT_NEAR(HalfToFloat(v_row[i]), HalfToFloat(FloatToHalf(v[t * kv_row + i])),
                    tolerance * (1 + std::fabs(v[t * kv_row + i])))
            << "token " << t << " value " << i;
      }
      if (t < 48) continue;
      const std::span<const float> q_row_of_step = trace->Q(t - 48, layer);
      for (size_t i = 0; i < q_row; ++i) {
        ASSERT_NEAR(q_row_of_step[i], q[t * q_row + i],
                    tolerance * (1 + std::fabs(q[t * q_row + i])))
            << "step " << t - 48 << " value " << i;
      }
    }
  }
}

TEST_F(CliTest, MakeModelWritesAModelThatRuns) {
  CliRun make =
      RunArgus("make-model --arch llama --preset stories260k --type f32 -o " + Path("tiny.gguf"));
  ASSERT_EQ(make.exit_code, 0) << make.err;
  CliRun run = RunArgus("run -m " + Path("tiny.gguf") + " -p hello -n 5 --temp 0.7 --seed 3");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("stories260k"), std::string::npos) << run.err;
  CliRun again = RunArgus("run -m " + Path("tiny.gguf") + " -p hello -n 5 --temp 0.7 --seed 3");
  EXPECT_EQ(again.out, run.out);  // seeded sampling repeats
  // A prompt that fills the context is an error; generation stops, saying so, when it fills.
  CliRun long_prompt = RunArgus("run -m " + Path("tiny.gguf") + " -c 4 -p 'hello there'");
  EXPECT_EQ(long_prompt.exit_code, 1);
  EXPECT_NE(long_prompt.err.find("context holds 4"), std::string::npos) << long_prompt.err;
  CliRun full = RunArgus("run -m " + Path("tiny.gguf") + " -c 12 -p hello -n 50");
  EXPECT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.err.find("context of 12 tokens is full"), std::string::npos) << full.err;
  // A profile that keeps pages on disk needs a disk tier; a ladder chooses its own codecs.
  CliRun no_disk = RunArgus("run -m " + Path("tiny.gguf") + " -p hi --profile research");
  EXPECT_EQ(no_disk.exit_code, 1);
  EXPECT_NE(no_disk.err.find("give --disk-dir"), std::string::npos) << no_disk.err;
  CliRun codecs =
      RunArgus("run -m " + Path("tiny.gguf") + " -p hi --profile balanced --cache-type-k q8_0");
  EXPECT_EQ(codecs.exit_code, 1);
  EXPECT_NE(codecs.err.find("from its ladder"), std::string::npos) << codecs.err;
  CliRun two_stores = RunArgus("run -m " + Path("tiny.gguf") + " -p hi --disk-dir " + Path("d1") +
                               " --prompt-cache " + Path("d2"));
  EXPECT_EQ(two_stores.exit_code, 1);
  EXPECT_NE(two_stores.err.find("one of --prompt-cache and --disk-dir"), std::string::npos)
      << two_stores.err;
  CliRun bad = RunArgus("make-model --preset gpt-5 -o " + Path("x.gguf"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("qwen2.5-0.5b"), std::string::npos) << bad.err;
  CliRun wrong_arch = RunArgus("make-model --arch qwen2 --preset stories260k -o " + Path("x.gguf"));
  EXPECT_EQ(wrong_arch.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(Path("x.gguf")));
}

TEST_F(CliTest, BenchE2eTimesEveryDepthAndCodecBesideF16) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun make = RunArgus("make-model --preset stories260k --type f32 -o " + Path("tiny.gguf"));
  ASSERT_EQ(make.exit_code, 0) << make.err;
  CliRun r = RunArgusBench("e2e -m " + Path("tiny.gguf") +
                           " --depths 0,100 --kv f16,q8_0 --tokens 2 --rounds 1 --page-tokens 16" +
                           " --prefill 64 --prefill-rounds 1 --json " + Path("e2e.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto bytes = ReadFileBytes(Path("e2e.json"));
  ASSERT_TRUE(bytes.ok());
  const nlohmann::json j = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  ASSERT_EQ(j["points"].size(), 4u);
  const bool peer =
      std::filesystem::exists(std::filesystem::path(testing::SharedDir()) / "peers/bin/depthbench");
  EXPECT_NE(j["peer"].get<std::string>().find(peer ? "depthbench" : "none"), std::string::npos);
  for (const auto& p : j["points"]) {
    EXPECT_GT(p["ms_per_token"].get<double>(), 0.0);
    EXPECT_GT(p["speedup_vs_f16"].get<double>(), 0.0);
    EXPECT_GT(p["roofline_ms"].get<double>(), 0.0);
    EXPECT_NEAR(p["vs_roofline"].get<double>(),
                p["ms_per_token"].get<double>() / p["roofline_ms"].get<double>(), 1e-9);
    // f16 KV: stock llama.cpp decodes at the same depth on the same file, beside argus.
    if (peer && p["kv"] == "f16/f16") {
      ASSERT_TRUE(p.contains("peer_ms_per_token")) << p.dump();
      EXPECT_NEAR(p["speedup_vs_peer"].get<double>(),
                  p["peer_ms_per_token"].get<double>() / p["ms_per_token"].get<double>(), 1e-9);
    }
    const double split = p["matmul_ms"].get<double>() + p["attention_ms"].get<double>() +
                         p["other_ms"].get<double>();
    EXPECT_NEAR(split, p["ms_per_token"].get<double>(), 1e-6);
  }
  // 100 synthetic tokens in pages of 16: q8_0's six full pages per layer take fewer bytes.
  EXPECT_LT(j["points"][3]["kv_bytes"].get<double>(), j["points"][2]["kv_bytes"].get<double>());
  // Time to first token of a 64-token prompt, beside llama-bench's prompt processing.
  ASSERT_EQ(j["prefill"].size(), 1u);
  const nlohmann::json& prefill = j["prefill"][0];
  EXPECT_EQ(prefill["tokens"], 64);
  EXPECT_GT(prefill["ms"].get<double>(), 0.0);
  EXPECT_NEAR(prefill["tokens_per_s"].get<double>(), 64e3 / prefill["ms"].get<double>(), 1e-6);
  const bool llama_bench = std::filesystem::exists(std::filesystem::path(testing::SharedDir()) /
                                                   "peers/bin/llama-bench");
  if (llama_bench) {
    ASSERT_TRUE(prefill.contains("peer_ms")) << prefill.dump();
    EXPECT_NEAR(prefill["speedup_vs_peer"].get<double>(),
                prefill["peer_ms"].get<double>() / prefill["ms"].get<double>(), 1e-9);
  }
}

// Codec names may hold a '/' (plane8/4): the K/V split is the codec library's, not the first '/'.
TEST_F(CliTest, BenchE2eSplitsKvPairsWhoseCodecNamesHoldASlash) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun make = RunArgus("make-model --preset stories260k --type f32 -o " + Path("tiny.gguf"));
  ASSERT_EQ(make.exit_code, 0) << make.err;
  CliRun r = RunArgusBench("e2e -m " + Path("tiny.gguf") +
                           " --depths 0 --kv plane8/4 --tokens 1 --rounds 1 --prefill 16" +
                           " --prefill-rounds 1 --no-peer --json " + Path("e.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto bytes = ReadFileBytes(Path("e.json"));
  ASSERT_TRUE(bytes.ok());
  const nlohmann::json j = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  EXPECT_EQ(j["points"][0]["kv"], "plane8/4/plane8/4");
}

// --prefill-rounds 0 measures no time to first token (before, it reported 0 ms and inf tokens a
// second); a negative count is refused by name.
TEST_F(CliTest, BenchE2eWithoutPrefillRoundsReportsNoPrefillPoint) {
  ARGUS_SKIP_WITHOUT_BENCH();
  CliRun make = RunArgus("make-model --preset stories260k --type f32 -o " + Path("tiny.gguf"));
  ASSERT_EQ(make.exit_code, 0) << make.err;
  const std::string run = "e2e -m " + Path("tiny.gguf") +
                          " --depths 0 --kv f16 --tokens 1 --rounds 1 --prefill 16 --no-peer";
  CliRun r = RunArgusBench(run + " --prefill-rounds 0 --json " + Path("e.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("inf"), std::string::npos) << r.out;
  auto bytes = ReadFileBytes(Path("e.json"));
  ASSERT_TRUE(bytes.ok());
  const nlohmann::json j = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  EXPECT_TRUE(j["prefill"].empty()) << j["prefill"].dump();
  EXPECT_EQ(j["points"].size(), 1u);
  CliRun bad = RunArgusBench(run + " --prefill-rounds -1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--prefill-rounds"), std::string::npos) << bad.err;
}

TEST_F(CliTest, RunOnAFileThatIsNotGgufNamesTheFileAndTheField) {
  const std::string text = "this is not a model";
  ASSERT_TRUE(WriteFileBytes(Path("bad.gguf"), std::as_bytes(std::span(text))).ok());
  CliRun r = RunArgus("run -m " + Path("bad.gguf") + " -p hi -n 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find(Path("bad.gguf")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("magic"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace argus
