// The dispatch table: every kernel compiled once per instruction-set level.
//
// Each level's unit (isa_generic.cpp, isa_avx2.cpp, isa_avx512.cpp) compiles the sources in
// ops/math/impl/ against its vector type (ops/math/simd/) inside its own namespace and fills
// one MathKernels. Op files call kernels().family.fn(...) and never test the processor
// themselves. A new kernel family is a struct of function pointers here, its source in
// impl/, and one line in each unit's table.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/math/isa.h"

namespace kiln::math {

// Element conversions between float and the 16-bit float types (round to nearest even;
// NaN stays NaN).
struct ConvertKernels {
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
};

// What a GEMM tile kernel applies to its sums as it stores them, after adding C's values when
// accumulating: row_bias[r] to the tile's row r and col_bias[j] to its column j (the tile's
// own, from its first row and column; either may be null), then max(., 0) when `relu`. A
// kernel given none stores the sums as they are.
struct TileEpilogue {
  const float* row_bias = nullptr;
  const float* col_bias = nullptr;
  bool relu = false;
};

// Single-precision GEMM building blocks (impl/sgemm.h; the driver is gemm.h).
struct GemmKernels {
  int mr = 0, nr = 0;  // the register tile: rows of A, columns of B
  // C[rows x cols] (+)= A_packed[k x mr] * B[k x nr] (row stride ldb: nr when B is packed);
  // rows <= mr, cols <= nr.
  // `e` (may be null) as the tile is stored: see TileEpilogue. So for every tile kernel below.
  void (*kernel)(int64_t k, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                 int rows, int cols, bool accumulate, const TileEpilogue* e) = nullptr;
  // rows (<= mr) x k of a strided A, times alpha, into one packed panel of k x mr.
  void (*pack_a)(const float* a, int64_t rs, int64_t cs, int rows, int64_t k, float alpha,
                 float* out) = nullptr;
  // k x n of a strided B into ceil(n / nr) panels of k x nr (padded with zeros).
  void (*pack_b)(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n,
                 float* out) = nullptr;
  float (*dot)(const float* x, const float* y, int64_t n) = nullptr;
  // Benchmarks: independent FMA chains for `iterations` rounds; returns the flops done.
  double (*fma_peak_loop)(int64_t iterations) = nullptr;
  // The tile with B in bfloat16 / float16 panels (always packed, so padded), widened to
  // float in registers.
  void (*kernel_bf16)(int64_t k, const float* a, const uint16_t* b, int64_t ldb, float* c,
                      int64_t ldc, int rows, int cols, bool accumulate,
                      const TileEpilogue* e) = nullptr;
  void (*kernel_f16)(int64_t k, const float* a, const uint16_t* b, int64_t ldb, float* c,
                     int64_t ldc, int rows, int cols, bool accumulate,
                     const TileEpilogue* e) = nullptr;
  // pack_b into bfloat16 / float16 panels (each value rounded to nearest even).
  void (*pack_b_bf16)(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n,
                      uint16_t* out) = nullptr;
  void (*pack_b_f16)(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n,
                     uint16_t* out) = nullptr;
  // `kernel` for B in packed panels (padded to nr columns): edge tiles load whole vectors.
  void (*kernel_packed)(int64_t k, const float* a, const float* b, int64_t ldb, float* c,
                        int64_t ldc, int rows, int cols, bool accumulate,
                        const TileEpilogue* e) = nullptr;
  // `kernel_packed` for a packed constant A that streams from memory (a convolution's
  // filter, larger than the caches): it prefetches A well ahead of its reads.
  void (*kernel_cold_a)(int64_t k, const float* a, const float* b, int64_t ldb, float* c,
                        int64_t ldc, int rows, int cols, bool accumulate,
                        const TileEpilogue* e) = nullptr;
  // `kernel_packed` prefetching the packed B panel ahead (the first row tile to meet a
  // panel of constant weights, which stream from memory).
  void (*kernel_cold_b)(int64_t k, const float* a, const float* b, int64_t ldb, float* c,
                        int64_t ldc, int rows, int cols, bool accumulate,
                        const TileEpilogue* e) = nullptr;
  // The tile with B read in place through a table of row pointers: B's row p, column j at
  // b_rows[p][j0 + j] (an indirect B: a convolution's patch rows inside its padded input,
  // so nothing is lowered). A is a packed constant, prefetched as in `kernel_cold_a`.
  void (*kernel_indirect)(int64_t k, const float* a, const float* const* b_rows, int64_t j0,
                          float* c, int64_t ldc, int rows, int cols, bool accumulate,
                          const TileEpilogue* e) = nullptr;
  // The tile with A read in place, row-major: row r, column p at a[r * lda + p] (no alpha);
  // B in packed panels. For products with one or two column panels, where a packed A panel
  // would be read only once or twice after it is made.
  void (*kernel_rows_a)(int64_t k, const float* a, int64_t lda, const float* b, float* c,
                        int64_t ldc, int rows, int cols, bool accumulate,
                        const TileEpilogue* e) = nullptr;
  // y[j] = dot(x, b + j * ldb) over k elements, for j < n (a row vector times a
  // column-major matrix: attention scores of one query against a row-major K).
  void (*dots)(const float* x, const float* b, int64_t ldb, int64_t k, int64_t n,
               float* y) = nullptr;
  // y[j] = sum_p w[p] * b[p * ldb + j] for j < n (a row vector times a row-major matrix,
  // streaming its rows once).
  void (*gemv_rows)(const float* w, const float* b, int64_t ldb, int64_t k, int64_t n,
                    float* y) = nullptr;
  // A finished tile's epilogue: c[i][j] += bias[j] + row_bias[i] (either may be null), then
  // max(c, 0) when `relu`.
  void (*epilogue)(float* c, int64_t ldc, int64_t rows, int64_t cols, const float* bias,
                   const float* row_bias, bool relu) = nullptr;
};

// Spatial sizes of one convolution, always three dimensions (1-D and 2-D problems have
// leading sizes of 1).
struct ConvGeometry {
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, stride[3] = {1, 1, 1},
          dil[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
};

// Rows (depth, height) and row width of the padded, phase-split copy of an input plane
// that ConvKernels::pad_plane writes: rows[0] x rows[1] rows of stride[2] phases of
// len[2] floats each (rows[2]: the padded width actually read).
inline void conv_padded_extent(const ConvGeometry& g, int64_t rows[3], int64_t len[3]) {
  for (int i = 0; i < 3; ++i) {
    rows[i] = (g.out[i] - 1) * g.stride[i] + (g.k[i] - 1) * g.dil[i] + 1;
    len[i] = (rows[i] + g.stride[i] - 1) / g.stride[i];
  }
}
// Floats of that copy.
inline int64_t conv_padded_floats(const ConvGeometry& g) {
  int64_t rows[3], len[3];
  conv_padded_extent(g, rows, len);
  return rows[0] * rows[1] * g.stride[2] * len[2];
}

// The zero-padded input extent of ConvKernels::depthwise_lanes's tile for a 2-D geometry: rows
// and columns, enough for every tap of every output and for the whole input at its pads.
inline void depthwise_lanes_extent(const ConvGeometry& g, int64_t& rows, int64_t& cols) {
  rows = std::max(g.pad[1] + g.in[1], (g.out[1] - 1) * g.stride[1] + (g.k[1] - 1) * g.dil[1] + 1);
  cols = std::max(g.pad[2] + g.in[2], (g.out[2] - 1) * g.stride[2] + (g.k[2] - 1) * g.dil[2] + 1);
}
// Floats of that tile at `lanes` floats a vector: the padded input positions, the filters'
// taps and the output positions, each a vector.
inline int64_t depthwise_lanes_floats(const ConvGeometry& g, int64_t lanes) {
  int64_t rows = 0, cols = 0;
  depthwise_lanes_extent(g, rows, cols);
  return (rows * cols + g.k[1] * g.k[2] + g.out[1] * g.out[2]) * lanes;
}

// Each tap's offset in that copy from an output row's first tap (taps in filter order).
inline void conv_tap_offsets(const ConvGeometry& g, int64_t* off) {
  int64_t rows[3], len[3];
  conv_padded_extent(g, rows, len);
  const int64_t s = g.stride[2], row = s * len[2];
  int64_t t = 0;
  for (int64_t kd = 0; kd < g.k[0]; ++kd) {
    for (int64_t kh = 0; kh < g.k[1]; ++kh) {
      for (int64_t kw = 0; kw < g.k[2]; ++kw) {
        const int64_t c = kw * g.dil[2];
        off[t++] = (kd * g.dil[0] * rows[1] + kh * g.dil[1]) * row + (c % s) * len[2] + c / s;
      }
    }
  }
}

// What ConvKernels::wide_plane computes over a window's taps.
enum class WideOp : uint8_t { Conv, Max, Sum };

// What ConvKernels::wide_plane does to each output as it stores it, in this order: add y's
// value (`accumulate`), times row_scale[od * out[1] + oh] * col_scale[ow] (when row_scale
// is given: average pooling's divisors), max(y, 0) (`relu`).
struct WideEpilogue {
  bool accumulate = false;
  bool relu = false;
  const float* row_scale = nullptr;
  const float* col_scale = nullptr;
};

// Convolution kernels (impl/conv.h, with impl/conv_direct.h, impl/conv_pool.h and
// impl/conv_wide.h): direct convolution of one plane, for the convolutions where a GEMM is the
// wrong shape, pooling, the wide layout, and the lowering of patches into GEMM panels.
struct ConvKernels {
  // The input plane `x` padded with `fill` (zeros for convolutions, -inf for max pooling)
  // and split into stride phases (conv_padded_floats floats at `out`).
  void (*pad_plane)(const float* x, const ConvGeometry& g, float fill, float* out) = nullptr;
  // y += w (*) x over one output plane, x given as pad_plane's copy and each tap's offset in
  // it as conv_tap_offsets gives them.
  void (*padded_plane)(const float* xp, const float* w, const int64_t* tap_offsets,
                       const ConvGeometry& g, float* y) = nullptr;
  // Rows [p0, p0 + kc) and output positions [j0, j0 + nc) of a convolution's patch matrix
  // (im2col) straight into GEMM B panels of this level's tile width (see math::BPacker).
  void (*im2col_panels)(const float* x, const ConvGeometry& g, int64_t p0, int64_t kc, int64_t j0,
                        int64_t nc, float* out) = nullptr;
  // Pooling of one plane from pad_plane's copy: y = the maximum (`max`) or the sum of each
  // window's taps (tap offsets as conv_tap_offsets gives them), written over y.
  void (*pool_plane)(const float* xp, const int64_t* tap_offsets, const ConvGeometry& g, bool max,
                     float* y) = nullptr;
  // y = init + w (*) x over one output plane straight from the unpadded input plane `x`, for
  // convolutions with column stride 1 or 2 and at most direct_max_width filter columns:
  // init is y's values plus `bias` when `accumulate`, else `bias`; then max(y, 0) when `relu`.
  void (*direct_plane)(const float* x, const float* w, const ConvGeometry& g, float bias,
                       bool accumulate, bool relu, float* y) = nullptr;
  // Pooling of one plane straight from the unpadded input plane, the same shapes as
  // direct_plane: y = the maximum (`max`, NaN inputs skipped) or the sum of each window's
  // taps inside the input, a sum times row_scale[od * out[1] + oh] * col_scale[ow] when
  // row_scale is given (average pooling's divisors, in the same pass).
  void (*direct_pool_plane)(const float* x, const ConvGeometry& g, bool max, const float* row_scale,
                            const float* col_scale, float* y) = nullptr;
  // `rows` rows of a plane's wide form (ops/conv/wide_layout.h) at dst, one after another, n
  // floats each: row i is the input row ih = ih0 + i * sh of the plane x (in_h rows of
  // `width` floats; null: no row inside), dst[j] = its column base + j * s where ih and that
  // column are inside the input, `fill` elsewhere. Vectors with masked loads for s 1 and 2
  // (the column masks found once for all the rows); nothing read outside the input.
  void (*pad_rows)(const float* x, int64_t in_h, int64_t width, int64_t ih0, int64_t sh,
                   int64_t rows, int64_t base, int64_t s, int64_t n, float fill,
                   float* dst) = nullptr;
  // pad_rows at column stride 2 into both column phases in one pass, for `rows` rows given
  // by pointer (src[i] null: a row outside the input): dst0[i][j] = src[i]'s column
  // base + 2j, dst1[i][j] = its column base + 2j + 1 (`fill` outside [0, width)), for j < n;
  // each pair of input vectors loaded once and split into its even and odd columns.
  void (*pad_rows_pair)(const float* const* src, int64_t rows, int64_t width, int64_t base,
                        int64_t n, float fill, float* const* dst0, float* const* dst1) = nullptr;
  // One output plane y (g.out) from a plane's wide form xp (ops/conv/wide_layout.h: phases of
  // len1 rows of len2 floats; the inputs of wide position i under tap t at xp[i + taps[t]],
  // output (od, oh, ow) at wide position (od * len1 + oh) * len2 + ow): `init` plus the sum
  // of w[t] * xp[i + taps[t]] over the taps (Conv, in filter order), or their maximum (Max:
  // from -inf, NaN inputs skipped) or sum (Sum: from 0), computed in whole vectors over the
  // wide positions into `scratch`, then each output row stored with the epilogue. xp needs
  // wide_slack readable floats past its last position, scratch room for the wide positions
  // plus wide_slack. Max and Sum over a 2-D window at stride 1 are separable: each row of
  // taps first, in place over xp (which they leave overwritten), then the rows' results
  // down each window's column.
  void (*wide_plane)(float* xp, const float* w, const int64_t* taps, int64_t n_taps, WideOp op,
                     float init, const ConvGeometry& g, int64_t len1, int64_t len2,
                     const WideEpilogue& e, float* scratch, float* y) = nullptr;
  // Depthwise convolution of `lanes` (at most `lanes` below) consecutive channels at once, one
  // per vector lane, for 2-D geometries: x's planes ip floats apart, w their kp-tap filters,
  // bias per channel (or null); y's planes op floats apart get bias + taps, plus y's values
  // when `accumulate`, then max(., 0) when `relu`. `tile` holds depthwise_lanes_floats(g).
  void (*depthwise_lanes)(const float* x, int64_t ip, const float* w, const float* bias, int lanes,
                          const ConvGeometry& g, bool accumulate, bool relu, float* tile, float* y,
                          int64_t op) = nullptr;
  // Max or sum pooling of `planes` 1-D or 2-D planes (x's ip floats apart, y's op apart) for
  // the geometries pool_planes_fit takes, straight from the input: each input row reduced
  // across every output column's window row once, into a buffer of pool_rows_floats on the
  // stack, then each output row reduced from its window's rows there. y = the maximum
  // (`max`: NaN inputs skipped, -inf for a window with no tap inside the input) or the sum
  // of each window's taps inside the input, a sum times row_scale[oh] * col_scale[ow] when
  // row_scale is given. The work of a call is set up once for all its planes.
  void (*pool_planes)(const float* x, int64_t ip, int64_t planes, const ConvGeometry& g, bool max,
                      const float* row_scale, const float* col_scale, float* y,
                      int64_t op) = nullptr;
  int lanes = 0;  // this level's vector width in floats
  static constexpr int64_t direct_max_width = 16;
  // pool_planes' buffer of row results, in floats.
  static constexpr int64_t pool_rows_floats = 4096;
  static constexpr int64_t wide_slack = 16;  // the widest vector (avx512) in floats
  // wide_plane's separable Max and Sum take windows up to this many rows and columns.
  static constexpr int64_t wide_separable_max = 16;
};

// Whether ConvKernels::pool_planes takes geometry g: 2-D or 1-D (one depth slice and a
// window of one), column stride 1 or 2, at most direct_max_width window columns, and the
// row results under one output row's window within its buffer (rows of whole vectors of the
// widest level).
inline bool pool_planes_fit(const ConvGeometry& g) {
  constexpr int64_t kWidest = ConvKernels::wide_slack;
  const int64_t pitch = (g.out[2] + kWidest - 1) / kWidest * kWidest;
  return g.in[0] == 1 && g.out[0] == 1 && g.k[0] == 1 && g.pad[0] == 0 && g.stride[2] <= 2 &&
         g.k[2] <= ConvKernels::direct_max_width &&
         ((g.k[1] - 1) * g.dil[1] + 1) * pitch <= ConvKernels::pool_rows_floats;
}

// The tiles of one image that one pass of a Winograd F(M x M, 3 x 3) convolution
// transforms (ops/math/winograd.h; M is 4 or 2): M x M output tiles, tiles_w to a row
// (ceil(out_w / M)), numbered row by row; the pass takes tiles [t0, t0 + count). Tile
// (ty, tx) reads the (M + 2) x (M + 2) input window at row M ty - pad_h, column M tx - pad_w
// (zero outside the input).
struct WinogradTiles {
  int64_t in_h = 0, in_w = 0, pad_h = 0, pad_w = 0, out_h = 0, out_w = 0;
  int64_t tiles_w = 0, t0 = 0, count = 0;
};

// Floats of one strip of the Winograd transforms' scratch for `count` tiles (at any level's
// vector width and either tile size: 4 floats a tile, rounded up to whole vectors of tiles,
// and the reads and writes past the end), and the scratch: twelve strips.
inline int64_t winograd_strip_len(int64_t count) {
  return 4 * ((count + 15) / 16 * 16) + 80;
}
inline int64_t winograd_scratch_floats(int64_t count) {
  return 12 * winograd_strip_len(count);
}

// The transforms of one Winograd F(M x M, 3 x 3) convolution (impl/winograd.h). Its
// P = (M + 2)^2 transformed positions xi are P products (ops/math/winograd.h) whose B
// operands `input` writes and whose results `output` reads, both laid out position-minor:
// row r (a channel, or a filter) of position xi at (r * P + xi) * ld, one float per tile.
struct WinogradTransforms {
  // Channels [c0, c1) of x (channel planes `ip` floats apart) over the pass's tiles: each
  // tile's input window d as B^T d B, value xi of pass tile t and channel c at
  // v[(c * P + xi) * ldv + t], and the rest of each row up to the tiles rounded up to whole
  // vectors (ldv must hold them). `rows`: winograd_scratch_floats(count).
  void (*input)(const float* x, int64_t ip, int64_t c0, int64_t c1, const WinogradTiles& b,
                float* v, int64_t ldv, float* rows) = nullptr;
  // Filters [k0, k1): the products of pass tile t at m[(k * P + xi) * ldm + t] (readable for
  // the tiles rounded up to whole vectors) as A^T m A, plus bias[k] (bias may be null), plus
  // y's values when `accumulate`, then max(y, 0) when `relu`, into y's planes (`op` floats
  // apart, out_h x out_w each) at the tiles' outputs inside the plane. `rows`:
  // winograd_scratch_floats(count).
  void (*output)(const float* m, int64_t ldm, int64_t k0, int64_t k1, const WinogradTiles& b,
                 const float* bias, bool accumulate, bool relu, float* y, int64_t op,
                 float* rows) = nullptr;
};

struct WinogradKernels {
  WinogradTransforms f4;  // F(4x4, 3x3): 36 positions
  WinogradTransforms f2;  // F(2x2, 3x3): 16 positions
};

// Float arithmetic on rows: y[i] = a[i * sa] op b[i * sb] (impl/binary.h). Fast when both
// strides are 1 or one is 0 (a broadcast scalar); y may be a or b.
struct BinaryKernels {
  using Row = void (*)(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n);
  Row add = nullptr, sub = nullptr, mul = nullptr, div = nullptr;
  // y[i] = x[i] * scale[i * ss] + shift[i * ss], then max(y, 0) when `relu` (a NaN gives 0,
  // as Relu does), with ss 0 (one scale and shift for the row: a channel's plane) or 1 (one
  // per element: a row of channels). One rounding where the level has FMA, two at generic.
  // y may be x.
  void (*affine)(const float* x, const float* scale, const float* shift, int64_t ss, float* y,
                 int64_t n, bool relu) = nullptr;
};

// Float math over arrays (impl/vecmath.h, impl/vecmath_rows.h). Elementwise: y[i] = f(x[i])
// for n elements, y may be x. Within a few ulp of the exact function (impl/vecmath.h lists
// each bound); NaN gives NaN, infinities their limits.
struct VecMathKernels {
  using Elementwise = void (*)(const float* x, float* y, int64_t n);
  Elementwise exp = nullptr;
  Elementwise log = nullptr;  // log(0) = -inf, log(x < 0) = NaN
  Elementwise erf = nullptr;
  Elementwise tanh = nullptr;
  Elementwise sigmoid = nullptr;
  Elementwise gelu = nullptr;       // x (1 + erf(x / sqrt2)) / 2
  Elementwise gelu_tanh = nullptr;  // x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2
  Elementwise silu = nullptr;       // x * sigmoid(x)
  // x * sigmoid(alpha x) (QuickGELU: alpha 1.702)
  void (*swish)(const float* x, float* y, int64_t n, float alpha) = nullptr;
  // One row of n: y = exp(x - max) / sum; log_softmax y = x - max - log(sum). A row whose
  // max is +-inf or that holds a NaN gives NaN throughout (as the ops always did). y may be x.
  void (*softmax)(const float* x, float* y, int64_t n) = nullptr;
  void (*log_softmax)(const float* x, float* y, int64_t n) = nullptr;
  // Softmax's numerators, in place, for attention (which divides after its product with V):
  // x = exp(x + bias - max) over one row of n (bias may be null); returns the sum. A row
  // that is -inf throughout (every key masked) becomes zeros and gives 0; a NaN, or a max
  // of +inf, gives NaN.
  float (*softmax_numerators)(float* x, const float* bias, int64_t n) = nullptr;
  // One row of n: y = (x - mean) * inv_std * scale + bias, inv_std = 1 / sqrt(var + epsilon);
  // scale, bias, mean and inv_std may be null (scale 1, bias 0, statistics not stored).
  void (*layer_norm)(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                     float epsilon, float* mean, float* inv_std) = nullptr;
  // One row of n: sum = a + b + bias, then y = layer_norm(sum) as above (bias, scale, beta,
  // mean and inv_std may be null). sum may be a, b or y; y may be a.
  void (*skip_layer_norm)(const float* a, const float* b, const float* bias, float* sum, float* y,
                          int64_t n, const float* scale, const float* beta, float epsilon,
                          float* mean, float* inv_std) = nullptr;
  // One row of n: y = x * inv_std * scale, inv_std = 1 / sqrt(mean(x^2) + epsilon) (scale
  // and inv_std may be null).
  void (*rms_norm)(const float* x, float* y, int64_t n, const float* scale, float epsilon,
                   float* inv_std) = nullptr;
  float (*sum)(const float* x, int64_t n) = nullptr;
  float (*max)(const float* x, int64_t n) = nullptr;  // NaN if any is; -inf when n == 0
};

// Added to every element (i, j) of a finished int32 tile of the int8 GEMM, while it is still
// in registers: row_add[i] + col_add[j] + row_mul[i] * col_mul[j] (a term is left out when
// its pointers are null; column arrays hold nr values). The driver (qgemm.h) expresses the
// zero points and biases this way.
struct Int8TileFix {
  const int32_t* row_add = nullptr;
  const int32_t* col_add = nullptr;
  const int32_t* row_mul = nullptr;
  const int32_t* col_mul = nullptr;
};

// 8-bit integer GEMM building blocks (impl/qgemm.h; the driver is qgemm.h). The tile
// multiplies uint8 A by int8 B into int32, exactly (no intermediate saturates); the packers
// flip the sign bit of the other signednesses on the way in (`flip` = 0x80) and return the
// sums the driver needs to correct for it.
struct Int8GemmKernels {
  const char* layout = nullptr;  // names the packed layouts, for caches of packed weights
  int mr = 0, nr = 0;            // the register tile: rows of A, columns of B
  int kb = 0;                    // k values per group: packed k is a multiple of it
  // rows (<= mr) x k of A, element (r, p) at a[r * rs + p * cs] xor flip, into one panel of
  // ceil(k / kb) groups of mr 32-bit words (zero padded); with row_sums, the sum of each
  // row's (flipped, unsigned) values into row_sums[0, rows).
  void (*pack_a)(const uint8_t* a, int64_t rs, int64_t cs, int rows, int64_t k, uint8_t flip,
                 int32_t* out, int32_t* row_sums) = nullptr;
  // k x n of B, element (p, j) at b[p * rs + j * cs] xor flip, into ceil(n / nr) panels of
  // ceil(k / kb) * kb * nr bytes (zero padded), and the sum of each column's (flipped, signed)
  // values into col_sums[0, ceil(n / nr) * nr) (zero past n).
  void (*pack_b)(const uint8_t* b, int64_t rs, int64_t cs, int64_t k, int64_t n, uint8_t flip,
                 uint8_t* out, int32_t* col_sums) = nullptr;
  // C[rows x cols] = A panel * B panel over `groups` k groups, plus `fix`; rows <= mr,
  // cols <= nr.
  void (*kernel)(int64_t groups, const int32_t* a, const uint8_t* b, int32_t* c, int64_t ldc,
                 int rows, int cols, const Int8TileFix& fix) = nullptr;
  // y[j] = saturate(round_half_even(float(acc[j]) * scale[j * scale_step]) + zero_point) for
  // j < n, as int8 when out_signed, else uint8; scale_step is 0 or 1, products in float.
  void (*requantize)(const int32_t* acc, int64_t n, const float* scale, int scale_step,
                     int32_t zero_point, bool out_signed, uint8_t* y) = nullptr;
  // y[j] = float(acc[j]) * scale[j * scale_step] (+ bias[j] when given), added to y[j] when
  // accumulate, for j < n: the float output of the dynamically quantized products.
  void (*to_float)(const int32_t* acc, int64_t n, const float* scale, int scale_step,
                   const float* bias, bool accumulate, float* y) = nullptr;
  // Dynamic quantization of float activations to uint8 (ops/quant/quantize.h): the smallest and
  // largest of x[0, n) and 0, NaNs skipped; and y[i] = saturate(round_half_even(x[i] / scale)
  // + zero_point), a NaN giving 0.
  void (*quant_range)(const float* x, int64_t n, float* lo, float* hi) = nullptr;
  void (*quantize_u8)(const float* x, int64_t n, float scale, float zero_point,
                      uint8_t* y) = nullptr;
  // rows (<= mr) x k of float A (row stride lda) quantized as quantize_u8 does, packed as
  // pack_a packs uint8 A, in one pass: dynamic quantization fused into the packing. Row r
  // takes scale[r * param_step] and zero_point[r * param_step] (param_step 0: one scale and
  // zero point for all rows, 1: one per row).
  void (*pack_a_quantized)(const float* a, int64_t lda, int rows, int64_t k, const float* scale,
                           const float* zero_point, int param_step, int32_t* out,
                           int32_t* row_sums) = nullptr;
};

// B of com.microsoft.MatMulNBits as onnxruntime lays it out: column j (of n) holds its k
// values in `blocks` blocks of `block` values, each block's `bits`-bit values packed into
// block * bits / 8 bytes (4-bit: element 2i in the low nibble of byte i, 2i + 1 in the high
// one; the last block padded). Element (p, j) = (q - zero point) * scale of its block.
struct NBitsMatrix {
  const uint8_t* data = nullptr;             // [n][blocks][block * bits / 8]
  const float* scales = nullptr;             // [n][blocks]
  const uint8_t* zero_points = nullptr;      // packed like the values, zp_bytes per column
  const float* float_zero_points = nullptr;  // [n][blocks]; without either: 2^(bits - 1)
  int bits = 4;
  int64_t k = 0, n = 0, block = 0, blocks = 0;

