#include "core/buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace argus {

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

namespace {

// n_bytes (a multiple of `align`, > 0) at an `align` boundary, zeroed. Huge-page alignment comes
// with the advice to back the buffer with transparent huge pages, given before any page is touched
// (advice only: where they are off, small pages back it).
Result<std::byte*> AllocateZeroed(size_t align, size_t n_bytes) {
  void* p = std::aligned_alloc(align, n_bytes);
  if (p == nullptr) {
    return Status::ResourceExhausted("cannot allocate a buffer of " + std::to_string(n_bytes) +
                                     " bytes");
  }
  if (align == kHugePageBytes) madvise(p, n_bytes, MADV_HUGEPAGE);
  std::memset(p, 0, n_bytes);
  return static_cast<std::byte*>(p);
}

}  // namespace

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t n_bytes) {
  AlignedBuffer buffer;
  if (n_bytes == 0) return buffer;
  // aligned_alloc wants a multiple of the alignment; the padding is never exposed.
  size_t padded = (n_bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
  if (padded < n_bytes)
    return Status::ResourceExhausted("buffer of " + std::to_string(n_bytes) +
                                     " bytes: size overflow");
  ARGUS_ASSIGN_OR_RETURN(std::byte * p, AllocateZeroed(kBufferAlign, padded));
  buffer.data_.reset(p);
  buffer.n_bytes_ = n_bytes;
  return buffer;
}

Result<AlignedBuffer> AlignedBuffer::AllocateHugePages(size_t n_bytes) {
  if (n_bytes == 0 || n_bytes % kHugePageBytes != 0)
    return Status::InvalidArgument("huge-page buffer of " + std::to_string(n_bytes) +
                                   " bytes: not a positive multiple of " +
                                   std::to_string(kHugePageBytes));
  ARGUS_ASSIGN_OR_RETURN(std::byte * p, AllocateZeroed(kHugePageBytes, n_bytes));
  AlignedBuffer buffer;
  buffer.data_.reset(p);
  buffer.n_bytes_ = n_bytes;
  return buffer;
}

}  // namespace argus
