// Chains of per-channel scales and shifts (inference BatchNormalization, Mul, Add, Sub, Div by
// per-channel constants) that no convolution took, fused into ChannelAffine.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// A chain of per-channel affine ops over axis 1, each reading the previous one's output alone:
// inference BatchNormalizations with constant parameters, and Muls, Adds, Subs and Divs by
// float constants of one value per channel ([C, 1, 1], [1, C, 1, 1]) or one for all, in any
// order and number, optionally followed by an activation: one kiln.ChannelAffine(X, scale,
// shift) with the `activation` attribute, its scale and shift composed in double. The chain
// starts where X's channels are known, so no constant broadcasts X to more of them: at a
// BatchNormalization (which fails on any other count, as the fused op does) or where the
// graph tells them. Made for a chain of two ops or more, or a BatchNormalization alone, that
// holds a normalization or a constant of more than one value (scalars alone, as in attention
// masks and near misses of the GELU patterns, are left to the other fusions). Runs after the
// folds into convolutions, which take such chains whole.
int fuse_channel_affine(Rewriter& r);

}  // namespace kiln::passes::fusion
