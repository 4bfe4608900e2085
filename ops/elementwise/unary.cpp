// Elementwise unary math and activations. Each op is a small functor over the compute
// type (float for half types); the loop, dispatch and in-place reuse are shared. Functors
// with a dispatched vector kernel (ops/math/impl/vecmath.h) name it in vec(); contiguous
// float tensors then go through it instead of the scalar loop.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

using VecFn = math::VecMathKernels::Elementwise;

// Elements per task: each task is long enough to repay its scheduling.
constexpr int64_t kVecBlock = 16384;

void run_vec(VecFn fn, const float* x, float* y, int64_t n) {
  parallel_for((n + kVecBlock - 1) / kVecBlock, 1, [&](int64_t b0, int64_t b1) {
    const int64_t i0 = b0 * kVecBlock, i1 = std::min(n, b1 * kVecBlock);
    fn(x + i0, y + i0, i1 - i0);
  });
}

template <typename Fn>
class Unary final : public Kernel {
 public:
  explicit Unary(const NodeInfo& info) : fn_(info) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    if constexpr (requires { fn_.vec(math::kernels().vec); }) {
      if (x.dtype() == DataType::Float && x.is_contiguous()) {
        if (const VecFn f = fn_.vec(math::kernels().vec)) {
          run_vec(f, x.data<const float>(), y.data<float>(), x.numel());
          return;
        }
      }
    }
    // The functor by value: its parameters (alpha, ...) are then locals the compiler knows no
    // store to y can change, so the loop over y vectorises (with -fno-trapping-math, set for
    // this file in ops/CMakeLists.txt, which lets it compute both sides of `x >= 0 ? x :
    // alpha * x` and select). Read through the member, LeakyRelu ran as a branch per element.
    dispatch(typename Fn::Types{}, x.dtype(), [&]<typename T>() {
      unary_loop<T, T>(
          x, y, [fn = fn_](T v) { return from_compute<T>(fn(static_cast<compute_t<T>>(v))); });
    });
  }

 private:
  Fn fn_;
};

// Functors. `Types` lists the element types the op accepts.
#define KILN_FLOAT_UNARY(Name, expr)  \
  struct Name {                       \
    using Types = FloatTypes;         \
    explicit Name(const NodeInfo&) {} \
    template <typename C>             \
    C operator()(C x) const {         \
      return expr;                    \
    }                                 \
  };

KILN_FLOAT_UNARY(SqrtFn, std::sqrt(x))
KILN_FLOAT_UNARY(ReciprocalFn, C(1) / x)
KILN_FLOAT_UNARY(FloorFn, std::floor(x))
KILN_FLOAT_UNARY(CeilFn, std::ceil(x))
KILN_FLOAT_UNARY(RoundFn, std::nearbyint(x))  // half to even under the default rounding mode
KILN_FLOAT_UNARY(SinFn, std::sin(x))
KILN_FLOAT_UNARY(CosFn, std::cos(x))
KILN_FLOAT_UNARY(TanFn, std::tan(x))
KILN_FLOAT_UNARY(AsinFn, std::asin(x))
KILN_FLOAT_UNARY(AcosFn, std::acos(x))
KILN_FLOAT_UNARY(AtanFn, std::atan(x))
KILN_FLOAT_UNARY(SinhFn, std::sinh(x))
KILN_FLOAT_UNARY(CoshFn, std::cosh(x))
KILN_FLOAT_UNARY(AsinhFn, std::asinh(x))
KILN_FLOAT_UNARY(AcoshFn, std::acosh(x))
KILN_FLOAT_UNARY(AtanhFn, std::atanh(x))
KILN_FLOAT_UNARY(SoftsignFn, x / (C(1) + std::abs(x)))
KILN_FLOAT_UNARY(SoftplusFn, x > C(20) ? x : std::log1p(std::exp(x)))
KILN_FLOAT_UNARY(MishFn, x* std::tanh(x > C(20) ? x : std::log1p(std::exp(x))))
#undef KILN_FLOAT_UNARY

