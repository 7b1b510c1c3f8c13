#include "policy/planner.h"

#include <algorithm>
#include <queue>

namespace argus::policy_internal {
namespace {

std::vector<uint32_t> PlanGreedily(std::span<const PlanState> states,
                                   std::span<const PlanPage> pages, size_t ram_bytes) {
  std::vector<uint32_t> plan(pages.size());
  size_t used = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    plan[i] = pages[i].cheapest;
    used += states[plan[i]].ram_bytes;
  }
  struct Upgrade {
    double gain_per_byte;
    size_t page;
    bool operator<(const Upgrade& o) const {
      // Ties go to the lower page index: pages come in a stable order, so plans are repeatable.
      return gain_per_byte != o.gain_per_byte ? gain_per_byte < o.gain_per_byte : page > o.page;
    }
  };
  std::priority_queue<Upgrade> queue;
  // The next rung of page i, or nothing when it is at its best. Free rungs are taken at once.
  auto push_next = [&](size_t i) {
    while (plan[i] > pages[i].best) {
      const PlanState& from = states[plan[i]];
      const PlanState& to = states[plan[i] - 1];
      if (to.ram_bytes > from.ram_bytes) {
        const double gain = pages[i].value * (from.error - to.error);
        queue.push({gain / static_cast<double>(to.ram_bytes - from.ram_bytes), i});
        return;
      }
      used -= from.ram_bytes - to.ram_bytes;
      --plan[i];
    }
  };
  for (size_t i = 0; i < pages.size(); ++i) push_next(i);
  while (!queue.empty()) {
    const size_t i = queue.top().page;
    queue.pop();
    const size_t extra = states[plan[i] - 1].ram_bytes - states[plan[i]].ram_bytes;
    if (used + extra > ram_bytes) continue;  // this page stays; cheaper rungs of others may fit
    used += extra;
    --plan[i];
    push_next(i);
  }
  return plan;
}

}  // namespace

std::vector<uint32_t> PlanStates(std::span<const PlanState> states, std::span<const PlanPage> pages,
                                 size_t ram_bytes, size_t max_disk_pages,
                                 size_t max_disk_pages_per_layer) {
  std::vector<uint32_t> plan = PlanGreedily(states, pages, ram_bytes);
  const auto disk = std::find_if(states.begin(), states.end(), [](auto& s) { return s.disk; });
  if (disk == states.end()) return plan;
  const auto disk_state = static_cast<uint32_t>(disk - states.begin());
  uint32_t n_layers = 0;
  for (const PlanPage& page : pages) n_layers = std::max(n_layers, page.layer + 1);
  std::vector<size_t> sketched, on_disk_of_layer(n_layers, 0);
  size_t n_on_disk = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i] == disk_state) {
      ++n_on_disk;
      ++on_disk_of_layer[pages[i].layer];
    }
    if (states[plan[i]].sketch && pages[i].cheapest == disk_state) sketched.push_back(i);
  }
  if (sketched.empty() || n_on_disk >= max_disk_pages) return plan;
  std::stable_sort(sketched.begin(), sketched.end(),
                   [&](size_t a, size_t b) { return pages[a].value < pages[b].value; });
  // Coldest first, the pages a layer's share of the staging leaves room for: every prefix of
  // the list keeps each layer within it.
  std::vector<size_t> candidates;
  for (size_t i : sketched) {
    if (on_disk_of_layer[pages[i].layer] < max_disk_pages_per_layer) {
      ++on_disk_of_layer[pages[i].layer];
      candidates.push_back(i);
    }
  }
  sketched = std::move(candidates);
  if (sketched.empty()) return plan;
  // The k coldest sketched pages on disk, the others replanned in the RAM they leave; the
  // smallest k after which no page is left in a sketch state, found by bisection (the RAM left
  // to the others only grows with k), or the most the allowance holds.
  std::vector<PlanPage> fixed(pages.begin(), pages.end());
  auto plan_with = [&](size_t k) {
    for (size_t j = 0; j < sketched.size(); ++j) {
      fixed[sketched[j]].best = j < k ? disk_state : pages[sketched[j]].best;
    }
    return PlanGreedily(states, fixed, ram_bytes);
  };
  auto has_sketch = [&](const std::vector<uint32_t>& p) {
    return std::any_of(p.begin(), p.end(), [&](uint32_t s) { return states[s].sketch; });
  };
  size_t lo = 1, hi = std::min(sketched.size(), max_disk_pages - n_on_disk);
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (has_sketch(plan_with(mid))) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return plan_with(lo);
}

}  // namespace argus::policy_internal
