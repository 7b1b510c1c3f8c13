// Internal to the policy module: the placement engine's state (PlacementEngine::Impl), shared by
// the files that do its jobs:
//   engine.cc             the public API: requests, appends, attention calls, steps, statistics
//   engine_ladder.cc      the ladder resolved into states, their measured prices, the read rates
//   engine_heat.cc        the per-page signals: heat, recall, prefetch marks
//   engine_plan.cc        the plan: which state each page should hold
//   engine_migrations.cc  the migrations a plan asks for, and the promotions a step needs now
//   engine_worker.cc      running migrations (inline or on the worker thread) and committing them
//
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
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "argus/core.h"
#include "argus/policy.h"
#include "cache/placement_access.h"
#include "core/buffer.h"
#include "core/measure.h"

namespace argus {

struct PlacementEngine::Impl {
  static constexpr double kRecallDecay = 0.99;
  static constexpr size_t kMaxPromotionsPerCall = 2;
  // A RAM state priced at this or more is a sketch, worth serving from disk instead: its keys' and
  // values' relative errors add up to half the page (jl keys, 1-bit keys, 2-bit states), where a
  // trained model's perplexity starts to pay several times what 3- and 4-bit states cost
  // (docs/placement.md, "Sketch or disk").
  static constexpr double kSketchPrice = 0.5;

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

  // The request: one sequence (BeginRequest), or a batch whose sequences come and go.
  std::vector<SeqId> seqs;
  bool in_request = false, is_batch = false, active = false;
  // The attention clock as of the last heat update: in a batch, pages whose last attention is
  // older belong to sequences the step did not run and received no mass in it.
  uint64_t heat_clock = 0;
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

  // Starts a request (engine.cc): activation for n_sequences of expected_tokens, fresh history.
  Status Begin(uint32_t n_sequences, uint32_t expected_tokens);
  // The request's one sequence; InvalidArgument without a request or during a batch.
  Result<SeqId> OnlySequence(std::string_view call) const;

  // ---- The ladder (engine_ladder.cc) ----------------------------------------------------------

  Status Init();
  Status MeasureBandwidth();
  bool NeedsMaster(uint32_t state) const;
  uint32_t CurrentState(PageId page) const;

  // ---- Signals (engine_heat.cc) ---------------------------------------------------------------

  // A full page the engine places, with what its plan needs of its sequence's layer.
  struct PlacedPage {
    PageView view;
    uint32_t layer_tokens = 0;  // tokens of its sequence in its layer
    uint32_t layer_pages = 0;   // placed pages of its sequence in its layer
  };

  void Grow();
  Status CheckSequence(SeqId seq) const;  // NotFound unless seq is one the request places
  std::vector<PlacedPage> SequencePages() const;
  // The mass that makes a page hot in a layer of n_pages pages: promote_mass, and at least twice
  // the uniform share (in a short layer every page has a large share).
  double HotMass(size_t n_pages) const {
    return std::max(profile.promote_mass, 2.0 / static_cast<double>(std::max<size_t>(n_pages, 1)));
  }
  void UpdateHeat(const std::vector<PlacedPage>& pages);
  void ForgetFreePages();

  // ---- The plan (engine_plan.cc) --------------------------------------------------------------

  // hot: pages that must get state 0 (found hot inside a step).
  void Plan(size_t reserve_bytes, std::span<const PageId> hot = {});
  size_t DiskPagesAllowed() const;
  // Pages the disk tier's staging holds at once (0 without a disk tier): what one attention call
  // can hold of a layer's disk pages, and the most the disk probe reads together.
  size_t StagedPages() const;

  // ---- Migrations (engine_migrations.cc) ------------------------------------------------------

  // With promote_only, of the promotions only those.
  Status Issue(bool synchronous, const std::vector<PageId>* promote_only = nullptr);
  Status WriteMastersNow();
  Status Demote(const PageView& view, uint32_t to, bool synchronous);
  Status Promote(const PageView& view, uint32_t to, bool synchronous);
  Status MakeRoom(size_t reserve_bytes);
  Result<bool> PromoteHotNow(SeqId seq, uint32_t layer);

  // ---- Running them (engine_worker.cc) --------------------------------------------------------

  Status Start(Job job, bool synchronous);
  void Execute(Job& job, float* scratch);
  void Commit(Job& job);
  void WorkerLoop();
  void Release(const Job& job);
  void CommitDone();
  void Drain();
};

}  // namespace argus
