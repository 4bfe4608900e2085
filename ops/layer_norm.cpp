// LayerNormalization (opset 17) and RMSNormalization (opset 23).
//
// X is seen as rows x N, N the product of the normalised dims [axis, rank). Each row is
// normalised independently (rows in parallel, tasks of at least kTaskElements elements) over
// the contiguous row: in float (half types too, float16 rows converted by the dispatched
// conversion kernels) by the dispatched row kernels
// (ops/math/impl/vecmath_rows.h), in double with Eigen expressions. Scale and bias are
// unidirectionally broadcast to X: the usual shapes (the normalised dims) are one vector
// shared by every row; a scale that also varies over the leading dims is expanded per row.
#include <Eigen/Core>
#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/half.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTaskElements = 16384;

template <typename C>
using Arr = Eigen::Array<C, Eigen::Dynamic, 1>;
template <typename C>
using ConstMap = Eigen::Map<const Arr<C>>;
template <typename C>
using MutMap = Eigen::Map<Arr<C>>;

// Scale or bias in the compute type: `data` has N values, or rows * N when `per_row`.
template <typename C>
struct Param {
  const C* data = nullptr;
  bool per_row = false;
  Tensor owned;
  const C* row(int64_t r, int64_t n) const { return per_row ? data + r * n : data; }
};

template <typename C>
Param<C> prepare_param(OpContext& ctx, const Tensor& p, const Shape& xshape, size_t axis, int64_t n,
                       const char* what) {
  if (p.rank() > xshape.size()) {
    ctx.fail(std::string(what) + " " + p.describe() + " has more dims than X");
  }
  const size_t off = xshape.size() - p.rank();
  bool per_row = false;
  for (size_t i = 0; i < p.rank(); ++i) {
    const int64_t d = p.dim(i), xd = xshape[off + i];
    if (d != xd && d != 1) {
      ctx.fail(std::string(what) + " " + p.describe() + " does not broadcast to X " +
               shape_to_string(xshape));
    }
    if (off + i < axis && d != 1) per_row = true;
  }
  Param<C> out;
  out.per_row = per_row;
  if (!per_row && p.dtype() == data_type_of<C>() && p.numel() == n && p.is_contiguous()) {
    out.data = p.data<const C>();
    return out;
  }
  // Expand to the normalised shape (or the whole of X) in the compute type.
  Shape target = per_row ? xshape : Shape(xshape.begin() + static_cast<long>(axis), xshape.end());
  // Dims of p in front of the normalised axes are all 1 here (else per_row): drop them.
  Tensor src = p;
  if (p.rank() > target.size()) {
    const auto drop = static_cast<long>(p.rank() - target.size());
    src = p.view(Shape(p.shape().begin() + drop, p.shape().end()),
                 Shape(p.strides().begin() + drop, p.strides().end()), p.byte_offset());
  }
  Tensor view = src.view(target, broadcast_strides(src, target), src.byte_offset());
  out.owned = ctx.allocate(data_type_of<C>(), target);
  dispatch(
      FloatTypes{}, p.dtype(),
      [&]<typename S>() {
        unary_loop<S, C>(view, out.owned,
                         [](S v) { return static_cast<C>(static_cast<compute_t<S>>(v)); });
      },
      what);
  out.data = out.owned.template data<const C>();
  return out;
}

DataType stash_dtype(const NodeInfo& info) {
  switch (info.attr_int("stash_type", 1)) {
    case 1:
      return DataType::Float;
    case 11:
      return DataType::Double;
    case 10:
      return DataType::Float16;
    case 16:
      return DataType::BFloat16;
    default:
      info.fail("stash_type must be a float type", ErrorKind::Unsupported);
  }
}

