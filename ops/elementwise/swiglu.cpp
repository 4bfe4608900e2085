// Swish (ai.onnx 24): y = x * sigmoid(alpha * x) (SiLU at alpha 1, QuickGELU at 1.702; the
// graph optimizer makes it from Mul and Sigmoid), and SwiGLU (ai.onnx 28): the gated form
// y = Swish_alpha(a) * b over two inputs of identical shape (no broadcasting).
#include <algorithm>
#include <cmath>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

template <typename C>
C swish(C x, C alpha) {
  const C z = alpha * x;
  // Split by sign so that exp never overflows into inf/inf.
  const C sig = z >= C(0) ? C(1) / (C(1) + std::exp(-z)) : std::exp(z) / (C(1) + std::exp(z));
  return x * sig;
}

class Swish final : public Kernel {
 public:
  explicit Swish(const NodeInfo& info) : alpha_(info.attr_float("alpha", 1.0f)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    if (x.dtype() == DataType::Float && x.is_contiguous()) {
      // The dispatched SiLU (alpha 1) or Swish kernel, in tasks of kBlock elements.
      constexpr int64_t kBlock = 16384;
      const float* src = x.data<const float>();
      float* dst = y.data<float>();
      const int64_t n = x.numel();
      const math::VecMathKernels& vm = math::kernels().vec;
      parallel_for((n + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1) {
        const int64_t i0 = b0 * kBlock, i1 = std::min(n, b1 * kBlock);
        if (alpha_ == 1.0f) {
          vm.silu(src + i0, dst + i0, i1 - i0);
        } else {
          vm.swish(src + i0, dst + i0, i1 - i0, alpha_);
        }
      });
      return;
    }
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const C alpha = static_cast<C>(alpha_);
      unary_loop<T, T>(x, y,
                       [alpha](T v) { return from_compute<T>(swish(static_cast<C>(v), alpha)); });
    });
  }

 private:
  float alpha_;
};

class SwiGLU final : public Kernel {
 public:
  explicit SwiGLU(const NodeInfo& info) : alpha_(info.attr_float("alpha", 1.0f)) {}

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
      ctx.fail("A " + a.describe() + " and B " + b.describe() +
               " must have the same type and shape (SwiGLU does not broadcast)");
    }
    const bool reuse_a = a.is_contiguous() && ctx.can_overwrite(0);
    const bool reuse_b = !reuse_a && b.is_contiguous() && ctx.can_overwrite(1);
    Tensor& y = reuse_a || reuse_b ? ctx.output_reusing(0, reuse_a ? 0 : 1, a.dtype(), a.shape())
                                   : ctx.output(0, a.dtype(), a.shape());
    dispatch(FloatTypes{}, a.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const C alpha = static_cast<C>(alpha_);
      binary_loop<T, T, T>(a, b, y, [alpha](T va, T vb) {
        return from_compute<T>(swish(static_cast<C>(va), alpha) * static_cast<C>(vb));
      });
    });
  }

 private:
  float alpha_;
};

// SwiGLU does not broadcast.
void swiglu_shape(ShapeContext& c) {
  if (c.dtype(0) != c.dtype(1) || c.shape(0) != c.shape(1)) unknown("A and B differ");
  same_shape(c);
}

}  // namespace

KILN_REGISTER_OP({.op = "Swish",
                  .since = 24,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<Swish>});
KILN_REGISTER_OP({.op = "SwiGLU",
                  .since = 28,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0, 1),
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = swiglu_shape,
                  .create = make<SwiGLU>});

}  // namespace kiln::ops
