// int8, int4, int2: affine (asymmetric) quantisation in groups of 32 values, each with an fp16
// scale and an fp16 minimum, grouped per token (32 consecutive values in row-major order, like
// ggml's q4_1) or per channel (32 consecutive tokens of one channel: KIVI's key grouping). This
// file also holds the coded-tile machinery that plane.cc shares (affine_kernels.h).
//
// Tile layouts, b = code bits (the code plane's panel layout is in affine_kernels.h):
//   token:   [fp16 scale x n_blocks][fp16 min x n_blocks][code plane, b bits]
//            n_blocks = ceil(tokens * dim / 32); metadata in TokenMetaIndex order (panel, column,
//            row); coded matrix [tokens, dim], or [n_blocks, 32] when 32 does not divide dim.
//            (4 + 4b) bytes per block: 9, 5, 3 bits per value.
//   channel: [fp16 scale x G dim][fp16 min x G dim][code plane, b bits]
//            G = ceil(tokens / 32) groups; the metadata of group g, channel d at g * dim + d;
//            coded matrix [tokens, 4 ceil(dim / 4)], the padding channels holding code 0.
//
// Quantisation of a group with values in [lo, hi]: min = the fp16 at or below lo, scale = the
// fp16 at or above (hi - min) / (2^b - 1), code = clamp(round((x - min) / scale), 0, 2^b - 1),
// x' = scale * code + min. Rounding both fp16 fields outward keeps the group inside
// [min, min + (2^b - 1) scale], so no code is clamped and |x - x'| <= scale / 2 (plus float
// rounding: 2^-24 |x'| in decode, 3 * 2^-24 (2^b - 1) scale in the encoder's division), where
// scale <= (hi - lo + ulp16(lo)) / (2^b - 1) * (1 + 2^-10), or 2^-24 when that is subnormal.
//
// Fused-kernel error (the integer kernels; the scalar ones decode, then dot in float). With Qmax,
// Wmax and kCentre = 2^(b-1) of affine_kernels.h and o = (2^b - 1) / 2:
//   token scores compute q^ . k' exactly, q^ being q quantised to Qmax levels per 32 channels:
//     |s - q.k'| <= ||q^ - q|| ||k'|| <= sqrt(32) / (2 Qmax) ||q|| ||k'||.
//   token accumulate quantises w_tj = p_t scale_tj over the 32 rows of a group (all columns j,
//   one step ws = max w / Wmax) against centred codes c - kCentre:
//     |delta_d| <= 32 kCentre ws / 2 <= 32 kCentre / (2 Wmax o) sum_t p_t ||v'_t||,
//     as a decoded block spans (2^b - 1) scale, so ||v'_t|| >= o scale_tj for every j.
//   channel layout: the same steps with the scales folded into the query (scores: one step per
//   32 channels, codes centred at o) or applied after the sum (accumulate). Rigorous bounds are
//   absolute: |s - q.k'_t| <= sum_k (qs_k / 2) sum_{d in k} |c_td - o| with
//   qs_k = max_{d in k} |q_d scale_d| / Qmax, and |delta_d| <= sum_groups (pmax / (2 Wmax))
//   sum_t |c_td - kCentre| scale_d. Relative to ||q|| ||k'_t|| they grow with the spread of the
//   channel scales in a group (an outlier channel leaves its neighbours few query levels), so the
//   stated figure is empirical: twice the token one, which covers keys with 30x outlier channels
//   in every 32-channel segment (measured worst: 0.20 int8, 0.11 int4, 0.13 int2). Rotation
//   (+rot) evens the channel scales out.
// Qmax and Wmax are those of the AVX2 kernels (kQueryMax, kWeightMax: their int16 sums limit 8-bit
// codes to 64 and 127). The AVX-512 kernels sum in int32 and take 127 and 255 at every width
// (kQueryMaxAvx512, kWeightMaxAvx512): the same quantisation at 4 and 2 bits, and at 8 bits the
// same derivation with about twice the levels, so about half the error. The stated figure is the
// AVX2 one, the larger, so it bounds both paths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "argus/core.h"
#include "codec/affine_kernels.h"
#include "codec/codec_internal.h"
#include "codec/panel_codec.h"

