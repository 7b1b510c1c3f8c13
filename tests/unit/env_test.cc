// The POSIX Env: positional transfers, sizes, directories, O_DIRECT, and errors that name the
// file and the operation.
#include "argus/env.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fault/fault_env.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::TempDir;

std::vector<std::byte> Bytes(std::string_view text) {
  std::vector<std::byte> b(text.size());
  std::memcpy(b.data(), text.data(), text.size());
  return b;
}

TEST(Env, LockFileIsExclusiveUntilTheLockingFileIsDestroyed) {
  TempDir dir;
  const std::string path = dir / "LOCK";
  Env* env = Env::Default();
  auto first = env->LockFile(path);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  // flock locks belong to the open file description: a second one conflicts in-process too.
  auto second = env->LockFile(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIOError);
  EXPECT_EQ(second.status().message(), path + " is locked by another process");
  first->reset();
  auto third = env->LockFile(path);
  EXPECT_TRUE(third.ok()) << third.status().ToString();
}

TEST(Env, PositionalWritesAndReadsRoundTripAndTruncateSetsSize) {
  TempDir dir;
  Env* env = Env::Default();
  auto file = env->Open(dir / "f", {.create = true});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE(WriteExact(**file, 10, Bytes("world"), "w").ok());
  ASSERT_TRUE(WriteExact(**file, 0, Bytes("hello"), "h").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  EXPECT_EQ((*file)->Size().value(), 15u);
  std::vector<std::byte> got(15);
  ASSERT_TRUE(ReadExact(**file, 0, got, "all").ok());
  std::vector<std::byte> want = Bytes("hello");
  want.resize(10);  // the hole reads as zeros
  for (std::byte b : Bytes("world")) want.push_back(b);
  EXPECT_EQ(got, want);
  ASSERT_TRUE((*file)->Truncate(7).ok());
  EXPECT_EQ((*file)->Size().value(), 7u);
  EXPECT_EQ((*file)->native_fd() >= 0, true);
}

TEST(Env, ReadPastEndIsCorruptionNamingFileOffsetAndWhat) {
  TempDir dir;
  auto file = Env::Default()->Open(dir / "short", {.create = true});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(WriteExact(**file, 0, Bytes("abc"), "x").ok());
  std::vector<std::byte> got(8);
  Status s = ReadExact(**file, 0, got, "the header");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find(dir / "short"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("truncated at byte 3, wanted 5 more bytes for the header"),
            std::string::npos)
      << s.message();
}

TEST(Env, MissingFileIsNotFoundNamingOperationAndPath) {
  TempDir dir;
  auto file = Env::Default()->Open(dir / "absent", {});
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(file.status().message(), "open " + (dir / "absent") + ": No such file or directory");
  Status removed = Env::Default()->Remove(dir / "absent");
  EXPECT_EQ(removed.code(), StatusCode::kNotFound);
  EXPECT_EQ(Env::Default()->Exists(dir / "absent").value(), false);
}

TEST(Env, WriteToReadOnlyFileIsIOErrorNamingPwriteAndOffset) {
  TempDir dir;
  ASSERT_TRUE(Env::Default()->Open(dir / "ro", {.create = true}).ok());
  auto file = Env::Default()->Open(dir / "ro", {.read_only = true});
  ASSERT_TRUE(file.ok());
  auto n = (*file)->WriteAt(4096, Bytes("x"));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kIOError);
  EXPECT_EQ(n.status().message().rfind("pwrite " + (dir / "ro") + " at 4096: ", 0), 0u)
      << n.status().message();
}

TEST(Env, DirectoriesListRenameAndRemove) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDir(dir / "sub").ok());
  ASSERT_TRUE(env->CreateDir(dir / "sub").ok());  // exists: fine
  ASSERT_TRUE(env->Open(dir / "sub/a", {.create = true}).ok());
  ASSERT_TRUE(env->Rename(dir / "sub/a", dir / "sub/b").ok());
  ASSERT_TRUE(env->SyncDir(dir / "sub").ok());
  EXPECT_EQ(env->ListDir(dir / "sub").value(), std::vector<std::string>{"b"});
  ASSERT_TRUE(env->Remove(dir / "sub/b").ok());
  EXPECT_TRUE(env->ListDir(dir / "sub").value().empty());
  EXPECT_EQ(env->ListDir(dir / "nope").status().code(), StatusCode::kNotFound);
}

TEST(Env, DirectIoTransfersAlignedBuffersAtTheReportedAlignment) {
  TempDir dir;
  Env* env = Env::Default();
  auto alignment = env->DirectIoAlignment(dir.path());
  ASSERT_TRUE(alignment.ok()) << alignment.status().ToString();
  const uint32_t a = std::max<uint32_t>(*alignment, 512);
  EXPECT_EQ(a & (a - 1), 0u) << a;
  auto file = env->Open(dir / "direct", {.create = true, .direct = true});
  if (!file.ok() && file.status().code() == StatusCode::kUnsupported) {
    GTEST_SKIP() << "the file system under /tmp refuses O_DIRECT: " << file.status().ToString();
  }
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto* raw = static_cast<std::byte*>(std::aligned_alloc(a, 2 * a));
  for (uint32_t i = 0; i < 2 * a; ++i) raw[i] = static_cast<std::byte>(i * 7 + 1);
  ASSERT_TRUE(WriteExact(**file, a, {raw, 2 * size_t{a}}, "direct write").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  std::vector<std::byte> want(raw, raw + 2 * a);
  std::memset(raw, 0, 2 * a);
  ASSERT_TRUE(ReadExact(**file, a, {raw, 2 * size_t{a}}, "direct read").ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), raw));
  std::free(raw);
}

}  // namespace
}  // namespace argus
