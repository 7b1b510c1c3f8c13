// The placement engine. Foreground (the caller's thread, between attention calls): heat, plans,
// and the commits that change the page table. Background (one worker thread): the slow part of
// each migration, on copies the foreground staged: writing a master, reading one back,
// re-encoding. A migration finished after its page changed is discarded (page generations), so
// the worker never needs the cache's lock it does not have.
//
// Migrations of a page, by what it holds and what the plan wants:
//   down to a lossy RAM state: the master is written first when the profile keeps one, then the
//     RAM copy (the best copy there is) is re-encoded;
//   down to disk: the RAM copy is dropped when a master exists (else written first; without
//     masters the page itself moves, synchronously: only the no-promotion cascade does that);
//   up: the master is read and re-encoded to the better state (straight copy for state 0).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "argus/core.h"
#include "argus/policy.h"
#include "cache/placement_access.h"
#include "core/buffer.h"
#include "core/checksum.h"
#include "core/measure.h"
#include "policy/planner.h"

namespace argus {

using policy_internal::PlanPage;
using policy_internal::PlanState;

namespace {

struct ResolvedState {
  uint16_t k = 0, v = 0;
  TierKind tier = TierKind::kRam;
  size_t ram_bytes = 0;
  double error = 0;
};

struct Job {
  enum class Kind { kWriteMaster, kEncode } kind = Kind::kEncode;
  PageId page = kNoPage;
  uint32_t generation = 0;
  uint32_t target = 0;  // ladder state the page moves to (kEncode)
  bool promotion = false;
  bool from_master = false;  // kEncode: read the master first
  bool counted = false;      // its disk read is in the statistics (a waiting job commits again)
  uint16_t src_k = 0, src_v = 0, dst_k = 0, dst_v = 0;
  PageKey key;  // the master written (kWriteMaster) or read (from_master)
  uint64_t checksum = 0;
  std::string tag;
  AlignedBuffer src, dst;
  std::vector<float> summary;
  Status status;
  size_t staged_bytes() const { return src.size() + dst.size(); }
};

// Relative reconstruction error ||x' - x|| / ||x|| of a codec on synthetic K or V of this
// geometry: the planner's measured price of a lossy state.
Result<double> MeasureError(const Codec& codec, uint32_t tokens, uint32_t dim, bool keys) {
  SyntheticKvOptions o;
  o.regime = KeyRegime::kModerateOutliers;
  o.dim = dim;
  o.seed = 0x51ac3;
  const SyntheticKv kv = GenerateSyntheticKv(o, tokens);
  const std::vector<float>& x = keys ? kv.k : kv.v;
  ARGUS_ASSIGN_OR_RETURN(size_t n_bytes, codec.encoded_size({tokens, dim}));
  std::vector<std::byte> bytes(n_bytes);
  std::vector<float> y(x.size());
  ARGUS_RETURN_IF_ERROR(codec.encode(x.data(), {tokens, dim}, bytes));
  ARGUS_RETURN_IF_ERROR(codec.decode(bytes, {tokens, dim}, y.data()));
  return RelativeL2Error(std::span<const float>(y), std::span<const float>(x));
}

}  // namespace

constexpr double kRecallDecay = 0.99;
constexpr size_t kMaxPromotionsPerCall = 2;
// A RAM state priced at this or more is a sketch: its reconstruction error is as large as the
// signal it stores.
constexpr double kSketchPrice = 1.0;

struct PlacementEngine::Impl {
  Impl(KvCache& c, ThreadPool& p, const PlacementOptions& o)
      : cache(c), attention(p), options(o), profile(options.profile) {}

  KvCache& cache;
  AttentionEngine attention;
  PlacementOptions options;
  const Profile& profile;
  std::vector<ResolvedState> states;
  uint32_t disk_state = UINT32_MAX;  // index of the disk state, if the ladder has one
  std::unordered_map<uint32_t, uint32_t> state_of_codecs;  // (k << 16 | v) -> RAM state
  std::vector<uint32_t> cheapest_of_layer;
  size_t page_bytes = 0;  // a full page in state 0 (and an active page's slot)
  size_t headroom_bytes = 0;
  size_t safe_floor_bytes = 0;  // see Init

  // The request.
  SeqId seq = 0;
  bool in_request = false, active = false;
  uint32_t expected_tokens = 0;
  uint32_t steps_since_plan = 0;
  bool plan_due = false;
  std::optional<Clock::time_point> step_start;  // the last EndStep of the request

  // Per page id (grown with the page table).
  std::vector<double> heat;
  // The largest mass a page received, decaying by kRecallDecay per step: a page retrieved once
  // is likely to be retrieved again long after its heat has faded.
  std::vector<double> recall;
  std::vector<uint32_t> target;
  std::vector<uint8_t> in_flight, prefetched;

