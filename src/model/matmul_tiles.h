// The tiles of the vector matrix kernels, shared by matmul_avx2.cc and matmul_avx512.cc: each
// file compiles them with its own instruction set and its own block dots (internal linkage, never
// merged). Bit-identical to the scalar specification in matmul.cc: each output keeps the
// specification's accumulators (8 lanes; one for q4_0) fed in its order, so tiling rows and batch
// rows changes only how many accumulators are live, never a result.
//
// A tile of NR weight rows x NB batch rows loads each weight block once and uses it NB times:
// with more than one batch row two rows meet four batch rows at a time, so the weights, the big
// stream, are read from memory once per two rows while the activations come from cache. At batch
// 1 (decode) a tile is two rows from the two halves of a task's rows: two sequential streams far
// apart, which the hardware prefetcher follows (tiles of 2 or 4 neighbouring rows, prefetched in
// software or not, read Q8_0 rows of 896 and 4,864 values at 0.4-0.7x the speed of one row at a
// time), and two independent chains (a row alone waits on its chain of one FMA per block: two
// streams took 0.7-0.9x its time). Long float rows, kLongFloatRowBytes or more, run four
// neighbours at a time (FloatKernel::InterleavesDecodeRows): each row is a long stream of its own.
//
// q8_0 weights use integer dots against the activations quantised to Q8_0 blocks (as ggml does):
// a block dot gives 8 int32 lanes, lane l the exact sum of products 4l..4l+3, then one FMA per
// block with the product of the two scales. A block-dot type Q says how:
//   Q::Weights Q::Load(block)          prepares a weight block once for every batch row of a tile;
//   Q::Activation Q::Prepare(codes)    prepares an activation block once for every weight row;
//   __m256i Q::Dot(weights, activation).
// The activation blocks are prepared once per product, before the tiles run (QuantisedKernel::
// Prepare), with their scales as floats: every tile of every row then reads them ready.
//
// A tile of several neighbouring rows prefetches the next tile's weights: its rows are short
// streams that the hardware prefetcher picks up too late.
//
// q4_0 weights, packed eight rows at a time, run a kernel of their own (Q4_0GroupKernel): one
// row per lane.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/avx2_reduce.h"
#include "model/matmul.h"

namespace argus::model {
namespace {

constexpr uint32_t kQk = 32;
constexpr size_t kQ8Bytes = 34;
constexpr size_t kLongFloatRowBytes = 4096;  // see the file comment

// The fp16 at p, as 8 equal floats.
inline __m256 BroadcastHalf(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
}

// Fetches the next tile's weights (see the file comment).
inline void Prefetch(const std::byte* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// A Q8_0 activation block as Q's dot reads it, and its scale as a float.
template <typename Q>
typename Q::Activation PrepareBlock(const std::byte* block, float& scale) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  scale = _cvtsh_ss(d);
  return Q::Prepare(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)));
}

template <typename Q>
class QuantisedKernel {
  using Activation = typename Q::Activation;
  static_assert(sizeof(Activation) + sizeof(float) <= kPreparedBlockBytes);

 public:
  // xq's n_batch rows as the tiles read them: the prepared blocks [n_batch, n_blocks], then their
  // scales [n_batch, n_blocks] as floats.
  static void Prepare(const std::byte* xq, uint32_t n_batch, uint32_t n_cols, std::byte* prepared) {
    const size_t n_blocks = size_t{n_batch} * (n_cols / kQk);
    auto* x = reinterpret_cast<Activation*>(prepared);
    auto* dx = reinterpret_cast<float*>(x + n_blocks);
    for (size_t i = 0; i < n_blocks; ++i) x[i] = PrepareBlock<Q>(xq + i * kQ8Bytes, dx[i]);
  }

  // `prepared` as Prepare leaves it for n_batch rows.
  QuantisedKernel(const WeightMatrix& w, const std::byte* prepared, uint32_t n_batch, float* y)
      : w_(w),
        n_blocks_(w.n_cols / kQk),
        x_(reinterpret_cast<const Activation*>(prepared)),
        dx_(reinterpret_cast<const float*>(x_ + size_t{n_batch} * n_blocks_)),
        y_(y) {}

