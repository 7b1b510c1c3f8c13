// Decode and prefill attention over a sequence's pages, on the encoded tiles.
//
// Query rows: for KV head h the rows are the (query, q head of h's group) pairs, in query-major
// order, pre-multiplied by the scale. Rows are cut into batches of at most kMaxGroupHeads, and
// each (KV head, batch) walks the pages in fixed chunks: per page, `scores` on the K tile,
// masks, an online-softmax update per row (one max and one exp pass per page), `accumulate` on
// the V tile. Chunk states are merged in chunk order, so results do not depend on threads.
//
// With epsilon > 0 a (KV head, batch) walks its pages in one chunk, in decreasing order of their
// key-summary score bound, and stops reading once the bound proves the rest carry at most
// epsilon of every row's mass (DESIGN §6).
//
// Pages on disk are read through the disk tier's staging area (DiskPages). With epsilon = 0
// every attended page is read, so the reads are issued ahead, in token order, when the call
// starts; items run chunk by chunk, the chunks without disk pages first, so the reads overlap
// the attention over resident pages, and a page's staging is returned when the last item that
// reads it is done. With epsilon > 0 a disk page is read on first use only, so the pages that
// certified skipping leaves out are never read.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>

#include "argus/attention.h"
#include "argus/core.h"
#include "argus/store.h"
#include "attention/softmax.h"
#include "cache/placement_access.h"
#include "core/softmax_state.h"

namespace argus {
namespace {

using attention_internal::BestSoftmaxKernels;
using attention_internal::SoftmaxKernels;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Work items per call to aim for: enough to balance any thread count in use, few enough that
// chunk states stay small. Depends on nothing but this constant and the shapes.
constexpr size_t kTargetItems = 64;

// Which of a page's tokens a row attends: tokens [a, b) against the sink range [0, sink_end)
// and the window range [win_lo, pos].
enum class Coverage : uint8_t { kNone, kPartial, kFull };

Coverage PageCoverage(uint32_t pos, uint32_t a, uint32_t b, const AttentionOptions& options) {
  auto overlap = [](uint64_t lo1, uint64_t hi1, uint64_t lo2, uint64_t hi2) -> uint64_t {
    uint64_t lo = std::max(lo1, lo2), hi = std::min(hi1, hi2);
    return hi > lo ? hi - lo : 0;
  };
  uint64_t end = uint64_t{pos} + 1;  // causal: [0, pos]
  uint64_t sink_end = std::min<uint64_t>(options.sinks, end);
  uint64_t win_lo = options.window == 0 || options.window > pos ? 0 : pos - options.window + 1;
  uint64_t attended =
      overlap(a, b, 0, sink_end) + overlap(a, b, win_lo, end) - overlap(a, b, win_lo, sink_end);
  if (attended == 0) return Coverage::kNone;
  return attended == b - a ? Coverage::kFull : Coverage::kPartial;
}

// The running softmax states of a batch's rows and their unnormalised outputs.
struct RowStates {
  std::vector<SoftmaxState<float>> softmax;  // [rows]
  std::vector<float> acc;                    // [rows, dim]
  void Reset(uint32_t n_rows, uint32_t dim) {
    softmax.assign(n_rows, {});
    acc.assign(size_t{n_rows} * dim, 0.0f);
  }
};

// Everything one call needs, computed before any work runs (plan, then run).
struct Plan {
  CacheGeometry g;
  std::vector<PageView> pages;     // the layer's pages, token order
  std::vector<uint32_t> attended;  // indices into pages that some row attends
  uint32_t n_queries = 0, first_pos = 0;
  uint32_t rows_per_head = 0;  // n_queries * gqa
  uint32_t n_batches = 0, batch_rows = 0;
  uint32_t n_chunks = 0;  // per (KV head, batch)
  // [n_kv_heads, n_batches, batch_rows, dim]: each batch's rows, scaled.
  std::vector<float> q_rows;
  AttentionOptions options;

