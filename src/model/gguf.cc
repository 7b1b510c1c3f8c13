// GGUF reader (ggml's docs/gguf.md, versions 2 and 3, little-endian).
//
// Every count and length read from the image is checked against the bytes that remain before it
// is used or allocated for, and every product or sum of such values goes through CheckedMul /
// CheckedAdd, so no image can make the reader allocate without bound or read out of bounds.
// Errors name the item (metadata i with its key, tensor info i with its name), the field and the
// byte offset where the field starts.
#include "argus/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/checked.h"
#include "core/string_map.h"
#include "model/gguf_types.h"

namespace argus {

using gguf::IsFloat;
using gguf::IsSigned;
using gguf::IsUnsigned;
using gguf::kDefaultAlignment;

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes little-endian");

std::string_view GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "unknown";
}

namespace {

struct GgmlTypeRow {
  GgmlType type;
  GgmlTypeInfo info;
};

// Block shapes from ggml's block_* structs in ggml-common.h (QK_K = 256).
constexpr GgmlTypeRow kGgmlTypes[] = {
    {GgmlType::kF32, {"f32", 1, 4}},
    {GgmlType::kF16, {"f16", 1, 2}},
    {GgmlType::kQ4_0, {"q4_0", 32, 18}},
    {GgmlType::kQ4_1, {"q4_1", 32, 20}},
    {GgmlType::kQ5_0, {"q5_0", 32, 22}},
    {GgmlType::kQ5_1, {"q5_1", 32, 24}},
    {GgmlType::kQ8_0, {"q8_0", 32, 34}},
    {GgmlType::kQ8_1, {"q8_1", 32, 36}},
    {GgmlType::kQ2_K, {"q2_K", 256, 84}},
    {GgmlType::kQ3_K, {"q3_K", 256, 110}},
    {GgmlType::kQ4_K, {"q4_K", 256, 144}},
    {GgmlType::kQ5_K, {"q5_K", 256, 176}},
    {GgmlType::kQ6_K, {"q6_K", 256, 210}},
    {GgmlType::kQ8_K, {"q8_K", 256, 292}},
    {GgmlType::kIQ2_XXS, {"iq2_xxs", 256, 66}},
    {GgmlType::kIQ2_XS, {"iq2_xs", 256, 74}},
    {GgmlType::kIQ3_XXS, {"iq3_xxs", 256, 98}},
    {GgmlType::kIQ1_S, {"iq1_s", 256, 50}},
    {GgmlType::kIQ4_NL, {"iq4_nl", 32, 18}},
    {GgmlType::kIQ3_S, {"iq3_s", 256, 110}},
    {GgmlType::kIQ2_S, {"iq2_s", 256, 82}},
    {GgmlType::kIQ4_XS, {"iq4_xs", 256, 136}},
    {GgmlType::kI8, {"i8", 1, 1}},
    {GgmlType::kI16, {"i16", 1, 2}},
    {GgmlType::kI32, {"i32", 1, 4}},
    {GgmlType::kI64, {"i64", 1, 8}},
    {GgmlType::kF64, {"f64", 1, 8}},
    {GgmlType::kIQ1_M, {"iq1_m", 256, 56}},
    {GgmlType::kBF16, {"bf16", 1, 2}},
    {GgmlType::kTQ1_0, {"tq1_0", 256, 54}},
    {GgmlType::kTQ2_0, {"tq2_0", 256, 66}},
};

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kMaxDims = 4;
// The smallest encodings, used to reject counts that cannot fit in the bytes that remain:
// a metadata pair is a key length, a type and at least one value byte; a tensor info is a name
// length, n_dims, one dim, a type and an offset.
constexpr size_t kMinMetadataBytes = 8 + 4 + 1;
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// Vectors sized from a declared count reserve at most this many entries up front and grow as
// entries actually parse, so memory stays proportional to the bytes read.
constexpr size_t kMaxReserve = 4096;

// Bytes a value of `type` takes in the file; for strings and arrays, the least they can take.
// 0 for an unknown type.
size_t MinValueBytes(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kString:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kArray:
      return 4 + 8;
  }
  return 0;
}


// A key or tensor name for an error message: at most 80 characters, non-printables as '?'.
std::string Printable(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out;
  for (char c : s.substr(0, kMax)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > kMax) out += "...";
  return out;
}

