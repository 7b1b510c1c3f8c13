// The placement engine's migrations: the demotions and promotions a plan asks for, the masters
// they need, room made for an append, and the promotions a decode step needs at once.
#include <algorithm>
#include <string>
#include <vector>

#include "policy/engine_impl.h"

namespace argus {

// Issues the migrations the plan asks for: demotions first (they free RAM), then promotions,
// hottest first, while the staging bytes allow.
Status PlacementEngine::Impl::Issue(bool synchronous, const std::vector<PageId>* promote_only) {
  Grow();
  if (synchronous) ARGUS_RETURN_IF_ERROR(WriteMastersNow());
  const std::vector<PlacedPage> pages = SequencePages();
  std::vector<const PageView*> up;
  for (const PlacedPage& placed : pages) {
    const PageView& view = placed.view;
    const PageId p = view.id;
    if (in_flight[p]) continue;
    const uint32_t current = CurrentState(p);
    if (current >= states.size()) continue;
    if (target[p] > current) {
      const Status status = Demote(view, target[p], synchronous);
      if (!status.ok()) {
        // Room a step needs: its error is the step's. In the background: the next plan retries.
        if (synchronous) return status;
        stats.last_error = status.ToString();
      }
    } else if (target[p] < current) {
      if (promote_only == nullptr ||
          std::find(promote_only->begin(), promote_only->end(), p) != promote_only->end()) {
        up.push_back(&view);
      }
    } else if (profile.masters == MasterRule::kAlways && !synchronous) {
      // Masters of pages that stay where they are are written in the background, so that a
      // later demotion costs no write.
      ARGUS_RETURN_IF_ERROR(Demote(view, current, false));
    }
  }
  std::stable_sort(up.begin(), up.end(),
                   [&](const PageView* a, const PageView* b) { return heat[a->id] > heat[b->id]; });
  for (const PageView* view : up) {
    ARGUS_RETURN_IF_ERROR(Promote(*view, target[view->id], synchronous));
  }
  return Status::Ok();
}

// Writes, in batches of one durable Put each, the masters the plan's demotions need (straight
// from the pages' RAM bytes) and attaches them.
Status PlacementEngine::Impl::WriteMastersNow() {
  const PageTable& t = PageTableOf(cache);
  const std::vector<PlacedPage> pages = SequencePages();
  const std::string tag = DiskTag(cache, FullKCodec(cache), FullVCodec(cache));
  constexpr size_t kBatchBytes = size_t{64} << 20;
  std::vector<PagePut> puts;
  std::vector<const PageView*> batch;
  size_t batch_bytes = 0;
  auto flush = [&]() -> Status {
    if (puts.empty()) return Status::Ok();
    ARGUS_RETURN_IF_ERROR(cache.disk()->Put(puts));
    for (size_t i = 0; i < puts.size(); ++i) {
      const PageId p = batch[i]->id;
      stats.master_bytes_written += puts[i].payload.size();
      if (!AttachMaster(cache, p, t.generation[p], puts[i].key, t.checksum[p]).ok()) {
        (void)cache.disk()->Erase(std::span<const PageKey>(&puts[i].key, 1));
      }
    }
    puts.clear();
    batch.clear();
    batch_bytes = 0;
    return Status::Ok();
  };
  for (const PlacedPage& placed : pages) {
    const PageView& view = placed.view;
    const PageId p = view.id;
    if (in_flight[p] || t.master_key[p] != PageKey{} || CurrentState(p) != 0) continue;
    if (target[p] == 0 || !NeedsMaster(target[p])) continue;
    puts.push_back({NewDiskKey(cache), tag, std::span<const std::byte>(view.bytes, view.n_bytes)});
    batch.push_back(&view);
    batch_bytes += view.n_bytes;
    if (batch_bytes >= kBatchBytes) ARGUS_RETURN_IF_ERROR(flush());
  }
  return flush();
}

// Moves a page down to state `to`; with `to` its current state, writes its master if the
// profile keeps one and it has none.
Status PlacementEngine::Impl::Demote(const PageView& view, uint32_t to, bool synchronous) {
  const PageTable& t = PageTableOf(cache);
  const PageId page = view.id;
  auto copy_of = [&](Job& job) -> Status {
    ARGUS_ASSIGN_OR_RETURN(job.src, AlignedBuffer::Allocate(view.n_bytes));
    std::copy_n(view.bytes, view.n_bytes, job.src.data());
    return Status::Ok();
  };
  // State 0 holds the exact bytes in RAM: the only copy a master is written from.
  if (t.master_key[page] == PageKey{} && NeedsMaster(to) && CurrentState(page) == 0) {
    Job job;
    job.kind = Job::Kind::kWriteMaster;
    job.page = page;
    job.generation = t.generation[page];
    job.key = NewDiskKey(cache);
    job.checksum = t.checksum[page];
    job.tag = DiskTag(cache, FullKCodec(cache), FullVCodec(cache));
    ARGUS_RETURN_IF_ERROR(copy_of(job));
    ARGUS_RETURN_IF_ERROR(Start(std::move(job), synchronous));
    // In the background the demotion follows at a later step, once the master is attached.
    if (!synchronous || t.master_key[page] == PageKey{}) return Status::Ok();
  }
  if (to == CurrentState(page)) return Status::Ok();
  if (to == disk_state) {
    if (t.master_key[page] != PageKey{}) {
      ARGUS_RETURN_IF_ERROR(DropToMaster(cache, page));
    } else {
      ARGUS_RETURN_IF_ERROR(cache.MoveToDisk(page));
    }
    if (prefetched[page]) {
      ++stats.n_prefetches_wasted;
      prefetched[page] = 0;
    }
    ++stats.n_demotions;
    return Status::Ok();
  }
  const ResolvedState& dst = states[to];
  Job job;
  job.page = page;
  job.generation = t.generation[page];
  job.target = to;
  job.src_k = t.k_codec[page];
  job.src_v = t.v_codec[page];
  job.dst_k = dst.k;
  job.dst_v = dst.v;
  ARGUS_RETURN_IF_ERROR(copy_of(job));
  ARGUS_ASSIGN_OR_RETURN(job.dst, AlignedBuffer::Allocate(dst.ram_bytes));
  return Start(std::move(job), synchronous);
}

Status PlacementEngine::Impl::Promote(const PageView& view, uint32_t to, bool synchronous) {
  const PageTable& t = PageTableOf(cache);
  const PageId page = view.id;
  if (t.master_key[page] == PageKey{}) return Status::Ok();  // nothing better to fetch
  const ResolvedState& dst = states[to];
  Job job;
  job.page = page;
  job.generation = t.generation[page];
  job.target = to;
  job.promotion = true;
  job.from_master = true;
  job.key = t.master_key[page];
  job.checksum = t.master_checksum[page];
  job.src_k = FullKCodec(cache);
  job.src_v = FullVCodec(cache);
  job.dst_k = dst.k;
  job.dst_v = dst.v;
  ARGUS_ASSIGN_OR_RETURN(job.src, AlignedBuffer::Allocate(page_bytes));
  ARGUS_ASSIGN_OR_RETURN(job.dst, AlignedBuffer::Allocate(dst.ram_bytes));
  return Start(std::move(job), synchronous);
}

// Makes room for a bulk append by demoting synchronously: waits for migrations in flight, plans
// with `reserve_bytes` more kept free, and runs the plan's demotions and master writes inline.
Status PlacementEngine::Impl::MakeRoom(size_t reserve_bytes) {
  Drain();
  Plan(reserve_bytes);
  return Issue(/*synchronous=*/true);
}

// Promotes, synchronously, the layer's lossy or disk pages that the last attention call found
// hot (those with a master). When free RAM cannot take them, the plan is redone with them in
// state 0 and run inline: the step needs them.
Result<bool> PlacementEngine::Impl::PromoteHotNow(SeqId seq, uint32_t layer) {
  Grow();
  const PageTable& t = PageTableOf(cache);
  ARGUS_ASSIGN_OR_RETURN(std::vector<PageView> pages, cache.Pages(seq, layer));
  std::vector<PageId> hot;
  size_t need = 0;
  const size_t n_full = static_cast<size_t>(std::count_if(
      pages.begin(), pages.end(), [](const PageView& v) { return v.key_min != nullptr; }));
  for (const PageView& view : pages) {
    const PageId p = view.id;
    if (view.key_min == nullptr || t.mass[p] < HotMass(n_full) || in_flight[p]) continue;
    const uint32_t current = CurrentState(p);
    if (current == 0 || current >= states.size() || t.master_key[p] == PageKey{}) continue;
    hot.push_back(p);
  }
  if (hot.empty()) return false;
  // The hottest few: a retrieval hits a page or two per layer; more means lossy keys spread
  // the mass, which promoting cannot be the answer to.
  std::sort(hot.begin(), hot.end(), [&](PageId a, PageId b) { return t.mass[a] > t.mass[b]; });
  if (hot.size() > kMaxPromotionsPerCall) hot.erase(hot.begin() + kMaxPromotionsPerCall, hot.end());
  for (const PageView& view : pages) {
    if (std::find(hot.begin(), hot.end(), view.id) != hot.end()) {
      need += page_bytes - (view.tier == TierKind::kRam ? view.n_bytes : 0);
    }
  }
  const RamTierStats ram = cache.stats().ram;
  const bool fits = ram.used_bytes + need <= ram.budget_bytes;
  if (!fits) {
    Drain();  // commits background promotions, as prefetches
    Plan(0, hot);
  }
  const uint64_t before = stats.n_promotions_on_demand;
  on_demand = true;
  auto promote = [&]() -> Status {
    if (!fits) return Issue(/*synchronous=*/true, &hot);
    for (const PageView& view : pages) {
      if (std::find(hot.begin(), hot.end(), view.id) == hot.end()) continue;
      target[view.id] = 0;
      ARGUS_RETURN_IF_ERROR(Promote(view, 0, /*synchronous=*/true));
    }
    return Status::Ok();
  };
  const Status status = promote();
  on_demand = false;
  ARGUS_RETURN_IF_ERROR(status);
  return stats.n_promotions_on_demand > before;
}

}  // namespace argus
