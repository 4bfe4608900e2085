// Elementwise binary ops with numpy broadcasting: arithmetic, comparison, logic, bitwise,
// and the variadic Min/Max/Sum/Mean.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/half.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

[[noreturn]] void integer_division_by_zero() {
  throw Error(ErrorKind::Runtime, "integer division by zero");
}

// Whether `big` is the broadcast of itself with `small` (small's dims, right-aligned, are 1
// or equal to big's).
bool broadcasts_into(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return false;
  const size_t skip = big.size() - small.size();
  for (size_t i = 0; i < small.size(); ++i) {
    if (small[i] != 1 && small[i] != big[skip + i]) return false;
  }
  return true;
}

// The broadcast shape of two inputs. When it is one input's shape (equal shapes, a bias or a
// scalar) no new vector is made. Used only within the full expression that passes it on, so
// the temporary outlives every use.
struct BroadcastShape {
  Shape computed;
  const Shape* same = nullptr;
  operator const Shape&() const { return same ? *same : computed; }  // NOLINT: implicit
};
BroadcastShape broadcast_shape(const Tensor& a, const Tensor& b) {
  if (broadcasts_into(b.shape(), a.shape())) return {{}, &a.shape()};
  if (broadcasts_into(a.shape(), b.shape())) return {{}, &b.shape()};
  return {broadcast_shapes(a.shape(), b.shape()), nullptr};
}

// Writes the result over whichever input has the output's shape and type when allowed.
Tensor& binary_output(OpContext& ctx, DataType dtype, const Shape& shape) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() == dtype && a.shape() == shape && ctx.can_overwrite(0)) {
    return ctx.output_reusing(0, 0, dtype, shape);
  }
  if (b.dtype() == dtype && b.shape() == shape && ctx.can_overwrite(1)) {
    return ctx.output_reusing(0, 1, dtype, shape);
  }
  return ctx.output(0, dtype, shape);
}

void check_same_type(const OpContext& ctx) {
  if (ctx.input(0).dtype() != ctx.input(1).dtype()) {
    ctx.fail("inputs have different element types (" + ctx.input(0).describe() + " and " +
             ctx.input(1).describe() + ")");
  }
}

// float16 Add/Sub/Mul/Div (contiguous `out`): each row widened block by block into float, run
// through the float row kernel and narrowed back, as onnxruntime computes half types; an
// operand broadcast along the row is widened once.
void half_rows(math::BinaryKernels::Row row, const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr int64_t kBlock = 256;
  const auto* pa = reinterpret_cast<const uint16_t*>(a.raw_data());
  const auto* pb = reinterpret_cast<const uint16_t*>(b.raw_data());
  auto* po = reinterpret_cast<uint16_t*>(out.raw_data());
  // m values of a row of stride s into dst; returns the stride to read them with.
  auto load = [](const uint16_t* src, int64_t s, float* dst, int64_t m) -> int64_t {
    if (s == 0) {
      widen_half(src, dst, 1);
      return 0;
    }
    if (s == 1) {
      widen_half(src, dst, m);
    } else {
      for (int64_t i = 0; i < m; ++i) dst[i] = static_cast<float>(float16::from_bits(src[i * s]));
    }
    return 1;
  };
  std::array<Shape, 3> strides{broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape()),
                               out.strides()};
  for_each_row<3>(out.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* s) {
    float fa[kBlock], fb[kBlock], fo[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      const int64_t sa = load(pa + off[0] + i * s[0], s[0], fa, m);
      const int64_t sb = load(pb + off[1] + i * s[1], s[1], fb, m);
      row(fa, sa, fb, sb, fo, m);
      narrow_half(fo, po + off[2] + i, m);
    }
  });
}