std::string TypeDescription(const GgufValue& v) {
  std::string d(GgufTypeName(v.type));
  if (v.type == GgufType::kArray) d += " of " + std::string(GgufTypeName(v.element_type));
  return d;
}

using NameIndex = StringMap<size_t>;

// A cursor over the image. Errors read "<file>: <item>: <field> at byte offset <at>: <problem>",
// where <item> is the metadata pair or tensor info being parsed (and the array element).
class Parser {
 public:
  Parser(std::span<const std::byte> image, const std::string& name) : image_(image), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return image_.size() - pos_; }
  void SetItem(std::string item) {
    item_ = std::move(item);
    element_ = -1;
  }
  void SetElement(int64_t element) { element_ = element; }

  Status Fail(StatusCode code, std::string_view field, size_t at, std::string_view problem) const {
    std::string m = name_ + ": " + item_;
    if (element_ >= 0) m += " element " + std::to_string(element_);
    m += ": " + std::string(field) + " at byte offset " + std::to_string(at) + ": " +
         std::string(problem);
    return Status(code, std::move(m));
  }
  Status Corrupt(std::string_view field, size_t at, std::string_view problem) const {
    return Fail(StatusCode::kCorruption, field, at, problem);
  }
  // A checked-arithmetic result, or Corruption naming the field it was computed for.
  Result<size_t> Checked(Result<size_t> r, std::string_view field, size_t at) const {
    if (r.ok()) return r;
    return Corrupt(field, at, r.status().message());
  }

  Status Need(size_t n_bytes, std::string_view field) const {
    if (n_bytes <= remaining()) return Status::Ok();
    return Corrupt(field, pos_,
                   "needs " + std::to_string(n_bytes) + " bytes, the file ends " +
                       std::to_string(remaining()) + " bytes later (file is " +
                       std::to_string(image_.size()) + " bytes)");
  }

  template <typename T>
  Result<T> Read(std::string_view field) {
    ARGUS_RETURN_IF_ERROR(Need(sizeof(T), field));
    T v;
    std::memcpy(&v, image_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> ReadString(std::string_view field) {
    const size_t at = pos_;
    ARGUS_ASSIGN_OR_RETURN(uint64_t n_bytes, Read<uint64_t>(field));
    if (n_bytes > remaining()) {
      return Corrupt(field, at,
                     "string length " + std::to_string(n_bytes) +
                         " runs past the end of the file (" + std::to_string(image_.size()) +
                         " bytes)");
    }
    std::string s(reinterpret_cast<const char*>(image_.data() + pos_), n_bytes);
    pos_ += n_bytes;
    return s;
  }

  // Reads one value of a scalar or string `type` into the member of `v` for that kind.
  Status ReadScalar(GgufType type, GgufValue& v) {
    const size_t at = pos_;
    switch (type) {
      case GgufType::kU8:
        return Assign<uint8_t>(v.u);
      case GgufType::kI8:
        return Assign<int8_t>(v.i);
      case GgufType::kU16:
        return Assign<uint16_t>(v.u);
      case GgufType::kI16:
        return Assign<int16_t>(v.i);
      case GgufType::kU32:
        return Assign<uint32_t>(v.u);
      case GgufType::kI32:
        return Assign<int32_t>(v.i);
      case GgufType::kU64:
        return Assign<uint64_t>(v.u);
      case GgufType::kI64:
        return Assign<int64_t>(v.i);
      case GgufType::kF32:
        return Assign<float>(v.f);
      case GgufType::kF64:
        return Assign<double>(v.f);
      case GgufType::kBool:
        ARGUS_RETURN_IF_ERROR(Assign<uint8_t>(v.u));
        if (v.u > 1) {
          return Corrupt("bool value", at, std::to_string(v.u) + " is not 0 or 1");
        }
        return Status::Ok();
      case GgufType::kString: {
        ARGUS_ASSIGN_OR_RETURN(v.s, ReadString("string"));
        return Status::Ok();
      }
      case GgufType::kArray:
        break;
    }
    return Status::Internal(name_ + ": " + item_ + ": ReadScalar of an array");
  }

  Result<GgufValue> ReadValue() {
    const size_t type_at = pos_;
    ARGUS_ASSIGN_OR_RETURN(uint32_t type, Read<uint32_t>("value type"));
    if (MinValueBytes(type) == 0) {
      return Corrupt("value type", type_at, "unknown metadata value type " + std::to_string(type));
    }
    GgufValue v;
    v.type = static_cast<GgufType>(type);
    if (v.type != GgufType::kArray) {
      ARGUS_RETURN_IF_ERROR(ReadScalar(v.type, v));
      return v;
    }
    const size_t element_type_at = pos_;
    ARGUS_ASSIGN_OR_RETURN(uint32_t element_type, Read<uint32_t>("array element type"));
    const size_t element_bytes = MinValueBytes(element_type);
    if (element_bytes == 0) {
      return Corrupt("array element type", element_type_at,
                     "unknown metadata value type " + std::to_string(element_type));
    }
    v.element_type = static_cast<GgufType>(element_type);
    if (v.element_type == GgufType::kArray) {
      return Fail(StatusCode::kUnsupported, "array element type", element_type_at,
                  "nested arrays are not supported");
    }
    const size_t length_at = pos_;
    ARGUS_ASSIGN_OR_RETURN(uint64_t n, Read<uint64_t>("array length"));
    ARGUS_ASSIGN_OR_RETURN(size_t min_bytes, Checked(CheckedMul(n, element_bytes, "array bytes"),
                                                     "array length", length_at));
    if (min_bytes > remaining()) {
      return Corrupt("array length", length_at,
                     std::to_string(n) + " elements of " +
                         std::string(GgufTypeName(v.element_type)) + " need at least " +
                         std::to_string(min_bytes) + " bytes, the file has " +
                         std::to_string(remaining()) + " left");
    }
    const size_t reserve = std::min<size_t>(n, kMaxReserve);
    if (v.element_type == GgufType::kString) {
      v.strings.reserve(reserve);
    } else if (IsFloat(v.element_type)) {
      v.floats.reserve(reserve);
    } else {
      v.ints.reserve(reserve);
    }
    GgufValue e;
    for (uint64_t k = 0; k < n; ++k) {
      SetElement(static_cast<int64_t>(k));
      const size_t at = pos_;
      ARGUS_RETURN_IF_ERROR(ReadScalar(v.element_type, e));
      if (v.element_type == GgufType::kString) {
        v.strings.push_back(std::move(e.s));
      } else if (IsFloat(v.element_type)) {
        v.floats.push_back(e.f);
      } else if (IsSigned(v.element_type)) {
        v.ints.push_back(e.i);
      } else {  // unsigned or bool
        if (e.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Fail(StatusCode::kUnsupported, "u64 value", at,
                      std::to_string(e.u) + " is above INT64_MAX, which arrays cannot hold");
        }
        v.ints.push_back(static_cast<int64_t>(e.u));
      }
    }
    element_ = -1;
    return v;
  }

 private:
  template <typename T, typename Member>
  Status Assign(Member& member) {
    ARGUS_ASSIGN_OR_RETURN(T v, Read<T>("value"));
    member = static_cast<Member>(v);
    return Status::Ok();
  }

  std::span<const std::byte> image_;
  const std::string& name_;
  size_t pos_ = 0;
  std::string item_ = "header";
  int64_t element_ = -1;
};

}  // namespace

