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
};

struct PlanPage {
  double value = 0;       // heat (plus a recency prior); only the order and ratios matter
  uint32_t best = 0;      // the best state the page may take (pins: 0; no promotion: current)
  uint32_t cheapest = 0;  // the cheapest state it may take (per-layer limits)
};

// Every page starts at its cheapest state; then single-rung upgrades are taken greedily by
// value * (error drop) / (extra bytes), each while it fits `ram_bytes`. Upgrades that cost no
// bytes are always taken. Returns the state per page. REQUIRES: states are ordered best first
// (errors non-increasing towards state 0) and best <= cheapest < states.size() for every page.
std::vector<uint32_t> PlanStates(std::span<const PlanState> states, std::span<const PlanPage> pages,
                                 size_t ram_bytes);

}  // namespace argus::policy_internal