template <bool kRms>
class Norm final : public Kernel {
 public:
  explicit Norm(const NodeInfo& info)
      : axis_(info.attr_int("axis", -1)),
        epsilon_(info.attr_float("epsilon", 1e-5f)),
        stash_(stash_dtype(info)) {
    if (!(epsilon_ >= 0)) info.fail("epsilon must be non-negative");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const bool has_bias = !kRms && ctx.has_input(2);
    if (scale.dtype() != x.dtype() || (has_bias && ctx.input(2).dtype() != x.dtype())) {
      ctx.fail("scale and bias must have X's element type " + x.describe(), ErrorKind::Unsupported);
    }
    const int64_t rank = static_cast<int64_t>(x.rank());
    const auto axis = static_cast<size_t>(normalize_axis(axis_, rank));
    int64_t rows = 1, n = 1;
    Shape stat_shape;
    for (size_t d = 0; d < x.rank(); ++d) {
      if (d < axis) {
        rows *= x.dim(d);
        stat_shape.push_back(x.dim(d));
      } else {
        n *= x.dim(d);
        stat_shape.push_back(1);
      }
    }
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const Param<C> s = prepare_param<C>(ctx, scale, x.shape(), axis, n, "scale");
      Param<C> b;
      if (has_bias) b = prepare_param<C>(ctx, ctx.input(2), x.shape(), axis, n, "bias");
      Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
      Tensor mean, inv_std;
      if (!kRms && ctx.has_output(1)) mean = ctx.output(1, stash_, stat_shape);
      if (!kRms && ctx.has_output(2)) inv_std = ctx.output(2, stash_, stat_shape);
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      const C eps = static_cast<C>(epsilon_);
      parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
        std::vector<C> scratch(std::is_same_v<T, C> ? 0 : static_cast<size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          const C* xr;
          C* yr;
          if constexpr (std::is_same_v<T, C>) {
            xr = src + r * n;
            yr = dst + r * n;
          } else {
            if constexpr (std::is_same_v<T, float16>) {
              widen_half(src + r * n, scratch.data(), n);
            } else {
              for (int64_t i = 0; i < n; ++i) scratch[static_cast<size_t>(i)] = src[r * n + i];
            }
            xr = yr = scratch.data();
          }
          ConstMap<C> xm(xr, n);
          MutMap<C> ym(yr, n);
          ConstMap<C> sm(s.row(r, n), n);
          C mu = 0, inv = 0;
          if constexpr (std::is_same_v<C, float>) {
            const math::VecMathKernels& vm = math::kernels().vec;
            if constexpr (kRms) {
              vm.rms_norm(xr, yr, n, s.row(r, n), eps, nullptr);
            } else {
              vm.layer_norm(xr, yr, n, s.row(r, n), has_bias ? b.row(r, n) : nullptr, eps, &mu,
                            &inv);
            }
          } else if constexpr (kRms) {
            inv = C(1) / std::sqrt(xm.square().sum() / static_cast<C>(n) + eps);
            ym = xm * inv * sm;
          } else {
            mu = xm.sum() / static_cast<C>(n);
            inv = C(1) / std::sqrt((xm - mu).square().sum() / static_cast<C>(n) + eps);
            if (has_bias) {
              ym = (xm - mu) * inv * sm + ConstMap<C>(b.row(r, n), n);
            } else {
              ym = (xm - mu) * inv * sm;
            }
          }
          if constexpr (std::is_same_v<T, float16>) {
            narrow_half(scratch.data(), dst + r * n, n);
          } else if constexpr (!std::is_same_v<T, C>) {
            for (int64_t i = 0; i < n; ++i) dst[r * n + i] = T(scratch[static_cast<size_t>(i)]);
          }
          if (mean.defined()) store(mean, r, mu);
          if (inv_std.defined()) store(inv_std, r, inv);
        }
      });
    });
  }

 private:
  template <typename C>
  static void store(const Tensor& t, int64_t i, C v) {
    dispatch(FloatTypes{}, t.dtype(),
             [&]<typename U>() { t.data<U>()[i] = from_compute<U>(static_cast<compute_t<U>>(v)); });
  }

  int64_t axis_;
  float epsilon_;
  DataType stash_;
};

// Y has X's shape; Mean and InvStdDev keep the axes before `axis` and 1 for the others, in
// the stash type.
void layer_norm_shape(ShapeContext& c) {
  const ValueFacts& x = c.in(0);
  c.set(0, x.dtype, x.shape);
  const int64_t stash = c.attr_i("stash_type", 1);
  if (stash != 1 && stash != 10 && stash != 11 && stash != 16) unknown("bad stash_type");
  const auto axis = static_cast<size_t>(
      normalize_axis(c.attr_i("axis", -1), static_cast<int64_t>(x.shape.size())));
  Shape stat = x.shape;
  std::fill(stat.begin() + static_cast<std::ptrdiff_t>(axis), stat.end(), 1);
  c.set(1, static_cast<DataType>(stash), stat);
  c.set(2, static_cast<DataType>(stash), stat);
}

}  // namespace

KILN_REGISTER_OP({.op = "LayerNormalization",
                  .since = 17,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 3,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16",
                  .shape = layer_norm_shape,
                  .create = make<Norm<false>>});
KILN_REGISTER_OP({.op = "RMSNormalization",
                  .since = 23,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16 (scale of X's type)",
                  .shape = same_shape,
                  .create = make<Norm<true>>});

}  // namespace kiln::ops
