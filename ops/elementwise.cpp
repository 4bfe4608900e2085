#include "ops/elementwise.h"

namespace kiln::ops {

void for_each_row_impl(const Shape& shape, size_t operands, const Shape* strides, RowFn fn,
                       void* state) {
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  constexpr size_t kMax = 8;
  if (operands > kMax) throw Error(ErrorKind::Runtime, "too many operands");
  // Collapse: drop size-1 dims and merge dims that are contiguous in every operand.
  // dims[0] ends up innermost.
  std::vector<int64_t> dims;
  std::vector<int64_t> st[kMax];
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    if (!dims.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < operands; ++k) {
        if (strides[k][d] != st[k].back() * dims.back()) mergeable = false;
      }
      if (mergeable) {
        dims.back() *= shape[d];
        continue;
      }
    }
    dims.push_back(shape[d]);
    for (size_t k = 0; k < operands; ++k) st[k].push_back(strides[k][d]);
  }
  int64_t inner_strides[kMax] = {};
  int64_t zero[kMax] = {};
  if (dims.empty()) {
    fn(state, zero, 1, inner_strides);
    return;
  }
  const int64_t inner = dims[0];
  for (size_t k = 0; k < operands; ++k) inner_strides[k] = st[k][0];
  int64_t rows = 1;
  for (size_t d = 1; d < dims.size(); ++d) rows *= dims[d];
  parallel_for(rows, grain_for(inner), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(dims.size(), 0);
    int64_t off[kMax] = {};
    int64_t r = begin;
    for (size_t d = 1; d < dims.size(); ++d) {
      idx[d] = r % dims[d];
      r /= dims[d];
      for (size_t k = 0; k < operands; ++k) off[k] += idx[d] * st[k][d];
    }
    for (int64_t row = begin; row < end; ++row) {
      fn(state, off, inner, inner_strides);
      for (size_t d = 1; d < dims.size(); ++d) {
        ++idx[d];
        for (size_t k = 0; k < operands; ++k) off[k] += st[k][d];
        if (idx[d] < dims[d]) break;
        for (size_t k = 0; k < operands; ++k) off[k] -= idx[d] * st[k][d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace kiln::ops
