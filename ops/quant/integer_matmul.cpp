// MatMulInteger and QLinearMatMul: numpy-style (batched, broadcasting) matmul of quantized
// tensors after subtracting their zero points.
//
// 8-bit integer operands go through the int8 GEMM layer (ops/math/qgemm.h), exact in int32
// for every signedness and zero point (per tensor, per row of A, per column of B, or per
// batch matrix). A constant 2-D B (a weight) is packed once when the session is planned and
// shared through the Environment's weights cache. QLinearMatMul requantizes each tile as it
// is produced: the int32 sum times a_scale * b_scale / y_scale in float, rounded half to
// even, plus y's zero point, saturated. Batches sharing one B fold into a single taller
// product; otherwise batches run in parallel, or one after another each split across threads.
// float8 operands (opset 21) are decoded and multiplied in double, as are float8 outputs
// rescaled.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/float8.h"
#include "ops/core/workspace.h"
#include "ops/linalg/matmul_plan.h"
#include "ops/math/gemm.h"
#include "ops/math/qgemm.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

// uint8, int8 and the 8-bit float8 types (not packed float4).
bool is_quant_input(DataType t) {
  return t == DataType::UInt8 || t == DataType::Int8 ||
         (lowp::minifloat_format(t) != nullptr && lowp::packed_bits(t) == 0);
}

// Per-tensor (one element), per-row/column (1-D of `lines`), or one value per
// (batch, row/column) of `t` (shape of t with the K dimension set to 1).
std::vector<double> line_values(const OpContext& ctx, const Tensor& v, const Tensor& t,
                                int64_t lines, bool rows, const char* what) {
  const int64_t n = v.numel();
  bool ok = n == 1 || (v.rank() == 1 && n == lines);
  if (!ok && v.rank() == t.rank() && t.rank() >= 2) {
    Shape want = t.shape();
    want[rows ? t.rank() - 1 : t.rank() - 2] = 1;
    ok = v.shape() == want;
  }
  if (!ok) {
    ctx.fail(std::string(what) + " shape " + shape_to_string(v.shape()) + " does not fit " +
             shape_to_string(t.shape()));
  }
  std::vector<double> out(static_cast<size_t>(n));
  lowp::read_as_doubles(v.contiguous(), 0, n, out.data());
  return out;
}

// t - zero_point as doubles into `v` (t's elements). `rows`: zero point per row of a (else per
// column of b).
void centered(const OpContext& ctx, const Tensor& t, const Tensor* zp, bool rows, const char* what,
              double* v) {
  const int64_t n = t.numel();
  if (n == 0) return;
  lowp::read_as_doubles(t, 0, n, v);
  if (!zp) return;
  if (zp->dtype() != t.dtype()) ctx.fail(std::string(what) + " type differs from its input's");
  const bool vec = t.rank() == 1;
  const int64_t cols = t.shape().back();
  const int64_t rows_n = vec ? (rows ? 1 : cols) : t.dim(t.rank() - 2);
  const int64_t lines = rows ? rows_n : (vec ? 1 : cols);
  const std::vector<double> z = line_values(ctx, *zp, t, lines, rows, what);
  if (z.size() == 1) {
    for (int64_t i = 0; i < n; ++i) v[i] -= z[0];
    return;
  }
  const int64_t mat = rows_n * (vec ? 1 : cols);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t in_mat = i % std::max<int64_t>(1, mat), batch = i / std::max<int64_t>(1, mat);
    const int64_t line = rows ? in_mat / cols : in_mat % cols;
    // 1-D zero points repeat for every batch; N-D ones have one line set per batch.
    const int64_t zi = static_cast<int64_t>(z.size()) == lines ? line : batch * lines + line;
    v[i] -= z[static_cast<size_t>(zi)];
  }
}

bool is_int8(DataType t) {
  return t == DataType::UInt8 || t == DataType::Int8;
}