  // Rows r0, r0 + row_step, ... x batch rows b0 .. b0 + NB; the next tile is prefetched when the
  // rows are consecutive.
  template <int NR, int NB>
  void Tile(uint32_t r0, uint32_t b0, uint32_t row_step = 1) const {
    const std::byte* rows[NR];
    const Activation* xs[NB];
    const float* dxs[NB];
    for (int r = 0; r < NR; ++r) rows[r] = w_.data + size_t{r0 + r * row_step} * w_.row_bytes;
    for (int b = 0; b < NB; ++b) {
      xs[b] = x_ + size_t{b0 + b} * n_blocks_;
      dxs[b] = dx_ + size_t{b0 + b} * n_blocks_;
    }
    __m256 acc[NR][NB];
    for (auto& a : acc) {
      for (auto& v : a) v = _mm256_setzero_ps();
    }
    const size_t ahead = NR * w_.row_bytes;
    for (uint32_t k = 0; k < n_blocks_; ++k) {
      typename Q::Weights qw[NR];
      __m256 dw[NR];
      for (int r = 0; r < NR; ++r) {
        const std::byte* block = rows[r] + k * Q::kBlockBytes;
        if (NR > 1 && row_step == 1) Prefetch(block + ahead);
        qw[r] = Q::Load(block);
        dw[r] = BroadcastHalf(block);
      }
      for (int b = 0; b < NB; ++b) {
        const Activation& qx = xs[b][k];
        const __m256 dx = _mm256_broadcast_ss(dxs[b] + k);
        for (int r = 0; r < NR; ++r) {
          const __m256 sums = _mm256_cvtepi32_ps(Q::Dot(qw[r], qx));
          acc[r][b] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), sums, acc[r][b]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int b = 0; b < NB; ++b) {
        y_[size_t{b0 + b} * w_.n_rows + r0 + r * row_step] = avx2::HorizontalSum(acc[r][b]);
      }
    }
  }

 private:
  const WeightMatrix& w_;
  uint32_t n_blocks_;
  const Activation* x_;
  const float* dx_;
  float* y_;
};

// q4_0 in groups of eight rows (WeightLayout::kQ4_0Groups, matmul.cc): lane l of every vector
// is row 8g + l. A block column of a group takes four loads of codes for its 8 rows, 8 byte dots
// against the activation's codes broadcast four at a time, one conversion of the 8 scales and one
// FMA for the 8 outputs: the specification's one accumulator per row, in block order. The nibbles
// are unsigned (n = w + 8): the dots start from -8 sum x, prepared once per activation block.
// Dots::Add(acc, u, s) adds to each int32 lane of acc the exact sum of its four products u * s
// (unsigned by signed bytes).
//
// A tile is one group x NB batch rows: the group's codes are unpacked once for every batch row.
// At batch 1 a task's groups are one sequential stream.
template <typename Dots>
class Q4_0GroupKernel {
 public:
  struct Activation {
    int8_t codes[kQk];
    int32_t minus_eight_sum;
    float scale;
  };
  static_assert(sizeof(Activation) <= kPreparedBlockBytes);

  static void Prepare(const std::byte* xq, uint32_t n_batch, uint32_t n_cols, std::byte* prepared) {
    const size_t n_blocks = size_t{n_batch} * (n_cols / kQk);
    auto* x = reinterpret_cast<Activation*>(prepared);
    for (size_t i = 0; i < n_blocks; ++i) {
      const std::byte* block = xq + i * kQ8Bytes;
      std::memcpy(x[i].codes, block + 2, kQk);
      int32_t sum = 0;
      for (int8_t c : x[i].codes) sum += c;
      x[i].minus_eight_sum = -8 * sum;
      uint16_t d;
      std::memcpy(&d, block, 2);
      x[i].scale = _cvtsh_ss(d);
    }
  }

  // Writes rows [begin, end) only.
  Q4_0GroupKernel(const WeightMatrix& w, const std::byte* prepared, float* y, uint32_t begin,
                  uint32_t end)
      : w_(w),
        n_blocks_(w.n_cols / kQk),
        x_(reinterpret_cast<const Activation*>(prepared)),
        y_(y),
        begin_(begin),
        end_(end) {}

