#include "policy/planner.h"

#include <queue>

namespace argus::policy_internal {

std::vector<uint32_t> PlanStates(std::span<const PlanState> states, std::span<const PlanPage> pages,
                                 size_t ram_bytes) {
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

}  // namespace argus::policy_internal
