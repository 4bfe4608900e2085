// Which path a float convolution takes (ops/conv/conv.cpp): direct loops (depthwise lanes or the
// wide layout among them), strided windows, Winograd, the transposed product, or the GEMM's
// wide or lowered paths; and the types those paths share. Each rule's reasons and measurements
// are with its definition (ops/conv/conv_strategy.cpp).
#pragma once

#include <cstdint>

#include "kiln/tensor.h"
#include "ops/conv/conv_filter.h"
#include "ops/core/geometry.h"
#include "ops/math/gemm.h"
#include "ops/math/kernels.h"
#include "ops/math/winograd.h"

namespace kiln::ops::convolution {

// Spatial sizes of one convolution, always three dimensions: 1-D and 2-D problems get
// leading dimensions of size 1.
using Geometry = Windows3;

struct Sizes {
  int64_t n, c, m, groups, cg, mg;
};

// What a fused convolution does besides the product: start from y's values (Z) instead of
// zeros, and the activation applied to the finished output.
struct ConvEpilogue {
  bool accumulate = false;
  math::Activation activation = math::Activation::None;
};

math::ConvGeometry conv_geometry(const Geometry& g);

bool use_strided_windows(const Sizes& s, const Geometry& g);
bool strided_window_filter(const Tensor& w, int64_t groups);
bool use_direct(const Sizes& s, const Geometry& g);

// The stack tile of depthwise_lanes, in floats (at the widest vector, 16 floats).
constexpr int64_t kLanesTileFloats = 10240;

bool use_depthwise_lanes(const Sizes& s, const Geometry& g);
bool use_depthwise_wide(const Sizes& s, const Geometry& g);
bool is_pointwise(const Geometry& g);
int winograd_tile(const Sizes& s, const Geometry& g);
bool use_winograd(const Sizes& s, const Geometry& g);
math::WinogradShape winograd_shape(const Sizes& s, const Geometry& g);
bool use_transposed(const Sizes& s, const Geometry& g);
FilterForm filter_form(const Sizes& s, const Geometry& g);

}  // namespace kiln::ops::convolution
