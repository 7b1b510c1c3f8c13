// The placement engine's per-page signals: heat (an EMA of the attention mass), recall (the
// largest mass, slowly decaying) and prefetch marks, kept per page id beside the page table.
#include <algorithm>
#include <string>
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

Status PlacementEngine::Impl::CheckSequence(SeqId seq) const {
  if (std::find(seqs.begin(), seqs.end(), seq) != seqs.end()) return Status::Ok();
  return Status::NotFound("placement: sequence " + std::to_string(seq) + " is not in the request");
}

std::vector<PlacementEngine::Impl::PlacedPage> PlacementEngine::Impl::SequencePages() const {
  std::vector<PlacedPage> all;
  const PageTable& t = PageTableOf(cache);
  for (SeqId seq : seqs) {
    for (uint32_t layer = 0; layer < cache.geometry().n_layers; ++layer) {
      auto pages = cache.Pages(seq, layer);
      auto length = cache.Length(seq, layer);
      if (!pages.ok() || !length.ok()) continue;
      const size_t first = all.size();
      for (const PageView& view : *pages) {
        // Full pages only; pages shared with forked sequences or pinned are left as they are.
        if (view.key_min != nullptr && t.ref_count[view.id] == 1 && t.pin_count[view.id] == 0) {
          all.push_back({view, *length, 0});
        }
      }
      for (size_t i = first; i < all.size(); ++i) {
        all[i].layer_pages = static_cast<uint32_t>(all.size() - first);
      }
    }
  }
  return all;
}

void PlacementEngine::Impl::UpdateHeat(const std::vector<PlacedPage>& pages) {
  const PageTable& t = PageTableOf(cache);
  bool hot = false;
  uint64_t clock = heat_clock;
  for (const PlacedPage& placed : pages) {
    const PageId p = placed.view.id;
    clock = std::max(clock, t.last_use[p]);
    const double mass = !is_batch || t.last_use[p] > heat_clock ? t.mass[p] : 0.0;
    heat[p] = profile.heat_decay * heat[p] + (1 - profile.heat_decay) * mass;
    recall[p] = std::max(recall[p] * kRecallDecay, mass);
    if (mass >= HotMass(placed.layer_pages)) {
      if (prefetched[p]) {
        ++stats.n_prefetches_used;
        prefetched[p] = 0;
      }
      if (profile.promote && CurrentState(p) > 0) hot = true;
    }
  }
  heat_clock = clock;
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
