// Internal: owned, aligned byte buffers.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "argus/status.h"

namespace argus {

inline constexpr size_t kBufferAlign = 64;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// An owned, 64-byte aligned, zero-initialised byte buffer. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Returns ResourceExhausted when the allocation fails.
  static Result<AlignedBuffer> Allocate(size_t n_bytes);
  // A buffer of whole huge pages (n_bytes a multiple of kHugePageBytes, else InvalidArgument),
  // aligned to one and advised to the kernel as transparent huge pages before it is touched: a
  // stream over it from DRAM then misses the TLB once per 2 MiB instead of once per 4 KiB.
  static Result<AlignedBuffer> AllocateHugePages(size_t n_bytes);

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return n_bytes_; }
  std::span<std::byte> span() { return {data(), n_bytes_}; }
  std::span<const std::byte> span() const { return {data(), n_bytes_}; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data());
  }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t n_bytes_ = 0;
};

}  // namespace argus
