// com.microsoft.MatMulNBits and GatherBlockQuantized against naive references written here
// from onnxruntime's ContribOperators.md: the weights are dequantized in double and then
// multiplied (or gathered). Random shapes cover K that is not a multiple of the block, odd N,
// 4 and 8 bits, packed and float zero points or none, a bias, and M from one row (a decode
// step) to 70 (a prefill, through the dequantize-and-GEMM path). The kernels are compared at
// every instruction-set level in one process; the op tests run again per level under
// KILN_ISA (ctest). Bad inputs fail with an Error naming the node.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ops/math/kernels.h"
#include "test/unit/isa_test.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr const char* kMs = "com.microsoft";

// A random quantized B [k x n] in onnxruntime's layout, with its dequantized values.
struct QuantB {
  int bits = 4;
  int64_t k = 0, n = 0, block = 0, blocks = 0;
  std::vector<uint8_t> data, zp_packed;
  std::vector<float> scales, zp_float;
  std::vector<double> w;  // dequantized, w[p * n + j]

  int64_t block_bytes() const { return block * bits / 8; }
  int64_t zp_bytes() const { return (blocks * bits + 7) / 8; }
};

enum class Zp { None, Packed, Float };

QuantB random_b(int bits, int64_t k, int64_t n, int64_t block, Zp zp, std::mt19937& rng) {
  QuantB b;
  b.bits = bits;
  b.k = k;
  b.n = n;
  b.block = block;
  b.blocks = (k + block - 1) / block;
  const int levels = 1 << bits;
  std::uniform_int_distribution<int> qd(0, levels - 1);
  std::uniform_real_distribution<float> sd(0.01f, 0.1f), zd(0.0f, static_cast<float>(levels - 1));
  b.data.assign(static_cast<size_t>(n * b.blocks * b.block_bytes()), 0);
  b.scales.resize(static_cast<size_t>(n * b.blocks));
  b.zp_packed.assign(static_cast<size_t>(n * b.zp_bytes()), 0);
  b.zp_float.resize(static_cast<size_t>(n * b.blocks));
  b.w.assign(static_cast<size_t>(k * n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t blk = 0; blk < b.blocks; ++blk) {
      const size_t sb = static_cast<size_t>(j * b.blocks + blk);
      b.scales[sb] = sd(rng);
      const int zq = qd(rng);
      b.zp_float[sb] = zd(rng);
      uint8_t* zbyte = &b.zp_packed[static_cast<size_t>(j * b.zp_bytes() + blk * bits / 8)];
      *zbyte |= static_cast<uint8_t>(bits == 8 ? zq : zq << (blk % 2 * 4));
      const double z = zp == Zp::None ? levels / 2 : zp == Zp::Packed ? zq : b.zp_float[sb];
      for (int64_t i = 0; i < block; ++i) {
        const int q = qd(rng);  // also in the padding past k, which must not count
        uint8_t* byte =
            &b.data[static_cast<size_t>((j * b.blocks + blk) * b.block_bytes() + i * bits / 8)];
        *byte |= static_cast<uint8_t>(bits == 8 ? q : q << (i % 2 * 4));
        const int64_t p = blk * block + i;
        if (p < k) b.w[static_cast<size_t>(p * n + j)] = (q - z) * b.scales[sb];
      }
    }
  }
  return b;
}

Tensor u8_tensor(Shape shape, const std::vector<uint8_t>& v) {
  Tensor t = Tensor::zeros(DataType::UInt8, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<uint8_t>());
  return t;
}

