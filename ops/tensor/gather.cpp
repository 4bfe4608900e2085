// Gather, GatherElements and GatherND: read elements or slices of `data` at positions
// given by an index tensor. They only move data, so the element loops are instantiated
// per element width (and once for strings), never per element type.
#include <algorithm>
#include <cstring>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// The shape functions below are shared by the kernels and the shape rules; they throw
// kiln::Error without a node (the executor names it; shape inference makes it unknown).

// Gather: data[:axis] + indices + data[axis + 1:], axis normalized into `*axis`.
Shape gather_output_shape(const Shape& data, const Shape& indices, int64_t axis_attr,
                          int64_t* axis) {
  const auto rank = static_cast<int64_t>(data.size());
  if (rank == 0) throw Error(ErrorKind::Runtime, "data must have rank >= 1");
  *axis = normalize_axis(axis_attr, rank);
  Shape out(data.begin(), data.begin() + *axis);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), data.begin() + *axis + 1, data.end());
  return out;
}

// GatherND with `b` batch dims: indices[:-1] + data[b + k:], k the last dimension of the
// indices.
Shape gather_nd_output_shape(const Shape& data, const Shape& indices, int64_t b) {
  auto fail = [](const std::string& m) { throw Error(ErrorKind::Runtime, m); };
  const auto r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(indices.size());
  if (r < 1 || q < 1) fail("data and indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q)) fail("batch_dims must be less than the ranks of both inputs");
  for (int64_t d = 0; d < b; ++d) {
    if (data[static_cast<size_t>(d)] != indices[static_cast<size_t>(d)]) {
      fail("batch dimensions of data " + shape_to_string(data) + " and indices " +
           shape_to_string(indices) + " differ");
    }
  }
  const int64_t k = indices.back();
  if (k < 1 || k > r - b) {
    fail("the last dimension of indices (" + std::to_string(k) +
         ") must be in [1, rank(data) - batch_dims]");
  }
  Shape out(indices.begin(), indices.end() - 1);
  out.insert(out.end(), data.begin() + b + k, data.end());
  return out;
}

struct Bytes16 {
  uint64_t lo, hi;
};

// Calls f.template operator()<T>() with T a trivially copyable type of the element's width
// (or std::string); pointers come from elems<T>() which does not check the element type.
template <typename F>
void dispatch_width(DataType dt, F&& f) {
  if (dt == DataType::String) return f.template operator()<std::string>();
  switch (bits_per_element(dt)) {
    case 8:
      return f.template operator()<uint8_t>();
    case 16:
      return f.template operator()<uint16_t>();
    case 32:
      return f.template operator()<uint32_t>();
    case 64:
      return f.template operator()<uint64_t>();
    case 128:
      return f.template operator()<Bytes16>();
    default:
      throw_unsupported_type(dt, "data");
  }
}

template <typename T>
T* elems(const Tensor& t) {
  return reinterpret_cast<T*>(t.raw_data());
}

[[noreturn]] void index_out_of_range(int64_t index, int64_t dim, const char* what) {
  throw Error(ErrorKind::Runtime, std::string(what) + " index " + std::to_string(index) +
                                      " is out of range for a dimension of size " +
                                      std::to_string(dim));
}

// Indices normalised to [0, dim) (negative ones count from the end); throws when outside.
Shape checked_indices(const Tensor& indices, int64_t dim, const char* what) {
  Shape idx = to_int64s(indices);
  for (int64_t& i : idx) {
    if (i < -dim || i >= dim) index_out_of_range(i, dim, what);
    if (i < 0) i += dim;
  }
  return idx;
}

void check_index_type(const OpContext& ctx, const Tensor& indices) {
  if (indices.dtype() != DataType::Int32 && indices.dtype() != DataType::Int64) {
    ctx.fail("indices must be int32 or int64, got " + indices.describe());
  }
}

// out[o, j, :] = data[o, idx[j], :] with outer = prod(data.shape[:axis]).
class Gather final : public Kernel {
 public:
  explicit Gather(const NodeInfo& info) : axis_(info.attr_int("axis", 0)) {}

  void run(OpContext& ctx) override {
    const Tensor& data = ctx.input(0);
    const Tensor& indices = ctx.input(1);
    check_index_type(ctx, indices);
    int64_t axis = 0;
    const Shape out_shape = gather_output_shape(data.shape(), indices.shape(), axis_, &axis);
    const Shape idx = checked_indices(indices, data.dim(axis), "Gather");
    Tensor& out = ctx.output(0, data.dtype(), out_shape);

    const int64_t outer = shape_numel(Shape(data.shape().begin(), data.shape().begin() + axis));
    const int64_t n = data.dim(axis);
    const int64_t inner = shape_numel(Shape(data.shape().begin() + axis + 1, data.shape().end()));
    const int64_t count = static_cast<int64_t>(idx.size());
    if (out.numel() == 0) return;
    dispatch_width(data.dtype(), [&]<typename T>() {
      const T* src = elems<const T>(data);
      T* dst = elems<T>(out);
      // One task item is one copied row of `inner` elements (an embedding row for axis 0).
      parallel_for(outer * count, grain_for(inner * static_cast<int64_t>(sizeof(T)), 1 << 16),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const int64_t o = r / count, j = r % count;
                       std::copy_n(src + (o * n + idx[static_cast<size_t>(j)]) * inner, inner,
                                   dst + r * inner);
                     }
                   });
    });
    ctx.count_copy(out.nbytes());
  }

 private:
  int64_t axis_;
};

