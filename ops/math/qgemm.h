// The 8-bit integer GEMM layer: every integer product of the quantized ops goes through
// qgemm().
//
//   R[m x n] = (A - za) * (B - zb) (+ bias)   A, B uint8 or int8; zero points per tensor, or
//                                             per row of A and per column of B
//   stored as int32 (wrapping like int32 accumulation), or requantized to 8 bits:
//   y = saturate(round_half_even(float(R) * scale) + y_zero_point), the product in float.
//
// The register tile (Int8GemmKernels) multiplies uint8 by int8. The other signednesses reach
// it exactly by flipping sign bits as the operands are packed: an int8 A becomes A + 128
// (uint8), a uint8 B becomes B - 128 (int8), and the offsets move into the zero points
// (za' = za + 128, zb' = zb - 128). The zero points then enter through row and column sums,
//
//   (A' - za')(B' - zb') = A'B' - za' colsum(B') - zb' rowsum(A') + K za' zb',
//
// which are added to each tile while it is still in registers (all modulo 2^32, so the
// result is the exact product wherever that fits int32). B is packed once when constant (a
// weight, at session creation) with its column sums; A is packed per row block into
// thread-local buffers. K is not split: each tile's sums are complete in registers, so the
// corrections and the requantization apply to it at once. Work is split across threads as
// in the float GEMM (ops/math/threading.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "ops/math/gemm.h"
#include "ops/math/kernels.h"

namespace kiln::math {

// An 8-bit matrix: element (i, j) at data[i * rs + j * cs], int8 when is_signed, else uint8.
struct QMatrixView {
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 0;
  bool is_signed = false;

  static QMatrixView row_major(const void* p, int64_t rows, int64_t cols, int64_t ld,
                               bool is_signed) {
    return {p, rows, cols, ld, 1, is_signed};
  }
};

// B packed for one level's int8 tile: the (sign-flipped) values in panels of nr columns
// (k rounded up to the tile's k group), followed by the column sums of the flipped values
// (a multiple of nr of them).
class QPackedB {
 public:
  QPackedB() = default;
  // Packs `b` with `kernels` (null: the active level's) into memory it owns.
  explicit QPackedB(const QMatrixView& b, const MathKernels* kernels = nullptr);
  // Uses a buffer already made by pack_into() with `kernels`' layout (not owned).
  QPackedB(const void* data, int64_t k, int64_t n, bool is_signed,
           const MathKernels* kernels = nullptr);

  // Bytes needed to pack a k x n B for `kernels`.
  static int64_t packed_bytes(int64_t k, int64_t n, const Int8GemmKernels& kernels);
  static void pack_into(const QMatrixView& b, void* out, const MathKernels& kernels);

  const uint8_t* panels() const { return data_; }
  const int32_t* col_sums() const { return col_sums_; }
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  bool is_signed() const { return is_signed_; }
  const char* layout() const { return layout_; }
  int nr() const { return nr_; }

 private:
  std::shared_ptr<uint8_t[]> owned_;
  const uint8_t* data_ = nullptr;
  const int32_t* col_sums_ = nullptr;
  int64_t k_ = 0, n_ = 0;
  bool is_signed_ = false;
  const char* layout_ = nullptr;
  int nr_ = 0;
};

// A packed for one level's int8 tile: panels of mr rows (k rounded up to the tile's k group),
// followed by the row sums of the flipped values (a multiple of mr of them). A constant left
// operand, such as a convolution's filter, is packed once this way.
class QPackedA {
 public:
  QPackedA() = default;
  explicit QPackedA(const QMatrixView& a, const MathKernels* kernels = nullptr);
  QPackedA(const void* data, int64_t m, int64_t k, bool is_signed,
           const MathKernels* kernels = nullptr);

  static int64_t packed_bytes(int64_t m, int64_t k, const Int8GemmKernels& kernels);
  static void pack_into(const QMatrixView& a, void* out, const MathKernels& kernels);

  // The panel holding row i (a multiple of mr).
  const int32_t* panel(int64_t i) const;
  const int32_t* row_sums() const { return row_sums_; }
  int64_t m() const { return m_; }
  int64_t k() const { return k_; }
  bool is_signed() const { return is_signed_; }
  const char* layout() const { return layout_; }
  int mr() const { return mr_; }

 private:
  std::shared_ptr<uint8_t[]> owned_;
  const int32_t* data_ = nullptr;
  const int32_t* row_sums_ = nullptr;
  int64_t m_ = 0, k_ = 0, groups_ = 0;
  bool is_signed_ = false;
  const char* layout_ = nullptr;
  int mr_ = 0;
};

// Where the result goes: int32 (c), or 8-bit (y) requantized with the scale
// scales[i * scale_rs + j * scale_cs] (scale_cs 0 or 1) and the zero point
// y_zero_points[i * y_zero_rs] (none: 0), or float (f) scaled back as the dynamically
// quantized ops do: f = float(R) * f_scales[j * f_scale_cs] + f_bias[j] (no bias when null),
// added to what f holds when f_accumulate, then f_row_bias[i] added (when given), then
// f_activation applied (with the vector kernels the standalone activation ops use, element
// by element: the same results). With f_row_scales, row i's scale is the float product
// f_row_scales[i] * f_scales[j * f_scale_cs], rounded once, before it multiplies float(R).
struct QGemmOutput {
  int32_t* c = nullptr;
  int64_t ldc = 0;
  uint8_t* y = nullptr;
  int64_t ldy = 0;
  bool y_signed = false;
  const float* scales = nullptr;
  int64_t scale_rs = 0, scale_cs = 0;
  const int32_t* y_zero_points = nullptr;
  int64_t y_zero_rs = 0;
  float* f = nullptr;
  int64_t ldf = 0;
  const float* f_scales = nullptr;
  int64_t f_scale_cs = 0;
  const float* f_bias = nullptr;
  const float* f_row_scales = nullptr;  // one per row of the product (m values), or null
  const float* f_row_bias = nullptr;    // one per row (m values), or null
  bool f_accumulate = false;
  Activation f_activation = Activation::None;  // applied last, to each finished tile row

