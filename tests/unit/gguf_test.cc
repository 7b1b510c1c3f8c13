// The GGUF reader and writer: a real llama.cpp file, byte-exact writer output against images
// written out by hand from the spec (ggml's docs/gguf.md), a round trip of every metadata type,
// and hostile images (truncation at every byte, absurd counts and lengths, overlapping and
// misplaced tensors, bit flips), each of which must be a clear error and never a crash.
#include "argus/gguf.h"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "core/files.h"
#include "eval/long_context.h"
#include "test_util.h"

namespace argus {
namespace {

// A little-endian image written field by field, independently of GgufWriter.
class Image {
 public:
  Image& U8(uint8_t v) { return Put(v); }
  Image& U32(uint32_t v) { return Put(v); }
  Image& U64(uint64_t v) { return Put(v); }
  Image& Str(std::string_view s) {
    U64(s.size());
    for (char c : s) bytes.push_back(static_cast<std::byte>(c));
    return *this;
  }
  Image& Zeros(size_t n) {
    bytes.insert(bytes.end(), n, std::byte{0});
    return *this;
  }
  Image& PadTo(size_t alignment) {
    return Zeros((alignment - bytes.size() % alignment) % alignment);
  }
  // n bytes of a pattern that differs per position.
  Image& Pattern(size_t n, uint8_t salt) {
    for (size_t i = 0; i < n; ++i) bytes.push_back(static_cast<std::byte>(i * 7 + salt));
    return *this;
  }
  template <typename T>
  Image& Put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
    return *this;
  }
  std::vector<std::byte> bytes;
};

Image Header(uint64_t n_tensors, uint64_t n_metadata, uint32_t version = 3) {
  Image img;
  img.bytes = {std::byte{'G'}, std::byte{'G'}, std::byte{'U'}, std::byte{'F'}};
  img.U32(version).U64(n_tensors).U64(n_metadata);
  return img;
}

void TensorInfo(Image& img, std::string_view name, const std::vector<uint64_t>& dims, uint32_t type,
                uint64_t offset) {
  img.Str(name).U32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) img.U64(d);
  img.U32(type).U64(offset);
}

// A valid one-tensor file: one string key, tensor "t" of 8 f32 at offset 0.
Image ValidSmallImage() {
  Image img = Header(1, 1);
  img.Str("general.architecture").U32(8).Str("llama");
  TensorInfo(img, "t", {8}, 0, 0);
  img.PadTo(32).Pattern(32, 1);
  return img;
}

// Parses `bytes` and expects failure with `code` and a message holding every one of `parts`.
void ExpectError(const std::vector<std::byte>& bytes, StatusCode code,
                 std::vector<std::string> parts) {
  auto file = GgufFile::Parse(bytes, "hostile.gguf");
  ASSERT_FALSE(file.ok()) << "parsed although it should not";
  EXPECT_EQ(file.status().code(), code) << file.status().ToString();
  parts.push_back("hostile.gguf: ");
  for (const std::string& part : parts) {
    EXPECT_NE(file.status().message().find(part), std::string::npos)
        << "'" << part << "' missing from: " << file.status().message();
  }
}

// Reads every byte of every tensor and every metadata value, so the sanitizers see any span or
// string that reaches outside its image.
uint64_t TouchEverything(const GgufFile& file) {
  uint64_t sum = file.version() + file.alignment();
  for (const GgufTensor& t : file.tensors()) {
    for (std::byte b : t.data) sum += std::to_integer<uint8_t>(b);
    sum += t.n_rows() + t.n_values + t.name.size();
  }
  for (const GgufKeyValue& kv : file.metadata()) {
    const GgufValue& v = kv.value;
    sum += kv.key.size() + v.u + static_cast<uint64_t>(v.i) + v.s.size() + v.array_size();
    for (int64_t x : v.ints) sum += static_cast<uint64_t>(x);
    for (const std::string& s : v.strings) sum += s.size();
    sum += v.floats.size();
  }
  return sum;
}

std::vector<std::byte> PatternBytes(size_t n, uint8_t salt) {
  Image img;
  img.Pattern(n, salt);
  return img.bytes;
}

GgufValue Array(GgufType element, std::vector<int64_t> ints, std::vector<double> floats = {},
                std::vector<std::string> strings = {}) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.element_type = element;
  v.ints = std::move(ints);
  v.floats = std::move(floats);
  v.strings = std::move(strings);
  return v;
}

GgufValue Scalar(GgufType type, uint64_t u, int64_t i = 0, double f = 0, std::string s = "") {
  GgufValue v;
  v.type = type;
  v.u = u;
  v.i = i;
  v.f = f;
  v.s = std::move(s);
  return v;
}

