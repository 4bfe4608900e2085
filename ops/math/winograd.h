// Convolutions with 3x3 filters at stride 1 as Winograd F(M x M, 3 x 3) products, M = 4 or 2.
//
// The output is cut into M x M tiles, each reading an (M + 2) x (M + 2) input window. With
// the filter transformed once (U = G g G^T, P = (M + 2)^2 values per filter and channel,
// packed at load as P GEMM A operands of filters x channels) and each window transformed as
// it is read (V = B^T d B, impl/winograd.h), every transformed position xi is one product
// M_xi = U_xi V_xi (filters x channels times channels x tiles), and each output tile is
// A^T M A. F(4x4, 3x3) takes 36 multiply-adds per channel for 16 outputs where the direct
// product takes 144; F(2x2, 3x3) 16 for 4 where it takes 36, and its 2x2 tiles give small
// maps (7x7: 16 tiles where 4x4 tiles are 4) enough columns for the products.
// The products run on the GEMM layer's register tile (GemmKernels::kernel_cold_a) over
// passes of `block` tiles whose transformed inputs and products stay within a few hundred
// KiB, so the transforms and the products meet in the caches.
//
// The transformed filter is four (M = 2: 16/9) times the filter's size. Rounding: F(4x4, 3x3)
// multiplies by small constants (up to 8 and 1/24), so its results differ from the direct
// convolution's by about a hundred times the direct product's rounding, about 1e-5 of the
// terms' magnitude (the unit tests bound it against a double-precision reference); F(2x2,
// 3x3)'s constants are 1 and 1/2.
#pragma once

#include <cstdint>

#include "ops/math/kernels.h"

namespace kiln::math {

// One image's convolution: channels x in_h x in_w in, filters x out_h x out_w out, a 3x3
// filter at stride 1 without dilation, pad_h rows above and pad_w columns left of the input
// (the outputs' count says how many lie below and right).
// (the outputs' count says how many lie below and right), in output tiles of `tile` (4 or 2).
struct WinogradShape {
  int64_t channels = 0, filters = 0;
  int64_t in_h = 0, in_w = 0, pad_h = 0, pad_w = 0, out_h = 0, out_w = 0;
  int tile = 4;
};

// Floats of the transformed filter: (tile + 2)^2 packed A operands (filters x channels).
int64_t winograd_filter_floats(int64_t filters, int64_t channels, int mr, int tile);
// w ([filters][channels][3][3], row-major) transformed for `tile` (in double) and packed into
// `out`.
void winograd_pack_filter(const float* w, int64_t filters, int64_t channels, int tile, float* out,
                          const MathKernels& kernels);

// How winograd_convolve runs a shape on a number of threads; a pure function of them, so the
// op's workspace rule and its kernel agree.
struct WinogradPlan {
  WinogradShape shape;
  int64_t images = 1;
  int64_t tiles_w = 0, tiles = 0;  // per image
  int64_t block = 0, blocks = 0;   // tiles per pass, passes per image
  int tasks = 1;
  // Each task runs its own passes (every pass's buffers its own), or, when there are too few
  // of them, each pass's filters are split among the tasks (each transforming the input).
  bool by_pass = false;
  // The products of a pass (WinogradTransforms' layout): V (channels x P rows) and M
  // (filters x P rows) of ld floats, a multiple of the register tile's width.
  int64_t ld = 0;
  int64_t slot_floats = 0, slots = 1, row_floats = 0;  // a pass's buffers per task

  int64_t workspace_floats() const { return slots * slot_floats + tasks * row_floats; }
};

WinogradPlan winograd_plan(const WinogradShape& shape, int64_t images, int threads,
                           const MathKernels& kernels);

// y = the convolution of x for every image: x's images x_image floats apart (channel planes
// in_h * in_w apart), y's y_image apart (planes out_h * out_w apart); `filter` from
// winograd_pack_filter; y = conv + bias[f] (bias may be null), plus y's values when
// `accumulate`, then max(y, 0) when `relu`. `space` holds plan.workspace_floats() floats.
void winograd_convolve(const WinogradPlan& plan, const float* x, int64_t x_image,
                       const float* filter, const float* bias, bool accumulate, bool relu, float* y,
                       int64_t y_image, float* space, const MathKernels& kernels);

// Counter for tests and benchmarks: winograd_convolve calls (one per image batch and group).
uint64_t winograd_convolutions();

}  // namespace kiln::math