  static QGemmOutput to_float(float* f, int64_t ldf, const float* scales, bool per_column,
                              const float* bias = nullptr, bool accumulate = false) {
    QGemmOutput o;
    o.f = f;
    o.ldf = ldf;
    o.f_scales = scales;
    o.f_scale_cs = per_column ? 1 : 0;
    o.f_bias = bias;
    o.f_accumulate = accumulate;
    return o;
  }
  static QGemmOutput int32(int32_t* c, int64_t ldc) {
    QGemmOutput o;
    o.c = c;
    o.ldc = ldc;
    return o;
  }
};

struct QGemmOptions {
  int32_t a_zero = 0;                    // A's zero point, unless
  const int32_t* a_zeros = nullptr;      // one per row (m values)
  int32_t b_zero = 0;                    // B's zero point, unless
  const int32_t* b_zeros = nullptr;      // one per column (n values)
  const int32_t* row_bias = nullptr;     // row_bias[i] added to row i before the output (m values)
  const int32_t* col_bias = nullptr;     // col_bias[j] added to column j (n values)
  int max_threads = 0;                   // 0: the current arena's; 1: stay on this thread
  const MathKernels* kernels = nullptr;  // null: the active level's (tests pick a level)
};

// Float A quantized to uint8 as it is packed, with one scale and zero point (the dynamically
// quantized products): element (i, p) at data[i * ld + p], quantized as
// Int8GemmKernels::quantize_u8 quantizes, so the product equals qgemm of the uint8 tensor
// DynamicQuantizeLinear writes with these parameters, without writing that tensor.
struct QFloatA {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  float scale = 1.0f;
  float zero_point = 0.0f;  // an integer in [0, 255]
};

// Float A quantized to uint8 per row as it is packed (the int8 weights of
// SessionOptions::gemm_weights): element (i, p) at data[i * ld + p]; each row i takes its own
// scale s_i and zero point z_i, computed over that row alone as DynamicQuantizeLinear computes
// them over a tensor (the row's range widened to include 0, s_i = (max - min) / 255, z_i =
// round_half_even(-min / s_i)), and is quantized as Int8GemmKernels::quantize_u8 quantizes.
// The int32 sums become floats through the output's per-row scales, which the product sets to
// alpha * s_i (times the caller's f_row_scales, when given).
struct QRowFloatA {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  float alpha = 1.0f;
};

// Columns [j0, j0 + nc) of all k rows of B, written row-major (row stride nc) at `out`. A
// convolution lowers its input patches this way, block by block.
using QBFiller = std::function<void(int64_t j0, int64_t nc, uint8_t* out)>;

// R = A * B for strided A and B (B is packed on the fly). A.cols == B.rows.
void qgemm(const QMatrixView& a, const QMatrixView& b, const QGemmOutput& out,
           const QGemmOptions& options = {});
// The same with B packed; throws if it was packed for another layout.
void qgemm(const QMatrixView& a, const QPackedB& b, const QGemmOutput& out,
           const QGemmOptions& options = {});
// The same with A packed and B (k = a.k() rows, n columns, int8 when b_signed) delivered by
// `fill_b` block by block.
void qgemm(const QPackedA& a, int64_t n, bool b_signed, const QBFiller& fill_b,
           const QGemmOutput& out, const QGemmOptions& options = {});

// R = quantize(A) * B: A's zero point is a.zero_point (options' a_zero and a_zeros are not
// used); B packed, or packed on the fly.
void qgemm(const QFloatA& a, const QPackedB& b, const QGemmOutput& out,
           const QGemmOptions& options = {});
void qgemm(const QFloatA& a, const QMatrixView& b, const QGemmOutput& out,
           const QGemmOptions& options = {});

// R = quantize_rows(A) * B, written as float (out.f is required; options' a_zero and a_zeros
// are not used: the rows' own zero points are): f = float(R) * (alpha * s_i * f_scales[j]) +
// the biases. B packed.
void qgemm(const QRowFloatA& a, const QPackedB& b, const QGemmOutput& out,
           const QGemmOptions& options = {});

// The scale and zero point QRowFloatA gives a row with range [lo, hi] (both widened to
// include 0, NaNs skipped): the one rule the product and its tests share.
void row_quant_params(float lo, float hi, float* scale, float* zero_point);

// Counter for tests and benchmarks: B matrices packed by qgemm on the fly (not prepacked).
uint64_t qgemm_b_packs();

}  // namespace kiln::math