  // The worker.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue, done;
  size_t n_running = 0;
  size_t staged_bytes = 0;
  bool stopping = false;
  std::thread worker;
  AlignedBuffer worker_scratch, inline_scratch;
  // Finished promotions waiting for RAM freed by demotions still in flight.
  std::vector<Job> waiting;
  size_t waiting_bytes = 0;  // their staging (foreground only)

  PlacementStats stats;
  // Set while PromoteHotNow runs its promotions: they are fetched on demand, not ahead.
  bool on_demand = false;

  Status Init();
  Status MeasureBandwidth();
  void Grow();
  bool NeedsMaster(uint32_t state) const;
  // The mass that makes a page hot in a layer of n_pages pages: promote_mass, and at least twice
  // the uniform share (in a short layer every page has a large share).
  double HotMass(size_t n_pages) const {
    return std::max(profile.promote_mass, 2.0 / static_cast<double>(std::max<size_t>(n_pages, 1)));
  }
  uint32_t CurrentState(PageId page) const;
  std::vector<PageView> SequencePages() const;
  // hot: pages that must get state 0 (found hot inside a step).
  void Plan(size_t reserve_bytes, std::span<const PageId> hot = {});
  size_t DiskPagesAllowed() const;
  void UpdateHeat(const std::vector<PageView>& pages);
  // With promote_only, of the promotions only those.
  Status Issue(bool synchronous, const std::vector<PageId>* promote_only = nullptr);
  Status Demote(const PageView& view, uint32_t to, bool synchronous);
  Status Promote(const PageView& view, uint32_t to, bool synchronous);
  Status Start(Job job, bool synchronous);
  void Execute(Job& job, float* scratch);
  void Commit(Job& job);
  void CommitDone();
  void Drain();
  void WorkerLoop();
  Status MakeRoom(size_t reserve_bytes);
  void ForgetFreePages();
  // The epsilon of the request's attention calls.
  AttentionOptions Attention() const {
    AttentionOptions o;
    if (active) o.epsilon = profile.epsilon;
    return o;
  }
  void Count(const AttentionStats& s) {
    stats.attention_disk_bytes_read += s.disk_bytes_read;
    stats.n_tiles_skipped += s.n_tiles_skipped;
    stats.max_skipped_mass_bound = std::max(stats.max_skipped_mass_bound, s.skipped_mass_bound);
  }
  Status WriteMastersNow();
  Result<bool> PromoteHotNow(uint32_t layer);
  void Release(const Job& job);
};

Status PlacementEngine::Impl::Init() {
  ARGUS_RETURN_IF_ERROR(profile.Validate());
  if (!(options.disk_time_share >= 0) || std::isinf(options.disk_time_share)) {
    return Status::InvalidArgument("placement: disk_time_share must be a finite share >= 0, not " +
                                   std::to_string(options.disk_time_share));
  }
  const CacheGeometry& g = cache.geometry();
  if (profile.NeedsDisk() && cache.disk() == nullptr) {
    return Status::InvalidArgument("profile '" + profile.name +
                                   "' keeps pages or masters on disk: the cache needs a disk tier");
  }
  for (uint32_t i = 0; i < profile.ladder.size(); ++i) {
    const LadderState& s = profile.ladder[i];
    ResolvedState r;
    r.tier = s.tier;
    if (s.tier == TierKind::kDisk) {
      r.k = FullKCodec(cache);
      r.v = FullVCodec(cache);
      disk_state = i;
    } else {
      ARGUS_ASSIGN_OR_RETURN(r.k, AddCodec(cache, s.k_codec, CodecRole::kKeys));
      ARGUS_ASSIGN_OR_RETURN(r.v, AddCodec(cache, s.v_codec, CodecRole::kValues));
      r.ram_bytes = FullPageBytes(cache, r.k, r.v);
      ARGUS_ASSIGN_OR_RETURN(
          double ek, MeasureError(CodecAt(cache, r.k), cache.page_tokens(), g.head_dim, true));
      ARGUS_ASSIGN_OR_RETURN(
          double ev, MeasureError(CodecAt(cache, r.v), cache.page_tokens(), g.head_dim, false));
      // Down the ladder the price never falls, whatever the measurement says.
      r.error = std::max(ek + ev, i > 0 ? states.back().error : 0.0);
      state_of_codecs.emplace(uint32_t{r.k} << 16 | r.v, i);
    }
    states.push_back(r);
  }
  if (states[0].k != FullKCodec(cache) || states[0].v != FullVCodec(cache)) {
    return Status::InvalidArgument("profile '" + profile.name + "': the ladder starts with k " +
                                   profile.ladder[0].k_codec + ", v " + profile.ladder[0].v_codec +
                                   " but the cache fills pages in its own k and v codecs");
  }
  // Serving a page from disk costs a read at every step it is attended: price it far above
  // every codec's error, so that pages go there only when the cheapest RAM state cannot hold them
  // (or, within a time allowance, instead of a sketch: see Plan).
  if (disk_state != UINT32_MAX) states[disk_state].error = states[disk_state - 1].error + 1e3;

  // The safe floor: the cheapest RAM state that is not a sketch, else the cheapest RAM state.
  for (const ResolvedState& r : states) {
    if (r.tier == TierKind::kRam && (r.error < kSketchPrice || safe_floor_bytes == 0)) {
      safe_floor_bytes = r.ram_bytes;
    }
  }
  cheapest_of_layer.assign(g.n_layers, static_cast<uint32_t>(states.size() - 1));
  for (const LayerOverride& o : profile.layer_overrides) {
    for (uint32_t layer : o.layers) {
      if (layer < g.n_layers) {
        cheapest_of_layer[layer] = std::min(cheapest_of_layer[layer], o.max_state);
      }
    }
  }
  page_bytes = states[0].ram_bytes;
  // One promotion's page. A layer whose active page fills makes room for the next one itself
  // (Append), which costs that step one demotion every page_tokens steps.
  headroom_bytes = page_bytes;
  const size_t pt = cache.page_tokens();
  const size_t pinned_pages =
      (profile.pin_sinks + pt - 1) / pt + (profile.pin_recent + pt - 1) / pt + 1;
  const size_t active_bytes = FullPageBytes(cache, 0, 0);  // codec 0: the active codec
  const size_t need =
      ((pinned_pages - 1) * page_bytes + active_bytes) * g.n_layers + headroom_bytes;
  const size_t budget = cache.stats().ram.budget_bytes;
  if (need > budget) {
    return Status::InvalidArgument(
        "profile '" + profile.name + "': the RAM budget of " + std::to_string(budget) +
        " bytes cannot hold the pins: " + std::to_string(pinned_pages) +
        " pages per layer in state 0 (" + std::to_string(profile.pin_sinks) + " sink and " +
        std::to_string(profile.pin_recent) + " recent tokens, the active page) and one page of " +
        "headroom, " + std::to_string(need) + " bytes");
  }
  const size_t scratch_bytes = size_t{cache.page_tokens()} * g.head_dim * sizeof(float);
  ARGUS_ASSIGN_OR_RETURN(worker_scratch, AlignedBuffer::Allocate(scratch_bytes));
  ARGUS_ASSIGN_OR_RETURN(inline_scratch, AlignedBuffer::Allocate(scratch_bytes));
  stats.pages_per_state.assign(states.size(), 0);
  ARGUS_RETURN_IF_ERROR(MeasureBandwidth());
  if (options.background) worker = std::thread([this] { WorkerLoop(); });
  return Status::Ok();
}

// One page of state 0 copied in RAM and written to and read back from the disk tier (best of
// three reads each; O_DIRECT reads bypass the page cache).
Status PlacementEngine::Impl::MeasureBandwidth() {
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer a, AlignedBuffer::Allocate(page_bytes));
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::Allocate(page_bytes));
  auto best_gbps = [&](auto&& read) -> Result<double> {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = Clock::now();
      ARGUS_RETURN_IF_ERROR(read());
      const double s = Seconds(start);
      best = std::max(best, static_cast<double>(page_bytes) / std::max(s, 1e-9) / 1e9);
    }
    return best;
  };
  ARGUS_ASSIGN_OR_RETURN(stats.ram_read_gbps, best_gbps([&] {
                           std::copy_n(a.data(), page_bytes, b.data());
                           return Status::Ok();
                         }));
  DiskTier* disk = cache.disk();
  if (disk == nullptr) return Status::Ok();
  const PageKey key = NewDiskKey(cache);
  ARGUS_RETURN_IF_ERROR(disk->Put({key, "probe", a.span()}).WithContext("disk bandwidth probe"));
  auto read = best_gbps([&] { return disk->Read(key, b.span()); });
  const Status erased = disk->Erase(std::span<const PageKey>(&key, 1));
  ARGUS_ASSIGN_OR_RETURN(stats.disk_read_gbps, std::move(read));
  return erased;
}