// An 8-bit operand's zero points as int32: one for the tensor, one per line (row of A or
// column of B), or one per line of each of the operand's own batch matrices.
struct IntZeroPoints {
  std::vector<int32_t> values{0};
  int64_t lines = 1;

  bool scalar() const { return values.size() == 1; }
  // The lines' zero points of the operand's batch matrix `batch`.
  const int32_t* lines_of(int64_t batch) const {
    return static_cast<int64_t>(values.size()) == lines ? values.data()
                                                        : values.data() + batch * lines;
  }
};

IntZeroPoints int_zero_points(const OpContext& ctx, const Tensor* zp, const Tensor& t, bool rows,
                              const char* what) {
  IntZeroPoints z;
  if (!zp) return z;
  if (zp->dtype() != t.dtype()) ctx.fail(std::string(what) + " type differs from its input's");
  const bool vec = t.rank() == 1;
  z.lines = vec ? 1 : (rows ? t.dim(t.rank() - 2) : t.shape().back());
  const std::vector<double> v = line_values(ctx, *zp, t, z.lines, rows, what);
  z.values.assign(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) z.values[i] = static_cast<int32_t>(v[i]);
  return z;
}

// The requantization of QLinearMatMul's 8-bit output: the scale of element (i, j) of a batch
// matrix at scales[i * scale_rs + j * scale_cs], the zero point of row i at zy[i * zy_rs].
struct Requant {
  bool y_signed = false;
  std::vector<float> scales;
  int64_t scale_rs = 0, scale_cs = 0;
  std::vector<int32_t> zy{0};
  int64_t zy_rs = 0;
};

// `v` (one value per row of a batch matrix) repeated for `times` matrices.
template <typename T>
std::vector<T> repeat(const std::vector<T>& v, int64_t times) {
  std::vector<T> out;
  out.reserve(v.size() * static_cast<size_t>(times));
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), v.begin(), v.end());
  return out;
}