Result<GgmlTypeInfo> GgmlTypeInfoOf(uint32_t type) {
  for (const GgmlTypeRow& row : kGgmlTypes) {
    if (static_cast<uint32_t>(row.type) == type) return row.info;
  }
  return Status::InvalidArgument("ggml type id " + std::to_string(type) +
                                 " is not a type this reader knows");
}

size_t GgufValue::array_size() const {
  if (type != GgufType::kArray) return 0;
  return ints.size() + floats.size() + strings.size();
}

uint64_t GgufTensor::n_rows() const {
  uint64_t n = 1;
  for (size_t d = 1; d < dims.size(); ++d) n *= dims[d];
  return n;
}

struct GgufFile::Impl {
  std::string name;
  std::span<const std::byte> image;
  void* map = nullptr;  // the memory map Open made, unmapped by the destructor
  size_t map_bytes = 0;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  std::vector<GgufKeyValue> metadata;
  std::vector<GgufTensor> tensors;
  NameIndex metadata_index;
  NameIndex tensor_index;

  ~Impl() {
    if (map != nullptr) ::munmap(map, map_bytes);
  }
  Status Parse();
  Status ParseHeader(Parser& p, uint64_t& n_tensors, uint64_t& n_metadata);
  Status ParseMetadata(Parser& p, uint64_t n_metadata);
  // Where each tensor info starts in the image and how many data bytes it declares.
  struct InfoPlace {
    size_t at;
    size_t n_bytes;
  };
  Status ParseTensorInfos(Parser& p, uint64_t n_tensors, std::vector<InfoPlace>& places);
  Status PlaceTensorData(Parser& p, const std::vector<InfoPlace>& places);
};