// out = fn(a, b) over Fn's types; shared by the numpy-broadcasting and legacy kernels so
// each op's type grid is instantiated once.
template <typename Fn>
void arithmetic(const Fn& fn, const Tensor& a, const Tensor& b, Tensor& out) {
  // Float Add/Sub/Mul/Div: the dispatched row kernels of the processor's level.
  if constexpr (requires { Fn::kFloatRow; }) {
    if (a.dtype() == DataType::Float) {
      const math::BinaryKernels::Row row = math::kernels().binary.*Fn::kFloatRow;
      const float* pa = a.data<const float>();
      const float* pb = b.data<const float>();
      float* po = out.data<float>();
      if (out.is_contiguous()) {
        const int64_t sa = flat_stride(a, out.shape()), sb = flat_stride(b, out.shape());
        if (sa >= 0 && sb >= 0) {
          row(pa, sa, pb, sb, po, out.numel());
          return;
        }
      }
      std::array<Shape, 3> strides{broadcast_strides(a, out.shape()),
                                   broadcast_strides(b, out.shape()), out.strides()};
      for_each_row<3>(out.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* s) {
        if (s[2] == 1) {
          row(pa + off[0], s[0], pb + off[1], s[1], po + off[2], n);
        } else {
          for (int64_t i = 0; i < n; ++i)
            po[off[2] + i * s[2]] = fn(pa[off[0] + i * s[0]], pb[off[1] + i * s[1]]);
        }
      });
      return;
    }
    if (a.dtype() == DataType::Float16 && out.is_contiguous()) {
      half_rows(math::kernels().binary.*Fn::kFloatRow, a, b, out);
      return;
    }
  }
  dispatch(typename Fn::Types{}, a.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    binary_loop<T, T, T>(a, b, out, [&](T x, T y) {
      return from_compute<T>(fn(static_cast<C>(x), static_cast<C>(y)));
    });
  });
}

// Arithmetic: the output has the inputs' type.
template <typename Fn>
class Arithmetic final : public Kernel {
 public:
  explicit Arithmetic(const NodeInfo& info) : fn_(info) {}
  void run(OpContext& ctx) override {
    check_same_type(ctx);
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    Tensor& out = binary_output(ctx, a.dtype(), broadcast_shape(a, b));
    arithmetic(fn_, a, b, out);
  }

 private:
  Fn fn_;
};

// Opsets 1-6: no numpy broadcasting. With `broadcast` = 1, B is matched against A's
// dimensions starting at `axis` (default: B's dimensions are A's trailing ones).
template <typename Fn>
class LegacyArithmetic final : public Kernel {
 public:
  explicit LegacyArithmetic(const NodeInfo& info)
      : fn_(info),
        broadcast_(info.attr_int("broadcast", 0) != 0),
        axis_(info.attr_int("axis", -1)) {
    has_axis_ = info.has_attr("axis");
  }
  void run(OpContext& ctx) override {
    check_same_type(ctx);
    const Tensor& a = ctx.input(0);
    Tensor b = ctx.input(1);
    if (!broadcast_) {
      if (a.shape() != b.shape()) {
        ctx.fail("shapes " + shape_to_string(a.shape()) + " and " + shape_to_string(b.shape()) +
                 " differ and broadcast is not set");
      }
    } else {
      const auto ra = static_cast<int64_t>(a.rank()), rb = static_cast<int64_t>(b.rank());
      const int64_t axis = has_axis_ ? (axis_ < 0 ? axis_ + ra : axis_) : ra - rb;
      if (axis < 0 || axis + rb > ra) ctx.fail("axis " + std::to_string(axis_) + " does not fit B");
      Shape aligned(static_cast<size_t>(ra), 1);
      for (int64_t d = 0; d < rb; ++d) {
        const int64_t bd = b.dim(static_cast<size_t>(d));
        if (bd != 1 && bd != a.dim(static_cast<size_t>(axis + d))) {
          ctx.fail("B's shape " + shape_to_string(b.shape()) + " does not match A's at axis " +
                   std::to_string(axis));
        }
        aligned[static_cast<size_t>(axis + d)] = bd;
      }
      b = b.contiguous().reshaped(aligned);
    }
    Tensor& out = ctx.output_reusing(0, 0, a.dtype(), a.shape());
    arithmetic(fn_, a, b, out);
  }