Tensor f32_tensor(Shape shape, const std::vector<float>& v) {
  Tensor t = Tensor::zeros(DataType::Float, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// y = a * w (+ bias) in double.
std::vector<double> reference(const Tensor& a, const QuantB& b, const std::vector<float>* bias) {
  const int64_t m = a.numel() / b.k;
  std::vector<double> y(static_cast<size_t>(m * b.n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < b.n; ++j) {
      double s = bias ? (*bias)[static_cast<size_t>(j)] : 0.0;
      for (int64_t p = 0; p < b.k; ++p) {
        s += element(a, i * b.k + p) * b.w[static_cast<size_t>(p * b.n + j)];
      }
      y[static_cast<size_t>(i * b.n + j)] = s;
    }
  }
  return y;
}

// Float sums of k terms of magnitude ~|a| |w|: the tolerance grows with sqrt(k).
void require_near(const float* got, const std::vector<double>& want, int64_t k) {
  const double tol = 2e-5 * std::sqrt(static_cast<double>(k));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

// The node over `b`; attributes other than b's when given.
struct Attrs {
  int64_t bits = 0, block = 0, n = 0;
};

OpTest nbits_op(const QuantB& b, const Tensor& a, Zp zp, const std::vector<float>* bias,
                Attrs at = {}) {
  OpTest op("MatMulNBits", 1, kMs);
  op.input(a)
      .constant_input(u8_tensor({b.n, b.blocks, b.block_bytes()}, b.data))
      .constant_input(f32_tensor({b.n * b.blocks}, b.scales));
  if (zp == Zp::Packed) op.constant_input(u8_tensor({b.n * b.zp_bytes()}, b.zp_packed));
  if (zp == Zp::Float) op.constant_input(f32_tensor({b.n, b.blocks}, b.zp_float));
  if (bias) {
    if (zp == Zp::None) op.no_input();
    op.no_input().constant_input(f32_tensor({b.n}, *bias));
  }
  op.attr("K", b.k)
      .attr("N", at.n ? at.n : b.n)
      .attr("bits", at.bits ? at.bits : b.bits)
      .attr("block_size", at.block ? at.block : b.block);
  return op;
}

}  // namespace

TEST_CASE("MatMulNBits matches dequantize-then-multiply", "[ops][contrib][nbits]") {
  std::mt19937 rng(19);
  const std::vector<int64_t> ms{1, 2, 3, 4, 5, 8, 9, 17, 70};
  for (int trial = 0; trial < 36; ++trial) {
    const int bits = trial % 2 ? 8 : 4;
    const int64_t block = int64_t{16} << (trial / 2 % 4);  // 16 .. 128
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 40)(rng) * 2 + 1;
    const int64_t m = ms[static_cast<size_t>(trial) % ms.size()];
    const Zp zp = static_cast<Zp>(trial % 3);
    const bool with_bias = trial % 4 == 1;
    INFO("trial " << trial << ": bits " << bits << " block " << block << " M " << m << " K " << k
                  << " N " << n << " zp " << static_cast<int>(zp) << " bias " << with_bias);
    const QuantB b = random_b(bits, k, n, block, zp, rng);
    const Tensor a = random_tensor(DataType::Float, {1, m, k}, rng, -1, 1);
    std::vector<float> bias(static_cast<size_t>(n));
    for (auto& v : bias) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    const Tensor y = nbits_op(b, a, zp, with_bias ? &bias : nullptr).run1();
    REQUIRE(y.shape() == Shape{1, m, n});
    require_near(y.data<const float>(), reference(a, b, with_bias ? &bias : nullptr), k);
  }
}

TEST_CASE("MatMulNBits with many columns splits them across threads", "[ops][contrib][nbits]") {
  std::mt19937 rng(7);
  const QuantB b = random_b(4, 768, 515, 32, Zp::Packed, rng);
  for (int64_t m : {1, 4, 40}) {
    const Tensor a = random_tensor(DataType::Float, {m, 768}, rng, -1, 1);
    OpTest op = nbits_op(b, a, Zp::Packed, nullptr);
    require_near(op.run1().data<const float>(), reference(a, b, nullptr), 768);
  }
}

KILN_ISA_TEST_CASE("the MatMulNBits kernels match the reference at every level", "[math][nbits]") {
  KILN_REQUIRE_ISA();
  const math::NBitsKernels& nk = isa_kernels.nbits;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 16; ++trial) {
    const int bits = trial % 2 ? 8 : 4;
    const int64_t block = int64_t{16} << (trial / 2 % 4);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 260)(rng);
    const int64_t n = 2 * (trial % 5) + 1;
    const Zp zp = static_cast<Zp>(trial % 3);
    const int rows = 1 + trial % nk.max_rows;
    INFO("trial " << trial << ": bits " << bits << " block " << block << " K " << k);
    const QuantB q = random_b(bits, k, n, block, zp, rng);
    math::NBitsMatrix b;
    b.data = q.data.data();
    b.scales = q.scales.data();
    b.zero_points = zp == Zp::Packed ? q.zp_packed.data() : nullptr;
    b.float_zero_points = zp == Zp::Float ? q.zp_float.data() : nullptr;
    b.bits = bits;
    b.k = k;
    b.n = n;
    b.block = block;
    b.blocks = q.blocks;
    const Tensor a = random_tensor(DataType::Float, {rows, k}, rng, -1, 1);
    std::vector<float> prepared(static_cast<size_t>(rows * q.blocks * block));
    std::vector<float> sums(static_cast<size_t>(rows * q.blocks)), y(static_cast<size_t>(rows * n));
    nk.prepare_a(a.data<const float>(), k, rows, b, prepared.data(), sums.data());
    nk.gemv(prepared.data(), sums.data(), rows, b, 0, n, y.data(), n);
    require_near(y.data(), reference(a, q, nullptr), k);
    // dequantize_rows: columns [1, n) as rows in prepare_a's order, whose dot products with
    // the prepared rows of A are the product.
    const int64_t padded = q.blocks * block;
    std::vector<float> w(static_cast<size_t>((n - 1) * padded));
    nk.dequantize_rows(b, 1, n, w.data());
    const std::vector<double> want = reference(a, q, nullptr);
    for (int r = 0; r < rows; ++r) {
      for (int64_t j = 1; j < n; ++j) {
        double dot = 0;
        for (int64_t p = 0; p < padded; ++p) {
          dot += double{prepared[static_cast<size_t>(r * padded + p)]} *
                 w[static_cast<size_t>((j - 1) * padded + p)];
        }
        REQUIRE(dot == Approx(want[static_cast<size_t>(r * n + j)]).margin(1e-4));
      }
    }
  }
}

