// Weight-matrix products: the scalar kernels (the specification), activation quantisation, the
// thread-pool split and path selection. matmul_avx2.cc computes the same results bit for bit.
//
// Every output y[b][r] is one dot product with a fixed evaluation order, the same on both paths
// and for any grouping of rows, batch rows or threads:
//   float weights (f32, f16, bf16; f16/bf16 widen exactly): column c goes to lane c % 8,
//     lane[l] = fma(w[c], x[c], lane[l]) in column order (the row zero-padded to a multiple of
//     8 columns);
//   q8_0 weights against x quantised to q8_0: per 32-column block k, with d = float(d_w[k]) *
//     float(d_x[k]) rounded to float, lane l takes the exact integer sum of the block's products
//     4l..4l+3: lane[l] = fma(d, float(isum), lane[l]) in block order (what _mm256_madd_epi16 of
//     _mm256_maddubs_epi16 leaves in lane l);
// then y = ((lane0 + lane4) + (lane2 + lane6)) + ((lane1 + lane5) + (lane3 + lane7)), the order
// of avx2::HorizontalSum;
//   q4_0 weights against x quantised to q8_0: y = fma(d, float(isum), y) in block order from
//     y = 0, d as for q8_0 and isum the exact integer sum of the block's 32 products (the vector
//     kernels hold eight rows in the lanes of one register, so a row has one accumulator).
//
// Block layouts are ggml's (ggml-common.h), little-endian:
//   q8_0 34 bytes: fp16 d, int8 q[32]      value j = q[j] * d
//   q4_0 18 bytes: fp16 d, uint8 qs[16]    value j = (n_j - 8) * d, n_j the low nibble of qs[j]
//                                          for j < 16 and the high nibble of qs[j - 16]
// q4_0 in groups (WeightLayout::kQ4_0Groups): rows 8g..8g+7 are group g (rows past the matrix's
// end zero), the groups one after another, each n_cols/32 block columns of 144 bytes: the 8 rows'
// fp16 d (row 8g+l's at byte 2l), then 128 bytes of nibbles, byte 16 + 32c + 4l + i holding row
// 8g+l's n_j for j = 4c + i in its low half and for j = 16 + 4c + i in its high half (c < 4,
// i < 4). A vector load at 16 + 32c is then 8 lanes of four codes, one lane per row, which meet
// the activation's codes 4c..4c+3 (or 16+4c..) broadcast to every lane.
// The codec library has the same blocks (src/codec/ggml.cc), but its encoders are private to
// that file and its public Codec limits rows to 1024 values and refuses non-finite input, so the
// q8_0 activation quantiser is restated here (quantize_row_q8_0_ref, checked against the oracle).
#include "model/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

#include "argus/codec.h"
#include "argus/core.h"
#include "core/buffer.h"
#include "core/checked.h"

