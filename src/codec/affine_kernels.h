// Layouts and kernels shared by the affine codecs (int8/int4/int2, affine.cc) and the bit-plane
// codec (plane8, plane.cc). Raw types only: the AVX2 and AVX-512 kernels (affine_avx2.cc,
// affine_avx512.cc) include this.
//
// Both families store a *coded matrix* [n_rows, row_len] of small unsigned codes plus fp16
// metadata. For per-token blocks of 32 values (int*:token, plane8*) the coded matrix is the tile
// itself, [tokens, dim], when 32 divides dim, and otherwise the flat row-major blocks of the tile,
// [n_blocks, 32], the last block zero-padded; block b is then row b / J, channels 32 (b % J) ..,
// with J = row_len / 32 blocks per row, in both cases. For per-channel groups (int*:channel) the
// coded matrix is [tokens, 4 * ceil(dim / 4)], the padding channels holding code 0.
//
// Panel layout of a code plane. A plane stores one w-bit field (w = 8, 4 or 2) of every code of
// the coded matrix. Rows go in panels of 8 (the last panel holds the m = n_rows % 8 rows left, if
// any). Within a panel, chunk i is channels 4i .. 4i+3, and 8/w consecutive chunks share a unit:
// unit u holds chunk (8/w) u + s at bit offset w s. A unit is 4m bytes, byte 4k + c holding row
// k, channel 4 * chunk + c. Panel p starts at byte 32 p U, where U = ceil(row_len / 4 * w / 8)
// units per panel; its unit u at + 4 m u. The plane is 4 n_rows U bytes.
// Why: one 32-byte load of a full panel gives 8 rows x 4 channels of 8/w chunks, so a score is
// an integer multiply-add of a broadcast 4-channel query slice with no horizontal reduction, and
// one byte shuffle per 32 codes turns the same bytes into 4 tokens per channel for accumulate.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/head_passes.h"

namespace argus {
enum class KernelPath : uint8_t;  // argus/codec.h, which brings std:: templates with it
}