// Every metadata type, and arrays of every element type, with their extreme values.
std::vector<GgufKeyValue> EveryMetadataType() {
  using L = std::numeric_limits<int64_t>;
  return {
      {"u8", Scalar(GgufType::kU8, 255)},
      {"i8", Scalar(GgufType::kI8, 0, -128)},
      {"u16", Scalar(GgufType::kU16, 65535)},
      {"i16", Scalar(GgufType::kI16, 0, -32768)},
      {"u32", Scalar(GgufType::kU32, 4294967295u)},
      {"i32", Scalar(GgufType::kI32, 0, -2147483647 - 1)},
      {"f32", Scalar(GgufType::kF32, 0, 0, -1.25e-5f)},
      {"bool.true", Scalar(GgufType::kBool, 1)},
      {"bool.false", Scalar(GgufType::kBool, 0)},
      {"string", Scalar(GgufType::kString, 0, 0, 0, std::string("nul\0and \xff\xfe bytes", 16))},
      {"string.empty", Scalar(GgufType::kString, 0)},
      {"u64", Scalar(GgufType::kU64, std::numeric_limits<uint64_t>::max())},
      {"i64", Scalar(GgufType::kI64, 0, L::min())},
      {"f64", Scalar(GgufType::kF64, 0, 0, 3.141592653589793)},
      {"array.u8", Array(GgufType::kU8, {0, 1, 255})},
      {"array.i8", Array(GgufType::kI8, {-128, 0, 127})},
      {"array.u16", Array(GgufType::kU16, {65535, 7})},
      {"array.i16", Array(GgufType::kI16, {-32768, 32767})},
      {"array.u32", Array(GgufType::kU32, {4294967295ll, 0})},
      {"array.i32", Array(GgufType::kI32, {-2147483648ll, 2147483647})},
      {"array.f32", Array(GgufType::kF32, {}, {0.5, -2.0, 1e30})},
      {"array.bool", Array(GgufType::kBool, {1, 0, 1})},
      {"array.string", Array(GgufType::kString, {}, {}, {"", "a", std::string(300, 'x')})},
      {"array.u64", Array(GgufType::kU64, {L::max(), 0})},
      {"array.i64", Array(GgufType::kI64, {L::min(), L::max()})},
      {"array.f64", Array(GgufType::kF64, {}, {1.0 / 3.0, -0.0})},
      {"array.empty", Array(GgufType::kU32, {})},
  };
}

bool SameValue(const GgufValue& a, const GgufValue& b) {
  auto same_floats = [](const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::bit_cast<uint64_t>(x[i]) != std::bit_cast<uint64_t>(y[i])) return false;
    }
    return true;
  };
  return a.type == b.type && a.u == b.u && a.i == b.i &&
         std::bit_cast<uint64_t>(a.f) == std::bit_cast<uint64_t>(b.f) && a.s == b.s &&
         (a.type != GgufType::kArray || a.element_type == b.element_type) && a.ints == b.ints &&
         same_floats(a.floats, b.floats) && a.strings == b.strings;
}

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> dims;
  size_t n_bytes;  // hand-computed from ggml's block sizes
};

const std::vector<TensorSpec>& OddTensors() {
  static const std::vector<TensorSpec> specs = {
      {"f32.3x5", GgmlType::kF32, {3, 5}, 60},
      {"f16.7", GgmlType::kF16, {7}, 14},
      {"q8_0.64x3", GgmlType::kQ8_0, {64, 3}, 6 * 34},
      {"q4_0.32x1x2", GgmlType::kQ4_0, {32, 1, 2}, 2 * 18},
      {"q4_K.256x2", GgmlType::kQ4_K, {256, 2}, 2 * 144},
      {"i8.5x1x1x3", GgmlType::kI8, {5, 1, 1, 3}, 15},
      {"bf16.1", GgmlType::kBF16, {1}, 2},
      {"tq1_0.256", GgmlType::kTQ1_0, {256}, 54},
  };
  return specs;
}

// The writer's file of EveryMetadataType() and OddTensors() at alignment 64.
std::vector<std::byte> RoundTripFile() {
  GgufWriter writer(64);
  for (const GgufKeyValue& kv : EveryMetadataType()) writer.Set(kv.key, kv.value);
  uint8_t salt = 0;
  for (const TensorSpec& t : OddTensors()) {
    EXPECT_TRUE(writer.AddTensor(t.name, t.type, t.dims, PatternBytes(t.n_bytes, ++salt)).ok());
  }
  auto bytes = writer.Serialize();
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<std::byte>{};
}

// ---- ggml type table --------------------------------------------------------------------

