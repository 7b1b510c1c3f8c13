// Weight-matrix products (src/model/matmul.h) against double-precision references computed from
// independently decoded weights: the codec library's q8_0/q4_0 decoders (checked against ggml's
// oracle in codec_ggml_test.cc) and argus's fp16/bf16 conversions.
#include "model/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "argus/codec.h"
#include "argus/core.h"
#include "test_util.h"

namespace argus::model {
namespace {

constexpr uint32_t kQk = 32;
constexpr uint32_t kMaxBatch = 8;

const char* Name(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return "f32";
    case GgmlType::kF16:
      return "f16";
    case GgmlType::kBF16:
      return "bf16";
    case GgmlType::kQ8_0:
      return "q8_0";
    default:
      return "q4_0";
  }
}

bool IsQuantised(GgmlType type) { return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0; }

constexpr GgmlType kTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                               GgmlType::kQ4_0};

std::vector<MatMulPath> Paths() {
  std::vector<MatMulPath> paths = {MatMulPath::kScalar};
  if (GetCpuFeatures().avx2_kernels()) paths.push_back(MatMulPath::kAvx2);
  if (GetCpuFeatures().avx512_kernels()) paths.push_back(MatMulPath::kAvx512);
  return paths;
}

const char* Name(MatMulPath path) {
  switch (path) {
    case MatMulPath::kAvx512:
      return "avx512";
    case MatMulPath::kAvx2:
      return "avx2";
    case MatMulPath::kScalar:
      break;
  }
  return "scalar";
}

// The codec library's q8_0/q4_0 codec encodes [n_blocks, 32] tiles as consecutive ggml blocks.
std::unique_ptr<Codec> BlockCodec(GgmlType type) {
  return testing::MakeCodec(type == GgmlType::kQ8_0 ? "q8_0" : "q4_0", KernelPath::kScalar);
}

std::vector<float> DecodeBlocks(GgmlType type, const std::vector<std::byte>& bytes,
                                uint32_t n_blocks) {
  auto codec = BlockCodec(type);
  return testing::DecodeTile(*codec, bytes, {n_blocks, kQk});
}

// A random weight matrix [n_rows, n_cols] encoded in `type`, its GGUF tensor, and its values
// decoded independently of matmul.cc; `w` as the product kernels read it (PackForMatMul), `rows`
// as GGUF stores it.
struct TestMatrix {
  std::vector<std::byte> bytes;
  std::vector<float> decoded;  // [n_rows, n_cols]
  GgufTensor tensor;
  WeightMatrix rows, w;
  MatMulWeights packed;

  TestMatrix(GgmlType type, uint32_t n_rows, uint32_t n_cols, uint64_t salt) {
    const size_t n = size_t{n_rows} * n_cols;
    decoded = testing::RandomValues(n, salt, 0.5f);
    switch (type) {
      case GgmlType::kF32:
        bytes.resize(4 * n);
        std::memcpy(bytes.data(), decoded.data(), bytes.size());
        break;
      case GgmlType::kF16:
      case GgmlType::kBF16:
        bytes.resize(2 * n);
        for (size_t i = 0; i < n; ++i) {
          const bool f16 = type == GgmlType::kF16;
          const uint16_t h = f16 ? FloatToHalf(decoded[i]) : FloatToBf16(decoded[i]);
          std::memcpy(&bytes[2 * i], &h, 2);
          decoded[i] = f16 ? HalfToFloat(h) : Bf16ToFloat(h);
        }
        break;
      default: {
        const auto n_blocks = static_cast<uint32_t>(n / kQk);
        bytes = testing::EncodeTile(*BlockCodec(type), decoded, {n_blocks, kQk});
        decoded = DecodeBlocks(type, bytes, n_blocks);
      }
    }
    tensor.name = "blk.0.test.weight";
    tensor.type = type;
    tensor.dims = {n_cols, n_rows};
    tensor.n_values = n;
    tensor.data = bytes;
    auto matrix = MatrixOf(tensor);
    EXPECT_TRUE(matrix.ok()) << matrix.status().ToString();
    if (!matrix.ok()) return;
    rows = *matrix;
    packed = PackForMatMul(rows).value();
    w = packed.matrix;
  }
};

// Activations [kMaxBatch, n_cols], quantised, and the quantised values decoded by the codec.
struct TestActivations {
  std::vector<float> x, xq_values;
  std::vector<std::byte> xq;

