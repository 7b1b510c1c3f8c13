#include "serve/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <list>
#include <unordered_map>

#include "serve/text_stream.h"

namespace argus::serve {

namespace {

using Clock = std::chrono::steady_clock;

// The hash of a prompt's first k pages, chained page by page (FNV-1a over the token ids). A hit
// is checked against the tokens themselves, so a collision costs a lookup, never a wrong page.
uint64_t ChainHash(uint64_t previous, std::span<const int32_t> page) {
  uint64_t h = previous ^ 0xcbf29ce484222325ull;
  for (int32_t token : page) {
    h ^= static_cast<uint32_t>(token);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<uint64_t> PageHashes(std::span<const int32_t> tokens, uint32_t page_tokens,
                                 size_t n_pages) {
  std::vector<uint64_t> hashes;
  uint64_t h = 0;
  for (size_t k = 0; k < n_pages; ++k) {
    h = ChainHash(h, tokens.subspan(k * page_tokens, page_tokens));
    hashes.push_back(h);
  }
  return hashes;
}

}  // namespace

bool RequestStream::Next(GenerationEvent& event, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestStream::Push(GenerationEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_one();
}

struct Scheduler::Request {
  Job job;
  std::shared_ptr<RequestStream> stream = std::make_shared<RequestStream>();
  size_t need_bytes =
      0;  // bytes its sequence may take alone, in the full codecs: what admission reserves
  Clock::time_point arrived = Clock::now(), last_token;
  SeqId seq = 0;
  uint32_t n_done = 0;      // prompt tokens in the sequence (shared or evaluated)
  int32_t next_token = -1;  // sampled, evaluated next step
  uint32_t n_generated = 0;
  Sampler sampler;
  TextStream text;

  explicit Request(Job j) : job(std::move(j)), sampler(job.sampler), text(job.stop) {}
  bool reading_prompt() const { return n_done < job.prompt.size(); }
};

// Sequences whose prompt pages later prompts may fork: live requests' once their prompt is in,
// and finished ones, kept (least recently used first) while memory allows.
class PrefixIndex {
 public:
  explicit PrefixIndex(uint32_t page_tokens) : page_tokens_(page_tokens) {}

  void Add(SeqId seq, std::span<const int32_t> prompt) {
    const size_t n_pages = prompt.size() / page_tokens_;
    if (n_pages == 0) return;
    Entry& e = entries_[seq];
    e.tokens.assign(prompt.begin(), prompt.begin() + n_pages * page_tokens_);
    e.hashes = PageHashes(e.tokens, page_tokens_, n_pages);
    for (uint64_t h : e.hashes) by_hash_[h] = seq;
  }

  void Remove(SeqId seq) {
    auto it = entries_.find(seq);
    if (it == entries_.end()) return;
    for (uint64_t h : it->second.hashes) {
      auto found = by_hash_.find(h);
      if (found != by_hash_.end() && found->second == seq) by_hash_.erase(found);
    }
    entries_.erase(it);
  }

  // The sequence holding the most whole pages of `prompt`, leaving its last token to evaluate
  // (its logits choose the first new token), and the tokens they cover; nullopt when none.
  std::optional<std::pair<SeqId, uint32_t>> Longest(std::span<const int32_t> prompt) const {
    const size_t n_pages = (prompt.size() - 1) / page_tokens_;
    const std::vector<uint64_t> hashes = PageHashes(prompt, page_tokens_, n_pages);
    for (size_t k = n_pages; k > 0; --k) {
      auto found = by_hash_.find(hashes[k - 1]);
      if (found == by_hash_.end()) continue;
      const std::vector<int32_t>& held = entries_.at(found->second).tokens;
      const size_t n = k * page_tokens_;
      if (held.size() >= n && std::equal(held.begin(), held.begin() + n, prompt.begin())) {
        return std::make_pair(found->second, static_cast<uint32_t>(n));
      }
    }
    return std::nullopt;
  }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> hashes;
  };
  uint32_t page_tokens_;
  std::unordered_map<SeqId, Entry> entries_;
  std::unordered_map<uint64_t, SeqId> by_hash_;
};

struct Scheduler::Impl {
  const Model& model;
  BatchContext& context;
  SchedulerOptions options;
  CacheOptions cache_options;
  size_t budget_bytes;  // what all requests together can place (RAM, and disk under placement)

  std::mutex mutex;  // guards queue, accepting, stopping
  std::condition_variable wake;
  std::deque<std::unique_ptr<Request>> queue;
  bool accepting = true, stopping = false;
  size_t n_active = 0;  // for Drain; written by the scheduler thread under the mutex

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Request>> active;
  size_t reserved_bytes = 0;
  PrefixIndex prefixes;
  std::list<SeqId> retained;  // finished sequences kept for forks, oldest first
  Clock::time_point last_cache_snapshot;

  Impl(const Model& m, BatchContext& c, const SchedulerOptions& o)
      : model(m),
        context(c),
        options(o),
        cache_options(c.cache().options()),
        budget_bytes(c.placeable_bytes()),
        prefixes(c.cache().page_tokens()) {}

  size_t NeedBytes(const Job& job) const {
    const uint32_t n = static_cast<uint32_t>(
        std::min<size_t>(context.n_ctx(), job.prompt.size() + job.max_tokens));
    Result<size_t> need = KvCache::RequiredRamBytes(cache_options, n);
    return need.ok() ? *need : SIZE_MAX;
  }

  void Forget(SeqId seq) {
    prefixes.Remove(seq);
    (void)context.Release(seq);  // a live sequence: Release cannot fail
  }

  // The number of requests in flight, for Drain and the metrics, after requests ended.
  void PublishActive(Metrics& metrics) {
    std::lock_guard lock(mutex);
    n_active = active.size();
    metrics.SetQueue(n_active, queue.size());
  }

  bool EvictOneRetained() {
    if (retained.empty()) return false;
    Forget(retained.front());
    retained.pop_front();
    return true;
  }

  // Keeps a finished request's whole prompt pages for later forks while there is room;
  // otherwise its sequence goes.
  void RetainOrRelease(const Request& r) {
    const uint32_t page = context.cache().page_tokens();
    const uint32_t keep = static_cast<uint32_t>(r.job.prompt.size() / page * page);
    if (keep == 0 || options.retained_prefixes == 0 || !context.Truncate(r.seq, keep).ok()) {
      Forget(r.seq);
      return;
    }
    retained.push_back(r.seq);
    while (retained.size() > options.retained_prefixes) EvictOneRetained();
  }

  // The pages (a page index and a layer each) of a run of n_tokens whole pages.
  size_t PagesOf(uint32_t n_tokens) const {
    return size_t{n_tokens} / context.cache().page_tokens() * context.cache().geometry().n_layers;
  }

  // A new request's sequence: a fork of the longest run of whole prompt pages some sequence
  // holds, else an empty one.
  Status Start(Request& r, Metrics& metrics) {
    const std::optional<std::pair<SeqId, uint32_t>> hit = prefixes.Longest(r.job.prompt);
    if (hit) {
      Result<SeqId> fork = context.Fork(hit->first, hit->second);
      if (fork.ok()) {
        r.seq = *fork;
        r.n_done = hit->second;
        // A retained sequence that served a fork is used again: last to go.
        auto it = std::find(retained.begin(), retained.end(), hit->first);
        if (it != retained.end()) retained.splice(retained.end(), retained, it);
        metrics.PrefixReused(hit->second, PagesOf(hit->second));
        return Status::Ok();
      }
    }
    ARGUS_ASSIGN_OR_RETURN(r.seq, context.NewSequence());
    if (options.prompt_cache) LoadStoredPrefix(r, metrics);
    return Status::Ok();
  }

  // The prompt cache is only a cache: when it fails, the request evaluates its whole prompt.
  void LoadStoredPrefix(Request& r, Metrics& metrics) {
    Result<uint32_t> loaded =
        context.LoadPrefix(r.seq, std::span(r.job.prompt).first(r.job.prompt.size() - 1));
    if (!loaded.ok()) {
      PromptCacheFailed(loaded.status(), metrics);
      return;
    }
    r.n_done = *loaded;
    metrics.PromptCacheLoaded(*loaded, PagesOf(*loaded));
  }

  // A prompt just evaluated: its whole pages into the prompt cache, before its first token may end
  // the request and its sequence with it. The first token waits for those pages' writes.
  void StorePrompt(const Request& r, Metrics& metrics) {
    PrefixStoreStats stored;
    const Status status = context.StorePrefix(r.seq, r.job.prompt, stored);
    metrics.PromptCacheStored(stored.n_stored);
    if (!status.ok()) PromptCacheFailed(status, metrics);
  }

  // Counted; and said on stderr unless it is only RAM that is short now (under memory pressure a
  // load waits for no room to be made).
  static void PromptCacheFailed(const Status& status, Metrics& metrics) {
    metrics.PromptCacheFailed();
    if (status.code() != StatusCode::kResourceExhausted)
      std::fprintf(stderr, "serve: prompt cache: %s\n", status.ToString().c_str());
  }

  // Ends a request: its last event, its reservation and its sequence.
  void End(Request& r, GenerationEvent event) {
    const bool done = event.kind == GenerationEvent::Kind::kDone;
    r.stream->Push(std::move(event));
    reserved_bytes -= r.need_bytes;
    if (done) {
      RetainOrRelease(r);
    } else {
      Forget(r.seq);
    }
  }

  GenerationEvent Done(Request& r, StopReason reason) {
    GenerationEvent e;
    e.kind = GenerationEvent::Kind::kDone;
    if (std::string rest = r.text.Finish(); !rest.empty() && !r.text.stopped()) {
      GenerationEvent text;
      text.text = std::move(rest);
      r.stream->Push(std::move(text));
    }
    e.stop_reason = r.text.stopped() ? StopReason::kStopSequence : reason;
    e.stop_sequence = r.text.stop_sequence();
    e.input_tokens = static_cast<uint32_t>(r.job.prompt.size());
    e.output_tokens = r.n_generated;
    return e;
  }

  static GenerationEvent Failed(ErrorKind kind, std::string message) {
    GenerationEvent e;
    e.kind = GenerationEvent::Kind::kError;
    e.error = kind;
    e.message = std::move(message);
    return e;
  }

  // The sampled token: its text to the stream, or the end of the request. Returns true when the
  // request goes on.
  bool Accept(Request& r, std::span<const float> logits, Metrics& metrics) {
    const int32_t token = r.sampler.Sample(logits);
    const Clock::time_point now = Clock::now();
    if (r.n_generated == 0 && r.next_token < 0) {
      metrics.PromptDone(static_cast<uint32_t>(r.job.prompt.size()),
                         std::chrono::duration<double>(now - r.arrived).count());
    } else {
      metrics.TokenGenerated(std::chrono::duration<double>(now - r.last_token).count());
    }
    r.last_token = now;
    const Tokenizer& tokenizer = model.tokenizer();
    if (tokenizer.IsEndOfGeneration(token)) {
      End(r, Done(r, StopReason::kEndTurn));
      return false;
    }
    ++r.n_generated;
    if (std::string text = r.text.Push(tokenizer.TokenToPiece(token)); !text.empty()) {
      GenerationEvent e;
      e.text = std::move(text);
      r.stream->Push(std::move(e));
    }
    if (r.text.stopped() || r.n_generated >= r.job.max_tokens) {
      End(r, Done(r, StopReason::kMaxTokens));
      return false;
    }
    if (context.Length(r.seq).value() >= context.n_ctx()) {  // the context is full
      End(r, Done(r, StopReason::kMaxTokens));
      return false;
    }
    r.next_token = token;
    return true;
  }
};

Scheduler::Scheduler(const Model& model, BatchContext& context, const SchedulerOptions& options)
    : impl_(std::make_unique<Impl>(model, context, options)), thread_([this] { Loop(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
    impl_->accepting = false;
  }
  impl_->wake.notify_all();
  thread_.join();
}

Result<std::shared_ptr<RequestStream>> Scheduler::Submit(Job job) {
  Impl& s = *impl_;
  if (job.prompt.empty()) return Status::InvalidArgument("the prompt has no tokens");
  if (job.prompt.size() >= s.context.n_ctx()) {
    return Status::InvalidArgument("the prompt has " + std::to_string(job.prompt.size()) +
                                   " tokens; the context holds " +
                                   std::to_string(s.context.n_ctx()));
  }
  auto request = std::make_unique<Request>(std::move(job));
  request->need_bytes = s.NeedBytes(request->job);
  if (request->need_bytes > s.budget_bytes) {
    return Status::ResourceExhausted(
        "the request's KV pages may need " + std::to_string(request->need_bytes) +
        " bytes; all requests together can place " + std::to_string(s.budget_bytes));
  }
  std::shared_ptr<RequestStream> stream = request->stream;
  {
    std::lock_guard lock(s.mutex);
    if (!s.accepting) return Status::ResourceExhausted("the server is shutting down");
    if (s.queue.size() >= s.options.queue_limit) {
      return Status::ResourceExhausted("the queue holds " + std::to_string(s.queue.size()) +
                                       " requests already");
    }
    s.queue.push_back(std::move(request));
  }
  s.wake.notify_all();
  return stream;
}

void Scheduler::Drain(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  s.accepting = false;
  const auto deadline = Clock::now() + grace;
  while ((s.n_active > 0 || !s.queue.empty()) && Clock::now() < deadline) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lock.lock();
  }
  s.stopping = true;  // the loop cancels what is left and ends
  lock.unlock();
  s.wake.notify_all();
  while (true) {
    lock.lock();
    const bool idle = s.n_active == 0 && s.queue.empty();
    lock.unlock();
    if (idle) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Scheduler::Loop() {
  Impl& s = *impl_;
  std::vector<BatchPiece> pieces;
  std::vector<Request*> in_step;
  std::vector<int32_t> decode_tokens;
  while (true) {
    // Admission: queued requests in order, while slots and the reservation of placeable bytes
    // allow.
    std::vector<std::unique_ptr<Request>> admitted;
    bool stopping = false;
    {
      std::unique_lock lock(s.mutex);
      if (s.active.empty() && s.queue.empty() && !s.stopping) {
        s.wake.wait_for(lock, std::chrono::milliseconds(200));
      }
      stopping = s.stopping;
      while (!s.queue.empty() && s.active.size() + admitted.size() < s.options.parallel &&
             s.reserved_bytes + s.queue.front()->need_bytes <= s.budget_bytes) {
        s.reserved_bytes += s.queue.front()->need_bytes;
        admitted.push_back(std::move(s.queue.front()));
        s.queue.pop_front();
      }
      if (stopping) {  // what is still queued ends now
        for (auto& r : s.queue) {
          r->stream->Push(Impl::Failed(ErrorKind::kOverloaded, "the server is shutting down"));
        }
        s.queue.clear();
      }
      s.n_active = s.active.size() + admitted.size();
      metrics_.SetQueue(s.n_active, s.queue.size());
      if (stopping && s.n_active == 0) return;
    }
    for (auto& r : admitted) {
      if (Status status = s.Start(*r, metrics_); !status.ok()) {
        s.reserved_bytes -= r->need_bytes;
        r->stream->Push(Impl::Failed(ErrorKind::kOverloaded, status.ToString()));
        continue;
      }
      s.active.push_back(std::move(r));
    }
    // Requests whose client left, that ran out of time, or that the shutdown cancels.
    std::erase_if(s.active, [&](const std::unique_ptr<Request>& r) {
      const bool timed_out = Clock::now() - r->arrived > s.options.request_timeout;
      if (!r->stream->cancelled() && !timed_out && !stopping) return false;
      s.End(*r, Impl::Failed(timed_out ? ErrorKind::kTimeout : ErrorKind::kOverloaded,
                             timed_out ? "the request ran past its time limit"
                                       : "the request was cancelled"));
      return true;
    });
    if (s.active.empty()) continue;

    // The step: one token of each decoding request, then a prompt chunk of each request reading
    // its prompt, while the batch has rows.
    pieces.clear();
    in_step.clear();
    decode_tokens.clear();
    decode_tokens.reserve(s.active.size());
    uint32_t rows = 0;
    for (auto& r : s.active) {
      if (r->reading_prompt()) continue;
      decode_tokens.push_back(r->next_token);
      pieces.push_back({r->seq, {&decode_tokens.back(), 1}, true});
      in_step.push_back(r.get());
      ++rows;
    }
    for (auto& r : s.active) {
      if (!r->reading_prompt()) continue;
      const uint32_t n = std::min<uint32_t>(
          s.options.prefill_chunk, static_cast<uint32_t>(r->job.prompt.size()) - r->n_done);
      if (rows + n > s.context.n_batch()) break;
      pieces.push_back({r->seq, std::span(r->job.prompt).subspan(r->n_done, n),
                        r->n_done + n == r->job.prompt.size()});
      in_step.push_back(r.get());
      rows += n;
    }
    const Clock::time_point t0 = Clock::now();
    Result<std::span<const float>> logits = s.context.Eval(pieces);
    while (!logits.ok() && logits.status().code() == StatusCode::kResourceExhausted &&
           s.EvictOneRetained()) {
      logits = s.context.Eval(pieces);
    }
    if (!logits.ok()) {
      // Every request of the step ends with the error: their sequences are as before it.
      for (Request* r : in_step) {
        s.End(*r, Impl::Failed(logits.status().code() == StatusCode::kResourceExhausted
                                   ? ErrorKind::kOverloaded
                                   : ErrorKind::kInternal,
                               logits.status().ToString()));
      }
      std::erase_if(s.active, [&](const std::unique_ptr<Request>& r) {
        return std::find(in_step.begin(), in_step.end(), r.get()) != in_step.end();
      });
      continue;
    }
    metrics_.StepDone(rows, std::chrono::duration<double>(Clock::now() - t0).count());
    const uint32_t n_vocab = s.model.config().n_vocab;
    size_t out = 0;
    std::vector<Request*> ended;
    for (size_t i = 0; i < pieces.size(); ++i) {
      Request& r = *in_step[i];
      if (r.reading_prompt()) {
        r.n_done += static_cast<uint32_t>(pieces[i].tokens.size());
        if (r.reading_prompt()) continue;
        s.prefixes.Add(r.seq, r.job.prompt);  // its prompt pages are whole and final now
        if (s.options.prompt_cache) s.StorePrompt(r, metrics_);  // before Accept may end it
      }
      if (!s.Accept(r, (*logits).subspan(out++ * n_vocab, n_vocab), metrics_)) {
        ended.push_back(&r);
      }
    }
    std::erase_if(s.active, [&](const std::unique_ptr<Request>& r) {
      return std::find(ended.begin(), ended.end(), r.get()) != ended.end();
    });
    if (!ended.empty()) s.PublishActive(metrics_);
    if (Clock::now() - s.last_cache_snapshot > std::chrono::milliseconds(100) || s.active.empty()) {
      metrics_.SetCache(s.context.cache().stats());
      if (auto placement = s.context.placement_stats()) metrics_.SetPlacement(*placement);
      s.last_cache_snapshot = Clock::now();
    }
  }
}

}  // namespace argus::serve