Status GgufFile::Impl::ParseHeader(Parser& p, uint64_t& n_tensors, uint64_t& n_metadata) {
  ARGUS_ASSIGN_OR_RETURN(uint32_t magic, p.Read<uint32_t>("magic"));
  if (std::memcmp(&magic, kMagic, sizeof kMagic) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    return p.Corrupt("magic", 0, std::string("not a GGUF file (bad magic ") + hex + ")");
  }
  ARGUS_ASSIGN_OR_RETURN(version, p.Read<uint32_t>("version"));
  if (version == 1) {
    return p.Fail(StatusCode::kUnsupported, "version", 4,
                  "GGUF version 1 (32-bit counts) is not supported; re-convert the model with a "
                  "current llama.cpp");
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    return p.Fail(StatusCode::kUnsupported, "version", 4,
                  "GGUF version " + std::to_string(version) + " is not supported (2 and 3 are)" +
                      (swapped == 2 || swapped == 3 ? "; a big-endian file?" : ""));
  }
  ARGUS_ASSIGN_OR_RETURN(n_tensors, p.Read<uint64_t>("tensor count"));
  ARGUS_ASSIGN_OR_RETURN(n_metadata, p.Read<uint64_t>("metadata count"));
  struct Count {
    std::string_view field;
    size_t at;
    uint64_t n;
    size_t min_bytes;
  };
  for (const Count& c : {Count{"tensor count", 8, n_tensors, kMinTensorInfoBytes},
                         Count{"metadata count", 16, n_metadata, kMinMetadataBytes}}) {
    ARGUS_ASSIGN_OR_RETURN(size_t n_bytes,
                           p.Checked(CheckedMul(c.n, c.min_bytes, c.field), c.field, c.at));
    if (n_bytes > p.remaining()) {
      return p.Corrupt(c.field, c.at,
                       "declares " + std::to_string(c.n) + " entries, which need at least " +
                           std::to_string(n_bytes) + " bytes; the file has " +
                           std::to_string(p.remaining()) + " left");
    }
  }
  return Status::Ok();
}

Status GgufFile::Impl::ParseMetadata(Parser& p, uint64_t n_metadata) {
  metadata.reserve(std::min<size_t>(n_metadata, kMaxReserve));
  for (uint64_t i = 0; i < n_metadata; ++i) {
    p.SetItem("metadata " + std::to_string(i));
    const size_t key_at = p.pos();
    ARGUS_ASSIGN_OR_RETURN(std::string key, p.ReadString("key"));
    p.SetItem("metadata " + std::to_string(i) + " ('" + Printable(key) + "')");
    const size_t value_at = p.pos();
    ARGUS_ASSIGN_OR_RETURN(GgufValue value, p.ReadValue());
    auto [it, inserted] = metadata_index.try_emplace(key, metadata.size());
    if (!inserted) {
      return p.Corrupt("key", key_at,
                       "duplicate key (also metadata " + std::to_string(it->second) + ")");
    }
    if (key == "general.alignment") {
      if (value.type != GgufType::kU32) {
        return p.Corrupt("value", value_at,
                         "general.alignment must be a u32, not " + TypeDescription(value));
      }
      if (!std::has_single_bit(value.u)) {
        return p.Corrupt(
            "value", value_at,
            "general.alignment " + std::to_string(value.u) + " is not a nonzero power of two");
      }
      alignment = value.u;
    }
    metadata.push_back({std::move(key), std::move(value)});
  }
  return Status::Ok();
}

