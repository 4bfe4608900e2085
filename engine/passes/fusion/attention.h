// Scaled dot-product attention written out in MatMuls and a Softmax, fused into Attention.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// MatMul(Q [* s], K^T [* s]) [* or / scale] [+ mask] -> Softmax(last axis) [-> Where(IsNaN,
// 0)] -> MatMul(., V) on 4-D [batch, heads, positions, head size] operands: one Attention
// (opset 23), which computes the scores a block of query rows at a time and never holds the
// [heads, L, L] matrix. K is K^T transposed back: a view (Transpose of a view).
int fuse_attention(Rewriter& r);

}  // namespace kiln::passes::fusion