// The same with the vector kernel `member` for contiguous float tensors.
#define KILN_VEC_UNARY(Name, expr, member)                              \
  struct Name {                                                         \
    using Types = FloatTypes;                                           \
    explicit Name(const NodeInfo&) {}                                   \
    template <typename C>                                               \
    C operator()(C x) const {                                           \
      return expr;                                                      \
    }                                                                   \
    VecFn vec(const math::VecMathKernels& k) const { return k.member; } \
  };

KILN_VEC_UNARY(ExpFn, std::exp(x), exp)
KILN_VEC_UNARY(LogFn, std::log(x), log)
KILN_VEC_UNARY(TanhFn, std::tanh(x), tanh)
KILN_VEC_UNARY(ErfFn, std::erf(x), erf)
KILN_VEC_UNARY(SigmoidFn,
               x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x)),
               sigmoid)
#undef KILN_VEC_UNARY

struct AbsFn {
  using Types = NumericTypes;
  explicit AbsFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else {
      return x < C(0) ? C(-x) : x;
    }
  }
};

struct NegFn {
  using Types = SignedNumericTypes;
  explicit NegFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<std::make_unsigned_t<C>>(0) -
                            static_cast<std::make_unsigned_t<C>>(x));
    } else {
      return -x;
    }
  }
};

struct SignFn {
  using Types = NumericTypes;
  explicit SignFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      if (std::isnan(x)) return x;
    }
    return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
  }
};

struct ReluFn {
  using Types = SignedNumericTypes;
  explicit ReluFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x) const {
    return x > C(0) ? x : C(0);
  }
};

struct LeakyReluFn {
  using Types = FloatTypes;
  float alpha;
  explicit LeakyReluFn(const NodeInfo& n) : alpha(n.attr_float("alpha", 0.01f)) {}
  template <typename C>
  C operator()(C x) const {
    return x >= C(0) ? x : C(alpha) * x;
  }
};

struct EluFn {
  using Types = FloatTypes;
  float alpha;
  explicit EluFn(const NodeInfo& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename C>
  C operator()(C x) const {
    return x >= C(0) ? x : C(alpha) * std::expm1(x);
  }
};

struct SeluFn {
  using Types = FloatTypes;
  float alpha, gamma;
  explicit SeluFn(const NodeInfo& n)
      : alpha(n.attr_float("alpha", 1.67326319217681884765625f)),
        gamma(n.attr_float("gamma", 1.05070102214813232421875f)) {}
  template <typename C>
  C operator()(C x) const {
    return x > C(0) ? C(gamma) * x : C(gamma) * (C(alpha) * std::exp(x) - C(alpha));
  }
};

struct CeluFn {
  using Types = FloatTypes;
  float alpha;
  explicit CeluFn(const NodeInfo& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename C>
  C operator()(C x) const {
    return std::max(C(0), x) + std::min(C(0), C(alpha) * std::expm1(x / C(alpha)));
  }
};

struct HardSigmoidFn {
  using Types = FloatTypes;
  float alpha, beta;
  explicit HardSigmoidFn(const NodeInfo& n)
      : alpha(n.attr_float("alpha", 0.2f)), beta(n.attr_float("beta", 0.5f)) {}
  template <typename C>
  C operator()(C x) const {
    return std::max(C(0), std::min(C(1), C(alpha) * x + C(beta)));
  }
};

struct HardSwishFn {
  using Types = FloatTypes;
  explicit HardSwishFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x) const {
    return x * std::max(C(0), std::min(C(1), x / C(6) + C(0.5)));
  }
};

struct ThresholdedReluFn {
  using Types = FloatTypes;
  float alpha;
  explicit ThresholdedReluFn(const NodeInfo& n) : alpha(n.attr_float("alpha", 1.0f)) {}
  template <typename C>
  C operator()(C x) const {
    return x > C(alpha) ? x : C(0);
  }
};

struct ShrinkFn {
  using Types = NumericTypes;
  float bias, lambd;
  explicit ShrinkFn(const NodeInfo& n)
      : bias(n.attr_float("bias", 0.0f)), lambd(n.attr_float("lambd", 0.5f)) {}
  template <typename C>
  C operator()(C x) const {
    const double v = static_cast<double>(x);
    if (v < -lambd) return static_cast<C>(v + bias);
    if (v > lambd) return static_cast<C>(v - bias);
    return C(0);
  }
};

struct GeluFn {
  using Types = FloatTypes;
  bool tanh_approx;
  explicit GeluFn(const NodeInfo& n) : tanh_approx(n.attr_string("approximate", "none") == "tanh") {
    const std::string a = n.attr_string("approximate", "none");
    if (a != "none" && a != "tanh") n.fail("approximate must be 'none' or 'tanh'");
  }
  template <typename C>
  C operator()(C x) const {
    if (tanh_approx) {
      const C k = C(0.7978845608028654);  // sqrt(2/pi)
      return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
    }
    return C(0.5) * x * (C(1) + std::erf(x / C(1.4142135623730951)));
  }
  VecFn vec(const math::VecMathKernels& k) const { return tanh_approx ? k.gelu_tanh : k.gelu; }
};

// Ops whose output type differs from the input's.
template <typename Pred>
class Predicate final : public Kernel {
 public:
  explicit Predicate(const NodeInfo& info) : pred_(info) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0, DataType::Bool, x.shape());
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      unary_loop<T, bool>(x, y, [&](T v) { return pred_(static_cast<compute_t<T>>(v)); });
    });
  }

 private:
  Pred pred_;
};

