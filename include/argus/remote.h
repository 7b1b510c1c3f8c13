// The remote tier: prefix pages shared by processes and machines through a Redis server, below
// RAM and the local disk tier.
//
// A RemoteTier holds one connection to one Redis node (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`;
// without a password in the URL, ARGUS_REDIS_PASSWORD is used when set). Each page is one Redis
// string under KEY_PREFIX + the page key in hex, holding a self-describing value (format below):
// a reader verifies magic, format version, key, tag and the payload's XXH3 before it uses a byte,
// so a damaged value, a value of another key, codec pair or format is a miss, never data. Writes
// are idempotent: a page key names its bytes (the cache's prefix keys hash the model, geometry,
// codecs and tokens), so the same key always gets the same value.
//
// Value, little-endian: "ARGUSRV1", u32 format version (1), u64 key.hi, u64 key.lo, u16 tag
// length, tag bytes, u64 payload length, u64 XXH3 of the payload, u64 XXH3 of every header byte
// before it, then the payload.
//
// Failure is never fatal and never an error of these calls: Redis refusing connections, a call
// running past the timeout, a full server (OOM under maxmemory with noeviction), a damaged or
// foreign value: the page is a miss (or a write is dropped), the failure is counted, the warning
// callback is called once per kind of failure, and after a connection failure the tier stays
// down (calls answer at once: misses) until a backoff that doubles from retry_initial_s to
// retry_max_s has passed. Memory on the Redis side is Redis's business (maxmemory and an
// eviction policy): a page evicted is a miss.
//
// Thread safety: all methods may be called from several threads; calls are serialised on the one
// connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/status.h"
#include "argus/store.h"

namespace argus {

struct RemoteTierOptions {
  std::string url;          // redis://… ; rediss:// is Unsupported (hiredis 0.14 has no TLS)
  double timeout_s = 1.0;   // connect, and each send or receive of a call
  double retry_initial_s = 1.0, retry_max_s = 60.0;  // backoff while the server is unreachable
  std::string key_prefix = "argus:kv1:";
  // Called (from the calling thread) the first time each kind of failure happens: the server
  // unreachable or failing a call, and a damaged or foreign value. nullptr: silent (statistics
  // still count every failure).
  std::function<void(const Status&)> on_warning;
};

struct RemoteTierStats {
  uint64_t n_hits = 0;         // pages returned (verified)
  uint64_t n_misses = 0;       // pages asked for and not returned (damaged and skipped included)
  uint64_t n_damaged = 0;      // values refused: bad magic, version, key, tag, length, checksum
  uint64_t n_written = 0;      // pages Redis accepted
  uint64_t read_bytes = 0;     // value bytes received
  uint64_t written_bytes = 0;  // value bytes sent with accepted writes
  uint64_t n_round_trips = 0;  // request/response exchanges with the server (a pipeline is one)
  uint64_t n_errors = 0;       // failed connects and calls, and error replies (OOM)
  uint64_t n_skipped = 0;      // calls answered without the server while backing off
  uint64_t n_connects = 0;     // connections established
};

// The value stored for a page; DecodeRemoteValue returns its payload after checking every field
// against `key` and `tag` and the payload's checksum: Corruption naming the field otherwise.
std::vector<std::byte> EncodeRemoteValue(const PageKey& key, std::string_view tag,
                                         std::span<const std::byte> payload);
Result<std::span<const std::byte>> DecodeRemoteValue(std::span<const std::byte> value,
                                                     const PageKey& key, std::string_view tag);

class RemoteTier {
 public:
  // Parses the URL and connects. InvalidArgument for a malformed URL or options, Unsupported for
  // rediss://. A server that cannot be reached is not an error: the tier starts down (warned,
  // counted) and retries after the backoff.
  static Result<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // One entry per key: the verified payload of the page stored under that key with this tag, or
  // an empty vector (a miss: not stored, damaged, foreign, or the server unavailable). One round
  // trip (MGET) for all keys.
  std::vector<std::vector<std::byte>> Get(std::span<const PageKey> keys, std::string_view tag);
  // Whether each key holds a value (unverified): one pipelined round trip. All false when the
  // server is unavailable.
  std::vector<bool> Contains(std::span<const PageKey> keys);
  // Writes the pages (SET, pipelined: one round trip). Returns the pages the server accepted;
  // the others (OOM, a lost connection) are counted and dropped.
  size_t Put(std::span<const PagePut> pages);
  size_t Put(const PagePut& page) { return Put(std::span<const PagePut>(&page, 1)); }

  // Whether calls go to the server now (false while backing off after a failure).
  bool available() const;
  RemoteTierStats stats() const;
  // The URL without its password, for messages.
  const std::string& name() const;

 private:
  struct Impl;
  explicit RemoteTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace argus
