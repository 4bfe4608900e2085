// The activations the graph optimizer fuses into products and convolutions (the
// `activation` attribute of kiln.FusedMatMul and kiln.FusedConv).
#pragma once

#include <cstdint>

#include "ops/core/kernel.h"
#include "ops/math/gemm.h"

namespace kiln::ops {

// The node's `activation` attribute (absent: None); an unknown name fails naming the node.
math::Activation parse_activation(const NodeInfo& info);

// y[i] = activation(y[i]) for n floats, with the active level's vector kernels.
void apply_activation(math::Activation a, float* y, int64_t n);

}  // namespace kiln::ops
