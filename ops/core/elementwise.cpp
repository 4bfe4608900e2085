#include "ops/core/elementwise.h"

#include <cstring>
#include <string>
#include <vector>

namespace kiln::ops {
namespace {

template <typename U>
void copy_run(std::byte* dst, const std::byte* src, int64_t n, int64_t ds, int64_t ss) {
  for (int64_t i = 0; i < n; ++i) {
    U v;
    std::memcpy(&v, src + i * ss * static_cast<int64_t>(sizeof(U)), sizeof(U));
    std::memcpy(dst + i * ds * static_cast<int64_t>(sizeof(U)), &v, sizeof(U));
  }
}

}  // namespace

void for_each_row_impl(const Shape& shape, size_t operands, const Shape* strides, RowFn fn,
                       void* state) {
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  constexpr size_t kMax = 8;
  if (operands > kMax) throw Error(ErrorKind::Runtime, "too many operands");
  // The collapsed dims and strides live on the stack up to kInlineRank dims (only higher
  // ranks allocate), so a small op pays no heap allocation here.
  constexpr size_t kInlineRank = 8;
  const size_t rank = shape.size();
  int64_t inline_buf[kInlineRank * (kMax + 1)];
  std::vector<int64_t> heap_buf;
  int64_t* dims = inline_buf;
  if (rank > kInlineRank) {
    heap_buf.resize(rank * (kMax + 1));
    dims = heap_buf.data();
  }
  // st[k * rank + j]: operand k's stride along collapsed dim j.
  int64_t* st = dims + rank;
  // Collapse: drop size-1 dims and merge dims that are contiguous in every operand.
  // dims[0] ends up innermost.
  size_t n_dims = 0;
  for (size_t d = rank; d-- > 0;) {
    if (shape[d] == 1) continue;
    if (n_dims > 0) {
      bool mergeable = true;
      for (size_t k = 0; k < operands; ++k) {
        if (strides[k][d] != st[k * rank + n_dims - 1] * dims[n_dims - 1]) mergeable = false;
      }
      if (mergeable) {
        dims[n_dims - 1] *= shape[d];
        continue;
      }
    }
    dims[n_dims] = shape[d];
    for (size_t k = 0; k < operands; ++k) st[k * rank + n_dims] = strides[k][d];
    ++n_dims;
  }
  int64_t inner_strides[kMax] = {};
  int64_t zero[kMax] = {};
  if (n_dims == 0) {
    fn(state, zero, 1, inner_strides);
    return;
  }
  const int64_t inner = dims[0];
  for (size_t k = 0; k < operands; ++k) inner_strides[k] = st[k * rank];
  int64_t rows = 1;
  for (size_t d = 1; d < n_dims; ++d) rows *= dims[d];
  if (rows == 1) {
    fn(state, zero, inner, inner_strides);
    return;
  }
  parallel_for(rows, grain_for(inner), [&](int64_t begin, int64_t end) {
    int64_t idx_inline[kInlineRank] = {};
    std::vector<int64_t> idx_heap;
    int64_t* idx = idx_inline;
    if (n_dims > kInlineRank) {
      idx_heap.assign(n_dims, 0);
      idx = idx_heap.data();
    }
    int64_t off[kMax] = {};
    int64_t r = begin;
    for (size_t d = 1; d < n_dims; ++d) {
      idx[d] = r % dims[d];
      r /= dims[d];
      for (size_t k = 0; k < operands; ++k) off[k] += idx[d] * st[k * rank + d];
    }
    for (int64_t row = begin; row < end; ++row) {
      fn(state, off, inner, inner_strides);
      for (size_t d = 1; d < n_dims; ++d) {
        ++idx[d];
        for (size_t k = 0; k < operands; ++k) off[k] += st[k * rank + d];
        if (idx[d] < dims[d]) break;
        for (size_t k = 0; k < operands; ++k) off[k] -= idx[d] * st[k * rank + d];
        idx[d] = 0;
      }
    }
  });
}

void copy_strided(const Tensor& src, const Tensor& dst) {
  const std::array<Shape, 2> strides{src.strides(), dst.strides()};
  if (src.dtype() == DataType::String) {
    const std::string* s = src.data<const std::string>();
    std::string* d = dst.data<std::string>();
    for_each_row<2>(src.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* st) {
      for (int64_t i = 0; i < n; ++i) d[off[1] + i * st[1]] = s[off[0] + i * st[0]];
    });
    return;
  }
  const int bits = bits_per_element(src.dtype());
  if (bits % 8 != 0) {
    copy_elements(src, dst);  // sub-byte elements: contiguous tensors only
    return;
  }
  const int64_t es = bits / 8;
  const std::byte* s = src.raw_data();
  std::byte* d = dst.raw_data();
  for_each_row<2>(src.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* st) {
    const std::byte* a = s + off[0] * es;
    std::byte* o = d + off[1] * es;
    if (st[0] == 1 && st[1] == 1) {
      std::memcpy(o, a, static_cast<size_t>(n * es));
      return;
    }
    switch (es) {
      case 1:
        copy_run<uint8_t>(o, a, n, st[1], st[0]);
        break;
      case 2:
        copy_run<uint16_t>(o, a, n, st[1], st[0]);
        break;
      case 4:
        copy_run<uint32_t>(o, a, n, st[1], st[0]);
        break;
      case 8:
        copy_run<uint64_t>(o, a, n, st[1], st[0]);
        break;
      default:
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(o + i * st[1] * es, a + i * st[0] * es, static_cast<size_t>(es));
        }
    }
  });
}

}  // namespace kiln::ops