  TestActivations(uint32_t n_cols, uint64_t salt, bool quantise) {
    x = testing::RandomValues(size_t{kMaxBatch} * n_cols, salt);
    if (!quantise) return;
    xq.resize(kMaxBatch * QuantizedRowBytes(n_cols));
    QuantizeRowsQ8_0(x.data(), kMaxBatch, n_cols, xq.data());
    xq_values = DecodeBlocks(GgmlType::kQ8_0, xq, kMaxBatch * n_cols / kQk);
  }
};

std::vector<float> Product(MatMulPath path, const TestMatrix& m, const TestActivations& a,
                           uint32_t n_batch) {
  std::vector<float> y(size_t{n_batch} * m.w.n_rows);
  MatMulRows(path, m.w, a.x.data(), a.xq.empty() ? nullptr : a.xq.data(), n_batch, 0, m.w.n_rows,
             y.data());
  return y;
}

bool BitsEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The largest |x - x_q| of each value's block: ggml's q8_0 rounds x / d to the nearest code with
// d = amax / 127 (so within d/2, plus float rounding of x * (1/d)), then stores d as fp16 d_h,
// which moves a code q by |q| |d - d_h| <= 127 |d - d_h|.
std::vector<double> ActivationErrorBounds(const std::vector<float>& x,
                                          const std::vector<std::byte>& xq) {
  std::vector<double> bound(x.size());
  for (size_t k = 0; k < x.size() / kQk; ++k) {
    double amax = 0;
    for (uint32_t j = 0; j < kQk; ++j) amax = std::max(amax, std::fabs(double{x[k * kQk + j]}));
    uint16_t h;
    std::memcpy(&h, &xq[k * 34], 2);
    const double d = amax / 127, d_h = HalfToFloat(h);
    for (uint32_t j = 0; j < kQk; ++j)
      bound[k * kQk + j] = d * (0.5 + 1e-4) + 127 * std::fabs(d - d_h);
  }
  return bound;
}

// Double-precision references for all kMaxBatch x n_rows outputs, and their error bounds:
//   float weights: y against the exact dot of the decoded weights and x, bound
//     1 * n_cols * FLT_EPSILON * sum |w x| (the classical n u bound, with c = 1 in units of eps =
//     2u, is twice the worst case of a sequential float sum; the kernels' 8-lane sums need far
//     less);
//   quantised weights, against the exact dot with the quantised activations: the kernels round
//     d_w * d_x once, add each of n_cols/32 blocks to a lane with one rounding and sum 8 lanes:
//     bound (n_cols/32 + 4) * FLT_EPSILON * sum |w x_q|;
//   quantised weights, against the float-x dot: that bound plus sum |w| |x - x_q|, with each
//     |x - x_q| itself checked against ActivationErrorBounds.
struct Reference {
  std::vector<double> exact, bound, exact_float_x, bound_float_x;  // [kMaxBatch, n_rows]
  double worst_activation_error = 0;                               // |x - x_q| / its bound

  Reference(GgmlType type, const TestMatrix& m, const TestActivations& a) {
    const uint32_t n_cols = m.w.n_cols, n_rows = m.w.n_rows;
    const bool quantised = IsQuantised(type);
    std::vector<double> x_error(a.x.size());
    if (quantised) {
      x_error = ActivationErrorBounds(a.x, a.xq);
      for (size_t i = 0; i < a.x.size(); ++i) {
        worst_activation_error = std::max(worst_activation_error,
                                          std::fabs(double{a.x[i]} - a.xq_values[i]) / x_error[i]);
      }
    }
    for (uint32_t b = 0; b < kMaxBatch; ++b) {
      const float* x = &a.x[size_t{b} * n_cols];
      const float* xq = quantised ? &a.xq_values[size_t{b} * n_cols] : x;
      for (uint32_t r = 0; r < n_rows; ++r) {
        const float* w = &m.decoded[size_t{r} * n_cols];
        double dot = 0, magnitude = 0, dot_float_x = 0, quantisation = 0;
        for (uint32_t c = 0; c < n_cols; ++c) {
          dot += double{w[c]} * xq[c];
          magnitude += std::fabs(double{w[c]} * xq[c]);
          dot_float_x += double{w[c]} * x[c];
          quantisation += std::fabs(double{w[c]}) * x_error[size_t{b} * n_cols + c];
        }
        const double rounding = (quantised ? n_cols / kQk + 4.0 : static_cast<double>(n_cols)) *
                                    FLT_EPSILON * magnitude +
                                DBL_MIN;
        exact.push_back(dot);
        bound.push_back(rounding);
        exact_float_x.push_back(dot_float_x);
        bound_float_x.push_back(rounding + quantisation);
      }
    }
  }

