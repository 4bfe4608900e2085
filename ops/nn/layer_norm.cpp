// LayerNormalization (opset 17) and RMSNormalization (opset 23).
//
// X is seen as rows x N, N the product of the normalised dims [axis, rank). Each row is
// normalised independently (rows in parallel, at most a task per thread, each of at least
// kTaskElements elements, with its own row of the workspace for half types) over
// the contiguous row: in float (half types too, float16 rows converted by the dispatched
// conversion kernels) by the dispatched row kernels
// (ops/math/impl/vecmath_rows.h), in double with Eigen expressions. Scale and bias are
// unidirectionally broadcast to X: the usual shapes (the normalised dims) are one vector
// shared by every row; a scale that also varies over the leading dims is expanded per row.
#include <Eigen/Core>
#include <cmath>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/half.h"
#include "ops/core/workspace.h"
#include "ops/math/kernels.h"
#include "ops/math/threading.h"

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
  const C* row(int64_t r, int64_t n) const { return per_row ? data + r * n : data; }
};

// Whether parameter `p` (of X's type) varies over the dims before `axis`: expanded per row.
// Throws kiln::Error (no node) when it does not broadcast to X.
bool param_per_row(const Shape& p, const Shape& x, size_t axis, const char* what) {
  if (p.size() > x.size()) {
    throw Error(ErrorKind::InvalidModel,
                std::string(what) + " " + shape_to_string(p) + " has more dims than X");
  }
  const size_t off = x.size() - p.size();
  bool per_row = false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != x[off + i] && p[i] != 1) {
      throw Error(ErrorKind::InvalidModel, std::string(what) + " " + shape_to_string(p) +
                                               " does not broadcast to X " + shape_to_string(x));
    }
    if (off + i < axis && p[i] != 1) per_row = true;
  }
  return per_row;
}

// The elements of parameter `p` in the compute type when it is not read in place (its own
// type is not the compute type, it is not N values, or it varies per row), else 0.
int64_t param_copy(const Shape& p, bool compute_type, const Shape& x, size_t axis, int64_t n,
                   const char* what) {
  const bool per_row = param_per_row(p, x, axis, what);
  if (!per_row && compute_type && shape_numel(p) == n) return 0;
  return per_row ? shape_numel(x) : n;
}

// Rows per task (at least kTaskElements elements each) and the tasks on `threads` threads.
int row_tasks(int64_t rows, int64_t n, int threads) {
  const int64_t grain = grain_for(n, kTaskElements);
  const int64_t by_rows = (rows + grain - 1) / grain;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(by_rows, threads)));
}

// The workspace, as the kernel and layer_norm_workspace lay it out: the scale and bias
// expanded (copy_scale, copy_bias elements, param_copy) and, for half types, a row in float
// per task.
struct NormParts {
  WorkspaceLayout layout;
  int scale = -1, bias = -1, rows = -1;
  int tasks = 1;
};

NormParts norm_parts(DataType x, int64_t rows, int64_t n, int64_t copy_scale, int64_t copy_bias,
                     int threads) {
  NormParts p;
  const DataType c = x == DataType::Double ? DataType::Double : DataType::Float;
  p.tasks = row_tasks(rows, n, threads);
  if (copy_scale > 0) p.scale = p.layout.add(c, copy_scale);
  if (copy_bias > 0) p.bias = p.layout.add(c, copy_bias);
  if (x != c) p.rows = p.layout.add(DataType::Float, p.tasks * n);
  return p;
}

