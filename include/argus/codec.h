// Codecs turn a KV tile (one head's slice of one plane of a page) into bytes and back, and
// compute attention directly on those bytes.
//
// A tile is `tokens x dim` floats in row-major order: // [tokens, dim]. An encoded tile is a
// self-contained byte string whose length is exactly encoded_size(shape). Codec objects are
// immutable after construction and thread-safe: every method is const and may be called
// concurrently. Every method that reads encoded bytes validates their length and content and
// returns an error (never crashes, never reads out of bounds) on malformed input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/status.h"

namespace argus {

inline constexpr uint32_t kMaxTileDim = 1024;      // head_dim limit (stack scratch in kernels)
inline constexpr uint32_t kMaxTileTokens = 65536;  // tokens per tile
inline constexpr uint32_t kMaxGroupHeads = 64;     // query heads per GQA group in one call

struct TileShape {
  uint32_t tokens = 0;
  uint32_t dim = 0;
  size_t n_values() const { return size_t{tokens} * dim; }
};
// InvalidArgument unless 1 <= tokens <= kMaxTileTokens and 1 <= dim <= kMaxTileDim.
Status ValidateShape(TileShape shape);

// Which plane a codec is meant for. Keys-only codecs return Unsupported from accumulate().
enum class CodecRole : uint8_t { kKeys = 1, kValues = 2, kBoth = 3 };
// How affine codecs group values under one scale: 32 consecutive values of a token (row-major
// blocks) or 32 consecutive tokens of one channel (KIVI's key grouping).
enum class Grouping : uint8_t { kToken = 0, kChannel = 1 };  // append only: reaches tiles

// Which implementation of the kernels an instance runs.
// Ordered by width. A codec asked for a path it has no kernels for runs the widest it has below
// it, and kernel_path() says so (fp8, int1 and jl have no AVX-512 kernels: they run AVX2).
enum class KernelPath : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
std::string_view KernelPathName(KernelPath path);
// kAvx512 when the CPU has AVX-512 F/BW/VL/VNNI besides AVX2+FMA+F16C, else kAvx2 when it has those,
// else kScalar (see GetCpuFeatures for the environment variables that narrow it).
KernelPath BestKernelPath();

struct CodecInfo {
  std::string name;           // the spec that creates it, e.g. "q4_0", "int4:channel+rot"
  double bits_per_value = 0;  // including scales and headers, for a 256 x 128 tile
  uint32_t code_bits = 0;     // bits of the per-value code: 16 for f16, 4 for q4_0, 0 = variable
  bool lossless = false;
  bool groupable = false;  // accepts a :token / :channel grouping in its spec
  CodecRole role = CodecRole::kBoth;
  std::string summary;  // one line: what it is for
  // The fused kernels' stated extra error against decode-then-dot in double: for scores,
  // |s - q.k'| <= fused_rel_error * ||q|| * ||k'_t||; for accumulate, per output element,
  // |delta| <= fused_rel_error * sum_t |p_t| * ||v'_t||, where k', v' are the decoded values.
  // Float paths state rounding only; integer paths (quantised queries or weights) state more.
  double fused_rel_error = 1e-5;
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual const CodecInfo& info() const = 0;
  virtual KernelPath kernel_path() const { return KernelPath::kScalar; }

  // Bytes of an encoded tile of this shape; Unsupported when the codec cannot hold the shape.
  virtual Result<size_t> encoded_size(TileShape shape) const = 0;
  // x: [tokens, dim]. REQUIRES: out.size() == encoded_size(shape).
  virtual Status encode(const float* x, TileShape shape, std::span<std::byte> out) const = 0;
  // x: [tokens, dim].
  virtual Status decode(std::span<const std::byte> in, TileShape shape, float* x) const = 0;