  uint32_t RowPos(uint32_t row) const { return first_pos + row / g.gqa(); }
  uint32_t BatchBegin(uint32_t batch) const { return batch * batch_rows; }
  uint32_t BatchRows(uint32_t batch) const {
    return std::min(batch_rows, rows_per_head - BatchBegin(batch));
  }
  size_t RowsOffset(uint32_t kv_head, uint32_t batch) const {
    return (size_t{kv_head} * n_batches + batch) * batch_rows * g.head_dim;
  }
  float* Rows(uint32_t kv_head, uint32_t batch) {
    return q_rows.data() + RowsOffset(kv_head, batch);
  }
  const float* Rows(uint32_t kv_head, uint32_t batch) const {
    return q_rows.data() + RowsOffset(kv_head, batch);
  }
};

// The attended pages that live on disk, for one call.
class DiskPages {
 public:
  // uses_per_page: how many items read each page (ahead mode); 0 selects on-demand mode.
  static Result<std::unique_ptr<DiskPages>> Open(const KvCache& cache, const Plan& plan,
                                                 uint32_t uses_per_page) {
    auto pages = std::unique_ptr<DiskPages>(new DiskPages());
    pages->index_.assign(plan.attended.size(), -1);
    std::vector<PageKey> keys;
    for (uint32_t a = 0; a < plan.attended.size(); ++a) {
      const PageView& page = plan.pages[plan.attended[a]];
      if (page.tier != TierKind::kDisk) continue;
      pages->index_[a] = static_cast<int32_t>(keys.size());
      keys.push_back(page.disk_key);
      pages->n_bytes_.push_back(page.n_bytes);
    }
    if (keys.empty()) return pages;
    pages->disk_ = cache.disk();
    if (pages->disk_ == nullptr) return Status::Internal("pages on disk in a cache without one");
    for (const PageKey& key : keys) {
      ARGUS_ASSIGN_OR_RETURN(StoredPageInfo info, pages->disk_->Info(key));
      pages->slot_bytes_.push_back(info.slot_bytes);
    }
    if (uses_per_page > 0) {
      ARGUS_ASSIGN_OR_RETURN(pages->ahead_, pages->disk_->ReadBatch(keys));
      pages->uses_left_ = std::make_unique<std::atomic<uint32_t>[]>(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) pages->uses_left_[i] = uses_per_page;
    } else {
      pages->keys_ = std::move(keys);
      pages->on_demand_.resize(pages->keys_.size());
    }
    return pages;
  }

  bool on_disk(uint32_t a) const { return index_[a] >= 0; }
  uint64_t bytes(uint32_t a) const { return n_bytes_[index_[a]]; }
  // What reading page a takes of the staging budget.
  uint64_t staging_bytes(uint32_t a) const { return slot_bytes_[index_[a]]; }
  size_t size() const { return n_bytes_.size(); }

  // The bytes of attended page a (on disk), read and verified.
  Result<const std::byte*> Acquire(uint32_t a) {
    const size_t i = static_cast<size_t>(index_[a]);
    std::span<const std::byte> bytes;
    if (ahead_ != nullptr) {
      ARGUS_ASSIGN_OR_RETURN(bytes, ahead_->Get(i));
    } else {
      PageReadBatch* batch;
      {
        std::lock_guard lock(mu_);
        if (on_demand_[i] == nullptr) {
          ARGUS_ASSIGN_OR_RETURN(on_demand_[i], disk_->ReadBatch({&keys_[i], 1}));
        }
        batch = on_demand_[i].get();
      }
      ARGUS_ASSIGN_OR_RETURN(bytes, batch->Get(0));
    }
    if (bytes.size() != n_bytes_[i])
      return Status::Corruption("disk page of " + std::to_string(bytes.size()) + " bytes, the " +
                                "page table says " + std::to_string(n_bytes_[i]));
    return bytes.data();
  }
  // An item is done with page a: the last one returns its staging (ahead mode).
  void Done(uint32_t a) {
    if (ahead_ == nullptr) return;
    const size_t i = static_cast<size_t>(index_[a]);
    if (uses_left_[i].fetch_sub(1, std::memory_order_acq_rel) == 1) ahead_->Release(i);
  }