namespace argus::codec_internal {

static_assert(kMaxRowLen == kMaxTileDim, "kernel scratch is sized by kMaxRowLen");

uint32_t PanelUnits(uint32_t row_len, uint32_t bits) { return (row_len / 4 * bits + 7) / 8; }

size_t PlaneBytes(uint32_t n_rows, uint32_t row_len, uint32_t bits) {
  return size_t{4} * n_rows * PanelUnits(row_len, bits);
}

void TokenRows(uint32_t tokens, uint32_t dim, uint32_t* n_rows, uint32_t* row_len) {
  if (dim % kAffineGroup == 0) {
    *n_rows = tokens;
    *row_len = dim;
  } else {
    *n_rows = static_cast<uint32_t>((size_t{tokens} * dim + kAffineGroup - 1) / kAffineGroup);
    *row_len = kAffineGroup;
  }
}

size_t TokenMetaIndex(uint32_t n_rows, uint32_t row_len, uint32_t row, uint32_t j) {
  const uint32_t first = row / kPanelRows * kPanelRows;
  const uint32_t m = std::min(kPanelRows, n_rows - first);
  return size_t{first} * (row_len / kAffineGroup) + size_t{m} * j + (row - first);
}

uint32_t CodeBits(CodeLayout layout) {
  uint32_t widths[3];
  uint32_t bits = 0;
  for (uint32_t i = 0, n = PlaneWidths(layout, widths); i < n; ++i) bits += widths[i];
  return bits;
}

uint32_t PlaneWidths(CodeLayout layout, uint32_t widths[3]) {
  switch (layout) {
    case CodeLayout::kBits8:
      widths[0] = 8;
      return 1;
    case CodeLayout::kBits4:
      widths[0] = 4;
      return 1;
    case CodeLayout::kBits2:
      widths[0] = 2;
      return 1;
    case CodeLayout::kPlanes224:
      widths[0] = 2;
      widths[1] = 2;
      widths[2] = 4;
      return 3;
    case CodeLayout::kPlanes22:
      widths[0] = 2;
      widths[1] = 2;
      return 2;
  }
  return 0;
}

uint16_t HalfRoundUp(double x) {
  uint16_t h = FloatToHalf(static_cast<float>(x));
  // One step suffices: the nearest half is within half a step of x.
  if (HalfToFloat(h) < x) {
    if ((h & 0x7fff) == 0) {
      h = 0x0001;  // +-0 -> the smallest positive subnormal
    } else if (h & 0x8000) {
      --h;  // negative: towards zero
    } else {
      ++h;
    }
  }
  return h;
}

uint16_t HalfRoundDown(double x) { return HalfRoundUp(-x) ^ 0x8000; }

bool WithinHalfRange(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(x[i]) <= kHalfMax)) return false;  // NaN fails too
  }
  return true;
}

