// Gemm: Y = alpha * op(A) * op(B) + beta * C, op() an optional transpose, C broadcast to
// [M, N] (and optional from opset 11).
//
// Float products go through the GEMM layer (ops/math/gemm.h): A and B are read through
// their strides, a constant B (transposed or not) is packed once when the session is
// planned, and C is applied by the epilogue when it is a row of biases ([N] or [1, N]) or a
// column ([M, 1]); a full [M, N] C is scaled into Y (in C's storage when it is free) and the
// product accumulated onto it.
#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/workspace.h"
#include "ops/linalg/packed_weights.h"
#include "ops/math/gemm.h"

namespace kiln::ops {
namespace {

// One operand of the product as a rows x cols matrix with element strides.
struct Operand {
  int64_t rows = 0, cols = 0, rs = 0, cs = 0;
};

Operand operand(const Tensor& t, bool transpose) {
  Operand o{t.dim(0), t.dim(1), t.strides()[0], t.strides()[1]};
  if (transpose) o = {o.cols, o.rows, o.cs, o.rs};
  // Strides of size-1 axes are arbitrary: choose them so that the matrix maps.
  if (o.cols <= 1) o.cs = 1;
  if (o.rows <= 1) o.rs = o.cs == 1 ? std::max<int64_t>(o.cols, 1) : 1;
  return o;
}

// `t` seen with the (broadcast) shape `shape`: zero strides where it is broadcast.
Tensor broadcast_view(const Tensor& t, const Shape& shape) {
  return t.view(shape, broadcast_strides(t, shape), t.byte_offset());
}

// Double products: plain loops over rows (not a hot type in models); y holds beta * C when
// accumulating.
template <typename T>
void run_loops(const T* a, const Operand& ao, const T* b, const Operand& bo, T* y, T alpha,
               bool accumulate) {
  const int64_t m = ao.rows, k = ao.cols, n = bo.cols;
  parallel_for(m, grain_for(n * k + 1), [&](int64_t lo, int64_t hi) {
    std::vector<T> acc(static_cast<size_t>(n));
    for (int64_t i = lo; i < hi; ++i) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t kk = 0; kk < k; ++kk) {
        const T av = a[i * ao.rs + kk * ao.cs];
        const T* row = b + kk * bo.rs;
        for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] += av * row[j * bo.cs];
      }
      T* out = y + i * n;
      for (int64_t j = 0; j < n; ++j) {
        const T v = alpha * acc[static_cast<size_t>(j)];
        out[j] = accumulate ? out[j] + v : v;
      }
    }
  });
}

// Integer products wrap around like two's complement hardware, without signed overflow.
template <typename T>
void run_integer(const T* a, const Operand& ao, const T* b, const Operand& bo, T* y, T alpha,
                 bool accumulate) {
  using U = std::make_unsigned_t<T>;
  const int64_t m = ao.rows, k = ao.cols, n = bo.cols;
  parallel_for(m, grain_for(n * k + 1), [&](int64_t lo, int64_t hi) {
    std::vector<U> acc(static_cast<size_t>(n));
    for (int64_t i = lo; i < hi; ++i) {
      std::fill(acc.begin(), acc.end(), U(0));
      for (int64_t kk = 0; kk < k; ++kk) {
        const U av = static_cast<U>(a[i * ao.rs + kk * ao.cs]);
        const T* row = b + kk * bo.rs;
        for (int64_t j = 0; j < n; ++j) {
          acc[static_cast<size_t>(j)] += static_cast<U>(av * static_cast<U>(row[j * bo.cs]));
        }
      }
      T* out = y + i * n;
      for (int64_t j = 0; j < n; ++j) {
        const U v = static_cast<U>(static_cast<U>(alpha) * acc[static_cast<size_t>(j)]);
        out[j] = static_cast<T>(accumulate ? static_cast<U>(static_cast<U>(out[j]) + v) : v);
      }
    }
  });
}

using GemmTypes = TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t, uint64_t>;

