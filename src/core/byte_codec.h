// Internal: field encoding of the library's own records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "argus/status.h"

namespace argus {

// Fields appended in memory order (little-endian on every machine ARGUS builds for): the
// encodings of the cache's manifests and page-key seeds, of trace files, of remote-tier values
// and of the disk tier's journal records.
class ByteWriter {
 public:
  // Appends after `bytes` (a record framed in place after earlier ones).
  explicit ByteWriter(std::vector<std::byte> bytes = {}) : bytes_(std::move(bytes)) {}
  template <typename T>
  ByteWriter& Put(const T& value) {
    return PutBytes(std::as_bytes(std::span(&value, 1)));
  }
  ByteWriter& PutBytes(std::span<const std::byte> bytes) {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  // The length as a Length, then the bytes.
  template <typename Length = uint16_t>
  ByteWriter& PutString(std::string_view text) {
    Put(static_cast<Length>(text.size()));
    return PutBytes(std::as_bytes(std::span(text.data(), text.size())));
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// Reads fields that ByteWriter wrote, each checked against the bytes that remain (the bytes are
// data from disk): Corruption "<what>: truncated in <field> (byte N)".
class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, std::string what)
      : bytes_(bytes), what_(std::move(what)) {}
  template <typename T>
  Result<T> Get(std::string_view field) {
    if (bytes_.size() - offset_ < sizeof(T)) return Truncated(field);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  // The next n bytes, viewed in place.
  Result<std::span<const std::byte>> GetBytes(size_t n, std::string_view field) {
    if (bytes_.size() - offset_ < n) return Truncated(field);
    const std::span<const std::byte> bytes = bytes_.subspan(offset_, n);
    offset_ += n;
    return bytes;
  }
  // The next n bytes as text (its length written before it, and checked, by the caller).
  Result<std::string> GetText(size_t n, std::string_view field) {
    ARGUS_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, GetBytes(n, field));
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  Result<std::string> GetString(std::string_view field) {  // a u16 length, then the bytes
    ARGUS_ASSIGN_OR_RETURN(uint16_t n, Get<uint16_t>(field));
    return GetText(n, field);
  }
  bool done() const { return offset_ == bytes_.size(); }
  size_t remaining() const { return bytes_.size() - offset_; }
  Status Corrupt(const std::string& why) const {
    return Status::Corruption(what_ + ": " + why + " (byte " + std::to_string(offset_) + ")");
  }

 private:
  Status Truncated(std::string_view field) const {
    return Corrupt("truncated in " + std::string(field));
  }
  std::span<const std::byte> bytes_;
  std::string what_;
  size_t offset_ = 0;
};

}  // namespace argus