  // The largest |error| / bound over the outputs of a product of n_batch rows (<= 1 passes).
  std::pair<double, double> Worst(const std::vector<float>& y) const {
    double worst = 0, worst_float_x = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      worst = std::max(worst, std::fabs(y[i] - exact[i]) / bound[i]);
      worst_float_x =
          std::max(worst_float_x, std::fabs(y[i] - exact_float_x[i]) / bound_float_x[i]);
    }
    return {worst, worst_float_x};
  }
};

std::vector<uint32_t> ColumnCounts(GgmlType type) {
  if (IsQuantised(type)) return {32, 64, 96, 896, 4864};
  return {1, 7, 32, 33, 64, 96, 896, 4864};
}

// The AVX2 kernels take rows 4 at a time at batch 1 and 2 at a time beyond, and batch rows 4, 3, 2
// or 1 at a time; the AVX-512 quantised kernels take rows 4 or 1 at a time beyond batch 1, and
// batch rows in pairs, 4, 3, 2 or 1 pairs at a time, an odd last row paired with zeros. Rows: a
// lone one, remainders, whole tiles and a remainder, whole tiles only. Batches: each batch tile
// alone, 4 + 1, 4 + 4 (and 1, 2, 3 and 4 pairs).
constexpr uint32_t kRowCounts[] = {1, 3, 18, 128};
constexpr uint32_t kBatchCounts[] = {1, 2, 3, 5, 8};

// Products of at most 128 x 896 weights. The bounds are tightest on short rows, where many rows
// find the worst case (worst |error| / bound up to 0.63 at 1 to 96 columns); at 4864 columns it
// is at most 0.053, the same with 18 rows as with 128, which took 70% of this test's time under
// the sanitizers.
constexpr size_t kMaxWeights = 128 * 896;

TEST(MatMul, EveryTypeAndPathMatchesDoubleReference) {
  for (GgmlType type : kTypes) {
    for (uint32_t n_cols : ColumnCounts(type)) {
      const TestActivations a(n_cols, n_cols, IsQuantised(type));
      for (uint32_t n_rows : kRowCounts) {
        if (size_t{n_rows} * n_cols > kMaxWeights) continue;
        const TestMatrix m(type, n_rows, n_cols, n_rows * 7919 + n_cols);
        const Reference ref(type, m, a);
        EXPECT_LE(ref.worst_activation_error, 1.0) << Name(type) << " n_cols " << n_cols;
        for (MatMulPath path : Paths()) {
          for (uint32_t n_batch : kBatchCounts) {
            const auto [worst, worst_float_x] = ref.Worst(Product(path, m, a, n_batch));
            EXPECT_LE(worst, 1.0) << Name(type) << " " << Name(path) << " [" << n_rows << ", "
                                  << n_cols << "] batch " << n_batch;
            EXPECT_LE(worst_float_x, 1.0) << Name(type) << " " << Name(path) << " [" << n_rows
                                          << ", " << n_cols << "] batch " << n_batch;
          }
        }
      }
    }
  }
}

// The vector kernels (AVX2; AVX-512 VNNI) follow the scalar specification's evaluation order
// exactly (integer block sums are exact; the float lanes see the same operations in the same
// order).
TEST(MatMul, VectorPathsEqualScalarBitForBit) {
  if (!GetCpuFeatures().avx2_kernels()) GTEST_SKIP() << "no AVX2+FMA+F16C (or ARGUS_FORCE_SCALAR)";
  for (MatMulPath path : Paths()) {
    if (path == MatMulPath::kScalar) continue;
    for (GgmlType type : kTypes) {
      for (uint32_t n_cols : ColumnCounts(type)) {
        const TestActivations a(n_cols, n_cols + 1, IsQuantised(type));
        const TestMatrix m(type, 17, n_cols, n_cols + 2);
        for (uint32_t n_batch : kBatchCounts) {
          EXPECT_TRUE(
              BitsEqual(Product(MatMulPath::kScalar, m, a, n_batch), Product(path, m, a, n_batch)))
              << Name(type) << " " << Name(path) << " n_cols " << n_cols << " batch " << n_batch;
        }
      }
    }
  }
}

