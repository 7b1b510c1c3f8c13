// The placement engine's public API (argus/policy.h); its state and the files that do its jobs
// are described in engine_impl.h.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

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
    // Room first when the budget cannot take the piece: room for it and, for a bulk append, a
    // few more, so that it does not plan per page.
    ARGUS_ASSIGN_OR_RETURN(const bool fits, AppendFitsRam(impl.cache, impl.seq, layer, piece));
    if (!fits) {
      const size_t budget = impl.cache.stats().ram.budget_bytes;
      ARGUS_RETURN_IF_ERROR(
          impl.MakeRoom(n_rows > 1 ? std::max(impl.page_bytes, budget / 16) : impl.page_bytes));
    }
    ARGUS_RETURN_IF_ERROR(impl.cache.Append(impl.seq, layer,
                                            k.subspan(done_rows * row, piece * row),
                                            v.subspan(done_rows * row, piece * row)));
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
