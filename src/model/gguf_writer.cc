// GGUF v3 writer: the header, metadata and tensor infos go through a buffered sink in chunks of
// at most kChunkBytes; each tensor's bytes are produced by its fill callback into one scratch
// buffer (the size of the largest tensor) and streamed out, so the whole file is never in memory.
// The layout matches ggml's writer: tensor data at aligned offsets in AddTensor order, each
// tensor (the last included) padded with zeros to the alignment.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "argus/gguf.h"
#include "core/buffer.h"
#include "core/checked.h"
#include "model/gguf_types.h"

namespace argus {
namespace {

using gguf::IsUnsigned;
using gguf::kDefaultAlignment;

constexpr uint32_t kVersion = 3;
constexpr size_t kChunkBytes = size_t{4} << 20;

// Collects small writes and hands the sink chunks of at most kChunkBytes.
class BufferedSink {
 public:
  using Sink = std::function<Status(std::span<const std::byte>)>;
  explicit BufferedSink(const Sink& sink) : sink_(sink) { buffer_.reserve(kChunkBytes); }

  Status Append(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), kChunkBytes - buffer_.size());
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
      bytes = bytes.subspan(n);
      if (buffer_.size() == kChunkBytes) ARGUS_RETURN_IF_ERROR(Flush());
    }
    return Status::Ok();
  }
  template <typename T>
  Status Put(T v) {
    return Append(std::as_bytes(std::span<const T>(&v, 1)));
  }
  Status PutString(std::string_view s) {
    ARGUS_RETURN_IF_ERROR(Put<uint64_t>(s.size()));
    return Append(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  Status Zeros(size_t n) {
    static constexpr std::byte kZeros[64] = {};
    for (; n > 0; n -= std::min(n, sizeof kZeros)) {
      ARGUS_RETURN_IF_ERROR(Append(std::span(kZeros, std::min(n, sizeof kZeros))));
    }
    return Status::Ok();
  }
  uint64_t written() const { return flushed_ + buffer_.size(); }
  Status Flush() {
    if (buffer_.empty()) return Status::Ok();
    ARGUS_RETURN_IF_ERROR(sink_(buffer_));
    flushed_ += buffer_.size();
    buffer_.clear();
    return Status::Ok();
  }

 private:
  const Sink& sink_;
  std::vector<std::byte> buffer_;
  uint64_t flushed_ = 0;
};

// Writes one scalar (or string) of `type`: `u` for unsigned types and bool, `i` for signed,
// `f` for floats, `s` for strings. InvalidArgument when the value does not fit the type.
Status PutScalar(BufferedSink& out, GgufType type, uint64_t u, int64_t i, double f,
                 std::string_view s, std::string_view key) {
  auto range = [&](std::string what) {
    return Status::InvalidArgument("metadata '" + std::string(key) + "': " + what +
                                   " does not fit in " + std::string(GgufTypeName(type)));
  };
  auto put_unsigned = [&]<typename T>(T) -> Status {
    if (u > std::numeric_limits<T>::max()) return range(std::to_string(u));
    return out.Put<T>(static_cast<T>(u));
  };
  auto put_signed = [&]<typename T>(T) -> Status {
    if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) {
      return range(std::to_string(i));
    }
    return out.Put<T>(static_cast<T>(i));
  };
  switch (type) {
    case GgufType::kU8:
      return put_unsigned(uint8_t{});
    case GgufType::kU16:
      return put_unsigned(uint16_t{});
    case GgufType::kU32:
      return put_unsigned(uint32_t{});
    case GgufType::kU64:
      return put_unsigned(uint64_t{});
    case GgufType::kI8:
      return put_signed(int8_t{});
    case GgufType::kI16:
      return put_signed(int16_t{});
    case GgufType::kI32:
      return put_signed(int32_t{});
    case GgufType::kI64:
      return put_signed(int64_t{});
    case GgufType::kBool:
      if (u > 1) return range(std::to_string(u));
      return out.Put<uint8_t>(static_cast<uint8_t>(u));
    case GgufType::kF32:
      return out.Put<float>(static_cast<float>(f));
    case GgufType::kF64:
      return out.Put<double>(f);
    case GgufType::kString:
      return out.PutString(s);
    case GgufType::kArray:
      break;
  }
  return Status::InvalidArgument("metadata '" + std::string(key) + "': value type " +
                                 std::to_string(static_cast<uint32_t>(type)) +
                                 " cannot be written here");
}

