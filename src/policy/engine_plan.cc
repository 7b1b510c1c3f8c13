// The placement engine's plan: the request's full pages ranked and priced for the planner
// (planner.h), with pins, recalled pages and a long prefill's share of the budget applied; the
// planner's answer becomes each page's target state.
#include <algorithm>
#include <cmath>
#include <vector>

#include "policy/engine_impl.h"
#include "policy/planner.h"

namespace argus {

using policy_internal::PlanPage;
using policy_internal::PlanState;

// Ranks the request's full pages (of every sequence of a batch together) and sets target[] for
// each; reserve_bytes are kept free beyond the headroom (a bulk append's next pieces).
void PlacementEngine::Impl::Plan(size_t reserve_bytes, std::span<const PageId> hot) {
  Grow();
  const PageTable& t = PageTableOf(cache);
  const std::vector<PlacedPage> pages = SequencePages();
  const CacheStats cs = cache.stats();
  // Bytes outside the plan: active pages, and pages shared between sequences.
  size_t fixed = cs.ram_page_bytes;
  for (const PlacedPage& placed : pages) {
    if (t.tier[placed.view.id] == TierKind::kRam) fixed -= t.n_bytes[placed.view.id];
  }
  const size_t reserved = fixed + headroom_bytes + reserve_bytes;
  size_t budget = cs.ram.budget_bytes > reserved ? cs.ram.budget_bytes - reserved : 0;

  std::vector<PlanState> plan_states;
  for (const ResolvedState& s : states) {
    plan_states.push_back({s.ram_bytes, s.error,
                           s.tier == TierKind::kRam && s.error >= kSketchPrice,
                           s.tier == TierKind::kDisk});
  }
  std::vector<PlanPage> plan_pages;
  std::vector<PageId> ids;
  const uint32_t pt = cache.page_tokens();
  auto uniform_share = [&](const PlacedPage& placed) {
    return 1.0 / std::max<double>(1.0, std::ceil(placed.layer_tokens / static_cast<double>(pt)));
  };
  // Pages in state 0 that were retrieved (a hot step) stay there while their recall signal
  // lasts, the most recalled first: re-reading a recalled page at its next retrieval is what the
  // offline optimum avoids. They may take at most a quarter of the budget, and only what leaves
  // every other page room for the safe floor (a sketch key misplaces mass on every page it holds,
  // which makes pages look hot and feeds more promotions).
  // In a batch the pins of all sequences may outgrow the budget: they are a preference (pages a
  // step will attend soon stay in their best state), not a need, so then they yield and every
  // page is placed by its value; only the pages hot in this step keep theirs.
  bool pins_hold = true;
  auto is_pinned = [&](const PlacedPage& placed) {
    const uint32_t first = placed.view.first_token;
    const bool pinned =
        first < profile.pin_sinks || first + pt + profile.pin_recent > placed.layer_tokens;
    return (pins_hold && pinned) || std::find(hot.begin(), hot.end(), placed.view.id) != hot.end();
  };
  auto count_pinned = [&] {
    return static_cast<size_t>(std::count_if(pages.begin(), pages.end(), [&](const PlacedPage& pp) {
      return CurrentState(pp.view.id) < states.size() && is_pinned(pp);
    }));
  };
  if (is_batch && count_pinned() * page_bytes > budget) pins_hold = false;
  std::vector<PageId> recalled;
  size_t n_pinned = 0, n_free = 0;
  for (const PlacedPage& placed : pages) {
    const PageId p = placed.view.id;
    if (CurrentState(p) >= states.size()) continue;
    if (is_pinned(placed)) {
      ++n_pinned;
      continue;
    }
    ++n_free;
    const size_t n_pages = placed.layer_tokens / pt;
    if (profile.promote && CurrentState(p) == 0 && recall[p] >= HotMass(n_pages)) {
      recalled.push_back(p);
    }
  }
  // While the sequence is still far from its expected length (a long prefill), the unpinned
  // pages plan with their share of the budget at that length, so that each is re-encoded once,
  // to about its final state, rather than one rung at a time as the context grows. A batch's
  // sequences have no length of their own to expect.
  uint32_t longest = 0;
  for (uint32_t layer = 0; !is_batch && layer < cache.geometry().n_layers; ++layer) {
    auto len = cache.Length(seqs.front(), layer);
    if (len.ok()) longest = std::max(longest, *len);
  }
  const size_t pinned_bytes = n_pinned * page_bytes;
  if (!is_batch && expected_tokens > 0 && longest < expected_tokens / 2 && budget > pinned_bytes) {
    budget = pinned_bytes + static_cast<size_t>(static_cast<double>(budget - pinned_bytes) *
                                                longest / expected_tokens);
  }
  const size_t floor_bytes = pinned_bytes + n_free * safe_floor_bytes;
  const size_t allowance = std::min(budget / 4, budget > floor_bytes ? budget - floor_bytes : 0);
  std::sort(recalled.begin(), recalled.end(),
            [&](PageId a, PageId b) { return recall[a] > recall[b]; });
  recalled.resize(std::min(recalled.size(), allowance / std::max<size_t>(page_bytes, 1)));
  for (const PlacedPage& placed : pages) {
    const PageId p = placed.view.id;
    const uint32_t current = CurrentState(p);
    if (current >= states.size()) continue;  // not a ladder state: left alone
    const uint32_t layer = t.layer[p];
    const uint32_t len = placed.layer_tokens;
    const uint32_t first = placed.view.first_token;
    const bool pinned =
        is_pinned(placed) || std::find(recalled.begin(), recalled.end(), p) != recalled.end();
    PlanPage pp;
    pp.layer = layer;
    const double recency = (first + 1.0) / std::max(len, 1u);
    // A lossy key misplaces mass onto its page whatever mass the page really has, so every
    // page is worth at least a uniform share of its layer.
    pp.value = profile.ranking == Ranking::kRecency
                   ? recency
                   : heat[p] + uniform_share(placed) + 1e-6 * recency;
    pp.cheapest = pinned ? 0 : cheapest_of_layer[layer];
    // Promotion reads a master: only for pages whose heat is half the hot mass (steadily hot;
    // a page hot in one step is promoted inside that step), so that pages do not churn.
    const bool warm = heat[p] >= HotMass(len / pt) / 2;
    pp.best = pinned || (profile.promote && warm) ? 0 : std::min(current, pp.cheapest);
    // Without a master, precision a page lost cannot come back.
    if (!pinned && t.master_key[p] == PageKey{}) {
      pp.best = std::max(pp.best, std::min(current, pp.cheapest));
    }
    plan_pages.push_back(pp);
    ids.push_back(p);
  }
  // A sketch costs a page its quality, the disk costs time: the planner serves the coldest
  // sketched pages from disk instead, as many as the step's time share for disk reads holds and
  // as one layer's attention call can stage at once (it holds a layer's disk pages while it
  // reads them: all of them with a skipping epsilon).
  stats.n_disk_pages_allowed = DiskPagesAllowed();
  const std::vector<uint32_t> plan = policy_internal::PlanStates(
      plan_states, plan_pages, budget, stats.n_disk_pages_allowed, StagedPages());
  for (size_t i = 0; i < ids.size(); ++i) target[ids[i]] = plan[i];
  ++stats.n_plans;
  steps_since_plan = 0;
  plan_due = false;
}

size_t PlacementEngine::Impl::StagedPages() const {
  const DiskTier* disk = cache.disk();
  return disk == nullptr ? 0 : disk->options().staging_budget_bytes / disk->SlotBytes(page_bytes);
}

// The disk pages a step may read in its time share, from the measured step time and disk rate.
size_t PlacementEngine::Impl::DiskPagesAllowed() const {
  // Without masters a page would move to disk as it is: still a sketch, and slower.
  if (profile.masters == MasterRule::kNever) return 0;
  const double bytes = options.disk_time_share * stats.step_seconds * stats.disk_read_gbps * 1e9;
  const double pages = bytes / static_cast<double>(std::max<size_t>(page_bytes, 1));
  return static_cast<size_t>(std::min(pages, 1e15));  // a share too large to matter: no limit
}

}  // namespace argus
