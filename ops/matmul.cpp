// MatMul: numpy-style matrix products, batched and broadcast over the leading dimensions.
//
// Operands are read through their strides. A matrix only needs unit stride along its rows
// or along its columns (a transposed K^T view, a KV cache with spare capacity along the
// sequence, a slice), so attention graphs run without contiguous copies; anything else is
// copied once inside the kernel. Products are Eigen maps; large ones are split into row or
// column blocks across the thread pool, each block one single-threaded Eigen product.
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/common.h"
#include "ops/elementwise.h"

namespace kiln::ops {
namespace {

// The matrices of one operand as the product sees them: rows x cols with element strides,
// and the element offset of the matrix used by each output batch.
struct Operand {
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 0;
  std::vector<int64_t> offsets;
};

struct Problem {
  int64_t m = 0, n = 0, k = 0, batches = 1;
  Shape out_shape;
  Operand a, b;
};

// Each matrix needs unit stride along one of its two axes for an Eigen map.
bool mappable(const Operand& o) {
  return (o.cs == 1 && o.rs >= 0) || (o.rs == 1 && o.cs >= 0);
}

// Strides of size-1 axes are arbitrary: choose them so that the matrix maps (a single
// strided row becomes a column-major 1 x k matrix).
void normalize(Operand& o) {
  if (o.cols <= 1) o.cs = 1;
  if (o.rows <= 1) o.rs = o.cs == 1 ? std::max<int64_t>(o.cols, 1) : 1;
}

int64_t checked_mul(int64_t x, int64_t y) {
  int64_t r = 0;
  if (__builtin_mul_overflow(x, y, &r) || r > (int64_t{1} << 60)) {
    throw Error(ErrorKind::Runtime, "MatMul output is too large");
  }
  return r;
}

// The offset of operand `t`'s matrix for every index of the broadcast batch shape.
std::vector<int64_t> batch_offsets(const Tensor& t, size_t matrix_dims, const Shape& batch) {
  const size_t tb = t.rank() - matrix_dims;  // t's own batch dims, right-aligned to `batch`
  const size_t off = batch.size() - tb;
  int64_t count = 1;
  for (int64_t d : batch) count = checked_mul(count, d);
  std::vector<int64_t> out(static_cast<size_t>(count), 0);
  Shape coord(batch.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t o = 0;
    for (size_t d = off; d < batch.size(); ++d) {
      if (t.dim(d - off) != 1) o += coord[d] * t.strides()[d - off];
    }
    out[static_cast<size_t>(i)] = o;
    for (size_t d = batch.size(); d-- > 0;) {
      if (++coord[d] < batch[d]) break;
      coord[d] = 0;
    }
  }
  return out;
}

Problem describe(const Tensor& a, const Tensor& b) {
  if (a.rank() == 0 || b.rank() == 0) {
    throw Error(ErrorKind::Runtime,
                "MatMul inputs must have rank >= 1, got " + a.describe() + " and " + b.describe());
  }
  Problem p;
  const size_t ra = a.rank(), rb = b.rank();
  // A 1-D left operand is a row vector, a 1-D right operand a column vector.
  p.a.rows = ra == 1 ? 1 : a.dim(ra - 2);
  p.a.cols = a.dim(ra - 1);
  p.a.cs = a.strides()[ra - 1];
  p.a.rs = ra == 1 ? p.a.cols : a.strides()[ra - 2];
  p.b.rows = rb == 1 ? b.dim(0) : b.dim(rb - 2);
  p.b.cols = rb == 1 ? 1 : b.dim(rb - 1);
  p.b.rs = rb == 1 ? b.strides()[0] : b.strides()[rb - 2];
  p.b.cs = rb == 1 ? 1 : b.strides()[rb - 1];
  if (p.a.cols != p.b.rows) {
    throw Error(ErrorKind::Runtime,
                "MatMul inner dimensions differ: " + a.describe() + " x " + b.describe());
  }
  normalize(p.a);
  normalize(p.b);
  p.m = p.a.rows;
  p.k = p.a.cols;
  p.n = p.b.cols;
  const size_t ma = ra == 1 ? 1 : 2, mb = rb == 1 ? 1 : 2;
  const Shape batch =
      broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - static_cast<long>(ma)),
                       Shape(b.shape().begin(), b.shape().end() - static_cast<long>(mb)));
  p.a.offsets = batch_offsets(a, ma, batch);
  p.b.offsets = batch_offsets(b, mb, batch);
  p.batches = static_cast<int64_t>(p.a.offsets.size());
  p.out_shape = batch;
  if (ra != 1) p.out_shape.push_back(p.m);
  if (rb != 1) p.out_shape.push_back(p.n);
  checked_mul(checked_mul(p.batches, p.m), p.n);
  return p;
}

