// The placement engine's public API (argus/policy.h); its state and the files that do its jobs
// are described in engine_impl.h.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "core/checked.h"
#include "policy/engine_impl.h"

namespace argus {

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
  for (const Impl::Job& job : impl.done) {
    if (job.kind == Impl::Job::Kind::kWriteMaster && job.status.ok()) orphans.push_back(job.key);
  }
  if (!orphans.empty()) (void)impl.cache.disk()->Erase(orphans);
}

Status PlacementEngine::Impl::Begin(uint32_t n_sequences, uint32_t expected) {
  Drain();
  ARGUS_ASSIGN_OR_RETURN(size_t one_bytes, KvCache::RequiredRamBytes(cache.options(), expected));
  ARGUS_ASSIGN_OR_RETURN(size_t exact_bytes,
                         CheckedMul(one_bytes, n_sequences, "the exact KV of the request"));
  const double ratio =
      static_cast<double>(exact_bytes) / static_cast<double>(cache.stats().ram.budget_bytes);
  const bool was_active = active;
  active = ratio > (was_active ? profile.deactivate_ratio : profile.activate_ratio);
  in_request = true;
  std::fill(heat.begin(), heat.end(), 0.0);
  std::fill(recall.begin(), recall.end(), 0.0);
  std::fill(prefetched.begin(), prefetched.end(), 0);
  steps_since_plan = 0;
  plan_due = active;
  step_start.reset();  // a request's prefill is no step: timing starts at its first end
  expected_tokens = expected;
  ++stats.n_requests;
  if (active) ++stats.n_requests_active;
  return Status::Ok();
}

Result<SeqId> PlacementEngine::Impl::OnlySequence(std::string_view call) const {
  if (!in_request) return Status::InvalidArgument(std::string(call) + ": no request begun");
  if (is_batch) {
    return Status::InvalidArgument(std::string(call) + ": a batch's calls name the sequence");
  }
  return seqs.front();
}

Status PlacementEngine::BeginRequest(SeqId seq, uint32_t expected_tokens) {
  Impl& impl = *impl_;
  impl.Drain();
  ARGUS_RETURN_IF_ERROR(impl.cache.Length(seq, 0).status());
  ARGUS_RETURN_IF_ERROR(impl.Begin(1, expected_tokens));
  impl.seqs = {seq};
  impl.is_batch = false;
  return Status::Ok();
}

Status PlacementEngine::BeginBatch(uint32_t n_sequences, uint32_t expected_tokens) {
  Impl& impl = *impl_;
  ARGUS_RETURN_IF_ERROR(impl.Begin(n_sequences, expected_tokens));
  impl.seqs.clear();
  impl.is_batch = true;
  return Status::Ok();
}

Status PlacementEngine::AddSequence(SeqId seq) {
  Impl& impl = *impl_;
  if (!impl.in_request || !impl.is_batch) {
    return Status::InvalidArgument("add sequence: no batch begun");
  }
  ARGUS_RETURN_IF_ERROR(impl.cache.Length(seq, 0).status());
  if (impl.CheckSequence(seq).ok()) return Status::Ok();
  impl.seqs.push_back(seq);
  return Status::Ok();
}

Status PlacementEngine::Release(SeqId seq) {
  Impl& impl = *impl_;
  ARGUS_RETURN_IF_ERROR(impl.CheckSequence(seq));
  impl.Drain();
  ARGUS_RETURN_IF_ERROR(impl.cache.Release(seq));
  std::erase(impl.seqs, seq);
  impl.ForgetFreePages();
  return Status::Ok();
}

Status PlacementEngine::Append(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  ARGUS_ASSIGN_OR_RETURN(const SeqId seq, impl_->OnlySequence("append"));
  return Append(seq, layer, k, v);
}

Status PlacementEngine::Append(SeqId seq, uint32_t layer, std::span<const float> k,
                               std::span<const float> v) {
  Impl& impl = *impl_;
  ARGUS_RETURN_IF_ERROR(impl.CheckSequence(seq));
  if (!impl.active) return impl.cache.Append(seq, layer, k, v);
  // Page by page, so that room is made between pieces; the pieces appended before an error
  // stay.
  const CacheGeometry& g = impl.cache.geometry();
  const size_t row = size_t{g.n_kv_heads} * g.head_dim;
  if (k.size() != v.size() || k.size() % row != 0) {
    return impl.cache.Append(seq, layer, k, v);  // the cache names the mismatch
  }
  const uint32_t pt = impl.cache.page_tokens();
  size_t done_rows = 0;
  const size_t n_rows = k.size() / row;
  while (done_rows < n_rows) {
    ARGUS_ASSIGN_OR_RETURN(uint32_t len, impl.cache.Length(seq, layer));
    const size_t piece = std::min<size_t>(n_rows - done_rows, pt - len % pt);
    // Room first when the budget cannot take the piece: room for it and, for a bulk append, a
    // few more, so that it does not plan per page.
    ARGUS_ASSIGN_OR_RETURN(const bool fits, AppendFitsRam(impl.cache, seq, layer, piece));
    if (!fits) {
      const size_t budget = impl.cache.stats().ram.budget_bytes;
      ARGUS_RETURN_IF_ERROR(
          impl.MakeRoom(n_rows > 1 ? std::max(impl.page_bytes, budget / 16) : impl.page_bytes));
    }
    ARGUS_RETURN_IF_ERROR(impl.cache.Append(seq, layer, k.subspan(done_rows * row, piece * row),
                                            v.subspan(done_rows * row, piece * row)));
    if ((len + piece) % pt == 0) impl.plan_due = true;
    done_rows += piece;
  }
  return Status::Ok();
}

