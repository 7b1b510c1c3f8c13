#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "argus/core.h"

namespace argus {

Status CheckThreadCount(unsigned n_threads, std::string_view what) {
  if (n_threads <= kMaxThreads) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + ": " + std::to_string(n_threads) +
                                 " threads; at most " + std::to_string(kMaxThreads));
}

// Waits up to kSpin for done() to hold, yielding the CPU between checks. Callers make many short
// ParallelFor calls back to back (one per layer): a worker that is still spinning when the next
// job is published skips a futex sleep and wake, which cost tens of microseconds here. Yielding
// (not pausing) keeps spinning cheap when threads outnumber cores.
template <typename Done>
bool SpinUntil(Done done) {
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Workers wait on a generation counter (spinning briefly, then sleeping); each ParallelFor
// publishes one job and every thread (the caller included) claims chunk indices from a shared
// atomic until none are left. Job fields are written under `mu` before the generation is
// advanced with release order, so a worker that sees the new generation sees the job.
struct ThreadPool::Impl {
  std::mutex call_mu;  // serialises ParallelFor calls
  std::mutex mu;
  std::condition_variable wake, done;
  std::vector<std::thread> workers;
  std::atomic<uint64_t> generation{0};
  std::atomic<bool> stopping{false};

  const std::function<void(size_t, size_t, size_t)>* fn = nullptr;
  size_t n_items = 0, chunk = 1, n_chunks = 0;
  std::atomic<size_t> next_chunk{0};
  std::atomic<size_t> n_busy{0};

  void RunChunks() {
    for (;;) {
      size_t c = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= n_chunks) return;
      size_t begin = c * chunk;
      size_t end = begin + chunk < n_items ? begin + chunk : n_items;
      (*fn)(c, begin, end);
    }
  }

  void WorkerLoop() {
    uint64_t seen = 0;
    auto ready = [&] {
      return stopping.load(std::memory_order_acquire) ||
             generation.load(std::memory_order_acquire) != seen;
    };
    for (;;) {
      if (!SpinUntil(ready)) {
        std::unique_lock lock(mu);
        wake.wait(lock, ready);
      }
      if (stopping.load(std::memory_order_acquire)) return;
      seen = generation.load(std::memory_order_acquire);
      RunChunks();
      if (n_busy.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mu);  // the caller may be between its check and its wait
        done.notify_one();
      }
    }
  }
};

ThreadPool::ThreadPool(unsigned n_threads) : impl_(std::make_unique<Impl>()) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < n_threads; ++i)
    impl_->workers.emplace_back([this] { impl_->WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping.store(true, std::memory_order_release);
  }
  impl_->wake.notify_all();
  for (auto& w : impl_->workers) w.join();
}

unsigned ThreadPool::n_threads() const { return static_cast<unsigned>(impl_->workers.size()) + 1; }

void ThreadPool::ParallelFor(size_t n_items, size_t chunk,
                             const std::function<void(size_t, size_t, size_t)>& fn) {
  if (n_items == 0) return;
  if (chunk == 0) chunk = 1;
  std::lock_guard call_lock(impl_->call_mu);
  if (n_items <= chunk) return fn(0, 0, n_items);  // one chunk: no worker to wake
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    s.fn = &fn;
    s.n_items = n_items;
    s.chunk = chunk;
    s.n_chunks = (n_items + chunk - 1) / chunk;
    s.next_chunk.store(0, std::memory_order_relaxed);
    s.n_busy.store(s.workers.size(), std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_release);
  }
  s.wake.notify_all();
  s.RunChunks();
  auto all_done = [&] { return s.n_busy.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(all_done)) {
    std::unique_lock lock(s.mu);
    s.done.wait(lock, all_done);
  }
}

}  // namespace argus
