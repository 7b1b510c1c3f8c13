// Lossless coding of 16-bit floats (LosslessEncode16 / LosslessDecode16) and the codecs
// lossless_f16 and lossless_bf16 built on it.
//
// A value splits into sign, exponent (E bits) and mantissa (M bits): f16 5 + 10, bf16 8 + 7.
// Sign and mantissa are close to uniformly random in KV data and are stored raw; the exponent
// stream is where the redundancy is (KV values cluster in a few binades), so it is entropy-coded
// with zstd, whose Huffman-coded literals approach the stream's Shannon bound. Encoding, all
// fields little-endian:
//
//   offset size  field
//   0      4     magic "AL16"
//   4      1     version, 1
//   5      1     kind (Half16: 0 f16, 1 bf16)
//   6      1     exponent coding: 0 packed raw (E bits each), 1 one zstd frame
//   7      1     reserved, 0
//   8      8     count of values
//   16     8     exponent section bytes
//   24     8     XXH3-64 (Checksum64) of the values as count little-endian u16
//   32     S     sign and mantissa: count fields of 1 + M bits (sign on top), LSB-first bit
//                stream, S = ceil(count * (1 + M) / 8)
//   32+S   X     exponent section
//
// The encoder stores the exponents raw whenever zstd does not make them smaller, so an encoding
// is never longer than 32 + ceil(count * (1 + M) / 8) + ceil(count * E / 8) bytes: the raw size
// plus the header and at most 2 bytes of padding.
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "argus/core.h"
#include "codec/codec_internal.h"
#include "core/checked.h"
#include "core/checksum.h"