namespace argus::model {

namespace {

constexpr uint32_t kQk = 32;      // values per quantised block
constexpr size_t kQ8Bytes = 34;   // fp16 d + 32 int8
constexpr size_t kQ4Bytes = 18;   // fp16 d + 16 bytes of nibbles
constexpr uint32_t kLanes = 8;    // lanes of the accumulators (one AVX2 register)
constexpr size_t kRowChunk = 16;  // rows per pool task with more than one batch row

uint16_t LoadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

bool IsQuantised(GgmlType type) { return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0; }

// The quantised activations' bytes in the scratch, rounded up so the prepared ones after them
// stay aligned for the vector loads.
size_t AlignedQuantizedBytes(uint32_t n_batch, uint32_t n_cols) {
  return (size_t{n_batch} * QuantizedRowBytes(n_cols) + kBufferAlign - 1) / kBufferAlign *
         kBufferAlign;
}

// Out of memory for a scratch smaller than x itself: no result can be computed and these
// interfaces have no error channel, so the failure shows as NaN outputs, never as a crash.
void FillNaN(const WeightMatrix& w, uint32_t n_batch, uint32_t begin, uint32_t end, float* y) {
  for (uint32_t b = 0; b < n_batch; ++b) {
    std::fill(y + size_t{b} * w.n_rows + begin, y + size_t{b} * w.n_rows + end,
              std::numeric_limits<float>::quiet_NaN());
  }
}

float LaneSum(const float* lane) {
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// C's float -> int8_t conversion as ggml's x86-64 build performs it (cvttss2si, then the low
// byte). Only degenerate blocks (1/d overflowing, NaN) reach values outside [-127, 127].
int8_t TruncToInt8(float f) {
  const int32_t i = (f > -2147483904.0f && f < 2147483648.0f) ? static_cast<int32_t>(f) : INT32_MIN;
  return static_cast<int8_t>(i);  // modular (C++20)
}

// Where row 8g + l's q4_0 block (18 bytes, as GGUF stores it) lies in its group's block column:
// copy(offset in the block, offset in the column, bytes) for its scale and its 4 runs of code
// bytes (a code byte holds nibbles j and 16 + j in both layouts).
template <typename Copy>
void ForEachGroupPiece(uint32_t l, Copy copy) {
  copy(0, 2 * l, 2);
  for (uint32_t c = 0; c < 4; ++c) copy(2 + 4 * c, 16 + 32 * c + 4 * l, 4);
}

// Block k of row r: its 32 values in units of its scale, and the scale's fp16 bits.
uint16_t BlockOf(const WeightMatrix& w, uint32_t r, uint32_t k, int8_t* codes) {
  std::byte gathered[kQ4Bytes];
  const std::byte* block;
  if (w.layout == WeightLayout::kQ4_0Groups) {
    const std::byte* column =
        w.data + (size_t{r / kQ4_0GroupRows} * (w.n_cols / kQk) + k) * kQ4_0GroupBlockBytes;
    ForEachGroupPiece(r % kQ4_0GroupRows, [&](size_t at, size_t from, size_t n) {
      std::memcpy(gathered + at, column + from, n);
    });
    block = gathered;
  } else {
    block = w.data + r * w.row_bytes + k * (w.type == GgmlType::kQ8_0 ? kQ8Bytes : kQ4Bytes);
  }
  if (w.type == GgmlType::kQ8_0) {
    std::memcpy(codes, block + 2, kQk);
  } else {
    for (uint32_t j = 0; j < kQk / 2; ++j) {
      const auto byte = std::to_integer<uint8_t>(block[2 + j]);
      codes[j] = static_cast<int8_t>((byte & 0xf) - 8);
      codes[j + kQk / 2] = static_cast<int8_t>((byte >> 4) - 8);
    }
  }
  return LoadU16(block);
}

float WeightAt(GgmlType type, const std::byte* row, uint32_t c) {
  switch (type) {
    case GgmlType::kF16:
      return HalfToFloat(LoadU16(row + 2 * size_t{c}));
    case GgmlType::kBF16:
      return Bf16ToFloat(LoadU16(row + 2 * size_t{c}));
    default: {
      float v;
      std::memcpy(&v, row + 4 * size_t{c}, 4);
      return v;
    }
  }
}

float FloatDot(GgmlType type, const std::byte* row, const float* x, uint32_t n_cols) {
  float lane[kLanes] = {};
  const uint32_t padded = (n_cols + kLanes - 1) / kLanes * kLanes;
  for (uint32_t c = 0; c < padded; ++c) {
    const bool in = c < n_cols;
    lane[c % kLanes] =
        std::fma(in ? WeightAt(type, row, c) : 0.0f, in ? x[c] : 0.0f, lane[c % kLanes]);
  }
  return LaneSum(lane);
}

float QuantisedDot(const WeightMatrix& w, uint32_t r, const std::byte* xq) {
  float lane[kLanes] = {}, y = 0.0f;
  int8_t codes[kQk];
  for (uint32_t k = 0; k < w.n_cols / kQk; ++k) {
    const std::byte* xb = xq + k * kQ8Bytes;
    const float d = HalfToFloat(BlockOf(w, r, k, codes)) * HalfToFloat(LoadU16(xb));
    int32_t isum[kLanes] = {};
    for (uint32_t j = 0; j < kQk; ++j) {
      isum[j / 4] +=
          int32_t{codes[j]} * int32_t{static_cast<int8_t>(std::to_integer<uint8_t>(xb[2 + j]))};
    }
    if (w.type == GgmlType::kQ4_0) {
      y = std::fma(d, static_cast<float>(std::accumulate(isum, isum + kLanes, 0)), y);
    } else {
      for (uint32_t l = 0; l < kLanes; ++l) {
        lane[l] = std::fma(d, static_cast<float>(isum[l]), lane[l]);
      }
    }
  }
  return w.type == GgmlType::kQ4_0 ? y : LaneSum(lane);
}

void MatMulRowsScalar(const WeightMatrix& w, const float* x, const std::byte* xq, uint32_t n_batch,
                      uint32_t begin, uint32_t end, float* y) {
  const bool quantised = IsQuantised(w.type);
  const size_t xq_row_bytes = QuantizedRowBytes(w.n_cols);
  for (uint32_t r = begin; r < end; ++r) {
    for (uint32_t b = 0; b < n_batch; ++b) {
      y[size_t{b} * w.n_rows + r] = quantised ? QuantisedDot(w, r, xq + b * xq_row_bytes)
                                              : FloatDot(w.type, w.data + r * w.row_bytes,
                                                         x + size_t{b} * w.n_cols, w.n_cols);
    }
  }
}

}  // namespace

Result<WeightMatrix> MatrixOf(const GgufTensor& tensor) {
  const std::string what = "tensor '" + tensor.name + "'";
  if (tensor.dims.size() != 2) {
    return Status::InvalidArgument(what + " has " + std::to_string(tensor.dims.size()) +
                                   " dimensions; a weight matrix has 2");
  }
  const uint64_t n_cols = tensor.dims[0], n_rows = tensor.dims[1];
  if (n_cols == 0 || n_rows == 0 || n_cols > std::numeric_limits<uint32_t>::max() ||
      n_rows > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument(what + " has shape [" + std::to_string(n_rows) + ", " +
                                   std::to_string(n_cols) +
                                   "]; a weight matrix needs 1..2^32-1 rows and columns");
  }
  size_t block_values = 1, block_bytes = 0;
  switch (tensor.type) {
    case GgmlType::kF32:
      block_bytes = 4;
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      block_bytes = 2;
      break;
    case GgmlType::kQ8_0:
      block_values = kQk;
      block_bytes = kQ8Bytes;
      break;
    case GgmlType::kQ4_0:
      block_values = kQk;
      block_bytes = kQ4Bytes;
      break;
    default: {
      auto info = GgmlTypeInfoOf(static_cast<uint32_t>(tensor.type));
      const std::string name =
          info.ok() ? std::string(info->name) : std::to_string(static_cast<uint32_t>(tensor.type));
      return Status::InvalidArgument(what + " has type " + name +
                                     "; matrix products support f32, f16, bf16, q8_0 and q4_0");
    }
  }
  if (n_cols % block_values != 0) {
    return Status::InvalidArgument(what + " has rows of " + std::to_string(n_cols) +
                                   " values; its type needs a multiple of " +
                                   std::to_string(block_values));
  }
  WeightMatrix w;
  w.type = tensor.type;
  w.n_rows = static_cast<uint32_t>(n_rows);
  w.n_cols = static_cast<uint32_t>(n_cols);
  w.row_bytes = n_cols / block_values * block_bytes;
  ARGUS_ASSIGN_OR_RETURN(const size_t n_bytes, CheckedMul(w.row_bytes, n_rows, what + " size"));
  if (tensor.data.size() != n_bytes) {
    return Status::InvalidArgument(what + " holds " + std::to_string(tensor.data.size()) +
                                   " bytes; its shape and type need " + std::to_string(n_bytes));
  }
  w.data = tensor.data.data();
  return w;
}

std::byte* MatMulScratch::Reserve(size_t n_bytes) {
  if (buffer_.size() < n_bytes) {
    auto grown = AlignedBuffer::Allocate(n_bytes);
    if (!grown.ok()) return nullptr;
    buffer_ = std::move(grown).value();
  }
  return buffer_.data();
}

size_t QuantizedRowBytes(uint32_t n_cols) { return n_cols / kQk * kQ8Bytes; }

// An even number of rows: the AVX-512 kernels prepare batch rows in pairs.
size_t PreparedActivationBytes(uint32_t n_batch, uint32_t n_cols) {
  return size_t{(n_batch + 1) / 2 * 2} * (n_cols / kQk) * kPreparedBlockBytes;
}

size_t MatMulScratchBytes(uint32_t n_batch, uint32_t n_cols) {
  return AlignedQuantizedBytes(n_batch, n_cols) + PreparedActivationBytes(n_batch, n_cols);
}

// quantize_row_q8_0_ref: d = amax / 127 stored as fp16; codes round(x * (1/d)) with the float d
// before its fp16 rounding. amax uses ggml's MAX(a, b) = a > b ? a : b, which lets a NaN through
// exactly as ggml does.
void QuantizeBlockQ8_0(const float* v, std::byte* block) {
  float amax = 0.0f;
  for (uint32_t j = 0; j < kQk; ++j) {
    const float a = std::fabs(v[j]);
    amax = amax > a ? amax : a;
  }
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = FloatToHalf(d);
  std::memcpy(block, &h, 2);
  for (uint32_t j = 0; j < kQk; ++j) {
    block[2 + j] = static_cast<std::byte>(TruncToInt8(std::round(v[j] * id)));
  }
}

void QuantizeRowsQ8_0(const float* x, uint32_t n_batch, uint32_t n_cols, std::byte* out) {
  const size_t n_blocks = size_t{n_batch} * (n_cols / kQk);
  for (size_t i = 0; i < n_blocks; ++i) QuantizeBlockQ8_0(x + i * kQk, out + i * kQ8Bytes);
}

void QuantizeRowsQ8_0(MatMulPath path, const float* x, uint32_t n_batch, uint32_t n_cols,
                      std::byte* out) {
  if (path == MatMulPath::kScalar) return QuantizeRowsQ8_0(x, n_batch, n_cols, out);
  QuantizeRowsQ8_0Avx2(x, n_batch, n_cols, out);
}

MatMulPath BestMatMulPath() {
  switch (BestKernelPath()) {
    case KernelPath::kAvx512:
      return MatMulPath::kAvx512;
    case KernelPath::kAvx2:
      return MatMulPath::kAvx2;
    default:
      return MatMulPath::kScalar;
  }
}

const std::byte* PrepareActivations(MatMulPath path, GgmlType type, const std::byte* xq,
                                    uint32_t n_batch, uint32_t n_cols, std::byte* prepared) {
  switch (path) {
    case MatMulPath::kAvx512:
      PrepareActivationsAvx512(type, xq, n_batch, n_cols, prepared);
      return prepared;
    case MatMulPath::kAvx2:
      PrepareActivationsAvx2(type, xq, n_batch, n_cols, prepared);
      return prepared;
    case MatMulPath::kScalar:
      break;
  }
  return xq;  // the scalar kernels read the Q8_0 blocks as they are
}

void MatMulRowsPrepared(MatMulPath path, const WeightMatrix& w, const float* x,
                        const std::byte* prepared, uint32_t n_batch, uint32_t begin, uint32_t end,
                        float* y) {
  if (path != MatMulPath::kScalar && w.type == GgmlType::kQ4_0 &&
      w.layout != WeightLayout::kQ4_0Groups) {
    return FillNaN(w, n_batch, begin, end, y);  // see matmul.h
  }
  switch (path) {
    case MatMulPath::kAvx512:
      return MatMulRowsAvx512(w, x, prepared, n_batch, begin, end, y);
    case MatMulPath::kAvx2:
      return MatMulRowsAvx2(w, x, prepared, n_batch, begin, end, y);
    case MatMulPath::kScalar:
      break;
  }
  MatMulRowsScalar(w, x, prepared, n_batch, begin, end, y);
}

void MatMulRows(MatMulPath path, const WeightMatrix& w, const float* x, const std::byte* xq,
                uint32_t n_batch, uint32_t begin, uint32_t end, float* y) {
  MatMulScratch scratch;
  const std::byte* prepared = nullptr;
  if (IsQuantised(w.type)) {
    std::byte* space = scratch.Reserve(PreparedActivationBytes(n_batch, w.n_cols));
    if (space == nullptr) return FillNaN(w, n_batch, begin, end, y);
    prepared = PrepareActivations(path, w.type, xq, n_batch, w.n_cols, space);
  }
  MatMulRowsPrepared(path, w, x, prepared, n_batch, begin, end, y);
}

// Rows per pool task (a row's result never depends on it). One batch row (decode) streams the
// weights once, and a task's rows are one stream: long tasks keep it long enough for the hardware
// prefetcher (16-row tasks, handed out in turn, left each thread a stream broken every 15 KB of
// Q8_0 and at a third to half of the read bandwidth), two per thread so a thread the machine
// delays is helped out.
size_t RowChunk(uint32_t n_rows, uint32_t n_batch, size_t n_threads) {
  if (n_batch > 1) return kRowChunk;
  const size_t per_task = (n_rows + 2 * n_threads - 1) / (2 * n_threads);
  return (per_task + kRowChunk - 1) / kRowChunk * kRowChunk;
}

void MatMul(const WeightMatrix& w, const float* x, uint32_t n_batch, float* y, ThreadPool& pool,
            MatMulScratch& scratch) {
  const bool unpacked_q4_0 = w.type == GgmlType::kQ4_0 && w.layout != WeightLayout::kQ4_0Groups;
  const MatMulPath path = unpacked_q4_0 ? MatMulPath::kScalar : BestMatMulPath();
  const std::byte* prepared = nullptr;
  if (IsQuantised(w.type)) {
    std::byte* xq = scratch.Reserve(MatMulScratchBytes(n_batch, w.n_cols));
    if (xq == nullptr) return FillNaN(w, n_batch, 0, w.n_rows, y);
    // A batch's rows are quantised on the pool (each row's bytes are its own).
    const size_t row_bytes = QuantizedRowBytes(w.n_cols);
    pool.ParallelFor(n_batch, 1, [&](size_t, size_t begin, size_t end) {
      QuantizeRowsQ8_0(path, x + begin * w.n_cols, static_cast<uint32_t>(end - begin), w.n_cols,
                       xq + begin * row_bytes);
    });
    prepared = PrepareActivations(path, w.type, xq, n_batch, w.n_cols,
                                  xq + AlignedQuantizedBytes(n_batch, w.n_cols));
  }
  pool.ParallelFor(w.n_rows, RowChunk(w.n_rows, n_batch, pool.n_threads()),
                   [&](size_t, size_t begin, size_t end) {
                     MatMulRowsPrepared(path, w, x, prepared, n_batch, static_cast<uint32_t>(begin),
                                        static_cast<uint32_t>(end), y);
                   });
}

void DequantizeRow(const WeightMatrix& w, uint32_t row, float* out) {
  if (!IsQuantised(w.type)) {
    const std::byte* data = w.data + size_t{row} * w.row_bytes;
    for (uint32_t c = 0; c < w.n_cols; ++c) out[c] = WeightAt(w.type, data, c);
    return;
  }
  int8_t codes[kQk];
  for (uint32_t k = 0; k < w.n_cols / kQk; ++k) {
    const float d = HalfToFloat(BlockOf(w, row, k, codes));
    for (uint32_t j = 0; j < kQk; ++j) out[k * kQk + j] = static_cast<float>(codes[j]) * d;
  }
}

Result<MatMulWeights> PackForMatMul(const WeightMatrix& w, ThreadPool* pool) {
  MatMulWeights packed{.matrix = w};
  if (w.type != GgmlType::kQ4_0 || w.layout == WeightLayout::kQ4_0Groups) return packed;
  const uint32_t n_blocks = w.n_cols / kQk,
                 n_groups = (w.n_rows + kQ4_0GroupRows - 1) / kQ4_0GroupRows;
  const size_t group_bytes = size_t{n_blocks} * kQ4_0GroupBlockBytes;
  ARGUS_ASSIGN_OR_RETURN(packed.storage, AlignedBuffer::Allocate(n_groups * group_bytes));
  std::byte* const out = packed.storage.data();
  if (w.n_rows % kQ4_0GroupRows != 0) {  // the last group's missing rows are zeros
    std::memset(out + (n_groups - 1) * group_bytes, 0, group_bytes);
  }
  auto pack_groups = [&](size_t, size_t begin, size_t end) {
    const size_t first_row = begin * kQ4_0GroupRows;
    const size_t last_row = std::min<size_t>(end * kQ4_0GroupRows, w.n_rows);
    for (size_t r = first_row; r < last_row; ++r) {
      std::byte* group = out + r / kQ4_0GroupRows * group_bytes;
      for (uint32_t k = 0; k < n_blocks; ++k) {
        const std::byte* block = w.data + r * w.row_bytes + k * kQ4Bytes;
        std::byte* column = group + k * kQ4_0GroupBlockBytes;
        ForEachGroupPiece(r % kQ4_0GroupRows, [&](size_t at, size_t to, size_t n) {
          std::memcpy(column + to, block + at, n);
        });
      }
    }
  };
  // Chunks of 64 groups (about 1 MiB of a 4096-column matrix): each task a sequential stream.
  if (pool != nullptr) {
    pool->ParallelFor(n_groups, 64, pack_groups);
  } else {
    pack_groups(0, 0, n_groups);
  }
  packed.matrix.data = out;
  packed.matrix.layout = WeightLayout::kQ4_0Groups;
  return packed;
}

}  // namespace argus::model
