// The io_uring engine: one ring of queue_depth entries shared by all submitters, and a
// completion thread that reaps completions, continues short reads and refills the ring from the
// engine's FIFO queue.
//
// Locking: `mu_` guards the submission side of the ring, the queue and the per-read state. The
// completion thread sleeps in poll(2) on the ring descriptor (readable while completions are
// pending) and an eventfd (the destructor's stop signal) without holding `mu_`, then reaps under
// it. Stopping through an eventfd rather than a no-op submission means the stop never depends on
// the ring accepting one more entry.
//
// Files without a kernel descriptor (test wrappers) cannot go through the ring: they are read
// with ReadAt by a one-thread pread pool the engine owns, so Submit still never blocks on them.
// Every completion passes through File::FilterNativeRead before it counts, so a wrapper that does
// expose a descriptor can still fail or shorten the kernel's reads.
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "store/io_engine.h"

namespace argus {
namespace {

constexpr uint32_t kMaxQueueDepth = 4096;
// One SQE moves at most this much; larger requests continue like short reads (the kernel caps a
// single read near 2 GiB anyway).
constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;

std::string ErrnoText(int error) {
  return std::error_code(error, std::generic_category()).message();
}

// What /proc says about io_uring being switched off, for refusal messages; "" when unknown.
std::string DisabledSysctl() {
  std::ifstream in("/proc/sys/kernel/io_uring_disabled");
  int value = 0;
  if (!(in >> value)) return "";
  return "; /proc/sys/kernel/io_uring_disabled is " + std::to_string(value) +
         (value == 0   ? ""
          : value == 1 ? " (rings only for io_uring_group)"
                       : " (rings refused)");
}

// A read on the ring: the request and how many of its bytes have arrived.
struct Op {
  IoRequest* request = nullptr;
  uint64_t n_done = 0;
};

class UringIoEngine final : public IoEngine {
 public:
  UringIoEngine(io_uring ring, uint32_t queue_depth, int wake_fd)
      : ring_(ring), queue_depth_(queue_depth), wake_fd_(wake_fd), ops_(queue_depth) {
    free_ops_.reserve(queue_depth);
    for (Op& op : ops_) free_ops_.push_back(&op);
    fallback_ = MakeThreadIoEngine(1);
    completer_ = std::thread([this] { CompletionLoop(); });
  }

  ~UringIoEngine() override {
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [&] { return queue_.empty() && free_ops_.size() == queue_depth_; });
    }
    const uint64_t one = 1;
    // The eventfd counter cannot overflow on one write, so this write cannot fail short.
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    completer_.join();
    io_uring_queue_exit(&ring_);
    close(wake_fd_);
  }

  void Submit(IoRequest* request) override {
    if (request->file->native_fd() < 0) {
      fallback_->Submit(request);
      return;
    }
    std::lock_guard lock(mu_);
    request->status = Status::Ok();
    request->done.store(false, std::memory_order_relaxed);
    if (!failed_.ok()) {
      FinishLocked(request, failed_);
      return;
    }
    queue_.push_back(request);
    PumpLocked({});
  }

  Status Wait(IoRequest* request) override {
    if (request->file->native_fd() < 0) return fallback_->Wait(request);
    std::unique_lock lock(mu_);
    finished_.wait(lock, [&] { return request->done.load(std::memory_order_relaxed); });
    return request->status;
  }

  std::string name() const override {
    return "io_uring (queue depth " + std::to_string(queue_depth_) + ")";
  }

 private:
  // Fills the ring from the queue, prepares the continuations in `resubmit`, and submits them
  // together with any entries an earlier partial submission left in the ring. REQUIRES: mu_
  // held.
  void PumpLocked(const std::vector<Op*>& resubmit) {
    std::vector<Op*> prepared = resubmit;
    while (!queue_.empty() && !free_ops_.empty()) {
      Op* op = free_ops_.back();
      free_ops_.pop_back();
      *op = Op{queue_.front(), 0};
      queue_.pop_front();
      prepared.push_back(op);
    }
    for (Op* op : prepared) {
      // Never null: at most queue_depth reads are prepared or in flight, the ring has at least
      // that many entries, and every prepared entry is submitted before mu_ is released.
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      IoRequest& r = *op->request;
      const uint64_t n_left = std::min<uint64_t>(r.dst.size() - op->n_done, kMaxReadBytes);
      io_uring_prep_read(sqe, r.file->native_fd(), r.dst.data() + op->n_done,
                         static_cast<unsigned>(n_left), r.offset + op->n_done);
      io_uring_sqe_set_data(sqe, op);
      in_sq_.push_back(op);
    }
    // The kernel may take fewer entries than are ready; the rest stay in the ring and are
    // submitted again here. When it takes none without an error, the next pump (every
    // completion and every Submit pumps) tries again.
    while (io_uring_sq_ready(&ring_) > 0) {
      const int ret = io_uring_submit(&ring_);
      if (ret == -EINTR || ret == -EAGAIN) continue;
      if (ret == 0) return;
      if (ret > 0) {
        in_sq_.erase(in_sq_.begin(), in_sq_.begin() + std::min<size_t>(ret, in_sq_.size()));
        continue;
      }
      // The kernel refused the entries still in the ring. Fail them and everything queued, and
      // submit nothing ever again: the entries stay unconsumed in the ring until it is
      // destroyed, so the kernel never writes into buffers their owners have been told are
      // free. Reads already in flight still complete normally.
      failed_ = Status::IOError("io_uring submission refused: " + ErrnoText(-ret));
      for (Op* op : in_sq_) FinishOpLocked(op, failed_);
      in_sq_.clear();
      for (IoRequest* request : queue_) FinishLocked(request, failed_);
      queue_.clear();
      return;
    }
  }