// Parameter `p` in the compute type: read in place, or expanded into workspace part `part`
// (norm_parts) when param_copy said so.
template <typename C>
Param<C> prepare_param(OpContext& ctx, const Tensor& p, const Shape& xshape, size_t axis, int64_t n,
                       const Workspace& space, int part) {
  Param<C> out;
  out.per_row = param_per_row(p.shape(), xshape, axis, "");
  if (part < 0) {  // contiguous, as the op takes no strided inputs
    out.data = p.data<const C>();
    return out;
  }
  // Expand to the normalised shape (or the whole of X) in the compute type.
  Shape target =
      out.per_row ? xshape : Shape(xshape.begin() + static_cast<long>(axis), xshape.end());
  // Dims of p in front of the normalised axes are all 1 here (else per_row): drop them.
  Tensor src = p;
  if (p.rank() > target.size()) {
    const auto drop = static_cast<long>(p.rank() - target.size());
    src = p.view(Shape(p.shape().begin() + drop, p.shape().end()),
                 Shape(p.strides().begin() + drop, p.strides().end()), p.byte_offset());
  }
  Tensor view = src.view(target, broadcast_strides(src, target), src.byte_offset());
  Tensor dst = space.tensor(part, target);
  dispatch(
      FloatTypes{}, p.dtype(),
      [&]<typename S>() {
        unary_loop<S, C>(view, dst,
                         [](S v) { return static_cast<C>(static_cast<compute_t<S>>(v)); });
      },
      "parameter");
  out.data = dst.template data<const C>();
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
    const char* names[] = {"scale", "bias"};
    int64_t copies[2] = {0, 0};
    const bool half = x.dtype() != DataType::Float && x.dtype() != DataType::Double;
    for (size_t i = 0; i < (has_bias ? 2u : 1u); ++i) {
      try {
        copies[i] = param_copy(ctx.input(i + 1).shape(), !half, x.shape(), axis, n, names[i]);
      } catch (const Error& e) {
        ctx.fail(e.what());
      }
    }
    // The outputs, then the workspace (layer_norm_workspace).
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    Tensor mean, inv_std;
    if (!kRms && ctx.has_output(1)) mean = ctx.output(1, stash_, stat_shape);
    if (!kRms && ctx.has_output(2)) inv_std = ctx.output(2, stash_, stat_shape);
    const NormParts parts = norm_parts(x.dtype(), rows, n, copies[0], copies[1], ctx.threads());
    const Workspace space(ctx, parts.layout);
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const Param<C> s = prepare_param<C>(ctx, scale, x.shape(), axis, n, space, parts.scale);
      Param<C> b;
      if (has_bias) b = prepare_param<C>(ctx, ctx.input(2), x.shape(), axis, n, space, parts.bias);
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      const C eps = static_cast<C>(epsilon_);
      const int tasks = parts.tasks;
      math::run_tasks(tasks, [&](int t) {
        const int64_t r0 = rows * t / tasks, r1 = rows * (t + 1) / tasks;
        C* scratch = nullptr;  // this task's row in float (half types)
        if constexpr (!std::is_same_v<T, C>) scratch = space.data<C>(parts.rows) + t * n;
        for (int64_t r = r0; r < r1; ++r) {
          const C* xr;
          C* yr;
          if constexpr (std::is_same_v<T, C>) {
            xr = src + r * n;
            yr = dst + r * n;
          } else {
            if constexpr (std::is_same_v<T, float16>) {
              widen_half(src + r * n, scratch, n);
            } else {
              for (int64_t i = 0; i < n; ++i) scratch[i] = src[r * n + i];
            }
            xr = yr = scratch;
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
            narrow_half(scratch, dst + r * n, n);
          } else if constexpr (!std::is_same_v<T, C>) {
            for (int64_t i = 0; i < n; ++i) dst[r * n + i] = T(scratch[i]);
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
  const ValueFacts& x = c.facts(0);
  same_shape(c);
  const int64_t stash = c.attr_int("stash_type", 1);
  if (stash != 1 && stash != 10 && stash != 11 && stash != 16) unknown("bad stash_type");
  // The statistics: x's shape with 1 from the normalized axis on.
  ValueFacts stat = typed_facts(static_cast<DataType>(stash));
  if (x.ranked) {
    const auto axis = static_cast<size_t>(normalize_axis(c.attr_int("axis", -1), x.rank()));
    stat = sub_shape(x, 0, axis);
    stat.dtype = static_cast<DataType>(stash);
    for (size_t k = axis; k < x.shape.size(); ++k) append_dim(stat, 1);
  }
  c.set(1, stat);
  c.set(2, std::move(stat));
}

// The kernel's workspace (norm_parts) for these shapes on c.threads() threads.
uint64_t norm_workspace(const ShapeContext& c) {
  const Shape& x = c.shape(0);
  const auto axis =
      static_cast<size_t>(normalize_axis(c.attr_int("axis", -1), static_cast<int64_t>(x.size())));
  int64_t rows = 1, n = 1;
  for (size_t d = 0; d < x.size(); ++d) (d < axis ? rows : n) *= x[d];
  const DataType dt = c.dtype(0);
  const bool half = dt != DataType::Float && dt != DataType::Double;
  const bool has_bias = c.node().op_type == "LayerNormalization" && c.has_input(2);
  const int64_t scale = param_copy(c.shape(1), !half, x, axis, n, "scale");
  const int64_t bias = has_bias ? param_copy(c.shape(2), !half, x, axis, n, "bias") : 0;
  return norm_parts(dt, rows, n, scale, bias, c.threads()).layout.bytes();
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
                  .workspace = norm_workspace,
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
                  .workspace = norm_workspace,
                  .create = make<Norm<true>>});

}  // namespace kiln::ops