 private:
  DiskPages() = default;
  DiskTier* disk_ = nullptr;
  std::vector<int32_t> index_;  // per attended page: its index among the disk pages, or -1
  std::vector<uint64_t> n_bytes_, slot_bytes_;
  std::unique_ptr<PageReadBatch> ahead_;
  std::unique_ptr<std::atomic<uint32_t>[]> uses_left_;
  std::mutex mu_;
  std::vector<PageKey> keys_;
  std::vector<std::unique_ptr<PageReadBatch>> on_demand_;
};

// What one work item produced beyond its row states.
struct ItemResult {
  Status status;
  AttentionStats counts;          // bytes_read and skipped_mass_bound
  std::vector<uint32_t> skipped;  // indices into Plan::attended
};

// Per-page softmax states of the last query's rows, for the mass signal:
// [attended page, n_q_heads].
using PageStats = std::vector<SoftmaxState<float>>;

class ItemRunner {
 public:
  ItemRunner(const Plan& plan, const SoftmaxKernels& kernels, DiskPages& disk_pages,
             uint32_t kv_head, uint32_t batch, RowStates& state, ItemResult& result,
             PageStats& page_stats)
      : plan_(plan),
        disk_pages_(disk_pages),
        k_(kernels),
        kv_head_(kv_head),
        row0_(plan.BatchBegin(batch)),
        n_rows_(plan.BatchRows(batch)),
        q_(plan.Rows(kv_head, batch)),
        state_(state),
        result_(result),
        page_stats_(page_stats) {
    state_.Reset(n_rows_, plan.g.head_dim);
  }

  // Reads page `pages[attended[a]]` into the state. False on an error (in result.status).
  bool ProcessPage(uint32_t a) {
    if (!disk_pages_.on_disk(a)) return ProcessBytes(a, plan_.pages[plan_.attended[a]]);
    PageView page = plan_.pages[plan_.attended[a]];
    auto bytes = disk_pages_.Acquire(a);
    bool ok = bytes.ok();
    if (ok) {
      page.bytes = *bytes;
      ok = ProcessBytes(a, page);
    } else {
      Fail(bytes.status(), page);
    }
    disk_pages_.Done(a);
    return ok;
  }

  bool ProcessBytes(uint32_t a, const PageView& page) {
    const uint32_t n = page.n_tokens, dim = plan_.g.head_dim;
    static thread_local std::vector<float> scratch;
    if (scratch.size() < size_t{n_rows_} * n) scratch.resize(size_t{n_rows_} * n);
    float* s = scratch.data();
    Status st = page.k_codec->scores(page.k_tile(kv_head_), {n, dim}, q_, n_rows_, s);
    if (!st.ok()) return Fail(st, page);
    for (uint32_t r = 0; r < n_rows_; ++r) {
      float* row = s + size_t{r} * n;
      uint32_t pos = plan_.RowPos(row0_ + r);
      switch (PageCoverage(pos, page.first_token, page.first_token + n, plan_.options)) {
        case Coverage::kFull:
          break;
        case Coverage::kNone:
          std::fill(row, row + n, kNegInf);
          break;
        case Coverage::kPartial:
          for (uint32_t t = 0; t < n; ++t)
            if (!Attends(pos, page.first_token + t, plan_.options)) row[t] = kNegInf;
          break;
      }
      float page_max = k_.max(row, n);
      if (page_max == kNegInf) {
        std::fill(row, row + n, 0.0f);  // no attended token: p = 0
        RecordPage(a, r, {});
        continue;
      }
      SoftmaxState<float>& state = state_.softmax[r];
      if (page_max > state.m)
        k_.scale(state_.acc.data() + size_t{r} * dim, dim, state.Raise(page_max));
      float sum = k_.exp_sum(row, n, state.m);
      state.d += sum;
      RecordPage(a, r, {state.m, sum});
    }
    st = page.v_codec->accumulate(page.v_tile(kv_head_), {n, dim}, s, n_rows_, state_.acc.data());
    if (!st.ok()) return Fail(st, page);
    result_.counts.bytes_read += page.k_tile_bytes + page.v_tile_bytes;
    return true;
  }

