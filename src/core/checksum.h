// Internal: XXH3 checksums of byte ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace argus {

uint64_t Checksum64(std::span<const std::byte> bytes);  // XXH3-64, seed 0
struct Hash128 {
  uint64_t hi = 0, lo = 0;
};
Hash128 Checksum128(std::span<const std::byte> bytes);  // XXH3-128, seed 0

}  // namespace argus