namespace argus {
namespace {

constexpr uint8_t kMagic[4] = {'A', 'L', '1', '6'};
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;

enum class ExponentCoding : uint8_t { kRaw = 0, kZstd = 1 };  // append only: reaches bytes

struct BitFields {
  unsigned exponent_bits, mantissa_bits;
  unsigned sign_mantissa_bits() const { return 1 + mantissa_bits; }
};

BitFields FieldsOf(Half16 kind) { return kind == Half16::kF16 ? BitFields{5, 10} : BitFields{8, 7}; }

std::string KindName(Half16 kind) { return kind == Half16::kF16 ? "f16" : "bf16"; }

size_t PackedBytes(size_t n, unsigned width) { return (n * width + 7) / 8; }

// Writes n fields of `width` (<= 16) bits, LSB first, into PackedBytes(n, width) bytes.
template <typename T>
void PackBits(const T* values, size_t n, unsigned width, std::byte* out) {
  uint64_t acc = 0;
  unsigned filled = 0;
  for (size_t i = 0; i < n; ++i) {
    acc |= uint64_t{values[i]} << filled;
    for (filled += width; filled >= 8; filled -= 8, acc >>= 8) {
      *out++ = static_cast<std::byte>(acc & 0xff);
    }
  }
  if (filled > 0) *out = static_cast<std::byte>(acc & 0xff);
}

// Reads n fields of `width` bits from PackedBytes(n, width) bytes.
template <typename T>
void UnpackBits(const std::byte* in, size_t n, unsigned width, T* values) {
  const uint64_t mask = (uint64_t{1} << width) - 1;
  uint64_t acc = 0;
  unsigned filled = 0;
  for (size_t i = 0; i < n; ++i) {
    for (; filled < width; filled += 8) acc |= uint64_t{std::to_integer<uint8_t>(*in++)} << filled;
    values[i] = static_cast<T>(acc & mask);
    acc >>= width;
    filled -= width;
  }
}

// Compresses the exponent stream into one zstd frame tuned for literals. KV exponents are close
// to independent draws, so the LZ matches that zstd's levels find all over a low-entropy stream
// cost more than the Huffman-coded literals they replace (level 1 stays ~0.3 bits/value above
// the Shannon bound). The fast strategy with a 64-entry hash table and 7-byte minimum matches
// finds almost none outside real repeats, and comes within ~0.06 bits of the bound at about
// 300 MB/s. Returns the frame's size, or 0 when zstd fails (the caller then stores raw).
size_t CompressExponents(const uint8_t* exponents, size_t n, std::byte* out, size_t capacity) {
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  if (!cctx) return 0;
  const std::pair<ZSTD_cParameter, int> params[] = {
      {ZSTD_c_compressionLevel, 1}, {ZSTD_c_strategy, ZSTD_fast}, {ZSTD_c_windowLog, 17},
      {ZSTD_c_hashLog, 6},          {ZSTD_c_minMatch, 7},         {ZSTD_c_contentSizeFlag, 1},
  };
  for (const auto& [param, value] : params) {
    if (ZSTD_isError(ZSTD_CCtx_setParameter(cctx.get(), param, value))) return 0;
  }
  const size_t n_bytes = ZSTD_compress2(cctx.get(), out, capacity, exponents, n);
  return ZSTD_isError(n_bytes) ? 0 : n_bytes;
}

uint64_t LoadU64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void StoreU64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }

uint64_t ChecksumOf(std::span<const uint16_t> values) { return Checksum64(std::as_bytes(values)); }

// A validated header; its sections lie within the bytes it was parsed from.
struct Parsed {
  Half16 kind = Half16::kF16;
  ExponentCoding coding = ExponentCoding::kRaw;
  size_t count = 0, sign_mantissa_bytes = 0, exponent_bytes = 0, total_bytes = 0;
  uint64_t checksum = 0;
};

Status Bad(const std::string& what) { return Status::Corruption("lossless16 encoding: " + what); }

// Size arithmetic on declared fields: an overflow means the header lies.
Result<size_t> DeclaredSize(Result<size_t> size, const std::string& field) {
  if (!size.ok()) return Bad(field + " overflows: " + size.status().message());
  return size;
}

Result<Parsed> Parse(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return Bad(std::to_string(bytes.size()) + " bytes, shorter than the " +
               std::to_string(kHeaderBytes) + "-byte header");
  }
  const std::byte* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) return Bad("bad magic");
  if (std::to_integer<uint8_t>(p[4]) != kVersion) {
    return Bad("version " + std::to_string(std::to_integer<int>(p[4])) + " (known: 1)");
  }
  if (std::to_integer<uint8_t>(p[5]) > 1) {
    return Bad("kind " + std::to_string(std::to_integer<int>(p[5])) + " (known: 0 f16, 1 bf16)");
  }
  if (std::to_integer<uint8_t>(p[6]) > 1) {
    return Bad("exponent coding " + std::to_string(std::to_integer<int>(p[6])) +
               " (known: 0 raw, 1 zstd)");
  }
  if (std::to_integer<uint8_t>(p[7]) != 0) return Bad("reserved byte is not zero");
  Parsed h;
  h.kind = static_cast<Half16>(std::to_integer<uint8_t>(p[5]));
  h.coding = static_cast<ExponentCoding>(std::to_integer<uint8_t>(p[6]));
  const uint64_t count = LoadU64(p + 8), exponent_bytes = LoadU64(p + 16);
  h.checksum = LoadU64(p + 24);
  const BitFields layout = FieldsOf(h.kind);
  // Each value takes at least one byte of sign and mantissa, so checking that section against
  // the bytes present bounds count (and every allocation made from it) by the input size.
  ARGUS_ASSIGN_OR_RETURN(
      size_t sm_bits,
      DeclaredSize(CheckedMul(count, layout.sign_mantissa_bits(), "sign/mantissa bits"), "count"));
  h.count = count;
  h.sign_mantissa_bytes = sm_bits / 8 + (sm_bits % 8 != 0);
  const size_t available = bytes.size() - kHeaderBytes;
  if (h.sign_mantissa_bytes > available) {
    return Bad("count " + std::to_string(count) + " needs " +
               std::to_string(h.sign_mantissa_bytes) + " bytes of sign and mantissa, only " +
               std::to_string(available) + " follow the header");
  }
  if (exponent_bytes > available - h.sign_mantissa_bytes) {
    return Bad("exponent section of " + std::to_string(exponent_bytes) + " bytes, only " +
               std::to_string(available - h.sign_mantissa_bytes) + " remain");
  }
  h.exponent_bytes = exponent_bytes;
  h.total_bytes = kHeaderBytes + h.sign_mantissa_bytes + h.exponent_bytes;
  if (h.coding == ExponentCoding::kRaw &&
      h.exponent_bytes != PackedBytes(count, layout.exponent_bits)) {
    return Bad("raw exponent section of " + std::to_string(h.exponent_bytes) + " bytes for " +
               std::to_string(count) + " values of " + std::to_string(layout.exponent_bits) +
               " bits");
  }
  if (h.coding == ExponentCoding::kZstd && count == 0) {
    return Bad("zstd exponent section for zero values");
  }
  return h;
}

