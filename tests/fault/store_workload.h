// A store workload for the fault and power-loss tests: replacements, a batch, erasures, a named
// record, a second slot size and a compaction, each step with the state it leaves, and a check
// that a store holds, for every key, one of the states a test allows (never torn or foreign
// bytes).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "argus/store.h"
#include "crash/versioned_page.h"

namespace argus::testing {

// What may be stored under each page key and the record: a version, or nullopt for absent.
using WorkloadState = std::map<uint64_t, std::optional<uint64_t>>;
using AllowedStates = std::map<uint64_t, std::set<std::optional<uint64_t>>>;
inline constexpr uint64_t kWorkloadRecordKey = 100;  // the named record "r", its version inside
inline constexpr size_t kWorkloadPageBytes[] = {3000, 700, 700, 7000};

// A store in `dir` on `env` read by a pread pool with buffered I/O (the power-loss model reads a
// file's bytes before changing them, and refuses O_DIRECT).
inline DiskTierOptions BufferedStoreOptions(const std::string& dir, Env* env) {
  DiskTierOptions o;
  o.dir = dir;
  o.env = env;
  o.disk_budget_bytes = size_t{16} << 20;
  o.io = DiskIoBackend::kThreads;
  o.n_io_threads = 2;
  o.direct_io = false;
  return o;
}

inline std::vector<std::byte> WorkloadRecordValue(uint64_t version) {
  const std::string text = "record version " + std::to_string(version);
  const auto bytes = std::as_bytes(std::span(text));
  return {bytes.begin(), bytes.end()};
}

struct WorkloadStep {
  WorkloadState changes;  // the state this step leaves, for the keys it touches
  std::function<Status(DiskTier&)> run;
};

inline Status PutWorkloadPages(DiskTier& store, std::vector<std::pair<uint64_t, uint64_t>> pages) {
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PagePut> puts;
  for (const auto& [k, version] : pages)
    payloads.push_back(VersionedPayload(TestPageKey(k), version, kWorkloadPageBytes[k]));
  for (size_t i = 0; i < pages.size(); ++i)
    puts.push_back({TestPageKey(pages[i].first), "t", payloads[i]});
  return store.Put(puts);
}

inline std::vector<WorkloadStep> StoreWorkload() {
  auto put = [](std::vector<std::pair<uint64_t, uint64_t>> pages) {
    WorkloadStep s;
    for (const auto& [k, v] : pages) s.changes[k] = v;
    s.run = [pages](DiskTier& store) { return PutWorkloadPages(store, pages); };
    return s;
  };
  auto erase = [](uint64_t k) {
    return WorkloadStep{{{k, std::nullopt}}, [k](DiskTier& store) {
                          const PageKey key = TestPageKey(k);
                          return store.Erase(std::span<const PageKey>(&key, 1));
                        }};
  };
  auto record = [](uint64_t v) {
    return WorkloadStep{{{kWorkloadRecordKey, v}}, [v](DiskTier& store) {
                          return store.PutRecord("r", WorkloadRecordValue(v));
                        }};
  };
  return {put({{0, 1}}),
          put({{1, 1}, {2, 1}}),
          put({{0, 2}}),
          erase(1),
          record(1),
          put({{3, 1}}),
          {{}, [](DiskTier& store) { return store.Compact(); }},
          put({{2, 2}, {3, 2}}),
          erase(0),
          record(2)};
}

// Every key absent: the state before the workload.
inline AllowedStates WorkloadStartStates() {
  AllowedStates allowed;
  for (uint64_t k : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, kWorkloadRecordKey})
    allowed[k] = {std::nullopt};
  return allowed;
}

// After a step: a durable (OK) step leaves only its new states; a failed one may have happened
// or not.
inline void ApplyWorkloadStep(const WorkloadStep& step, bool ok, AllowedStates& allowed) {
  for (const auto& [k, v] : step.changes) {
    if (ok) allowed[k].clear();
    allowed[k].insert(v);
  }
}

// What each key holds now, "" when it is one of `allowed`, else what is wrong. With
// read_errors_allowed, a page whose read fails with IOError counts as unknown (not wrong); a
// page read is never allowed to return bytes of no version or of a version not allowed.
inline std::string VerifyWorkload(DiskTier& store, const AllowedStates& allowed,
                                  WorkloadState& found, bool read_errors_allowed = false) {
  for (const auto& [k, states] : allowed) {
    std::optional<uint64_t> got;
    if (k == kWorkloadRecordKey) {
      auto value = store.GetRecord("r");
      if (value.ok()) {
        for (uint64_t v : {uint64_t{1}, uint64_t{2}})
          if (*value == WorkloadRecordValue(v)) got = v;
        if (!got) return "the record holds bytes of no version";
      }
    } else if (store.Contains(TestPageKey(k))) {
      std::vector<std::byte> bytes(kWorkloadPageBytes[k]);
      const Status read = store.Read(TestPageKey(k), bytes);
      if (!read.ok() && read_errors_allowed && read.code() == StatusCode::kIOError) continue;
      if (!read.ok()) return "page " + std::to_string(k) + ": " + read.ToString();
      got = PayloadVersion(TestPageKey(k), bytes);
      if (!got) return "page " + std::to_string(k) + " served torn or foreign bytes";
    }
    if (!states.contains(got)) {
      return "key " + std::to_string(k) + " holds " + (got ? std::to_string(*got) : "nothing") +
             ", not what a durable or in-flight call left";
    }
    found[k] = got;
  }
  return "";
}

}  // namespace argus::testing
