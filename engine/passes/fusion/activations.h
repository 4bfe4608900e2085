// Activations written out in primitives, fused into the one op with a vector kernel (GELU in
// its erf and tanh forms, SiLU and QuickGELU); and the activations the fused products and
// convolutions take as their epilogue's.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// 0.5 * x * (1 + erf(x / sqrt(2))) as torch exports it (Div or Mul by 1/sqrt2, the 0.5
// applied first or last, operands in either order): rewritten as Gelu (opset 20).
int fuse_gelu(Rewriter& r);

// The tanh approximation 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) (GPT-2's
// gelu_new, x^3 as Pow(x, 3)), with the outer part in the forms the erf GELU takes:
// Gelu(approximate = "tanh"), whose vector kernel reads x once instead of eight ops.
int fuse_gelu_tanh(Rewriter& r);

// x * Sigmoid(x) (SiLU) and x * Sigmoid(alpha * x) with a constant scalar alpha (QuickGELU:
// 1.702), in either operand order: one Swish (opset 24), whose vector kernel reads x once;
// a product or convolution before it takes it as its epilogue's activation.
int fuse_swish(Rewriter& r);

// The `activation` attribute of the fused ops.
ir::Attribute activation_attr(const char* name);

// The `activation` attribute value a fused product or convolution takes for activation node
// `n` (Relu, Sigmoid, Tanh, Gelu, Swish as SiLU or QuickGELU), or null when it takes none.
const char* activation_of(const ir::Node& n);

}  // namespace kiln::passes::fusion
