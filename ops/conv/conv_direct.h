// The direct float convolutions (ops/conv/conv.cpp, use_direct): depthwise convolutions a channel
// per vector lane or on the wide layout, and the dispatched plane kernels.
#pragma once

#include <cstdint>

#include "ops/conv/conv_strategy.h"

namespace kiln::ops::convolution {

// Floats of the wide depthwise path's slots for these sizes, 0 where the path does not apply.
int64_t depthwise_floats(const Sizes& s, const Geometry& g);

// Floats of the direct loops' padded planes, one per task, 0 where they read in place.
int64_t padded_plane_floats(const Sizes& s, const Geometry& g, int threads);

// Float convolution with the dispatched direct plane kernel: each output plane is the sum
// over its group's input channels. `space` is the workspace's part for the direct loops: the
// wide path's slots for small depthwise planes (depthwise_floats) or each task's padded plane
// (padded_plane_floats).
void direct_convolve(const float* x, const float* w, const float* bias, float* y, const Sizes& s,
                     const Geometry& g, const ConvEpilogue& e, float* space);

}  // namespace kiln::ops::convolution
