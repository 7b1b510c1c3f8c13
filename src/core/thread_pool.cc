#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "argus/core.h"

namespace argus {

// Workers sleep on a generation counter; each ParallelFor publishes one job and every thread
// (the caller included) claims chunk indices from a shared atomic until none are left.
struct ThreadPool::Impl {
  std::mutex call_mu;  // serialises ParallelFor calls
  std::mutex mu;
  std::condition_variable wake, done;
  std::vector<std::thread> workers;
  uint64_t generation = 0;
  bool stopping = false;

  const std::function<void(size_t, size_t, size_t)>* fn = nullptr;
  size_t n_items = 0, chunk = 1, n_chunks = 0;
  std::atomic<size_t> next_chunk{0};
  size_t n_busy = 0;

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
    for (;;) {
      {
        std::unique_lock lock(mu);
        wake.wait(lock, [&] { return stopping || generation != seen; });
        if (stopping) return;
        seen = generation;
      }
      RunChunks();
      std::lock_guard lock(mu);
      if (--n_busy == 0) done.notify_one();
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
    impl_->stopping = true;
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
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    s.fn = &fn;
    s.n_items = n_items;
    s.chunk = chunk;
    s.n_chunks = (n_items + chunk - 1) / chunk;
    s.next_chunk.store(0, std::memory_order_relaxed);
    s.n_busy = s.workers.size();
    ++s.generation;
  }
  s.wake.notify_all();
  s.RunChunks();
  std::unique_lock lock(s.mu);
  s.done.wait(lock, [&] { return s.n_busy == 0; });
}

}  // namespace argus
