#include <cstdlib>
#include <cstring>
#include <string>

#include "argus/core.h"

namespace argus {

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t n_bytes) {
  AlignedBuffer buffer;
  if (n_bytes == 0) return buffer;
  // aligned_alloc wants a multiple of the alignment; the padding is never exposed.
  size_t padded = (n_bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
  if (padded < n_bytes)
    return Status::ResourceExhausted("buffer of " + std::to_string(n_bytes) +
                                     " bytes: size overflow");
  void* p = std::aligned_alloc(kBufferAlign, padded);
  if (p == nullptr) {
    return Status::ResourceExhausted("cannot allocate a buffer of " + std::to_string(n_bytes) +
                                     " bytes");
  }
  std::memset(p, 0, padded);
  buffer.data_.reset(static_cast<std::byte*>(p));
  buffer.n_bytes_ = n_bytes;
  return buffer;
}

}  // namespace argus