// Codes no encoder of ours writes but a GGUF file may hold: q8_0 weights of -128 and 127 (the
// vpmaddubsw pair sums reach 2 * 128 * 127), q4_0's full nibble range, against activations at
// +-127. Every path must still give the exact integer dot (rounded as specified), bit for bit.
TEST(MatMul, ExtremeWeightCodesAreExactOnEveryPath) {
  std::mt19937_64 rng(testing::TestSeed());
  const uint32_t n_rows = 9, n_cols = 256;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const size_t block_bytes = type == GgmlType::kQ8_0 ? 34 : 18;
    std::vector<std::byte> bytes(n_rows * n_cols / kQk * block_bytes);
    for (size_t k = 0; k < bytes.size() / block_bytes; ++k) {
      const uint16_t d = FloatToHalf(std::uniform_real_distribution<float>(1e-3f, 1.0f)(rng));
      std::memcpy(&bytes[k * block_bytes], &d, 2);
      for (size_t j = 2; j < block_bytes; ++j) {
        // Mostly the extremes 0x80 (-128, or nibbles 0 and 8) and 0x7f (127, nibbles 15 and 7).
        const auto roll = rng() % 4;
        bytes[k * block_bytes + j] = static_cast<std::byte>(roll == 0   ? 0x80
                                                            : roll == 1 ? 0x7f
                                                                        : rng() & 0xff);
      }
    }
    GgufTensor tensor;
    tensor.name = "extreme";
    tensor.type = type;
    tensor.dims = {n_cols, n_rows};
    tensor.data = bytes;
    const MatMulWeights packed = PackForMatMul(MatrixOf(tensor).value()).value();
    const WeightMatrix& w = packed.matrix;
    // Every block of x has values at +-amax, so its codes reach +-127.
    std::vector<float> x(kMaxBatch * n_cols);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] =
          i % 3 == 0 ? (i % 2 ? 3.0f : -3.0f) : std::uniform_real_distribution<float>(-3, 3)(rng);
    }
    std::vector<std::byte> xq(kMaxBatch * QuantizedRowBytes(n_cols));
    QuantizeRowsQ8_0(x.data(), kMaxBatch, n_cols, xq.data());
    const std::vector<float> wd = DecodeBlocks(type, bytes, n_rows * n_cols / kQk);
    const std::vector<float> xd = DecodeBlocks(GgmlType::kQ8_0, xq, kMaxBatch * n_cols / kQk);
    std::vector<std::vector<float>> results;
    for (MatMulPath path : Paths()) {
      std::vector<float> y(kMaxBatch * n_rows);
      MatMulRows(path, w, x.data(), xq.data(), kMaxBatch, 0, n_rows, y.data());
      for (uint32_t b = 0; b < kMaxBatch; ++b) {
        for (uint32_t r = 0; r < n_rows; ++r) {
          double exact = 0, magnitude = 0;
          for (uint32_t c = 0; c < n_cols; ++c) {
            exact += double{wd[r * n_cols + c]} * xd[b * n_cols + c];
            magnitude += std::fabs(double{wd[r * n_cols + c]} * xd[b * n_cols + c]);
          }
          EXPECT_NEAR(y[b * n_rows + r], exact, (n_cols / kQk + 4.0) * FLT_EPSILON * magnitude)
              << Name(type) << " " << Name(path) << " row " << r << " batch row " << b;
        }
      }
      results.push_back(y);
    }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(BitsEqual(results[0], results[i])) << Name(type) << " " << Name(Paths()[i]);
    }
  }
}

