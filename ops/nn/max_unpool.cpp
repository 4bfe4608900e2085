// MaxUnpool: scatters X into a zero tensor at the flat positions I that MaxPool reported,
// giving an output of the shape MaxPool's input had (or the explicit output_shape).
#include <algorithm>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/geometry.h"

namespace kiln::ops {
namespace {

// MaxPool's kernel, strides and pads: MaxUnpool has no dilations or automatic padding.
WindowAttrs unpool_window(const ir::Node& node) {
  const WindowAttrs all = window_attrs(node);
  WindowAttrs a;
  a.kernel_shape = all.kernel_shape;
  a.strides = all.strides;
  a.pads = all.pads;
  if (a.kernel_shape.empty()) throw Error(ErrorKind::InvalidModel, "kernel_shape is required");
  check_window_ranks(a, a.kernel_shape.size());
  return a;
}

// The output shape: that of MaxPool's input, each window of X scattered back (`inferred`,
// the space the indices address), or the explicit output_shape `asked`, which may only add
// room at the end of each spatial dimension. The kernel and the shape rule both use it.
Shape unpool_shape(const Shape& x, const WindowAttrs& window, const std::vector<int64_t>* asked,
                   Shape* inferred) {
  if (x.size() != window.kernel_shape.size() + 2) {
    throw Error(ErrorKind::Runtime, "input " + shape_to_string(x) + " does not match kernel_shape");
  }
  *inferred =
      windowed_shape(x[0], x[1], transposed_windows(spatial_dims(x), window.kernel_shape, window));
  Shape shape = *inferred;
  if (asked) {
    shape = *asked;
    if (shape.size() != x.size()) {
      throw Error(ErrorKind::Runtime,
                  "output_shape must have " + std::to_string(x.size()) + " values");
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < (*inferred)[d] || (d < 2 && shape[d] != (*inferred)[d])) {
        throw Error(ErrorKind::Runtime, "output_shape " + shape_to_string(shape) +
                                            " is smaller than the unpooled " +
                                            shape_to_string(*inferred));
      }
    }
  }
  check_output_elements(shape);
  return shape;
}

void unpool_shape_rule(ShapeContext& c) {
  Shape inferred;
  c.set(0, c.dtype(0),
        unpool_shape(c.shape(0), unpool_window(c.node()), c.has_input(2) ? &c.data(2) : nullptr,
                     &inferred));
}

class MaxUnpool final : public Kernel {
 public:
  explicit MaxUnpool(const NodeInfo& info) : window_(unpool_window(info.node())) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    if (ind.dtype() != DataType::Int64 || ind.shape() != x.shape()) {
      ctx.fail("indices " + ind.describe() + " must be int64 with the shape of " + x.describe());
    }
    Shape inferred;
    std::vector<int64_t> asked;
    if (ctx.has_input(2)) asked = to_int64s(ctx.input(2));
    const Shape shape =
        unpool_shape(x.shape(), window_, ctx.has_input(2) ? &asked : nullptr, &inferred);
    const int64_t limit = shape_numel(inferred);
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      Tensor& y = ctx.output(0, x.dtype(), shape);
      T* out = y.data<T>();
      std::fill(out, out + y.numel(), T(0.0f));
      const T* in = x.data<const T>();
      const int64_t* idx = ind.data<const int64_t>();
      for (int64_t i = 0; i < x.numel(); ++i) {
        int64_t flat = idx[i];
        if (flat < 0 || flat >= limit) {
          ctx.fail("index " + std::to_string(flat) + " is out of range for " +
                   shape_to_string(inferred));
        }
        int64_t pos = 0, stride = 1;
        for (size_t d = inferred.size(); d-- > 0;) {
          pos += (flat % inferred[d]) * stride;
          flat /= inferred[d];
          stride *= shape[d];
        }
        out[pos] = in[i];
      }
    });
  }

 private:
  WindowAttrs window_;
};

}  // namespace

KILN_REGISTER_OP({.op = "MaxUnpool",
                  .since = 9,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = unpool_shape_rule,
                  .create = make<MaxUnpool>});

}  // namespace kiln::ops