// Block shapes computed by hand from ggml-common.h's block_* structs (QK_K = 256, ggml_half 2
// bytes), e.g. q3_K = hmask[32] + qs[64] + scales[12] + d = 110.
TEST(GgufTypes, BlockShapesMatchGgmlStructs) {
  struct Row {
    uint32_t id;
    std::string_view name;
    uint32_t block_values, block_bytes;
  };
  const Row rows[] = {
      {0, "f32", 1, 4},
      {1, "f16", 1, 2},
      {2, "q4_0", 32, 2 + 16},
      {3, "q4_1", 32, 4 + 16},
      {6, "q5_0", 32, 2 + 4 + 16},
      {7, "q5_1", 32, 4 + 4 + 16},
      {8, "q8_0", 32, 2 + 32},
      {9, "q8_1", 32, 4 + 32},
      {10, "q2_K", 256, 16 + 64 + 4},
      {11, "q3_K", 256, 32 + 64 + 12 + 2},
      {12, "q4_K", 256, 4 + 12 + 128},
      {13, "q5_K", 256, 4 + 12 + 32 + 128},
      {14, "q6_K", 256, 128 + 64 + 16 + 2},
      {15, "q8_K", 256, 4 + 256 + 32},
      {16, "iq2_xxs", 256, 2 + 64},
      {17, "iq2_xs", 256, 2 + 64 + 8},
      {18, "iq3_xxs", 256, 2 + 96},
      {19, "iq1_s", 256, 2 + 32 + 16},
      {20, "iq4_nl", 32, 2 + 16},
      {21, "iq3_s", 256, 2 + 64 + 8 + 32 + 4},
      {22, "iq2_s", 256, 2 + 64 + 8 + 8},
      {23, "iq4_xs", 256, 2 + 2 + 4 + 128},
      {24, "i8", 1, 1},
      {25, "i16", 1, 2},
      {26, "i32", 1, 4},
      {27, "i64", 1, 8},
      {28, "f64", 1, 8},
      {29, "iq1_m", 256, 32 + 16 + 8},
      {30, "bf16", 1, 2},
      {34, "tq1_0", 256, 48 + 4 + 2},
      {35, "tq2_0", 256, 64 + 2},
  };
  for (const Row& row : rows) {
    auto info = GgmlTypeInfoOf(row.id);
    ASSERT_TRUE(info.ok()) << row.id;
    EXPECT_EQ(info->name, row.name) << row.id;
    EXPECT_EQ(info->block_values, row.block_values) << row.name;
    EXPECT_EQ(info->block_bytes, row.block_bytes) << row.name;
  }
  // Removed (4, 5: q4_2, q4_3; 31-33: repacked q4_0) and newer (39: mxfp4) ids are unknown.
  for (uint32_t id : {4u, 5u, 31u, 33u, 36u, 39u, 1000u}) {
    auto info = GgmlTypeInfoOf(id);
    ASSERT_FALSE(info.ok()) << id;
    EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(info.status().message().find(std::to_string(id)), std::string::npos);
  }
  EXPECT_EQ(GgufTypeName(GgufType::kString), "string");
  EXPECT_EQ(GgufTypeName(static_cast<GgufType>(13)), "unknown");
}

// ---- a real file ------------------------------------------------------------------------

TEST(Gguf, Stories260KHasItsMetadataAndTensors) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string path = testing::SharedDir() + "/models/stories260K.gguf";
  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const GgufFile& f = **opened;
  EXPECT_EQ(f.name(), path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.size_bytes(), 1185376u);
  EXPECT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetUint("llama.block_count"), 5u);
  EXPECT_EQ(*f.GetUint("llama.embedding_length"), 64u);
  EXPECT_EQ(*f.GetUint("llama.feed_forward_length"), 172u);
  EXPECT_EQ(*f.GetUint("llama.attention.head_count"), 8u);
  EXPECT_EQ(*f.GetUint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*f.GetUint("llama.context_length"), 2048u);
  EXPECT_EQ(*f.GetUint("llama.rope.dimension_count"), 8u);
  EXPECT_EQ(*f.GetFloat("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(*f.GetUint("tokenizer.ggml.padding_token_id"), 4294967295u);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "llama");
  auto tokens = f.GetArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ((*tokens)->element_type, GgufType::kString);
  ASSERT_EQ((*tokens)->array_size(), 512u);
  EXPECT_EQ((*tokens)->strings[0], "<unk>");
  EXPECT_EQ((*tokens)->strings[2], "</s>");
  EXPECT_EQ((*f.GetArray("tokenizer.ggml.scores"))->floats.size(), 512u);
  EXPECT_EQ((*f.GetArray("tokenizer.ggml.token_type"))->ints[0], 2);

  // 3 + 9 per layer; despite shared/testdata/README.md this file has no rope_freqs.weight.
  ASSERT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.FindTensor("rope_freqs.weight"), nullptr);
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(embd->n_rows(), 512u);
  const GgufTensor* q = f.FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dims, (std::vector<uint64_t>{64, 64}));
  EXPECT_EQ(q->offset, 262400u);
  EXPECT_EQ(f.FindTensor("blk.4.ffn_down.weight")->dims, (std::vector<uint64_t>{172, 64}));

  // The tensor infos end at byte 14152, so the data section starts at 14176; every span must be
  // exactly the file's bytes there.
  auto bytes = ReadFileBytes(path);
  ASSERT_TRUE(bytes.ok());
  constexpr size_t kDataStart = 14176;
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
    ASSERT_EQ(t.data.size(), t.n_values * 4) << t.name;
    ASSERT_LE(kDataStart + t.offset + t.data.size(), bytes->size()) << t.name;
    EXPECT_EQ(std::memcmp(t.data.data(), bytes->data() + kDataStart + t.offset, t.data.size()), 0)
        << t.name;
  }
  const GgufTensor* last = f.FindTensor("blk.4.ffn_norm.weight");
  EXPECT_EQ(kDataStart + last->offset + last->data.size(), bytes->size());
}