// y[m x n] (row-major, leading dimension ldy) = a[m x k] * b[k x n], each operand either
// row-major (cs == 1) or column-major (rs == 1) with its own leading dimension.
template <typename T>
void product(const T* a, int64_t m, int64_t k, int64_t ars, int64_t acs, const T* b, int64_t n,
             int64_t brs, int64_t bcs, T* y, int64_t ldy) {
  using RM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
  using S = Eigen::OuterStride<>;
  Eigen::Map<RM, 0, S> ym(y, m, n, S(ldy));
  auto times_b = [&](const auto& am) {
    if (bcs == 1) {
      ym.noalias() = am * Eigen::Map<const RM, 0, S>(b, k, n, S(brs));
    } else {
      ym.noalias() = am * Eigen::Map<const CM, 0, S>(b, k, n, S(bcs));
    }
  };
  if (acs == 1) {
    times_b(Eigen::Map<const RM, 0, S>(a, m, k, S(ars)));
  } else {
    times_b(Eigen::Map<const CM, 0, S>(a, m, k, S(acs)));
  }
}

// A batch of row vectors (or a batch of matrices stacked along their rows) times one shared
// right operand is a single taller product.
void fold_batches(Problem& p) {
  if (p.batches <= 1 || p.a.cs != 1) return;
  const auto& bo = p.b.offsets;
  if (std::any_of(bo.begin(), bo.end(), [&](int64_t o) { return o != bo[0]; })) return;
  const auto& ao = p.a.offsets;
  const int64_t step = ao.size() > 1 ? ao[1] - ao[0] : 0;
  if (p.m > 1 && step != p.m * p.a.rs) return;
  if (step < 0) return;
  for (size_t i = 1; i < ao.size(); ++i) {
    if (ao[i] - ao[i - 1] != step) return;
  }
  if (p.m == 1) p.a.rs = step;
  p.m *= p.batches;
  p.a.rows = p.m;
  p.batches = 1;
  p.a.offsets.resize(1);
  p.b.offsets.resize(1);
}

template <typename T>
void run_float(const Problem& p, const T* a, const T* b, T* y) {
  const int64_t m = p.m, n = p.n, k = p.k;
  auto block = [&](int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const size_t i = static_cast<size_t>(bi);
    product<T>(a + p.a.offsets[i] + m0 * p.a.rs, m1 - m0, k, p.a.rs, p.a.cs,
               b + p.b.offsets[i] + n0 * p.b.cs, n1 - n0, p.b.rs, p.b.cs,
               y + bi * m * n + m0 * n + n0, n);
  };
  const double work = static_cast<double>(p.batches) * static_cast<double>(m * n) * k;
  const int threads = tbb::this_task_arena::max_concurrency();
  constexpr double kMinParallel = 1 << 17, kMinTask = 1 << 15;
  if (threads <= 1 || work < kMinParallel) {
    for (int64_t bi = 0; bi < p.batches; ++bi) block(bi, 0, m, 0, n);
    return;
  }
  // Split each matrix when there are fewer batches than tasks wanted: rows when the output
  // is tall, columns when it is wide (a row vector times a matrix).
  const int64_t want = int64_t{2} * threads;
  int64_t splits = (want + p.batches - 1) / p.batches;
  splits = std::min<int64_t>(
      splits, std::max<int64_t>(1, static_cast<int64_t>(work / p.batches / kMinTask)));
  int64_t rb = 1, cb = 1;
  if (m >= n) {
    rb = std::clamp<int64_t>(m / 4, 1, splits);
  } else {
    cb = std::clamp<int64_t>(n / 16, 1, splits);
  }
  const int64_t per = rb * cb;
  const double task_work = work / static_cast<double>(p.batches * per);
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kMinTask / task_work));
  parallel_for(p.batches * per, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t bi = t / per, r = (t % per) / cb, c = t % cb;
      block(bi, r * m / rb, (r + 1) * m / rb, c * n / cb, (c + 1) * n / cb);
    }
  });
}