// float16 / bfloat16 (contiguous) to float.
void widen(DataType dt, const void* src, float* dst, int64_t n) {
  const math::ConvertKernels& cv = math::kernels().convert;
  (dt == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(static_cast<const uint16_t*>(src), dst,
                                                             n);
}

Tensor widen_into_part(const Tensor& t, Tensor dst) {
  if (t.is_contiguous()) {
    widen(t.dtype(), t.raw_data(), dst.data<float>(), t.numel());
  } else if (t.dtype() == DataType::Float16) {
    unary_loop<float16, float>(t, dst, [](float16 v) { return static_cast<float>(v); });
  } else {
    unary_loop<bfloat16, float>(t, dst, [](bfloat16 v) { return static_cast<float>(v); });
  }
  return dst;
}

// How C enters the product.
enum class CForm { ColumnBias, RowBias, Full };

CForm c_form(const Shape& c, int64_t m, int64_t n) {
  const int64_t rows = c.size() == 2 ? c[0] : 1;
  const int64_t cols = c.size() >= 1 ? c.back() : 1;
  if (rows == m && cols == n && m > 1) return CForm::Full;
  if (rows == 1) return CForm::ColumnBias;  // [N], [1, N], or one value for every column
  if (cols == 1) return CForm::RowBias;     // [M, 1]
  return CForm::Full;
}

// The workspace, as the kernel and gemm_workspace lay it out: for half types A, B (unless
// packed at load), C and Y in float; for float and half types the row or column of beta * C
// the GEMM's epilogue adds (when C is present and not of Y's shape).
struct GemmParts {
  WorkspaceLayout layout;
  int a = -1, b = -1, c = -1, y = -1, bias = -1;
};

GemmParts gemm_parts(DataType dt, const Shape& a, const Shape& b, const Shape* c, int64_t m,
                     int64_t n, bool b_at_load) {
  GemmParts p;
  const bool half = dt == DataType::Float16 || dt == DataType::BFloat16;
  if (!half && dt != DataType::Float) return p;
  if (half) {
    p.a = p.layout.add(DataType::Float, shape_numel(a));
    if (!b_at_load) p.b = p.layout.add(DataType::Float, shape_numel(b));
    if (c) p.c = p.layout.add(DataType::Float, shape_numel(*c));
    p.y = p.layout.add(DataType::Float, m * n);
  }
  if (c) {
    const CForm form = c_form(*c, m, n);
    if (form != CForm::Full) p.bias = p.layout.add(DataType::Float, form == CForm::RowBias ? m : n);
  }
  return p;
}

class Gemm final : public Kernel {
 public:
  explicit Gemm(const NodeInfo& info)
      : trans_a_(info.attr_int("transA", 0) != 0),
        trans_b_(info.attr_int("transB", 0) != 0),
        alpha_(info.attr_float("alpha", 1.0f)),
        beta_(info.attr_float("beta", 1.0f)),
        packed_(pack_constant_b(info, 1, trans_b_)),
        b_at_load_(packed_from_initializer(info, 1, packed_)) {}

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const bool has_c = ctx.has_input(2) && beta_ != 0.0f;
    if (a.rank() != 2 || b.rank() != 2) {
      ctx.fail("A and B must be 2-D, got " + a.describe() + " and " + b.describe());
    }
    if (a.dtype() != b.dtype() || (has_c && ctx.input(2).dtype() != a.dtype())) {
      ctx.fail("inputs have different element types");
    }
    const Operand ao = operand(a, trans_a_), bo = operand(b, trans_b_);
    if (ao.cols != bo.rows) {
      ctx.fail("inner dimensions differ: " + a.describe() + (trans_a_ ? "^T" : "") + " x " +
               b.describe() + (trans_b_ ? "^T" : ""));
    }
    const Shape shape{ao.rows, bo.cols};
    if (bo.cols > 0 && ao.rows > (int64_t{1} << 48) / bo.cols) ctx.fail("output is too large");
    if (has_c) {
      const Tensor& c = ctx.input(2);
      if (c.rank() > 2 || broadcast_shapes(c.shape(), shape) != shape) {
        ctx.fail("C " + c.describe() + " does not broadcast to " + shape_to_string(shape));
      }
    }
    dispatch(GemmTypes{}, a.dtype(), [&]<typename T>() {
      if constexpr (std::is_same_v<T, float>) {
        run_float(ctx, shape, has_c);
      } else if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        run_half(ctx, shape, has_c);
      } else {
        Tensor& y = init_output<T>(ctx, shape, has_c);
        if (y.numel() == 0) return;
        if (ao.cols == 0) {
          if (!has_c) std::fill(y.data<T>(), y.data<T>() + y.numel(), T(0));
          return;
        }
        if constexpr (std::is_floating_point_v<T>) {
          run_loops<T>(a.data<const T>(), ao, b.data<const T>(), bo, y.data<T>(),
                       static_cast<T>(alpha_), has_c);
        } else {
          run_integer<T>(a.data<const T>(), ao, b.data<const T>(), bo, y.data<T>(),
                         static_cast<T>(alpha_), has_c);
        }
      }
    });
  }

 private:
  // Y = beta * C (broadcast), in C's storage when it is free and already has Y's shape.
  template <typename T>
  Tensor& init_output(OpContext& ctx, const Shape& shape, bool has_c) {
    if (!has_c) return ctx.output(0, data_type_of<T>(), shape);
    // A reference, not a copy: a second handle on C's storage would forbid writing over it.
    const Tensor& c = ctx.input(2);
    Tensor& y = ctx.output_reusing(0, 2, data_type_of<T>(), shape);
    const T beta = static_cast<T>(beta_);
    if (y.raw_data() == c.raw_data()) {
      if (beta != T(1)) {
        T* p = y.data<T>();
        for (int64_t i = 0; i < y.numel(); ++i) p[i] = static_cast<T>(beta * p[i]);
      }
    } else {
      unary_loop<T, T>(broadcast_view(c, shape), y,
                       [beta](T v) { return static_cast<T>(beta * v); });
    }
    return y;
  }

  // y[m x n] = alpha * op(a) * op(b) + C's part, all float: `c` is C as float (or null); y
  // already holds beta * C when `full_c`, else a row or column of beta * C, made in `bias`
  // (the workspace's part), is added by the epilogue.
  void product(const Tensor& a, const Tensor& b, const Tensor* c, float* y, int64_t m, int64_t n,
               bool full_c, float* bias) const {
    const Operand ao = operand(a, trans_a_);
    const math::MatrixView av{a.data<const float>(), ao.rows, ao.cols, ao.rs, ao.cs};
    math::GemmOptions o;
    o.alpha = alpha_;
    o.accumulate = full_c;
    if (c && !full_c) {
      const CForm form = c_form(c->shape(), m, n);
      const bool rows = form == CForm::RowBias;
      const int64_t len = rows ? m : n;
      const Tensor cb = broadcast_view(*c, rows ? Shape{m, 1} : Shape{1, n});
      const float* base = cb.data<const float>();
      const int64_t step = rows ? cb.strides()[0] : cb.strides()[1];
      for (int64_t i = 0; i < len; ++i) bias[i] = beta_ * base[i * step];
      (rows ? o.row_bias : o.bias) = bias;
    }
    if (packed_ && ao.cols > 0) {
      packed_product(av, packed_, y, n, o);
    } else {
      const Operand bo = operand(b, trans_b_);
      math::sgemm(av, math::MatrixView{b.data<const float>(), bo.rows, bo.cols, bo.rs, bo.cs}, y, n,
                  o);
    }
  }

  // The workspace's layout (gemm_parts) for this run.
  GemmParts parts(OpContext& ctx, const Shape& shape, bool has_c) const {
    const Shape* c = has_c ? &ctx.input(2).shape() : nullptr;
    return gemm_parts(ctx.input(0).dtype(), ctx.input(0).shape(), ctx.input(1).shape(), c, shape[0],
                      shape[1], b_at_load_);
  }

  void run_float(OpContext& ctx, const Shape& shape, bool has_c) {
    const int64_t m = shape[0], n = shape[1];
    const bool full_c = has_c && c_form(ctx.input(2).shape(), m, n) == CForm::Full;
    Tensor& y =
        full_c ? init_output<float>(ctx, shape, true) : ctx.output(0, DataType::Float, shape);
    const GemmParts p = parts(ctx, shape, has_c);
    const Workspace space(ctx, p.layout);
    if (y.numel() == 0) return;
    const Tensor c = has_c ? ctx.input(2) : Tensor();
    product(ctx.input(0), ctx.input(1), has_c ? &c : nullptr, y.data<float>(), m, n, full_c,
            space.data<float>(p.bias));
  }

  // Half types: widen to float, compute, narrow, in the workspace.
  void run_half(OpContext& ctx, const Shape& shape, bool has_c) {
    const int64_t m = shape[0], n = shape[1];
    // Y may take C's storage (as the placement planned): C is widened before Y is written.
    const DataType dt = ctx.input(0).dtype();
    Tensor& y = has_c ? ctx.output_reusing(0, 2, dt, shape) : ctx.output(0, dt, shape);
    const GemmParts p = parts(ctx, shape, has_c);
    const Workspace space(ctx, p.layout);
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor fa = widen_into_part(a, space.tensor(p.a, a.shape()));
    // A B packed though not at load (a constant not an initializer) leaves its part unused.
    const Tensor fb = packed_ ? b : widen_into_part(b, space.tensor(p.b, b.shape()));
    Tensor fy = space.tensor(p.y, shape);
    Tensor fc;
    bool full_c = false;
    if (has_c) {
      fc = widen_into_part(ctx.input(2), space.tensor(p.c, ctx.input(2).shape()));
      full_c = c_form(fc.shape(), m, n) == CForm::Full;
      if (full_c) {
        const float beta = beta_;
        unary_loop<float, float>(broadcast_view(fc, shape), fy,
                                 [beta](float v) { return beta * v; });
      }
    }
    if (fy.numel() > 0) {
      product(fa, fb, has_c ? &fc : nullptr, fy.data<float>(), m, n, full_c,
              space.data<float>(p.bias));
    }
    const math::ConvertKernels& cv = math::kernels().convert;
    (y.dtype() == DataType::Float16 ? cv.f32_to_f16 : cv.f32_to_bf16)(
        fy.data<const float>(), reinterpret_cast<uint16_t*>(y.raw_data()), y.numel());
  }

  bool trans_a_, trans_b_;
  float alpha_, beta_;
  PackedWeight packed_;  // a constant op(B), packed once
  bool b_at_load_;       // B is an initializer packed at load: the workspace holds no float B
};