Status GgufFile::Impl::ParseTensorInfos(Parser& p, uint64_t n_tensors,
                                        std::vector<InfoPlace>& places) {
  tensors.reserve(std::min<size_t>(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    p.SetItem("tensor info " + std::to_string(i));
    const size_t info_at = p.pos();
    GgufTensor t;
    ARGUS_ASSIGN_OR_RETURN(t.name, p.ReadString("name"));
    p.SetItem("tensor info " + std::to_string(i) + " ('" + Printable(t.name) + "')");
    const size_t dims_at = p.pos();
    ARGUS_ASSIGN_OR_RETURN(uint32_t n_dims, p.Read<uint32_t>("n_dims"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return p.Corrupt(
          "n_dims", dims_at,
          std::to_string(n_dims) + " dimensions (1 to " + std::to_string(kMaxDims) + " allowed)");
    }
    size_t n_values = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t at = p.pos();
      ARGUS_ASSIGN_OR_RETURN(uint64_t dim, p.Read<uint64_t>("dim"));
      if (dim == 0) return p.Corrupt("dim", at, "dim " + std::to_string(d) + " is 0");
      ARGUS_ASSIGN_OR_RETURN(n_values,
                             p.Checked(CheckedMul(n_values, dim, "element count"), "dim", at));
      t.dims.push_back(dim);
    }
    if (n_values > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return p.Corrupt("dims", dims_at,
                       "element count " + std::to_string(n_values) + " does not fit in int64");
    }
    t.n_values = n_values;
    const size_t type_at = p.pos();
    ARGUS_ASSIGN_OR_RETURN(uint32_t type, p.Read<uint32_t>("ggml type"));
    auto info = GgmlTypeInfoOf(type);
    if (!info.ok()) {
      return p.Fail(StatusCode::kUnsupported, "ggml type", type_at,
                    "unknown ggml type id " + std::to_string(type));
    }
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % info->block_values != 0) {
      return p.Corrupt("dims", dims_at,
                       "row length ne[0] = " + std::to_string(t.dims[0]) +
                           " is not a multiple of " + std::string(info->name) + "'s block of " +
                           std::to_string(info->block_values) + " values");
    }
    ARGUS_ASSIGN_OR_RETURN(size_t n_bytes, p.Checked(CheckedMul(n_values / info->block_values,
                                                                info->block_bytes, "tensor bytes"),
                                                     "dims", dims_at));
    const size_t offset_at = p.pos();
    ARGUS_ASSIGN_OR_RETURN(t.offset, p.Read<uint64_t>("offset"));
    if (t.offset % alignment != 0) {
      return p.Corrupt("offset", offset_at,
                       "data offset " + std::to_string(t.offset) +
                           " is not a multiple of the alignment " + std::to_string(alignment));
    }
    auto [it, inserted] = tensor_index.try_emplace(t.name, tensors.size());
    if (!inserted) {
      return p.Corrupt(
          "name", info_at,
          "duplicate tensor name (also tensor info " + std::to_string(it->second) + ")");
    }
    places.push_back({info_at, n_bytes});
    tensors.push_back(std::move(t));
  }
  return Status::Ok();
}

Status GgufFile::Impl::PlaceTensorData(Parser& p, const std::vector<InfoPlace>& places) {
  if (tensors.empty()) return Status::Ok();
  p.SetItem("data section");
  ARGUS_ASSIGN_OR_RETURN(size_t padded, p.Checked(CheckedAdd(p.pos(), alignment - 1, "data start"),
                                                  "padding", p.pos()));
  const size_t data_start = padded / alignment * alignment;
  for (size_t i = 0; i < tensors.size(); ++i) {
    GgufTensor& t = tensors[i];
    const size_t n_bytes = places[i].n_bytes;
    p.SetItem("tensor info " + std::to_string(i) + " ('" + Printable(t.name) + "')");
    auto begin = CheckedAdd(data_start, t.offset, "data extent");
    auto end = begin.ok() ? CheckedAdd(*begin, n_bytes, "data extent") : begin;
    if (!end.ok() || *end > image.size()) {
      return p.Corrupt("data extent", places[i].at,
                       "[offset " + std::to_string(t.offset) + ", " + std::to_string(n_bytes) +
                           " bytes] from the data section at byte " + std::to_string(data_start) +
                           " runs past the end of the file (" + std::to_string(image.size()) +
                           " bytes)");
    }
    t.data = image.subspan(*begin, n_bytes);
  }
  std::vector<size_t> by_offset(tensors.size());
  std::iota(by_offset.begin(), by_offset.end(), size_t{0});
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensor& prev = tensors[by_offset[k - 1]];
    const GgufTensor& cur = tensors[by_offset[k]];
    if (prev.offset + prev.data.size() > cur.offset) {  // both extents lie inside the image
      p.SetItem("tensor info " + std::to_string(by_offset[k]) + " ('" + Printable(cur.name) + "')");
      return p.Corrupt("data extent", places[by_offset[k]].at,
                       "[offset " + std::to_string(cur.offset) + ", " +
                           std::to_string(cur.data.size()) + " bytes] overlaps tensor info " +
                           std::to_string(by_offset[k - 1]) + " ('" + Printable(prev.name) +
                           "') [offset " + std::to_string(prev.offset) + ", " +
                           std::to_string(prev.data.size()) + " bytes]");
    }
  }
  return Status::Ok();
}