TEST(Gguf, OpenMissingFileIsIOErrorNamingThePath) {
  auto file = GgufFile::Open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kIOError);
  EXPECT_NE(file.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

// A tensor repacked for the kernels gives its mapped pages back: the process's resident memory
// falls by about its size, and its bytes read the same afterwards (from the file). On an image
// the caller owns nothing is touched.
TEST(Gguf, ReleasePagesDropsMappedTensorPagesAndKeepsTheirBytes) {
  constexpr size_t kBytes = size_t{32} << 20;
  const std::vector<std::byte> pattern = PatternBytes(kBytes, 7);
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("big", GgmlType::kF32, {kBytes / 4}, pattern).ok());
  testing::TempDir dir;
  ASSERT_TRUE(writer.Write(dir / "big.gguf").ok());
  auto file = GgufFile::Open(dir / "big.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::span<const std::byte> data = (*file)->FindTensor("big")->data;
  ASSERT_TRUE(std::equal(data.begin(), data.end(), pattern.begin(), pattern.end()));  // resident
  const size_t before = CurrentRssBytes();
  (*file)->ReleasePages(data);
  const size_t after = CurrentRssBytes();
  EXPECT_LT(after + kBytes * 3 / 4, before) << "RSS " << before << " -> " << after;
  EXPECT_TRUE(std::equal(data.begin(), data.end(), pattern.begin(), pattern.end()));

  const std::vector<std::byte> image = writer.Serialize().value();
  auto parsed = GgufFile::Parse(image);
  ASSERT_TRUE(parsed.ok());
  const std::span<const std::byte> owned = (*parsed)->FindTensor("big")->data;
  (*parsed)->ReleasePages(owned);
  EXPECT_TRUE(std::equal(owned.begin(), owned.end(), pattern.begin(), pattern.end()));
}

// ---- the writer ---------------------------------------------------------------------------

TEST(GgufWriter, OutputMatchesHandWrittenSpecBytes) {
  GgufWriter writer;
  writer.SetU32("n", 7);
  writer.SetString("s", "hi");
  writer.SetU32("n", 9);  // replaced in place: stays first
  const std::vector<std::byte> data = PatternBytes(8, 1);
  ASSERT_TRUE(writer.AddTensor("w", GgmlType::kF32, {2}, data).ok());
  ASSERT_TRUE(writer.AddTensor("b", GgmlType::kF16, {3}, PatternBytes(6, 2)).ok());
  auto bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();

  Image want = Header(2, 2);
  want.Str("n").U32(4).U32(9);
  want.Str("s").U32(8).Str("hi");
  TensorInfo(want, "w", {2}, 0, 0);
  TensorInfo(want, "b", {3}, 1, 32);
  want.PadTo(32).Pattern(8, 1).Zeros(24).Pattern(6, 2).Zeros(26);
  EXPECT_EQ(*bytes, want.bytes);
}

TEST(GgufWriter, RoundTripKeepsEveryTypeShapeAndByte) {
  const std::vector<std::byte> bytes = RoundTripFile();
  auto parsed = GgufFile::Parse(bytes, "roundtrip.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const GgufFile& f = **parsed;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.size_bytes(), bytes.size());

  const std::vector<GgufKeyValue> want = EveryMetadataType();
  ASSERT_EQ(f.metadata().size(), want.size() + 1);
  EXPECT_EQ(f.metadata()[0].key, "general.alignment");
  EXPECT_EQ(*f.GetUint("general.alignment"), 64u);
  for (size_t i = 0; i < want.size(); ++i) {
    const GgufKeyValue& got = f.metadata()[i + 1];
    EXPECT_EQ(got.key, want[i].key);
    GgufValue expected = want[i].value;
    if (expected.type == GgufType::kF32) expected.f = static_cast<float>(expected.f);
    if (expected.element_type == GgufType::kF32) {
      for (double& x : expected.floats) x = static_cast<float>(x);
    }
    EXPECT_TRUE(SameValue(got.value, expected)) << got.key;
    EXPECT_EQ(f.Find(want[i].key), &got.value);
  }

  ASSERT_EQ(f.tensors().size(), OddTensors().size());
  uint8_t salt = 0;
  uint64_t offset = 0;
  for (size_t i = 0; i < OddTensors().size(); ++i) {
    const TensorSpec& spec = OddTensors()[i];
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.name, spec.name);
    EXPECT_EQ(t.type, spec.type);
    EXPECT_EQ(t.dims, spec.dims);
    EXPECT_EQ(t.offset, offset) << spec.name;
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(f.FindTensor(spec.name), &t);
    const std::vector<std::byte> data = PatternBytes(spec.n_bytes, ++salt);
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), data.begin(), data.end())) << spec.name;
    offset += (spec.n_bytes + 63) / 64 * 64;
  }
  EXPECT_EQ(f.FindTensor("absent"), nullptr);
  EXPECT_EQ(f.Find("absent"), nullptr);

  // Writing the parsed file back gives the same bytes.
  GgufWriter again(64);
  for (const GgufKeyValue& kv : f.metadata()) again.Set(kv.key, kv.value);
  for (const GgufTensor& t : f.tensors()) {
    ASSERT_TRUE(again.AddTensor(t.name, t.type, t.dims, t.data).ok());
  }
  auto rewritten = again.Serialize();
  ASSERT_TRUE(rewritten.ok());
  EXPECT_EQ(*rewritten, bytes);
}

