// NumPy .npy files: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
// Only little-endian, C-order float32 / float16 / uint8 arrays; everything else is a clear error.
#include "core/npy.h"

#include <cstring>
#include <string>

#include "argus/core.h"
#include "core/checked.h"
#include "core/files.h"

namespace argus {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

size_t ElementSize(NpyType type) {
  switch (type) {
    case NpyType::kFloat32:
      return 4;
    case NpyType::kFloat16:
      return 2;
    case NpyType::kUint8:
      return 1;
  }
  return 1;
}

const char* Descr(NpyType type) {
  switch (type) {
    case NpyType::kFloat32:
      return "<f4";
    case NpyType::kFloat16:
      return "<f2";
    case NpyType::kUint8:
      return "|u1";
  }
  return "";
}

// The value that follows 'key': in the header dict, with surrounding blanks removed.
Result<std::string> DictValue(std::string_view header, std::string_view key,
                              std::string_view name) {
  std::string quoted = "'" + std::string(key) + "'";
  size_t at = header.find(quoted);
  if (at == std::string_view::npos) {
    return Status::Corruption(std::string(name) + ": .npy header has no '" + std::string(key) +
                              "'");
  }
  size_t colon = header.find(':', at + quoted.size());
  if (colon == std::string_view::npos) {
    return Status::Corruption(std::string(name) + ": .npy header entry '" + std::string(key) +
                              "' has no value");
  }
  size_t begin = header.find_first_not_of(' ', colon + 1);
  if (begin == std::string_view::npos) {
    return Status::Corruption(std::string(name) + ": .npy header entry '" + std::string(key) +
                              "' has no value");
  }
  size_t end;
  if (header[begin] == '(') {
    end = header.find(')', begin);
    if (end == std::string_view::npos)
      return Status::Corruption(std::string(name) + ": .npy shape is not closed");
    ++end;
  } else {
    end = header.find_first_of(",}", begin);
    if (end == std::string_view::npos) end = header.size();
  }
  std::string value(header.substr(begin, end - begin));
  while (!value.empty() && value.back() == ' ') value.pop_back();
  return value;
}

Result<std::vector<size_t>> ParseShape(std::string_view text, std::string_view name) {
  // "(3, 4)", "(5,)", "()"
  std::vector<size_t> shape;
  size_t i = 1;
  while (i + 1 < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i + 1 >= text.size()) break;
    if (text[i] < '0' || text[i] > '9') {
      return Status::Corruption(std::string(name) + ": .npy shape " + std::string(text) +
                                " is malformed");
    }
    size_t value = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      ARGUS_ASSIGN_OR_RETURN(value, CheckedMul(value, 10, std::string(name) + ": .npy shape"));
      ARGUS_ASSIGN_OR_RETURN(value, CheckedAdd(value, static_cast<size_t>(text[i] - '0'),
                                               std::string(name) + ": .npy shape"));
      ++i;
    }
    shape.push_back(value);
    if (shape.size() > 32)
      return Status::Corruption(std::string(name) + ": .npy shape has more than 32 dimensions");
  }
  return shape;
}

}  // namespace

size_t NpyArray::n_values() const {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  return n;
}

std::string NpyShapeText(const std::vector<size_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<float> NpyArray::ToFloat() const {
  size_t n = n_values();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (type) {
      case NpyType::kFloat32:
        std::memcpy(&out[i], data.data() + 4 * i, 4);
        break;
      case NpyType::kFloat16: {
        uint16_t h;
        std::memcpy(&h, data.data() + 2 * i, 2);
        out[i] = HalfToFloat(h);
        break;
      }
      case NpyType::kUint8:
        out[i] = static_cast<float>(std::to_integer<uint8_t>(data[i]));
        break;
    }
  }
  return out;
}

