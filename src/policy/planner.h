// The placement plan: which ladder state each page should hold, from page values and state
// costs, under a RAM byte budget. Pure (no cache, no I/O), so it is tested on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace argus::policy_internal {

struct PlanState {
  size_t ram_bytes = 0;  // bytes a page in this state holds in RAM (0 on disk)
  double error = 0;      // the planner's cost of serving a page from this state (see planner.cc)
  bool sketch = false;   // a RAM state that keeps too little of the page to be worth its error
  bool disk = false;     // the page's exact master on disk
};

struct PlanPage {
  double value = 0;       // heat (plus a recency prior); only the order and ratios matter
  uint32_t best = 0;      // the best state the page may take (pins: 0; no promotion: current)
  uint32_t cheapest = 0;  // the cheapest state it may take (per-layer limits)
  uint32_t layer = 0;     // pages of one layer are attended in one call
};

// Every page starts at its cheapest state; then single-rung upgrades are taken greedily by
// value * (error drop) / (extra bytes), each while it fits `ram_bytes`. Upgrades that cost no
// bytes are always taken. Then, if the plan leaves pages in sketch states, the lowest-valued of
// those whose cheapest state is the disk state are served from disk instead, and the plan is
// redone with them fixed there (the RAM they leave goes to the others): as few as leave no page
// in a sketch state, and at most as many as bring the pages planned on disk to
// `max_disk_pages`, and those of any one layer to `max_disk_pages_per_layer` (what one
// attention call can stage). Returns the state per page. REQUIRES: states are ordered
// best first (errors non-increasing towards state 0), at most one is a disk state, and
// best <= cheapest < states.size() for every page.
std::vector<uint32_t> PlanStates(std::span<const PlanState> states, std::span<const PlanPage> pages,
                                 size_t ram_bytes, size_t max_disk_pages = 0,
                                 size_t max_disk_pages_per_layer = SIZE_MAX);

}  // namespace argus::policy_internal
