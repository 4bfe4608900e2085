// The GEMM's wide path for float convolutions (ops/conv/conv.cpp): each input channel laid out once
// in stride phases (ops/conv/wide_layout.h), the patch matrix's rows read in place, over bands of
// output rows.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/conv/conv_strategy.h"
#include "ops/conv/wide_layout.h"
#include "ops/math/gemm.h"

namespace kiln::ops::convolution {

// The wide path's layout, the same for every (image, group): the extents and each
// patch-matrix row's offset in the laid-out channels.
struct WideLayout : WideExtent {
  std::vector<int64_t> row_offsets;

  WideLayout(const math::ConvGeometry& cg, int64_t channels) : WideExtent(cg) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t off : taps) row_offsets.push_back(c * plane + off);
    }
  }
};

// A convolution of one (image, group) over "wide" output positions: with each input channel
// laid out once in stride phases (pad_phases), every row of the patch matrix over output
// rows as wide as a phase's rows is a contiguous run of that layout, which the product reads
// in place (math::sgemm_indirect): no lowering, no index arithmetic or strided gathers. The
// product lands in `wide` (mg x wide positions) and its valid columns are copied (or added,
// for Z) into y with the bias and activation. `cg` may be a band of the convolution's output
// rows (wide_band): xg's channels are `ip` floats apart and y's planes `op` floats apart.
void wide_convolve(const float* xg, int64_t ip, const math::PackedA& a, const float* bias, float* y,
                   int64_t op, const Sizes& s, const math::ConvGeometry& cg, const WideLayout& w,
                   const ConvEpilogue& e, float* xp, float* wide);

// The convolution restricted to output rows [oh0, oh0 + rows) (2-D and 1-D: out[0] == 1):
// its input rows start at row `in_row0` of the input, the padding above is what remains of
// it for this band, and the rows below the input are padding as before.
math::ConvGeometry band_geometry(const Geometry& g, int64_t oh0, int64_t rows, int64_t& in_row0);

// Output rows per band of the wide path: all of them unless its buffers pass
// kWideBandFloats, then halved until they fit (or one row).
int64_t wide_band(const Sizes& s, const Geometry& g);

// Floats of the wide path's buffers (one group's padded input channels, then the product
// over the wide positions) for float convolutions of these sizes, 0 where the path does not
// apply. It is the kernel's workspace (see conv_workspace): taken whenever this is nonzero,
// used unless the product runs one (image, group) unit per thread instead.
int64_t wide_floats(const Sizes& s, const Geometry& g);

}  // namespace kiln::ops::convolution
