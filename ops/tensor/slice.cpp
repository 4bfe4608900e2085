// Slice: a strided view of the input (offset start, stride times step); no bytes move.
// Negative steps are copied into a new tensor instead: views with negative strides would
// reach code that computes addresses with unsigned offsets (copy_elements). Starts, ends
// and axes are attributes before opset 10 and inputs (with steps) from opset 10.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

// First index and element count of one axis (step != 0), clamped as ONNX specifies; the
// kernel and the shape rule both use it. Any int64 start, end and step: no overflow.
void slice_range(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t* first,
                 int64_t* len) {
  *first = 0;
  *len = 0;
  if (dim == 0) return;
  if (start < 0) start += dim;  // start >= INT64_MIN, dim >= 0: no overflow
  if (end < 0) end += dim;
  uint64_t span = 0, mag = 0;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    if (end <= start) return;
    span = static_cast<uint64_t>(end - start);
    mag = static_cast<uint64_t>(step);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    if (start <= end) return;
    span = static_cast<uint64_t>(start - end);
    mag = uint64_t{0} - static_cast<uint64_t>(step);
  }
  *first = start;
  *len = static_cast<int64_t>((span - 1) / mag + 1);
}

// Per axis of the input, the element count (`len`, the output's shape), first index and step
// a Slice takes (unsliced axes: the whole dimension from 0 by 1), from its starts, ends, axes
// and steps (`axes` and `steps` null when omitted: the first axes, steps of 1). The kernel and
// the shape rule both compute the output's shape with it. First indices and steps share one
// Shapes: slices run on every decode step, and their few numbers stay inline.
struct SliceWindow {
  Shape len, firsts, steps;
  int64_t first(size_t d) const { return firsts[d]; }
  int64_t step(size_t d) const { return steps[d]; }
};

SliceWindow slice_window(const Shape& x, const Shape& starts, const Shape& ends, const Shape* axes,
                         const Shape* steps) {
  const size_t n = starts.size();
  if (ends.size() != n || (axes && axes->size() != n) || (steps && steps->size() != n))
    throw Error(ErrorKind::Runtime, "starts, ends, axes and steps must have the same length");
  SliceWindow w{x, Shape(x.size(), 0), Shape(x.size(), 0)};  // step 0: the axis is not sliced yet
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = axes ? (*axes)[i] : static_cast<int64_t>(i);
    const auto axis = static_cast<size_t>(normalize_axis(a, static_cast<int64_t>(x.size())));
    if (w.step(axis) != 0)
      throw Error(ErrorKind::Runtime, "axis " + std::to_string(a) + " is repeated");
    const int64_t step = steps ? (*steps)[i] : 1;
    if (step == 0) throw Error(ErrorKind::Runtime, "step cannot be 0");
    slice_range(x[axis], starts[i], ends[i], step, &w.firsts[axis], &w.len[axis]);
    w.steps[axis] = step;
  }
  for (size_t d = 0; d < x.size(); ++d)
    if (w.steps[d] == 0) w.steps[d] = 1;
  return w;
}

class Slice final : public Kernel {
 public:
  explicit Slice(const NodeInfo& info) {
    if (info.opset() < 10) {
      starts_ = info.attr_ints("starts");
      ends_ = info.attr_ints("ends");
      axes_ = info.attr_ints("axes");
      if (!info.has_attr("starts") || !info.has_attr("ends")) {
        info.fail("starts and ends are required");
      }
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
      throw_unsupported_type(x.dtype(), "Slice input");
    }
    Shape starts = starts_, ends = ends_, axes = axes_, steps;
    bool has_axes = !axes_.empty(), has_steps = false;
    if (ctx.opset() >= 10) {
      starts = to_int64s(ctx.input(1));
      ends = to_int64s(ctx.input(2));
      has_axes = ctx.has_input(3);
      if (has_axes) axes = to_int64s(ctx.input(3));
      has_steps = ctx.has_input(4);
      if (has_steps) steps = to_int64s(ctx.input(4));
    }
    SliceWindow w = slice_window(x.shape(), starts, ends, has_axes ? &axes : nullptr,
                                 has_steps ? &steps : nullptr);
    Shape strides = x.strides();
    int64_t offset = 0;  // in elements
    bool backwards = false;
    for (size_t d = 0; d < x.rank(); ++d) {
      offset += w.first(d) * strides[d];
      if (w.len[d] > 1) strides[d] *= w.step(d);  // |step| < dim here, so this cannot overflow
      backwards = backwards || (w.len[d] > 1 && w.step(d) < 0);
    }
    Shape shape = std::move(w.len);
    const auto es = static_cast<int64_t>(bits_per_element(x.dtype()) / 8);
    const int64_t byte_offset = static_cast<int64_t>(x.byte_offset()) + offset * es;
    Tensor y = x.view(std::move(shape), std::move(strides), static_cast<size_t>(byte_offset));
    // Strided string tensors are copied too: the engine cannot make them contiguous later.
    if (backwards || (x.dtype() == DataType::String && !y.is_contiguous())) {
      Tensor& out = ctx.output(0, x.dtype(), y.shape());
      copy_strided(y, out);
      ctx.count_copy(out.nbytes());
      return;
    }
    ctx.set_output(0, std::move(y));
  }

 private:
  Shape starts_, ends_, axes_;
};

