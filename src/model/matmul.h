// Weight-matrix products for the model runner: y = W x for a block of activation rows, with W in
// a ggml type (F32, F16, BF16, Q8_0, Q4_0). Quantised weights use integer dot products against
// the activations quantised to Q8_0 blocks (as ggml does); float weights use float dot products.
// The scalar kernels in matmul.cc are the specification; matmul_avx2.cc and matmul_avx512.cc
// (VNNI integer dots) compute the same bits faster. The vector kernels read q4_0 matrices packed
// eight rows at a time (PackForMatMul), as ggml's CPU backend repacks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "argus/core.h"
#include "argus/gguf.h"
#include "argus/status.h"
#include "core/buffer.h"

namespace argus::model {

// How a matrix's bytes are laid out: kRows, row after row as GGUF stores them; kQ4_0Groups (q4_0
// only), rows packed eight at a time so that a vector's lane l holds row 8g + l (matmul.cc gives
// the bytes).
enum class WeightLayout : uint8_t { kRows, kQ4_0Groups };

// A weight matrix [n_rows, n_cols] (GGUF: ne[0] = n_cols, ne[1] = n_rows).
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  uint32_t n_rows = 0, n_cols = 0;
  size_t row_bytes = 0;  // bytes of one encoded row (in either layout, its share)
  const std::byte* data = nullptr;
  WeightLayout layout = WeightLayout::kRows;
};
// A view of a 2-D GGUF tensor; InvalidArgument naming the tensor for another rank, an unsupported
// type, or a row length the type cannot hold (quantised types need n_cols % 32 == 0).
Result<WeightMatrix> MatrixOf(const GgufTensor& tensor);

// A matrix as the product kernels read it best: q4_0 packed into groups of eight rows, held in
// `storage` (the rows past the last group's end are zeros), the groups split over `pool` when one
// is given; any other type the same view, storage empty. ResourceExhausted when the storage
// cannot be had.
struct MatMulWeights {
  WeightMatrix matrix;
  AlignedBuffer storage;
};
Result<MatMulWeights> PackForMatMul(const WeightMatrix& w, ThreadPool* pool = nullptr);
inline constexpr uint32_t kQ4_0GroupRows = 8;
inline constexpr size_t kQ4_0GroupBlockBytes = 144;  // one block column of a group: 8 x 18 bytes

// Scratch reused across products: the activations quantised to Q8_0 blocks and prepared for the
// kernels. Grows on demand.
class MatMulScratch {
 public:
  std::byte* Reserve(size_t n_bytes);

 private:
  AlignedBuffer buffer_;
};
// The scratch bytes a product of n_batch rows of n_cols values needs.
size_t MatMulScratchBytes(uint32_t n_batch, uint32_t n_cols);

// y[b][r] = sum_c W[r][c] * x[b][c] for b < n_batch. x: [n_batch, n_cols], y: [n_batch, n_rows].
// Rows are split over the pool in fixed chunks: the result is bit-identical for every thread
// count, and the same for a q4_0 matrix in either layout (one in rows runs the scalar kernels:
// pack it). REQUIRES: n_batch >= 1, x and y do not overlap.
void MatMul(const WeightMatrix& w, const float* x, uint32_t n_batch, float* y, ThreadPool& pool,
            MatMulScratch& scratch);

// Row `row` of W dequantised to floats (embedding lookup), in either layout. out: [n_cols].
void DequantizeRow(const WeightMatrix& w, uint32_t row, float* out);

// The kernels, exposed for tests and the microbenchmark. For quantised weights a product runs in
// two steps: PrepareActivations turns x quantised by QuantizeRowsQ8_0 into what `path`'s kernels
// read, once for every weight row (the vector paths: each block's codes beside the correction its
// integer dot needs, and its scale as a float), then MatMulRowsPrepared computes y for rows
// [begin, end) of W (float weights read x and ignore `prepared`). MatMulRows does both, in a
// scratch of its own. The vector paths read q4_0 only in groups (PackForMatMul); given one in
// rows they write NaNs.
enum class MatMulPath : uint8_t { kScalar, kAvx2, kAvx512 };
MatMulPath BestMatMulPath();  // as BestKernelPath()
// The most bytes any path prepares per Q8_0 block: codes and a correction of 8 int32 lanes, and
// the scale as a float.
inline constexpr size_t kPreparedBlockBytes = 68;
// For any path and type (the AVX-512 path prepares batch rows in pairs: an odd count is rounded
// up).
size_t PreparedActivationBytes(uint32_t n_batch, uint32_t n_cols);
// Returns what the kernels read: `prepared`, or xq itself on the scalar path.
const std::byte* PrepareActivations(MatMulPath path, GgmlType type, const std::byte* xq,
                                    uint32_t n_batch, uint32_t n_cols, std::byte* prepared);
void MatMulRowsPrepared(MatMulPath path, const WeightMatrix& w, const float* x,
                        const std::byte* prepared, uint32_t n_batch, uint32_t begin, uint32_t end,
                        float* y);
void MatMulRows(MatMulPath path, const WeightMatrix& w, const float* x, const std::byte* xq,
                uint32_t n_batch, uint32_t begin, uint32_t end, float* y);
// The vector paths (matmul_avx2.cc, matmul_avx512.cc), as PrepareActivations and
// MatMulRowsPrepared.
void PrepareActivationsAvx2(GgmlType type, const std::byte* xq, uint32_t n_batch, uint32_t n_cols,
                            std::byte* prepared);
void MatMulRowsAvx2(const WeightMatrix& w, const float* x, const std::byte* prepared,
                    uint32_t n_batch, uint32_t begin, uint32_t end, float* y);
void PrepareActivationsAvx512(GgmlType type, const std::byte* xq, uint32_t n_batch, uint32_t n_cols,
                              std::byte* prepared);
void MatMulRowsAvx512(const WeightMatrix& w, const float* x, const std::byte* prepared,
                      uint32_t n_batch, uint32_t begin, uint32_t end, float* y);
// x: [n_batch, n_cols] -> n_batch rows of n_cols/32 Q8_0 blocks (ggml's block_q8_0 layout,
// quantize_row_q8_0_ref rounding). REQUIRES: n_cols % 32 == 0.
void QuantizeRowsQ8_0(const float* x, uint32_t n_batch, uint32_t n_cols, std::byte* out);
// The same bytes on `path`'s vector units (both vector paths run the AVX2 kernel): the scale and
// the rounding are exact operations, and a block holding a NaN, whose amax depends on the order of
// ggml's comparisons, goes through QuantizeBlockQ8_0.
void QuantizeRowsQ8_0(MatMulPath path, const float* x, uint32_t n_batch, uint32_t n_cols,
                      std::byte* out);
void QuantizeRowsQ8_0Avx2(const float* x, uint32_t n_batch, uint32_t n_cols, std::byte* out);
// One block of 32 values, as QuantizeRowsQ8_0.
void QuantizeBlockQ8_0(const float* v, std::byte* block);
size_t QuantizedRowBytes(uint32_t n_cols);  // n_cols / 32 * 34

}  // namespace argus::model