namespace argus::codec_internal {

// Functions here are defined out of line in affine.cc (not inline): an inline function emitted
// by a kernel translation unit could be the copy the linker keeps for scalar callers too.
inline constexpr uint32_t kPanelRows = 8;
// Values under one scale: a block of a token's values, or the tokens of a channel group.
inline constexpr uint32_t kAffineGroup = 32;
inline constexpr uint32_t kMaxRowLen = 1024;  // = kMaxTileDim (checked in affine.cc)

uint32_t PanelUnits(uint32_t row_len, uint32_t bits);
size_t PlaneBytes(uint32_t n_rows, uint32_t row_len, uint32_t bits);
// The coded matrix of per-token blocks: [tokens, dim] when 32 divides dim, else [n_blocks, 32].
void TokenRows(uint32_t tokens, uint32_t dim, uint32_t* n_rows, uint32_t* row_len);

// Which planes make a code, most significant first.
enum class CodeLayout : uint8_t {
  kBits8,      // one 8-bit plane (int8)
  kBits4,      // one 4-bit plane (int4)
  kBits2,      // one 2-bit plane (int2, plane8/2)
  kPlanes224,  // plane8: 2 + 2 + 4 bits
  kPlanes22,   // plane8/4: 2 + 2 bits
};
uint32_t CodeBits(CodeLayout layout);
// Widths of the planes, most significant first; returns how many.
uint32_t PlaneWidths(CodeLayout layout, uint32_t widths[3]);

// Integer ranges of the AVX2 kernels per code width. Scores: query in [-kQueryMax, kQueryMax], so
// vpmaddubsw's pair sums of unsigned codes x query stay below 2^15. Accumulate: weights in
// [0, kWeightMax] against codes centred to signed, c - kCentre.
template <uint32_t kBits>
inline constexpr int kQueryMax = kBits == 8 ? 64 : 127;
template <uint32_t kBits>
inline constexpr int kWeightMax = kBits == 8 ? 127 : 255;
template <uint32_t kBits>
inline constexpr int kCentre = 1 << (kBits - 1);
// The AVX-512 kernels sum in int32 (vpdpbusd), which nothing here can overflow, so they take the
// widest ranges of the signed query and the unsigned weights at every width.
inline constexpr int kQueryMaxAvx512 = 127;
inline constexpr int kWeightMaxAvx512 = 255;

// f(Layout<C>{}) with the code layout as a compile-time constant; for the kernel files, whose
// copies have internal linkage so that each is compiled with its own file's instruction set.
template <CodeLayout C>
struct Layout {
  static constexpr CodeLayout kValue = C;
};
namespace {
template <typename F>
void ByCodeLayout(CodeLayout code, F f) {
  switch (code) {
    case CodeLayout::kBits8:
      return f(Layout<CodeLayout::kBits8>{});
    case CodeLayout::kBits4:
      return f(Layout<CodeLayout::kBits4>{});
    case CodeLayout::kBits2:
      return f(Layout<CodeLayout::kBits2>{});
    case CodeLayout::kPlanes224:
      return f(Layout<CodeLayout::kPlanes224>{});
    case CodeLayout::kPlanes22:
      return f(Layout<CodeLayout::kPlanes22>{});
  }
}
}  // namespace

// What the fp16 metadata holds. Token layouts index it by block in panel order:
// TokenMetaIndex(); the channel layout by (group, channel): (row / 32) * dim + channel.
enum class MetaLayout : uint8_t {
  kTokenScaleMin,    // x' = scale * code + min
  kTokenStep,        // x' = (code - (2^bits - 1) / 2) * d * step_mul   (symmetric, plane8)
  kChannelScaleMin,  // x' = scale * code + min, per 32 tokens of one channel
};

// A view of an encoded tile whose length has been checked.
struct CodedTile {
  CodeLayout code = CodeLayout::kBits8;
  MetaLayout meta = MetaLayout::kTokenScaleMin;
  uint32_t tokens = 0, dim = 0;       // the tile
  uint32_t n_rows = 0, row_len = 0;   // the coded matrix
  const std::byte* scales = nullptr;  // fp16 scales (kTokenStep: d)
  const std::byte* mins = nullptr;    // fp16 minimums; null for kTokenStep
  const std::byte* planes[3] = {};
  float step_mul = 1;  // kTokenStep: 2^(8 - bits)
};

// Index of the metadata of block (row, column j) for token layouts: panel by panel, column by
// column within a panel, row within the column, so a panel's 8 scales of one column are adjacent.
size_t TokenMetaIndex(uint32_t n_rows, uint32_t row_len, uint32_t row, uint32_t j);

// Panel p of every plane: each plane's units 32 bytes apart, as a full panel has them.
struct PanelView {
  const uint8_t* plane[3] = {};
  uint32_t rows = 0;
};

// The panels of a tile's planes, for the vector kernels.
struct PanelGeometry {
  uint32_t n_planes = 0, units[3] = {}, n_panels = 0;  // units of each plane per panel
  PanelView last;  // the last panel, copied into a pad with zero rows beyond its own when short
};
// Room for every plane of one panel with 32-byte units.
inline constexpr uint32_t kPadBytes = 32 * (kMaxRowLen / 4);
// REQUIRES: pad holds kPadBytes and outlives the result (a tile has at most one short panel).
PanelGeometry GeometryOf(const CodedTile& t, uint8_t* pad);

// Panel p into *panel, field by field (a copied struct reads back in wider loads than it was
// written with, which stalls store forwarding). Static: each kernel file compiles its own copy,
// so that none built with wider instructions can be the one the linker keeps for the others.
[[gnu::always_inline]] static inline void PanelAt(const CodedTile& t, const PanelGeometry& g,
                                                  uint32_t p, PanelView* panel) {
  const bool last = p + 1 == g.n_panels;
  panel->rows = last ? g.last.rows : kPanelRows;
  for (uint32_t i = 0; i < g.n_planes; ++i) {
    panel->plane[i] =
        last ? g.last.plane[i]
             : reinterpret_cast<const uint8_t*>(t.planes[i]) + size_t{32} * p * g.units[i];
  }
}

// Writes field (code >> shift) & (2^bits - 1) of every code of codes[n_rows][row_len] into a
// zeroed plane in panel layout.
void StorePanelPlane(const uint8_t* codes, uint32_t n_rows, uint32_t row_len, uint32_t bits,
                     uint32_t shift, std::byte* plane);

// fp16 bits of the nearest half at or above (below) x; x must lie within +-65504.
uint16_t HalfRoundUp(double x);
uint16_t HalfRoundDown(double x);
inline constexpr float kHalfMax = 65504.0f;
// True when every value is finite and within +-kHalfMax (what fp16 metadata can describe).
bool WithinHalfRange(const float* x, size_t n);

// ---- Kernels over a coded tile -------------------------------------------------------------
// The scalar versions (affine.cc) decode and are the specification. On `path` kAvx2 or kAvx512
// that path's integer kernels run when the tile's shape allows (token layouts: 32 | dim; channel:
// 16 | dim) and the inputs suit integer arithmetic (finite q with |q| <= 1e30; finite p in
// [0, 1e30]); otherwise the scalar ones do. q, s, p, acc as in Codec.
void PanelDecode(const CodedTile& tile, float* x);
void PanelScores(const CodedTile& tile, const float* q, uint32_t n_q, float* s, KernelPath path);
void PanelAccumulate(const CodedTile& tile, const float* p, uint32_t n_q, float* acc,
                     KernelPath path);

// The stated bound (CodecInfo::fused_rel_error) of the integer kernels of both paths; see
// affine.cc.
double PanelFusedRelError(CodeLayout code, MetaLayout meta);

// AVX2 kernels (affine_avx2.cc) and AVX-512 VNNI ones (affine_avx512.cc). REQUIRES: the
// conditions above.
void PanelScoresAvx2(const CodedTile& tile, const float* q, uint32_t n_q, float* s);
void PanelAccumulateAvx2(const CodedTile& tile, const float* p, uint32_t n_q, float* acc);
void PanelScoresAvx512(const CodedTile& tile, const float* q, uint32_t n_q, float* s);
void PanelAccumulateAvx512(const CodedTile& tile, const float* p, uint32_t n_q, float* acc);
// True when every x[i] is in [lo, hi] (NaN is not); the vector kernels' domain check.
bool AllWithinAvx2(const float* x, size_t n, float lo, float hi);
bool AllWithinAvx512(const float* x, size_t n, float lo, float hi);

// The scalar encoder's range of a group (affine.cc): min and max of x[0], x[stride], ...
// (count >= 1) as the in-order fold lo = min(lo, x), hi = max(hi, x).
void FoldRange(const float* x, size_t count, size_t stride, float* lo, float* hi);

// The AVX-512 encoder's pieces (affine_avx512.cc), each giving exactly the scalar encoder's
// result. REQUIRES: finite x.
// FoldRange of x[0 .. count), count >= 1.
void RangeAvx512(const float* x, size_t count, float* lo, float* hi);
// The same per channel d < dim over rows t < count of x[t * dim + d] (count >= 1).
void ColumnRangesAvx512(const float* x, uint32_t count, uint32_t dim, float* lo, float* hi);
// codes[i] = clamp(floor((x[i] - min) * inv_scale + 0.5), 0, max_code), i < n, for x >= min.
void CodesAvx512(const float* x, size_t n, float min, float inv_scale, float max_code,
                 uint8_t* codes);
// The same for one row of per-channel groups: min[d] and inv_scale[d] for x[d], d < dim.
void RowCodesAvx512(const float* x, uint32_t dim, const float* min, const float* inv_scale,
                    float max_code, uint8_t* codes);

}  // namespace argus::codec_internal
