// Dynamically quantized products (onnxruntime's quantize_dynamic) fused into
// DynamicQuantizeMatMul or MatMulIntegerToFloat, and a Gelu after one into its epilogue.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// onnxruntime's quantize_dynamic writes each MatMul as
//   DynamicQuantizeLinear(x) -> (A, a_scale, a_zero)
//   MatMulInteger(A, B, a_zero[, b_zero]) -> Cast(float) -> Mul(., Mul(a_scale, b_scale))
// with B (2-D), b_scale and b_zero constant, b_scale and b_zero per tensor or per column. The
// chain becomes com.microsoft.DynamicQuantizeMatMul(x, B, b_scale, b_zero) when A has no
// other reader: its kernel quantizes x straight into the GEMM's packed panels (no uint8
// tensor) and scales the sums in the GEMM's store. Else (A shared by several products: the
// query, key and value) MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero, b_zero), which
// packs the shared A. A constant bias Add after the Mul joins as the bias input. Both compute
// float(sum) * (a_scale * b_scale_j) (+ bias_j) with the chain's roundings: results are the
// same bit for bit. MatMulIntegerToFloat reading a DynamicQuantizeLinear alone (onnxruntime's
// own fusion of the chain) becomes DynamicQuantizeMatMul the same way.
int fuse_dynamic_quant_matmul(Rewriter& r);

// A com.microsoft.Gelu reading a DynamicQuantizeMatMul alone (the first feed-forward product
// of a quantized BERT) joins it: kiln.DynamicQuantizeMatMul with the `activation` attribute
// applies it to each finished tile while the tile is in cache, with the vector kernel the Gelu
// op runs, element by element: the same results, one pass over the product's output less.
int fuse_dynamic_quant_activation(Rewriter& r);

}  // namespace kiln::passes::fusion