// Every output is one dot product whatever the batch: prefill and decode agree bit for bit.
TEST(MatMul, BatchedRowsEqualSingleRowProducts) {
  const uint32_t n_rows = 11, n_cols = 96, n_batch = 7;
  for (GgmlType type : kTypes) {
    const TestMatrix m(type, n_rows, n_cols, 5);
    const TestActivations a(n_cols, 6, IsQuantised(type));
    for (MatMulPath path : Paths()) {
      const std::vector<float> batched = Product(path, m, a, n_batch);
      for (uint32_t b = 0; b < n_batch; ++b) {
        std::vector<float> single(n_rows);
        MatMulRows(path, m.w, &a.x[b * n_cols],
                   a.xq.empty() ? nullptr : &a.xq[b * QuantizedRowBytes(n_cols)], 1, 0, n_rows,
                   single.data());
        EXPECT_EQ(0, std::memcmp(single.data(), &batched[b * n_rows], n_rows * sizeof(float)))
            << Name(type) << " " << Name(path) << " batch row " << b;
      }
    }
  }
}

// MatMulRows writes rows [begin, end) of every batch row and nothing else: the pool's chunks
// write disjoint outputs.
TEST(MatMul, RowRangeWritesOnlyItsRows) {
  const uint32_t n_rows = 20, n_cols = 64, n_batch = 3, begin = 5, end = 14;
  for (GgmlType type : kTypes) {
    const TestMatrix m(type, n_rows, n_cols, 8);
    const TestActivations a(n_cols, 9, IsQuantised(type));
    for (MatMulPath path : Paths()) {
      const std::vector<float> full = Product(path, m, a, n_batch);
      std::vector<float> y(n_batch * n_rows, -12345.0f);
      MatMulRows(path, m.w, a.x.data(), a.xq.empty() ? nullptr : a.xq.data(), n_batch, begin, end,
                 y.data());
      for (uint32_t b = 0; b < n_batch; ++b) {
        for (uint32_t r = 0; r < n_rows; ++r) {
          const float expected = r >= begin && r < end ? full[b * n_rows + r] : -12345.0f;
          EXPECT_EQ(y[b * n_rows + r], expected) << Name(type) << " " << Name(path) << " row " << r;
        }
      }
    }
  }
}

TEST(MatMul, ResultIsBitIdenticalForAnyThreadCount) {
  const uint32_t n_rows = 200, n_cols = 896, n_batch = 5;  // 200 rows: 12 chunks and a partial one
  MatMulScratch scratch;
  for (GgmlType type : kTypes) {
    const TestMatrix m(type, n_rows, n_cols, 10);
    const TestActivations a(n_cols, 11, IsQuantised(type));
    const std::vector<float> expected = Product(BestMatMulPath(), m, a, n_batch);
    for (unsigned n_threads : {1u, 2u, 4u, 16u}) {
      ThreadPool pool(n_threads);
      std::vector<float> y(n_batch * n_rows);
      MatMul(m.w, a.x.data(), n_batch, y.data(), pool, scratch);
      EXPECT_TRUE(BitsEqual(y, expected)) << Name(type) << " " << n_threads << " threads";
    }
  }
}

TEST(MatMul, BestPathFollowsCpuFeatures) {
  const CpuFeatures& cpu = GetCpuFeatures();
  EXPECT_EQ(BestMatMulPath(), cpu.avx512_kernels() ? MatMulPath::kAvx512
                              : cpu.avx2_kernels() ? MatMulPath::kAvx2
                                                   : MatMulPath::kScalar);
}

TEST(MatMul, DequantizeRowMatchesIndependentDecoder) {
  const uint32_t n_rows = 13, n_cols = 96;  // a whole group of eight rows and a partial one
  for (GgmlType type : kTypes) {
    const TestMatrix m(type, n_rows, n_cols, 12);
    std::vector<float> row(n_cols);
    for (const WeightMatrix& w : {m.rows, m.w}) {
      for (uint32_t r = 0; r < n_rows; ++r) {
        DequantizeRow(w, r, row.data());
        EXPECT_EQ(0, std::memcmp(row.data(), &m.decoded[r * n_cols], n_cols * sizeof(float)))
            << Name(type) << " row " << r << (w.layout == WeightLayout::kRows ? "" : ", packed");
      }
    }
  }
}

// q4_0 packs eight rows at a time; every other type is read where it lies.
TEST(MatMul, PackForMatMulPacksOnlyQ4_0) {
  for (GgmlType type : kTypes) {
    const TestMatrix m(type, 13, 64, 14);
    const bool q4_0 = type == GgmlType::kQ4_0;
    EXPECT_EQ(m.w.layout, q4_0 ? WeightLayout::kQ4_0Groups : WeightLayout::kRows) << Name(type);
    EXPECT_EQ(m.w.data == m.rows.data, !q4_0) << Name(type);
    // Two groups of 2 block columns of 144 bytes.
    EXPECT_EQ(m.packed.storage.size(), q4_0 ? 2 * 2 * kQ4_0GroupBlockBytes : 0) << Name(type);
  }
}