TEST_CASE("MatMulNBits rejects bad inputs naming the node", "[ops][contrib][nbits]") {
  std::mt19937 rng(5);
  const QuantB b = random_b(4, 64, 3, 32, Zp::Packed, rng);
  const Tensor a = random_tensor(DataType::Float, {2, 64}, rng);
  auto fails_with = [](OpTest op, const char* text) {
    REQUIRE_THROWS_WITH(op.run(), Catch::Contains("MatMulNBits") && Catch::Contains(text));
  };
  fails_with(nbits_op(b, a, Zp::Packed, nullptr, {.bits = 3}), "bits 3");
  fails_with(nbits_op(b, a, Zp::Packed, nullptr, {.block = 24}), "block_size 24");
  fails_with(nbits_op(b, random_tensor(DataType::Float, {2, 63}, rng), Zp::Packed, nullptr),
             "K = 64");
  fails_with(nbits_op(b, a, Zp::Packed, nullptr, {.n = 4}), "B ");
  {
    OpTest op("MatMulNBits", 1, kMs);
    op.input(a)
        .constant_input(u8_tensor({3, 2, 16}, b.data))
        .constant_input(f32_tensor({6}, b.scales))
        .constant_input(u8_tensor({2}, {0, 0}))
        .attr("K", 64)
        .attr("N", 3)
        .attr("bits", 4)
        .attr("block_size", 32);
    fails_with(std::move(op), "zero_points");
  }
  {
    OpTest op("MatMulNBits", 1, kMs);
    Tensor g = Tensor::zeros(DataType::Int32, {64});
    op.input(a)
        .constant_input(u8_tensor({3, 2, 16}, b.data))
        .constant_input(f32_tensor({6}, b.scales))
        .no_input()
        .constant_input(g)
        .attr("K", 64)
        .attr("N", 3)
        .attr("bits", 4)
        .attr("block_size", 32);
    REQUIRE_THROWS_WITH(op.run(), Catch::Contains("g_idx"));
  }
}

