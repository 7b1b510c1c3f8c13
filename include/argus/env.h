// File operations behind a seam: every byte the disk tier reads or writes goes through an Env,
// so tests replace it with one that injects EIO, short transfers, ENOSPC and torn writes
// (LevelDB's Env). Env::Default() is POSIX.
//
// Thread safety: an Env and the Files it opens may be used from several threads at once
// (ReadAt/WriteAt are positional; no call keeps a file offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "argus/status.h"

namespace argus {

struct FileOpenOptions {
  bool create = false;     // create when missing (never truncates)
  bool read_only = false;  // no writes
  // Open with O_DIRECT: offsets, lengths and buffer addresses of every transfer must then be
  // multiples of the file's direct I/O alignment (Env::DirectIoAlignment). Unsupported when the
  // file system refuses O_DIRECT.
  bool direct = false;
  // A store's own file: a symbolic link is refused (O_NOFOLLOW: a link planted in the store's
  // directory must not redirect its writes), a new file is created 0600, and a file owned by
  // another user is refused (IOError naming it).
  bool private_file = false;
};

class File {
 public:
  virtual ~File() = default;
  // One positional transfer: returns the bytes moved, which may be fewer than asked (a short
  // read at end of file or a short write). IOError (NoSpace for ENOSPC) names the file.
  virtual Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) = 0;
  virtual Result<size_t> WriteAt(uint64_t offset, std::span<const std::byte> src) = 0;
  // fdatasync. A failure is not retried by callers: the file is considered failed.
  virtual Status Sync() = 0;
  virtual Result<uint64_t> Size() = 0;
  virtual Status Truncate(uint64_t n_bytes) = 0;
  // The kernel descriptor, for io_uring; -1 when the file is not a plain descriptor (a test
  // wrapper), in which case reads go through ReadAt.
  virtual int native_fd() const { return -1; }
  // The io_uring engine reads native_fd() in the kernel, past ReadAt; it hands each completion
  // of a read into dst at offset (res: the bytes the kernel read into dst, or -errno) to this
  // before acting on it, and acts on what it returns (at most res when res > 0). A plain file
  // returns res; a fault-injecting wrapper may return an error or fewer bytes, or alter dst.
  virtual int FilterNativeRead(uint64_t offset, std::span<std::byte> dst, int res) {
    (void)offset, (void)dst;
    return res;
  }
  virtual const std::string& path() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();  // POSIX; never null; lives forever

  virtual Result<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOpenOptions& options) = 0;
  virtual Status CreateDir(const std::string& path) = 0;  // Ok when it exists
  virtual Status SyncDir(const std::string& path) = 0;    // makes renames and creations durable
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;  // NotFound when missing
  virtual Result<bool> Exists(const std::string& path) = 0;
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;  // names only
  // The alignment O_DIRECT transfers need on the file system holding `path` (the device's
  // logical block size: statx DIOALIGN, else the block device's queue/logical_block_size, else
  // 4096).
  virtual Result<uint32_t> DirectIoAlignment(const std::string& path) = 0;
  // Opens (creating when missing, as a private_file) `path` and takes an exclusive advisory lock
  // on it, held until the returned File is destroyed. POSIX: flock(LOCK_EX | LOCK_NB), per open
  // file description, so a second LockFile of the same path conflicts even within one process.
  // A lock held elsewhere is IOError "PATH is locked by another process"; nothing waits.
  virtual Result<std::unique_ptr<File>> LockFile(const std::string& path) = 0;
};

// Loops over short transfers. ReadExact: end of file before dst is full is Corruption ("file F:
// truncated at byte N, wanted M more bytes for `what`"). WriteExact: a write that makes no
// progress is IOError.
Status ReadExact(File& file, uint64_t offset, std::span<std::byte> dst, std::string_view what);
Status WriteExact(File& file, uint64_t offset, std::span<const std::byte> src,
                  std::string_view what);

}  // namespace argus
