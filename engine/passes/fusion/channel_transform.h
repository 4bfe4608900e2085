// Per-channel constants over axis 1 as the convolution folds and the ChannelAffine fusion read
// them, and the per-channel scale and shift they compose into.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// A float constant of `n` values (any shape holding n), as doubles; empty otherwise.
std::vector<double> float_values(Rewriter& r, ir::ValueId v, int64_t n);

// A float tensor of m values.
Tensor float_vector(const std::vector<double>& v);

// y = x * scale[c] + shift[c] over channels c, composed in double along a chain.
struct ChannelTransform {
  std::vector<double> scale, shift;
};

// `t` followed by the inference BatchNormalization `bn` over m channels, y = (x - mean) * a +
// bias with a = scale / sqrt(variance + epsilon), in double; false (t unchanged) when its
// parameters are not m float constants.
bool apply_batchnorm(Rewriter& r, const ir::Node& bn, int64_t m, ChannelTransform& t);

// A BatchNormalization at inference (opset 7 or later: before, is_test and spatial), its
// statistics outputs unread and its parameters one per channel (spatial not 0).
bool inference_batchnorm(Rewriter& r, const ir::Node& bn);

// The values of a float constant `c` that scales or shifts a convolution's output (rank
// `rank`, m channels) per output channel: m values along axis 1 (its shape right-aligned to
// the output's, every other axis 1) or one value for all; empty otherwise.
std::vector<double> per_channel(Rewriter& r, ir::ValueId c, int64_t rank, int64_t m);

}  // namespace kiln::passes::fusion
