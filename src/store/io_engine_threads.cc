// The portable I/O engine: a pool of threads that take requests from one FIFO queue and read them
// with File::ReadAt (ReadExact continues short reads and turns end of file into Corruption).
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "store/io_engine.h"

namespace argus {
namespace {

class ThreadIoEngine final : public IoEngine {
 public:
  explicit ThreadIoEngine(uint32_t n_threads) {
    workers_.reserve(n_threads);
    for (uint32_t i = 0; i < n_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~ThreadIoEngine() override {
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [&] { return queue_.empty() && n_reading_ == 0; });
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  void Submit(IoRequest* request) override {
    {
      std::lock_guard lock(mu_);
      request->status = Status::Ok();
      request->done.store(false, std::memory_order_relaxed);
      queue_.push_back(request);
    }
    work_.notify_one();
  }

  Status Wait(IoRequest* request) override {
    std::unique_lock lock(mu_);
    finished_.wait(lock, [&] { return request->done.load(std::memory_order_relaxed); });
    return request->status;
  }

  std::string name() const override {
    return "pread pool of " + std::to_string(workers_.size()) +
           (workers_.size() == 1 ? " thread" : " threads");
  }

 private:
  void WorkerLoop() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      IoRequest* request = queue_.front();
      queue_.pop_front();
      ++n_reading_;
      lock.unlock();
      Status status = ReadExact(*request->file, request->offset, request->dst,
                                "a read of " + std::to_string(request->dst.size()) +
                                    " bytes at offset " + std::to_string(request->offset));
      lock.lock();
      // Published under the mutex: a waiter tests `done` under it, so no wake-up is lost, and
      // once it sees `done` it may free the request, which this thread no longer touches.
      // Release order: a caller that polls `done` without the mutex also sees status and bytes.
      request->status = std::move(status);
      request->done.store(true, std::memory_order_release);
      --n_reading_;
      finished_.notify_all();
      if (queue_.empty() && n_reading_ == 0) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;      // queue_ gained a request, or stopping_
  std::condition_variable finished_;  // some request turned done
  std::condition_variable idle_;      // nothing queued or being read
  std::deque<IoRequest*> queue_;
  size_t n_reading_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> MakeThreadIoEngine(uint32_t n_threads) {
  return std::make_unique<ThreadIoEngine>(n_threads == 0 ? 1 : n_threads);
}

}  // namespace argus
