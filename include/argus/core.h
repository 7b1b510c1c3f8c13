// Foundation shared by every module: checked size arithmetic, fp16/bf16/FP8 conversions,
// aligned buffers, a deterministic thread pool, XXH3 checksums, CPU feature detection and
// .npy file I/O. Nothing here knows about pages or codecs.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/status.h"

namespace argus {

// ---- Time ------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
// Wall seconds since `since`.
inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// ---- Error measures ---------------------------------------------------------------------------

// ||x - ref|| / ||ref|| in double precision (||x - ref|| when ref is all zero). ref holds float
// or double values, as many as x.
template <typename Ref>
double RelativeL2Error(std::span<const float> x, std::span<const Ref> ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double{x[i]} - double{ref[i]};
    err += d * d;
    norm += double{ref[i]} * double{ref[i]};
  }
  return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
}

// ---- Checked size arithmetic -----------------------------------------------------------------
// Every size derived from untrusted values (files, pages, arguments) goes through these.

// Returns a*b, or InvalidArgument naming `what` when it does not fit in size_t.
Result<size_t> CheckedMul(size_t a, size_t b, std::string_view what);
// Returns a+b, or InvalidArgument naming `what` on overflow.
Result<size_t> CheckedAdd(size_t a, size_t b, std::string_view what);

// ---- Scalar number formats -------------------------------------------------------------------
// All conversions round to nearest even. These scalar versions are the specification; vector
// kernels must agree with them bit for bit.

uint16_t FloatToHalf(float x);  // IEEE binary16; overflow gives Inf, NaN stays NaN
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float x);  // NaN stays NaN (quiet)
float Bf16ToFloat(uint16_t b);

enum class Fp8Format : uint8_t { kE4M3 = 0, kE5M2 = 1 };  // append only: reaches encoded tiles
// OCP FP8, saturating: finite values beyond the largest finite code (and +-Inf) give that
// largest finite code with the input's sign; NaN gives a NaN code.
uint8_t FloatToFp8(float x, Fp8Format format);
float Fp8ToFloat(uint8_t code, Fp8Format format);
float Fp8MaxFinite(Fp8Format format);  // 448 (E4M3), 57344 (E5M2)

// ---- Aligned buffers -------------------------------------------------------------------------

inline constexpr size_t kBufferAlign = 64;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// An owned, 64-byte aligned, zero-initialised byte buffer. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Returns ResourceExhausted when the allocation fails.
  static Result<AlignedBuffer> Allocate(size_t n_bytes);
  // A buffer of whole huge pages (n_bytes a multiple of kHugePageBytes, else InvalidArgument),
  // aligned to one and advised to the kernel as transparent huge pages before it is touched: a
  // stream over it from DRAM then misses the TLB once per 2 MiB instead of once per 4 KiB.
  static Result<AlignedBuffer> AllocateHugePages(size_t n_bytes);

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return n_bytes_; }
  std::span<std::byte> span() { return {data(), n_bytes_}; }
  std::span<const std::byte> span() const { return {data(), n_bytes_}; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data());
  }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t n_bytes_ = 0;
};

// ---- Thread pool -----------------------------------------------------------------------------

// A fixed set of worker threads. ParallelFor splits [0, n_items) into chunks of `chunk` items,
// a split that depends only on n_items and chunk, never on the number of threads, so any
// computation whose chunks write disjoint outputs is bit-identical for every thread count.
// Thread-safe: ParallelFor may be called from several threads; calls are serialised. Idle
// workers spin (yielding) for 50 us after a job before they sleep, so back-to-back calls, one
// per layer, do not pay a sleep and wake each.
// The most threads a pool may be asked for: beyond it, creating them fails or takes seconds,
// and no machine this runs on has that many hardware threads.
inline constexpr unsigned kMaxThreads = 1024;
// InvalidArgument naming `what` when n_threads exceeds kMaxThreads (0, one per hardware thread,
// is fine).
Status CheckThreadCount(unsigned n_threads, std::string_view what);

