// Float convolutions through the GEMM layer (ops/conv/conv.cpp): Winograd products, the transposed
// product of small maps, the wide path, or patches lowered straight into the GEMM's panels.
#pragma once

#include <cstdint>

#include "ops/conv/conv_strategy.h"
#include "ops/core/kernel.h"

namespace kiln::ops::convolution {

// The float paths' workspace parts (see conv_parts): the wide or direct paths' buffers, and
// the transposed product's.
struct ConvSpace {
  float* wide = nullptr;
  float* source = nullptr;
  float* product = nullptr;
  int64_t* offsets = nullptr;
  float* winograd = nullptr;  // winograd_plan's workspace
  int threads = 1;            // the threads the workspace was planned for
};

math::WinogradPlan winograd_plan(const Sizes& s, const Geometry& g, int threads);

// Float convolution through the GEMM layer; `packed` is pack_filter's form of the filter
// (transposed for small maps: use_transposed). The wide path's buffers are `space.wide`
// (wide_floats of them) when given, else scratch from `ctx` (without a context the path is
// not taken).
void gemm_convolve(OpContext* ctx, const float* x, const float* packed, const float* bias, float* y,
                   const Sizes& s, const Geometry& g, const ConvEpilogue& e,
                   const ConvSpace& space);

}  // namespace kiln::ops::convolution