namespace {

// data [rows x cols] of random 4- or 8-bit values blocked along the last axis, as uint8
// (4-bit: two to a byte), with the dequantized values.
struct QuantTable {
  int64_t rows = 0, cols = 0, block = 0, blocks = 0;
  int bits = 4;
  std::vector<uint8_t> data, zp;
  std::vector<float> scales;
  std::vector<double> w;
};

QuantTable random_table(int bits, int64_t rows, int64_t cols, int64_t block, bool with_zp,
                        std::mt19937& rng) {
  QuantTable t;
  t.rows = rows;
  t.cols = cols;
  t.block = block;
  t.bits = bits;
  t.blocks = (cols + block - 1) / block;
  const int levels = 1 << bits;
  std::uniform_int_distribution<int> qd(0, levels - 1);
  const int64_t row_bytes = cols * bits / 8, zp_row = bits == 4 ? (t.blocks + 1) / 2 : t.blocks;
  t.data.assign(static_cast<size_t>(rows * row_bytes), 0);
  t.zp.assign(static_cast<size_t>(rows * zp_row), 0);
  t.scales.resize(static_cast<size_t>(rows * t.blocks));
  t.w.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int> z(static_cast<size_t>(t.blocks));
    for (int64_t blk = 0; blk < t.blocks; ++blk) {
      z[static_cast<size_t>(blk)] = with_zp ? qd(rng) : levels / 2;
      t.zp[static_cast<size_t>(r * zp_row + blk * bits / 8)] |= static_cast<uint8_t>(
          bits == 8 ? z[static_cast<size_t>(blk)] : z[static_cast<size_t>(blk)] << (blk % 2 * 4));
      t.scales[static_cast<size_t>(r * t.blocks + blk)] =
          std::uniform_real_distribution<float>(0.01f, 0.1f)(rng);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const int q = qd(rng);
      t.data[static_cast<size_t>(r * row_bytes + c * bits / 8)] |=
          static_cast<uint8_t>(bits == 8 ? q : q << (c % 2 * 4));
      const size_t sb = static_cast<size_t>(r * t.blocks + c / block);
      t.w[static_cast<size_t>(r * cols + c)] = (q - z[c / block]) * double{t.scales[sb]};
    }
  }
  return t;
}

}  // namespace

TEST_CASE("GatherBlockQuantized looks up dequantized rows", "[ops][contrib][nbits]") {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 8; ++trial) {
    const int bits = trial % 2 ? 8 : 4;
    const bool with_zp = trial / 2 % 2;
    const int64_t rows = 11, cols = 2 * (20 + 13 * trial), block = trial < 4 ? 16 : 32;
    const QuantTable t = random_table(bits, rows, cols, block, with_zp, rng);
    INFO("trial " << trial << ": bits " << bits << " zp " << with_zp << " cols " << cols);
    Tensor idx = Tensor::zeros(DataType::Int64, {2, 3});
    const std::vector<int64_t> picks{0, 10, -1, 3, 3, 7};
    std::copy(picks.begin(), picks.end(), idx.data<int64_t>());
    OpTest op("GatherBlockQuantized", 1, kMs);
    op.constant_input(u8_tensor({rows, cols * bits / 8}, t.data))
        .input(idx)
        .constant_input(f32_tensor({rows, t.blocks}, t.scales));
    if (with_zp)
      op.constant_input(u8_tensor({rows, bits == 4 ? (t.blocks + 1) / 2 : t.blocks}, t.zp));
    op.attr("gather_axis", 0).attr("quantize_axis", 1).attr("block_size", block).attr("bits", bits);
    const Tensor y = op.run1();
    REQUIRE(y.shape() == Shape{2, 3, cols});
    for (size_t i = 0; i < picks.size(); ++i) {
      const int64_t r = (picks[i] + rows) % rows;
      for (int64_t c = 0; c < cols; ++c) {
        REQUIRE(y.data<const float>()[static_cast<int64_t>(i) * cols + c] ==
                Approx(t.w[static_cast<size_t>(r * cols + c)]).margin(1e-6));
      }
    }
  }
}

