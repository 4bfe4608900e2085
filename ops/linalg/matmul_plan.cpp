#include "ops/linalg/matmul_plan.h"

#include "ops/core/common.h"

namespace kiln::ops {

MatMulPlan plan_matmul(const OpContext& ctx, const Shape& a_in, const Shape& b_in) {
  if (a_in.empty() || b_in.empty()) ctx.fail("matmul operands must have rank >= 1");
  Shape a = a_in, b = b_in;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  MatMulPlan p;
  p.M = a[a.size() - 2], p.K = a.back(), p.N = b.back();
  if (b[b.size() - 2] != p.K) {
    ctx.fail("matmul shapes " + shape_to_string(a_in) + " and " + shape_to_string(b_in) +
             " do not agree on K");
  }
  const Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  const Shape batch = broadcast_shapes(ab, bb);
  const int64_t nb = shape_numel(batch);
  p.a_batch.resize(static_cast<size_t>(nb));
  p.b_batch.resize(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    // Right-aligned broadcast of the flat batch index onto each operand's batch dims.
    int64_t rem = i, ia = 0, ib = 0, sa = 1, sb = 1;
    for (size_t d = batch.size(); d-- > 0;) {
      const int64_t c = rem % batch[d];
      rem /= batch[d];
      const size_t oa = batch.size() - ab.size(), ob = batch.size() - bb.size();
      if (d >= oa) {
        const int64_t dim = ab[d - oa];
        ia += (dim == 1 ? 0 : c) * sa;
        sa *= dim;
      }
      if (d >= ob) {
        const int64_t dim = bb[d - ob];
        ib += (dim == 1 ? 0 : c) * sb;
        sb *= dim;
      }
    }
    p.a_batch[static_cast<size_t>(i)] = ia;
    p.b_batch[static_cast<size_t>(i)] = ib;
  }
  p.out = batch;
  if (a_in.size() > 1) p.out.push_back(p.M);
  if (b_in.size() > 1) p.out.push_back(p.N);
  return p;
}

}  // namespace kiln::ops
