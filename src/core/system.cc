// Checksums, CPU features, whole-file I/O and build information.
#include <cpuid.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "argus/core.h"
#include "core/build_info.h"
#include "core/checksum.h"
#include "core/files.h"

namespace argus {

uint64_t Checksum64(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

Hash128 Checksum128(std::span<const std::byte> bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.high64, h.low64};
}

namespace {

bool EnvFlag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && value[0] != '0';
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
  if (EnvFlag("ARGUS_FORCE_SCALAR")) return f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  bool osxsave = ecx & bit_OSXSAVE;
  bool ymm_saved = false, zmm_saved = false;
  if (osxsave) {
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    ymm_saved = (lo & 0x6) == 0x6;
    zmm_saved = (lo & 0xe6) == 0xe6;
  }
  f.fma = ymm_saved && (ecx & bit_FMA);
  f.f16c = ymm_saved && (ecx & bit_F16C);
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.avx2 = ymm_saved && (ebx & bit_AVX2);
    f.bmi2 = ebx & bit_BMI2;
    zmm_saved = zmm_saved && !EnvFlag("ARGUS_FORCE_AVX2");
    f.avx512f = zmm_saved && (ebx & bit_AVX512F);
    f.avx512bw = zmm_saved && (ebx & bit_AVX512BW);
    f.avx512vl = zmm_saved && (ebx & bit_AVX512VL);
    f.avx512vnni = zmm_saved && (ecx & bit_AVX512VNNI);
  }
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) f.avx_vnni = ymm_saved && (eax & (1u << 4));
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(bmi2, "bmi2");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx_vnni, "avx_vnni");
  return s.empty() ? "none" : s;
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = DetectCpuFeatures();
  return features;
}

Result<std::vector<std::byte>> ReadFileBytes(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    auto code = errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIOError;
    return Status(code, path + ": cannot open: " + std::strerror(errno));
  }
  std::vector<std::byte> bytes;
  std::byte chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0)
    bytes.insert(bytes.end(), chunk, chunk + n);
  bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) return Status::IOError(path + ": read failed");
  return bytes;
}

Status WriteFileBytes(const std::string& path, std::span<const std::byte> bytes) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      auto code = err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError;
      return Status(code, tmp + ": write failed: " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return Status::IOError(tmp + ": close failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::IOError(path + ": rename failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info = {
      ARGUS_VERSION,
      ARGUS_COMPILER,
      ARGUS_BUILD_TYPE,
#ifdef ARGUS_SANITIZE
      std::string(ARGUS_CXX_FLAGS) + " -fsanitize=address,undefined",
#else
      ARGUS_CXX_FLAGS,
#endif
  };
  return info;
}

}  // namespace argus
