// Asynchronous positional reads for the disk tier: io_uring where the kernel allows it, a pool
// of pread threads otherwise. The engine only moves bytes; the caller verifies them.
//
// Thread safety: Submit and Wait may be called from any thread; a request is owned by its
// submitter and must stay alive (and unmoved) until Wait returns for it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "argus/env.h"
#include "argus/status.h"

namespace argus {

// One read of dst.size() bytes at offset. With an O_DIRECT file, offset, dst.data() and
// dst.size() must be multiples of the file's alignment. Short reads are continued by the
// engine; end of file before dst is full is Corruption naming the file and offset.
struct IoRequest {
  File* file = nullptr;
  uint64_t offset = 0;
  std::span<std::byte> dst;
  // Set by the engine before `done` turns true.
  Status status;
  std::atomic<bool> done{false};
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;  // waits for every request in flight
  // Queues a read. Never blocks on the device; at most queue_depth reads are in flight at
  // once (more wait in the engine's queue).
  virtual void Submit(IoRequest* request) = 0;
  // Blocks until the request is done; returns its status.
  virtual Status Wait(IoRequest* request) = 0;
  virtual std::string name() const = 0;  // "io_uring (queue depth 32)", "pread pool of 4 threads"
};

// Unsupported (naming the reason: io_uring_queue_init's errno, io_uring_disabled) when the
// kernel refuses a ring. Files without a native_fd are read with ReadAt on the engine's thread.
Result<std::unique_ptr<IoEngine>> MakeUringIoEngine(uint32_t queue_depth);
std::unique_ptr<IoEngine> MakeThreadIoEngine(uint32_t n_threads);

}  // namespace argus