  // Release order on `done`: a caller that polls it without the mutex also sees the status.
  void FinishLocked(IoRequest* request, Status status) {
    request->status = std::move(status);
    request->done.store(true, std::memory_order_release);
    finished_.notify_all();
  }

  void FinishOpLocked(Op* op, Status status) {
    FinishLocked(op->request, std::move(status));
    op->request = nullptr;
    free_ops_.push_back(op);
    if (queue_.empty() && free_ops_.size() == queue_depth_) idle_.notify_all();
  }

  // Handles one completion; returns the op when its read must be continued. REQUIRES: mu_ held.
  Op* CompleteLocked(Op* op, int res) {
    IoRequest& r = *op->request;
    const uint64_t at = r.offset + op->n_done;
    const uint64_t n_asked = std::min<uint64_t>(r.dst.size() - op->n_done, kMaxReadBytes);
    // A wrapper's verdict (tests inject faults here); never more bytes than the kernel read.
    res = std::min(res, r.file->FilterNativeRead(at, r.dst.subspan(op->n_done, n_asked), res));
    if (res == -EINTR || res == -EAGAIN) return op;
    if (res < 0) {
      FinishOpLocked(
          op, Status::IOError("file " + r.file->path() + ": read of " +
                              std::to_string(r.dst.size() - op->n_done) + " bytes at offset " +
                              std::to_string(at) + ": " + ErrnoText(-res)));
      return nullptr;
    }
    if (res == 0) {
      FinishOpLocked(
          op, Status::Corruption("file " + r.file->path() + ": truncated at byte " +
                                 std::to_string(at) + ", wanted " +
                                 std::to_string(r.dst.size() - op->n_done) +
                                 " more bytes for a read of " + std::to_string(r.dst.size()) +
                                 " bytes at offset " + std::to_string(r.offset)));
      return nullptr;
    }
    op->n_done += static_cast<uint64_t>(res);
    if (op->n_done < r.dst.size()) return op;
    FinishOpLocked(op, Status::Ok());
    return nullptr;
  }

  void CompletionLoop() {
    pollfd fds[2] = {{ring_.ring_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    std::vector<Op*> resubmit;
    for (;;) {
      if (poll(fds, 2, -1) < 0) continue;  // EINTR
      if (fds[1].revents != 0) return;     // only sent once nothing is in flight
      std::lock_guard lock(mu_);
      resubmit.clear();
      unsigned head;
      unsigned n_seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        if (Op* op = CompleteLocked(static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res)) {
          resubmit.push_back(op);
        }
        ++n_seen;
      }
      io_uring_cq_advance(&ring_, n_seen);
      if (!failed_.ok()) {
        for (Op* op : resubmit) FinishOpLocked(op, failed_);
      } else {
        PumpLocked(resubmit);
      }
    }
  }

  io_uring ring_;
  const uint32_t queue_depth_;
  const int wake_fd_;
  std::mutex mu_;
  std::condition_variable finished_;  // some request turned done
  std::condition_variable idle_;      // nothing queued or in flight
  std::deque<IoRequest*> queue_;      // submitted, waiting for a free op
  std::vector<Op> ops_;               // [queue_depth]
  std::vector<Op*> free_ops_;
  std::deque<Op*> in_sq_;  // prepared in the ring, not yet taken by the kernel, oldest first
  Status failed_;  // set once the ring refuses a submission; every later request fails with it
  std::unique_ptr<IoEngine> fallback_;
  std::thread completer_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeUringIoEngine(uint32_t queue_depth) {
  if (queue_depth == 0 || queue_depth > kMaxQueueDepth) {
    return Status::InvalidArgument("io_uring queue depth " + std::to_string(queue_depth) +
                                   ": must be 1.." + std::to_string(kMaxQueueDepth));
  }
  io_uring ring;
  if (int ret = io_uring_queue_init(queue_depth, &ring, 0); ret < 0) {
    return Status::Unsupported("io_uring refused by the kernel: io_uring_queue_init(" +
                               std::to_string(queue_depth) + "): " + ErrnoText(-ret) +
                               DisabledSysctl());
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  const bool has_read = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!has_read) {
    io_uring_queue_exit(&ring);
    return Status::Unsupported("io_uring: the kernel lacks IORING_OP_READ (Linux 5.6 or later)");
  }
  const int wake_fd = eventfd(0, EFD_CLOEXEC);
  if (wake_fd < 0) {
    const int error = errno;
    io_uring_queue_exit(&ring);
    return Status::IOError("io_uring engine: eventfd: " + ErrnoText(error));
  }
  return std::unique_ptr<IoEngine>(std::make_unique<UringIoEngine>(ring, queue_depth, wake_fd));
}

}  // namespace argus