  // Pages [begin, end) of the attended list, in order.
  void RunChunk(uint32_t begin, uint32_t end) {
    for (uint32_t a = begin; a < end; ++a) {
      if (!ProcessPage(a)) {
        // The pages this item will not read must still count as done, or their staging would
        // never return.
        for (uint32_t b = a + 1; b < end; ++b)
          if (disk_pages_.on_disk(b)) disk_pages_.Done(b);
        return;
      }
    }
  }

  // Every attended page, reading the ones whose bound may matter (see the file comment).
  void RunCertified();

 private:
  bool Fail(const Status& st, const PageView& page) {
    result_.status =
        st.WithContext("page " + std::to_string(page.id) + ", kv head " + std::to_string(kv_head_));
    return false;
  }
  // Only the last query's rows feed the mass signal (for decode: every row).
  void RecordPage(uint32_t a, uint32_t r, SoftmaxState<float> page) {
    uint32_t row = row0_ + r;
    uint32_t gqa = plan_.g.gqa();
    if (row / gqa != plan_.n_queries - 1) return;
    page_stats_[size_t{a} * plan_.g.n_q_heads + kv_head_ * gqa + row % gqa] = page;
  }
  // Upper bound on the scaled scores of row r against page `page` (keys from the summary, plus
  // the K codec's fused-kernel error).
  double ScoreBound(const PageView& page, uint32_t r) const;