 private:
  Fn fn_;
  bool broadcast_;
  int64_t axis_;
  bool has_axis_ = false;
};

struct AddFn {
  using Types = NumericTypes;
  static constexpr math::BinaryKernels::Row math::BinaryKernels::*kFloatRow =
      &math::BinaryKernels::add;
  explicit AddFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) {  // wrap around like ORT, without UB
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(x) + static_cast<U>(y));
    } else {
      return x + y;
    }
  }
};

struct SubFn {
  using Types = NumericTypes;
  static constexpr math::BinaryKernels::Row math::BinaryKernels::*kFloatRow =
      &math::BinaryKernels::sub;
  explicit SubFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(x) - static_cast<U>(y));
    } else {
      return x - y;
    }
  }
};

struct MulFn {
  using Types = NumericTypes;
  static constexpr math::BinaryKernels::Row math::BinaryKernels::*kFloatRow =
      &math::BinaryKernels::mul;
  explicit MulFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      using W = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, U>;
      return static_cast<C>(static_cast<W>(static_cast<U>(x)) * static_cast<W>(static_cast<U>(y)));
    } else {
      return x * y;
    }
  }
};

struct DivFn {
  using Types = NumericTypes;
  static constexpr math::BinaryKernels::Row math::BinaryKernels::*kFloatRow =
      &math::BinaryKernels::div;
  explicit DivFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) {
      if (y == 0) integer_division_by_zero();
      if constexpr (std::is_signed_v<C>) {
        if (y == -1) return static_cast<C>(0 - static_cast<std::make_unsigned_t<C>>(x));
      }
      return static_cast<C>(x / y);
    } else {
      return x / y;
    }
  }
};

struct ModFn {
  using Types = NumericTypes;
  bool fmod;
  explicit ModFn(const NodeInfo& n) : fmod(n.attr_int("fmod", 0) != 0) {}
  template <typename C>
  C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) {
      if (y == 0) integer_division_by_zero();
      if constexpr (std::is_signed_v<C>) {
        if (y == -1) return C(0);
        C r = static_cast<C>(x % y);
        if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<C>(r + y);
        return r;
      } else {
        return static_cast<C>(x % y);
      }
    } else {
      C r = std::fmod(x, y);
      if (!fmod && r != C(0) && ((r < C(0)) != (y < C(0)))) r += y;
      return r;
    }
  }
};

struct PowFn {  // opsets 1-6: float types only, same type for base and exponent
  using Types = FloatTypes;
  explicit PowFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    return std::pow(x, y);
  }
};

struct BitwiseAndFn {
  using Types = IntTypes;
  explicit BitwiseAndFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    return static_cast<C>(x & y);
  }
};
struct BitwiseOrFn {
  using Types = IntTypes;
  explicit BitwiseOrFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    return static_cast<C>(x | y);
  }
};
struct BitwiseXorFn {
  using Types = IntTypes;
  explicit BitwiseXorFn(const NodeInfo&) {}
  template <typename C>
  C operator()(C x, C y) const {
    return static_cast<C>(x ^ y);
  }
};

struct BitShiftFn {
  using Types = UnsignedIntTypes;
  bool left;
  explicit BitShiftFn(const NodeInfo& n) {
    const std::string dir = n.attr_string("direction");
    if (dir != "LEFT" && dir != "RIGHT") n.fail("direction must be LEFT or RIGHT");
    left = dir == "LEFT";
  }
  template <typename C>
  C operator()(C x, C y) const {
    if (y >= sizeof(C) * 8) return C(0);
    return left ? static_cast<C>(x << y) : static_cast<C>(x >> y);
  }
};