struct IsNaNPred {
  explicit IsNaNPred(const NodeInfo&) {}
  template <typename C>
  bool operator()(C x) const {
    return std::isnan(x);
  }
};

struct IsInfPred {
  bool pos, neg;
  explicit IsInfPred(const NodeInfo& n)
      : pos(n.attr_int("detect_positive", 1) != 0), neg(n.attr_int("detect_negative", 1) != 0) {}
  template <typename C>
  bool operator()(C x) const {
    return std::isinf(x) && ((x > 0 && pos) || (x < 0 && neg));
  }
};

class Not final : public Kernel {
 public:
  explicit Not(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::Bool) throw_unsupported_type(x.dtype(), "Not input");
    Tensor& y = ctx.output_reusing(0, 0, DataType::Bool, x.shape());
    unary_loop<bool, bool>(x, y, [](bool v) { return !v; });
  }
};

class BitwiseNot final : public Kernel {
 public:
  explicit BitwiseNot(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(IntTypes{}, x.dtype(),
             [&]<typename T>() { unary_loop<T, T>(x, y, [](T v) { return static_cast<T>(~v); }); });
  }
};

// Neg and Abs of known integers (shape chains negate and take magnitudes of sizes).
void neg_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0,
                  [](const std::vector<int64_t>& a) { return checked_sub(0, a[0]); });
}

void abs_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0, [](const std::vector<int64_t>& a) {
    return a[0] < 0 ? checked_sub(0, a[0]) : a[0];
  });
}

void predicate_shape(ShapeContext& c) {
  same_shape_as(c, DataType::Bool);
}

}  // namespace

#define KILN_UNARY_AS(op_name, since_v, Fn, type_names, shape_fn) \
  KILN_REGISTER_OP({.op = op_name,                                \
                    .since = since_v,                             \
                    .min_inputs = 1,                              \
                    .max_inputs = 1,                              \
                    .min_outputs = 1,                             \
                    .max_outputs = 1,                             \
                    .in_place = inputs(0),                        \
                    .strided_inputs = true,                       \
                    .types = type_names,                          \
                    .shape = shape_fn,                            \
                    .create = make<Unary<Fn>>})