// Partial facts (opset 10 on): the rank; each sliced axis's length where its size and the bounds
// are known (every axis the slice may change is unknown when the bounds are not); the elements of a
// 1-D input.
void slice_partial(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  if (!x.ranked) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  const auto rank = static_cast<int64_t>(x.shape.size());
  ValueFacts out = x;
  out.has_data = false;
  out.data.clear();
  out.elems.clear();
  const auto known = [&](size_t i) { return !c.has_input(i) || c.facts(i).has_data; };
  if (!known(1) || !known(2) || !known(3) || !known(4)) {
    // Which axes change is not known: those listed, else the first as many as the starts.
    const ValueFacts& axes = c.facts(3);
    if (c.has_input(3) && axes.has_data) {
      for (int64_t a : axes.data) out.shape[static_cast<size_t>(normalize_axis(a, rank))] = -1;
    } else {
      const int64_t n = !c.has_input(3) ? c.facts(1).dim(0) : kUnknownDim;
      for (int64_t k = 0; k < rank; ++k)
        if (n == kUnknownDim || k < n) out.shape[static_cast<size_t>(k)] = kUnknownDim;
    }
    c.set(0, std::move(out));
    return;
  }
  const std::vector<int64_t>& starts = c.data(1);
  const std::vector<int64_t>& ends = c.data(2);
  const size_t n = starts.size();
  std::vector<int64_t> axes, steps(n, 1);
  for (size_t i = 0; i < n; ++i) axes.push_back(static_cast<int64_t>(i));
  if (c.has_input(3)) axes = c.data(3);
  if (c.has_input(4)) steps = c.data(4);
  if (ends.size() != n || axes.size() != n || steps.size() != n) unknown("lengths differ");
  int64_t first = 0, step = 1;
  for (size_t i = 0; i < n; ++i) {
    const auto axis = static_cast<size_t>(normalize_axis(axes[i], rank));
    if (steps[i] == 0) unknown("step 0");
    if (x.shape[axis] == kUnknownDim) continue;
    int64_t len = 0;
    slice_range(x.shape[axis], starts[i], ends[i], steps[i], &first, &len);
    out.shape[axis] = len;
    if (axis == 0) step = steps[i];
  }
  if (rank == 1 && out.shape[0] != kUnknownDim && x.num_elems() > 0) {
    for (int64_t k = 0; k < out.shape[0]; ++k)
      out.elems.push_back(x.elem(static_cast<size_t>(first + k * step)));
  }
  c.set(0, std::move(out));
}

void slice_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const bool bounds = c.opset() < 10 || (c.facts(1).has_data && c.facts(2).has_data &&
                                         (!c.has_input(3) || c.facts(3).has_data) &&
                                         (!c.has_input(4) || c.facts(4).has_data));
  if (!x.known || !bounds) {
    if (c.opset() >= 10) {
      slice_partial(c);
    } else {
      c.set(0, typed_facts(x.dtype));
    }
    return;
  }
  Shape starts, ends, axes, steps;
  bool has_axes = false, has_steps = false;
  if (c.opset() < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
    has_axes = !axes.empty();
  } else {
    starts = c.data(1);
    ends = c.data(2);
    has_axes = c.has_input(3);
    if (has_axes) axes = c.data(3);
    has_steps = c.has_input(4);
    if (has_steps) steps = c.data(4);
  }
  const SliceWindow w =
      slice_window(x.shape, starts, ends, has_axes ? &axes : nullptr, has_steps ? &steps : nullptr);
  const Shape& out = w.len;
  if (x.shape.size() == 1 && x.num_elems() > 0) {
    ValueFacts v = known_facts(x.dtype, out);
    for (int64_t k = 0; k < out[0]; ++k)
      v.elems.push_back(x.elem(static_cast<size_t>(w.first(0) + k * w.step(0))));
    c.set(0, std::move(v));
    return;
  }
  c.set(0, x.dtype, out);
}

// A view of the input with each sliced axis's stride multiplied by its step; a backward
// step makes the kernel copy.
void place_slice(Placement& p) {
  const Shape& xs = p.input(0).shape;
  const Shape& ys = p.output(0).shape;
  Shape strides = p.strides(0);
  const ir::Node& node = p.node();
  auto ints = [&](size_t i) {
    return i < node.inputs.size() && node.inputs[i] != ir::kNoValue ? p.input(i).data
                                                                    : std::vector<int64_t>{};
  };
  std::vector<int64_t> axes = ints(3), steps = ints(4);
  if (node.opset < 10) {
    if (const ir::Attribute* a = node.attr("axes")) axes = a->ints;
    steps.clear();
  }
  bool backwards = false;
  for (size_t k = 0; k < steps.size(); ++k) {
    int64_t a = k < axes.size() ? axes[k] : static_cast<int64_t>(k);
    if (a < 0) a += static_cast<int64_t>(xs.size());
    const auto ax = static_cast<size_t>(a);
    if (ax >= xs.size() || ys[ax] <= 1) continue;
    strides[ax] *= steps[k];
    backwards = backwards || steps[k] < 0;
  }
  if (backwards)
    p.allocate(0);
  else
    p.view(0, 0, strides, false);
}

}  // namespace

KILN_REGISTER_OP({.op = "Slice",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = slice_shape,
                  .place = place_slice,
                  .create = make<Slice>});

}  // namespace kiln::ops
