// Clip: y = min(max(x, lo), hi). Opsets 6-10 take the bounds as attributes (float types);
// 11+ take them as optional scalar inputs, 12+ for every numeric type. When lo > hi every
// element becomes hi, as the spec says.
#include <limits>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

class Clip final : public Kernel {
 public:
  explicit Clip(const NodeInfo& info) : opset_(info.opset()) {
    if (opset_ < 11) {
      has_min_ = info.has_attr("min");
      has_max_ = info.has_attr("max");
      attr_min_ = info.attr_float("min", 0.0f);
      attr_max_ = info.attr_float("max", 0.0f);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(NumericTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      C lo = std::numeric_limits<C>::lowest();
      C hi = std::numeric_limits<C>::max();
      if (opset_ < 11) {
        if (has_min_) lo = static_cast<C>(attr_min_);
        if (has_max_) hi = static_cast<C>(attr_max_);
      } else {
        if (ctx.has_input(1)) lo = bound<T>(ctx, 1, "min");
        if (ctx.has_input(2)) hi = bound<T>(ctx, 2, "max");
      }
      unary_loop<T, T>(x, y, [lo, hi](T v) {
        C c = static_cast<C>(v);
        if (c < lo) c = lo;
        if (c > hi) c = hi;
        return from_compute<T>(c);
      });
    });
  }

 private:
  // The bound read before y is written: y may share x's storage but never a bound's.
  template <typename T>
  static compute_t<T> bound(const OpContext& ctx, size_t i, const char* name) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != ctx.input(0).dtype()) {
      ctx.fail(std::string(name) + " has type " + t.describe() + ", input is " +
               ctx.input(0).describe());
    }
    if (t.numel() != 1) ctx.fail(std::string(name) + " must be a scalar, got " + t.describe());
    return static_cast<compute_t<T>>(t.data<const T>()[0]);
  }

  int64_t opset_;
  bool has_min_ = false, has_max_ = false;
  float attr_min_ = 0, attr_max_ = 0;
};

}  // namespace

KILN_REGISTER_OP({.op = "Clip",
                  .since = 6,
                  .min_inputs = 1,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float types (6-11), all numeric (12+)",
                  .shape = same_shape,
                  .create = make<Clip>});

}  // namespace kiln::ops