void gemm_shape(ShapeContext& c) {
  const ValueFacts& a = c.facts(0);
  const ValueFacts& b = c.facts(1);
  if ((a.ranked && a.shape.size() != 2) || (b.ranked && b.shape.size() != 2))
    unknown("Gemm takes matrices");
  ValueFacts out = typed_facts(a.dtype);
  if (a.ranked) {
    append_dim(out, a, c.attr_int("transA", 0) ? 1 : 0);
  } else {
    append_dim(out, kUnknownDim);
  }
  if (b.ranked) {
    append_dim(out, b, c.attr_int("transB", 0) ? 0 : 1);
  } else {
    append_dim(out, kUnknownDim);
  }
  c.set(0, std::move(out));
}

// The kernel's workspace (gemm_parts) for these shapes.
uint64_t gemm_workspace(const ShapeContext& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  if (a.size() != 2 || b.size() != 2) unknown("Gemm takes matrices");
  const int64_t m = c.attr_int("transA", 0) ? a[1] : a[0];
  const int64_t n = c.attr_int("transB", 0) ? b[0] : b[1];
  const Shape* cs = c.has_input(2) ? &c.shape(2) : nullptr;
  return gemm_parts(c.dtype(0), a, b, cs, m, n, packs_constant_b(c.constant_input(1)))
      .layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "Gemm",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(2),
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16, int32, int64, uint32, uint64",
                  .shape = gemm_shape,
                  .workspace = gemm_workspace,
                  .create = make<Gemm>});

}  // namespace kiln::ops