Result<std::vector<uint16_t>> DecodeParsed(std::span<const std::byte> bytes, const Parsed& h) {
  const BitFields layout = FieldsOf(h.kind);
  const std::byte* sign_mantissa = bytes.data() + kHeaderBytes;
  const std::byte* exponent_section = sign_mantissa + h.sign_mantissa_bytes;
  std::vector<uint8_t> exponents(h.count);
  if (h.coding == ExponentCoding::kRaw) {
    UnpackBits(exponent_section, h.count, layout.exponent_bits, exponents.data());
  } else {
    const unsigned long long content = ZSTD_getFrameContentSize(exponent_section, h.exponent_bytes);
    if (content != h.count) {
      return Bad("the zstd frame does not declare " + std::to_string(h.count) + " exponents");
    }
    const size_t frame = ZSTD_findFrameCompressedSize(exponent_section, h.exponent_bytes);
    if (ZSTD_isError(frame) || frame != h.exponent_bytes) {
      return Bad("the zstd frame does not fill the exponent section");
    }
    const size_t n =
        ZSTD_decompress(exponents.data(), exponents.size(), exponent_section, h.exponent_bytes);
    if (ZSTD_isError(n)) return Bad(std::string("zstd: ") + ZSTD_getErrorName(n));
    if (n != h.count) {
      return Bad("the zstd frame holds " + std::to_string(n) + " exponents, not " +
                 std::to_string(h.count));
    }
    const uint8_t limit = static_cast<uint8_t>((1u << layout.exponent_bits) - 1);
    if (std::any_of(exponents.begin(), exponents.end(), [&](uint8_t e) { return e > limit; })) {
      return Bad("an exponent exceeds " + std::to_string(layout.exponent_bits) + " bits");
    }
  }
  std::vector<uint16_t> values(h.count);
  UnpackBits(sign_mantissa, h.count, layout.sign_mantissa_bits(), values.data());
  const unsigned m = layout.mantissa_bits;
  for (size_t i = 0; i < h.count; ++i) {
    const unsigned sm = values[i];
    values[i] = static_cast<uint16_t>((sm >> m) << 15 | unsigned{exponents[i]} << m |
                                      (sm & ((1u << m) - 1)));
  }
  const uint64_t checksum = ChecksumOf(values);
  if (checksum != h.checksum) {
    return Bad("checksum mismatch (header " + std::to_string(h.checksum) + ", values " +
               std::to_string(checksum) + ")");
  }
  return values;
}

}  // namespace

std::vector<std::byte> LosslessEncode16(std::span<const uint16_t> bits, Half16 kind) {
  const BitFields layout = FieldsOf(kind);
  const size_t n = bits.size();
  const unsigned m = layout.mantissa_bits;
  std::vector<uint16_t> sign_mantissa(n);
  std::vector<uint8_t> exponents(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned b = bits[i];
    sign_mantissa[i] = static_cast<uint16_t>((b >> 15) << m | (b & ((1u << m) - 1)));
    exponents[i] = static_cast<uint8_t>((b >> m) & ((1u << layout.exponent_bits) - 1));
  }
  const size_t sm_bytes = PackedBytes(n, layout.sign_mantissa_bits());
  const size_t raw_exponent_bytes = PackedBytes(n, layout.exponent_bits);
  std::vector<std::byte> out(kHeaderBytes + sm_bytes +
                             std::max(raw_exponent_bytes, ZSTD_compressBound(n)));
  std::byte* exponent_section = out.data() + kHeaderBytes + sm_bytes;
  PackBits(sign_mantissa.data(), n, layout.sign_mantissa_bits(), out.data() + kHeaderBytes);

  ExponentCoding coding = ExponentCoding::kRaw;
  size_t exponent_bytes = raw_exponent_bytes;
  if (n > 0) {
    const size_t z =
        CompressExponents(exponents.data(), n, exponent_section, ZSTD_compressBound(n));
    if (z > 0 && z < raw_exponent_bytes) {
      coding = ExponentCoding::kZstd;
      exponent_bytes = z;
    }
  }
  if (coding == ExponentCoding::kRaw) {
    // A failed or unprofitable compression leaves the raw form, which is always valid.
    std::fill(exponent_section, exponent_section + raw_exponent_bytes, std::byte{0});
    PackBits(exponents.data(), n, layout.exponent_bits, exponent_section);
  }
  out.resize(kHeaderBytes + sm_bytes + exponent_bytes);

  std::memcpy(out.data(), kMagic, 4);
  out[4] = std::byte{kVersion};
  out[5] = static_cast<std::byte>(kind);
  out[6] = static_cast<std::byte>(coding);
  out[7] = std::byte{0};
  StoreU64(out.data() + 8, n);
  StoreU64(out.data() + 16, exponent_bytes);
  StoreU64(out.data() + 24, ChecksumOf(bits));
  return out;
}

Result<std::vector<uint16_t>> LosslessDecode16(std::span<const std::byte> bytes) {
  ARGUS_ASSIGN_OR_RETURN(Parsed h, Parse(bytes));
  if (h.total_bytes != bytes.size()) {
    return Bad(std::to_string(bytes.size() - h.total_bytes) + " bytes follow the encoding");
  }
  return DecodeParsed(bytes, h);
}

double ExponentEntropyBits(std::span<const uint16_t> bits, Half16 kind) {
  if (bits.empty()) return 0;
  const BitFields layout = FieldsOf(kind);
  std::vector<size_t> histogram(size_t{1} << layout.exponent_bits);
  for (uint16_t b : bits) ++histogram[(b >> layout.mantissa_bits) & (histogram.size() - 1)];
  double entropy = 0;
  for (size_t c : histogram) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / static_cast<double>(bits.size());
    entropy -= p * std::log2(p);
  }
  return entropy;
}

