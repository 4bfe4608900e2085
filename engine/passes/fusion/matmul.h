// Products: MatMul with its bias and activation, and scalars and transposes folded into them.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// MatMul(a, b) + bias (a constant float vector along the last axis), then optionally an
// activation: one kiln.FusedMatMul whose GEMM adds the bias and applies the activation to
// each tile while it is in cache.
int fuse_matmul_epilogue(Rewriter& r);

// Scalar Muls and Divs folded into a float product's alpha: MatMul(A * s, B), MatMul(A, B * s)
// and MatMul(A, B) * s (or / s), where the product is a MatMul or a fused one (for a product
// scaled afterwards: without an activation, its bias scaled too). A Transpose swapping the
// last two axes of an operand becomes transA / transB (the GEMM reads the view either way;
// one node less). Plain MatMuls become com.microsoft.FusedMatMul, onnxruntime's op with this
// meaning. Runs after the attention fusion, which matches plain MatMuls.
int fold_into_matmul(Rewriter& r);

}  // namespace kiln::passes::fusion