TEST_CASE("GatherBlockQuantized rejects bad inputs naming the node", "[ops][contrib][nbits]") {
  std::mt19937 rng(29);
  const QuantTable t = random_table(4, 4, 64, 32, false, rng);
  auto op_with = [&](Tensor idx, int64_t quantize_axis) {
    OpTest op("GatherBlockQuantized", 1, kMs);
    op.constant_input(u8_tensor({4, 32}, t.data))
        .input(std::move(idx))
        .constant_input(f32_tensor({4, 2}, t.scales))
        .attr("quantize_axis", quantize_axis)
        .attr("block_size", 32);
    return op;
  };
  Tensor far = Tensor::zeros(DataType::Int64, {1});
  far.data<int64_t>()[0] = 4;
  REQUIRE_THROWS_WITH(op_with(far, 1).run(),
                      Catch::Contains("GatherBlockQuantized") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(op_with(Tensor::zeros(DataType::Int64, {1}), 0).run(),
                      Catch::Contains("quantize_axis last"));
  OpTest bad_scales("GatherBlockQuantized", 1, kMs);
  bad_scales.constant_input(u8_tensor({4, 32}, t.data))
      .input(Tensor::zeros(DataType::Int64, {1}))
      .constant_input(f32_tensor({4, 3}, std::vector<float>(12, 1.0f)))
      .attr("block_size", 32);
  REQUIRE_THROWS_WITH(bad_scales.run(), Catch::Contains("scales"));
}

TEST_CASE("GatherBlockQuantized reads int4 data along any axis with float16 scales",
          "[ops][contrib][nbits]") {
  // int4 data [3, 40, 2] quantized along axis 1 in blocks of 16 (3 blocks, the last short),
  // gathered along axis 2: what MatMulNBitsQuantizer's int4 Gather layout allows in general.
  std::mt19937 rng(31);
  const int64_t d0 = 3, d1 = 40, d2 = 2, block = 16, blocks = 3;
  Tensor data = Tensor::zeros(DataType::Int4, {d0, d1, d2});
  Tensor scales = Tensor::zeros(DataType::Float16, {d0, blocks, d2});
  auto* bytes = reinterpret_cast<uint8_t*>(data.raw_data());
  std::vector<int> q(static_cast<size_t>(d0 * d1 * d2));
  for (size_t f = 0; f < q.size(); ++f) {
    q[f] = std::uniform_int_distribution<int>(-8, 7)(rng);
    bytes[f / 2] |= static_cast<uint8_t>((q[f] & 15) << (f % 2 * 4));
  }
  for (int64_t i = 0; i < scales.numel(); ++i) {
    scales.data<float16>()[i] = float16(std::uniform_real_distribution<float>(0.1f, 1.0f)(rng));
  }
  Tensor idx = Tensor::zeros(DataType::Int32, {3});
  const std::vector<int32_t> picks{1, 0, -1};
  std::copy(picks.begin(), picks.end(), idx.data<int32_t>());
  OpTest op("GatherBlockQuantized", 1, kMs);
  op.constant_input(data).input(idx).constant_input(scales);
  op.attr("gather_axis", 2).attr("quantize_axis", 1).attr("block_size", block);
  const Tensor y = op.run1();
  REQUIRE(y.dtype() == DataType::Float16);
  REQUIRE(y.shape() == Shape{d0, d1, 3});
  for (int64_t i = 0; i < d0; ++i) {
    for (int64_t j = 0; j < d1; ++j) {
      for (int64_t t = 0; t < 3; ++t) {
        const int64_t c = (picks[static_cast<size_t>(t)] + d2) % d2;
        const double s =
            static_cast<float>(scales.data<const float16>()[(i * blocks + j / block) * d2 + c]);
        const double want = q[static_cast<size_t>((i * d1 + j) * d2 + c)] * s;
        REQUIRE(static_cast<float>(y.data<const float16>()[(i * d1 + j) * 3 + t]) ==
                Approx(want).margin(1e-3 * (1 + std::fabs(want))));
      }
    }
  }
}

// accuracy_level 4 (onnxruntime's CompInt8): A quantized per block to int8 as onnxruntime's
// QuantizeARow does (scale amax / 127, rounded to nearest even), written here independently.
namespace {

struct QuantA {
  std::vector<int> q;         // [rows][k] in natural order
  std::vector<double> scale;  // [rows][blocks]
};

QuantA quantize_reference(const Tensor& a, int64_t rows, int64_t k, int64_t block) {
  const int64_t blocks = (k + block - 1) / block;
  QuantA r;
  r.q.resize(static_cast<size_t>(rows * k));
  r.scale.resize(static_cast<size_t>(rows * blocks));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t p0 = blk * block, p1 = std::min(k, p0 + block);
      float amax = 0;
      for (int64_t p = p0; p < p1; ++p)
        amax = std::max(amax, std::fabs(a.data<const float>()[i * k + p]));
      const float inv = amax != 0 ? 127.0f / amax : 0.0f;
      r.scale[static_cast<size_t>(i * blocks + blk)] = amax / 127.0f;
      for (int64_t p = p0; p < p1; ++p) {
        r.q[static_cast<size_t>(i * k + p)] =
            static_cast<int>(std::nearbyint(a.data<const float>()[i * k + p] * inv));
      }
    }
  }
  return r;
}

