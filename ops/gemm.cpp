// Gemm: Y = alpha * op(A) * op(B) + beta * C, op() an optional transpose, C broadcast to
// [M, N] (and optional from opset 11).
//
// A and B are read through their strides (a transposed or sliced view maps directly when
// one axis has unit stride). When C already has Y's shape and is not needed afterwards, Y
// is written over it. Large products are split into row or column blocks across threads.
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/common.h"
#include "ops/elementwise.h"

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

bool mappable(const Operand& o) {
  return (o.cs == 1 && o.rs >= 0) || (o.rs == 1 && o.cs >= 0);
}

// y[m x n] (row-major, leading dimension ldy) = alpha * a * b (+ y when `accumulate`).
template <typename T>
void product(const T* a, int64_t m, int64_t k, const Operand& ao, const T* b, int64_t n,
             const Operand& bo, T* y, int64_t ldy, T alpha, bool accumulate) {
  using RM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
  using S = Eigen::OuterStride<>;
  Eigen::Map<RM, 0, S> ym(y, m, n, S(ldy));
  auto times_b = [&](const auto& am) {
    auto apply = [&](const auto& bm) {
      if (accumulate) {
        ym.noalias() += alpha * am * bm;
      } else if (alpha == T(1)) {
        ym.noalias() = am * bm;
      } else {
        ym.noalias() = alpha * am * bm;
      }
    };
    if (bo.cs == 1) {
      apply(Eigen::Map<const RM, 0, S>(b, k, n, S(bo.rs)));
    } else {
      apply(Eigen::Map<const CM, 0, S>(b, k, n, S(bo.cs)));
    }
  };
  if (ao.cs == 1) {
    times_b(Eigen::Map<const RM, 0, S>(a, m, k, S(ao.rs)));
  } else {
    times_b(Eigen::Map<const CM, 0, S>(a, m, k, S(ao.cs)));
  }
}

template <typename T>
void run_float(const T* a, const Operand& ao, const T* b, const Operand& bo, T* y, T alpha,
               bool accumulate) {
  const int64_t m = ao.rows, k = ao.cols, n = bo.cols;
  auto block = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    product<T>(a + m0 * ao.rs, m1 - m0, k, ao, b + n0 * bo.cs, n1 - n0, bo, y + m0 * n + n0, n,
               alpha, accumulate);
  };
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int threads = tbb::this_task_arena::max_concurrency();
  constexpr double kMinParallel = 1 << 17, kMinTask = 1 << 15;
  if (threads <= 1 || work < kMinParallel) {
    block(0, m, 0, n);
    return;
  }
  const int64_t splits =
      std::clamp<int64_t>(static_cast<int64_t>(work / kMinTask), 1, int64_t{2} * threads);
  const int64_t rb = m >= n ? std::clamp<int64_t>(m / 4, 1, splits) : 1;
  const int64_t cb = m >= n ? 1 : std::clamp<int64_t>(n / 16, 1, splits);
  parallel_for(rb * cb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t r = t / cb, c = t % cb;
      block(r * m / rb, (r + 1) * m / rb, c * n / cb, (c + 1) * n / cb);
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

class Gemm final : public Kernel {
 public:
  explicit Gemm(const NodeInfo& info)
      : trans_a_(info.attr_int("transA", 0) != 0),
        trans_b_(info.attr_int("transB", 0) != 0),
        alpha_(info.attr_float("alpha", 1.0f)),
        beta_(info.attr_float("beta", 1.0f)) {}

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
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        run_half<T>(ctx, shape, has_c);
      } else {
        Tensor& y = init_output<T>(ctx, shape, has_c);
        compute<T>(ctx, a, b, y, has_c);
      }
    });
  }

 private:
  // Y = beta * C (broadcast), in C's storage when it is free and already has Y's shape.
  template <typename T>
  Tensor& init_output(OpContext& ctx, const Shape& shape, bool has_c) {
    if (!has_c) return ctx.output(0, data_type_of<T>(), shape);
    const Tensor c = ctx.input(2);
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

  template <typename T>
  void compute(OpContext& ctx, const Tensor& a_in, const Tensor& b_in, Tensor& y, bool has_c) {
    Tensor a = a_in, b = b_in;
    Operand ao = operand(a, trans_a_), bo = operand(b, trans_b_);
    if (!mappable(ao)) {
      ctx.count_copy(a.nbytes(), CopyCause::Contiguous);
      a = a.contiguous();
      ao = operand(a, trans_a_);
    }
    if (!mappable(bo)) {
      ctx.count_copy(b.nbytes(), CopyCause::Contiguous);
      b = b.contiguous();
      bo = operand(b, trans_b_);
    }
    if (y.numel() == 0) return;
    T* py = y.data<T>();
    if (ao.cols == 0) {
      if (!has_c) std::fill(py, py + y.numel(), T(0));
      return;
    }
    const T alpha = static_cast<T>(alpha_);
    if constexpr (std::is_floating_point_v<T>) {
      run_float<T>(a.data<const T>(), ao, b.data<const T>(), bo, py, alpha, has_c);
    } else {
      run_integer<T>(a.data<const T>(), ao, b.data<const T>(), bo, py, alpha, has_c);
    }
  }

  // Half types: widen to float, compute, narrow.
  template <typename H>
  void run_half(OpContext& ctx, const Shape& shape, bool has_c) {
    auto widen = [&](const Tensor& t) {
      Tensor f = ctx.allocate(DataType::Float, t.shape());
      unary_loop<H, float>(t, f, [](H v) { return static_cast<float>(v); });
      return f;
    };
    const Tensor fa = widen(ctx.input(0)), fb = widen(ctx.input(1));
    Tensor fy = ctx.allocate(DataType::Float, shape);
    if (has_c) {
      const Tensor fc = widen(ctx.input(2));
      const float beta = beta_;
      unary_loop<float, float>(broadcast_view(fc, shape), fy, [beta](float v) { return beta * v; });
    }
    compute<float>(ctx, fa, fb, fy, has_c);
    Tensor& y = ctx.output(0, ctx.input(0).dtype(), shape);
    unary_loop<float, H>(fy, y, [](float v) { return H(v); });
  }

  bool trans_a_, trans_b_;
  float alpha_, beta_;
};

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
                  .create = make<Gemm>});

}  // namespace kiln::ops
