#include "ops/conv/conv_strategy.h"

#include <array>

#include "ops/conv/wide_layout.h"

namespace kiln::ops::convolution {

// Strided windows: convolutions whose windows all lie along one row (1-D convolutions, and
// 2-D or 3-D ones of maps and kernels one row high) over one input channel per group, with
// at least kMinWindowTaps taps and kMinWindowFilters filters per group: the STFT and
// filterbank front ends of audio models (hundreds of taps at strides of 64 to 160, hundreds
// of filters). The patch matrix of an (image, group) is then its signal itself read as a
// strided matrix, position p's window from p * stride with its taps dilation apart, and the
// convolution is a GEMM product (use_direct is false) instead of direct loops, which spend
// two loads on each multiply-add where the product's register tile reuses every load across
// its filters. With fewer filters per group the product's tiles run mostly empty and the
// direct loops win (measured: docs/performance.md, "Figures cited in code comments").
constexpr int64_t kMinWindowTaps = 16;
constexpr int64_t kMinWindowFilters = 8;

namespace {

// Whether every window lies along one row: a single row of input, kernel and output.
bool one_row(const Geometry& g) {
  return g.in[0] == 1 && g.in[1] == 1 && g.k[0] == 1 && g.k[1] == 1 && g.out[0] == 1 &&
         g.out[1] == 1;
}

}  // namespace

bool use_strided_windows(const Sizes& s, const Geometry& g) {
  return s.cg == 1 && s.mg >= kMinWindowFilters && g.k[2] >= kMinWindowTaps && one_row(g);
}

// Whether a filter of these groups makes strided windows whenever its input is one row
// (use_strided_windows on the filter alone).
bool strided_window_filter(const Tensor& w, int64_t groups) {
  for (size_t d = 2; d + 1 < w.rank(); ++d) {
    if (w.dim(d) != 1) return false;
  }
  return w.dim(1) == 1 && w.dim(0) / groups >= kMinWindowFilters &&
         w.dim(w.rank() - 1) >= kMinWindowTaps;
}

// Depthwise convolutions (one input channel per group) and those with one or two output
// channels per group run as direct loops: a GEMM with so few rows would spend its time
// lowering patches. Strided windows are the exception (see above).
bool use_direct(const Sizes& s, const Geometry& g) {
  return (s.cg == 1 || s.mg <= 2) && !use_strided_windows(s, g);
}

math::ConvGeometry conv_geometry(const Geometry& g) {
  math::ConvGeometry d;
  for (int i = 0; i < 3; ++i) {
    d.in[i] = g.in[i], d.out[i] = g.out[i], d.k[i] = g.k[i];
    d.stride[i] = g.stride[i], d.dil[i] = g.dil[i], d.pad[i] = g.pad[i];
  }
  return d;
}

// Depthwise convolutions (one input and one output channel per group) of 2-D planes of at
// most 64 outputs (8x8) take depthwise_lanes: a channel per vector lane fills every vector
// however small the plane, where the wide path's rows of 7 leave half of each vector empty
// and its per-plane setup weighs on so few outputs. Larger planes fill their vectors, and
// there the lanes path's element-by-element transposes cost more than they save (measured:
// docs/performance.md, "Figures cited in code comments").
bool use_depthwise_lanes(const Sizes& s, const Geometry& g) {
  const math::ConvGeometry cg = conv_geometry(g);
  return s.cg == 1 && s.mg == 1 && g.in[0] == 1 && g.k[0] == 1 && g.out[0] == 1 &&
         g.out[1] * g.out[2] <= 64 && math::depthwise_lanes_floats(cg, 16) <= kLanesTileFloats;
}

// The other depthwise convolutions of small planes take depthwise_wide.
bool use_depthwise_wide(const Sizes& s, const Geometry& g) {
  return s.cg == 1 && !use_depthwise_lanes(s, g) && use_wide_planes(conv_geometry(g), s.n * s.m);
}

// Maps of at most this many output positions are products with the positions as rows:
// Y^T [positions x mg] = patches [positions x cg * kernel] * W^T, the filter a packed B
// streamed once for all the positions. The other way round (the filter as A) the few
// positions make narrow B panels, which run far below the product's peak (measured:
// docs/performance.md, "Figures cited in code comments").
constexpr int64_t kMaxTransposedPositions = 100;
// Convolutions with a window (not 1x1 stride 1) up to this many positions too: a 13x13 map's
// wide rows fill 169 of 224 columns, so it gains this way; a 14x14 map's fill 196 of 224,
// and there (as for 1x1 layers on both) writing Y^T back costs what the narrower panels lose
// (measured: docs/performance.md, "Figures cited in code comments").
constexpr int64_t kMaxTransposedWindowed = 180;

// 1x1, stride 1 and no padding at either end: the patch matrix is the input itself.
bool is_pointwise(const Geometry& g) {
  return g.k_size() == 1 && g.stride == std::array<int64_t, 3>{1, 1, 1} &&
         g.pad == std::array<int64_t, 3>{0, 0, 0} && g.out == g.in;
}

// 3x3 stride-1 convolutions of 2-D maps with enough channels and filters are Winograd
// products (ops/math/winograd.h): F(4x4, 3x3), a quarter of the multiply-adds, over maps of
// at least nine 4x4 tiles; F(2x2, 3x3), 4/9 of them, over smaller maps of at least nine 2x2
// tiles (7x7: 16, where 4x4 tiles are 4 and would fill the products' panels poorly). With
// fewer channels or filters the products are too small to pay for the transforms.
constexpr int64_t kWinogradMinChannels = 8;
constexpr int64_t kWinogradMinTiles = 9;

// The Winograd tile size for a convolution: 4, 2, or 0 where it is not a Winograd one.
int winograd_tile(const Sizes& s, const Geometry& g) {
  if (g.in[0] != 1 || g.out[0] != 1 || g.k[0] != 1 || g.k[1] != 3 || g.k[2] != 3 ||
      g.stride[1] != 1 || g.stride[2] != 1 || g.dil[1] != 1 || g.dil[2] != 1 ||
      s.cg < kWinogradMinChannels || s.mg < kWinogradMinChannels)
    return 0;
  for (const int tile : {4, 2}) {
    if ((g.out[1] + tile - 1) / tile * ((g.out[2] + tile - 1) / tile) >= kWinogradMinTiles)
      return tile;
  }
  return 0;
}

bool use_winograd(const Sizes& s, const Geometry& g) {
  return winograd_tile(s, g) != 0;
}

math::WinogradShape winograd_shape(const Sizes& s, const Geometry& g) {
  return {
      s.cg, s.mg, g.in[1], g.in[2], g.pad[1], g.pad[2], g.out[1], g.out[2], winograd_tile(s, g)};
}

bool use_transposed(const Sizes& s, const Geometry& g) {
  if (use_winograd(s, g)) return false;
  const int64_t positions = g.out_size();
  const int64_t limit = is_pointwise(g) ? kMaxTransposedPositions : kMaxTransposedWindowed;
  return !use_direct(s, g) && positions > 0 && positions <= limit;
}

// The form the float paths read the filter in for these sizes.
FilterForm filter_form(const Sizes& s, const Geometry& g) {
  if (const int tile = winograd_tile(s, g)) {
    return tile == 4 ? FilterForm::Winograd4 : FilterForm::Winograd2;
  }
  return use_transposed(s, g) ? FilterForm::Transposed : FilterForm::Packed;
}

}  // namespace kiln::ops::convolution