#define KILN_UNARY(op_name, since_v, Fn, type_names) \
  KILN_UNARY_AS(op_name, since_v, Fn, type_names, same_shape)

constexpr const char* kFloat = "float, double, float16, bfloat16";
constexpr const char* kNumeric = "all numeric";
KILN_UNARY("Exp", 6, ExpFn, kFloat);
KILN_UNARY("Log", 6, LogFn, kFloat);
KILN_UNARY("Sqrt", 6, SqrtFn, kFloat);
KILN_UNARY("Reciprocal", 6, ReciprocalFn, kFloat);
KILN_UNARY("Floor", 6, FloorFn, kFloat);
KILN_UNARY("Ceil", 6, CeilFn, kFloat);
KILN_UNARY("Round", 11, RoundFn, kFloat);
KILN_UNARY("Sin", 7, SinFn, kFloat);
KILN_UNARY("Cos", 7, CosFn, kFloat);
KILN_UNARY("Tan", 7, TanFn, kFloat);
KILN_UNARY("Asin", 7, AsinFn, kFloat);
KILN_UNARY("Acos", 7, AcosFn, kFloat);
KILN_UNARY("Atan", 7, AtanFn, kFloat);
KILN_UNARY("Sinh", 9, SinhFn, kFloat);
KILN_UNARY("Cosh", 9, CoshFn, kFloat);
KILN_UNARY("Asinh", 9, AsinhFn, kFloat);
KILN_UNARY("Acosh", 9, AcoshFn, kFloat);
KILN_UNARY("Atanh", 9, AtanhFn, kFloat);
KILN_UNARY("Tanh", 6, TanhFn, kFloat);
KILN_UNARY("Erf", 9, ErfFn, kFloat);
KILN_UNARY("Sigmoid", 6, SigmoidFn, kFloat);
KILN_UNARY("Softsign", 1, SoftsignFn, kFloat);
KILN_UNARY("Softplus", 1, SoftplusFn, kFloat);
KILN_UNARY("Mish", 18, MishFn, kFloat);
KILN_UNARY_AS("Abs", 6, AbsFn, kNumeric, abs_shape);
KILN_UNARY_AS("Neg", 6, NegFn, "signed numeric", neg_shape);
KILN_UNARY("Sign", 9, SignFn, kNumeric);
KILN_UNARY("Relu", 6, ReluFn, "float types, signed integers");
KILN_UNARY("LeakyRelu", 6, LeakyReluFn, kFloat);
KILN_UNARY("Elu", 6, EluFn, kFloat);
KILN_UNARY("Selu", 6, SeluFn, kFloat);
KILN_UNARY("Celu", 12, CeluFn, kFloat);
KILN_UNARY("HardSigmoid", 6, HardSigmoidFn, kFloat);
KILN_UNARY("HardSwish", 14, HardSwishFn, kFloat);
KILN_UNARY("ThresholdedRelu", 10, ThresholdedReluFn, kFloat);
KILN_UNARY("Shrink", 9, ShrinkFn, kNumeric);
KILN_UNARY("Gelu", 20, GeluFn, kFloat);
#undef KILN_UNARY
#undef KILN_UNARY_AS

KILN_REGISTER_OP({.op = "IsNaN",
                  .since = 9,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .strided_inputs = true,
                  .types = "float types",
                  .shape = predicate_shape,
                  .create = make<Predicate<IsNaNPred>>});
KILN_REGISTER_OP({.op = "IsInf",
                  .since = 10,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .strided_inputs = true,
                  .types = "float types",
                  .shape = predicate_shape,
                  .create = make<Predicate<IsInfPred>>});
KILN_REGISTER_OP({.op = "Not",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "bool",
                  .shape = same_shape,
                  .create = make<Not>});
KILN_REGISTER_OP({.op = "BitwiseNot",
                  .since = 18,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "integers",
                  .shape = same_shape,
                  .create = make<BitwiseNot>});

}  // namespace kiln::ops