// Packing on a pool (the model loader's) writes the same bytes as packing alone: chunks of groups
// and a partial last group.
TEST(MatMul, PackForMatMulOnAPoolGivesTheSameBytes) {
  const TestMatrix m(GgmlType::kQ4_0, 2 * 64 * kQ4_0GroupRows + 5, 64, 17);
  ThreadPool pool(4);
  const MatMulWeights pooled = PackForMatMul(m.rows, &pool).value();
  ASSERT_EQ(pooled.storage.size(), m.packed.storage.size());
  EXPECT_EQ(0, std::memcmp(pooled.storage.data(), m.packed.storage.data(), pooled.storage.size()));
}

// A q4_0 matrix left in GGUF's layout gives MatMul the same bits (through the scalar kernels);
// the vector paths refuse it with NaNs rather than read it as groups.
TEST(MatMul, Q4_0InRowsGivesTheSameProducts) {
  const uint32_t n_rows = 21, n_cols = 128, n_batch = 3;
  const TestMatrix m(GgmlType::kQ4_0, n_rows, n_cols, 15);
  const TestActivations a(n_cols, 16, true);
  ThreadPool pool(2);
  MatMulScratch scratch;
  std::vector<float> from_rows(n_batch * n_rows), from_groups(n_batch * n_rows);
  MatMul(m.rows, a.x.data(), n_batch, from_rows.data(), pool, scratch);
  MatMul(m.w, a.x.data(), n_batch, from_groups.data(), pool, scratch);
  EXPECT_TRUE(BitsEqual(from_rows, from_groups));
  for (MatMulPath path : Paths()) {
    std::vector<float> y(n_batch * n_rows);
    MatMulRows(path, m.rows, a.x.data(), a.xq.data(), n_batch, 0, n_rows, y.data());
    if (path == MatMulPath::kScalar) {
      EXPECT_TRUE(BitsEqual(y, from_groups));
    } else {
      EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }))
          << Name(path);
    }
  }
}

// Activations quantise as ggml's quantize_row_q8_0_ref does, byte for byte, on the oracle's
// blocks (zeros, ties, large and tiny magnitudes, ...), all in one call as one long row.
TEST(MatMul, QuantizeRowsMatchesGgmlOracle) {
  ARGUS_SKIP_WITHOUT_SHARED();
  std::ifstream in(testing::SharedDir() + "/testdata/ggml-quant/q8_0.txt");
  ASSERT_TRUE(in.good());
  std::vector<float> x;
  std::vector<std::byte> expected;
  std::string line, token;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    while (fields >> token && token != ":") {
      x.push_back(std::bit_cast<float>(static_cast<uint32_t>(std::stoul(token, nullptr, 16))));
    }
    while (fields >> token)
      expected.push_back(static_cast<std::byte>(std::stoul(token, nullptr, 16)));
  }
  const auto n_blocks = static_cast<uint32_t>(x.size() / kQk);
  ASSERT_GE(n_blocks, 100u);
  ASSERT_EQ(expected.size(), n_blocks * QuantizedRowBytes(kQk));
  for (MatMulPath path : Paths()) {
    std::vector<std::byte> got(expected.size());
    QuantizeRowsQ8_0(path, x.data(), 1, n_blocks * kQk, got.data());
    for (uint32_t k = 0; k < n_blocks; ++k) {
      EXPECT_EQ(0, std::memcmp(&got[k * 34], &expected[k * 34], 34))
          << Name(path) << " oracle block " << k;
    }
    // The same blocks as n_blocks rows of one block each give the same bytes.
    std::vector<std::byte> rows(expected.size());
    QuantizeRowsQ8_0(path, x.data(), n_blocks, kQk, rows.data());
    EXPECT_EQ(rows, got) << Name(path);
  }
}