namespace {

// Byte offset and bit shift of the field of (row, channel) in a plane of `units` per panel.
size_t FieldOffset(uint32_t n_rows, uint32_t units, uint32_t bits, uint32_t row, uint32_t channel,
                   uint32_t* shift) {
  const uint32_t first = row / kPanelRows * kPanelRows;
  const uint32_t m = std::min(kPanelRows, n_rows - first);
  const uint32_t per_unit = 8 / bits, chunk = channel / 4;
  *shift = bits * (chunk % per_unit);
  return size_t{4} * first * units + size_t{4} * m * (chunk / per_unit) + 4 * (row - first) +
         channel % 4;
}

// Decodes channels [c0, c0 + n) of coded row `row`.
void DecodeSpan(const CodedTile& t, uint32_t row, uint32_t c0, uint32_t n, float* out) {
  uint32_t widths[3], units[3];
  const uint32_t n_planes = PlaneWidths(t.code, widths);
  for (uint32_t i = 0; i < n_planes; ++i) units[i] = PanelUnits(t.row_len, widths[i]);
  const float offset = static_cast<float>((1u << CodeBits(t.code)) - 1) / 2;
  size_t meta = SIZE_MAX;
  float scale = 0, min = 0;
  for (uint32_t c = c0; c < c0 + n; ++c) {
    uint32_t code = 0;
    for (uint32_t i = 0; i < n_planes; ++i) {
      uint32_t shift;
      const size_t at = FieldOffset(t.n_rows, units[i], widths[i], row, c, &shift);
      code = (code << widths[i]) |
             ((std::to_integer<uint32_t>(t.planes[i][at]) >> shift) & ((1u << widths[i]) - 1));
    }
    const size_t index = t.meta == MetaLayout::kChannelScaleMin
                             ? size_t{row / kAffineGroup} * t.dim + c
                             : TokenMetaIndex(t.n_rows, t.row_len, row, c / kAffineGroup);
    if (index != meta) {
      meta = index;
      scale = HalfToFloat(LoadU16(t.scales + 2 * index));
      if (t.meta == MetaLayout::kTokenStep) {
        scale *= t.step_mul;  // a power of two: exact
      } else {
        min = HalfToFloat(LoadU16(t.mins + 2 * index));
      }
    }
    // Both forms are one rounding at most: scale * code and (code - offset) * scale are exact.
    out[c - c0] = t.meta == MetaLayout::kTokenStep ? (static_cast<float>(code) - offset) * scale
                                                   : scale * static_cast<float>(code) + min;
  }
}

// True when `path` has vector kernels and x[0 .. n) lies in their domain [lo, hi].
bool VectorDomain(KernelPath path, const float* x, size_t n, float lo, float hi) {
  if (path == KernelPath::kAvx512) return AllWithinAvx512(x, n, lo, hi);
  return path == KernelPath::kAvx2 && AllWithinAvx2(x, n, lo, hi);
}

bool VectorShape(const CodedTile& t) {
  return t.meta == MetaLayout::kChannelScaleMin ? t.dim % 16 == 0 : t.dim % kAffineGroup == 0;
}

constexpr float kMaxKernelInput = 1e30f;  // keeps q * scale and p * scale finite in float

}  // namespace

// FieldOffset's layout, walked panel by panel (8 / bits chunks a unit: a shift, not a division).
void StorePanelPlane(const uint8_t* codes, uint32_t n_rows, uint32_t row_len, uint32_t bits,
                     uint32_t shift, std::byte* plane) {
  const uint32_t units = PanelUnits(row_len, bits), mask = (1u << bits) - 1;
  const uint32_t chunks_log2 = bits == 8 ? 0 : bits == 4 ? 1 : 2;  // log2(8 / bits)
  for (uint32_t first = 0; first < n_rows; first += kPanelRows) {
    const uint32_t m = std::min(kPanelRows, n_rows - first);
    std::byte* panel = plane + size_t{4} * first * units;
    for (uint32_t k = 0; k < m; ++k) {
      const uint8_t* row = codes + size_t{first + k} * row_len;
      for (uint32_t c = 0; c < row_len; ++c) {
        const uint32_t chunk = c / 4, unit = chunk >> chunks_log2;
        const uint32_t at_shift = bits * (chunk & ((1u << chunks_log2) - 1));
        panel[size_t{4} * m * unit + 4 * k + c % 4] |=
            static_cast<std::byte>(((row[c] >> shift) & mask) << at_shift);
      }
    }
  }
}

PanelGeometry GeometryOf(const CodedTile& t, uint8_t* pad) {
  PanelGeometry g;
  uint32_t widths[3];
  g.n_planes = PlaneWidths(t.code, widths);
  for (uint32_t i = 0; i < g.n_planes; ++i) g.units[i] = PanelUnits(t.row_len, widths[i]);
  g.n_panels = (t.n_rows + kPanelRows - 1) / kPanelRows;
  const uint32_t p = g.n_panels - 1;
  g.last.rows = t.n_rows - p * kPanelRows;
  for (uint32_t i = 0; i < g.n_planes; ++i) {
    const uint8_t* plane =
        reinterpret_cast<const uint8_t*>(t.planes[i]) + size_t{32} * p * g.units[i];
    g.last.plane[i] = plane;
    if (g.last.rows == kPanelRows) continue;
    std::memset(pad, 0, size_t{32} * g.units[i]);
    for (uint32_t u = 0; u < g.units[i]; ++u)
      std::memcpy(pad + 32 * u, plane + 4 * g.last.rows * u, 4 * g.last.rows);
    g.last.plane[i] = pad;
    pad += size_t{32} * g.units[i];
  }
  return g;
}

