// The argus program as a user runs it: exit codes, stdout/stderr, files it writes.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "argus/attention.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus {
namespace {

struct CliRun {
  int exit_code;
  std::string out, err;
};

CliRun RunArgus(const std::string& args) {
  auto dir = std::filesystem::temp_directory_path();
  std::string err_path = (dir / ("argus_cli_err_" + std::to_string(::getpid()))).string();
  std::string command = std::string(ARGUS_CLI_PATH) + " " + args + " 2>" + err_path;
  CliRun run{};
  FILE* pipe = ::popen(command.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) run.out.append(buf.data(), n);
  int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto err = ReadFileBytes(err_path);
  if (err.ok()) run.err.assign(reinterpret_cast<const char*>(err->data()), err->size());
  std::filesystem::remove(err_path);
  return run;
}

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

TEST_F(CliTest, ThreeDimensionalInputIsRefused) {
  ASSERT_TRUE(
      WriteNpy(Path("k3.npy"), NpyArray::FromFloat({2, 2, 8}, testing::RandomValues(32, 1))).ok());
  CliRun r = RunArgus("codec encode --codec f16 " + Path("k3.npy") + " " + Path("k.bin"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("expected a 2-D array"), std::string::npos) << r.err;
}

TEST_F(CliTest, BenchCodecsWritesJsonWithRatiosToF16) {
  CliRun r = RunArgus(
      "bench codecs --quick --codecs f16,bf16 --dims 64 --gqa 4 --quality-tokens 512 --reps 1 "
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

// ---- argus bench attention -------------------------------------------------------------------

TEST_F(CliTest, BenchAttentionJsonHasEveryFigureBesideF16) {
  CliRun r = RunArgus(
      "bench attention --quick --contexts 1024 --models qwen2.5-0.5b --pairs f16/f16,q8_0/q8_0 "
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
  EXPECT_EQ(j["slopes"].size(), 2u);
  EXPECT_FALSE(j["slopes"][0].contains("r2"));  // one context: no line to fit
  EXPECT_EQ(j["ordering"]["by_context"].size(), 1u);
  EXPECT_FALSE(j["roofline_target"].contains("ratio"));  // 4096 tokens not measured
}

TEST_F(CliTest, BenchAttentionRefusesUnknownPairsAndModels) {
  CliRun pair = RunArgus("bench attention --pairs f16/nope --contexts 16");
  EXPECT_EQ(pair.exit_code, 1);
  EXPECT_NE(pair.err.find("codec pair 'f16/nope'"), std::string::npos) << pair.err;
  CliRun model = RunArgus("bench attention --models gpt-9 --contexts 16");
  EXPECT_EQ(model.exit_code, 1);
  EXPECT_NE(model.err.find("model 'gpt-9' is not one of"), std::string::npos) << model.err;
}

}  // namespace
}  // namespace argus