// y = sum over blocks of s_b * sa * sum_p qa_p (q_p - z), in double, from the dequantized w.
std::vector<double> int8_reference(const QuantA& qa, const QuantB& b, int64_t rows,
                                   const std::vector<float>* bias) {
  std::vector<double> y(static_cast<size_t>(rows * b.n), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < b.n; ++j) {
      double s = bias ? (*bias)[static_cast<size_t>(j)] : 0.0;
      for (int64_t p = 0; p < b.k; ++p) {
        s += qa.scale[static_cast<size_t>(i * b.blocks + p / b.block)] *
             qa.q[static_cast<size_t>(i * b.k + p)] * b.w[static_cast<size_t>(p * b.n + j)];
      }
      y[static_cast<size_t>(i * b.n + j)] = s;
    }
  }
  return y;
}

// The float rounding of a scaled int32 sum per block: far tighter than the int8 rounding.
void require_close(const float* got, const std::vector<double>& want, int64_t k) {
  const double tol = 1e-5 * std::sqrt(static_cast<double>(k));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

void check_int8_kernels(const math::NBitsKernels& nk, std::mt19937& rng) {
  for (int trial = 0; trial < 24; ++trial) {
    const int bits = trial % 6 == 5 ? 8 : 4;
    const int64_t block = int64_t{16} << (trial / 2 % 4);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 400)(rng);
    const int64_t n = 2 * (trial % 5) + 1;
    const Zp zp = static_cast<Zp>(trial % 3);
    // Every block width with one and more rows (one row of blocks of 32 has its own kernel).
    const int rows = 1 + (trial / 8 + trial % 2) % nk.max_rows;
    INFO("trial " << trial << ": bits " << bits << " block " << block << " K " << k << " N " << n
                  << " rows " << rows);
    const QuantB q = random_b(bits, k, n, block, zp, rng);
    math::NBitsMatrix b;
    b.data = q.data.data();
    b.scales = q.scales.data();
    b.zero_points = zp == Zp::Packed ? q.zp_packed.data() : nullptr;
    b.float_zero_points = zp == Zp::Float ? q.zp_float.data() : nullptr;
    b.bits = bits;
    b.k = k;
    b.n = n;
    b.block = block;
    b.blocks = q.blocks;
    // Values up to 4: the blocks' largest values land on +-127.
    const Tensor a = random_tensor(DataType::Float, {rows, k}, rng, -4, 4);
    const QuantA want = quantize_reference(a, rows, k, block);
    const int64_t padded = q.blocks * block;
    std::vector<int8_t> quantized(static_cast<size_t>(rows * padded), 99);
    std::vector<float> scales(static_cast<size_t>(rows * q.blocks)), sums(scales.size());
    nk.quantize_a(a.data<const float>(), k, rows, b, quantized.data(), scales.data(), sums.data());
    // Every value of A, and the padding as zeros, where the documented order puts them.
    for (int r = 0; r < rows; ++r) {
      for (int64_t p = 0; p < padded; ++p) {
        const int64_t blk = p / block, i = p % block;
        const int64_t c = std::min<int64_t>(block, 32), ci = i % c;
        const int64_t at = bits == 4 ? blk * block + i - ci + (ci % 2) * (c / 2) + ci / 2 : p;
        const int expect = p < k ? want.q[static_cast<size_t>(r * k + p)] : 0;
        REQUIRE(quantized[static_cast<size_t>(r * padded + at)] == expect);
      }
      for (int64_t blk = 0; blk < q.blocks; ++blk) {
        const size_t s = static_cast<size_t>(r * q.blocks + blk);
        REQUIRE(scales[s] == static_cast<float>(want.scale[s]));
        int sum = 0;
        for (int64_t p = blk * block; p < std::min(k, (blk + 1) * block); ++p) {
          sum += want.q[static_cast<size_t>(r * k + p)];
        }
        REQUIRE(sums[s] == Approx(want.scale[s] * sum).epsilon(1e-6));
      }
    }
    std::vector<float> y(static_cast<size_t>(rows * n));
    nk.gemv_int8(quantized.data(), scales.data(), sums.data(), rows, b, 0, n, y.data(), n);
    require_close(y.data(), int8_reference(want, q, rows, nullptr), k);
  }
}

}  // namespace

