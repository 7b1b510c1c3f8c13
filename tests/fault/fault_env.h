// Test utilities for the disk tier: a temporary directory, and FaultEnv, an Env that wraps
// another and injects faults at chosen calls.
//
// FaultEnv counts the calls of each kind (open, read, write, sync, ...) made through it and the
// files it opened, and can be armed to fail the Nth call of a kind with an errno (EIO, ENOSPC),
// to make the Nth read or write short, or to tear the Nth write: store only its first bytes and
// fail every later call, as if the process had died there (a simulated crash). Its files report
// native_fd() == -1, so the I/O engines read them through ReadAt and faults reach reads too.
// Thread-safe. Files must not outlive their FaultEnv.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "argus/env.h"
#include "test_util.h"

namespace argus::testing {

enum class FaultOp : int {
  kOpen,
  kRead,
  kWrite,
  kSync,
  kSize,
  kTruncate,
  kCreateDir,
  kSyncDir,
  kRename,
  kRemove,
  kExists,
  kListDir,
  kAlignment,
};
inline constexpr int kNumFaultOps = 13;

inline const char* FaultOpName(FaultOp op) {
  static const char* const kNames[kNumFaultOps] = {
      "open",   "pread",  "pwrite", "fdatasync", "fstat", "ftruncate", "mkdir", "fsync directory",
      "rename", "unlink", "stat",   "opendir",   "statx"};
  return kNames[static_cast<int>(op)];
}

class FaultEnv final : public Env {
 public:
  explicit FaultEnv(Env* base = Env::Default()) : base_(base) {}

  // Counts start again from zero; an armed fault is dropped; the crash is over.
  void Reset() {
    std::lock_guard lock(mu_);
    for (uint64_t& n : counts_) n = 0;
    armed_ = false;
    fired_ = false;
    crashed_ = false;
  }
  uint64_t count(FaultOp op) const {
    std::lock_guard lock(mu_);
    return counts_[static_cast<int>(op)];
  }
  bool fired() const {
    std::lock_guard lock(mu_);
    return fired_;
  }
  bool crashed() const {
    std::lock_guard lock(mu_);
    return crashed_;
  }

  // The nth call (1-based, counted since Reset) of `op` does nothing and fails with `err`.
  void FailNth(FaultOp op, uint64_t nth, int err = EIO) { Arm(op, nth, Mode::kError, err, 0); }
  // The nth read or write moves only its first keep_bytes bytes, and says so.
  void ShortNth(FaultOp op, uint64_t nth, size_t keep_bytes) {
    Arm(op, nth, Mode::kShort, 0, keep_bytes);
  }
  // The nth write stores only its first keep_bytes bytes and fails; so does every later call.
  void TearNth(uint64_t nth, size_t keep_bytes) {
    Arm(FaultOp::kWrite, nth, Mode::kTorn, EIO, keep_bytes);
  }

  // Opens with O_DIRECT fail with Unsupported, as on a file system without it (tmpfs of old).
  void RefuseDirect(bool refuse) {
    std::lock_guard lock(mu_);
    refuse_direct_ = refuse;
  }

  Result<std::unique_ptr<File>> Open(const std::string& path,
                                     const FileOpenOptions& options) override {
    Decision d = Enter(FaultOp::kOpen, path);
    if (!d.status.ok()) return d.status;
    if (options.direct && refuse_direct()) {
      return Status::Unsupported("open " + path + " with O_DIRECT: refused (injected)");
    }
    ARGUS_ASSIGN_OR_RETURN(auto file, base_->Open(path, options));
    return std::unique_ptr<File>(std::make_unique<FaultFile>(this, std::move(file)));
  }
  Status CreateDir(const std::string& path) override {
    return Call(FaultOp::kCreateDir, path, [&] { return base_->CreateDir(path); });
  }
  Status SyncDir(const std::string& path) override {
    return Call(FaultOp::kSyncDir, path, [&] { return base_->SyncDir(path); });
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return Call(FaultOp::kRename, from, [&] { return base_->Rename(from, to); });
  }
  Status Remove(const std::string& path) override {
    return Call(FaultOp::kRemove, path, [&] { return base_->Remove(path); });
  }
  Result<bool> Exists(const std::string& path) override {
    Decision d = Enter(FaultOp::kExists, path);
    if (!d.status.ok()) return d.status;
    return base_->Exists(path);
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    Decision d = Enter(FaultOp::kListDir, path);
    if (!d.status.ok()) return d.status;
    return base_->ListDir(path);
  }
  Result<uint32_t> DirectIoAlignment(const std::string& path) override {
    Decision d = Enter(FaultOp::kAlignment, path);
    if (!d.status.ok()) return d.status;
    return base_->DirectIoAlignment(path);
  }
  // Not counted and never failed: the lock is no I/O the store's recovery rules depend on.
  Result<std::unique_ptr<File>> LockFile(const std::string& path) override {
    return base_->LockFile(path);
  }

