// Self-describing pages for the disk tier's crash, concurrency and command-line tests: a payload
// names its key and a version in its first bytes and is filled from a splitmix64 stream seeded
// by both, so a reader can tell a whole version of a key from a torn, stale-slot or foreign page
// without knowing which version to expect. A temporary store directory to go with them.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "argus/store.h"
#include "core/splitmix.h"
#include "test_util.h"

namespace argus::testing {

// Key `index` of a test: both halves vary, so a key mix-up cannot hide in one word.
inline PageKey TestPageKey(uint64_t index) {
  uint64_t state = index;
  return PageKey{SplitMix64Next(state), index};
}

// Bytes 0..7 key.hi, 8..15 key.lo, 16..23 version (little-endian host order), then the stream.
inline constexpr size_t kVersionedHeaderBytes = 24;

namespace internal {
inline void FillVersioned(const PageKey& key, uint64_t version, std::span<std::byte> out) {
  uint64_t state = key.hi ^ (key.lo * 0xD1B54A32D192ED03ull) ^ (version * kSplitMixGamma);
  for (size_t i = kVersionedHeaderBytes; i < out.size(); i += 8) {
    const uint64_t word = SplitMix64Next(state);
    std::memcpy(out.data() + i, &word, std::min<size_t>(8, out.size() - i));
  }
}
}  // namespace internal

// REQUIRES: n_bytes >= kVersionedHeaderBytes.
inline std::vector<std::byte> VersionedPayload(const PageKey& key, uint64_t version,
                                               size_t n_bytes) {
  std::vector<std::byte> out(n_bytes);
  std::memcpy(out.data(), &key.hi, 8);
  std::memcpy(out.data() + 8, &key.lo, 8);
  std::memcpy(out.data() + 16, &version, 8);
  internal::FillVersioned(key, version, out);
  return out;
}

// The version `payload` holds when it is a whole versioned page of `key`; nullopt otherwise.
inline std::optional<uint64_t> PayloadVersion(const PageKey& key,
                                              std::span<const std::byte> payload) {
  if (payload.size() < kVersionedHeaderBytes) return std::nullopt;
  PageKey named;
  uint64_t version = 0;
  std::memcpy(&named.hi, payload.data(), 8);
  std::memcpy(&named.lo, payload.data() + 8, 8);
  std::memcpy(&version, payload.data() + 16, 8);
  if (!(named == key)) return std::nullopt;
  std::vector<std::byte> expected(payload.size());
  internal::FillVersioned(key, version, expected);
  if (std::memcmp(expected.data() + kVersionedHeaderBytes, payload.data() + kVersionedHeaderBytes,
                  payload.size() - kVersionedHeaderBytes) != 0) {
    return std::nullopt;
  }
  return version;
}

}  // namespace argus::testing