// out[i0..ir] = data[i0.., idx[i0..ir] (at axis), ..ir]; indices has data's rank.
class GatherElements final : public Kernel {
 public:
  explicit GatherElements(const NodeInfo& info) : axis_(info.attr_int("axis", 0)) {}

  void run(OpContext& ctx) override {
    const Tensor& data = ctx.input(0);
    const Tensor& indices = ctx.input(1);
    check_index_type(ctx, indices);
    const size_t rank = data.rank();
    if (rank == 0) ctx.fail("data must have rank >= 1");
    if (indices.rank() != rank) {
      ctx.fail("indices " + indices.describe() + " must have the rank of data " + data.describe());
    }
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(rank)));
    for (size_t d = 0; d < rank; ++d) {
      if (d != axis && indices.dim(d) > data.dim(d)) {
        ctx.fail("indices " + indices.describe() + " exceed data " + data.describe() +
                 " outside the gather axis");
      }
    }
    const Shape idx = checked_indices(indices, data.dim(axis), "GatherElements");
    Tensor& out = ctx.output(0, data.dtype(), indices.shape());
    if (out.numel() == 0) return;

    const Shape& dstrides = data.strides();
    const int64_t last = indices.dim(rank - 1);
    const int64_t rows = out.numel() / last;
    const int64_t axis_stride = dstrides[axis];
    const bool axis_is_last = axis == rank - 1;
    dispatch_width(data.dtype(), [&]<typename T>() {
      const T* src = elems<const T>(data);
      T* dst = elems<T>(out);
      parallel_for(rows, grain_for(last), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          // Offset in data of this row's start, leaving out the gather axis.
          int64_t base = 0, rem = r;
          for (size_t d = rank - 1; d-- > 0;) {
            const int64_t c = rem % indices.dim(d);
            rem /= indices.dim(d);
            if (d != axis) base += c * dstrides[d];
          }
          const int64_t* ir = idx.data() + r * last;
          T* o = dst + r * last;
          if (axis_is_last) {
            for (int64_t k = 0; k < last; ++k) o[k] = src[base + ir[k]];
          } else {
            for (int64_t k = 0; k < last; ++k) o[k] = src[base + k + ir[k] * axis_stride];
          }
        }
      });
    });
    ctx.count_copy(out.nbytes());
  }

 private:
  int64_t axis_;
};

// Slices of data addressed by the last dimension of indices, after `batch_dims` shared
// leading dimensions.
class GatherND final : public Kernel {
 public:
  explicit GatherND(const NodeInfo& info) : batch_dims_(info.attr_int("batch_dims", 0)) {
    if (batch_dims_ < 0) info.fail("batch_dims must be >= 0");
  }