TEST(GgufWriter, WriteProducesSerializeBytesAndOpenMapsThem) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("argus_gguf_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.gguf").string();
  GgufWriter writer(64);
  for (const GgufKeyValue& kv : EveryMetadataType()) writer.Set(kv.key, kv.value);
  uint8_t salt = 0;
  for (const TensorSpec& t : OddTensors()) {
    ASSERT_TRUE(writer.AddTensor(t.name, t.type, t.dims, PatternBytes(t.n_bytes, ++salt)).ok());
  }
  ASSERT_TRUE(writer.Write(path).ok());
  auto on_disk = ReadFileBytes(path);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_EQ(*on_disk, RoundTripFile());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator{}),
            1);  // no temporary file is left

  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const GgufTensor* t = (*opened)->FindTensor("q4_K.256x2");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->data.size(), 288u);
  EXPECT_EQ(std::to_integer<uint8_t>(t->data[1]), 7 + 5);  // PatternBytes(288, 5)[1]
  std::filesystem::remove_all(dir);
}

TEST(GgufWriter, WriteIntoMissingDirectoryIsIOErrorNamingThePath) {
  GgufWriter writer;
  writer.SetU32("x", 1);
  Status s = writer.Write("/nonexistent/dir/out.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("/nonexistent/dir/out.gguf"), std::string::npos);
}

TEST(GgufWriter, BadTensorsAndValuesAreInvalidArgument) {
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("a", GgmlType::kF32, {4}, PatternBytes(16, 0)).ok());
  auto expect_invalid = [](Status s, std::string_view part) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  };
  expect_invalid(writer.AddTensor("a", GgmlType::kF32, {4}, PatternBytes(16, 0)), "'a'");
  expect_invalid(writer.AddTensor("t", static_cast<GgmlType>(4), {4}, PatternBytes(16, 0)), "4");
  expect_invalid(writer.AddTensor("t", GgmlType::kQ8_0, {16}, PatternBytes(17, 0)), "multiple");
  expect_invalid(writer.AddTensor("t", GgmlType::kF32, {}, PatternBytes(0, 0)), "dimensions");
  expect_invalid(writer.AddTensor("t", GgmlType::kF32, {1, 1, 1, 1, 1}, PatternBytes(4, 0)),
                 "dimensions");
  expect_invalid(writer.AddTensor("t", GgmlType::kF32, {4, 0}, PatternBytes(0, 0)), "0");
  expect_invalid(writer.AddTensor("t", GgmlType::kF32, {4}, PatternBytes(15, 0)), "16");
  expect_invalid(writer.AddTensor("t", GgmlType::kF32, {uint64_t{1} << 62, 8},
                                  [](std::span<std::byte>) { return Status::Ok(); }),
                 "overflow");

  GgufWriter range;
  range.Set("small", Scalar(GgufType::kU8, 256));
  expect_invalid(range.Serialize().status(), "small");
  GgufWriter negative;
  negative.Set("neg", Array(GgufType::kU32, {1, -1}));
  expect_invalid(negative.Serialize().status(), "neg");
  GgufWriter mixed;
  mixed.Set("mixed", Array(GgufType::kU32, {1}, {2.0}));
  expect_invalid(mixed.Serialize().status(), "mixed");
  expect_invalid(GgufWriter(48).Serialize().status(), "48");
  GgufWriter disagree(64);
  disagree.SetU32("general.alignment", 32);
  expect_invalid(disagree.Serialize().status(), "general.alignment");
}

TEST(GgufWriter, FillErrorIsReturnedNamingTheTensor) {
  GgufWriter writer;
  ASSERT_TRUE(writer
                  .AddTensor("broken", GgmlType::kF32, {4},
                             [](std::span<std::byte>) { return Status::IOError("source gone"); })
                  .ok());
  auto bytes = writer.Serialize();
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), StatusCode::kIOError);
  EXPECT_NE(bytes.status().message().find("broken"), std::string::npos);
  EXPECT_NE(bytes.status().message().find("source gone"), std::string::npos);
}

// ---- typed getters ------------------------------------------------------------------------

TEST(Gguf, TypedGettersConvertIntegersAndNameKeyAndTypesOtherwise) {
  GgufWriter writer;
  writer.SetU32("u32", 7);
  writer.SetI32("neg", -3);
  writer.SetI32("pos", 5);
  writer.SetF32("f32", 1.5f);
  writer.SetBool("flag", true);
  writer.SetString("name", "x");
  writer.SetStrings("list", {"a", "b"});
  writer.Set("big", Scalar(GgufType::kU64, std::numeric_limits<uint64_t>::max()));
  writer.Set("f64", Scalar(GgufType::kF64, 0, 0, 0.25));
  auto bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok());
  auto parsed = GgufFile::Parse(*bytes, "getters.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const GgufFile& f = **parsed;
  EXPECT_EQ(*f.GetUint("u32"), 7u);
  EXPECT_EQ(*f.GetInt("u32"), 7);
  EXPECT_EQ(*f.GetInt("neg"), -3);
  EXPECT_EQ(*f.GetUint("pos"), 5u);
  EXPECT_EQ(*f.GetUint("big"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f.GetFloat("f32"), 1.5);
  EXPECT_EQ(*f.GetFloat("f64"), 0.25);
  EXPECT_TRUE(*f.GetBool("flag"));
  EXPECT_EQ(*f.GetString("name"), "x");
  EXPECT_EQ((*f.GetArray("list"))->strings, (std::vector<std::string>{"a", "b"}));

  auto expect = [](Status s, StatusCode code, std::vector<std::string_view> parts) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    for (std::string_view part : parts) {
      EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
    }
  };
  expect(f.GetString("missing").status(), StatusCode::kNotFound, {"getters.gguf", "'missing'"});
  expect(f.GetUint("neg").status(), StatusCode::kInvalidArgument, {"'neg'", "i32", "-3"});
  expect(f.GetInt("big").status(), StatusCode::kInvalidArgument, {"'big'", "u64"});
  expect(f.GetFloat("u32").status(), StatusCode::kInvalidArgument, {"'u32'", "u32", "float"});
  expect(f.GetString("u32").status(), StatusCode::kInvalidArgument, {"'u32'", "string"});
  expect(f.GetBool("u32").status(), StatusCode::kInvalidArgument, {"'u32'", "bool"});
  expect(f.GetUint("flag").status(), StatusCode::kInvalidArgument, {"'flag'", "bool"});
  expect(f.GetArray("name").status(), StatusCode::kInvalidArgument, {"'name'", "array"});
  expect(f.GetUint("list").status(), StatusCode::kInvalidArgument, {"'list'", "array of string"});
}

