// The asynchronous read engines (io_uring and the pread pool) against files whose bytes follow a
// formula: every read is compared with the formula, not with another read path.
#include "store/io_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "argus/env.h"
#include "crash/versioned_page.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::TempDir;
using testing::TestSeed;

// Byte i of every test file.
std::byte PatternByte(uint64_t i) {
  return static_cast<std::byte>(((i * 2654435761u) >> 11) ^ (i >> 12));
}

void WritePatternFile(const std::string& path, uint64_t n_bytes) {
  std::vector<char> bytes(n_bytes);
  for (uint64_t i = 0; i < n_bytes; ++i) bytes[i] = static_cast<char>(PatternByte(i));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Index of the first byte of dst that differs from the file's bytes at offset, or -1.
int64_t FirstMismatch(std::span<const std::byte> dst, uint64_t offset) {
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i] != PatternByte(offset + i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// Aligned for O_DIRECT on any device (logical blocks are at most 4 KiB).
struct DirectBuffer {
  explicit DirectBuffer(size_t n_bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(kAlign, std::max(n_bytes, kAlign)))),
        size(n_bytes) {
    std::memset(data.get(), 0xEE, size);  // bytes no read wrote differ from the pattern
  }
  std::span<std::byte> span() { return {data.get(), size}; }
  static constexpr size_t kAlign = 4096;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;
  size_t size;
};

// A file that hides its descriptor, as the fault-injecting test files do: engines must read it
// through ReadAt. It hands out at most `max_read` bytes per call, so the engine must continue.
class WrapperFile final : public File {
 public:
  WrapperFile(std::unique_ptr<File> base, size_t max_read)
      : base_(std::move(base)), max_read_(max_read) {}
  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    n_reads.fetch_add(1);
    return base_->ReadAt(offset, dst.first(std::min(dst.size(), max_read_)));
  }
  Result<size_t> WriteAt(uint64_t offset, std::span<const std::byte> src) override {
    return base_->WriteAt(offset, src);
  }
  Status Sync() override { return base_->Sync(); }
  Result<uint64_t> Size() override { return base_->Size(); }
  Status Truncate(uint64_t n_bytes) override { return base_->Truncate(n_bytes); }
  const std::string& path() const override { return base_->path(); }
  std::atomic<int> n_reads{0};

 private:
  std::unique_ptr<File> base_;
  size_t max_read_;
};