// Pow: base and exponent may have different types; the result has the base's type.
class Pow final : public Kernel {
 public:
  explicit Pow(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    Tensor& out = binary_output(ctx, a.dtype(), broadcast_shape(a, b));
    // A float base squared (a single exponent equal to 2, as variances and power spectra
    // write it): x * x, which is what std::pow(x, 2) returns (one correctly rounded product),
    // without a libm call per element.
    if (a.dtype() == DataType::Float && b.numel() == 1 && a.shape() == out.shape() &&
        scalar_as_double(b) == 2.0) {
      unary_loop<float, float>(a, out, [](float v) { return v * v; });  // a may be strided
      return;
    }
    using Bases = TypeList<float, double, float16, bfloat16, int32_t, int64_t>;
    dispatch(Bases{}, a.dtype(), [&]<typename T>() {
      dispatch(
          NumericTypes{}, b.dtype(),
          [&]<typename E>() {
            binary_loop<T, E, T>(a, b, out, [](T x, E y) {
              if constexpr (std::is_integral_v<T>) {
                // Out of T's range (or NaN, 0 to a negative power): saturated, never the
                // undefined float-to-integer conversion.
                const double r = std::pow(static_cast<double>(x), static_cast<double>(y));
                if (std::isnan(r)) return T(0);
                if (r >= static_cast<double>(std::numeric_limits<T>::max()))
                  return std::numeric_limits<T>::max();
                if (r <= static_cast<double>(std::numeric_limits<T>::min()))
                  return std::numeric_limits<T>::min();
                return static_cast<T>(r);
              } else {
                using C = compute_t<T>;
                return from_compute<T>(static_cast<C>(
                    std::pow(static_cast<C>(x), static_cast<C>(static_cast<compute_t<E>>(y)))));
              }
            });
          },
          "exponent");
    });
  }
};

// Comparisons read half types as float; strings and bools as they are.
template <typename T>
decltype(auto) as_compute(const T& v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return static_cast<float>(v);
  } else {
    return (v);
  }
}

// Comparisons and logic: bool output.
template <typename Fn>
class Compare final : public Kernel {
 public:
  explicit Compare(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    check_same_type(ctx);
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    Tensor& out = binary_output(ctx, DataType::Bool, broadcast_shape(a, b));
    dispatch(typename Fn::Types{}, a.dtype(), [&]<typename T>() {
      binary_loop<T, T, bool>(a, b, out, [](const T& x, const T& y) -> bool {
        return Fn::apply(as_compute(x), as_compute(y));
      });
    });
  }
};

using CompareTypes = TypeList<float, double, float16, bfloat16, int8_t, int16_t, int32_t, int64_t,
                              uint8_t, uint16_t, uint32_t, uint64_t, bool, std::string>;
using OrderTypes = NumericTypes;
using BoolOnly = TypeList<bool>;

struct EqualFn {
  using Types = CompareTypes;
  template <typename C>
  static bool apply(const C& x, const C& y) {
    return x == y;
  }
};
struct LessFn {
  using Types = OrderTypes;
  template <typename C>
  static bool apply(C x, C y) {
    return x < y;
  }
};
struct LessOrEqualFn {
  using Types = OrderTypes;
  template <typename C>
  static bool apply(C x, C y) {
    return x <= y;
  }
};
struct GreaterFn {
  using Types = OrderTypes;
  template <typename C>
  static bool apply(C x, C y) {
    return x > y;
  }
};
struct GreaterOrEqualFn {
  using Types = OrderTypes;
  template <typename C>
  static bool apply(C x, C y) {
    return x >= y;
  }
};
struct AndFn {
  using Types = BoolOnly;
  static bool apply(bool x, bool y) { return x && y; }
};
struct OrFn {
  using Types = BoolOnly;
  static bool apply(bool x, bool y) { return x || y; }
};
struct XorFn {
  using Types = BoolOnly;
  static bool apply(bool x, bool y) { return x != y; }
};

// Min, Max, Sum, Mean over one or more inputs, all broadcast together.
enum class Fold { Min, Max, Sum, Mean };

