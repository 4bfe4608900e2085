// MaxUnpool: scatters X into a zero tensor at the flat positions I that MaxPool reported,
// giving an output of the shape MaxPool's input had (or the explicit output_shape).
#include <algorithm>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// Attribute values above this are rejected, so that sizes computed from them stay far
// from int64 overflow.
constexpr int64_t kMaxAttr = int64_t{1} << 31;

// Fails unless `shape` has an element count that int64 arithmetic (and memory) can hold.
void check_output_size(const OpContext& ctx, const Shape& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 48)) {
      ctx.fail("output shape " + shape_to_string(shape) + " is too large");
    }
  }
}

class MaxUnpool final : public Kernel {
 public:
  explicit MaxUnpool(const NodeInfo& info)
      : kernel_(info.attr_ints("kernel_shape")),
        strides_(info.attr_ints("strides")),
        pads_(info.attr_ints("pads")) {
    const size_t r = kernel_.size();
    if (r == 0) info.fail("kernel_shape is required");
    if ((!strides_.empty() && strides_.size() != r) || (!pads_.empty() && pads_.size() != 2 * r)) {
      info.fail("strides and pads must match kernel_shape");
    }
    for (int64_t v : kernel_)
      if (v < 1 || v > kMaxAttr) info.fail("kernel_shape must be in [1, 2^31]");
    for (int64_t v : strides_)
      if (v < 1 || v > kMaxAttr) info.fail("strides must be in [1, 2^31]");
    for (int64_t v : pads_)
      if (v < 0 || v > kMaxAttr) info.fail("pads must be in [0, 2^31]");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const size_t r = kernel_.size();
    if (x.rank() != r + 2) ctx.fail("input " + x.describe() + " does not match kernel_shape");
    if (ind.dtype() != DataType::Int64 || ind.shape() != x.shape()) {
      ctx.fail("indices " + ind.describe() + " must be int64 with the shape of " + x.describe());
    }
    // Indices address the shape MaxPool's input had; an explicit output_shape may only
    // add room at the end of each dimension.
    Shape inferred{x.dim(0), x.dim(1)};
    for (size_t d = 0; d < r; ++d) {
      const int64_t s = strides_.empty() ? 1 : strides_[d];
      const int64_t p = pads_.empty() ? 0 : pads_[d] + pads_[d + r];
      const int64_t out = (x.dim(d + 2) - 1) * s + kernel_[d] - p;
      if (out < 0) ctx.fail("output size would be negative for input " + x.describe());
      inferred.push_back(out);
    }
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
    check_output_size(ctx, inferred);
    check_output_size(ctx, shape);
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
  std::vector<int64_t> kernel_, strides_, pads_;
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