 private:
  enum class Mode { kError, kShort, kTorn };
  struct Decision {
    Status status;
    size_t keep_bytes = SIZE_MAX;  // a short or torn transfer moves only these
    bool tear = false;
  };

  class FaultFile final : public File {
   public:
    FaultFile(FaultEnv* env, std::unique_ptr<File> base) : env_(env), base_(std::move(base)) {}
    Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) override {
      Decision d = env_->Enter(FaultOp::kRead, path(), offset);
      if (!d.status.ok()) return d.status;
      return base_->ReadAt(offset, dst.first(std::min(dst.size(), d.keep_bytes)));
    }
    Result<size_t> WriteAt(uint64_t offset, std::span<const std::byte> src) override {
      Decision d = env_->Enter(FaultOp::kWrite, path(), offset);
      if (!d.status.ok()) return d.status;
      src = src.first(std::min(src.size(), d.keep_bytes));
      if (!d.tear) return base_->WriteAt(offset, src);
      if (!src.empty()) (void)base_->WriteAt(offset, src);
      return Status::IOError("pwrite " + path() + " at " + std::to_string(offset) +
                             ": simulated crash after " + std::to_string(src.size()) +
                             " bytes (injected)");
    }
    Status Sync() override {
      return env_->Call(FaultOp::kSync, path(), [&] { return base_->Sync(); });
    }
    Result<uint64_t> Size() override {
      Decision d = env_->Enter(FaultOp::kSize, path());
      if (!d.status.ok()) return d.status;
      return base_->Size();
    }
    Status Truncate(uint64_t n_bytes) override {
      return env_->Call(FaultOp::kTruncate, path(), [&] { return base_->Truncate(n_bytes); });
    }
    const std::string& path() const override { return base_->path(); }

   private:
    FaultEnv* env_;
    std::unique_ptr<File> base_;
  };

  void Arm(FaultOp op, uint64_t nth, Mode mode, int err, size_t keep_bytes) {
    std::lock_guard lock(mu_);
    armed_ = true;
    fired_ = false;
    op_ = op;
    nth_ = nth;
    mode_ = mode;
    errno_ = err;
    keep_bytes_ = keep_bytes;
  }

  // Counts the call and decides its fate.
  Decision Enter(FaultOp op, const std::string& path, int64_t offset = -1) {
    std::lock_guard lock(mu_);
    const std::string where = std::string(FaultOpName(op)) + " " + path +
                              (offset >= 0 ? " at " + std::to_string(offset) : std::string());
    if (crashed_) return {Status::IOError(where + ": after a simulated crash (injected)")};
    const uint64_t n = ++counts_[static_cast<int>(op)];
    if (!armed_ || op != op_ || n != nth_) return {};
    armed_ = false;
    fired_ = true;
    switch (mode_) {
      case Mode::kError: {
        std::string m = where + ": " + std::strerror(errno_) + " (injected)";
        return {errno_ == ENOSPC ? Status::NoSpace(std::move(m)) : Status::IOError(std::move(m))};
      }
      case Mode::kShort:
        return {Status::Ok(), keep_bytes_};
      case Mode::kTorn:
        crashed_ = true;
        return {Status::Ok(), keep_bytes_, true};
    }
    return {};
  }

  bool refuse_direct() const {
    std::lock_guard lock(mu_);
    return refuse_direct_;
  }

  template <typename F>
  Status Call(FaultOp op, const std::string& path, F&& fn) {
    Decision d = Enter(op, path);
    if (!d.status.ok()) return d.status;
    return fn();
  }

  Env* base_;
  mutable std::mutex mu_;
  uint64_t counts_[kNumFaultOps] = {};
  bool armed_ = false, fired_ = false, crashed_ = false, refuse_direct_ = false;
  FaultOp op_ = FaultOp::kOpen;
  uint64_t nth_ = 0;
  Mode mode_ = Mode::kError;
  int errno_ = EIO;
  size_t keep_bytes_ = 0;
};

}  // namespace argus::testing