// The vector paths write the scalar specification's bytes on random rows with the cases its
// rounding and conversion single out: halves (ties), values at the scale's edge, zero blocks,
// infinities, NaNs at every position of a block, and tiny blocks whose 1/d overflows.
TEST(MatMul, QuantizeRowsGivesTheSpecificationsBytesOnEveryPath) {
  constexpr uint32_t kBlocks = 400;
  std::vector<float> x = testing::RandomValues(size_t{kBlocks} * kQk, 17, 3.0f);
  for (uint32_t k = 0; k < kBlocks; ++k) {
    float* v = &x[size_t{k} * kQk];
    switch (k % 8) {
      case 1:  // amax 127: every code is its value, and the halves are ties
        for (uint32_t j = 0; j < kQk; ++j) v[j] = static_cast<float>(j) - 15.5f;
        v[kQk - 1] = 127.0f;
        break;
      case 2:
        std::fill(v, v + kQk, 0.0f);
        break;
      case 3:
        v[k % kQk] = std::numeric_limits<float>::infinity();
        break;
      case 4:
        v[(k / 8) % kQk] = std::numeric_limits<float>::quiet_NaN();
        break;
      case 5:  // d underflows to a denormal whose reciprocal overflows
        for (uint32_t j = 0; j < kQk; ++j) v[j] *= 1e-39f;
        break;
      default:
        break;
    }
  }
  std::vector<std::byte> spec(size_t{kBlocks} * 34);
  QuantizeRowsQ8_0(x.data(), 1, kBlocks * kQk, spec.data());
  for (MatMulPath path : Paths()) {
    std::vector<std::byte> got(spec.size());
    QuantizeRowsQ8_0(path, x.data(), 1, kBlocks * kQk, got.data());
    for (uint32_t k = 0; k < kBlocks; ++k) {
      EXPECT_EQ(0, std::memcmp(&got[k * 34], &spec[k * 34], 34)) << Name(path) << " block " << k;
    }
  }
}

GgufTensor Tensor(GgmlType type, std::vector<uint64_t> dims, std::span<const std::byte> data) {
  GgufTensor t;
  t.name = "blk.3.ffn_up.weight";
  t.type = type;
  t.dims = std::move(dims);
  t.data = data;
  return t;
}

TEST(MatrixOf, ReadsShapeAndRowBytes) {
  std::vector<std::byte> data(3 * 2 * 18);
  auto w = MatrixOf(Tensor(GgmlType::kQ4_0, {64, 3}, data));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->type, GgmlType::kQ4_0);
  EXPECT_EQ(w->n_rows, 3u);
  EXPECT_EQ(w->n_cols, 64u);
  EXPECT_EQ(w->row_bytes, 36u);
  EXPECT_EQ(w->data, data.data());
  std::vector<std::byte> bf16(7 * 5 * 2);
  auto v = MatrixOf(Tensor(GgmlType::kBF16, {7, 5}, bf16));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->row_bytes, 14u);
}

void ExpectInvalidNamingTensor(const Result<WeightMatrix>& w, const std::string& also) {
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("blk.3.ffn_up.weight"), std::string::npos)
      << w.status().ToString();
  EXPECT_NE(w.status().message().find(also), std::string::npos) << w.status().ToString();
}

TEST(MatrixOf, WrongRankIsInvalidArgumentNamingTensor) {
  std::vector<std::byte> data(4 * 64);
  ExpectInvalidNamingTensor(MatrixOf(Tensor(GgmlType::kF32, {64}, data)), "1 dimensions");
  ExpectInvalidNamingTensor(MatrixOf(Tensor(GgmlType::kF32, {16, 2, 2}, data)), "3 dimensions");
}

TEST(MatrixOf, UnsupportedTypeIsInvalidArgumentNamingTensor) {
  std::vector<std::byte> data(144);
  ExpectInvalidNamingTensor(MatrixOf(Tensor(GgmlType::kQ4_K, {256, 1}, data)), "q4_K");
}

TEST(MatrixOf, QuantisedRowNotMultipleOf32IsInvalidArgument) {
  std::vector<std::byte> data(34 * 4);
  ExpectInvalidNamingTensor(MatrixOf(Tensor(GgmlType::kQ8_0, {48, 2}, data)), "48");
}

TEST(MatrixOf, DataSizeNotMatchingShapeIsInvalidArgument) {
  std::vector<std::byte> data(4 * 10 - 1);
  ExpectInvalidNamingTensor(MatrixOf(Tensor(GgmlType::kF32, {5, 2}, data)), "39 bytes");
}

}  // namespace
}  // namespace argus::model
