// Recovery of a disk store from hostile files, shared by the libFuzzer target
// (tests/fuzz/journal_fuzz.cc) and the unit test that replays its corpus and regressions.
//
// Input: u16 little-endian journal length, u16 slot size in 512-byte units (0: 8), the journal
// bytes, then the bytes of the one slot file, slots-<slot size>.dat. The files are written to a
// private directory and the store opened from them. Recovery must fail with a Status or open a
// store whose every page reads back verified or fails as Corruption/IOError; it must never crash,
// loop or read outside a buffer. A store that opens is opened again: recovery is idempotent (the
// same pages and records), and a read-only open of it agrees.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "argus/core.h"
#include "argus/store.h"
#include "core/files.h"

namespace argus::testing {

namespace journal_recovery {

// The store's directory, one per process, removed at exit.
struct ScratchDir {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("argus_journal_recovery_" + std::to_string(::getpid())))
                         .string();
  ~ScratchDir() {
    std::error_code error;
    std::filesystem::remove_all(path, error);
  }
};

inline const std::string& Dir() {
  static const ScratchDir dir;
  return dir.path;
}

inline DiskTierOptions Options(bool read_only) {
  DiskTierOptions o;
  o.dir = Dir();
  o.disk_budget_bytes = size_t{64} << 20;
  o.metadata_budget_bytes = size_t{16} << 20;
  o.staging_budget_bytes = size_t{16} << 20;
  o.io = DiskIoBackend::kThreads;
  o.n_io_threads = 1;
  o.direct_io = false;  // tmpfs and friends refuse O_DIRECT; the format is the same
  o.verify_on_open = false;
  o.read_only = read_only;
  return o;
}

struct Snapshot {
  std::vector<PageKey> keys;
  std::vector<std::string> records;
  bool operator==(const Snapshot&) const = default;
};

// Reads every page and record and checks the store; what went wrong, or "".
inline std::string Touch(DiskTier& store, Snapshot& s) {
  s.keys = store.Keys();
  std::sort(s.keys.begin(), s.keys.end(), [](const PageKey& a, const PageKey& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  });
  for (const PageKey& key : s.keys) {
    auto info = store.Info(key);
    if (!info.ok()) return "Info of a listed key: " + info.status().ToString();
    if (info->payload_bytes > (size_t{64} << 20)) continue;  // declared, never allocated blindly
    std::vector<std::byte> bytes(info->payload_bytes);
    Status read = store.Read(key, bytes);
    if (!read.ok() && read.code() != StatusCode::kCorruption &&
        read.code() != StatusCode::kIOError) {
      return "read of a stored page: " + read.ToString();
    }
  }
  s.records = store.RecordNames();
  for (const std::string& name : s.records) {
    if (!store.GetRecord(name).ok()) return "GetRecord of a listed name: " + name;
  }
  auto check = store.Check();
  if (!check.ok() && check.status().message().empty()) return "Check without a message";
  return "";
}

}  // namespace journal_recovery

// What recovery from `data` did wrong, or "" (see the file comment).
inline std::string CheckJournalRecovery(const uint8_t* data, size_t size) {
  using namespace journal_recovery;
  if (size < 4) return "";
  const size_t journal_bytes = std::min<size_t>(size - 4, data[0] | size_t{data[1]} << 8);
  const size_t slot_units = data[2] | size_t{data[3]} << 8;
  const size_t slot_bytes = 512 * (slot_units == 0 ? 8 : slot_units);
  const auto* journal = reinterpret_cast<const std::byte*>(data + 4);
  const std::string& dir = Dir();
  std::error_code error;
  std::filesystem::remove_all(dir, error);
  std::filesystem::create_directories(dir, error);
  if (error || !WriteFileBytes(dir + "/journal", {journal, journal_bytes}).ok() ||
      !WriteFileBytes(dir + "/slots-" + std::to_string(slot_bytes) + ".dat",
                      {journal + journal_bytes, size - 4 - journal_bytes})
           .ok()) {
    return "writing the input to " + dir;
  }
  Snapshot first, again, read_only;
  {
    auto store = DiskTier::Open(Options(false));
    if (!store.ok()) return store.status().message().empty() ? "error without a message" : "";
    if (std::string e = Touch(**store, first); !e.empty()) return e;
  }
  {
    auto store = DiskTier::Open(Options(false));
    if (!store.ok()) return "second open of a store that opened: " + store.status().ToString();
    if (std::string e = Touch(**store, again); !e.empty()) return e;
  }
  if (!(again == first)) return "the second open differs (keys or records)";
  auto store = DiskTier::Open(Options(true));
  if (!store.ok()) return "read-only open of a store that opened: " + store.status().ToString();
  if (std::string e = Touch(**store, read_only); !e.empty()) return e;
  if (!(read_only == first)) return "the read-only open differs (keys or records)";
  return "";
}

}  // namespace argus::testing
