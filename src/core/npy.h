// Internal: NumPy .npy file I/O (the CLI's and the tests' exchange format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/status.h"

namespace argus {

enum class NpyType : uint8_t { kFloat32, kFloat16, kUint8 };

// An array read from or written to a NumPy .npy file (format versions 1.0-3.0, little-endian,
// C order). data holds n_values() elements of `type`.
struct NpyArray {
  NpyType type = NpyType::kFloat32;
  std::vector<size_t> shape;
  std::vector<std::byte> data;

  size_t n_values() const;
  // The values as float32 (float16 and uint8 are converted).
  std::vector<float> ToFloat() const;
  static NpyArray FromFloat(std::vector<size_t> shape, std::span<const float> values);
};

// Errors name the file and what is wrong (bad magic, unsupported dtype or order, a header
// that lies about the size, a truncated file).
Result<NpyArray> ReadNpy(const std::string& path);
Result<NpyArray> ParseNpy(std::span<const std::byte> bytes, std::string_view name);
Status WriteNpy(const std::string& path, const NpyArray& array);
std::string NpyShapeText(const std::vector<size_t>& shape);  // "[4, 2, 64]", for messages

}  // namespace argus
