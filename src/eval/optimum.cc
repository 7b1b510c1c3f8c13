// Belady's MIN for steps that each need a set of pages at once (docs/traces.md, "The offline
// optimum"). Next uses are precomputed per page, and the resident pages sit in a set ordered by
// next use, so a trace of N page references costs O(N log N).
#include <algorithm>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "argus/eval.h"

namespace argus {

uint64_t OptimalMisses(std::span<const std::vector<uint32_t>> needed, size_t capacity,
                       std::span<const uint32_t> initial) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // Distinct pages per step, and a dense index for every page id seen.
  std::vector<std::vector<uint32_t>> steps(needed.size());
  std::vector<uint32_t> ids(initial.begin(), initial.end());
  for (size_t t = 0; t < needed.size(); ++t) {
    steps[t] = needed[t];
    std::sort(steps[t].begin(), steps[t].end());
    steps[t].erase(std::unique(steps[t].begin(), steps[t].end()), steps[t].end());
    ids.insert(ids.end(), steps[t].begin(), steps[t].end());
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  auto index_of = [&](uint32_t page) {
    return static_cast<size_t>(std::lower_bound(ids.begin(), ids.end(), page) - ids.begin());
  };
  for (auto& pages : steps) {
    for (uint32_t& p : pages) p = static_cast<uint32_t>(index_of(p));
  }

  // uses[first[p] .. first[p + 1]) are the steps needing page p, in order; cursor[p] is its
  // next one not yet reached.
  std::vector<size_t> first(ids.size() + 1, 0), cursor(ids.size());
  for (const auto& pages : steps) {
    for (uint32_t p : pages) ++first[p + 1];
  }
  for (size_t p = 0; p < ids.size(); ++p) first[p + 1] += first[p];
  std::vector<uint64_t> uses(first.back());
  for (size_t p = 0; p < ids.size(); ++p) cursor[p] = first[p];
  for (size_t t = 0; t < steps.size(); ++t) {
    for (uint32_t p : steps[t]) uses[cursor[p]++] = t;
  }
  for (size_t p = 0; p < ids.size(); ++p) cursor[p] = first[p];
  auto next_use = [&](uint32_t p) { return cursor[p] < first[p + 1] ? uses[cursor[p]] : kNever; };

  // Resident pages as (next use, page): the last element is the one needed farthest ahead.
  std::set<std::pair<uint64_t, uint32_t>> resident;
  std::vector<bool> is_resident(ids.size(), false);
  for (uint32_t page : initial) {
    const auto p = static_cast<uint32_t>(index_of(page));
    if (resident.size() == capacity || is_resident[p]) continue;  // the first `capacity` only
    is_resident[p] = true;
    resident.emplace(next_use(p), p);
  }
  auto evict_farthest = [&] {
    const auto last = std::prev(resident.end());
    is_resident[last->second] = false;
    resident.erase(last);
  };

  uint64_t n_misses = 0;
  for (size_t t = 0; t < steps.size(); ++t) {
    const std::vector<uint32_t>& pages = steps[t];
    for (uint32_t p : pages) {
      if (is_resident[p]) {
        resident.erase({t, p});
      } else {
        ++n_misses;
        is_resident[p] = true;
      }
      ++cursor[p];  // past step t
    }
    if (pages.size() <= capacity) {
      // The step's pages must all be resident together: evict among the others.
      while (resident.size() + pages.size() > capacity) evict_farthest();
      for (uint32_t p : pages) resident.emplace(next_use(p), p);
    } else {
      // The step cannot hold its pages at once: each one it lacked was fetched (a miss), and
      // the tier keeps, of everything it saw, the `capacity` pages needed soonest.
      for (uint32_t p : pages) resident.emplace(next_use(p), p);
      while (resident.size() > capacity) evict_farthest();
    }
  }
  return n_misses;
}

}  // namespace argus