// A file whose descriptor is a directory: every read fails in the kernel with EISDIR.
class DirectoryFile final : public File {
 public:
  explicit DirectoryFile(std::string path)
      : path_(std::move(path)), fd_(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {}
  ~DirectoryFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) override {
    ssize_t n = ::pread(fd_, dst.data(), dst.size(), static_cast<off_t>(offset));
    if (n < 0) return Status::IOError("file " + path_ + ": " + std::strerror(errno));
    return static_cast<size_t>(n);
  }
  Result<size_t> WriteAt(uint64_t, std::span<const std::byte>) override {
    return Status::IOError("file " + path_ + ": read only");
  }
  Status Sync() override { return Status::Ok(); }
  Result<uint64_t> Size() override { return uint64_t{0}; }
  Status Truncate(uint64_t) override { return Status::IOError("file " + path_ + ": read only"); }
  int native_fd() const override { return fd_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

enum class EngineKind { kUring, kThreads };
constexpr uint64_t kBlock = 4096;
constexpr uint64_t kFileBytes = 64 * kBlock;

// Parameters: the engine, and whether the file is opened with O_DIRECT.
class IoEngineTest : public ::testing::TestWithParam<std::tuple<EngineKind, bool>> {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/pattern.bin";
    WritePatternFile(path_, kFileBytes);
  }

  // A small depth, so that the tests' bursts also exercise the engine's own queue.
  std::unique_ptr<IoEngine> MakeEngine(uint32_t depth = 4) {
    if (std::get<0>(GetParam()) == EngineKind::kThreads) return MakeThreadIoEngine(depth);
    auto engine = MakeUringIoEngine(depth);
    if (!engine.ok()) {
      EXPECT_EQ(engine.status().code(), StatusCode::kUnsupported) << engine.status().ToString();
      skip_reason_ = engine.status().ToString();
      return nullptr;
    }
    return std::move(engine).value();
  }

  std::unique_ptr<File> OpenPattern() {
    FileOpenOptions options;
    options.read_only = true;
    options.direct = std::get<1>(GetParam());
    auto file = Env::Default()->Open(path_, options);
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return file.ok() ? std::move(file).value() : nullptr;
  }

  TempDir dir_;
  std::string path_;
  std::string skip_reason_;
};

#define MAKE_ENGINE_OR_SKIP(engine, ...)               \
  auto engine = MakeEngine(__VA_ARGS__);               \
  if (engine == nullptr) GTEST_SKIP() << skip_reason_; \
  auto file = OpenPattern();                           \
  ASSERT_NE(file, nullptr)

TEST_P(IoEngineTest, ConcurrentReadsFromSeveralThreadsReturnTheFileBytes) {
  MAKE_ENGINE_OR_SKIP(engine);
  constexpr int kThreads = 4, kReadsPerThread = 48;
  std::vector<std::thread> threads;
  std::atomic<int> n_bad{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(t));
      std::vector<DirectBuffer> buffers;
      std::vector<IoRequest> requests(kReadsPerThread);
      for (IoRequest& r : requests) {
        const uint64_t n_blocks = 1 + rng() % 8;
        buffers.emplace_back(n_blocks * kBlock);
        r.file = file.get();
        r.offset = (rng() % (kFileBytes / kBlock - n_blocks + 1)) * kBlock;
        r.dst = buffers.back().span();
        engine->Submit(&r);
      }
      // Waited in reverse, so most waits find their read done or behind others.
      for (int i = kReadsPerThread - 1; i >= 0; --i) {
        IoRequest& r = requests[static_cast<size_t>(i)];
        Status status = engine->Wait(&r);
        int64_t bad = FirstMismatch(r.dst, r.offset);
        if (!status.ok() || bad >= 0 || !r.done.load()) {
          ADD_FAILURE() << "read of " << r.dst.size() << " bytes at " << r.offset << ": "
                        << status.ToString() << ", first wrong byte " << bad;
          n_bad.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(n_bad.load(), 0);
}

TEST_P(IoEngineTest, ReadPastEndOfFileIsCorruptionNamingFileAndOffset) {
  MAKE_ENGINE_OR_SKIP(engine);
  DirectBuffer straddling(2 * kBlock), beyond(kBlock);
  IoRequest a, b;
  a.file = b.file = file.get();
  a.offset = kFileBytes - kBlock;  // the last block is there, the next is not
  a.dst = straddling.span();
  b.offset = kFileBytes;
  b.dst = beyond.span();
  engine->Submit(&a);
  engine->Submit(&b);
  for (IoRequest* r : {&a, &b}) {
    Status status = engine->Wait(r);
    EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
    EXPECT_NE(status.message().find(path_), std::string::npos) << status.ToString();
    EXPECT_NE(status.message().find(std::to_string(r->offset)), std::string::npos)
        << status.ToString();
  }
  // The part that exists arrived intact.
  EXPECT_EQ(FirstMismatch(a.dst.first(kBlock), a.offset), -1);
}

TEST_P(IoEngineTest, FileWithoutDescriptorIsReadThroughReadAtWithShortReads) {
  auto engine = MakeEngine();
  if (engine == nullptr) GTEST_SKIP() << skip_reason_;
  auto base = OpenPattern();
  ASSERT_NE(base, nullptr);
  WrapperFile file(std::move(base), kBlock);  // 4 KiB per ReadAt: each read below needs 3
  std::vector<DirectBuffer> buffers;
  std::vector<IoRequest> requests(6);
  for (size_t i = 0; i < requests.size(); ++i) {
    buffers.emplace_back(3 * kBlock);
    requests[i].file = &file;
    requests[i].offset = (5 + 7 * i) * kBlock;
    requests[i].dst = buffers.back().span();
    engine->Submit(&requests[i]);
  }
  for (IoRequest& r : requests) {
    Status status = engine->Wait(&r);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(FirstMismatch(r.dst, r.offset), -1) << "offset " << r.offset;
  }
  EXPECT_EQ(file.n_reads.load(), 3 * static_cast<int>(requests.size()));
}

TEST_P(IoEngineTest, KernelReadErrorIsIOErrorNamingTheFile) {
  auto engine = MakeEngine();
  if (engine == nullptr) GTEST_SKIP() << skip_reason_;
  DirectoryFile file(dir_.path());
  ASSERT_GE(file.native_fd(), 0) << std::strerror(errno);
  DirectBuffer buffer(kBlock);
  IoRequest r;
  r.file = &file;
  r.dst = buffer.span();
  engine->Submit(&r);
  Status status = engine->Wait(&r);
  EXPECT_EQ(status.code(), StatusCode::kIOError) << status.ToString();
  EXPECT_NE(status.message().find(dir_.path()), std::string::npos) << status.ToString();
}

TEST_P(IoEngineTest, DestructionWaitsForReadsInFlight) {
  MAKE_ENGINE_OR_SKIP(engine, 2);
  std::vector<DirectBuffer> buffers;
  std::vector<IoRequest> requests(32);
  for (size_t i = 0; i < requests.size(); ++i) {
    buffers.emplace_back(2 * kBlock);
    requests[i].file = file.get();
    requests[i].offset = (i % 60) * kBlock;
    requests[i].dst = buffers.back().span();
    engine->Submit(&requests[i]);
  }
  engine.reset();  // no Wait: the destructor must let every read land
  for (IoRequest& r : requests) {
    ASSERT_TRUE(r.done.load()) << "offset " << r.offset;
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(FirstMismatch(r.dst, r.offset), -1) << "offset " << r.offset;
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineTest,
                         ::testing::Combine(::testing::Values(EngineKind::kUring,
                                                              EngineKind::kThreads),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<IoEngineTest::ParamType>& param_info) {
                           return std::string(std::get<0>(param_info.param) == EngineKind::kUring
                                                  ? "Uring"
                                                  : "Threads") +
                                  (std::get<1>(param_info.param) ? "Direct" : "Buffered");
                         });

TEST(UringIoEngine, QueueDepthZeroIsInvalidArgument) {
  auto engine = MakeUringIoEngine(0);
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument) << engine.status().ToString();
}

TEST(UringIoEngine, NameStatesQueueDepth) {
  auto engine = MakeUringIoEngine(8);
  if (!engine.ok()) GTEST_SKIP() << engine.status().ToString();
  EXPECT_EQ((*engine)->name(), "io_uring (queue depth 8)");
  EXPECT_EQ(MakeThreadIoEngine(3)->name(), "pread pool of 3 threads");
}

}  // namespace
}  // namespace argus