void PanelDecode(const CodedTile& tile, float* x) {
  if (tile.meta == MetaLayout::kChannelScaleMin) {
    for (uint32_t t = 0; t < tile.tokens; ++t)
      DecodeSpan(tile, t, 0, tile.dim, x + size_t{t} * tile.dim);
    return;
  }
  // Token layouts: the coded matrix is the tile's values in row-major order, then padding.
  const size_t n = size_t{tile.tokens} * tile.dim;
  float row[kMaxRowLen];
  for (uint32_t r = 0; r < tile.n_rows; ++r) {
    const size_t first = size_t{r} * tile.row_len;
    DecodeSpan(tile, r, 0, tile.row_len, row);
    std::copy(row, row + std::min<size_t>(tile.row_len, n - first), x + first);
  }
}

void PanelScores(const CodedTile& tile, const float* q, uint32_t n_q, float* s, KernelPath path) {
  if (VectorShape(tile) &&
      VectorDomain(path, q, size_t{n_q} * tile.dim, -kMaxKernelInput, kMaxKernelInput)) {
    if (path == KernelPath::kAvx512) {
      PanelScoresAvx512(tile, q, n_q, s);
    } else {
      PanelScoresAvx2(tile, q, n_q, s);
    }
    return;
  }
  const TileShape shape{tile.tokens, tile.dim};
  if (tile.meta == MetaLayout::kChannelScaleMin) {
    ScoresByRows(shape, q, n_q, s,
                 [&](uint32_t t, float* row) { DecodeSpan(tile, t, 0, tile.dim, row); });
    return;
  }
  const uint32_t blocks_per_row = tile.row_len / kAffineGroup;
  ScoresByBlocks(shape, q, n_q, s, [&](size_t b, float* x) {
    DecodeSpan(tile, static_cast<uint32_t>(b / blocks_per_row),
               static_cast<uint32_t>(b % blocks_per_row) * kAffineGroup, kAffineGroup, x);
  });
}

void PanelAccumulate(const CodedTile& tile, const float* p, uint32_t n_q, float* acc,
                     KernelPath path) {
  if (VectorShape(tile) &&
      VectorDomain(path, p, size_t{n_q} * tile.tokens, 0.0f, kMaxKernelInput)) {
    if (path == KernelPath::kAvx512) {
      PanelAccumulateAvx512(tile, p, n_q, acc);
    } else {
      PanelAccumulateAvx2(tile, p, n_q, acc);
    }
    return;
  }
  const TileShape shape{tile.tokens, tile.dim};
  if (tile.meta == MetaLayout::kChannelScaleMin) {
    AccumulateByRows(shape, p, n_q, acc,
                     [&](uint32_t t, float* row) { DecodeSpan(tile, t, 0, tile.dim, row); });
    return;
  }
  const uint32_t blocks_per_row = tile.row_len / kAffineGroup;
  AccumulateByBlocks(shape, p, n_q, acc, [&](size_t b, float* x) {
    DecodeSpan(tile, static_cast<uint32_t>(b / blocks_per_row),
               static_cast<uint32_t>(b % blocks_per_row) * kAffineGroup, kAffineGroup, x);
  });
}

double PanelFusedRelError(CodeLayout code, MetaLayout meta) {
  const uint32_t bits = CodeBits(code);
  const double query_max = bits == 8 ? kQueryMax<8> : kQueryMax<4>;
  const double weight_max = bits == 8 ? kWeightMax<8> : kWeightMax<4>;
  const double o = ((1u << bits) - 1) / 2.0, centre = 1u << (bits - 1);
  const double scores = std::sqrt(double{kAffineGroup}) / (2 * query_max);
  const double accumulate = kAffineGroup * centre / (2 * weight_max * o);
  const double empirical = meta == MetaLayout::kChannelScaleMin ? 2 : 1;  // see the top of the file
  return empirical * std::max(scores, accumulate) + 1e-5;                 // + float rounding
}

void FoldRange(const float* x, size_t count, size_t stride, float* lo, float* hi) {
  *lo = *hi = x[0];
  for (size_t i = 1; i < count; ++i) {
    *lo = std::min(*lo, x[i * stride]);
    *hi = std::max(*hi, x[i * stride]);
  }
}