Result<AttentionStats> PlacementEngine::Decode(uint32_t layer, const float* q, float* out) {
  ARGUS_ASSIGN_OR_RETURN(const SeqId seq, impl_->OnlySequence("decode"));
  return Decode(seq, layer, q, out);
}

Result<AttentionStats> PlacementEngine::Decode(SeqId seq, uint32_t layer, const float* q,
                                               float* out) {
  Impl& impl = *impl_;
  ARGUS_RETURN_IF_ERROR(impl.CheckSequence(seq));
  const AttentionOptions o = impl.Attention();
  ARGUS_ASSIGN_OR_RETURN(AttentionStats s,
                         impl.attention.Decode(impl.cache, seq, layer, q, out, o));
  if (impl.active && impl.profile.promote) {
    // A page that turned hot in this very step while lossy: fetch its master now (the step
    // needs it, making room inline if needed) and attend again, so a recall is served exact.
    ARGUS_ASSIGN_OR_RETURN(bool refetched, impl.PromoteHotNow(seq, layer));
    if (refetched) {
      ++impl.stats.n_refetched_steps;
      impl.plan_due = true;  // the headroom it used is restored by the next plan
      impl.stats.attention_disk_bytes_read += s.disk_bytes_read;  // the first call's reads
      ARGUS_ASSIGN_OR_RETURN(s, impl.attention.Decode(impl.cache, seq, layer, q, out, o));
    }
  }
  impl.Count(s);
  return s;
}

Result<AttentionStats> PlacementEngine::Prefill(uint32_t layer, const float* q, uint32_t n,
                                                float* out) {
  ARGUS_ASSIGN_OR_RETURN(const SeqId seq, impl_->OnlySequence("prefill"));
  return Prefill(seq, layer, q, n, out);
}

Result<AttentionStats> PlacementEngine::Prefill(SeqId seq, uint32_t layer, const float* q,
                                                uint32_t n, float* out) {
  Impl& impl = *impl_;
  ARGUS_RETURN_IF_ERROR(impl.CheckSequence(seq));
  ARGUS_ASSIGN_OR_RETURN(AttentionStats s, impl.attention.Prefill(impl.cache, seq, layer, q, n, out,
                                                                  impl.Attention()));
  impl.Count(s);
  return s;
}

Status PlacementEngine::Crop(uint32_t n_tokens) {
  ARGUS_ASSIGN_OR_RETURN(const SeqId seq, impl_->OnlySequence("crop"));
  return Crop(seq, n_tokens);
}

Status PlacementEngine::Crop(SeqId seq, uint32_t n_tokens) {
  Impl& impl = *impl_;
  ARGUS_RETURN_IF_ERROR(impl.CheckSequence(seq));
  impl.Drain();
  if (impl.active) {
    // Cutting inside a full page turns it back into an active page in RAM.
    ARGUS_RETURN_IF_ERROR(impl.MakeRoom(impl.page_bytes * impl.cache.geometry().n_layers));
  }
  ARGUS_RETURN_IF_ERROR(impl.cache.Crop(seq, n_tokens));
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

size_t PlacementEngine::PlaceableBytes() const {
  const Impl& impl = *impl_;
  const size_t ram = impl.cache.stats().ram.budget_bytes;
  if (!impl.active) return ram;
  size_t cheapest = impl.page_bytes;
  for (const Impl::ResolvedState& r : impl.states) {
    if (r.tier == TierKind::kRam) cheapest = std::min(cheapest, r.ram_bytes);
  }
  const double scaled = static_cast<double>(ram) * static_cast<double>(impl.page_bytes) /
                        static_cast<double>(std::max<size_t>(cheapest, 1));
  const size_t in_ram = static_cast<size_t>(std::min(scaled, 1e18));
  const DiskTier* disk = impl.cache.disk();
  if (disk == nullptr || impl.disk_state == UINT32_MAX) return in_ram;
  const size_t on_disk = disk->stats().budget_bytes;
  if (impl.profile.masters == MasterRule::kAlways) return on_disk;
  return in_ram > SIZE_MAX - on_disk ? SIZE_MAX : in_ram + on_disk;
}

PlacementStats PlacementEngine::stats() const {
  const Impl& impl = *impl_;
  PlacementStats s = impl.stats;
  s.active = impl.active;
  const CacheStats cs = impl.cache.stats();
  s.ram_budget_bytes = cs.ram.budget_bytes;
  s.ram_used_bytes = cs.ram.used_bytes;
  s.disk_used_bytes = cs.has_disk ? cs.disk.used_bytes : 0;
  std::fill(s.pages_per_state.begin(), s.pages_per_state.end(), 0);
  for (const LadderState& state : impl.profile.ladder) {
    s.state_names.push_back(state.tier == TierKind::kDisk ? "disk"
                                                          : state.k_codec + "/" + state.v_codec);
  }
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
  for (const Impl::ResolvedState& r : impl.states) {
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
