// The placement engine's ladder: each profile state resolved into the cache's codecs, its bytes
// and its price (the measured reconstruction error of its codecs), the RAM budget checked
// against the pins, the read rates of RAM and disk measured, and which state a page holds.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "argus/codec.h"
#include "policy/engine_impl.h"

namespace argus {

namespace {

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

// Pages of state 0 copied in RAM, and written to and read back from the disk tier as attention
// reads them: a batch issued together, so the rate is the tier's throughput at its queue depth,
// not one read's latency (one synchronous read of a small page measured a third to a half of the
// batch's rate and moved by 2x between runs, and with it how many pages a plan sends to disk).
// Best of three each; O_DIRECT reads bypass the page cache.
Status PlacementEngine::Impl::MeasureBandwidth() {
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer a, AlignedBuffer::Allocate(page_bytes));
  ARGUS_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::Allocate(page_bytes));
  auto best_gbps = [&](size_t n_bytes, auto&& read) -> Result<double> {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = Clock::now();
      ARGUS_RETURN_IF_ERROR(read());
      const double s = Seconds(start);
      best = std::max(best, static_cast<double>(n_bytes) / std::max(s, 1e-9) / 1e9);
    }
    return best;
  };
  ARGUS_ASSIGN_OR_RETURN(stats.ram_read_gbps, best_gbps(page_bytes, [&] {
                           std::copy_n(a.data(), page_bytes, b.data());
                           return Status::Ok();
                         }));
  DiskTier* disk = cache.disk();
  if (disk == nullptr) return Status::Ok();
  // About 1 MiB of pages, at most 16, and what the staging holds at once.
  constexpr size_t kProbeBytes = size_t{1} << 20, kMaxProbePages = 16;
  const size_t n_pages =
      std::max<size_t>(1, std::min({kProbeBytes / page_bytes, kMaxProbePages, StagedPages()}));
  std::vector<PageKey> keys;
  std::vector<PagePut> puts;
  for (size_t i = 0; i < n_pages; ++i) {
    keys.push_back(NewDiskKey(cache));
    puts.push_back({keys.back(), "probe", a.span()});
  }
  ARGUS_RETURN_IF_ERROR(disk->Put(puts).WithContext("disk bandwidth probe"));
  auto read = best_gbps(n_pages * page_bytes, [&]() -> Status {
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<PageReadBatch> batch, disk->ReadBatch(keys));
    for (size_t i = 0; i < n_pages; ++i) {
      ARGUS_RETURN_IF_ERROR(batch->Get(i).status());
      batch->Release(i);
    }
    return Status::Ok();
  });
  const Status erased = disk->Erase(keys);
  ARGUS_ASSIGN_OR_RETURN(stats.disk_read_gbps, std::move(read));
  return erased;
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

}  // namespace argus
