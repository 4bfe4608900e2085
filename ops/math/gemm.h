// The one GEMM layer: every float matrix product in kiln goes through sgemm().
//
//   C[m x n] = alpha * A[m x k] * B[k x n]  (+ C when accumulate)  (+ bias)  -> activation
//
// A is any strided view (row- or column-major, a transposed or sliced tensor). B is either
// a strided view or a PackedB made once (a constant weight, at session creation) for the
// active level's register tile. The driver blocks for the caches (BLIS order: k blocks, row
// blocks of packed A, B panels, register tiles), packs A per task into thread-local
// buffers, reads a row-major B directly when M is small (a decode step's GEMV streams the
// weights once) and packs it otherwise, and applies the epilogue to each tile while it is
// still in cache. Work is split across the environment's threads only in tasks of at
// least kMinTaskWork multiply-adds (ops/math/threading.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "ops/math/kernels.h"

namespace kiln::math {

// Element (i, j) at data[i * rs + j * cs].
struct MatrixView {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 0;

  static MatrixView row_major(const float* p, int64_t rows, int64_t cols, int64_t ld) {
    return {p, rows, cols, ld, 1};
  }
  static MatrixView col_major(const float* p, int64_t rows, int64_t cols, int64_t ld) {
    return {p, rows, cols, 1, ld};
  }
  MatrixView transposed() const { return {data, cols, rows, cs, rs}; }
};

// What is applied to each output element after the product (and the biases). All but Relu
// go through the vector kernels (VecMathKernels) of the table the product used.
// QuickGelu is x * sigmoid(1.702 x).
enum class Activation : uint8_t { None, Relu, Gelu, GeluTanh, Silu, QuickGelu, Sigmoid, Tanh };
constexpr float kQuickGeluAlpha = 1.702f;

// y[i] = activation(y[i]) for n floats, with `kernels`' vector kernels.
void activate(Activation a, float* y, int64_t n, const MathKernels& kernels);

struct GemmOptions {
  float alpha = 1.0f;
  bool accumulate = false;          // C += product (C must hold values) instead of C =
  const float* bias = nullptr;      // bias[j] added to column j (n values)
  const float* row_bias = nullptr;  // row_bias[i] added to row i (m values)
  Activation activation = Activation::None;
  int max_threads = 0;                   // 0: the current arena's; 1: stay on this thread
  const MathKernels* kernels = nullptr;  // null: the active level's (tests pick a level)
};

// How a packed B holds its values: float, or bfloat16 / float16 (half the memory and
// bandwidth; widened to float in registers, so only the weights' own rounding differs).
enum class PackedType : uint8_t { Float32, BFloat16, Float16 };

// B packed into panels of the register tile's width for one level.
class PackedB {
 public:
  PackedB() = default;
  // Packs `b` with `kernels` (null: the active level's) into memory it owns.
  PackedB(const MatrixView& b, const MathKernels* kernels = nullptr,
          PackedType type = PackedType::Float32);
  // Uses panels already packed by pack_into() at `data` (not owned).
  PackedB(const void* data, int64_t k, int64_t n, int nr, PackedType type = PackedType::Float32);
  // Rows [p0, p0 + k) and columns [j0, j0 + n) of this B (j0 a multiple of nr): a view of the
  // same panels.
  PackedB block(int64_t p0, int64_t k, int64_t j0, int64_t n) const;

  // Elements needed to pack a k x n B for tile width nr (padding included).
  static int64_t packed_floats(int64_t k, int64_t n, int nr);
  static int64_t packed_bytes(int64_t k, int64_t n, int nr, PackedType type);
  // Packs `b` into `out` (packed_bytes() bytes) with `kernels`' layout.
  static void pack_into(const MatrixView& b, void* out, const MathKernels& kernels,
                        PackedType type = PackedType::Float32);

  const void* data() const { return data_; }
  PackedType type() const { return type_; }
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int nr() const { return nr_; }
  // Elements from one panel to the next (k * nr unless this is a block of a taller B).
  int64_t panel_stride() const { return panel_stride_; }

 private:
  std::shared_ptr<char[]> owned_;
  const void* data_ = nullptr;
  int64_t k_ = 0, n_ = 0;
  int nr_ = 0;
  PackedType type_ = PackedType::Float32;
  int64_t panel_stride_ = 0;
};

// A packed into panels of the register tile's height for one level: a panel holds rows
// [i, i + mr) of one k block as kc groups of mr floats (rows past m zero). A constant left
// operand, such as a convolution's filter, is packed once this way.
class PackedA {
 public:
  // k is cut into blocks of kBlock (the driver's k block); each block holds the panels of all
  // row tiles one after another (tile t at t * mr * kc within it), so a product's pass over
  // one k block reads the weights as one sequential stream.
  static constexpr int64_t kBlock = 256;