// ---- hostile images ------------------------------------------------------------------------

TEST(GgufHostile, HandWrittenValidImageParses) {  // the base the cases below corrupt
  auto file = GgufFile::Parse(ValidSmallImage().bytes);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->tensors()[0].data.size(), 32u);
  EXPECT_EQ((*file)->name(), "<memory>");
}

TEST(GgufHostile, TruncationAtEveryByteIsCorruption) {
  GgufWriter writer;
  writer.SetString("general.architecture", "llama");
  writer.SetStrings("tokens", {"a", "bc", ""});
  writer.SetF32s("scores", {1, 2});
  writer.SetBool("flag", false);
  writer.SetU32("general.alignment", 32);
  ASSERT_TRUE(writer.AddTensor("q", GgmlType::kQ8_0, {32, 2}, PatternBytes(68, 1)).ok());
  ASSERT_TRUE(writer.AddTensor("last", GgmlType::kF32, {8}, PatternBytes(32, 2)).ok());
  auto bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(GgufFile::Parse(*bytes).ok());
  // The last tensor fills its aligned slot, so the file ends with tensor data, not padding.
  ASSERT_EQ(bytes->size() % 32, 0u);
  for (size_t n = 0; n < bytes->size(); ++n) {
    auto file = GgufFile::Parse(std::span(*bytes).first(n), "cut.gguf");
    ASSERT_FALSE(file.ok()) << "a prefix of " << n << " bytes parsed";
    ASSERT_EQ(file.status().code(), StatusCode::kCorruption) << file.status().ToString();
    ASSERT_NE(file.status().message().find("cut.gguf: "), std::string::npos);
  }
}

TEST(GgufHostile, TruncatedStringNamesKeyFieldAndOffset) {
  Image img = Header(0, 1);
  img.Str("general.name").U32(8).U64(100).Str("short");
  ExpectError(img.bytes, StatusCode::kCorruption,
              {"metadata 0 ('general.name')", "at byte offset 48", "string length 100",
               "past the end of the file"});
}

TEST(GgufHostile, AbsurdCountsAndLengthsAreCorruptionNotAllocation) {
  const uint64_t k62 = uint64_t{1} << 62;
  ExpectError(Header(k62, 0).bytes, StatusCode::kCorruption, {"tensor count", "byte offset 8"});
  ExpectError(Header(0, k62).bytes, StatusCode::kCorruption, {"metadata count", "byte offset 16"});
  ExpectError(Header(std::numeric_limits<uint64_t>::max(), 0).bytes, StatusCode::kCorruption,
              {"tensor count", "overflow"});

  Image key = Header(0, 1);
  key.U64(uint64_t{1} << 63).Zeros(16);
  ExpectError(key.bytes, StatusCode::kCorruption, {"key", "9223372036854775808"});

  Image value = Header(0, 1);
  value.Str("k").U32(8).U64(uint64_t{1} << 40).Str("tail");
  ExpectError(value.bytes, StatusCode::kCorruption, {"('k')", "1099511627776"});

  Image u32s = Header(0, 1);
  u32s.Str("a").U32(9).U32(4).U64(uint64_t{1} << 61).U32(1);
  ExpectError(u32s.bytes, StatusCode::kCorruption,
              {"('a')", "array length", "2305843009213693952"});

  Image u64s = Header(0, 1);
  u64s.Str("a").U32(9).U32(10).U64(uint64_t{1} << 61).U64(1);
  ExpectError(u64s.bytes, StatusCode::kCorruption, {"('a')", "array length", "overflow"});

  Image u8s = Header(0, 1);
  u8s.Str("a").U32(9).U32(0).U64(uint64_t{1} << 60).U8(1);
  ExpectError(u8s.bytes, StatusCode::kCorruption, {"('a')", "array length"});

  Image strings = Header(0, 1);
  strings.Str("a").U32(9).U32(8).U64(uint64_t{1} << 59).Str("x");
  ExpectError(strings.bytes, StatusCode::kCorruption, {"('a')", "array length"});

  Image name = Header(1, 0);
  name.U64(uint64_t{1} << 63).Zeros(40);
  ExpectError(name.bytes, StatusCode::kCorruption, {"tensor info 0", "name"});
}