class ThreadPool {
 public:
  // n_threads == 0 means one per hardware thread. The calling thread takes part in the work,
  // so n_threads == 1 runs everything inline. REQUIRES: n_threads <= kMaxThreads.
  explicit ThreadPool(unsigned n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned n_threads() const;
  // Calls fn(chunk_index, begin, end) once per chunk; returns when all chunks are done.
  void ParallelFor(size_t n_items, size_t chunk,
                   const std::function<void(size_t chunk_index, size_t begin, size_t end)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Checksums -------------------------------------------------------------------------------

uint64_t Checksum64(std::span<const std::byte> bytes);  // XXH3-64, seed 0
struct Hash128 {
  uint64_t hi = 0, lo = 0;
};
Hash128 Checksum128(std::span<const std::byte> bytes);  // XXH3-128, seed 0

// ---- CPU features ----------------------------------------------------------------------------

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx_vnni = false;
  // AVX2 + FMA + F16C, and the OS saves the YMM state: what ARGUS's vector kernels need.
  bool avx2_kernels() const { return avx2 && fma && f16c; }
  // Those and AVX-512 F/BW/VL/VNNI with the ZMM state saved: what the *_avx512.cc kernels need
  // (the integer kernels multiply-add with VNNI; every AVX-512 CPU since Cascade Lake has it).
  bool avx512_kernels() const {
    return avx2_kernels() && avx512f && avx512bw && avx512vl && avx512vnni;
  }
  std::string ToString() const;  // "avx2 fma f16c bmi2 ..."
};
// Detected once. ARGUS_FORCE_SCALAR=1 in the environment reports no vector features, so the
// scalar kernels can be exercised on any machine; ARGUS_FORCE_AVX2=1 reports no AVX-512, so the
// AVX2 kernels can be measured beside the AVX-512 ones.
const CpuFeatures& GetCpuFeatures();

// ---- Machine probes ------------------------------------------------------------------------
// The denominators of every benchmark: what this machine can read and compute, measured now.

size_t LastLevelCacheBytes();  // from sysfs / sysconf; 32 MiB when unknown

struct MachineProbe {
  double read_gbps_one_thread = 0;  // streaming read of a buffer 4x the last-level cache
  double read_gbps_all_threads = 0;
  double fma_gflops_one_thread = 0;   // peak fp32 FMA rate (2 flops per lane), widest path
  double fma_gflops_all_threads = 0;  // the same, every thread of the pool at once
  size_t buffer_bytes = 0;
  unsigned n_threads = 0;
};
// Takes about a second. Returns ResourceExhausted when the probe buffer cannot be allocated.
Result<MachineProbe> ProbeMachine(ThreadPool& pool);

// ---- .npy files ------------------------------------------------------------------------------

enum class NpyType : uint8_t { kFloat32, kFloat16, kUint8 };

// An array read from or written to a NumPy .npy file (format versions 1.0-3.0, little-endian,
// C order). data holds n_values() elements of `type`.
struct NpyArray {
  NpyType type = NpyType::kFloat32;
  std::vector<size_t> shape;
  std::vector<std::byte> data;

  size_t n_values() const;
  // The values as float32 (float16 and uint8 are converted).
  std::vector<float> ToFloat() const;
  static NpyArray FromFloat(std::vector<size_t> shape, std::span<const float> values);
};

// Errors name the file and what is wrong (bad magic, unsupported dtype or order, a header
// that lies about the size, a truncated file).
Result<NpyArray> ReadNpy(const std::string& path);
Result<NpyArray> ParseNpy(std::span<const std::byte> bytes, std::string_view name);
Status WriteNpy(const std::string& path, const NpyArray& array);
std::string NpyShapeText(const std::vector<size_t>& shape);  // "[4, 2, 64]", for messages

// ---- Field encoding --------------------------------------------------------------------------

// Fields appended in memory order (little-endian on every machine ARGUS builds for): the
// encodings of the cache's manifests and page-key seeds and of trace files.
class ByteWriter {
 public:
  template <typename T>
  ByteWriter& Put(const T& value) {
    return PutBytes(std::as_bytes(std::span(&value, 1)));
  }
  ByteWriter& PutBytes(std::span<const std::byte> bytes) {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  // The length as a Length, then the bytes.
  template <typename Length = uint16_t>
  ByteWriter& PutString(std::string_view text) {
    Put(static_cast<Length>(text.size()));
    return PutBytes(std::as_bytes(std::span(text.data(), text.size())));
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// Reads fields that ByteWriter wrote, each checked against the bytes that remain (the bytes are
// data from disk): Corruption "<what>: truncated in <field> (byte N)".
class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, std::string what)
      : bytes_(bytes), what_(std::move(what)) {}
  template <typename T>
  Result<T> Get(std::string_view field) {
    if (bytes_.size() - offset_ < sizeof(T)) return Truncated(field);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  Result<std::string> GetString(std::string_view field) {  // a u16 length, then the bytes
    ARGUS_ASSIGN_OR_RETURN(uint16_t n, Get<uint16_t>(field));
    if (bytes_.size() - offset_ < n) return Truncated(field);
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), n);
    offset_ += n;
    return text;
  }
  bool done() const { return offset_ == bytes_.size(); }
  size_t remaining() const { return bytes_.size() - offset_; }
  Status Corrupt(const std::string& why) const {
    return Status::Corruption(what_ + ": " + why + " (byte " + std::to_string(offset_) + ")");
  }

 private:
  Status Truncated(std::string_view field) const {
    return Corrupt("truncated in " + std::string(field));
  }
  std::span<const std::byte> bytes_;
  std::string what_;
  size_t offset_ = 0;
};

// ---- Files -----------------------------------------------------------------------------------

Result<std::vector<std::byte>> ReadFileBytes(const std::string& path);
// Writes to path.tmp, then renames, so a failure never leaves a half-written file at path.
Status WriteFileBytes(const std::string& path, std::span<const std::byte> bytes);

// ---- Build information -----------------------------------------------------------------------

struct BuildInfo {
  std::string version, compiler, build_type, flags;
};
const BuildInfo& GetBuildInfo();

}  // namespace argus