KILN_ISA_TEST_CASE("the MatMulNBits int8 kernels match an int8 reference at every level",
                   "[math][nbits]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(41);
  check_int8_kernels(isa_kernels.nbits, rng);
  // The level without AVX512-VNNI (pmaddubsw) where the processor has it.
  check_int8_kernels(math::kernels_without_extensions(TestType::isa).nbits, rng);
}

TEST_CASE("MatMulNBits at accuracy_level 4 computes with int8 activations",
          "[ops][contrib][nbits]") {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t block = int64_t{16} << (trial % 4);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 40)(rng) * 2 + 1;
    const int64_t m = 1 + trial % 8;
    const Zp zp = static_cast<Zp>(trial % 3);
    const bool with_bias = trial % 2 == 1;
    INFO("trial " << trial << ": block " << block << " M " << m << " K " << k << " N " << n);
    const QuantB b = random_b(4, k, n, block, zp, rng);
    const Tensor a = random_tensor(DataType::Float, {m, k}, rng, -1, 1);
    std::vector<float> bias(static_cast<size_t>(n));
    for (auto& v : bias) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    OpTest op = nbits_op(b, a, zp, with_bias ? &bias : nullptr);
    op.attr("accuracy_level", int64_t{4});
    const Tensor y = op.run1();
    const std::vector<double> want =
        int8_reference(quantize_reference(a, m, k, block), b, m, with_bias ? &bias : nullptr);
    require_close(y.data<const float>(), want, k);
    // And not the float product: the int8 rounding shows.
    const std::vector<double> exact = reference(a, b, with_bias ? &bias : nullptr);
    double diff = 0;
    for (size_t i = 0; i < exact.size(); ++i) diff = std::max(diff, std::fabs(exact[i] - want[i]));
    if (k >= 16) CHECK(diff > 1e-5);
  }
}