namespace codec_internal {
namespace {

// A tile is a LosslessEncode16 encoding of the tile's values followed by zero bytes up to the
// worst-case size (raw exponents), so that tiles keep the fixed size the Codec interface
// promises. Stores that want the compact form keep only the encoding (its length is in its
// header) or use LosslessEncode16 directly.
class LosslessCodec final : public CodecBase {
 public:
  LosslessCodec(CodecInfo info, Half16 kind)
      : CodecBase(std::move(info), KernelPath::kScalar), kind_(kind) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    const BitFields layout = FieldsOf(kind_);
    return kHeaderBytes + PackedBytes(shape.n_values(), layout.sign_mantissa_bits()) +
           PackedBytes(shape.n_values(), layout.exponent_bits);
  }

 private:
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    std::vector<uint16_t> bits(shape.n_values());
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = kind_ == Half16::kF16 ? FloatToHalf(x[i]) : FloatToBf16(x[i]);
    }
    const std::vector<std::byte> encoding = LosslessEncode16(bits, kind_);
    if (encoding.size() > out.size()) {
      return Status::Internal(info_.name + ": encoding of " + std::to_string(encoding.size()) +
                              " bytes exceeds the tile bound of " + std::to_string(out.size()));
    }
    std::memcpy(out.data(), encoding.data(), encoding.size());
    std::memset(out.data() + encoding.size(), 0, out.size() - encoding.size());
    return Status::Ok();
  }

  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    return DecodeFloats(in, shape, x);
  }

  // Decodes the tile first: this codec is for disk and network tiers, not hot attention.
  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    std::vector<float> x(shape.n_values());
    ARGUS_RETURN_IF_ERROR(DecodeFloats(k, shape, x.data()));
    ScoresByRows(shape, q, n_q, s, [&](uint32_t t, float* row) { CopyRow(x, shape, t, row); });
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    std::vector<float> x(shape.n_values());
    ARGUS_RETURN_IF_ERROR(DecodeFloats(v, shape, x.data()));
    AccumulateByRows(shape, p, n_q, acc,
                     [&](uint32_t t, float* row) { CopyRow(x, shape, t, row); });
    return Status::Ok();
  }

  static void CopyRow(const std::vector<float>& x, TileShape shape, uint32_t t, float* row) {
    std::memcpy(row, x.data() + size_t{t} * shape.dim, sizeof(float) * shape.dim);
  }

  // REQUIRES: CheckEncoded(in.size(), shape) passed.
  Status DecodeFloats(std::span<const std::byte> in, TileShape shape, float* x) const {
    ARGUS_ASSIGN_OR_RETURN(Parsed h, Parse(in));
    const std::string where =
        info_.name + " tile of " + std::to_string(shape.tokens) + "x" + std::to_string(shape.dim);
    if (h.kind != kind_) {
      return Status::Corruption(where + " holds " + KindName(h.kind) + " values");
    }
    if (h.count != shape.n_values()) {
      return Status::Corruption(where + " holds " + std::to_string(h.count) + " values");
    }
    if (std::any_of(in.begin() + static_cast<ptrdiff_t>(h.total_bytes), in.end(),
                    [](std::byte b) { return b != std::byte{0}; })) {
      return Status::Corruption(where + ": the padding after the encoding is not zero");
    }
    ARGUS_ASSIGN_OR_RETURN(std::vector<uint16_t> bits, DecodeParsed(in.first(h.total_bytes), h));
    for (size_t i = 0; i < bits.size(); ++i) {
      x[i] = kind_ == Half16::kF16 ? HalfToFloat(bits[i]) : Bf16ToFloat(bits[i]);
    }
    return Status::Ok();
  }

  Half16 kind_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeLosslessCodec(const CodecSpec& spec) {
  Half16 kind;
  if (spec.name == "lossless_f16") {
    kind = Half16::kF16;
  } else if (spec.name == "lossless_bf16") {
    kind = Half16::kBf16;
  } else {
    return Status::NotFound("no lossless codec named '" + spec.name + "'");
  }
  CodecInfo info;
  info.name = spec.name;
  info.code_bits = 0;
  info.lossless = true;
  info.role = CodecRole::kBoth;
  info.summary = "exact for " + KindName(kind) + " values (floats are rounded to " +
                 KindName(kind) +
                 " first); zstd-coded exponents for disk and network; tiles padded to the raw size";
  // ScoresByRows / AccumulateByRows on the decoded floats: float rounding only.
  info.fused_rel_error = 1e-5;
  auto codec = std::make_unique<LosslessCodec>(std::move(info), kind);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace codec_internal
}  // namespace argus