void PlacementEngine::Impl::Grow() {
  const size_t n = PageTableOf(cache).size();
  if (heat.size() >= n) return;
  heat.resize(n, 0.0);
  recall.resize(n, 0.0);
  target.resize(n, 0);
  in_flight.resize(n, 0);
  prefetched.resize(n, 0);
}

bool PlacementEngine::Impl::NeedsMaster(uint32_t state) const {
  switch (profile.masters) {
    case MasterRule::kAlways:
      return true;
    case MasterRule::kLossy:
      return state > 0;
    case MasterRule::kNever:
      return false;
  }
  return false;
}

uint32_t PlacementEngine::Impl::CurrentState(PageId page) const {
  const PageTable& t = PageTableOf(cache);
  if (t.tier[page] == TierKind::kDisk) {
    return disk_state != UINT32_MAX ? disk_state : static_cast<uint32_t>(states.size());
  }
  auto it = state_of_codecs.find(uint32_t{t.k_codec[page]} << 16 | t.v_codec[page]);
  return it == state_of_codecs.end() ? static_cast<uint32_t>(states.size()) : it->second;
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

// Ranks the request's full pages and sets target[] for each; reserve_bytes are kept free beyond
// the headroom (a bulk append's next pieces).
void PlacementEngine::Impl::Plan(size_t reserve_bytes, std::span<const PageId> hot) {
  Grow();
  const PageTable& t = PageTableOf(cache);
  const std::vector<PageView> pages = SequencePages();
  const CacheStats cs = cache.stats();
  // Bytes outside the plan: active pages.
  size_t fixed = cs.ram_page_bytes;
  for (const PageView& view : pages) {
    if (t.tier[view.id] == TierKind::kRam) fixed -= t.n_bytes[view.id];
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
  std::vector<uint32_t> lengths(cache.geometry().n_layers, 0);
  for (uint32_t layer = 0; layer < lengths.size(); ++layer) {
    auto len = cache.Length(seq, layer);
    if (len.ok()) lengths[layer] = *len;
  }
  std::vector<double> uniform_share(lengths.size());
  for (size_t layer = 0; layer < lengths.size(); ++layer) {
    uniform_share[layer] =
        1.0 / std::max<double>(1.0, std::ceil(lengths[layer] / static_cast<double>(pt)));
  }
  // Pages in state 0 that were retrieved (a hot step) stay there while their recall signal
  // lasts, the most recalled first: re-reading a recalled page at its next retrieval is what the
  // offline optimum avoids. They may take at most a quarter of the budget, and only what leaves
  // every other page room for the safe floor (a sketch key misplaces mass on every page it holds,
  // which makes pages look hot and feeds more promotions).
  auto is_pinned = [&](PageId p, uint32_t first) {
    const uint32_t len = lengths[t.layer[p]];
    return first < profile.pin_sinks || first + pt + profile.pin_recent > len ||
           std::find(hot.begin(), hot.end(), p) != hot.end();
  };
  std::vector<PageId> recalled;
  size_t n_pinned = 0, n_free = 0;
  for (const PageView& view : pages) {
    const PageId p = view.id;
    if (CurrentState(p) >= states.size()) continue;
    if (is_pinned(p, view.first_token)) {
      ++n_pinned;
      continue;
    }
    ++n_free;
    const size_t n_pages = lengths[t.layer[p]] / pt;
    if (profile.promote && CurrentState(p) == 0 && recall[p] >= HotMass(n_pages)) {
      recalled.push_back(p);
    }
  }
  // While the sequence is still far from its expected length (a long prefill), the unpinned
  // pages plan with their share of the budget at that length, so that each is re-encoded once,
  // to about its final state, rather than one rung at a time as the context grows.
  const uint32_t longest = *std::max_element(lengths.begin(), lengths.end());
  const size_t pinned_bytes = n_pinned * page_bytes;
  if (expected_tokens > 0 && longest < expected_tokens / 2 && budget > pinned_bytes) {
    budget = pinned_bytes + static_cast<size_t>(static_cast<double>(budget - pinned_bytes) *
                                                longest / expected_tokens);
  }
  const size_t floor_bytes = pinned_bytes + n_free * safe_floor_bytes;
  const size_t allowance = std::min(budget / 4, budget > floor_bytes ? budget - floor_bytes : 0);
  std::sort(recalled.begin(), recalled.end(),
            [&](PageId a, PageId b) { return recall[a] > recall[b]; });
  recalled.resize(std::min(recalled.size(), allowance / std::max<size_t>(page_bytes, 1)));
  for (const PageView& view : pages) {
    const PageId p = view.id;
    const uint32_t current = CurrentState(p);
    if (current >= states.size()) continue;  // not a ladder state: left alone
    const uint32_t layer = t.layer[p];
    const uint32_t len = lengths[layer];
    const uint32_t first = view.first_token;
    const bool pinned =
        is_pinned(p, first) || std::find(recalled.begin(), recalled.end(), p) != recalled.end();
    PlanPage pp;
    const double recency = (first + 1.0) / std::max(len, 1u);
    // A lossy key misplaces mass onto its page whatever mass the page really has, so every
    // page is worth at least a uniform share of its layer.
    pp.value = profile.ranking == Ranking::kRecency
                   ? recency
                   : heat[p] + uniform_share[layer] + 1e-6 * recency;
    pp.cheapest = pinned ? 0 : cheapest_of_layer[layer];
    // Promotion reads a master: only for pages whose heat is half the hot mass (steadily hot;
    // a page hot in one step is promoted inside that step), so that pages do not churn.
    const bool warm = heat[p] >= HotMass(lengths[layer] / pt) / 2;
    pp.best = pinned || (profile.promote && warm) ? 0 : std::min(current, pp.cheapest);
    // Without a master, precision a page lost cannot come back.
    if (!pinned && t.master_key[p] == PageKey{}) {
      pp.best = std::max(pp.best, std::min(current, pp.cheapest));
    }
    plan_pages.push_back(pp);
    ids.push_back(p);
  }
  // A sketch costs a page its quality, the disk costs time: the planner serves the coldest
  // sketched pages from disk instead, as many as the step's time share for disk reads holds.
  stats.n_disk_pages_allowed = DiskPagesAllowed();
  const std::vector<uint32_t> plan =
      policy_internal::PlanStates(plan_states, plan_pages, budget, stats.n_disk_pages_allowed);
  for (size_t i = 0; i < ids.size(); ++i) target[ids[i]] = plan[i];
  ++stats.n_plans;
  steps_since_plan = 0;
  plan_due = false;
}

// The disk pages a step may read in its time share, from the measured step time and disk rate.
size_t PlacementEngine::Impl::DiskPagesAllowed() const {
  // Without masters a page would move to disk as it is: still a sketch, and slower.
  if (profile.masters == MasterRule::kNever) return 0;
  const double bytes = options.disk_time_share * stats.step_seconds * stats.disk_read_gbps * 1e9;
  const double pages = bytes / static_cast<double>(std::max<size_t>(page_bytes, 1));
  return static_cast<size_t>(std::min(pages, 1e15));  // a share too large to matter: no limit
}

// Issues the migrations the plan asks for: demotions first (they free RAM), then promotions,
// hottest first, while the staging bytes allow.
Status PlacementEngine::Impl::Issue(bool synchronous, const std::vector<PageId>* promote_only) {
  Grow();
  if (synchronous) ARGUS_RETURN_IF_ERROR(WriteMastersNow());
  const std::vector<PageView> pages = SequencePages();
  std::vector<const PageView*> up;
  for (const PageView& view : pages) {
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
  const std::vector<PageView> pages = SequencePages();
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
  for (const PageView& view : pages) {
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

Status PlacementEngine::Impl::Start(Job job, bool synchronous) {
  if (synchronous || !worker.joinable()) {
    Execute(job, inline_scratch.as<float>());
    Commit(job);
    return Status::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    // Bounded staging: a job that does not fit beside those in flight waits for a later step.
    // Promotions waiting for RAM hold staging too, but must not block the demotions that
    // free it: they are not counted here.
    const size_t moving = staged_bytes - waiting_bytes;
    if (moving > 0 && moving + job.staged_bytes() > options.staging_bytes) {
      return Status::Ok();
    }
    staged_bytes += job.staged_bytes();
    in_flight[job.page] = 1;
    queue.push_back(std::move(job));
  }
  cv.notify_all();
  return Status::Ok();
}

void PlacementEngine::Impl::Execute(Job& job, float* scratch) {
  DiskTier& disk = *cache.disk();
  if (job.kind == Job::Kind::kWriteMaster) {
    job.status = disk.Put({job.key, job.tag, job.src.span()});
    return;
  }
  if (job.from_master) {
    job.status = disk.Read(job.key, job.src.span());
    if (job.status.ok() && Checksum64(job.src.span()) != job.checksum) {
      job.status = Status::Corruption("master " + job.key.ToString() + " of page " +
                                      std::to_string(job.page) + " fails its checksum");
    }
    if (!job.status.ok()) return;
  }
  job.summary.resize(SummaryFloats(cache));
  job.status = TranscodePage(cache, job.src.span(), job.src_k, job.src_v, job.dst.span(), job.dst_k,
                             job.dst_v, job.summary.data(), scratch);
}

void PlacementEngine::Impl::Commit(Job& job) {
  const PageId p = job.page;
  if (job.kind == Job::Kind::kWriteMaster) {
    if (job.status.ok()) {
      stats.master_bytes_written += job.src.size();
      job.status = AttachMaster(cache, p, job.generation, job.key, job.checksum);
      if (!job.status.ok()) (void)cache.disk()->Erase(std::span<const PageKey>(&job.key, 1));
    }
  } else {
    if (job.from_master && job.status.ok() && !job.counted) {
      stats.promoted_bytes_read += job.src.size();
      job.counted = true;
    }
    if (job.status.ok()) {
      job.status = InstallPage(cache, p, job.generation, job.dst_k, job.dst_v, job.dst.span(),
                               job.summary.data());
    }
    if (job.status.ok() && job.promotion) {
      ++stats.n_promotions;
      if (on_demand) {
        ++stats.n_promotions_on_demand;
      } else {
        ++stats.n_prefetches;
      }
      prefetched[p] = on_demand ? 0 : 1;
    } else if (job.status.ok()) {
      ++stats.n_demotions;
      if (prefetched[p]) {
        ++stats.n_prefetches_wasted;
        prefetched[p] = 0;
      }
    }
  }
  if (job.status.ok() || job.status.code() == StatusCode::kResourceExhausted) return;
  ++stats.n_migrations_dropped;
  if (job.status.code() != StatusCode::kAborted) stats.last_error = job.status.ToString();
}

void PlacementEngine::Impl::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return stopping || !queue.empty(); });
    if (stopping) return;
    // Consecutive master writes go out as one durable Put.
    std::vector<Job> jobs;
    do {
      jobs.push_back(std::move(queue.front()));
      queue.pop_front();
    } while (jobs.back().kind == Job::Kind::kWriteMaster && !queue.empty() &&
             queue.front().kind == Job::Kind::kWriteMaster && jobs.size() < 64);
    n_running += jobs.size();
    lock.unlock();
    if (jobs.size() > 1) {
      std::vector<PagePut> puts;
      for (const Job& job : jobs) puts.push_back({job.key, job.tag, job.src.span()});
      const Status status = cache.disk()->Put(puts);
      for (Job& job : jobs) job.status = status;
    } else {
      Execute(jobs[0], worker_scratch.as<float>());
    }
    lock.lock();
    n_running -= jobs.size();
    for (Job& job : jobs) done.push_back(std::move(job));
    cv.notify_all();
  }
}

void PlacementEngine::Impl::Release(const Job& job) {
  std::lock_guard<std::mutex> lock(mu);
  staged_bytes -= job.staged_bytes();
  in_flight[job.page] = 0;
}

// Commits what the worker finished. A promotion that finds no RAM yet (the demotions that make
// room are still in flight) waits, holding its staging, until the plan no longer wants it.
void PlacementEngine::Impl::CommitDone() {
  std::vector<Job> finished;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (Job& job : done) finished.push_back(std::move(job));
    done.clear();
  }
  for (Job& job : waiting) finished.push_back(std::move(job));
  waiting.clear();
  waiting_bytes = 0;
  for (Job& job : finished) {
    Commit(job);
    if (job.status.code() == StatusCode::kResourceExhausted) {
      if (target[job.page] == job.target) {
        job.status = Status::Ok();
        waiting_bytes += job.staged_bytes();
        waiting.push_back(std::move(job));
        continue;
      }
      ++stats.n_migrations_dropped;
    }
    Release(job);
  }
}