namespace {

// The encoder's code of v in a group of this min and inverse scale.
uint8_t AffineCode(float v, float min, float inv_scale, float max_code) {
  return static_cast<uint8_t>(std::clamp(std::floor((v - min) * inv_scale + 0.5f), 0.0f, max_code));
}

// The fp16 fields of one group, from its min and max, and the encoder's code function.
struct AffineFit {
  uint16_t scale_h = 0, min_h = 0;
  float min = 0, inv_scale = 0, max_code = 0;

  AffineFit(float lo, float hi, uint32_t bits) {
    max_code = static_cast<float>((1u << bits) - 1);
    min_h = HalfRoundDown(lo);
    min = HalfToFloat(min_h);
    scale_h = HalfRoundUp((double{hi} - min) / max_code);
    const float scale = HalfToFloat(scale_h);
    inv_scale = scale > 0 ? 1.0f / scale : 0.0f;
  }
  uint8_t Code(float v) const { return AffineCode(v, min, inv_scale, max_code); }
};

class AffineCodec final : public PanelCodec {
 public:
  AffineCodec(CodecInfo info, KernelPath path, uint32_t bits, Grouping grouping)
      : PanelCodec(std::move(info), path), bits_(bits), grouping_(grouping) {}

  Result<size_t> encoded_size(TileShape shape) const override {
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    const Geometry g = GeometryOf(shape);
    return 4 * g.n_meta + PlaneBytes(g.n_rows, g.row_len, bits_);
  }

 private:
  // The AVX-512 path computes the same codes and fields with vector pieces (RangeAvx512 ...).
  Status EncodeChecked(const float* x, TileShape shape, std::span<std::byte> out) const override {
    const bool simd = path_ == KernelPath::kAvx512;
    if (!(simd ? AllWithinAvx512(x, shape.n_values(), -kHalfMax, kHalfMax)
               : WithinHalfRange(x, shape.n_values()))) {
      return Status::InvalidArgument(info_.name +
                                     ": input values must be finite and within +-65504 "
                                     "(the range of its fp16 scales and minimums)");
    }
    const Geometry g = GeometryOf(shape);
    std::fill(out.begin(), out.end(), std::byte{0});
    std::vector<uint8_t> codes(size_t{g.n_rows} * g.row_len, 0);
    std::byte* scales = out.data();
    std::byte* mins = out.data() + 2 * g.n_meta;
    if (grouping_ == Grouping::kToken) {
      // Block b is values 32b .. 32b + 31 in row-major order: coded row b / J, column b % J.
      const size_t n = shape.n_values();
      const uint32_t blocks_per_row = g.row_len / kAffineGroup;
      for (size_t b = 0; b < g.n_meta; ++b) {
        const size_t first = b * kAffineGroup, count = std::min<size_t>(kAffineGroup, n - first);
        float lo, hi;
        if (simd) {
          RangeAvx512(x + first, count, &lo, &hi);
        } else {
          FoldRange(x + first, count, 1, &lo, &hi);
        }
        const AffineFit fit(lo, hi, bits_);
        const size_t meta =
            TokenMetaIndex(g.n_rows, g.row_len, static_cast<uint32_t>(b / blocks_per_row),
                           static_cast<uint32_t>(b % blocks_per_row));
        StoreU16(scales + 2 * meta, fit.scale_h);
        StoreU16(mins + 2 * meta, fit.min_h);
        if (simd) {
          CodesAvx512(x + first, count, fit.min, fit.inv_scale, fit.max_code, &codes[first]);
        } else {
          for (size_t i = 0; i < count; ++i) codes[first + i] = fit.Code(x[first + i]);
        }
      }
    } else {
      const uint32_t dim = shape.dim;
      std::vector<float> lo(dim), hi(dim), min(dim), inv_scale(dim);
      const auto max_code = static_cast<float>((1u << bits_) - 1);
      for (uint32_t t0 = 0; t0 < shape.tokens; t0 += kAffineGroup) {
        const uint32_t count = std::min(kAffineGroup, shape.tokens - t0);
        const float* rows = x + size_t{t0} * dim;
        if (simd) {
          ColumnRangesAvx512(rows, count, dim, lo.data(), hi.data());
        } else {
          for (uint32_t d = 0; d < dim; ++d) FoldRange(rows + d, count, dim, &lo[d], &hi[d]);
        }
        for (uint32_t d = 0; d < dim; ++d) {
          const AffineFit fit(lo[d], hi[d], bits_);
          const size_t meta = size_t{t0 / kAffineGroup} * dim + d;
          StoreU16(scales + 2 * meta, fit.scale_h);
          StoreU16(mins + 2 * meta, fit.min_h);
          min[d] = fit.min;
          inv_scale[d] = fit.inv_scale;
        }
        for (uint32_t i = 0; i < count; ++i) {
          const float* row = rows + size_t{i} * dim;
          uint8_t* row_codes = &codes[size_t{t0 + i} * g.row_len];
          if (simd) {
            RowCodesAvx512(row, dim, min.data(), inv_scale.data(), max_code, row_codes);
          } else {
            for (uint32_t d = 0; d < dim; ++d) {
              row_codes[d] = AffineCode(row[d], min[d], inv_scale[d], max_code);
            }
          }
        }
      }
    }
    StorePanelPlane(codes.data(), g.n_rows, g.row_len, bits_, 0, out.data() + 4 * g.n_meta);
    return Status::Ok();
  }

