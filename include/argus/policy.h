// Placement: which state (K codec, V codec, tier) each page of a cache holds, decided from
// measured signals under byte budgets. The measuring ground that compares policies on identical
// work (traces, their replay, and the offline optimum) is in argus/eval.h.
//
// A *profile* is an ordered ladder of states from best to cheapest, rules for exact masters,
// pins and per-layer limits. The *placement engine* wraps a KvCache for one request at a time:
// it appends through the cache, runs attention with the profile's tolerance, keeps a heat (EMA
// of the attention mass) per page, replans when a page fills and every `replan_every` steps,
// and migrates pages (re-encode down from the best copy in RAM, fetch the exact master up when a
// page turns hot) on a background thread. See docs/placement.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/status.h"

namespace argus {

// ---- Profiles ---------------------------------------------------------------------------------

// One rung of a ladder. A disk state holds the page's exact master (the best state's codecs)
// on the disk tier and nothing in RAM; its codec fields are ignored.
struct LadderState {
  std::string k_codec = "f16";
  std::string v_codec = "f16";
  TierKind tier = TierKind::kRam;
};

// When an exact master copy of a page is kept on disk: always (written when the page fills, so
// any demotion is free and every promotion can restore exact bytes), never (a page demoted to
// a lossy state stays lossy; a page sent to disk moves there as it is), or only for pages
// leaving the best state.
enum class MasterRule : uint8_t { kAlways = 0, kNever = 1, kLossy = 2 };
// What ranks pages: their heat (with recency to break ties), or only their age (newest first:
// the earlier prototype's cascade).
enum class Ranking : uint8_t { kHeat = 0, kRecency = 1 };

struct LayerOverride {
  std::vector<uint32_t> layers;
  uint32_t max_state = 0;  // the cheapest ladder index these layers' pages may take
};

struct Profile {
  std::string name;
  std::vector<LadderState> ladder;  // best first; ladder[0] is a RAM state (the master codecs)
  MasterRule masters = MasterRule::kAlways;
  uint32_t pin_sinks = 0;   // pages holding any of the first pin_sinks tokens stay in state 0
  uint32_t pin_recent = 0;  // so do pages holding any of the last pin_recent tokens
  std::vector<LayerOverride> layer_overrides;
  Ranking ranking = Ranking::kHeat;
  bool promote = true;          // may a page move to a better state than it holds?
  double heat_decay = 0.95;     // heat = decay * heat + (1 - decay) * mass, per step
  uint32_t replan_every = 16;   // decode steps between plans (a page filling also plans)
  double promote_mass = 0.02;   // a page receiving this much mass in a step is hot: plan now
  double epsilon = 0;           // certified skipping tolerance of the attention calls
  double activate_ratio = 0.9;  // of the RAM budget (the high-water mark); see BeginRequest
  double deactivate_ratio = 0.7;

  // "exact", "balanced", "research", "capacity" and "cascade" (the no-promotion baseline);
  // InvalidArgument naming the known ones otherwise.
  static Result<Profile> BuiltIn(std::string_view name);
  static std::vector<std::string> BuiltInNames();
  // Parses a JSON profile (schema in docs/profiles.md); InvalidArgument naming the field (as
  // a JSON pointer, e.g. "/ladder/2/k") and `source` (a file name, for messages).
  static Result<Profile> FromJson(std::string_view json, std::string_view source);
  // A built-in name, or a path to a JSON file (read and parsed).
  static Result<Profile> Load(std::string_view name_or_path);
  std::string ToJson() const;  // round-trips through FromJson
  // InvalidArgument for an empty ladder, a disk state first, a state after a disk state, codec
  // specs the registry cannot build for their plane, ratios out of order, a zero replan period,
  // an override naming a state the ladder lacks.
  Status Validate() const;
  // A disk state in the ladder, or exact masters kept: the cache needs a disk tier.
  bool NeedsDisk() const;
};

// ---- The engine -------------------------------------------------------------------------------

struct PlacementOptions {
  Profile profile;
  // Bytes of page copies migrations may hold at once (the background thread's staging).
  size_t staging_bytes = size_t{64} << 20;
  bool background = true;  // false: migrations run inside EndStep (tests, determinism)
  // Pages a plan would leave in a sketch state (a RAM state whose keys' and values' measured
  // relative errors add up to half the page or more: jl or 1-bit keys, 2-bit states) are served
  // exact from disk instead, coldest first, while reading them takes at most this share of a
  // step's measured time. The time includes those reads, so a step converges to at most
  // 1 / (1 - share) its time without them: 1.5x at the default. 0, or a profile without
  // masters: sketches are never traded for disk reads.
  double disk_time_share = 1.0 / 3.0;
};

struct PlacementStats {
  bool active = false;  // the ladder is active for the current request
  // Read rates of one page measured when the engine started: copied in RAM, and read back from
  // the disk tier (0 without one).
  double ram_read_gbps = 0, disk_read_gbps = 0;
  // The measured wall time of a step (EndStep to EndStep, averaged), and the disk pages that
  // disk_time_share of it reads at disk_read_gbps: how many pages the last plan could serve from
  // disk instead of a sketch state (PlacementOptions::disk_time_share).
  double step_seconds = 0;
  size_t n_disk_pages_allowed = 0;
  uint64_t n_requests = 0, n_requests_active = 0;
  uint64_t n_steps = 0, n_plans = 0;
  uint64_t n_promotions = 0, n_demotions = 0;  // migrations committed, up and down the ladder
  // Promotions made inside a decode call (a lossy page found hot there; the layer is attended
  // again), and the (step, layer) calls that did so.
  uint64_t n_promotions_on_demand = 0, n_refetched_steps = 0;
  uint64_t n_migrations_dropped = 0;  // discarded: their page changed, or they failed
  std::string last_error;             // of the last migration that failed (not overtaken)
  uint64_t promoted_bytes_read = 0;   // master bytes read from disk by promotions
  uint64_t master_bytes_written = 0;
  uint64_t attention_disk_bytes_read = 0;  // bytes attention read from disk pages
  uint64_t n_prefetches = 0, n_prefetches_used = 0, n_prefetches_wasted = 0;
  uint64_t n_tiles_skipped = 0;
  double max_skipped_mass_bound = 0;  // the largest proven skipped-mass bound of any call
  size_t ram_budget_bytes = 0, ram_used_bytes = 0, disk_used_bytes = 0;
  // Pages per ladder state (index into the profile's ladder); the active pages are not counted.
  std::vector<size_t> pages_per_state;
  std::vector<std::string> state_names;  // per ladder state: "K/V" codecs in RAM, or "disk"
  double effective_bits_per_value = 0;   // bits of RAM page bytes per cached K or V value
  // One line per codec in use: its spec and the kernel path that runs it ("avx2", "scalar").
  std::vector<std::pair<std::string, std::string>> kernel_paths;
};

class PlacementEngine {
 public:
  // The cache must hold full pages in the profile's best codecs (ladder[0]); a profile with a
  // disk state or masters needs the cache's disk tier. InvalidArgument (naming it) when the RAM
  // budget cannot hold the pins and one active page per layer at state 0.
  static Result<std::unique_ptr<PlacementEngine>> Create(KvCache& cache, ThreadPool& pool,
                                                         const PlacementOptions& options);
  ~PlacementEngine();  // waits for migrations in flight (and discards them)
  PlacementEngine(const PlacementEngine&) = delete;
  PlacementEngine& operator=(const PlacementEngine&) = delete;