// Waits for the worker to finish everything queued, then commits it; promotions still without
// RAM are dropped.
void PlacementEngine::Impl::Drain() {
  if (worker.joinable()) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return queue.empty() && n_running == 0; });
  }
  CommitDone();
  for (Job& job : waiting) {
    ++stats.n_migrations_dropped;
    Release(job);
  }
  waiting.clear();
  waiting_bytes = 0;
}

// Makes room for a bulk append by demoting synchronously: waits for migrations in flight, plans
// with `reserve_bytes` more kept free, and runs the plan's demotions and master writes inline.
Status PlacementEngine::Impl::MakeRoom(size_t reserve_bytes) {
  Drain();
  Plan(reserve_bytes);
  return Issue(/*synchronous=*/true);
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

// Promotes, synchronously, the layer's lossy or disk pages that the last attention call found
// hot (those with a master). When free RAM cannot take them, the plan is redone with them in
// state 0 and run inline: the step needs them.
Result<bool> PlacementEngine::Impl::PromoteHotNow(uint32_t layer) {
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
  hot.resize(std::min<size_t>(hot.size(), kMaxPromotionsPerCall));
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

// ---- PlacementEngine -------------------------------------------------------------------------

Result<std::unique_ptr<PlacementEngine>> PlacementEngine::Create(KvCache& cache, ThreadPool& pool,
                                                                 const PlacementOptions& options) {
  auto impl = std::make_unique<Impl>(cache, pool, options);
  ARGUS_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<PlacementEngine>(new PlacementEngine(std::move(impl)));
}

PlacementEngine::PlacementEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PlacementEngine::~PlacementEngine() {
  Impl& impl = *impl_;
  if (impl.worker.joinable()) {
    {
      std::unique_lock<std::mutex> lock(impl.mu);
      impl.cv.wait(lock, [&] { return impl.n_running == 0; });
      impl.stopping = true;
    }
    impl.cv.notify_all();
    impl.worker.join();
  }
  // Masters written for pages that never got them attached would be orphans on disk.
  std::vector<PageKey> orphans;
  for (const Job& job : impl.done) {
    if (job.kind == Job::Kind::kWriteMaster && job.status.ok()) orphans.push_back(job.key);
  }
  if (!orphans.empty()) (void)impl.cache.disk()->Erase(orphans);
}

Status PlacementEngine::BeginRequest(SeqId seq, uint32_t expected_tokens) {
  Impl& impl = *impl_;
  impl.Drain();
  ARGUS_RETURN_IF_ERROR(impl.cache.Length(seq, 0).status());
  ARGUS_ASSIGN_OR_RETURN(size_t exact_bytes,
                         KvCache::RequiredRamBytes(impl.cache.options(), expected_tokens));
  const double ratio =
      static_cast<double>(exact_bytes) / static_cast<double>(impl.cache.stats().ram.budget_bytes);
  const bool was_active = impl.active;
  impl.active = ratio > (was_active ? impl.profile.deactivate_ratio : impl.profile.activate_ratio);
  impl.seq = seq;
  impl.in_request = true;
  std::fill(impl.heat.begin(), impl.heat.end(), 0.0);
  std::fill(impl.recall.begin(), impl.recall.end(), 0.0);
  std::fill(impl.prefetched.begin(), impl.prefetched.end(), 0);
  impl.steps_since_plan = 0;
  impl.plan_due = impl.active;
  impl.step_start.reset();  // a request's prefill is no step: timing starts at its first end
  impl.expected_tokens = expected_tokens;
  ++impl.stats.n_requests;
  if (impl.active) ++impl.stats.n_requests_active;
  return Status::Ok();
}

Status PlacementEngine::Append(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  Impl& impl = *impl_;
  if (!impl.in_request) return Status::InvalidArgument("append: no request begun");
  if (!impl.active) return impl.cache.Append(impl.seq, layer, k, v);
  // Page by page, so that room is made between pieces; the pieces appended before an error
  // stay.
  const CacheGeometry& g = impl.cache.geometry();
  const size_t row = size_t{g.n_kv_heads} * g.head_dim;
  if (k.size() != v.size() || k.size() % row != 0) {
    return impl.cache.Append(impl.seq, layer, k, v);  // the cache names the mismatch
  }
  const uint32_t pt = impl.cache.page_tokens();
  size_t done_rows = 0;
  const size_t n_rows = k.size() / row;
  while (done_rows < n_rows) {
    ARGUS_ASSIGN_OR_RETURN(uint32_t len, impl.cache.Length(impl.seq, layer));
    const size_t piece = std::min<size_t>(n_rows - done_rows, pt - len % pt);
    auto kk = k.subspan(done_rows * row, piece * row);
    auto vv = v.subspan(done_rows * row, piece * row);
    Status status = impl.cache.Append(impl.seq, layer, kk, vv);
    if (status.code() == StatusCode::kResourceExhausted) {
      // Room for this piece; for a bulk append a few more, so that it does not plan per page.
      const size_t budget = impl.cache.stats().ram.budget_bytes;
      ARGUS_RETURN_IF_ERROR(
          impl.MakeRoom(n_rows > 1 ? std::max(impl.page_bytes, budget / 16) : impl.page_bytes));
      status = impl.cache.Append(impl.seq, layer, kk, vv);
    }
    ARGUS_RETURN_IF_ERROR(status);
    if ((len + piece) % pt == 0) impl.plan_due = true;
    done_rows += piece;
  }
  return Status::Ok();
}

Result<AttentionStats> PlacementEngine::Decode(uint32_t layer, const float* q, float* out) {
  Impl& impl = *impl_;
  if (!impl.in_request) return Status::InvalidArgument("decode: no request begun");
  const AttentionOptions o = impl.Attention();
  ARGUS_ASSIGN_OR_RETURN(AttentionStats s,
                         impl.attention.Decode(impl.cache, impl.seq, layer, q, out, o));
  if (impl.active && impl.profile.promote) {
    // A page that turned hot in this very step while lossy: fetch its master now (the step
    // needs it, making room inline if needed) and attend again, so a recall is served exact.
    ARGUS_ASSIGN_OR_RETURN(bool refetched, impl.PromoteHotNow(layer));
    if (refetched) {
      ++impl.stats.n_refetched_steps;
      impl.plan_due = true;  // the headroom it used is restored by the next plan
      impl.stats.attention_disk_bytes_read += s.disk_bytes_read;  // the first call's reads
      ARGUS_ASSIGN_OR_RETURN(s, impl.attention.Decode(impl.cache, impl.seq, layer, q, out, o));
    }
  }
  impl.Count(s);
  return s;
}

Result<AttentionStats> PlacementEngine::Prefill(uint32_t layer, const float* q, uint32_t n,
                                                float* out) {
  Impl& impl = *impl_;
  if (!impl.in_request) return Status::InvalidArgument("prefill: no request begun");
  ARGUS_ASSIGN_OR_RETURN(AttentionStats s, impl.attention.Prefill(impl.cache, impl.seq, layer, q, n,
                                                                  out, impl.Attention()));
  impl.Count(s);
  return s;
}

Status PlacementEngine::Crop(uint32_t n_tokens) {
  Impl& impl = *impl_;
  if (!impl.in_request) return Status::InvalidArgument("crop: no request begun");
  impl.Drain();
  if (impl.active) {
    // Cutting inside a full page turns it back into an active page in RAM.
    ARGUS_RETURN_IF_ERROR(impl.MakeRoom(impl.page_bytes * impl.cache.geometry().n_layers));
  }
  ARGUS_RETURN_IF_ERROR(impl.cache.Crop(impl.seq, n_tokens));
  impl.ForgetFreePages();
  return Status::Ok();
}

Status PlacementEngine::EndStep() {
  Impl& impl = *impl_;
  if (!impl.in_request) return Status::InvalidArgument("end of step: no request begun");
  ++impl.stats.n_steps;
  if (!impl.active) return Status::Ok();
  // The step's wall time, host work included (a model's matmuls): what disk reads are weighed
  // against. Averaged over steps, quick to follow a change (prefill chunks, then decode).
  if (impl.step_start) {
    const double s = Seconds(*impl.step_start);
    impl.stats.step_seconds = impl.stats.step_seconds > 0 ? 0.5 * (impl.stats.step_seconds + s) : s;
  }
  impl.step_start = Clock::now();
  impl.Grow();
  impl.CommitDone();
  impl.UpdateHeat(impl.SequencePages());
  if (impl.plan_due || ++impl.steps_since_plan >= impl.profile.replan_every) impl.Plan(0);
  return impl.Issue(/*synchronous=*/!impl.options.background);
}

Status PlacementEngine::Drain() {
  impl_->Drain();
  return Status::Ok();
}

const Profile& PlacementEngine::profile() const { return impl_->profile; }
bool PlacementEngine::active() const { return impl_->active; }

PlacementStats PlacementEngine::stats() const {
  const Impl& impl = *impl_;
  PlacementStats s = impl.stats;
  s.active = impl.active;
  const CacheStats cs = impl.cache.stats();
  s.ram_budget_bytes = cs.ram.budget_bytes;
  s.ram_used_bytes = cs.ram.used_bytes;
  s.disk_used_bytes = cs.has_disk ? cs.disk.used_bytes : 0;
  std::fill(s.pages_per_state.begin(), s.pages_per_state.end(), 0);
  const PageTable& t = PageTableOf(impl.cache);
  uint64_t n_values = 0;
  for (PageId p = 0; p < t.size(); ++p) {
    if (t.state[p] == PageState::kFree) continue;
    n_values += uint64_t{t.n_tokens[p]} * impl.cache.geometry().n_kv_heads *
                impl.cache.geometry().head_dim * 2;
    if (t.state[p] != PageState::kFull) continue;
    const uint32_t state = impl.CurrentState(p);
    if (state < s.pages_per_state.size()) ++s.pages_per_state[state];
  }
  s.effective_bits_per_value =
      n_values ? 8.0 * static_cast<double>(cs.ram_page_bytes) / static_cast<double>(n_values) : 0;
  std::vector<uint16_t> codecs;
  for (const ResolvedState& r : impl.states) {
    codecs.push_back(r.k);
    codecs.push_back(r.v);
  }
  std::sort(codecs.begin(), codecs.end());
  codecs.erase(std::unique(codecs.begin(), codecs.end()), codecs.end());
  for (uint16_t c : codecs) {
    const Codec& codec = CodecAt(impl.cache, c);
    s.kernel_paths.emplace_back(codec.info().name,
                                std::string(KernelPathName(codec.kernel_path())));
  }
  return s;
}

}  // namespace argus