Status PutValue(BufferedSink& out, const GgufValue& v, std::string_view key) {
  ARGUS_RETURN_IF_ERROR(out.Put<uint32_t>(static_cast<uint32_t>(v.type)));
  if (v.type != GgufType::kArray) return PutScalar(out, v.type, v.u, v.i, v.f, v.s, key);
  const GgufType e = v.element_type;
  const bool is_string = e == GgufType::kString;
  const bool is_float = e == GgufType::kF32 || e == GgufType::kF64;
  const size_t n = is_string ? v.strings.size() : is_float ? v.floats.size() : v.ints.size();
  if (v.array_size() != n || e == GgufType::kArray) {
    return Status::InvalidArgument("metadata '" + std::string(key) + "': an array of " +
                                   std::string(GgufTypeName(e)) +
                                   " must hold its elements in the vector for that type only");
  }
  ARGUS_RETURN_IF_ERROR(out.Put<uint32_t>(static_cast<uint32_t>(e)));
  ARGUS_RETURN_IF_ERROR(out.Put<uint64_t>(n));
  for (size_t k = 0; k < n; ++k) {
    if (is_string) {
      ARGUS_RETURN_IF_ERROR(out.PutString(v.strings[k]));
    } else if (is_float) {
      ARGUS_RETURN_IF_ERROR(PutScalar(out, e, 0, 0, v.floats[k], {}, key));
    } else {
      const int64_t x = v.ints[k];
      if ((IsUnsigned(e) || e == GgufType::kBool) && x < 0) {
        return Status::InvalidArgument("metadata '" + std::string(key) + "': element " +
                                       std::to_string(k) + " is " + std::to_string(x) +
                                       ", negative in an array of " + std::string(GgufTypeName(e)));
      }
      ARGUS_RETURN_IF_ERROR(PutScalar(out, e, static_cast<uint64_t>(x), x, 0, {}, key));
    }
  }
  return Status::Ok();
}

// The byte count of a tensor of `type` and `dims`, or InvalidArgument naming the tensor.
Result<uint64_t> TensorBytes(const std::string& name, GgmlType type,
                             const std::vector<uint64_t>& dims) {
  auto info = GgmlTypeInfoOf(static_cast<uint32_t>(type));
  if (!info.ok()) return info.status().WithContext("tensor '" + name + "'");
  if (dims.empty() || dims.size() > 4) {
    return Status::InvalidArgument("tensor '" + name + "': " + std::to_string(dims.size()) +
                                   " dimensions (1 to 4 allowed)");
  }
  size_t n_values = 1;
  for (uint64_t d : dims) {
    if (d == 0) return Status::InvalidArgument("tensor '" + name + "': a dimension is 0");
    ARGUS_ASSIGN_OR_RETURN(n_values, CheckedMul(n_values, d, "tensor '" + name + "' elements"));
  }
  if (dims[0] % info->block_values != 0) {
    return Status::InvalidArgument("tensor '" + name + "': row length " + std::to_string(dims[0]) +
                                   " is not a multiple of " + std::string(info->name) +
                                   "'s block of " + std::to_string(info->block_values));
  }
  return CheckedMul(n_values / info->block_values, info->block_bytes,
                    "tensor '" + name + "' bytes");
}

uint64_t AlignUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// Writes all of `bytes` to fd; NoSpace on ENOSPC, IOError otherwise, naming `path`.
Status WriteAll(int fd, std::span<const std::byte> bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      return Status(err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError,
                    path + ": write failed: " + std::strerror(err));
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  // ggml reads general.alignment as a u32; the default needs no key.
  if (alignment != kDefaultAlignment && alignment <= std::numeric_limits<uint32_t>::max()) {
    SetU32("general.alignment", static_cast<uint32_t>(alignment));
  }
}

void GgufWriter::Set(std::string key, GgufValue value) {
  auto it = std::find_if(metadata_.begin(), metadata_.end(),
                         [&](const GgufKeyValue& kv) { return kv.key == key; });
  if (it != metadata_.end()) {
    it->value = std::move(value);
  } else {
    metadata_.push_back({std::move(key), std::move(value)});
  }
}

void GgufWriter::SetString(std::string key, std::string value) {
  GgufValue v;
  v.type = GgufType::kString;
  v.s = std::move(value);
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetU32(std::string key, uint32_t value) {
  GgufValue v;
  v.type = GgufType::kU32;
  v.u = value;
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetI32(std::string key, int32_t value) {
  GgufValue v;
  v.type = GgufType::kI32;
  v.i = value;
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetF32(std::string key, float value) {
  GgufValue v;
  v.type = GgufType::kF32;
  v.f = value;
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetBool(std::string key, bool value) {
  GgufValue v;
  v.type = GgufType::kBool;
  v.u = value ? 1 : 0;
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetStrings(std::string key, std::vector<std::string> values) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.element_type = GgufType::kString;
  v.strings = std::move(values);
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetF32s(std::string key, std::vector<float> values) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.element_type = GgufType::kF32;
  v.floats.assign(values.begin(), values.end());
  Set(std::move(key), std::move(v));
}

void GgufWriter::SetI32s(std::string key, std::vector<int32_t> values) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.element_type = GgufType::kI32;
  v.ints.assign(values.begin(), values.end());
  Set(std::move(key), std::move(v));
}

Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<uint64_t> dims,
                             FillFn fill) {
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return Status::InvalidArgument("tensor '" + name + "' is already added");
  }
  ARGUS_ASSIGN_OR_RETURN(uint64_t n_bytes, TensorBytes(name, type, dims));
  tensors_.push_back({std::move(name), type, std::move(dims), n_bytes, std::move(fill)});
  return Status::Ok();
}

Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<uint64_t> dims,
                             std::span<const std::byte> bytes) {
  ARGUS_ASSIGN_OR_RETURN(uint64_t n_bytes, TensorBytes(name, type, dims));
  if (bytes.size() != n_bytes) {
    return Status::InvalidArgument("tensor '" + name + "': " + std::to_string(bytes.size()) +
                                   " bytes given, its shape needs " + std::to_string(n_bytes));
  }
  auto copy = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  return AddTensor(std::move(name), type, std::move(dims), [copy](std::span<std::byte> out) {
    std::memcpy(out.data(), copy->data(), copy->size());
    return Status::Ok();
  });
}

