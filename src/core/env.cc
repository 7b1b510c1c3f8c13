// The POSIX Env: positional reads and writes on file descriptors, fdatasync, directory fsync.
#include "argus/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace argus {
namespace {

// "pwrite /x/y at 4096: Input/output error". ENOSPC and EDQUOT are NoSpace (retryable),
// ENOENT is NotFound, everything else IOError.
Status ErrnoStatus(int err, std::string_view op, const std::string& path, int64_t offset = -1) {
  std::string m = std::string(op) + " " + path;
  if (offset >= 0) m += " at " + std::to_string(offset);
  m += ": ";
  m += std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status::NoSpace(std::move(m));
  if (err == ENOENT) return Status::NotFound(std::move(m));
  return Status::IOError(std::move(m));
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override { ::close(fd_); }
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    for (;;) {
      const ssize_t n = ::pread(fd_, dst.data(), dst.size(), static_cast<off_t>(offset));
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return ErrnoStatus(errno, "pread", path_, static_cast<int64_t>(offset));
    }
  }

  Result<size_t> WriteAt(uint64_t offset, std::span<const std::byte> src) override {
    for (;;) {
      const ssize_t n = ::pwrite(fd_, src.data(), src.size(), static_cast<off_t>(offset));
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return ErrnoStatus(errno, "pwrite", path_, static_cast<int64_t>(offset));
    }
  }

  Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoStatus(errno, "fdatasync", path_);
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, "fstat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

  Status Truncate(uint64_t n_bytes) override {
    if (::ftruncate(fd_, static_cast<off_t>(n_bytes)) != 0) {
      return ErrnoStatus(errno, "ftruncate", path_, static_cast<int64_t>(n_bytes));
    }
    return Status::Ok();
  }

  int native_fd() const override { return fd_; }
  const std::string& path() const override { return path_; }

 private:
  int fd_;
  std::string path_;
};

// The logical block size of the block device holding st_dev, from sysfs; 0 when unknown. A
// partition's directory has no queue/, its parent disk's has.
uint32_t SysfsLogicalBlockSize(dev_t dev) {
  const std::string base =
      "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::ifstream in(base + rel);
    uint32_t n = 0;
    if (in >> n && n > 0) return n;
  }
  return 0;
}

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path,
                                     const FileOpenOptions& options) override {
    int flags = (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
    if (options.create) flags |= O_CREAT;
    if (options.direct) flags |= O_DIRECT;
    if (options.private_file) flags |= O_NOFOLLOW;
    int fd;
    do {
      fd = ::open(path.c_str(), flags, options.private_file ? 0600 : 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      if (options.direct && errno == EINVAL) {
        return Status::Unsupported("open " + path + " with O_DIRECT: the file system refuses it");
      }
      if (options.private_file && errno == ELOOP) {
        return Status::IOError("open " + path + ": a symbolic link, refused in a store");
      }
      return ErrnoStatus(errno, "open", path);
    }
    auto file = std::make_unique<PosixFile>(fd, path);  // closes fd on every return below
    if (options.private_file) {
      struct stat st;
      if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat", path);
      if (!S_ISREG(st.st_mode)) return Status::IOError(path + ": not a regular file");
      if (st.st_uid != ::geteuid()) {
        return Status::IOError(path + ": owned by user " + std::to_string(st.st_uid) +
                               ", not by this process's user " + std::to_string(::geteuid()) +
                               "; refused in a store");
      }
    }
    return std::unique_ptr<File>(std::move(file));
  }

  Result<std::unique_ptr<File>> LockFile(const std::string& path) override {
    ARGUS_ASSIGN_OR_RETURN(auto file, Open(path, {.create = true, .private_file = true}));
    int locked;
    do {
      locked = ::flock(file->native_fd(), LOCK_EX | LOCK_NB);
    } while (locked != 0 && errno == EINTR);
    if (locked != 0) {
      if (errno == EWOULDBLOCK) return Status::IOError(path + " is locked by another process");
      return ErrnoStatus(errno, "flock", path);
    }
    return file;
  }

  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) == 0) return Status::Ok();
    const int err = errno;
    struct stat st;
    if (err == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return Status::Ok();
    }
    return ErrnoStatus(err, "mkdir", path);
  }

  Status SyncDir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open directory", path);
    const int synced = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (synced != 0) return ErrnoStatus(err, "fsync directory", path);
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, "rename to " + to + " from", from);
    }
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "unlink", path);
    return Status::Ok();
  }

  Result<bool> Exists(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return ErrnoStatus(errno, "stat", path);
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoStatus(errno, "opendir", path);
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const dirent* entry = ::readdir(dir);
      if (entry == nullptr) break;
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return ErrnoStatus(err, "readdir", path);
    return names;
  }

  Result<uint32_t> DirectIoAlignment(const std::string& path) override {
#ifdef STATX_DIOALIGN
    // Regular files report their own alignment (file systems may need more than the device).
    struct statx stx;
    if (::statx(AT_FDCWD, path.c_str(), 0, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align > 0) {
      return std::max(stx.stx_dio_offset_align, stx.stx_dio_mem_align);
    }
#endif
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
    const uint32_t n = SysfsLogicalBlockSize(st.st_dev);
    return n > 0 ? n : uint32_t{4096};
  }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv;  // never destroyed: files may outlive static destruction
  return env;
}

Status ReadExact(File& file, uint64_t offset, std::span<std::byte> dst, std::string_view what) {
  size_t done = 0;
  while (done < dst.size()) {
    ARGUS_ASSIGN_OR_RETURN(const size_t n, file.ReadAt(offset + done, dst.subspan(done)));
    if (n == 0) {
      return Status::Corruption(
          "file " + file.path() + ": truncated at byte " + std::to_string(offset + done) +
          ", wanted " + std::to_string(dst.size() - done) + " more bytes for " + std::string(what));
    }
    done += n;
  }
  return Status::Ok();
}

Status WriteExact(File& file, uint64_t offset, std::span<const std::byte> src,
                  std::string_view what) {
  size_t done = 0;
  while (done < src.size()) {
    ARGUS_ASSIGN_OR_RETURN(const size_t n, file.WriteAt(offset + done, src.subspan(done)));
    if (n == 0) {
      return Status::IOError("pwrite " + file.path() + " at " + std::to_string(offset + done) +
                             ": no progress writing " + std::string(what));
    }
    done += n;
  }
  return Status::Ok();
}

}  // namespace argus