  // Starts a request over `seq`, expected to reach `expected_tokens` in every layer; the pages'
  // history (heat, recall) starts afresh. The ladder
  // is active for the whole request when the exact cache for that length needs more than
  // activate_ratio of the RAM budget, or more than deactivate_ratio while the previous request
  // was active (hysteresis). Inactive, every call below is the cache's own: bit-identical.
  Status BeginRequest(SeqId seq, uint32_t expected_tokens);
  // KvCache::Append, after making room when the ladder is active (waiting for the migrations
  // that room needs, none other).
  Status Append(uint32_t layer, std::span<const float> k, std::span<const float> v);
  // Decode attention for the request's sequence with the profile's epsilon (0 when inactive).
  Result<AttentionStats> Decode(uint32_t layer, const float* q, float* out);
  // Prefill attention of n queries (AttentionEngine::Prefill) over the pages as they are, with
  // the same epsilon; no promotion inside the call.
  Result<AttentionStats> Prefill(uint32_t layer, const float* q, uint32_t n, float* out);
  // KvCache::Crop of the request's sequence, after the migrations in flight and after making
  // room for the active pages the crop re-opens; the freed pages' history (heat, recall) goes.
  Status Crop(uint32_t n_tokens);

  // A batch: one request over many sequences of the cache (argus serve's conversations), which
  // join with AddSequence and leave with Release, all placed under the one RAM budget: a plan
  // ranks every sequence's full pages together, so an idle or long sequence's cold pages go down
  // the ladder first, and a page found hot in a step is promoted whichever sequence holds it.
  // The ladder is active as BeginRequest decides for n_sequences sequences of expected_tokens
  // each. The calls below that take a sequence act on one of the batch's (NotFound for another);
  // the calls above without one are InvalidArgument during a batch.
  Status BeginBatch(uint32_t n_sequences, uint32_t expected_tokens);
  // Places `seq`, a sequence of the cache (an empty one, or a fork: pages it shares with
  // another sequence stay where they are while shared). NotFound for an unknown sequence.
  Status AddSequence(SeqId seq);
  // KvCache::Release of a batch sequence, after the migrations in flight; its pages' history
  // goes with them.
  Status Release(SeqId seq);
  Status Append(SeqId seq, uint32_t layer, std::span<const float> k, std::span<const float> v);
  Result<AttentionStats> Decode(SeqId seq, uint32_t layer, const float* q, float* out);
  Result<AttentionStats> Prefill(SeqId seq, uint32_t layer, const float* q, uint32_t n, float* out);
  Status Crop(SeqId seq, uint32_t n_tokens);

  // Ends a decode step (every layer appended and attended, of every sequence in it): updates
  // heat, commits finished migrations, plans when due, and issues migrations.
  Status EndStep();
  // Waits for every migration in flight and commits it.
  Status Drain();

  const Profile& profile() const;
  bool active() const;  // the ladder is active for the current request
  // The bytes of pages, in the ladder's best state, that the cache can hold under this profile:
  // the RAM budget while the ladder is inactive; active, the RAM budget at the cheapest RAM
  // state's size, and the disk tier's budget when pages can go to disk (bounding every full page
  // where each keeps an exact master there). An estimate for admission: the budgets' errors are
  // the final word.
  size_t PlaceableBytes() const;
  PlacementStats stats() const;

 private:
  struct Impl;
  explicit PlacementEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace argus
