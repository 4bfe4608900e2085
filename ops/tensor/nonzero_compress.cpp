// NonZero (coordinates of the non-zero elements) and Compress (the slices of the input
// selected by a boolean condition along an axis, or of the flattened input).
#include <algorithm>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

struct Bytes16 {
  uint64_t lo, hi;
};

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
      throw_unsupported_type(dt, "input");
  }
}

// Flat positions of the non-zero elements. Floats compare by value (-0 is zero, NaN is
// not); every other type is non-zero when any bit is set, so it is read by width.
std::vector<int64_t> nonzero_positions(const Tensor& x) {
  std::vector<int64_t> pos;
  const int64_t n = x.numel();
  auto collect = [&]<typename T>() {
    const T* p = reinterpret_cast<const T*>(x.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      if (static_cast<compute_t<T>>(p[i]) != compute_t<T>(0)) pos.push_back(i);
    }
  };
  if (type_in(FloatTypes{}, x.dtype())) {
    dispatch(FloatTypes{}, x.dtype(), collect);
    return pos;
  }
  if (x.dtype() == DataType::String || bits_per_element(x.dtype()) > 64 ||
      bits_per_element(x.dtype()) < 8) {
    throw_unsupported_type(x.dtype(), "NonZero input");
  }
  switch (bits_per_element(x.dtype())) {
    case 8:
      collect.operator()<uint8_t>();
      break;
    case 16:
      collect.operator()<uint16_t>();
      break;
    case 32:
      collect.operator()<uint32_t>();
      break;
    default:
      collect.operator()<uint64_t>();
      break;
  }
  return pos;
}

class NonZero final : public Kernel {
 public:
  explicit NonZero(const NodeInfo&) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> pos = nonzero_positions(x);
    // A scalar is seen as a one-element vector (as onnxruntime does).
    const Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
    const int64_t rank = static_cast<int64_t>(shape.size());
    const int64_t count = static_cast<int64_t>(pos.size());
    Tensor& out = ctx.output(0, DataType::Int64, {rank, count});
    int64_t* o = out.data<int64_t>();
    for (int64_t j = 0; j < count; ++j) {
      int64_t rem = pos[static_cast<size_t>(j)];
      for (int64_t d = rank; d-- > 0;) {
        o[d * count + j] = rem % shape[static_cast<size_t>(d)];
        rem /= shape[static_cast<size_t>(d)];
      }
    }
  }
};

class Compress final : public Kernel {
 public:
  explicit Compress(const NodeInfo& info)
      : has_axis_(info.has_attr("axis")), axis_(info.attr_int("axis", 0)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& cond = ctx.input(1);
    if (cond.dtype() != DataType::Bool) ctx.fail("condition must be bool");
    if (cond.rank() != 1) ctx.fail("condition must be 1-D, got " + cond.describe());
    int64_t outer = 1, n = x.numel(), inner = 1;
    size_t axis = 0;
    if (has_axis_) {
      axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank())));
      outer = shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
      n = x.dim(axis);
      inner = shape_numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
    }
    // Entries past the end of the axis select nothing (as in onnxruntime).
    const bool* c = cond.data<const bool>();
    std::vector<int64_t> selected;
    for (int64_t i = 0; i < std::min(n, cond.numel()); ++i) {
      if (c[i]) selected.push_back(i);
    }
    const int64_t count = static_cast<int64_t>(selected.size());
    Shape out_shape{count};
    if (has_axis_) {
      out_shape = x.shape();
      out_shape[axis] = count;
    }
    Tensor& out = ctx.output(0, x.dtype(), out_shape);
    if (out.numel() == 0) return;
    dispatch_width(x.dtype(), [&]<typename T>() {
      const T* src = reinterpret_cast<const T*>(x.raw_data());
      T* dst = reinterpret_cast<T*>(out.raw_data());
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = 0; j < count; ++j) {
          std::copy_n(src + (o * n + selected[static_cast<size_t>(j)]) * inner, inner,
                      dst + (o * count + j) * inner);
        }
      }
    });
    ctx.count_copy(out.nbytes());
  }

 private:
  bool has_axis_;
  int64_t axis_;
};

// Known only when the input's values are (a small integer or bool tensor): [rank, count]
// with the coordinates of each non-zero element.
void nonzero_shape(ShapeContext& c) {
  const ValueFacts& x = c.in(0);
  if (!x.has_data) unknown("the number of non-zero elements is only known when run");
  const Shape shape = x.shape.empty() ? Shape{1} : x.shape;
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> pos;
  for (size_t i = 0; i < x.data.size(); ++i) {
    if (x.data[i] != 0) pos.push_back(static_cast<int64_t>(i));
  }
  const auto count = static_cast<int64_t>(pos.size());
  std::vector<int64_t> out(static_cast<size_t>(rank * count));
  for (int64_t j = 0; j < count; ++j) {
    int64_t rem = pos[static_cast<size_t>(j)];
    for (int64_t d = rank; d-- > 0;) {
      out[static_cast<size_t>(d * count + j)] = rem % shape[static_cast<size_t>(d)];
      rem /= shape[static_cast<size_t>(d)];
    }
  }
  c.set(0, DataType::Int64, {rank, count}, &out);
}

// Known when the condition's values are: as many elements (or slices along `axis`) as it
// selects within the input.
void compress_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (c.dtype(1) != DataType::Bool || c.shape(1).size() != 1) unknown("condition must be 1-D bool");
  const std::vector<int64_t>& cond = c.data(1);
  Shape out{0};
  size_t axis = 0;
  int64_t n = numel_or_unknown(x);
  if (c.has_attr("axis")) {
    axis =
        static_cast<size_t>(normalize_axis(c.attr_int("axis", 0), static_cast<int64_t>(x.size())));
    out = x;
    n = x[axis];
  }
  int64_t count = 0;
  for (int64_t i = 0; i < std::min(n, static_cast<int64_t>(cond.size())); ++i) {
    count += cond[static_cast<size_t>(i)] != 0 ? 1 : 0;
  }
  out[axis] = count;
  c.set(0, c.dtype(0), out);
}

}  // namespace

KILN_REGISTER_OP({.op = "NonZero",
                  .since = 9,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all numeric, bool",
                  .shape = nonzero_shape,
                  .create = make<NonZero>});
KILN_REGISTER_OP({.op = "Compress",
                  .since = 9,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types",
                  .shape = compress_shape,
                  .create = make<Compress>});

}  // namespace kiln::ops