// The product of every output batch of 8-bit a and b (b packed when `packed` is given) into
// int32 `c` or, with `rq`, requantized into `y` (both contiguous [batches, M, N]).
void run_int(const MatMulPlan& p, const Tensor& a, const Tensor& b, const math::QPackedB* packed,
             const IntZeroPoints& za, const IntZeroPoints& zb, int32_t* c, uint8_t* y,
             const Requant* rq) {
  const int64_t nb = static_cast<int64_t>(p.a_batch.size());
  const bool a_signed = a.dtype() == DataType::Int8, b_signed = b.dtype() == DataType::Int8;
  const auto* ad = reinterpret_cast<const uint8_t*>(a.raw_data());
  const auto* bd = reinterpret_cast<const uint8_t*>(b.raw_data());
  const bool one_b =
      std::all_of(p.b_batch.begin(), p.b_batch.end(), [&](int64_t i) { return i == p.b_batch[0]; });
  bool a_in_order = true;
  for (int64_t i = 0; i < nb; ++i)
    a_in_order = a_in_order && p.a_batch[static_cast<size_t>(i)] == i;
  // Batches of A stacked on one B are one taller product (unless the scales vary along both
  // rows and columns, which are laid out per batch matrix).
  const bool fold = nb > 1 && one_b && a_in_order && !(rq && rq->scale_rs && rq->scale_cs);
  // A B shared by every batch and not packed yet is packed once for all of them.
  math::QPackedB shared;
  if (!packed && one_b && nb > 1) {
    shared = math::QPackedB(
        math::QMatrixView::row_major(bd + p.b_batch[0] * p.K * p.N, p.K, p.N, p.N, b_signed));
    packed = &shared;
  }
  // Per-row arrays over the rows of a folded product.
  std::vector<int32_t> za_rows, zy_rows;
  std::vector<float> scale_rows;
  if (fold) {
    if (!za.scalar() && static_cast<int64_t>(za.values.size()) == za.lines) {
      za_rows = repeat(za.values, nb);
    }
    if (rq && rq->scale_rs) scale_rows = repeat(rq->scales, nb);
    if (rq && rq->zy_rs) zy_rows = repeat(rq->zy, nb);
  }
  const int64_t rows = fold ? nb * p.M : p.M;
  const int64_t products = fold ? 1 : nb;
  const double work = static_cast<double>(nb) * static_cast<double>(p.M) *
                      static_cast<double>(p.N) * static_cast<double>(p.K) / 4;
  const int tasks = math::task_count(work);
  const bool by_batch = tasks > 1 && products >= 2 * tasks;
  auto product = [&](int64_t bi) {
    const int64_t ab = p.a_batch[static_cast<size_t>(bi)], bb = p.b_batch[static_cast<size_t>(bi)];
    const math::QMatrixView av =
        math::QMatrixView::row_major(ad + ab * p.M * p.K, rows, p.K, p.K, a_signed);
    math::QGemmOptions o;
    if (by_batch) o.max_threads = 1;
    if (za.scalar()) {
      o.a_zero = za.values[0];
    } else {
      o.a_zeros = za_rows.empty() ? za.lines_of(ab) : za_rows.data();
    }
    if (zb.scalar()) {
      o.b_zero = zb.values[0];
    } else {
      o.b_zeros = zb.lines_of(bb);
    }
    math::QGemmOutput out;
    if (rq) {
      out.y = y + bi * p.M * p.N;
      out.ldy = p.N;
      out.y_signed = rq->y_signed;
      out.scales = scale_rows.empty() ? rq->scales.data() : scale_rows.data();
      out.scale_rs = rq->scale_rs;
      out.scale_cs = rq->scale_cs;
      out.y_zero_points = zy_rows.empty() ? rq->zy.data() : zy_rows.data();
      out.y_zero_rs = rq->zy_rs;
    } else {
      out = math::QGemmOutput::int32(c + bi * p.M * p.N, p.N);
    }
    if (packed) {
      math::qgemm(av, *packed, out, o);
    } else {
      math::qgemm(av, math::QMatrixView::row_major(bd + bb * p.K * p.N, p.K, p.N, p.N, b_signed),
                  out, o);
    }
  };
  if (by_batch) {
    parallel_for(products, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t bi = lo; bi < hi; ++bi) product(bi);
    });
  } else {
    for (int64_t bi = 0; bi < products; ++bi) product(bi);
  }
}

// Calls emit(batch, c) with c the double product (M x N, in `c`) of every output batch.
template <typename Emit>
void double_products(const MatMulPlan& p, const double* a, const double* b, double* c,
                     Emit&& emit) {
  for (size_t bi = 0; bi < p.a_batch.size(); ++bi) {
    math::gemm<double>(a + p.a_batch[bi] * p.M * p.K, p.M, p.K, p.K, 1,
                       b + p.b_batch[bi] * p.K * p.N, p.N, p.N, 1, c, p.N);
    emit(static_cast<int64_t>(bi), c);
  }
}

// A constant 2-D 8-bit B (a weight) packed once for the active level's int8 tile, through
// the weights cache.
struct PackedWeight {
  std::shared_ptr<const Tensor> storage;
  math::QPackedB b;

  static PackedWeight make(const NodeInfo& info, size_t input) {
    PackedWeight w;
    const Tensor* b = info.constant_input(input);
    if (!b || b->rank() != 2 || !is_int8(b->dtype()) || b->numel() == 0) return w;
    const math::MathKernels& t = math::kernels();
    const std::string name = std::string("qgemm-b-") + math::isa_name(t.isa) + "-" +
                             t.int8_gemm.layout + "-nr" + std::to_string(t.int8_gemm.nr);
    w.storage = info.prepared_input(input, name, [](const Tensor& v) {
      const Tensor c = v.contiguous();
      const math::MathKernels& tk = math::kernels();
      const int64_t k = c.dim(0), n = c.dim(1);
      const int64_t bytes = math::QPackedB::packed_bytes(k, n, tk.int8_gemm);
      Tensor packed(DataType::UInt8, Shape{bytes},
                    Storage::heap_uninitialized(static_cast<size_t>(bytes)));
      math::QPackedB::pack_into(
          math::QMatrixView::row_major(c.raw_data(), k, n, n, c.dtype() == DataType::Int8),
          packed.raw_data(), tk);
      packed.storage()->set_read_only();
      return packed;
    });
    w.b = math::QPackedB(w.storage->raw_data(), b->dim(0), b->dim(1), b->dtype() == DataType::Int8);
    return w;
  }
  // The packed form when `b` (the input as run) is the weight it was made from.
  const math::QPackedB* for_input(const Tensor& b) const {
    return storage && b.rank() == 2 ? &this->b : nullptr;
  }
};

