// The argus program as a user runs it: exit codes, stdout/stderr, files it writes.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>

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

}  // namespace
}  // namespace argus
