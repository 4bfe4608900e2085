// MaxUnpool: scatters X into a zero tensor at the flat positions I that MaxPool reported,
// giving an output of the shape MaxPool's input had (or the explicit output_shape).
#include <algorithm>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/geometry.h"

namespace kiln::ops {
namespace {

class MaxUnpool final : public Kernel {
 public:
  explicit MaxUnpool(const NodeInfo& info) : window_(unpool_window(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const size_t r = window_.kernel_shape.size();
    if (x.rank() != r + 2) ctx.fail("input " + x.describe() + " does not match kernel_shape");
    if (ind.dtype() != DataType::Int64 || ind.shape() != x.shape()) {
      ctx.fail("indices " + ind.describe() + " must be int64 with the shape of " + x.describe());
    }
    // Indices address the shape MaxPool's input had: each window scattered back. An
    // explicit output_shape may only add room at the end of each dimension.
    const Shape inferred =
        windowed_shape(x.dim(0), x.dim(1),
                       transposed_windows(spatial_dims(x.shape()), window_.kernel_shape, window_));
    Shape shape = inferred;
    if (ctx.has_input(2)) {
      shape = to_int64s(ctx.input(2));
      if (shape.size() != x.rank()) {
        ctx.fail("output_shape must have " + std::to_string(x.rank()) + " values");
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] < inferred[d] || (d < 2 && shape[d] != inferred[d])) {
          ctx.fail("output_shape " + shape_to_string(shape) + " is smaller than the unpooled " +
                   shape_to_string(inferred));
        }
      }
    }
    check_output_elements(shape);
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
  // MaxPool's kernel, strides and pads: MaxUnpool has no dilations or automatic padding.
  static WindowAttrs unpool_window(const NodeInfo& info) {
    const WindowAttrs all = window_attrs(info.node());
    WindowAttrs a;
    a.kernel_shape = all.kernel_shape;
    a.strides = all.strides;
    a.pads = all.pads;
    if (a.kernel_shape.empty()) info.fail("kernel_shape is required");
    check_window_ranks(a, a.kernel_shape.size());
    return a;
  }

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
                  .create = make<MaxUnpool>});

}  // namespace kiln::ops