class MatMulInteger final : public Kernel {
 public:
  explicit MatMulInteger(const NodeInfo& info) : weight_(PackedWeight::make(info, 1)) {}
  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    for (const Tensor* t : {&a, &b}) {
      if (!is_int8(t->dtype())) throw_unsupported_type(t->dtype(), "MatMulInteger input");
    }
    const MatMulPlan p = plan_matmul(ctx, a.shape(), b.shape());
    const IntZeroPoints za =
        int_zero_points(ctx, ctx.has_input(2) ? &ctx.input(2) : nullptr, a, true, "a_zero_point");
    const IntZeroPoints zb =
        int_zero_points(ctx, ctx.has_input(3) ? &ctx.input(3) : nullptr, b, false, "b_zero_point");
    Tensor& y = ctx.output(0, DataType::Int32, p.out);
    if (y.numel() == 0) return;
    run_int(p, a, b, weight_.for_input(b), za, zb, y.data<int32_t>(), nullptr, nullptr);
  }

 private:
  PackedWeight weight_;
};

// QLinearMatMul's workspace, as the kernel and qlinear_matmul_workspace lay it out: the int32
// sums of 8-bit integer inputs when the output is a float8 type (an 8-bit integer output is
// requantized tile by tile); for float8 inputs A and B decoded and centred in double and one
// batch's double product (M x N). None for an empty output.
WorkspaceLayout qlinear_matmul_parts(DataType a, DataType b, DataType out, const Shape& a_shape,
                                     const Shape& b_shape, const Shape& y) {
  WorkspaceLayout l;
  if (shape_numel(y) == 0) return l;
  if (is_int8(a) && is_int8(b)) {
    if (lowp::minifloat_format(out) != nullptr) l.add(DataType::Int32, shape_numel(y));
    return l;
  }
  const int64_t m = a_shape.size() < 2 ? 1 : a_shape[a_shape.size() - 2];
  const int64_t n = b_shape.size() < 2 ? 1 : b_shape.back();
  l.add(DataType::Double, shape_numel(a_shape));
  l.add(DataType::Double, shape_numel(b_shape));
  l.add(DataType::Double, checked_numel({m, n}));
  return l;
}

