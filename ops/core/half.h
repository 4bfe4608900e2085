// float16 operands of float kernels. onnxruntime's CPU contrib kernels take float16 by widening
// it to float on load and narrowing their results on store, computing in float in between;
// these helpers do both conversions with the dispatched conversion kernels.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"
#include "ops/core/kernel.h"

namespace kiln::ops {

// n float16 values at `src` into floats, and back (round to nearest even).
void widen_half(const void* src, float* dst, int64_t n);
void narrow_half(const float* src, void* dst, int64_t n);

// `t` (float or float16) as a contiguous float tensor: `t` itself when it is one, else its
// values widened into scratch from `ctx`, in parallel.
Tensor widen_to_float(OpContext& ctx, const Tensor& t);

// The float16 tensor `t` widened into `dst` (a contiguous float tensor of as many elements,
// a kernel's workspace), in parallel; returns `dst`.
Tensor widen_into(const Tensor& t, Tensor dst);

// The contiguous float tensor `src` narrowed into the contiguous float16 tensor `dst` of as
// many elements, in parallel.
void narrow_into(const Tensor& src, Tensor& dst);

}  // namespace kiln::ops