  const Plan& plan_;
  DiskPages& disk_pages_;
  const SoftmaxKernels& k_;
  uint32_t kv_head_, row0_, n_rows_;
  const float* q_;  // [n_rows_, dim]
  RowStates& state_;
  ItemResult& result_;
  PageStats& page_stats_;
};

double ItemRunner::ScoreBound(const PageView& page, uint32_t r) const {
  const uint32_t dim = plan_.g.head_dim;
  const float* q = q_ + size_t{r} * dim;
  const float* lo = page.key_min + size_t{kv_head_} * dim;
  const float* hi = page.key_max + size_t{kv_head_} * dim;
  double bound = 0, q_norm2 = 0;
  for (uint32_t d = 0; d < dim; ++d) {
    double qd = q[d];
    bound += std::max(qd * lo[d], qd * hi[d]);
    q_norm2 += qd * qd;
  }
  // The fused kernels may exceed q.k' by this (CodecInfo::fused_rel_error), and float summation
  // of the bound itself is exact enough in double.
  double slack =
      page.k_codec->info().fused_rel_error * std::sqrt(q_norm2) * page.key_norm_max[kv_head_];
  return bound + slack;
}

void ItemRunner::RunCertified() {
  const auto& attended = plan_.attended;
  std::vector<uint32_t> order;  // candidates for skipping: full pages with summaries
  for (uint32_t a = 0; a < attended.size(); ++a) {
    if (plan_.pages[attended[a]].key_min == nullptr) {
      if (!ProcessPage(a)) return;  // the active page is always read
    } else {
      order.push_back(a);
    }
  }
  // bounds[i][r], and per row the largest bound C_r (the reference of the suffix sums).
  const size_t n = order.size();
  std::vector<double> bounds(n * n_rows_, -std::numeric_limits<double>::infinity());
  std::vector<double> top(n_rows_, -std::numeric_limits<double>::infinity());
  std::vector<double> key(n, -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < n; ++i) {
    const PageView& page = plan_.pages[attended[order[i]]];
    for (uint32_t r = 0; r < n_rows_; ++r) {
      uint32_t pos = plan_.RowPos(row0_ + r);
      if (PageCoverage(pos, page.first_token, page.first_token + page.n_tokens, plan_.options) ==
          Coverage::kNone)
        continue;
      double b = ScoreBound(page, r);
      bounds[i * n_rows_ + r] = b;
      top[r] = std::max(top[r], b);
      key[i] = std::max(key[i], b);
    }
  }
  // Most promising pages first (ties in page order), so the state's max and sum grow fast.
  std::vector<uint32_t> rank(n);
  std::iota(rank.begin(), rank.end(), 0u);
  std::stable_sort(rank.begin(), rank.end(),
                   [&](uint32_t x, uint32_t y) { return key[x] > key[y]; });
  // suffix[i][r] = sum over ranked pages j >= i of n_tokens_j * exp(bound_jr - C_r).
  std::vector<double> suffix((n + 1) * n_rows_, 0.0);
  for (size_t i = n; i-- > 0;) {
    const PageView& page = plan_.pages[attended[order[rank[i]]]];
    for (uint32_t r = 0; r < n_rows_; ++r) {
      double b = bounds[size_t{rank[i]} * n_rows_ + r];
      double term = b == -std::numeric_limits<double>::infinity()
                        ? 0.0
                        : page.n_tokens * std::exp(b - top[r]);
      suffix[i * n_rows_ + r] = suffix[(i + 1) * n_rows_ + r] + term;
    }
  }
  const double epsilon = plan_.options.epsilon;
  for (size_t i = 0; i < n; ++i) {
    // The rest (ranked i..n-1) is skippable when, for every row, its mass bound relative to the
    // mass already seen is within epsilon; mass seen <= total, so the fraction of the total is
    // smaller still.
    double worst = 0;
    for (uint32_t r = 0; r < n_rows_ && worst <= epsilon; ++r) {
      double rest = suffix[i * n_rows_ + r];
      if (rest == 0) continue;
      const SoftmaxState<float>& seen = state_.softmax[r];
      worst = std::max(worst, seen.d > 0 ? SoftmaxState<double>{top[r], rest}.ShareOf(seen)
                                         : std::numeric_limits<double>::infinity());
    }
    if (worst <= epsilon) {
      for (size_t j = i; j < n; ++j) result_.skipped.push_back(order[rank[j]]);
      // `worst` stopped early only when above epsilon, so here it covers every row.
      result_.counts.skipped_mass_bound = worst;
      return;
    }
    if (!ProcessPage(order[rank[i]])) return;
  }
}

// Merges chunk state b into a (both for the same rows), a then b.
void Merge(RowStates& a, const RowStates& b, uint32_t dim) {
  for (size_t r = 0; r < a.softmax.size(); ++r) {
    if (b.softmax[r].empty()) continue;
    const auto [fa, fb] = a.softmax[r].Merge(b.softmax[r]);
    for (uint32_t d = 0; d < dim; ++d)
      a.acc[r * dim + d] = a.acc[r * dim + d] * fa + b.acc[r * dim + d] * fb;
  }
}

Result<Plan> MakePlan(const KvCache& cache, SeqId seq, uint32_t layer, const float* q,
                      uint32_t n_queries, const AttentionOptions& options) {
  Plan plan;
  plan.g = cache.geometry();
  plan.options = options;
  if (!(options.epsilon >= 0 && options.epsilon < 1))
    return Status::InvalidArgument("attention epsilon must be in [0, 1), got " +
                                   std::to_string(options.epsilon));
  if (!(options.scale >= 0) || !std::isfinite(options.scale))
    return Status::InvalidArgument("attention scale must be finite and >= 0 (0: 1/sqrt(dim))");
  ARGUS_ASSIGN_OR_RETURN(uint32_t length, cache.Length(seq, layer));
  if (n_queries == 0 || n_queries > length)
    return Status::InvalidArgument("attention of " + std::to_string(n_queries) +
                                   " queries over layer " + std::to_string(layer) +
                                   " of sequence " + std::to_string(seq) + " which holds " +
                                   std::to_string(length) + " tokens");
  ARGUS_ASSIGN_OR_RETURN(plan.pages, cache.Pages(seq, layer));
  plan.n_queries = n_queries;
  plan.first_pos = length - n_queries;
  // A non-finite query would turn every score of its head into NaN, which the softmax absorbs
  // into an output that looks valid: refused here, as K and V are at Append.
  const size_t q_row = size_t{cache.geometry().n_q_heads} * cache.geometry().head_dim;
  const float* q_end = q + n_queries * q_row;
  if (const float* bad =
          std::find_if_not(q, q_end, [](float value) { return std::isfinite(value); });
      bad != q_end) {
    const size_t i = static_cast<size_t>(bad - q);
    return Status::InvalidArgument(
        "attention over layer " + std::to_string(layer) + " of sequence " + std::to_string(seq) +
        ": query value " + std::to_string(*bad) + " at position " +
        std::to_string(plan.first_pos + i / q_row) + ", head " +
        std::to_string(i % q_row / cache.geometry().head_dim) + " is not finite");
  }
  const CacheGeometry& g = plan.g;
  const uint32_t gqa = g.gqa(), dim = g.head_dim;
  plan.rows_per_head = n_queries * gqa;
  plan.batch_rows = std::min(plan.rows_per_head, kMaxGroupHeads / gqa * gqa);
  plan.n_batches = (plan.rows_per_head + plan.batch_rows - 1) / plan.batch_rows;

  uint32_t last_pos = length - 1;
  for (uint32_t i = 0; i < plan.pages.size(); ++i) {
    const PageView& page = plan.pages[i];
    // Rows span positions [first_pos, last_pos]; their attended ranges union to
    // [0, sinks) and (first_pos - window, last_pos].
    bool hit = page.first_token < options.sinks || options.window == 0 ||
               uint64_t{page.first_token} + page.n_tokens + options.window > plan.first_pos + 1;
    if (hit && page.first_token <= last_pos) plan.attended.push_back(i);
  }

  const float scale = options.scale > 0 ? options.scale : 1.0f / std::sqrt(float(dim));
  plan.q_rows.assign(size_t{g.n_kv_heads} * plan.n_batches * plan.batch_rows * dim, 0.0f);
  for (uint32_t h = 0; h < g.n_kv_heads; ++h)
    for (uint32_t row = 0; row < plan.rows_per_head; ++row) {
      const float* src = q + (size_t{row / gqa} * g.n_q_heads + h * gqa + row % gqa) * dim;
      const uint32_t batch = row / plan.batch_rows;
      float* dst = plan.Rows(h, batch) + size_t{row - plan.BatchBegin(batch)} * dim;
      for (uint32_t d = 0; d < dim; ++d) dst[d] = src[d] * scale;
    }
  size_t heads_batches = size_t{g.n_kv_heads} * plan.n_batches;
  size_t chunks = options.epsilon > 0 ? 1 : std::max<size_t>(1, kTargetItems / heads_batches);
  plan.n_chunks = static_cast<uint32_t>(
      std::clamp<size_t>(chunks, 1, std::max<size_t>(1, plan.attended.size())));
  return plan;
}

// The order chunks run in when reading ahead: chunks without disk pages first, so the reads
// overlap their attention, then the others in token order, the order their pages are read.
// The pool hands out items in order, so at most `window` consecutive chunks have items running
// (ceil(threads / items per chunk) + 1); when the disk pages of any `window` consecutive disk
// chunks fit the staging budget together (`most_staged`), every page those items wait for gets
// staged as earlier chunks release theirs, and no order of waits can deadlock. (With epsilon > 0
// there is one chunk, held until the call ends.)
struct ChunkOrder {
  std::vector<uint32_t> order;
  uint64_t most_staged = 0;  // the most bytes of disk pages `window` consecutive chunks hold
};

template <typename ChunkBegin>
ChunkOrder OrderChunks(const Plan& plan, const DiskPages& disk_pages, size_t window,
                       ChunkBegin chunk_begin) {
  ChunkOrder result;
  std::vector<uint32_t> with_disk;
  std::vector<uint64_t> disk_bytes;  // of the chunks in with_disk
  for (uint32_t c = 0; c < plan.n_chunks; ++c) {
    uint64_t n_bytes = 0;
    for (uint32_t a = chunk_begin(c); a < chunk_begin(c + 1); ++a)
      if (disk_pages.on_disk(a)) n_bytes += disk_pages.staging_bytes(a);
    (n_bytes == 0 ? result.order : with_disk).push_back(c);
    if (n_bytes > 0) disk_bytes.push_back(n_bytes);
  }
  result.order.insert(result.order.end(), with_disk.begin(), with_disk.end());
  uint64_t sum = 0;
  for (size_t i = 0; i < disk_bytes.size(); ++i) {
    sum += disk_bytes[i] - (i >= window ? disk_bytes[i - window] : 0);
    result.most_staged = std::max(result.most_staged, sum);
  }
  return result;
}

}  // namespace

AttentionEngine::AttentionEngine(ThreadPool& pool) : pool_(pool) {}

Result<AttentionStats> AttentionEngine::Decode(KvCache& cache, SeqId seq, uint32_t layer,
                                               const float* q, float* out,
                                               const AttentionOptions& options) {
  return Prefill(cache, seq, layer, q, 1, out, options);
}

Result<AttentionStats> AttentionEngine::Prefill(KvCache& cache, SeqId seq, uint32_t layer,
                                                const float* q, uint32_t n_queries, float* out,
                                                const AttentionOptions& options) {
  ARGUS_ASSIGN_OR_RETURN(Plan plan, MakePlan(cache, seq, layer, q, n_queries, options));
  const CacheGeometry& g = plan.g;
  const uint32_t dim = g.head_dim, gqa = g.gqa();
  const SoftmaxKernels& kernels = BestSoftmaxKernels();

  const uint32_t n_attended = static_cast<uint32_t>(plan.attended.size());
  auto chunk_begin = [&](uint32_t chunk) {
    return static_cast<uint32_t>(uint64_t{n_attended} * chunk / plan.n_chunks);
  };

  const bool read_ahead = options.epsilon == 0;
  const uint32_t heads_batches = g.n_kv_heads * plan.n_batches;
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<DiskPages> disk_pages,
                         DiskPages::Open(cache, plan, read_ahead ? heads_batches : 0));
  const size_t window = (pool_.n_threads() + heads_batches - 1) / heads_batches + 1;
  // A call whose window of chunks outgrows the staging is split into more chunks (a window then
  // holds fewer pages), down to a page a chunk, before it is refused.
  const uint64_t staging =
      cache.disk() == nullptr ? 0 : cache.disk()->options().staging_budget_bytes;
  ChunkOrder chunks = OrderChunks(plan, *disk_pages, window, chunk_begin);
  while (chunks.most_staged > staging && read_ahead && plan.n_chunks < n_attended) {
    plan.n_chunks = std::min(n_attended, plan.n_chunks * 2);
    chunks = OrderChunks(plan, *disk_pages, window, chunk_begin);
  }
  if (chunks.most_staged > staging) {
    return Status::ResourceExhausted("staging budget of " + std::to_string(staging) +
                                     " bytes: attention may hold " +
                                     std::to_string(chunks.most_staged) +
                                     " bytes of disk pages at once; raise the staging budget");
  }
  const std::vector<uint32_t>& chunk_order = chunks.order;