class QLinearMatMul final : public Kernel {
 public:
  explicit QLinearMatMul(const NodeInfo& info) : weight_(PackedWeight::make(info, 3)) {}
  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(3);
    for (const Tensor* t : {&a, &b}) {
      if (!is_quant_input(t->dtype())) throw_unsupported_type(t->dtype(), "QLinearMatMul input");
    }
    const Tensor* y_zp = ctx.has_input(7) ? &ctx.input(7) : nullptr;
    const DataType out_t = y_zp ? y_zp->dtype() : a.dtype();
    if (!is_quant_input(out_t)) throw_unsupported_type(out_t, "QLinearMatMul output");
    const Tensor& as = ctx.input(1);
    const Tensor& bs = ctx.input(4);
    const Tensor& ys = ctx.input(6);
    for (const Tensor* s : {&as, &bs, &ys}) {
      if (s->dtype() != DataType::Float && s->dtype() != DataType::Float16 &&
          s->dtype() != DataType::BFloat16) {
        throw_unsupported_type(s->dtype(), "QLinearMatMul scale");
      }
    }
    const MatMulPlan p = plan_matmul(ctx, a.shape(), b.shape());
    const bool a_vec = a.rank() == 1;
    const std::vector<double> sa = line_values(ctx, as, a, a_vec ? 1 : p.M, true, "a_scale");
    const std::vector<double> sb = line_values(ctx, bs, b, p.N, false, "b_scale");
    const std::vector<double> sy = line_values(ctx, ys, a, a_vec ? 1 : p.M, true, "y_scale");
    std::vector<double> zy(1, 0.0);
    if (y_zp) zy = line_values(ctx, *y_zp, a, a_vec ? 1 : p.M, true, "y_zero_point");
    if (sa.size() > 1 && static_cast<int64_t>(sa.size()) != p.M)
      ctx.fail("a_scale must be per-row");
    if (sb.size() > 1 && static_cast<int64_t>(sb.size()) != p.N)
      ctx.fail("b_scale must be per-column");
    if (sy.size() > 1 && static_cast<int64_t>(sy.size()) != p.M)
      ctx.fail("y_scale must be per-row");
    if (zy.size() > 1 && static_cast<int64_t>(zy.size()) != p.M)
      ctx.fail("y_zero_point must be per-row");
    // numpy forms a_scale * b_scale / y_scale in the scales' own type.
    const bool half = as.dtype() == DataType::Float16 && bs.dtype() == DataType::Float16 &&
                      ys.dtype() == DataType::Float16;
    auto in_scale_type = [&](double v) {
      return half ? static_cast<double>(float16(static_cast<float>(v)))
                  : static_cast<double>(static_cast<float>(v));
    };
    auto pick = [](const std::vector<double>& v, int64_t i) {
      return v[v.size() == 1 ? 0 : static_cast<size_t>(i)];
    };
    auto multiplier = [&](int64_t m, int64_t n) {
      return in_scale_type(in_scale_type(pick(sa, m) * pick(sb, n)) / pick(sy, m));
    };
    Tensor& y = ctx.output(0, out_t, p.out);
    if (y.numel() == 0) return;
    const lowp::MiniFloat* fmt = lowp::minifloat_format(out_t);