  // Group g x batch rows b0 .. b0 + NB (NR = 1: one group; BatchTiles' shape).
  template <int NR, int NB>
  void Tile(uint32_t g, uint32_t b0) const {
    static_assert(NR == 1);
    const std::byte* group = w_.data + size_t{g} * n_blocks_ * kQ4_0GroupBlockBytes;
    const Activation* xs[NB];
    for (int b = 0; b < NB; ++b) xs[b] = x_ + size_t{b0 + b} * n_blocks_;
    __m256 acc[NB];
    for (auto& a : acc) a = _mm256_setzero_ps();
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
    for (uint32_t k = 0; k < n_blocks_; ++k) {
      const std::byte* block = group + k * kQ4_0GroupBlockBytes;
      __m256i codes[8];  // [c]: the rows' codes 4c..4c+3; [4 + c]: 16 + 4c..
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * c));
        codes[c] = _mm256_and_si256(v, low_nibbles);
        codes[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibbles);
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
      for (int b = 0; b < NB; ++b) {
        const Activation& x = xs[b][k];
        // Two chains of four dots, so that each waits on half as many.
        __m256i low = _mm256_set1_epi32(x.minus_eight_sum), high = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          low = Dots::Add(low, codes[c], Broadcast4(x.codes + 4 * c));
          high = Dots::Add(high, codes[4 + c], Broadcast4(x.codes + 16 + 4 * c));
        }
        const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(x.scale));
        acc[b] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(low, high)), acc[b]);
      }
    }
    const uint32_t r0 = g * kQ4_0GroupRows;
    const uint32_t first = std::max(r0, begin_), last = std::min(r0 + kQ4_0GroupRows, end_);
    for (int b = 0; b < NB; ++b) {
      float* out = y_ + size_t{b0 + b} * w_.n_rows;
      if (first == r0 && last == r0 + kQ4_0GroupRows) {
        _mm256_storeu_ps(out + r0, acc[b]);
        continue;
      }
      alignas(32) float lanes[kQ4_0GroupRows];
      _mm256_store_ps(lanes, acc[b]);
      for (uint32_t r = first; r < last; ++r) out[r] = lanes[r - r0];
    }
  }

 private:
  // Four codes at p in every lane.
  static __m256i Broadcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }

  const WeightMatrix& w_;
  uint32_t n_blocks_;
  const Activation* x_;
  float* y_;
  uint32_t begin_, end_;
};

// Rows [r, r + NR) x all n_batch batch columns (batch rows, or pairs of them) in tiles of 4, 3, 2
// or 1; see the file comment for the shapes.
template <int NR, typename Kernel>
void BatchTiles(const Kernel& kernel, uint32_t r, uint32_t n_batch) {
  uint32_t b = 0;
  for (; b + 4 <= n_batch; b += 4) kernel.template Tile<NR, 4>(r, b);
  switch (n_batch - b) {
    case 3:
      kernel.template Tile<NR, 3>(r, b);
      break;
    case 2:
      kernel.template Tile<NR, 2>(r, b);
      break;
    case 1:
      kernel.template Tile<NR, 1>(r, b);
      break;
    default:
      break;
  }
}

// One batch row (decode): rows [begin, end) as two streams, or four neighbours at a time where the
// kernel says so (float kernels with long rows; see above).
template <typename Kernel>
void RunDecodeRows(const Kernel& kernel, uint32_t begin, uint32_t end) {
  uint32_t r = begin;
  if constexpr (requires { kernel.InterleavesDecodeRows(); }) {
    if (kernel.InterleavesDecodeRows()) {
      for (; r + 4 <= end; r += 4) kernel.template Tile<4, 1>(r, 0);
      for (; r < end; ++r) kernel.template Tile<1, 1>(r, 0);
      return;
    }
  }
  const uint32_t half = (end - begin) / 2;
  for (uint32_t i = 0; i < half; ++i) kernel.template Tile<2, 1>(begin + i, 0, half);
  if (begin + 2 * half < end) kernel.template Tile<1, 1>(end - 1, 0);
}

template <typename Kernel>
void RunTiles(const Kernel& kernel, uint32_t n_batch, uint32_t begin, uint32_t end) {
  if (n_batch == 1) return RunDecodeRows(kernel, begin, end);
  uint32_t r = begin;
  for (; r + 2 <= end; r += 2) BatchTiles<2>(kernel, r, n_batch);
  for (; r < end; ++r) BatchTiles<1>(kernel, r, n_batch);
}

// Rows [begin, end) of a q4_0 matrix in groups: the groups they touch, x all batch rows.
template <typename Dots>
void RunQ4_0Groups(const WeightMatrix& w, const std::byte* prepared, uint32_t n_batch,
                   uint32_t begin, uint32_t end, float* y) {
  const Q4_0GroupKernel<Dots> kernel(w, prepared, y, begin, end);
  for (uint32_t g = begin / kQ4_0GroupRows; g * kQ4_0GroupRows < end; ++g) {
    BatchTiles<1>(kernel, g, n_batch);
  }
}

}  // namespace
}  // namespace argus::model