TEST(GgufHostile, BadDimensionsAreCorruption) {
  auto with_dims = [](uint32_t n_dims, std::vector<uint64_t> dims) {
    Image img = Header(1, 0);
    img.Str("t").U32(n_dims);
    for (uint64_t d : dims) img.U64(d);
    img.U32(0).U64(0).PadTo(32).Zeros(64);
    return img.bytes;
  };
  ExpectError(with_dims(0, {}), StatusCode::kCorruption, {"('t')", "n_dims", "0 dimensions"});
  ExpectError(with_dims(5, {1, 1, 1, 1, 1}), StatusCode::kCorruption, {"n_dims", "5 dimensions"});
  ExpectError(with_dims(2, {4, 0}), StatusCode::kCorruption, {"('t')", "dim 1 is 0"});
  const uint64_t k32 = uint64_t{1} << 32;
  ExpectError(with_dims(3, {k32, k32, k32}), StatusCode::kCorruption, {"('t')", "overflow"});
  ExpectError(with_dims(2, {k32, uint64_t{1} << 31}), StatusCode::kCorruption,
              {"('t')", "9223372036854775808", "int64"});
  // Fits in int64 as a count, but not in bytes.
  ExpectError(with_dims(2, {k32, uint64_t{1} << 30}), StatusCode::kCorruption,
              {"('t')", "overflow"});
}

TEST(GgufHostile, UnknownTypesAndNestedArraysAreErrors) {
  Image meta = Header(0, 1);
  meta.Str("k").U32(13).U32(0);
  ExpectError(meta.bytes, StatusCode::kCorruption, {"('k')", "unknown metadata value type 13"});

  Image element = Header(0, 1);
  element.Str("k").U32(9).U32(99).U64(0);
  ExpectError(element.bytes, StatusCode::kCorruption, {"('k')", "value type 99"});

  Image nested = Header(0, 1);
  nested.Str("k").U32(9).U32(9).U64(1).U32(0).U64(0);
  ExpectError(nested.bytes, StatusCode::kUnsupported, {"('k')", "nested arrays"});

  Image ggml = Header(1, 0);
  TensorInfo(ggml, "blk.0.w", {32}, 39, 0);
  ggml.PadTo(32).Zeros(128);
  ExpectError(ggml.bytes, StatusCode::kUnsupported, {"('blk.0.w')", "ggml type id 39"});

  Image row = Header(1, 0);
  TensorInfo(row, "w", {16, 2}, 8, 0);  // q8_0 rows hold whole blocks of 32
  row.PadTo(32).Zeros(128);
  ExpectError(row.bytes, StatusCode::kCorruption, {"('w')", "ne[0] = 16", "q8_0", "32"});
}

TEST(GgufHostile, BadAlignmentIsCorruption) {
  auto with_alignment = [](uint32_t type, uint64_t value, size_t value_bytes) {
    Image img = Header(0, 1);
    img.Str("general.alignment").U32(type);
    for (size_t b = 0; b < value_bytes; ++b) img.U8(static_cast<uint8_t>(value >> (8 * b)));
    return img.bytes;
  };
  ExpectError(with_alignment(4, 0, 4), StatusCode::kCorruption, {"alignment 0", "power of two"});
  ExpectError(with_alignment(4, 3, 4), StatusCode::kCorruption, {"alignment 3", "power of two"});
  ExpectError(with_alignment(10, 64, 8), StatusCode::kCorruption, {"must be a u32", "u64"});
  ExpectError(with_alignment(5, 64, 4), StatusCode::kCorruption, {"must be a u32", "i32"});
  auto ok = GgufFile::Parse(with_alignment(4, 1, 4));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->alignment(), 1u);
}

TEST(GgufHostile, MisplacedTensorDataIsCorruption) {
  Image unaligned = Header(1, 0);
  TensorInfo(unaligned, "t", {4}, 0, 16);
  unaligned.PadTo(32).Zeros(64);
  ExpectError(unaligned.bytes, StatusCode::kCorruption, {"('t')", "offset 16", "alignment 32"});

  Image past_end = Header(2, 0);
  TensorInfo(past_end, "a", {8}, 0, 0);
  TensorInfo(past_end, "blk.0.attn_q.weight", {64, 64}, 0, 32);
  past_end.PadTo(32).Zeros(1000);
  ExpectError(past_end.bytes, StatusCode::kCorruption,
              {"tensor info 1 ('blk.0.attn_q.weight')", "[offset 32, 16384 bytes]",
               "past the end of the file (" + std::to_string(past_end.bytes.size()) + " bytes)"});

  Image huge_offset = Header(1, 0);
  TensorInfo(huge_offset, "t", {8}, 0, std::numeric_limits<uint64_t>::max() / 32 * 32);
  huge_offset.PadTo(32).Zeros(32);
  ExpectError(huge_offset.bytes, StatusCode::kCorruption, {"('t')", "past the end of the file"});

  Image overlap = Header(3, 0);
  TensorInfo(overlap, "a", {16}, 0, 0);   // [0, 64)
  TensorInfo(overlap, "b", {8}, 0, 128);  // [128, 160)
  TensorInfo(overlap, "c", {8}, 0, 32);   // [32, 64) inside a
  overlap.PadTo(32).Zeros(160);
  ExpectError(overlap.bytes, StatusCode::kCorruption,
              {"tensor info 2 ('c')", "overlaps tensor info 0 ('a')"});

  Image same_offset = Header(2, 0);
  TensorInfo(same_offset, "a", {8}, 0, 0);
  TensorInfo(same_offset, "b", {8}, 0, 0);
  same_offset.PadTo(32).Zeros(32);
  ExpectError(same_offset.bytes, StatusCode::kCorruption, {"overlaps"});
}

