// PRelu: y = x < 0 ? slope * x : x, with the slope broadcast to x (unidirectionally).
// Before opset 7 a 1-D slope of x.shape[1] values is per channel (the layout old PyTorch
// exports use), so it is seen as [C, 1, ..., 1].
#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

using PReluTypes = TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t, uint64_t>;

class PRelu final : public Kernel {
 public:
  explicit PRelu(const NodeInfo& info) : opset_(info.opset()) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor slope = ctx.input(1);
    if (slope.dtype() != x.dtype()) {
      ctx.fail("slope has type " + slope.describe() + ", X is " + x.describe());
    }
    if (opset_ < 7 && slope.rank() == 1 && x.rank() >= 2 && slope.dim(0) == x.dim(1) &&
        slope.dim(0) != 1) {
      Shape shape(x.rank() - 1, 1), strides(x.rank() - 1, 0);
      shape[0] = slope.dim(0);
      strides[0] = slope.strides()[0];
      slope = slope.view(shape, strides, slope.byte_offset());
    }
    if (slope.rank() > x.rank() || broadcast_shapes(x.shape(), slope.shape()) != x.shape()) {
      ctx.fail("slope " + slope.describe() + " does not broadcast to X " + x.describe());
    }
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(PReluTypes{}, x.dtype(), [&]<typename T>() {
      binary_loop<T, T, T>(x, slope, y, [](T v, T s) {
        if constexpr (std::is_unsigned_v<T>) {
          return v;
        } else if constexpr (std::is_integral_v<T>) {  // wraps like Mul, without UB
          using U = std::make_unsigned_t<T>;
          return v < 0 ? static_cast<T>(static_cast<U>(v) * static_cast<U>(s)) : v;
        } else {
          using C = compute_t<T>;
          const C c = static_cast<C>(v);
          return c < C(0) ? from_compute<T>(static_cast<C>(c * static_cast<C>(s))) : v;
        }
      });
    });
  }

 private:
  int64_t opset_;
};

}  // namespace

KILN_REGISTER_OP({.op = "PRelu",
                  .since = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float types, int32, int64, uint32, uint64",
                  .shape = same_shape,
                  .create = make<PRelu>});

}  // namespace kiln::ops