  PackedA() = default;
  PackedA(const MatrixView& a, const MathKernels* kernels = nullptr);
  PackedA(const float* data, int64_t m, int64_t k, int mr);

  static int64_t packed_floats(int64_t m, int64_t k, int mr);
  static void pack_into(const MatrixView& a, float* out, const MathKernels& kernels);
  // Rows [r0, r0 + rows.rows) (r0 a multiple of mr) of a matrix of m rows, given as `rows`,
  // into their places in pack_into's layout of the whole matrix at `out`.
  static void pack_rows_into(const MatrixView& rows, int64_t r0, int64_t m, float* out,
                             const MathKernels& kernels);

  // Rows [r0, r0 + m) of this A (r0 a multiple of mr): a view of the same panels.
  PackedA rows(int64_t r0, int64_t m) const;
  // The panel of row tile `i` (a multiple of mr) for the k block starting at p0.
  const float* panel(int64_t i, int64_t p0) const {
    const int64_t kc = k_ - p0 < kBlock ? k_ - p0 : kBlock;
    return data_ + p0 * padded_rows_ + (row0_ + i) * kc;
  }
  int64_t m() const { return m_; }
  int64_t k() const { return k_; }
  int mr() const { return mr_; }

 private:
  std::shared_ptr<float[]> owned_;
  const float* data_ = nullptr;
  int64_t m_ = 0, k_ = 0;
  int64_t row0_ = 0;         // the first row of this view in the packed matrix
  int64_t padded_rows_ = 0;  // the packed matrix's rows, padded to whole tiles
  int mr_ = 0;
};

// Produces B block by block, already in panel form: rows [p0, p0 + kc) and columns
// [j0, j0 + nc) of B into ceil(nc / nr) panels of kc x nr floats at `out` (panel q at
// out + q * kc * nr; columns past B's last are zero). A convolution lowers its input patches
// straight into panels this way (im2col without an intermediate matrix).
using BPacker = std::function<void(int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out)>;

// C (row-major, leading dimension ldc) = the product above. A.cols == B.rows.
void sgemm(const MatrixView& a, const MatrixView& b, float* c, int64_t ldc,
           const GemmOptions& options = {});
// The same with B packed; throws if it was packed for another tile width.
void sgemm(const MatrixView& a, const PackedB& b, float* c, int64_t ldc,
           const GemmOptions& options = {});

// Produces A panel by panel: rows [i0, i0 + rows) (rows <= mr, the tile height) and columns
// [p0, p0 + kc) of A into one panel of kc groups of mr floats at `out` (group q holds column
// p0 + q of the rows; rows past `rows` zero). A convolution over a small map gathers its
// input patches (one row of A per output position) straight into panels this way.
using APacker =
    std::function<void(int64_t i0, int rows, int mr, int64_t p0, int64_t kc, float* out)>;

// C = A * B for an A of m rows delivered by `pack_a` (options.alpha must be 1) and a packed
// B; the tasks split B's columns when it is the larger operand.
void sgemm(int64_t m, const APacker& pack_a, const PackedB& b, float* c, int64_t ldc,
           const GemmOptions& options = {});

// C = A * B with A packed (options.alpha must be 1: the panels are as packed) and B of
// `n` columns delivered by `pack_b`.
void sgemm(const PackedA& a, int64_t n, const BPacker& pack_b, float* c, int64_t ldc,
           const GemmOptions& options = {});

// C = A * B with A packed (alpha 1) and B's row p, column j read in place at b_rows[p][j]
// for j < n (an indirect B: a convolution's patch rows inside its padded input). Each row
// must be readable for n floats.
void sgemm_indirect(const PackedA& a, int64_t n, const float* const* b_rows, float* c, int64_t ldc,
                    const GemmOptions& options = {});

// The product for float or double operands given as pointers and strides: C (ldc) =
// alpha * A (m x k, element (i, p) at a[i * ars + p * acs]) * B (k x n, at b[p * brs + j *
// bcs]) (+ C when accumulating), with the options' epilogue for float. Float runs sgemm;
// double (not a hot type in models) runs plain loops, rows split across threads.
template <typename T>
void gemm(const T* a, int64_t m, int64_t k, int64_t ars, int64_t acs, const T* b, int64_t n,
          int64_t brs, int64_t bcs, T* c, int64_t ldc, const GemmOptions& options = {});

// Counters for tests and benchmarks: B matrices packed by sgemm on the fly (not prepacked),
// and those of them packed into memory allocated for the call (B shared by several tasks, or
// larger than a thread's kept buffer holds) rather than into the thread's kept buffer.
uint64_t gemm_b_packs();
uint64_t gemm_b_allocations();

}  // namespace kiln::math