// Integer products wrap around like two's complement hardware, without signed overflow.
template <typename T>
void run_integer(const Problem& p, const T* a, const T* b, T* y) {
  using U = std::make_unsigned_t<T>;
  const int64_t m = p.m, n = p.n, k = p.k;
  parallel_for(p.batches * m, grain_for(n * k + 1), [&](int64_t lo, int64_t hi) {
    std::vector<U> acc(static_cast<size_t>(n));
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t bi = r / m, i = r % m;
      const T* pa = a + p.a.offsets[static_cast<size_t>(bi)] + i * p.a.rs;
      const T* pb = b + p.b.offsets[static_cast<size_t>(bi)];
      std::fill(acc.begin(), acc.end(), U(0));
      for (int64_t kk = 0; kk < k; ++kk) {
        const U av = static_cast<U>(pa[kk * p.a.cs]);
        const T* row = pb + kk * p.b.rs;
        for (int64_t j = 0; j < n; ++j) {
          acc[static_cast<size_t>(j)] += static_cast<U>(av * static_cast<U>(row[j * p.b.cs]));
        }
      }
      T* out = y + r * n;
      for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(acc[static_cast<size_t>(j)]);
    }
  });
}

using MatMulTypes =
    TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t, uint64_t>;

// A half-type weight widened to float once, the form run_half multiplies with.
Tensor widen_to_float(const Tensor& w) {
  Tensor f(DataType::Float, w.shape(),
           Storage::heap_uninitialized(storage_bytes(DataType::Float, w.numel())));
  dispatch(TypeList<float16, bfloat16>{}, w.dtype(), [&]<typename H>() {
    unary_loop<H, float>(w, f, [](H v) { return static_cast<float>(v); });
  });
  f.storage()->set_read_only();
  return f;
}

class MatMul final : public Kernel {
 public:
  explicit MatMul(const NodeInfo& info) {
    const Tensor* b = info.constant_input(1);
    if (b && (b->dtype() == DataType::Float16 || b->dtype() == DataType::BFloat16)) {
      b_float_ = info.prepared_input(1, "float32", widen_to_float);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != b.dtype()) {
      ctx.fail("inputs have different element types (" + a.describe() + " and " + b.describe() +
               ")");
    }
    dispatch(MatMulTypes{}, a.dtype(), [&]<typename T>() {
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        run_half<T>(ctx, a, b);
      } else {
        compute<T>(ctx, a, b, nullptr);
      }
    });
  }

 private:
  // Computes into output 0, or into `dst` when given (the float result of a half product).
  template <typename T>
  void compute(OpContext& ctx, const Tensor& a_in, const Tensor& b_in, Tensor* dst) {
    Problem p = describe(a_in, b_in);
    Tensor a = a_in, b = b_in;
    if (!mappable(p.a) || !mappable(p.b)) {
      // Neither axis of a matrix has unit stride: one contiguous copy, then plain maps.
      if (!mappable(p.a)) {
        ctx.count_copy(a.nbytes(), CopyCause::Contiguous);
        a = a.contiguous();
      }
      if (!mappable(p.b)) {
        ctx.count_copy(b.nbytes(), CopyCause::Contiguous);
        b = b.contiguous();
      }
      p = describe(a, b);
    }
    Tensor& y = dst ? *dst : ctx.output(0, a.dtype(), p.out_shape);
    if (y.numel() == 0) return;
    T* py = y.data<T>();
    if (p.k == 0) {
      std::fill(py, py + y.numel(), T(0));
      return;
    }
    if constexpr (std::is_floating_point_v<T>) {
      fold_batches(p);
      run_float<T>(p, a.data<const T>(), b.data<const T>(), py);
    } else {
      run_integer<T>(p, a.data<const T>(), b.data<const T>(), py);
    }
  }

  // Half types: widen both operands to float, multiply, narrow the result.
  template <typename H>
  void run_half(OpContext& ctx, const Tensor& a, const Tensor& b) {
    Tensor fa = ctx.allocate(DataType::Float, a.shape());
    unary_loop<H, float>(a, fa, [](H v) { return static_cast<float>(v); });
    Tensor fb;
    if (b_float_) {
      fb = *b_float_;  // the constant weight, widened when the session was planned
    } else {
      fb = ctx.allocate(DataType::Float, b.shape());
      unary_loop<H, float>(b, fb, [](H v) { return static_cast<float>(v); });
    }
    const Problem p = describe(fa, fb);
    Tensor fy = ctx.allocate(DataType::Float, p.out_shape);
    compute<float>(ctx, fa, fb, &fy);
    Tensor& y = ctx.output(0, a.dtype(), p.out_shape);
    unary_loop<float, H>(fy, y, [](float v) { return H(v); });
  }

  std::shared_ptr<const Tensor> b_float_;
};

}  // namespace

KILN_REGISTER_OP({.op = "MatMul",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16, int32, int64, uint32, uint64",
                  .create = make<MatMul>});

}  // namespace kiln::ops