  // Fused kernels; they never materialise the tile as floats.
  // q: [n_q, dim], s: [n_q, tokens]. s[i][t] = q_i . k_t (unscaled). 1 <= n_q <= kMaxGroupHeads.
  virtual Status scores(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                        float* s) const = 0;
  // p: [n_q, tokens], acc: [n_q, dim]. acc[i] += sum_t p[i][t] * v_t.
  virtual Status accumulate(std::span<const std::byte> v, TileShape shape, const float* p,
                            uint32_t n_q, float* acc) const = 0;
};

// ---- Building codecs -------------------------------------------------------------------------

// A codec spec is a string: NAME[:token|:channel][+rot][+center], for example "q8_0",
// "int4:channel", "q4_0+rot+center". Grouping applies to int8/int4/int2 (default: token);
// +rot (Hadamard rotation of head_dim) and +center (per-tile mean-centring) apply to codecs of
// 8 bits or fewer and are recorded in the encoded tile.
struct CodecSpec {
  std::string name;
  Grouping grouping = Grouping::kToken;
  bool grouping_given = false;
  bool rotate = false;
  bool center = false;
  KernelPath path = BestKernelPath();

  static Result<CodecSpec> Parse(std::string_view spec);
  std::string ToString() const;  // canonical form, without the kernel path
};

using CodecFactory = std::function<Result<std::unique_ptr<Codec>>(const CodecSpec&)>;

// Codecs by name. The default registry holds every built-in codec; an application may
// register its own and unregister built-in ones. Thread-safe.
class CodecRegistry {
 public:
  CodecRegistry() = default;
  static CodecRegistry& Default();  // holds the built-in codecs

  // InvalidArgument when `name` is taken or malformed (names are [a-z0-9_/]+).
  Status Register(std::string name, CodecInfo info, CodecFactory factory);
  Status Unregister(std::string_view name);  // NotFound when absent

  // Creates the codec a spec describes; transforms wrap the base codec.
  Result<std::unique_ptr<Codec>> Create(const CodecSpec& spec) const;
  Result<std::unique_ptr<Codec>> Create(std::string_view spec) const;

  struct Query {
    CodecRole role = CodecRole::kBoth;  // codecs usable for this role (kBoth: any)
    bool lossless_only = false;
    double max_bits_per_value = 1e9;
  };
  // Registered codecs matching the query, by name.
  std::vector<CodecInfo> Find(const Query& query) const;
  std::vector<CodecInfo> List() const { return Find(Query{}); }

 private:
  struct Entry {
    CodecInfo info;
    CodecFactory factory;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

// ---- Lossless coding of raw 16-bit floats ----------------------------------------------------

enum class Half16 : uint8_t { kF16 = 0, kBf16 = 1 };  // append only: reaches encoded bytes
// Exact for every bit pattern (NaN payloads, +-0, Inf, subnormals): splits sign, exponent and
// mantissa and entropy-codes the exponent stream.
std::vector<std::byte> LosslessEncode16(std::span<const uint16_t> bits, Half16 kind);
// Corruption when the bytes are not a valid encoding.
Result<std::vector<uint16_t>> LosslessDecode16(std::span<const std::byte> bytes);
// Shannon entropy of the exponent field histogram, in bits per value (for reports).
double ExponentEntropyBits(std::span<const uint16_t> bits, Half16 kind);

// ---- Synthetic KV ----------------------------------------------------------------------------

// A documented, seeded generator of KV tiles with the structure real models show (see
// docs/codecs.md, "Synthetic KV"). Same seed and parameters, same values, on every machine.
enum class KeyRegime : uint8_t {
  kIsotropic = 0,         // keys ~ N(0, 1) per channel
  kModerateOutliers = 1,  // a few channels with 4-8x the scale
  kHeavyOutliers = 2,     // several channels with 10-30x the scale and large channel means
};
std::string_view KeyRegimeName(KeyRegime regime);

struct SyntheticKvOptions {
  KeyRegime regime = KeyRegime::kIsotropic;
  uint32_t dim = 128;
  uint32_t n_q = 4;  // query heads of the GQA group
  uint64_t seed = 1;
  bool sink = true;  // token 0 is an attention sink: queries align with its key
};

// One GQA group's data for a context: keys and values [tokens, dim], queries [n_q, dim].
struct SyntheticKv {
  uint32_t tokens = 0, dim = 0, n_q = 0;
  std::vector<float> k, v, q;
};
SyntheticKv GenerateSyntheticKv(const SyntheticKvOptions& options, uint32_t tokens);

}  // namespace argus