Status GgufFile::Impl::Parse() {
  Parser p(image, name);
  uint64_t n_tensors = 0, n_metadata = 0;
  ARGUS_RETURN_IF_ERROR(ParseHeader(p, n_tensors, n_metadata));
  ARGUS_RETURN_IF_ERROR(ParseMetadata(p, n_metadata));
  std::vector<InfoPlace> places;
  ARGUS_RETURN_IF_ERROR(ParseTensorInfos(p, n_tensors, places));
  return PlaceTensorData(p, places);
}

GgufFile::GgufFile() : impl_(std::make_unique<Impl>()) {}
GgufFile::~GgufFile() = default;

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IOError(path + ": not a regular file");
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  Impl& impl = *file->impl_;
  impl.name = path;
  const size_t n_bytes = static_cast<size_t>(st.st_size);
  if (n_bytes > 0) {
    void* map = ::mmap(nullptr, n_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::IOError(path + ": cannot map " + std::to_string(n_bytes) +
                             " bytes: " + std::strerror(err));
    }
    impl.map = map;
    impl.map_bytes = n_bytes;
    impl.image = std::span<const std::byte>(static_cast<const std::byte*>(map), n_bytes);
  }
  ::close(fd);
  ARGUS_RETURN_IF_ERROR(impl.Parse());
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(std::span<const std::byte> image,
                                                  std::string name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->impl_->name = std::move(name);
  file->impl_->image = image;
  ARGUS_RETURN_IF_ERROR(file->impl_->Parse());
  return file;
}

const std::string& GgufFile::name() const { return impl_->name; }
uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
size_t GgufFile::size_bytes() const { return impl_->image.size(); }
std::span<const std::byte> GgufFile::image() const { return impl_->image; }
const std::vector<GgufKeyValue>& GgufFile::metadata() const { return impl_->metadata; }
const std::vector<GgufTensor>& GgufFile::tensors() const { return impl_->tensors; }

void GgufFile::ReleasePages(std::span<const std::byte> bytes) const {
  if (impl_->map == nullptr || bytes.empty()) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  // Advice only: a refusal leaves the pages resident, which is what happens without it.
  if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = impl_->metadata_index.find(key);
  return it == impl_->metadata_index.end() ? nullptr : &impl_->metadata[it->second].value;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

namespace {

// The value under `key`, or NotFound naming the file and the key.
Result<const GgufValue*> Lookup(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) {
    return Status::NotFound(file.name() + ": metadata key '" + std::string(key) + "' is absent");
  }
  return v;
}

Status Mismatch(const GgufFile& file, std::string_view key, const GgufValue& v,
                std::string_view wanted) {
  std::string held = TypeDescription(v);
  if (IsUnsigned(v.type)) held += " " + std::to_string(v.u);
  if (IsSigned(v.type)) held += " " + std::to_string(v.i);
  return Status::InvalidArgument(file.name() + ": metadata key '" + std::string(key) + "' holds " +
                                 held + ", which is not " + std::string(wanted));
}

}  // namespace

Result<std::string> GgufFile::GetString(std::string_view key) const {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != GgufType::kString) return Mismatch(*this, key, *v, "a string");
  return v->s;
}

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (IsUnsigned(v->type)) return v->u;
  if (IsSigned(v->type) && v->i >= 0) return static_cast<uint64_t>(v->i);
  return Mismatch(*this, key, *v, "an unsigned integer");
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (IsSigned(v->type)) return v->i;
  if (IsUnsigned(v->type) && v->u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(v->u);
  }
  return Mismatch(*this, key, *v, "a signed 64-bit integer");
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (IsFloat(v->type)) return v->f;
  return Mismatch(*this, key, *v, "a float");
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type == GgufType::kBool) return v->u != 0;
  return Mismatch(*this, key, *v, "a bool");
}

Result<const GgufValue*> GgufFile::GetArray(std::string_view key) const {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type == GgufType::kArray) return v;
  return Mismatch(*this, key, *v, "an array");
}

}  // namespace argus
