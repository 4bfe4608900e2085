// Constant B operands of MatMul and Gemm packed once for the GEMM layer (through the
// weights cache, see NodeInfo::prepared_input), in the precision the session asks for.
#pragma once

#include <memory>

#include "kiln/session.h"
#include "ops/core/kernel.h"
#include "ops/math/gemm.h"
#include "ops/math/qgemm.h"

namespace kiln::ops {

// A packed constant B: the weights cache's tensor and a view of it for sgemm, or, with
// WeightPrecision::Int8, a view for qgemm and the columns' scales. Products go through
// packed_product, which takes either form.
struct PackedWeight {
  std::shared_ptr<const Tensor> storage;
  math::PackedB view;                 // float, bfloat16 or float16 panels (not int8)
  math::QPackedB qview;               // int8: the quantized columns, packed
  const float* col_scales = nullptr;  // int8: column j's value is qview's times col_scales[j]
  explicit operator bool() const { return storage != nullptr; }
  bool is_int8() const { return col_scales != nullptr; }
  int64_t k() const { return is_int8() ? qview.k() : view.k(); }
  int64_t n() const { return is_int8() ? qview.n() : view.n(); }
};

// Packs constant input `i` (a 2-D float, float16 or bfloat16 tensor; op(B) = B^T when
// `transpose`) once per Environment in NodeInfo::gemm_weights() precision. Empty when input
// i is not such a constant. Int8: each column j of op(B) (an output channel) is quantized
// symmetrically, q = round_half_even(b / s_j) with s_j = max |column j| / 127 (1 for a
// column of zeros), so q lies in [-127, 127].
PackedWeight pack_constant_b(const NodeInfo& info, size_t i, bool transpose);

// y (row stride ldc) = A * b with o's alpha, biases, accumulation and activation: sgemm of
// the packed panels, or with int8 weights qgemm of A quantized per row (math::QRowFloatA)
// scaled back by each row's and column's scales. A A whose elements are not contiguous along
// its rows is copied first for the int8 product.
void packed_product(const math::MatrixView& a, const PackedWeight& b, float* y, int64_t ldc,
                    const math::GemmOptions& o);

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
