// MatMul: numpy-style matrix products, batched and broadcast over the leading dimensions.
//
// Every float product goes through the GEMM layer (ops/math/gemm.h), which reads operands
// through their strides (a transposed K^T view, a KV cache with spare capacity along the
// sequence, a slice), so attention graphs run without contiguous copies. A constant B (a
// weight, in this graph or captured from an enclosing one) is packed once when the session
// is planned and shared through the Environment's weights cache; half-precision weights are
// widened as they are packed. Batches run in parallel when there are enough of them,
// otherwise each product is split across threads by the GEMM layer.
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/workspace.h"
#include "ops/elementwise/activation.h"
#include "ops/linalg/packed_weights.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

// The matrices of one operand as the product sees them: rows x cols with element strides,
// and the element offset of the matrix used by each output batch.
struct Operand {
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 0;
  // A Shape only as a small int64 vector: a single batch or a few heads need no heap.
  Shape offsets;
};

struct Problem {
  int64_t m = 0, n = 0, k = 0, batches = 1;
  Shape out_shape;
  Operand a, b;
};

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
Shape batch_offsets(const Tensor& t, size_t matrix_dims, const Shape& batch) {
  const size_t tb = t.rank() - matrix_dims;  // t's own batch dims, right-aligned to `batch`
  const size_t off = batch.size() - tb;
  int64_t count = 1;
  for (int64_t d : batch) count = checked_mul(count, d);
  Shape out(static_cast<size_t>(count), 0);
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

math::MatrixView view(const Operand& o, const float* base, size_t batch, int64_t rows) {
  return {base + o.offsets[batch], rows, o.cols, o.rs, o.cs};
}

// y (contiguous [batches, m, n]) = a * b, with b packed when `packed` is given.
void run_float(const Problem& p, const float* a, const float* b, const PackedWeight* packed,
               float* y, const math::GemmOptions& epilogue = {}) {
  const int64_t m = p.m, n = p.n;
  const double work = static_cast<double>(p.batches) * static_cast<double>(m) *
                      static_cast<double>(n) * static_cast<double>(p.k);
  const int tasks = math::task_count(work);
  // Enough batches for every task: one single-threaded product per batch; otherwise one
  // product after another, each split across the threads.
  const bool by_batch = tasks > 1 && p.batches >= 2 * tasks;
  math::GemmOptions o = epilogue;
  if (by_batch) o.max_threads = 1;
  auto product = [&](int64_t bi) {
    const size_t i = static_cast<size_t>(bi);
    const math::MatrixView av = view(p.a, a, i, m);
    float* yb = y + bi * m * n;
    if (packed) {
      packed_product(av, *packed, yb, n, o);
    } else {
      math::sgemm(av, math::MatrixView{b + p.b.offsets[i], p.k, n, p.b.rs, p.b.cs}, yb, n, o);
    }
  };
  if (by_batch) {
    parallel_for(p.batches, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t bi = lo; bi < hi; ++bi) product(bi);
    });
  } else {
    for (int64_t bi = 0; bi < p.batches; ++bi) product(bi);
  }
}