  int64_t block_bytes() const { return block * bits / 8; }
  int64_t zp_bytes() const { return (blocks * bits + 7) / 8; }
  float zero_point(int64_t j, int64_t b) const {
    if (float_zero_points) return float_zero_points[j * blocks + b];
    if (!zero_points) return static_cast<float>(1 << (bits - 1));
    const uint8_t* z = zero_points + j * zp_bytes();
    return static_cast<float>(bits == 8 ? z[b] : (z[b / 2] >> (b % 2 * 4)) & 15);
  }
};

// Products with an NBitsMatrix B (impl/nbits.h; the op is ops/quant/matmul_nbits.cpp). The weights
// stay packed: a few rows of A stream them once, each block widened to float in registers.
struct NBitsKernels {
  int max_rows = 0;  // rows of A one gemv call takes
  // Rows x k of A (row stride lda) in the order gemv reads them, into `out` (rows x
  // blocks * block floats): zero padded, 4-bit blocks with their even-indexed values first;
  // and each row's block sums into sums[r * blocks + b].
  void (*prepare_a)(const float* a, int64_t lda, int rows, const NBitsMatrix& b, float* out,
                    float* sums) = nullptr;
  // y[r * ldy + j] = row r of A times column j of B, for r < rows (<= max_rows) and j in
  // [j0, j1); a and sums from prepare_a.
  void (*gemv)(const float* a, const float* sums, int rows, const NBitsMatrix& b, int64_t j0,
               int64_t j1, float* y, int64_t ldy) = nullptr;
  // Columns [j0, j1) of B as float, column j in the row out + (j - j0) * blocks * block, in
  // prepare_a's order (a prepared row of A times such a row is their product).
  void (*dequantize_rows)(const NBitsMatrix& b, int64_t j0, int64_t j1, float* out) = nullptr;
  // accuracy_level 4 (impl/nbits_int8.h): rows x k of A quantized to int8 per block of B,
  // into `out` (rows x blocks * block bytes, zero padded, 4-bit blocks in chunks of 32 with
  // each chunk's even-indexed values first); each block's scale (amax / 127) into
  // scales[r * blocks + b] and that scale times the block's quantized sum into sums.
  void (*quantize_a)(const float* a, int64_t lda, int rows, const NBitsMatrix& b, int8_t* out,
                     float* scales, float* sums) = nullptr;
  // gemv with quantize_a's rows: each block an integer dot product, scaled in float.
  void (*gemv_int8)(const int8_t* a, const float* scales, const float* sums, int rows,
                    const NBitsMatrix& b, int64_t j0, int64_t j1, float* y, int64_t ldy) = nullptr;
};

struct MathKernels {
  Isa isa = Isa::Generic;
  ConvertKernels convert;
  GemmKernels gemm;
  ConvKernels conv;
  WinogradKernels winograd;
  BinaryKernels binary;
  VecMathKernels vec;
  Int8GemmKernels int8_gemm;
  NBitsKernels nbits;
};

// The table of active_isa() (throws as active_isa() does).
const MathKernels& kernels();
// The table of one level; throws kiln::Error when this processor does not run it. Tests
// use it to compare every level the processor runs within one process.
const MathKernels& kernels_for(Isa isa);
// kernels_for(isa) without the optional extensions beyond the level (AVX512-VNNI), which
// kernels_for uses where the processor has them: tests run both variants this way.
const MathKernels& kernels_without_extensions(Isa isa);

}  // namespace kiln::math
