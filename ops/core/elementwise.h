// Strided, broadcasting element loops shared by unary, binary and variadic ops.
//
// Operands are described by element strides aligned to the output shape (0 where an
// operand is broadcast), so strided views (Transpose, Slice, a KV cache with spare
// capacity) are read directly without a contiguous copy. Adjacent dimensions that are
// contiguous in every operand are merged first, so the common cases become one flat loop.
#pragma once

#include <array>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {

// The non-template core of for_each_row: `fn(state, offsets, n, inner_strides)` per row.
using RowFn = void (*)(void* state, const int64_t* offsets, int64_t n, const int64_t* strides);
void for_each_row_impl(const Shape& shape, size_t operands, const Shape* strides, RowFn fn,
                       void* state);

// Calls f(offsets, n, inner_strides) for each innermost row of `shape`, where offsets[k]
// is operand k's element offset at the row start (arrays of K). Rows run in parallel.
// Only `f` is instantiated per op and type; the iteration itself is shared code.
template <size_t K, typename F>
void for_each_row(const Shape& shape, const std::array<Shape, K>& strides, F&& f) {
  using Fn = std::remove_reference_t<F>;
  for_each_row_impl(
      shape, K, strides.data(),
      [](void* state, const int64_t* off, int64_t n, const int64_t* s) {
        (*static_cast<Fn*>(state))(off, n, s);
      },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// dst = src for tensors of the same shape and type in any layouts (strings and byte-sized
// elements; sub-byte types contiguous only). Rows run in parallel.
void copy_strided(const Tensor& src, const Tensor& dst);

// The element stride of an operand read in one flat pass over a contiguous output of
// `shape`: 1 when it is contiguous with that shape, 0 when it holds one element (broadcast),
// -1 when it needs the strided loop. Small tensors then cost no shape or stride vectors.
inline int64_t flat_stride(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape && t.is_contiguous()) return 1;
  return t.numel() == 1 ? 0 : -1;
}

// out[i] = op(in[i]) over any input layout; `out` is contiguous and may alias `in`.
template <typename TI, typename TO, typename Op>
void unary_loop(const Tensor& in, const Tensor& out, Op op) {
  const TI* src = in.data<const TI>();
  TO* dst = out.data<TO>();
  if (out.is_contiguous() && flat_stride(in, out.shape()) == 1) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] = op(src[i]);
    return;
  }
  std::array<Shape, 2> strides{in.strides(), out.strides()};
  for_each_row<2>(out.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* s) {
    const TI* a = src + off[0];
    TO* o = dst + off[1];
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(a[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[1]] = op(a[i * s[0]]);
    }
  });
}

// out[i] = op(a[i'], b[i'']) with numpy broadcasting; `out` has the broadcast shape.
template <typename TA, typename TB, typename TO, typename Op>
void binary_loop(const Tensor& a, const Tensor& b, const Tensor& out, Op op) {
  const TA* pa = a.data<const TA>();
  const TB* pb = b.data<const TB>();
  TO* po = out.data<TO>();
  if (out.is_contiguous()) {
    const int64_t sa = flat_stride(a, out.shape()), sb = flat_stride(b, out.shape());
    if (sa >= 0 && sb >= 0) {
      const int64_t n = out.numel();
      for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i * sa], pb[i * sb]);
      return;
    }
  }
  std::array<Shape, 3> strides{broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape()),
                               out.strides()};
  for_each_row<3>(out.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* s) {
    const TA* x = pa + off[0];
    const TB* y = pb + off[1];
    TO* o = po + off[2];
    if (s[2] == 1) {
      if (s[0] == 1 && s[1] == 1) {
        for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
      } else if (s[0] == 1 && s[1] == 0) {
        const TB yv = y[0];
        for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], yv);
      } else if (s[0] == 0 && s[1] == 1) {
        const TA xv = x[0];
        for (int64_t i = 0; i < n; ++i) o[i] = op(xv, y[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = op(x[i * s[0]], y[i * s[1]]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[2]] = op(x[i * s[0]], y[i * s[1]]);
    }
  });
}

// Three operands (Where, Clip with tensors, ...).
template <typename TA, typename TB, typename TC, typename TO, typename Op>
void ternary_loop(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& out, Op op) {
  const TA* pa = a.data<const TA>();
  const TB* pb = b.data<const TB>();
  const TC* pc = c.data<const TC>();
  TO* po = out.data<TO>();
  std::array<Shape, 4> strides{broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape()),
                               broadcast_strides(c, out.shape()), out.strides()};
  for_each_row<4>(out.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* s) {
    const TA* x = pa + off[0];
    const TB* y = pb + off[1];
    const TC* z = pc + off[2];
    TO* o = po + off[3];
    for (int64_t i = 0; i < n; ++i) o[i * s[3]] = op(x[i * s[0]], y[i * s[1]], z[i * s[2]]);
  });
}

}  // namespace kiln::ops