// Double products: a plain loop, rows split across threads (not a hot type in models).
void run_double(const Problem& p, const double* a, const double* b, double* y) {
  const int64_t m = p.m, n = p.n, k = p.k;
  parallel_for(p.batches * m, grain_for(n * k + 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t bi = r / m, i = r % m;
      const double* pa = a + p.a.offsets[static_cast<size_t>(bi)] + i * p.a.rs;
      const double* pb = b + p.b.offsets[static_cast<size_t>(bi)];
      double* out = y + r * n;
      std::fill(out, out + n, 0.0);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double av = pa[kk * p.a.cs];
        const double* row = pb + kk * p.b.rs;
        for (int64_t j = 0; j < n; ++j) out[j] += av * row[j * p.b.cs];
      }
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

// float16 / bfloat16 elements to float (contiguous `src`, `n` elements).
void widen(DataType dt, const void* src, float* dst, int64_t n) {
  const math::ConvertKernels& cv = math::kernels().convert;
  parallel_for(n, 1 << 16, [&](int64_t lo, int64_t hi) {
    const auto* s = static_cast<const uint16_t*>(src) + lo;
    (dt == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(s, dst + lo, hi - lo);
  });
}

// Half-type `t` widened into `dst` (a contiguous float tensor of t's shape, the workspace).
template <typename T>
Tensor widen_into_part(const Tensor& t, Tensor dst) {
  if (t.is_contiguous()) {
    widen(t.dtype(), t.raw_data(), dst.data<float>(), t.numel());
  } else {
    unary_loop<T, float>(t, dst, [](T v) { return static_cast<float>(v); });
  }
  return dst;
}

// The workspace of a half-type MatMul, as the kernel and matmul_workspace lay it out: A, B
// (unless packed at load) and Y in float. Other types take none.
struct HalfParts {
  WorkspaceLayout layout;
  int a = -1, b = -1, y = -1;
};

HalfParts half_parts(DataType dt, const Shape& a, const Shape& b, const Shape& y, bool b_at_load) {
  HalfParts p;
  if (dt != DataType::Float16 && dt != DataType::BFloat16) return p;
  p.a = p.layout.add(DataType::Float, shape_numel(a));
  if (!b_at_load) p.b = p.layout.add(DataType::Float, shape_numel(b));
  p.y = p.layout.add(DataType::Float, shape_numel(y));
  return p;
}

class MatMul final : public Kernel {
 public:
  explicit MatMul(const NodeInfo& info)
      : packed_(pack_constant_b(info, 1, false)),
        b_at_load_(packed_from_initializer(info, 1, packed_)) {}

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
  void compute(OpContext& ctx, const Tensor& a, const Tensor& b, Tensor* dst) {
    Problem p = describe(a, b);
    Tensor& y = dst ? *dst : ctx.output(0, a.dtype(), p.out_shape);
    if (y.numel() == 0) return;
    T* py = y.data<T>();
    if (p.k == 0) {
      std::fill(py, py + y.numel(), T(0));
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      fold_batches(p);
      const bool use_packed = packed_ && b.rank() == 2;
      run_float(p, a.data<const float>(), use_packed ? nullptr : b.data<const float>(),
                use_packed ? &packed_ : nullptr, py);
    } else if constexpr (std::is_same_v<T, double>) {
      run_double(p, a.data<const double>(), b.data<const double>(), py);
    } else {
      run_integer<T>(p, a.data<const T>(), b.data<const T>(), py);
    }
  }

  // Half types: float products (B from the packed weight when there is one) in the
  // workspace (half_parts), the result narrowed back.
  template <typename T>
  void run_half(OpContext& ctx, const Tensor& a, const Tensor& b) {
    Problem p = describe(a, b);
    Tensor& y = ctx.output(0, a.dtype(), p.out_shape);
    const HalfParts parts = half_parts(a.dtype(), a.shape(), b.shape(), p.out_shape, b_at_load_);
    const Workspace space(ctx, parts.layout);
    Tensor fy = space.tensor(parts.y, p.out_shape);
    if (fy.numel() > 0) {
      if (p.k == 0) {
        std::fill(fy.data<float>(), fy.data<float>() + fy.numel(), 0.0f);
      } else {
        const bool use_packed = packed_ && b.rank() == 2;
        const Tensor fa = widen_into_part<T>(a, space.tensor(parts.a, a.shape()));
        // A B packed though not at load (a constant not an initializer) leaves its part unused.
        const Tensor fb = use_packed ? b : widen_into_part<T>(b, space.tensor(parts.b, b.shape()));
        p = describe(fa, fb);
        fold_batches(p);
        run_float(p, fa.data<const float>(), use_packed ? nullptr : fb.data<const float>(),
                  use_packed ? &packed_ : nullptr, fy.data<float>());
      }
    }
    const math::ConvertKernels& cv = math::kernels().convert;
    const float* src = fy.data<const float>();
    auto* dst = reinterpret_cast<uint16_t*>(y.raw_data());
    parallel_for(y.numel(), 1 << 16, [&](int64_t lo, int64_t hi) {
      (a.dtype() == DataType::Float16 ? cv.f32_to_f16 : cv.f32_to_bf16)(src + lo, dst + lo,
                                                                        hi - lo);
    });
  }

  PackedWeight packed_;  // a constant B, packed once
  bool b_at_load_;       // B is an initializer packed at load: the workspace holds no float B
};

// `t` with its last two axes swapped: a strided view, no bytes move (a 1-D tensor is left
// as it is, as onnxruntime's FusedMatMul does).
Tensor swap_last_axes(const Tensor& t) {
  if (t.rank() < 2) return t;
  Shape shape = t.shape(), strides = t.strides();
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  return t.view(std::move(shape), std::move(strides), t.byte_offset());
}

// com.microsoft.FusedMatMul and kiln.FusedMatMul (both made by the graph optimizer,
// engine/passes/fusion/matmul.cpp; the first also by onnxruntime's): float MatMul of op(A) and
// op(B), op a transpose of the last two axes when transA / transB is set (read through a
// strided view; a constant B is packed transposed once), scaled by alpha. The kiln op adds
// a bias and an activation, which the GEMM's epilogue applies to each tile while it is in
// cache: y = activation(alpha * op(A) op(B) + bias), bias a vector along the last axis.
class FusedMatMul final : public Kernel {
 public:
  explicit FusedMatMul(const NodeInfo& info)
      : trans_a_(info.attr_int("transA", 0) != 0),
        trans_b_(info.attr_int("transB", 0) != 0),
        packed_(pack_constant_b(info, 1, trans_b_)),
        alpha_(info.attr_float("alpha", 1.0f)),
        activation_(parse_activation(info)) {
    if (info.attr_int("transBatchA", 0) != 0 || info.attr_int("transBatchB", 0) != 0) {
      info.fail("transBatchA and transBatchB are not supported", ErrorKind::Unsupported);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor a = trans_a_ ? swap_last_axes(ctx.input(0)) : ctx.input(0);
    const Tensor b = trans_b_ ? swap_last_axes(ctx.input(1)) : ctx.input(1);
    if (a.dtype() != DataType::Float || b.dtype() != DataType::Float) {
      ctx.fail("takes float inputs, got " + a.describe() + " and " + b.describe());
    }
    Problem p = describe(a, b);
    math::GemmOptions o;
    o.alpha = alpha_;
    o.activation = activation_;
    Tensor bias;
    if (ctx.has_input(2)) {
      bias = ctx.input(2).contiguous();
      if (bias.dtype() != DataType::Float || bias.numel() != p.n) {
        ctx.fail("bias " + bias.describe() + " must hold " + std::to_string(p.n) + " floats");
      }
      o.bias = bias.data<const float>();
    }
    Tensor& y = ctx.output(0, DataType::Float, p.out_shape);
    if (y.numel() == 0) return;
    if (p.k == 0) {  // an empty sum: the bias and activation of zero
      std::fill(y.data<float>(), y.data<float>() + y.numel(), 0.0f);
      for (int64_t r = 0; o.bias && r < y.numel() / p.n; ++r) {
        std::copy(o.bias, o.bias + p.n, y.data<float>() + r * p.n);
      }
      apply_activation(activation_, y.data<float>(), y.numel());
      return;
    }
    fold_batches(p);
    const bool use_packed = packed_ && b.rank() == 2;
    run_float(p, a.data<const float>(), use_packed ? nullptr : b.data<const float>(),
              use_packed ? &packed_ : nullptr, y.data<float>(), o);
  }

 private:
  bool trans_a_, trans_b_;
  PackedWeight packed_;
  float alpha_;
  math::Activation activation_;
};

// MatMul, and the fused products whose transA / transB swap an operand's last two axes.
void matmul_shape(ShapeContext& c) {
  if (!c.inputs_known()) {
    // Partial facts: broadcast batch axes, A's rows and B's columns (names kept).
    ValueFacts a = c.facts(0), b = c.facts(1);
    if (!a.ranked || !b.ranked || a.shape.empty() || b.shape.empty()) {
      c.set(0, typed_facts(a.dtype));
      return;
    }
    const auto swap_last = [](ValueFacts& v) {
      const size_t r = v.shape.size();
      std::swap(v.shape[r - 1], v.shape[r - 2]);
      if (!v.dim_names.empty()) std::swap(v.dim_names[r - 1], v.dim_names[r - 2]);
    };
    if (a.shape.size() >= 2 && c.attr_int("transA", 0) != 0) swap_last(a);
    if (b.shape.size() >= 2 && c.attr_int("transB", 0) != 0) swap_last(b);
    const size_t ra = a.shape.size(), rb = b.shape.size();
    const ValueFacts batch_a = sub_shape(a, 0, ra >= 2 ? ra - 2 : 0);
    const ValueFacts batch_b = sub_shape(b, 0, rb >= 2 ? rb - 2 : 0);
    ValueFacts out = broadcast_facts({&batch_a, &batch_b});
    out.dtype = a.dtype;
    if (ra >= 2) append_dim(out, a, ra - 2);
    if (rb >= 2) append_dim(out, b, rb - 1);
    c.set(0, std::move(out));
    return;
  }
  Shape a = c.shape(0), b = c.shape(1);
  if (a.size() >= 2 && c.attr_int("transA", 0) != 0) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (b.size() >= 2 && c.attr_int("transB", 0) != 0) std::swap(b[b.size() - 1], b[b.size() - 2]);
  c.set(0, c.dtype(0), matmul_shape_of(std::move(a), std::move(b)));
}

// The kernel's workspace (half_parts) for these shapes.
uint64_t matmul_workspace(const ShapeContext& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  return half_parts(c.dtype(0), a, b, matmul_shape_of(a, b), packs_constant_b(c.constant_input(1)))
      .layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "MatMul",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16, int32, int64, uint32, uint64",
                  .shape = matmul_shape,
                  .workspace = matmul_workspace,
                  .create = make<MatMul>});

KILN_REGISTER_OP({.domain = "kiln",
                  .op = "FusedMatMul",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float",
                  .shape = matmul_shape,
                  .create = make<FusedMatMul>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "FusedMatMul",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float",
                  .shape = matmul_shape,
                  .create = make<FusedMatMul>});

}  // namespace kiln::ops