  struct Geometry {
    uint32_t n_rows = 0, row_len = 0;
    size_t n_meta = 0;  // scales (and minimums)
  };

  Geometry GeometryOf(TileShape shape) const {
    Geometry g;
    if (grouping_ == Grouping::kToken) {
      TokenRows(shape.tokens, shape.dim, &g.n_rows, &g.row_len);
      g.n_meta = NumBlocks(shape);
    } else {
      g.n_rows = shape.tokens;
      g.row_len = (shape.dim + 3) / 4 * 4;
      g.n_meta = size_t{(shape.tokens + kAffineGroup - 1) / kAffineGroup} * shape.dim;
    }
    return g;
  }

  CodedTile View(const std::byte* bytes, TileShape shape) const override {
    const Geometry g = GeometryOf(shape);
    CodedTile t;
    t.code = bits_ == 8 ? CodeLayout::kBits8 : bits_ == 4 ? CodeLayout::kBits4 : CodeLayout::kBits2;
    t.meta =
        grouping_ == Grouping::kToken ? MetaLayout::kTokenScaleMin : MetaLayout::kChannelScaleMin;
    t.tokens = shape.tokens;
    t.dim = shape.dim;
    t.n_rows = g.n_rows;
    t.row_len = g.row_len;
    t.scales = bytes;
    t.mins = bytes + 2 * g.n_meta;
    t.planes[0] = bytes + 4 * g.n_meta;
    return t;
  }

  uint32_t bits_;
  Grouping grouping_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeAffineCodec(const CodecSpec& spec) {
  uint32_t bits;
  if (spec.name == "int8") {
    bits = 8;
  } else if (spec.name == "int4") {
    bits = 4;
  } else if (spec.name == "int2") {
    bits = 2;
  } else {
    return Status::NotFound("no affine codec named '" + spec.name + "'");
  }
  const bool channel = spec.grouping == Grouping::kChannel;
  CodecInfo info;
  // Always name the grouping, so tables and logs never leave the default implicit.
  info.name = spec.name + (channel ? ":channel" : ":token");
  info.code_bits = bits;
  info.groupable = true;
  info.role = CodecRole::kBoth;
  info.summary =
      std::to_string(bits) + "-bit affine codes with an fp16 scale and minimum per " +
      (channel ? "32 tokens of a channel (KIVI's key grouping)" : "32 values of a token");
  const CodeLayout layout = bits == 8   ? CodeLayout::kBits8
                            : bits == 4 ? CodeLayout::kBits4
                                        : CodeLayout::kBits2;
  info.fused_rel_error = PanelFusedRelError(
      layout, channel ? MetaLayout::kChannelScaleMin : MetaLayout::kTokenScaleMin);
  auto codec = std::make_unique<AffineCodec>(std::move(info), spec.path, bits, spec.grouping);
  codec->ComputeBitsPerValue();
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace argus::codec_internal
