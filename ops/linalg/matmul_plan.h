// numpy matmul's broadcasting for the kernels that run batches of products one matrix at a time
// (MatMulInteger, QLinearMatMul, MatMulIntegerToFloat, DynamicQuantizeMatMul).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/core/kernel.h"

namespace kiln::ops {

struct MatMulPlan {
  Shape out;
  int64_t M = 1, K = 1, N = 1;
  std::vector<int64_t> a_batch, b_batch;  // per output batch: the operand's batch index
};

// The output shape, M, K and N of A x B (a 1-D operand gets a unit axis, removed again from
// the output), and per output batch matrix the batch matrix of A and of B it reads. Fails
// through `ctx` for a scalar operand or when K differs.
MatMulPlan plan_matmul(const OpContext& ctx, const Shape& a_in, const Shape& b_in);

}  // namespace kiln::ops