template <Fold kFold>
class Variadic final : public Kernel {
 public:
  explicit Variadic(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const size_t n = ctx.num_inputs();
    const Tensor& first = ctx.input(0);
    Shape shape = first.shape();
    for (size_t i = 1; i < n; ++i) {
      if (ctx.input(i).dtype() != first.dtype()) ctx.fail("inputs have different element types");
      shape = broadcast_shapes(shape, ctx.input(i).shape());
    }
    Tensor& out = ctx.output(0, first.dtype(), shape);
    dispatch(NumericTypes{}, first.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      auto combine = [](C x, C y) -> C {
        if constexpr (kFold == Fold::Min || kFold == Fold::Max) {
          if constexpr (std::is_floating_point_v<C>) {
            if (std::isnan(x)) return x;
            if (std::isnan(y)) return y;
          }
          return kFold == Fold::Min ? (y < x ? y : x) : (y > x ? y : x);
        } else {
          return static_cast<C>(x + y);
        }
      };
      if (n == 1) {
        unary_loop<T, T>(first, out, [](T x) { return x; });
      } else {
        binary_loop<T, T, T>(first, ctx.input(1), out, [&](T x, T y) {
          return from_compute<T>(combine(static_cast<C>(x), static_cast<C>(y)));
        });
        for (size_t i = 2; i < n; ++i) {
          binary_loop<T, T, T>(out, ctx.input(i), out, [&](T x, T y) {
            return from_compute<T>(combine(static_cast<C>(x), static_cast<C>(y)));
          });
        }
      }
      if constexpr (kFold == Fold::Mean) {
        unary_loop<T, T>(out, out, [&](T x) {
          return from_compute<T>(static_cast<C>(static_cast<C>(x) / static_cast<C>(n)));
        });
      }
    });
  }
};

// Shape rules. Known integers (sizes in shape chains) are computed for the arithmetic and
// comparisons exporters use on them.
void broadcast_only(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0, nullptr);
}

void compare_only(ShapeContext& c) {
  broadcast_shape(c, DataType::Bool, 0, nullptr);
}

void add_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0,
                  [](const std::vector<int64_t>& a) { return checked_add(a[0], a[1]); });
}

void sub_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0,
                  [](const std::vector<int64_t>& a) { return checked_sub(a[0], a[1]); });
}

void mul_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0,
                  [](const std::vector<int64_t>& a) { return checked_mul(a[0], a[1]); });
}

void div_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0,
                  [](const std::vector<int64_t>& a) { return checked_div(a[0], a[1]); });
}

void max_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0, [](const std::vector<int64_t>& a) {
    return *std::max_element(a.begin(), a.end());
  });
}

void min_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 0, [](const std::vector<int64_t>& a) {
    return *std::min_element(a.begin(), a.end());
  });
}

void equal_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Bool, 0,
                  [](const std::vector<int64_t>& a) -> int64_t { return a[0] == a[1]; });
}

void less_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Bool, 0,
                  [](const std::vector<int64_t>& a) -> int64_t { return a[0] < a[1]; });
}

void greater_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Bool, 0,
                  [](const std::vector<int64_t>& a) -> int64_t { return a[0] > a[1]; });
}

}  // namespace

#define KILN_BINARY(op_name, since_v, Kernel_, type_names, shape_fn) \
  KILN_REGISTER_OP({.op = op_name,                                   \
                    .since = since_v,                                \
                    .min_inputs = 2,                                 \
                    .max_inputs = 2,                                 \
                    .min_outputs = 1,                                \
                    .max_outputs = 1,                                \
                    .in_place = inputs(0, 1),                        \
                    .strided_inputs = true,                          \
                    .types = type_names,                             \
                    .shape = shape_fn,                               \
                    .create = make<Kernel_>})

