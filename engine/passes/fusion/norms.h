// Layer normalizations: LayerNorm written out in primitives, and a residual Add before one.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// LayerNormalization written out in primitives over the last axis (PyTorch exports before
// opset 17):
//   d = x - ReduceMean(x);  var = ReduceMean(d^2) (Pow(d, 2) or d * d)
//   y = d / Sqrt(var + eps) * gamma [+ beta]
// with gamma and beta constant float vectors along the last axis: one LayerNormalization
// (opset 17), whose row kernel reads x twice instead of running nine elementwise passes.
int fuse_layer_norm(Rewriter& r);

// Add(a, b) -> LayerNormalization over the last axis with constant float gamma (and beta):
// one com.microsoft.SkipLayerNormalization, whose row kernel adds, normalises and scales each
// row in one visit. When the sum has other readers (the residual stream of a pre-norm
// transformer) it becomes the node's fourth output, input_skip_bias_sum.
int fuse_skip_layer_norm(Rewriter& r);

}  // namespace kiln::passes::fusion