TEST(GgufHostile, DuplicateKeysAndTensorNamesAreCorruption) {
  Image keys = Header(0, 2);
  keys.Str("k").U32(4).U32(1).Str("k").U32(4).U32(2);
  ExpectError(keys.bytes, StatusCode::kCorruption, {"metadata 1 ('k')", "duplicate key"});

  Image names = Header(2, 0);
  TensorInfo(names, "w", {8}, 0, 0);
  TensorInfo(names, "w", {8}, 0, 32);
  names.PadTo(32).Zeros(64);
  ExpectError(names.bytes, StatusCode::kCorruption,
              {"tensor info 1 ('w')", "duplicate tensor name", "tensor info 0"});
}

TEST(GgufHostile, BadMagicAndVersionsAreErrors) {
  std::vector<std::byte> magic = ValidSmallImage().bytes;
  magic[3] = std::byte{'G'};
  ExpectError(magic, StatusCode::kCorruption, {"magic", "byte offset 0", "not a GGUF file"});

  Image v1 = Header(0, 0, 1);
  ExpectError(v1.bytes, StatusCode::kUnsupported, {"version 1", "32-bit counts"});
  ExpectError(Header(0, 0, 99).bytes, StatusCode::kUnsupported, {"version 99"});
  ExpectError(Header(0, 0, 0x03000000).bytes, StatusCode::kUnsupported, {"big-endian"});
  ExpectError({}, StatusCode::kCorruption, {"magic", "needs 4 bytes"});
  auto v2 = GgufFile::Parse(Header(0, 0, 2).bytes);
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ((*v2)->version(), 2u);
}

TEST(GgufHostile, BadValuesAreErrors) {
  Image scalar = Header(0, 1);
  scalar.Str("flag").U32(7).U8(2);
  ExpectError(scalar.bytes, StatusCode::kCorruption, {"('flag')", "bool value", "2 is not 0 or 1"});

  Image element = Header(0, 1);
  element.Str("flags").U32(9).U32(7).U64(3).U8(1).U8(0).U8(5);
  ExpectError(element.bytes, StatusCode::kCorruption, {"('flags') element 2", "5 is not 0 or 1"});

  Image big = Header(0, 1);
  big.Str("ids").U32(9).U32(10).U64(2).U64(1).U64(uint64_t{1} << 63);
  ExpectError(big.bytes, StatusCode::kUnsupported, {"('ids') element 1", "INT64_MAX"});
}

TEST(GgufHostile, RandomBitFlipsNeverCrash) {
  const std::vector<std::byte> valid = RoundTripFile();
  std::mt19937_64 rng(testing::TestSeed());
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<std::byte> bytes = valid;
    // Mostly the header, metadata and tensor infos, where a flip changes the structure.
    const size_t span = trial % 4 == 0 ? bytes.size() : std::min<size_t>(bytes.size(), 1200);
    for (int flip = 0; flip < 1 + trial % 3; ++flip) {
      bytes[rng() % span] ^= static_cast<std::byte>(1u << (rng() % 8));
    }
    auto file = GgufFile::Parse(bytes);
    if (file.ok()) {
      EXPECT_GT(TouchEverything(**file), 0u);
    } else {
      EXPECT_FALSE(file.status().message().empty());
    }
  }
}

// ---- fuzzing corpus -----------------------------------------------------------------------

// Every file in tests/fuzz/corpus/gguf and tests/fuzz/regress/gguf parses or fails cleanly. The
// seed corpus (written by scripts/gguf_seed_corpus.py) holds small files, each valid unless its
// name says invalid_.
TEST(GgufFuzz, SeedsParseAsNamedAndNoCorpusOrRegressInputCrashes) {
  namespace fs = std::filesystem;
  size_t n_seeds = 0;
  for (const char* dir : {"tests/fuzz/corpus/gguf", "tests/fuzz/regress/gguf"}) {
    const fs::path path = fs::path(ARGUS_SOURCE_DIR) / dir;
    if (!fs::is_directory(path)) continue;
    const bool seeds = path.parent_path().filename() == "corpus";
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string name = entry.path().filename().string();
      auto bytes = ReadFileBytes(entry.path().string());
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      auto file = GgufFile::Parse(*bytes, name);
      if (file.ok()) {
        EXPECT_GT(TouchEverything(**file), 0u);
      }
      if (!seeds) continue;
      ++n_seeds;
      EXPECT_EQ(file.ok(), name.rfind("invalid_", 0) != 0)
          << name << ": " << (file.ok() ? "parsed" : file.status().ToString());
      EXPECT_LE(bytes->size(), 4096u) << name;
    }
  }
  EXPECT_GE(n_seeds, 12u) << "the seed corpus is missing: run scripts/gguf_seed_corpus.py";
}

}  // namespace
}  // namespace argus
