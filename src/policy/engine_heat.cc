// The placement engine's per-page signals: heat (an EMA of the attention mass), recall (the
// largest mass, slowly decaying) and prefetch marks, kept per page id beside the page table.
#include <algorithm>
#include <vector>

#include "policy/engine_impl.h"

namespace argus {

void PlacementEngine::Impl::Grow() {
  const size_t n = PageTableOf(cache).size();
  if (heat.size() >= n) return;
  heat.resize(n, 0.0);
  recall.resize(n, 0.0);
  target.resize(n, 0);
  in_flight.resize(n, 0);
  prefetched.resize(n, 0);
}

std::vector<PageView> PlacementEngine::Impl::SequencePages() const {
  std::vector<PageView> all;
  for (uint32_t layer = 0; layer < cache.geometry().n_layers; ++layer) {
    auto pages = cache.Pages(seq, layer);
    if (!pages.ok()) continue;
    const PageTable& t = PageTableOf(cache);
    for (const PageView& view : *pages) {
      // Full pages only; pages shared with forked sequences or pinned are left as they are.
      if (view.key_min != nullptr && t.ref_count[view.id] == 1 && t.pin_count[view.id] == 0) {
        all.push_back(view);
      }
    }
  }
  return all;
}

void PlacementEngine::Impl::UpdateHeat(const std::vector<PageView>& pages) {
  const PageTable& t = PageTableOf(cache);
  std::vector<size_t> pages_per_layer(cache.geometry().n_layers, 0);
  for (const PageView& view : pages) ++pages_per_layer[t.layer[view.id]];
  bool hot = false;
  for (const PageView& view : pages) {
    const PageId p = view.id;
    const double mass = t.mass[p];
    heat[p] = profile.heat_decay * heat[p] + (1 - profile.heat_decay) * mass;
    recall[p] = std::max(recall[p] * kRecallDecay, mass);
    if (mass >= HotMass(pages_per_layer[t.layer[p]])) {
      if (prefetched[p]) {
        ++stats.n_prefetches_used;
        prefetched[p] = 0;
      }
      if (profile.promote && CurrentState(p) > 0) hot = true;
    }
  }
  if (hot) plan_due = true;
}

// Page ids are reused: a freed page's heat, recall and prefetch mark must not pass to the next.
void PlacementEngine::Impl::ForgetFreePages() {
  Grow();
  const PageTable& t = PageTableOf(cache);
  for (PageId p = 0; p < t.size(); ++p) {
    if (t.state[p] != PageState::kFree) continue;
    heat[p] = recall[p] = 0;
    prefetched[p] = 0;
  }
}

}  // namespace argus