KILN_BINARY("Add", 7, Arithmetic<AddFn>, "all numeric", add_shape);
KILN_REGISTER_OP({.op = "Add",
                  .since = 1,
                  .until = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "all numeric (broadcast/axis attributes)",
                  .shape = same_shape,
                  .create = make<LegacyArithmetic<AddFn>>});
KILN_REGISTER_OP({.op = "Sub",
                  .since = 1,
                  .until = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "all numeric (broadcast/axis attributes)",
                  .shape = same_shape,
                  .create = make<LegacyArithmetic<SubFn>>});
KILN_REGISTER_OP({.op = "Mul",
                  .since = 1,
                  .until = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "all numeric (broadcast/axis attributes)",
                  .shape = same_shape,
                  .create = make<LegacyArithmetic<MulFn>>});
KILN_REGISTER_OP({.op = "Div",
                  .since = 1,
                  .until = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "all numeric (broadcast/axis attributes)",
                  .shape = same_shape,
                  .create = make<LegacyArithmetic<DivFn>>});
KILN_REGISTER_OP({.op = "Pow",
                  .since = 1,
                  .until = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float types (broadcast/axis attributes)",
                  .shape = same_shape,
                  .create = make<LegacyArithmetic<PowFn>>});
KILN_BINARY("Sub", 7, Arithmetic<SubFn>, "all numeric", sub_shape);
KILN_BINARY("Mul", 7, Arithmetic<MulFn>, "all numeric", mul_shape);
KILN_BINARY("Div", 7, Arithmetic<DivFn>, "all numeric", div_shape);
KILN_BINARY("Mod", 10, Arithmetic<ModFn>, "all numeric", broadcast_only);
KILN_BINARY("Pow", 7, Pow, "float types, int32, int64 (any numeric exponent)", broadcast_only);
KILN_BINARY("BitwiseAnd", 18, Arithmetic<BitwiseAndFn>, "integers", broadcast_only);
KILN_BINARY("BitwiseOr", 18, Arithmetic<BitwiseOrFn>, "integers", broadcast_only);
KILN_BINARY("BitwiseXor", 18, Arithmetic<BitwiseXorFn>, "integers", broadcast_only);
KILN_BINARY("BitShift", 11, Arithmetic<BitShiftFn>, "unsigned integers", broadcast_only);
KILN_BINARY("Equal", 7, Compare<EqualFn>, "all numeric, bool, string", equal_shape);
KILN_BINARY("Less", 7, Compare<LessFn>, "all numeric", less_shape);
KILN_BINARY("LessOrEqual", 12, Compare<LessOrEqualFn>, "all numeric", compare_only);
KILN_BINARY("Greater", 7, Compare<GreaterFn>, "all numeric", greater_shape);
KILN_BINARY("GreaterOrEqual", 12, Compare<GreaterOrEqualFn>, "all numeric", compare_only);
KILN_BINARY("And", 7, Compare<AndFn>, "bool", compare_only);
KILN_BINARY("Or", 7, Compare<OrFn>, "bool", compare_only);
KILN_BINARY("Xor", 7, Compare<XorFn>, "bool", compare_only);
#undef KILN_BINARY

#define KILN_VARIADIC(op_name, since_v, fold, shape_fn) \
  KILN_REGISTER_OP({.op = op_name,                      \
                    .since = since_v,                   \
                    .min_inputs = 1,                    \
                    .min_outputs = 1,                   \
                    .max_outputs = 1,                   \
                    .strided_inputs = true,             \
                    .types = "all numeric",             \
                    .shape = shape_fn,                  \
                    .create = make<Variadic<fold>>})
KILN_VARIADIC("Min", 6, Fold::Min, min_shape);
KILN_VARIADIC("Max", 6, Fold::Max, max_shape);
KILN_VARIADIC("Sum", 6, Fold::Sum, broadcast_only);
KILN_VARIADIC("Mean", 6, Fold::Mean, broadcast_only);
#undef KILN_VARIADIC

}  // namespace kiln::ops