Status GgufWriter::WriteTo(const std::function<Status(std::span<const std::byte>)>& sink) const {
  if (!std::has_single_bit(alignment_) || alignment_ > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("GGUF alignment " + std::to_string(alignment_) +
                                   " is not a power of two that fits in a u32");
  }
  for (const GgufKeyValue& kv : metadata_) {
    if (kv.key == "general.alignment" &&
        (kv.value.type != GgufType::kU32 || kv.value.u != alignment_)) {
      return Status::InvalidArgument(
          "metadata 'general.alignment' disagrees with the writer's "
          "alignment " +
          std::to_string(alignment_));
    }
  }
  BufferedSink out(sink);
  ARGUS_RETURN_IF_ERROR(out.Append(std::as_bytes(std::span("GGUF", 4))));
  ARGUS_RETURN_IF_ERROR(out.Put<uint32_t>(kVersion));
  ARGUS_RETURN_IF_ERROR(out.Put<uint64_t>(tensors_.size()));
  ARGUS_RETURN_IF_ERROR(out.Put<uint64_t>(metadata_.size()));
  for (const GgufKeyValue& kv : metadata_) {
    ARGUS_RETURN_IF_ERROR(out.PutString(kv.key));
    ARGUS_RETURN_IF_ERROR(PutValue(out, kv.value, kv.key));
  }
  uint64_t offset = 0, max_bytes = 0;
  for (const PendingTensor& t : tensors_) {
    ARGUS_RETURN_IF_ERROR(out.PutString(t.name));
    ARGUS_RETURN_IF_ERROR(out.Put<uint32_t>(static_cast<uint32_t>(t.dims.size())));
    for (uint64_t d : t.dims) ARGUS_RETURN_IF_ERROR(out.Put<uint64_t>(d));
    ARGUS_RETURN_IF_ERROR(out.Put<uint32_t>(static_cast<uint32_t>(t.type)));
    ARGUS_RETURN_IF_ERROR(out.Put<uint64_t>(offset));
    ARGUS_ASSIGN_OR_RETURN(
        offset, CheckedAdd(offset, AlignUp(t.n_bytes, alignment_), "GGUF data section bytes"));
    max_bytes = std::max(max_bytes, t.n_bytes);
  }
  if (tensors_.empty()) return out.Flush();
  ARGUS_RETURN_IF_ERROR(out.Zeros(AlignUp(out.written(), alignment_) - out.written()));
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer scratch, AlignedBuffer::Allocate(max_bytes));
  for (const PendingTensor& t : tensors_) {
    std::span<std::byte> bytes = scratch.span().first(t.n_bytes);
    std::fill(bytes.begin(), bytes.end(), std::byte{0});  // a short fill stays deterministic
    Status filled = t.fill(bytes);
    if (!filled.ok()) return filled.WithContext("tensor '" + t.name + "'");
    ARGUS_RETURN_IF_ERROR(out.Append(bytes));
    ARGUS_RETURN_IF_ERROR(out.Zeros(AlignUp(t.n_bytes, alignment_) - t.n_bytes));
  }
  return out.Flush();
}

Result<std::vector<std::byte>> GgufWriter::Serialize() const {
  std::vector<std::byte> bytes;
  ARGUS_RETURN_IF_ERROR(WriteTo([&](std::span<const std::byte> chunk) {
    bytes.insert(bytes.end(), chunk.begin(), chunk.end());
    return Status::Ok();
  }));
  return bytes;
}

Status GgufWriter::Write(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError,
                  path + ": cannot create " + tmp + ": " + std::strerror(err));
  }
  auto fail = [&](Status s) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  Status s = WriteTo([&](std::span<const std::byte> chunk) { return WriteAll(fd, chunk, path); });
  if (!s.ok()) return fail(s);
  if (::fsync(fd) != 0) {
    const int err = errno;
    return fail(Status(err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError,
                       path + ": fsync failed: " + std::strerror(err)));
  }
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) {
    const int err = errno;
    return fail(Status(err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError,
                       path + ": close failed: " + std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    return fail(Status::IOError(path + ": rename from " + tmp + " failed: " + std::strerror(err)));
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int synced = ::fsync(dir_fd);
    const int err = errno;
    ::close(dir_fd);
    if (synced != 0 && err != EINVAL) {
      return Status::IOError(path + ": fsync of the directory failed: " + std::strerror(err));
    }
  }
  return Status::Ok();
}

}  // namespace argus