  void run(OpContext& ctx) override {
    const Tensor& data = ctx.input(0);
    const Tensor& indices = ctx.input(1);
    if (indices.dtype() != DataType::Int64) ctx.fail("indices must be int64");
    const Shape out_shape = gather_nd_output_shape(data.shape(), indices.shape(), batch_dims_);
    const size_t b = static_cast<size_t>(batch_dims_);
    const size_t q = indices.rank();
    const int64_t k = indices.dim(q - 1);
    const int64_t slice =
        shape_numel(Shape(data.shape().begin() + static_cast<int64_t>(b) + k, data.shape().end()));
    const int64_t batches = shape_numel(Shape(data.shape().begin(), data.shape().begin() + b));
    const int64_t batch_size = batches == 0 ? 0 : data.numel() / batches;
    const int64_t slices = indices.numel() / k;
    const int64_t per_batch = batches == 0 ? 0 : slices / batches;

    // Element offset of each slice in data, validated before any copying.
    std::vector<int64_t> offsets(static_cast<size_t>(slices));
    const int64_t* ip = indices.data<const int64_t>();
    for (int64_t s = 0; s < slices; ++s) {
      int64_t off = per_batch == 0 ? 0 : (s / per_batch) * batch_size;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t dim = data.dim(b + static_cast<size_t>(j));
        int64_t i = ip[s * k + j];
        if (i < -dim || i >= dim) index_out_of_range(i, dim, "GatherND");
        if (i < 0) i += dim;
        off += i * data.strides()[b + static_cast<size_t>(j)];
      }
      offsets[static_cast<size_t>(s)] = off;
    }

    Tensor& out = ctx.output(0, data.dtype(), out_shape);
    if (out.numel() == 0) return;
    dispatch_width(data.dtype(), [&]<typename T>() {
      const T* src = elems<const T>(data);
      T* dst = elems<T>(out);
      parallel_for(slices, grain_for(slice), [&](int64_t begin, int64_t end) {
        for (int64_t s = begin; s < end; ++s) {
          std::copy_n(src + offsets[static_cast<size_t>(s)], slice, dst + s * slice);
        }
      });
    });
    ctx.count_copy(out.nbytes());
  }

 private:
  int64_t batch_dims_;
};

void gather_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const ValueFacts& idx = c.facts(1);
  if (!x.ranked || !idx.ranked) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  if (x.known && idx.known) {
    int64_t axis = 0;
    const Shape out = gather_output_shape(x.shape, idx.shape, c.attr_int("axis", 0), &axis);
    if (x.has_data && idx.has_data && x.shape.size() == 1) {
      std::vector<int64_t> data;
      for (int64_t i : idx.data) {
        const int64_t k = i < 0 ? i + x.shape[0] : i;
        if (k < 0 || k >= x.shape[0]) unknown("index out of range");
        data.push_back(x.data[static_cast<size_t>(k)]);
      }
      c.set(0, x.dtype, out, &data);
      return;
    }
  }
  // Partial facts: data[:axis] + indices + data[axis + 1:]; the known elements of a 1-D
  // tensor at known indices (the hidden size out of a Shape whose batch is open).
  if (x.shape.empty()) unknown("data must have rank >= 1");
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_int("axis", 0), x.rank()));
  ValueFacts out = sub_shape(x, 0, axis);
  out.dtype = x.dtype;
  for (size_t k = 0; k < idx.shape.size(); ++k) append_dim(out, idx, k);
  for (size_t k = axis + 1; k < x.shape.size(); ++k) append_dim(out, x, k);
  const int64_t len = x.dim(0);
  if (x.shape.size() == 1 && idx.has_data && len != kUnknownDim &&
      static_cast<int64_t>(x.num_elems()) == len) {
    for (int64_t i : idx.data) {
      const int64_t k = i < 0 ? i + len : i;
      if (k < 0 || k >= len) unknown("index out of range");
      out.elems.push_back(x.elem(static_cast<size_t>(k)));
    }
  }
  c.set(0, std::move(out));
}

void gather_elements_shape(ShapeContext& c) {
  if (c.shape(0).empty() || c.shape(1).size() != c.shape(0).size()) unknown("ranks differ");
  c.set(0, c.dtype(0), c.shape(1));
}

// indices[:-1] + data[batch_dims + k:], k the last dimension of the indices.
void gather_nd_shape(ShapeContext& c) {
  if (c.dtype(1) != DataType::Int64) unknown("GatherND takes int64 indices");
  c.set(0, c.dtype(0), gather_nd_output_shape(c.shape(0), c.shape(1), c.attr_int("batch_dims", 0)));
}

}  // namespace

KILN_REGISTER_OP({.op = "Gather",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types (int32/int64 indices)",
                  .shape = gather_shape,
                  .create = make<Gather>});
KILN_REGISTER_OP({.op = "GatherElements",
                  .since = 11,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types (int32/int64 indices)",
                  .shape = gather_elements_shape,
                  .create = make<GatherElements>});
KILN_REGISTER_OP({.op = "GatherND",
                  .since = 11,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types (int64 indices)",
                  .shape = gather_nd_shape,
                  .create = make<GatherND>});

}  // namespace kiln::ops