  const size_t n_items = size_t{g.n_kv_heads} * plan.n_batches * plan.n_chunks;
  std::vector<RowStates> states(n_items);
  std::vector<ItemResult> results(n_items);
  PageStats page_stats;
  page_stats.assign(plan.attended.size() * g.n_q_heads, {});

  // Items run chunk by chunk in chunk_order (see the file comment); item i's state is
  // states[(kv_head * n_batches + batch) * n_chunks + chunk] whatever the order, so the merge
  // below, and the result, do not depend on it.
  pool_.ParallelFor(n_items, 1, [&](size_t i, size_t, size_t) {
    const uint32_t chunk = read_ahead ? chunk_order[i / heads_batches] : i % plan.n_chunks;
    const size_t head_batch = read_ahead ? i % heads_batches : i / plan.n_chunks;
    const uint32_t batch = static_cast<uint32_t>(head_batch % plan.n_batches);
    const uint32_t kv_head = static_cast<uint32_t>(head_batch / plan.n_batches);
    const size_t item = head_batch * plan.n_chunks + chunk;
    ItemRunner runner(plan, kernels, *disk_pages, kv_head, batch, states[item], results[item],
                      page_stats);
    if (options.epsilon > 0) {
      runner.RunCertified();
    } else {
      runner.RunChunk(chunk_begin(chunk), chunk_begin(chunk + 1));
    }
  });