NpyArray NpyArray::FromFloat(std::vector<size_t> shape, std::span<const float> values) {
  NpyArray a;
  a.type = NpyType::kFloat32;
  a.shape = std::move(shape);
  a.data.resize(values.size() * 4);
  std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

Result<NpyArray> ParseNpy(std::span<const std::byte> bytes, std::string_view name) {
  const std::string n(name);
  if (bytes.size() < kMagicSize + 4 || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0) {
    return Status::Corruption(n + ": not a .npy file (bad magic)");
  }
  auto u8 = [&](size_t i) { return std::to_integer<uint32_t>(bytes[i]); };
  uint32_t major = u8(6);
  size_t header_len, header_at;
  if (major == 1) {
    header_len = u8(8) | (u8(9) << 8);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Status::Corruption(n + ": truncated .npy header");
    header_len = u8(8) | (u8(9) << 8) | (u8(10) << 16) | (size_t{u8(11)} << 24);
    header_at = 12;
  } else {
    return Status::Unsupported(n + ": .npy format version " + std::to_string(major) +
                               " is not supported");
  }
  if (header_len > bytes.size() - header_at)
    return Status::Corruption(n + ": truncated .npy header");
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + header_at), header_len);

  NpyArray array;
  ARGUS_ASSIGN_OR_RETURN(std::string descr, DictValue(header, "descr", name));
  if (descr == "'<f4'") {
    array.type = NpyType::kFloat32;
  } else if (descr == "'<f2'") {
    array.type = NpyType::kFloat16;
  } else if (descr == "'|u1'" || descr == "'<u1'") {
    array.type = NpyType::kUint8;
  } else {
    return Status::Unsupported(n + ": .npy dtype " + descr +
                               " is not supported (float32, float16, uint8)");
  }
  ARGUS_ASSIGN_OR_RETURN(std::string order, DictValue(header, "fortran_order", name));
  if (order != "False")
    return Status::Unsupported(n + ": Fortran-order .npy arrays are not supported");
  ARGUS_ASSIGN_OR_RETURN(std::string shape_text, DictValue(header, "shape", name));
  ARGUS_ASSIGN_OR_RETURN(array.shape, ParseShape(shape_text, name));

  size_t n_bytes = ElementSize(array.type);
  for (size_t d : array.shape) {
    ARGUS_ASSIGN_OR_RETURN(n_bytes, CheckedMul(n_bytes, d, n + ": .npy shape"));
  }
  size_t data_at = header_at + header_len;
  if (bytes.size() - data_at != n_bytes) {
    return Status::Corruption(n + ": .npy data is " + std::to_string(bytes.size() - data_at) +
                              " bytes, the header's shape needs " + std::to_string(n_bytes));
  }
  array.data.assign(bytes.begin() + static_cast<ptrdiff_t>(data_at), bytes.end());
  return array;
}

Result<NpyArray> ReadNpy(const std::string& path) {
  ARGUS_ASSIGN_OR_RETURN(auto bytes, ReadFileBytes(path));
  return ParseNpy(bytes, path);
}

Status WriteNpy(const std::string& path, const NpyArray& array) {
  size_t expected = array.n_values() * ElementSize(array.type);
  if (array.data.size() != expected) {
    return Status::InvalidArgument(path + ": array holds " + std::to_string(array.data.size()) +
                                   " bytes, its shape needs " + std::to_string(expected));
  }
  std::string header =
      std::string("{'descr': '") + Descr(array.type) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < array.shape.size(); ++i)
    header += std::to_string(array.shape[i]) +
              (array.shape.size() == 1 ? "," : (i + 1 < array.shape.size() ? ", " : ""));
  header += "), }";
  // Pad with spaces and a newline so the data starts on a 64-byte boundary.
  size_t total = kMagicSize + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::vector<std::byte> out;
  out.reserve(kMagicSize + 4 + header.size() + array.data.size());
  for (size_t i = 0; i < kMagicSize; ++i) out.push_back(static_cast<std::byte>(kMagic[i]));
  out.push_back(std::byte{1});
  out.push_back(std::byte{0});
  out.push_back(static_cast<std::byte>(header.size() & 0xff));
  out.push_back(static_cast<std::byte>(header.size() >> 8));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), array.data.begin(), array.data.end());
  return WriteFileBytes(path, out);
}

}  // namespace argus