    if (is_int8(a.dtype()) && is_int8(b.dtype())) {
      const IntZeroPoints za =
          int_zero_points(ctx, ctx.has_input(2) ? &ctx.input(2) : nullptr, a, true, "a_zero_point");
      const IntZeroPoints zb = int_zero_points(ctx, ctx.has_input(5) ? &ctx.input(5) : nullptr, b,
                                               false, "b_zero_point");
      if (!fmt) {
        // 8-bit integer output: requantized tile by tile.
        Requant rq;
        rq.y_signed = out_t == DataType::Int8;
        const bool by_row = sa.size() > 1 || sy.size() > 1, by_col = sb.size() > 1;
        const int64_t rows = by_row ? p.M : 1, cols = by_col ? p.N : 1;
        rq.scales.resize(static_cast<size_t>(rows * cols));
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            rq.scales[static_cast<size_t>(i * cols + j)] = static_cast<float>(multiplier(i, j));
          }
        }
        rq.scale_rs = by_row ? cols : 0;
        rq.scale_cs = by_col ? 1 : 0;
        rq.zy.assign(zy.size(), 0);
        for (size_t i = 0; i < zy.size(); ++i) rq.zy[i] = static_cast<int32_t>(zy[i]);
        rq.zy_rs = zy.size() > 1 ? 1 : 0;
        run_int(p, a, b, weight_.for_input(b), za, zb, nullptr,
                reinterpret_cast<uint8_t*>(y.raw_data()), &rq);
        return;
      }
      // A float8 output: the exact int32 sums (the workspace, qlinear_matmul_parts),
      // rescaled and encoded.
      const WorkspaceLayout layout =
          qlinear_matmul_parts(a.dtype(), b.dtype(), out_t, a.shape(), b.shape(), p.out);
      const Workspace space(ctx, layout);
      int32_t* acc = space.data<int32_t>(0);
      run_int(p, a, b, weight_.for_input(b), za, zb, acc, nullptr, nullptr);
      const int32_t* src = acc;
      auto* dst = reinterpret_cast<uint8_t*>(y.raw_data());
      const int64_t mn = p.M * p.N;
      for (int64_t at = 0; at < y.numel(); ++at) {
        const int64_t m = (at % mn) / p.N, n = at % p.N;
        const double v = static_cast<double>(src[at]) * multiplier(m, n) + pick(zy, m);
        dst[at] = static_cast<uint8_t>(lowp::encode_minifloat(v, *fmt, true));
      }
      return;
    }

    // float8 inputs: decoded, centred and multiplied in double, in the workspace
    // (qlinear_matmul_parts).
    const WorkspaceLayout layout =
        qlinear_matmul_parts(a.dtype(), b.dtype(), out_t, a.shape(), b.shape(), p.out);
    const Workspace space(ctx, layout);
    double* ca = space.data<double>(0);
    double* cb = space.data<double>(1);
    centered(ctx, a, ctx.has_input(2) ? &ctx.input(2) : nullptr, true, "a_zero_point", ca);
    centered(ctx, b, ctx.has_input(5) ? &ctx.input(5) : nullptr, false, "b_zero_point", cb);
    std::byte* out = y.raw_data();
    const double lo = out_t == DataType::Int8 ? -128 : 0, hi = out_t == DataType::Int8 ? 127 : 255;
    double_products(p, ca, cb, space.data<double>(2), [&](int64_t batch, const double* c) {
      for (int64_t m = 0; m < p.M; ++m) {
        for (int64_t n = 0; n < p.N; ++n) {
          const double v = c[m * p.N + n] * multiplier(m, n) + pick(zy, m);
          const int64_t at = (batch * p.M + m) * p.N + n;
          if (fmt) {
            reinterpret_cast<uint8_t*>(out)[at] =
                static_cast<uint8_t>(lowp::encode_minifloat(v, *fmt, true));
            continue;
          }
          const double q = std::isnan(v) ? 0.0 : std::clamp(std::nearbyint(v), lo, hi);
          if (out_t == DataType::Int8) {
            reinterpret_cast<int8_t*>(out)[at] = static_cast<int8_t>(q);
          } else {
            reinterpret_cast<uint8_t*>(out)[at] = static_cast<uint8_t>(q);
          }
        }
      }
    });
  }

 private:
  PackedWeight weight_;
};

void matmul_integer_shape(ShapeContext& c) {
  c.set(0, DataType::Int32, matmul_shape_of(c.shape(0), c.shape(1)));
}

// The output's type is y_zero_point's, else A's.
void qlinear_matmul_shape(ShapeContext& c) {
  const DataType out = c.has_input(7) ? c.dtype(7) : c.dtype(0);
  if (!is_quant_input(c.dtype(0)) || !is_quant_input(c.dtype(3)) || !is_quant_input(out)) {
    unknown("types QLinearMatMul does not take");
  }
  c.set(0, out, matmul_shape_of(c.shape(0), c.shape(3)));
}

// The kernel's workspace (qlinear_matmul_parts) for these shapes.
uint64_t qlinear_matmul_workspace(const ShapeContext& c) {
  const DataType out = c.has_input(7) ? c.dtype(7) : c.dtype(0);
  return qlinear_matmul_parts(c.dtype(0), c.dtype(3), out, c.shape(0), c.shape(3),
                              matmul_shape_of(c.shape(0), c.shape(3)))
      .bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "MatMulInteger",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 -> int32",
                  .shape = matmul_integer_shape,
                  .create = make<MatMulInteger>});
KILN_REGISTER_OP({.op = "QLinearMatMul",
                  .since = 10,
                  .min_inputs = 8,
                  .max_inputs = 8,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8, float8 with float/float16/bfloat16 scales",
                  .shape = qlinear_matmul_shape,
                  .workspace = qlinear_matmul_workspace,
                  .create = make<QLinearMatMul>});

}  // namespace kiln::ops