  AttentionStats stats;
  stats.n_pages = static_cast<uint32_t>(plan.pages.size());
  stats.n_pages_masked = stats.n_pages - n_attended;
  stats.n_tiles = uint64_t{n_attended} * g.n_kv_heads;
  // A tile counts as skipped when every row batch of its KV head skipped it.
  std::vector<uint32_t> n_skips(n_attended), n_heads_skipping(n_attended);
  for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
    std::fill(n_skips.begin(), n_skips.end(), 0u);
    for (size_t item = size_t{h} * plan.n_batches * plan.n_chunks;
         item < size_t{h + 1} * plan.n_batches * plan.n_chunks; ++item) {
      const ItemResult& r = results[item];
      ARGUS_RETURN_IF_ERROR(r.status);
      stats += r.counts;
      for (uint32_t a : r.skipped) ++n_skips[a];
    }
    for (uint32_t a = 0; a < n_attended; ++a) {
      if (n_skips[a] < plan.n_batches) continue;
      ++n_heads_skipping[a];
      const PageView& page = plan.pages[plan.attended[a]];
      stats.skipped.push_back({page.id, h});
      stats.bytes_skipped += page.k_tile_bytes + page.v_tile_bytes;
    }
  }
  stats.n_tiles_skipped = stats.skipped.size();
  for (uint32_t a = 0; a < n_attended; ++a) {
    if (!disk_pages->on_disk(a)) continue;
    // Ahead mode reads every page; on demand, a page every KV head skipped was never read.
    if (!read_ahead && n_heads_skipping[a] == g.n_kv_heads) continue;
    ++stats.n_disk_pages_read;
    stats.disk_bytes_read += disk_pages->bytes(a);
  }

  // Merge each (KV head, batch)'s chunks in chunk order and normalise into out.
  std::vector<SoftmaxState<float>> last_rows(g.n_q_heads);  // the last query's, by head
  for (uint32_t h = 0; h < g.n_kv_heads; ++h)
    for (uint32_t b = 0; b < plan.n_batches; ++b) {
      size_t first = (size_t{h} * plan.n_batches + b) * plan.n_chunks;
      RowStates& merged = states[first];
      for (uint32_t c = 1; c < plan.n_chunks; ++c) Merge(merged, states[first + c], dim);
      for (uint32_t r = 0; r < plan.BatchRows(b); ++r) {
        uint32_t row = plan.BatchBegin(b) + r;
        uint32_t head = h * gqa + row % gqa;
        float* dst = out + (size_t{row / gqa} * g.n_q_heads + head) * dim;
        const float inv = merged.softmax[r].Normalizer();
        for (uint32_t d = 0; d < dim; ++d) dst[d] = merged.acc[size_t{r} * dim + d] * inv;
        if (row / gqa == n_queries - 1) last_rows[head] = merged.softmax[r];
      }
    }

  if (options.record_mass) {
    // A page's mass per head is its sum rescaled to the head's final max, over the head's
    // final sum; the page's signal is the mean over heads. Masked pages get 0.
    std::vector<PageId> ids(plan.pages.size());
    std::vector<float> mass(plan.pages.size(), 0.0f);
    for (size_t i = 0; i < plan.pages.size(); ++i) ids[i] = plan.pages[i].id;
    for (uint32_t a = 0; a < n_attended; ++a) {
      double total = 0;
      for (uint32_t head = 0; head < g.n_q_heads; ++head) {
        const SoftmaxState<float>& page = page_stats[size_t{a} * g.n_q_heads + head];
        if (page.d == 0 || last_rows[head].d == 0) continue;
        total += page.ShareOf(last_rows[head]);
      }
      mass[plan.attended[a]] = static_cast<float>(total / g.n_q_heads);
    }
    RecordAttention(cache, ids, mass);
  }
  return stats;
}

}  // namespace argus
