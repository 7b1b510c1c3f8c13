// Test utilities for the disk tier: a temporary directory, and FaultEnv, an Env that wraps
// another and injects faults at chosen calls.
//
// FaultEnv counts the calls of each kind (open, read, write, sync, ...) made through it and the
// files it opened, and can be armed to fail the Nth call of a kind with an errno (EIO, ENOSPC),
// to make the Nth read or write short, or to tear the Nth write: store only its first bytes and
// fail every later call, as if the process had died there (a simulated crash). Its files report
// native_fd() == -1 (unless UseNativeDescriptors), so the I/O engines read them through ReadAt
// and faults reach reads too.
//
// Power loss (CutPowerAtSync): a crash loses more than the process. Writes and truncations not
// yet followed by their file's sync sit in a page cache that a power cut may drop, partly
// write, or write out of order; FaultEnv logs them per file and at the cut rebuilds each file
// from its state at its last sync, each logged change kept, lost or (writes) torn at a sector
// boundary, as a seed decides. Directory operations count as durable when they return (not
// modelled).
//
// A failing disk (FailFrom): every call of a kind from the Nth on fails, as a dying device does;
// nothing else changes. The io_uring path (UseNativeDescriptors): the files then expose their
// kernel descriptors, so the io_uring engine reads them in the kernel, and each of its
// completions is a counted read whose fault (error, short, flipped bit) FilterNativeRead applies.
// Thread-safe. Files must not outlive their FaultEnv.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
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
    sticky_ = false;
    fired_ = false;
    crashed_ = false;
    power_model_ = false;
    unsynced_.clear();
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
  // The nth call of `op` and every later one fail with `err`: a disk that keeps failing.
  void FailFrom(FaultOp op, uint64_t nth, int err = EIO) {
    Arm(op, nth, Mode::kError, err, 0);
    std::lock_guard lock(mu_);
    sticky_ = true;
  }
  // The nth read returns its bytes with one bit of the first byte flipped, and no error (a
  // device that returns wrong data).
  void FlipNth(uint64_t nth) { Arm(FaultOp::kRead, nth, Mode::kFlip, 0, 0); }
  // Files expose their kernel descriptors (native_fd), so the io_uring engine reads them itself.
  void UseNativeDescriptors(bool use) {
    std::lock_guard lock(mu_);
    native_fds_ = use;
  }
  uint64_t n_fired() const {
    std::lock_guard lock(mu_);
    return n_fired_;
  }

  // The nth write stores only its first keep_bytes bytes and fails; so does every later call.
  void TearNth(uint64_t nth, size_t keep_bytes) {
    Arm(FaultOp::kWrite, nth, Mode::kTorn, EIO, keep_bytes);
  }

  // From now on, unsynced writes are logged; the nth sync (1-based, counted since Reset) of any
  // file cuts the power instead of syncing: every file loses, keeps or tears its unsynced
  // changes as `seed` decides, and every later call fails as after a crash. O_DIRECT is refused
  // (the store falls back to buffered I/O): the log reads a file's bytes before changing them.
  void CutPowerAtSync(uint64_t nth, uint64_t seed) {
    Arm(FaultOp::kSync, nth, Mode::kPowerCut, EIO, 0);
    std::lock_guard lock(mu_);
    power_model_ = true;
    power_seed_ = seed;
    refuse_direct_ = true;
  }

  // Unsynced changes the last power cut lost or tore (so a test can tell it cut something).
  uint64_t n_changes_lost() const {
    std::lock_guard lock(mu_);
    return n_changes_lost_;
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
    return Call(FaultOp::kRename, from, [&] {
      ARGUS_RETURN_IF_ERROR(base_->Rename(from, to));
      std::lock_guard lock(mu_);  // the log follows the file, and `to`'s old file is gone
      unsynced_.erase(to);
      if (auto it = unsynced_.find(from); it != unsynced_.end()) {
        unsynced_[to] = std::move(it->second);
        unsynced_.erase(from);
      }
      return Status::Ok();
    });
  }
  Status Remove(const std::string& path) override {
    return Call(FaultOp::kRemove, path, [&] {
      ARGUS_RETURN_IF_ERROR(base_->Remove(path));
      std::lock_guard lock(mu_);
      unsynced_.erase(path);
      return Status::Ok();
    });
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
  enum class Mode { kError, kShort, kTorn, kPowerCut, kFlip };
  struct Decision {
    Status status;
    size_t keep_bytes = SIZE_MAX;  // a short or torn transfer moves only these
    bool tear = false;
    bool flip = false;  // a read's first byte comes back with a bit flipped
    int err = 0;        // with a failed status: the errno it stands for
  };

  // A file's changes since its last sync, over its bytes at that sync.
  struct Unsynced {
    std::vector<std::byte> synced;
    struct Change {
      uint64_t offset = 0;          // a write at offset, or a truncation to offset bytes
      std::vector<std::byte> data;  // empty: the truncation
      bool truncate = false;
    };
    std::vector<Change> changes;
  };

  class FaultFile final : public File {
   public:
    FaultFile(FaultEnv* env, std::unique_ptr<File> base) : env_(env), base_(std::move(base)) {}
    Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) override {
      Decision d = env_->Enter(FaultOp::kRead, path(), offset);
      if (!d.status.ok()) return d.status;
      auto n = base_->ReadAt(offset, dst.first(std::min(dst.size(), d.keep_bytes)));
      if (n.ok() && *n > 0 && d.flip) dst[0] ^= std::byte{1};
      return n;
    }
    int native_fd() const override { return env_->native_fds() ? base_->native_fd() : -1; }
    int FilterNativeRead(uint64_t offset, std::span<std::byte> dst, int res) override {
      Decision d = env_->Enter(FaultOp::kRead, path(), static_cast<int64_t>(offset));
      if (!d.status.ok()) return -d.err;
      if (res <= 0) return res;
      if (d.flip) dst[0] ^= std::byte{1};
      return static_cast<int>(std::min(static_cast<size_t>(res), d.keep_bytes));
    }
    Result<size_t> WriteAt(uint64_t offset, std::span<const std::byte> src) override {
      Decision d = env_->Enter(FaultOp::kWrite, path(), offset);
      if (!d.status.ok()) return d.status;
      src = src.first(std::min(src.size(), d.keep_bytes));
      env_->LogChange(*base_, {offset, {src.begin(), src.end()}, false});
      if (!d.tear) return base_->WriteAt(offset, src);
      if (!src.empty()) (void)base_->WriteAt(offset, src);
      return Status::IOError("pwrite " + path() + " at " + std::to_string(offset) +
                             ": simulated crash after " + std::to_string(src.size()) +
                             " bytes (injected)");
    }
    Status Sync() override {
      Decision d = env_->Enter(FaultOp::kSync, path());
      if (!d.status.ok()) return d.status;
      ARGUS_RETURN_IF_ERROR(base_->Sync());
      env_->Synced(path());
      return Status::Ok();
    }
    Result<uint64_t> Size() override {
      Decision d = env_->Enter(FaultOp::kSize, path());
      if (!d.status.ok()) return d.status;
      return base_->Size();
    }
    Status Truncate(uint64_t n_bytes) override {
      return env_->Call(FaultOp::kTruncate, path(), [&] {
        env_->LogChange(*base_, {n_bytes, {}, true});
        return base_->Truncate(n_bytes);
      });
    }
    const std::string& path() const override { return base_->path(); }

   private:
    FaultEnv* env_;
    std::unique_ptr<File> base_;
  };

  void Arm(FaultOp op, uint64_t nth, Mode mode, int err, size_t keep_bytes) {
    std::lock_guard lock(mu_);
    armed_ = true;
    sticky_ = false;
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
    if (crashed_) {
      return {Status::IOError(where + ": after a simulated crash (injected)"), SIZE_MAX, false,
              false, EIO};
    }
    const uint64_t n = ++counts_[static_cast<int>(op)];
    if (!armed_ || op != op_ || (sticky_ ? n < nth_ : n != nth_)) return {};
    armed_ = sticky_;
    fired_ = true;
    ++n_fired_;
    switch (mode_) {
      case Mode::kError: {
        std::string m = where + ": " + std::strerror(errno_) + " (injected)";
        return {errno_ == ENOSPC ? Status::NoSpace(std::move(m)) : Status::IOError(std::move(m)),
                SIZE_MAX, false, false, errno_};
      }
      case Mode::kFlip:
        return {Status::Ok(), SIZE_MAX, false, true};
      case Mode::kShort:
        return {Status::Ok(), keep_bytes_};
      case Mode::kTorn:
        crashed_ = true;
        return {Status::Ok(), keep_bytes_, true};
      case Mode::kPowerCut:
        CutPowerLocked();
        return {Status::IOError(where + ": power cut (injected)"), SIZE_MAX, false, false, EIO};
    }
    return {};
  }

  // REQUIRES: mu_ not held. Logs a change before it reaches `file`, first saving the file's
  // bytes as of its last sync (read now: nothing changed them since).
  void LogChange(File& file, Unsynced::Change change) {
    std::lock_guard lock(mu_);
    if (!power_model_ || crashed_) return;
    auto [it, added] = unsynced_.try_emplace(file.path());
    if (added) {
      auto file_size = file.Size();
      const uint64_t size = file_size.ok() ? *file_size : 0;
      it->second.synced.resize(size);
      size_t done = 0;
      while (done < size) {
        auto n = file.ReadAt(done, std::span(it->second.synced).subspan(done));
        if (!n.ok() || *n == 0) break;
        done += *n;
      }
    }
    it->second.changes.push_back(std::move(change));
  }

  void Synced(const std::string& path) {
    std::lock_guard lock(mu_);
    unsynced_.erase(path);
  }

  // Rebuilds every file with unsynced changes as the power cut leaves it.
  void CutPowerLocked() {
    crashed_ = true;
    std::mt19937_64 rng(power_seed_);
    for (auto& [path, log] : unsynced_) {
      std::vector<std::byte> bytes = log.synced;
      for (const Unsynced::Change& c : log.changes) {
        const uint64_t fate = rng() % 3;  // 0 kept, 1 lost, 2 torn (a write's leading sectors)
        if (fate != 0) ++n_changes_lost_;
        if (fate == 1) continue;
        if (c.truncate) {
          bytes.resize(c.offset);
          continue;
        }
        size_t n = c.data.size();
        if (fate == 2) n = std::min(n, 512 * (rng() % (n / 512 + 1)));
        if (c.offset + n > bytes.size()) bytes.resize(c.offset + n);
        std::copy_n(c.data.begin(), n, bytes.begin() + static_cast<ptrdiff_t>(c.offset));
      }
      auto file = base_->Open(path, {});
      if (!file.ok()) continue;  // removed since (a compaction's tmp): nothing to rebuild
      (void)(*file)->Truncate(0);
      (void)(*file)->WriteAt(0, bytes);
      (void)(*file)->Sync();
    }
    unsynced_.clear();
  }

  bool refuse_direct() const {
    std::lock_guard lock(mu_);
    return refuse_direct_;
  }
  bool native_fds() const {
    std::lock_guard lock(mu_);
    return native_fds_;
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
  bool armed_ = false, sticky_ = false, fired_ = false, crashed_ = false, refuse_direct_ = false;
  bool native_fds_ = false;
  uint64_t n_fired_ = 0;
  bool power_model_ = false;
  uint64_t power_seed_ = 0, n_changes_lost_ = 0;
  std::map<std::string, Unsynced> unsynced_;
  FaultOp op_ = FaultOp::kOpen;
  uint64_t nth_ = 0;
  Mode mode_ = Mode::kError;
  int errno_ = EIO;
  size_t keep_bytes_ = 0;
};

}  // namespace argus::testing
