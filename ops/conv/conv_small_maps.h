// Float convolutions of small maps as the transposed product (ops/conv/conv.cpp, use_transposed):
// the output positions as the product's rows, the filter's packed transpose streamed once.
#pragma once

#include <cstdint>

#include "ops/conv/conv_strategy.h"

namespace kiln::ops::convolution {

// The transposed product's workspace floats: the padded copy of one group's channels, Y^T of
// one (image, group); and its int64 offsets: each output position's and each patch row's.
struct TransposedSizes {
  int64_t source = 0, product = 0, offsets = 0;
};

TransposedSizes transposed_sizes(const Sizes& s, const Geometry& g);

// A convolution of small maps as the transposed product (use_transposed): per (image,
// group), patches gathered from the input (or its padded copy in `source`) straight into the
// GEMM's A panels, times the filter's packed transpose (`packed`: pack_filter's transposed
// form), with the bias as column bias, into Y^T at `product`; then Y^T is written into y
// transposed (added to y's values for Z) and activated. `offsets` holds
// transposed_sizes().offsets values.
void transposed_convolve(const float* x, const float* packed, const float* bias, float* y,
                         const Sizes& s, const Geometry& g, const ConvEpilogue& e, float* source,
                         float* product, int64_t* offsets);

}  // namespace kiln::ops::convolution
