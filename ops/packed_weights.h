// Constant B operands of MatMul and Gemm packed once for the GEMM layer (through the
// weights cache, see NodeInfo::prepared_input), in the precision the session asks for.
#pragma once

#include <memory>

#include "kiln/session.h"
#include "ops/kernel.h"
#include "ops/math/gemm.h"
#include "ops/math/qgemm.h"

namespace kiln::ops {

// A packed constant B: the weights cache's tensor and a view of it for sgemm.
struct PackedWeight {
  std::shared_ptr<const Tensor> storage;
  math::PackedB view;
  explicit operator bool() const { return storage != nullptr; }
};

// Packs constant input `i` (a 2-D float, float16 or bfloat16 tensor; op(B) = B^T when
// `transpose`) once per Environment in NodeInfo::gemm_weights() precision. Empty when input
// i is not such a constant.
PackedWeight pack_constant_b(const NodeInfo& info, size_t i, bool transpose);

// Whether `b` is a constant pack_constant_b packs: a workspace rule's test (on
// ShapeContext::constant) that the kernel reads B packed and needs no room for it.
bool packs_constant_b(const Tensor* b);

// Whether `packed` (pack_constant_b's for input i) was made from an initializer, the
// constants a workspace rule sees: the kernel's side of packs_constant_b.
bool packed_from_initializer(const NodeInfo& info, size_t i, const PackedWeight& packed);

// A packed constant 8-bit B: the weights cache's tensor and a view of it for qgemm.
struct QPackedWeight {
  std::shared_ptr<const Tensor> storage;
  math::QPackedB view;
  explicit operator bool() const { return storage != nullptr; }
};

// Packs constant input `i` (a 2-D uint8 or int8 tensor; op(B) = B^T when `transpose`) once per
// Environment for the active level's int8 tile. Empty when input i is not such a constant.
QPackedWeight pack_constant_qb(const NodeInfo& info, size_t i, bool transpose);

}  // namespace kiln::ops
