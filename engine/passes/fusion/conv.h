// Convolutions: a BatchNormalization or per-channel scale and shift after a Conv folded into
// its filter and bias, and a residual Add and an activation after one fused into FusedConv.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// Conv(X, W, B) -> BatchNormalization at inference, W, B and the normalization's scale,
// bias, mean and variance constants: one Conv(X, W', B') with W' = W * s per output channel
// and B' = (B - mean) * s + bias, s = scale / sqrt(variance + epsilon), computed in double.
int fold_conv_batchnorm(Rewriter& r);

// Conv(X, W, B) -> Mul or Add by a per-output-channel float constant (a batch normalization
// written out as a scale and a shift, as Caffe2's exports have it), the convolution's output
// read by that node alone: one Conv(X, W', B') with W' = W * s and B' = B * s for a Mul,
// B' = B + a for an Add, computed in double. Repeats along a chain of them.
int fold_conv_scale_shift(Rewriter& r);

// A float Conv, then optionally an Add (or a two-input Sum) of another tensor Z (a residual
// connection; it may broadcast), then optionally an activation, each reading the previous output
// alone: one kiln.FusedConv(X, W, B, Z) with the `activation` attribute, y = act(conv + B + Z),
// which accumulates onto Z in place and applies the activation to each tile while it is in cache.
int fuse_conv_epilogue(Rewriter& r);

}  // namespace kiln::passes::fusion
