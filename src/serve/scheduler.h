// The scheduler of argus serve: one thread that owns the BatchContext and runs continuous
// batching. Every step evaluates, in one forward pass, one token of every request that is
// decoding and one prompt chunk of each request still reading its prompt; requests join and leave
// between steps. Prompts that begin with the same full pages as a live or recently finished
// sequence fork it (copy-on-write) instead of evaluating those pages again; with a prompt cache,
// others load their stored pages from disk.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "argus/model.h"
#include "serve/api.h"
#include "serve/metrics.h"

namespace argus::serve {

// What one request's handler receives, in order: text pieces, then one kDone or kError.
struct GenerationEvent {
  enum class Kind : uint8_t { kText, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;
  StopReason stop_reason = StopReason::kEndTurn;  // kDone
  std::string stop_sequence;                      // kDone with kStopSequence
  uint32_t input_tokens = 0, output_tokens = 0;   // kDone
  ErrorKind error = ErrorKind::kInternal;         // kError
  std::string message;                            // kError
};

// The channel between a request's HTTP handler and the scheduler.
class RequestStream {
 public:
  // The next event, waiting up to `timeout`; false when none came.
  bool Next(GenerationEvent& event, std::chrono::milliseconds timeout);
  // The client is gone or stopped waiting: the scheduler drops the request and frees its pages.
  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  void Push(GenerationEvent event);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct Job {
  std::vector<int32_t> prompt;  // at least one token
  uint32_t max_tokens = 0;
  SamplerOptions sampler;
  std::vector<std::string> stop;
};

struct SchedulerOptions {
  uint32_t parallel = 16;     // requests generating at once
  uint32_t queue_limit = 64;  // requests waiting for a slot; beyond it: overloaded
  // Prompt tokens of one request per step: argus run's chunk (-b), so a request's tokens are
  // the ones `argus run` computes.
  uint32_t prefill_chunk = 64;
  std::chrono::seconds request_timeout{600};
  uint32_t retained_prefixes = 64;  // finished prompts kept for later forks, while memory allows
  // The context's disk tier is a prompt cache: each prompt's whole pages are stored there once
  // evaluated, and a prompt no live or retained sequence shares loads its prefix from there
  // (BatchContext::LoadPrefix, StorePrefix), across restarts.
  bool prompt_cache = false;
};

class Scheduler {
 public:
  Scheduler(const Model& model, BatchContext& context, const SchedulerOptions& options);
  ~Scheduler();  // cancels what is in flight and joins the thread

  // Queues a job. InvalidArgument when its prompt and max_tokens exceed the context;
  // ResourceExhausted (overloaded) when the queue is full, the scheduler is stopping, or the
  // job's pages could never be placed (BatchContext::placeable_bytes: RAM, and disk under a
  // placement engine).
  Result<std::shared_ptr<RequestStream>> Submit(Job job);

  // Stops accepting, lets the requests in flight finish for up to `grace`, then cancels the rest.
  // Returns once the scheduler is idle.
  void Drain(std::chrono::milliseconds grace);

  Metrics& metrics() { return metrics_; }

 private:
  struct Request;
  struct Impl;
  void Loop();

  std::unique_ptr<Impl> impl_;
  Metrics metrics_;
  std::thread thread_;
};

}  // namespace argus::serve
