// GGUF v3 model files: a bounds-checked reader and a streaming writer.
//
// The format (ggml's docs/gguf.md): a header (magic "GGUF", version, tensor count, metadata
// count), metadata key/value pairs, tensor infos (name, dims, ggml type, offset), padding to
// `general.alignment` (default 32), then the tensor data. Every count, string length, offset and
// tensor extent read from a file is checked against the bytes that remain before anything is
// allocated or read: a truncated, corrupt or hostile file is an error naming the field and its
// byte offset, never a crash or an out-of-bounds read.
//
// GgufFile is immutable after Open/Parse and thread-safe for reads. Tensor data spans point into
// the file's memory map (Open) or the caller's image (Parse) and live as long as the GgufFile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/status.h"

namespace argus {

// Metadata value types, numbered as in the file (append only).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view GgufTypeName(GgufType type);  // "u32", "string", ...; "unknown" otherwise

// ggml tensor types, numbered as in the file (append only). The reader knows the block shape of
// every type listed here (so it can check any tensor's extent); the model runner computes with
// F32, F16, BF16, Q8_0 and Q4_0.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

struct GgmlTypeInfo {
  std::string_view name;      // "f32", "q8_0", ...
  uint32_t block_values = 0;  // values per block (1 for plain types)
  uint32_t block_bytes = 0;   // bytes per block
};
// InvalidArgument naming the type id when it is not a ggml type this reader knows.
Result<GgmlTypeInfo> GgmlTypeInfoOf(uint32_t type);

// A metadata value. Scalars use the member for their kind; arrays of scalars or strings keep
// their element type and the elements in the matching vector. Nested arrays are Unsupported.
struct GgufValue {
  GgufType type = GgufType::kU8;
  uint64_t u = 0;                         // kU8 kU16 kU32 kU64, and kBool (0 or 1)
  int64_t i = 0;                          // kI8 kI16 kI32 kI64
  double f = 0;                           // kF32 kF64
  std::string s;                          // kString
  GgufType element_type = GgufType::kU8;  // kArray only
  std::vector<int64_t> ints;         // arrays of integers or bools (u64 above INT64_MAX: error)
  std::vector<double> floats;        // arrays of f32/f64
  std::vector<std::string> strings;  // arrays of strings
  size_t array_size() const;         // elements of an array, 0 for a scalar
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> dims;  // ne[0] first: ne[0] is the contiguous (row) length
  uint64_t n_values = 0;
  uint64_t offset = 0;  // from the start of the data section, a multiple of the alignment
  std::span<const std::byte> data;  // exactly the tensor's bytes
  uint64_t n_rows() const;          // product of dims[1..]
};

class GgufFile {
 public:
  // Memory-maps the file read-only. IOError when it cannot be opened; Corruption or
  // InvalidArgument naming the field (and its byte offset) when it is not a valid GGUF v2/v3 file.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an image the caller owns and keeps alive for the GgufFile's lifetime (fuzzing, tests).
  // `name` appears in error messages.
  static Result<std::unique_ptr<GgufFile>> Parse(std::span<const std::byte> image,
                                                 std::string name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& name() const;  // the path, or the name given to Parse
  uint32_t version() const;
  uint64_t alignment() const;
  size_t size_bytes() const;  // of the whole image
  std::span<const std::byte> image() const;
  const std::vector<GgufKeyValue>& metadata() const;
  const std::vector<GgufTensor>& tensors() const;

  const GgufValue* Find(std::string_view key) const;  // nullptr when absent
  const GgufTensor* FindTensor(std::string_view name) const;

  // For bytes of the image the caller has copied elsewhere (a tensor repacked for the kernels):
  // on a file Open mapped, the pages wholly inside `bytes` leave this process's resident memory
  // (read from the file again if touched); on an image given to Parse, nothing.
  void ReleasePages(std::span<const std::byte> bytes) const;

  // Typed access: NotFound naming the key when absent, InvalidArgument naming the key and both
  // types when the stored type does not convert (integers of any width convert to an integer
  // that holds the value; f32/f64 to a double).
  Result<std::string> GetString(std::string_view key) const;
  Result<uint64_t> GetUint(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  // Arrays: InvalidArgument when the key holds something else.
  Result<const GgufValue*> GetArray(std::string_view key) const;

 private:
  GgufFile();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes GGUF v3 files. Tensor bytes are produced by a callback at write time, so a multi-GB
// model is written without holding it in memory. Not thread-safe.
class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32);

  // Metadata, written in the order set; setting a key again replaces its value in place.
  void Set(std::string key, GgufValue value);
  void SetString(std::string key, std::string value);
  void SetU32(std::string key, uint32_t value);
  void SetI32(std::string key, int32_t value);
  void SetF32(std::string key, float value);
  void SetBool(std::string key, bool value);
  void SetStrings(std::string key, std::vector<std::string> values);
  void SetF32s(std::string key, std::vector<float> values);
  void SetI32s(std::string key, std::vector<int32_t> values);

  // `fill` writes exactly the tensor's bytes (values / block_values * block_bytes) into `out`.
  using FillFn = std::function<Status(std::span<std::byte> out)>;
  // InvalidArgument for a duplicate name, an unknown type, or dims whose row length is not a
  // multiple of the type's block.
  Status AddTensor(std::string name, GgmlType type, std::vector<uint64_t> dims, FillFn fill);
  // Convenience: a tensor whose bytes are given (copied).
  Status AddTensor(std::string name, GgmlType type, std::vector<uint64_t> dims,
                   std::span<const std::byte> bytes);

  // Writes to `path` through a temporary file renamed into place, so a failed write never
  // leaves a partial file under the name. IOError/NoSpace name the path.
  Status Write(const std::string& path) const;
  // The whole file in memory (tests).
  Result<std::vector<std::byte>> Serialize() const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    uint64_t n_bytes;
    FillFn fill;
  };
  Status WriteTo(const std::function<Status(std::span<const std::byte>)>& sink) const;
  uint64_t alignment_;
  std::vector<GgufKeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace argus
