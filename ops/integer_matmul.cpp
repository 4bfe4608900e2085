// MatMulInteger and QLinearMatMul: numpy-style (batched, broadcasting) matmul of quantized
// tensors after subtracting their zero points.
//
// The zero-point-centred operands are products of at most 9-bit integers, so their sums are
// exact in double for any realistic K (< 2^37); the product therefore runs as an Eigen
// double GEMM, which is exact, vectorised, and free of int32 overflow.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/float8.h"

namespace kiln::ops {
namespace {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct MatMulPlan {
  Shape out;
  int64_t M = 1, K = 1, N = 1;
  std::vector<int64_t> a_batch, b_batch;  // per output batch: the operand's batch index
};

MatMulPlan plan_matmul(const OpContext& ctx, const Shape& a_in, const Shape& b_in) {
  if (a_in.empty() || b_in.empty()) ctx.fail("matmul operands must have rank >= 1");
  Shape a = a_in, b = b_in;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  MatMulPlan p;
  p.M = a[a.size() - 2], p.K = a.back(), p.N = b.back();
  if (b[b.size() - 2] != p.K) {
    ctx.fail("matmul shapes " + shape_to_string(a_in) + " and " + shape_to_string(b_in) +
             " do not agree on K");
  }
  const Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  const Shape batch = broadcast_shapes(ab, bb);
  const int64_t nb = shape_numel(batch);
  p.a_batch.resize(static_cast<size_t>(nb));
  p.b_batch.resize(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    // Right-aligned broadcast of the flat batch index onto each operand's batch dims.
    int64_t rem = i, ia = 0, ib = 0, sa = 1, sb = 1;
    for (size_t d = batch.size(); d-- > 0;) {
      const int64_t c = rem % batch[d];
      rem /= batch[d];
      const size_t oa = batch.size() - ab.size(), ob = batch.size() - bb.size();
      if (d >= oa) {
        const int64_t dim = ab[d - oa];
        ia += (dim == 1 ? 0 : c) * sa;
        sa *= dim;
      }
      if (d >= ob) {
        const int64_t dim = bb[d - ob];
        ib += (dim == 1 ? 0 : c) * sb;
        sb *= dim;
      }
    }
    p.a_batch[static_cast<size_t>(i)] = ia;
    p.b_batch[static_cast<size_t>(i)] = ib;
  }
  p.out = batch;
  if (a_in.size() > 1) p.out.push_back(p.M);
  if (b_in.size() > 1) p.out.push_back(p.N);
  return p;
}

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

// t - zero_point as doubles. `rows`: zero point per row of a (else per column of b).
std::vector<double> centered(const OpContext& ctx, const Tensor& t, const Tensor* zp, bool rows,
                             const char* what) {
  const int64_t n = t.numel();
  std::vector<double> v(static_cast<size_t>(n));
  lowp::read_as_doubles(t, 0, n, v.data());
  if (!zp) return v;
  if (zp->dtype() != t.dtype()) ctx.fail(std::string(what) + " type differs from its input's");
  const bool vec = t.rank() == 1;
  const int64_t cols = t.shape().back();
  const int64_t rows_n = vec ? (rows ? 1 : cols) : t.dim(t.rank() - 2);
  const int64_t lines = rows ? rows_n : (vec ? 1 : cols);
  const std::vector<double> z = line_values(ctx, *zp, t, lines, rows, what);
  if (z.size() == 1) {
    for (double& x : v) x -= z[0];
    return v;
  }
  const int64_t mat = rows_n * (vec ? 1 : cols);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t in_mat = i % std::max<int64_t>(1, mat), batch = i / std::max<int64_t>(1, mat);
    const int64_t line = rows ? in_mat / cols : in_mat % cols;
    // 1-D zero points repeat for every batch; N-D ones have one line set per batch.
    const int64_t zi = static_cast<int64_t>(z.size()) == lines ? line : batch * lines + line;
    v[static_cast<size_t>(i)] -= z[static_cast<size_t>(zi)];
  }
  return v;
}

// Calls emit(batch, row0, block) with the double product rows [row0, row0 + block.rows()).
template <typename Emit>
void gemm(const MatMulPlan& p, const std::vector<double>& a, const std::vector<double>& b,
          Emit&& emit) {
  constexpr int64_t kRows = 32;
  const int64_t row_blocks = (p.M + kRows - 1) / kRows;
  const int64_t tasks = static_cast<int64_t>(p.a_batch.size()) * row_blocks;
  parallel_for(tasks, grain_for(kRows * p.K * p.N, 1 << 16), [&](int64_t t0, int64_t t1) {
    RowMat c;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t batch = t / row_blocks, r0 = (t % row_blocks) * kRows;
      const int64_t rows = std::min(kRows, p.M - r0);
      const double* pa = a.data() + (p.a_batch[static_cast<size_t>(batch)] * p.M + r0) * p.K;
      const double* pb = b.data() + p.b_batch[static_cast<size_t>(batch)] * p.K * p.N;
      Eigen::Map<const RowMat> am(pa, rows, p.K);
      Eigen::Map<const RowMat> bm(pb, p.K, p.N);
      c.resize(rows, p.N);
      c.noalias() = am * bm;
      emit(batch, r0, c);
    }
  });
}

class MatMulInteger final : public Kernel {
 public:
  explicit MatMulInteger(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    for (const Tensor* t : {&a, &b}) {
      if (t->dtype() != DataType::UInt8 && t->dtype() != DataType::Int8) {
        throw_unsupported_type(t->dtype(), "MatMulInteger input");
      }
    }
    const MatMulPlan p = plan_matmul(ctx, a.shape(), b.shape());
    const std::vector<double> ca =
        centered(ctx, a, ctx.has_input(2) ? &ctx.input(2) : nullptr, true, "a_zero_point");
    const std::vector<double> cb =
        centered(ctx, b, ctx.has_input(3) ? &ctx.input(3) : nullptr, false, "b_zero_point");
    Tensor& y = ctx.output(0, DataType::Int32, p.out);
    int32_t* py = y.data<int32_t>();
    gemm(p, ca, cb, [&](int64_t batch, int64_t r0, const RowMat& c) {
      int32_t* dst = py + (batch * p.M + r0) * p.N;
      const double* src = c.data();
      // Wraps like int32 accumulation would for absurdly long K.
      for (int64_t i = 0; i < c.size(); ++i) {
        dst[i] = static_cast<int32_t>(static_cast<int64_t>(src[i]));
      }
    });
  }
};

class QLinearMatMul final : public Kernel {
 public:
  explicit QLinearMatMul(const NodeInfo&) {}
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
    const std::vector<double> ca =
        centered(ctx, a, ctx.has_input(2) ? &ctx.input(2) : nullptr, true, "a_zero_point");
    const std::vector<double> cb =
        centered(ctx, b, ctx.has_input(5) ? &ctx.input(5) : nullptr, false, "b_zero_point");
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
    Tensor& y = ctx.output(0, out_t, p.out);
    std::byte* out = y.raw_data();
    const lowp::MiniFloat* fmt = lowp::minifloat_format(out_t);
    const double lo = out_t == DataType::Int8 ? -128 : 0, hi = out_t == DataType::Int8 ? 127 : 255;
    gemm(p, ca, cb, [&](int64_t batch, int64_t r0, const RowMat& c) {
      const int64_t base = (batch * p.M + r0) * p.N;
      for (int64_t r = 0; r < c.rows(); ++r) {
        const int64_t m = r0 + r;
        for (int64_t n = 0; n < p.N; ++n) {
          const double mult = in_scale_type(in_scale_type(pick(sa, m) * pick(sb, n)) / pick(sy, m));
          const double v = c(r, n) * mult + pick(zy, m);
          const int64_t at = base + r * p.N + n;
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
};

}  // namespace

KILN_REGISTER_OP({.op = "MatMulInteger",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 -> int32",
                  .create = make<MatMulInteger>});
KILN_REGISTER_OP({.op = "QLinearMatMul",
                  .since = 10,
                  .min_inputs = 8,
                  .max_inputs = 8,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8, float8 with float/float16/bfloat16 scales",
                  .create = make<QLinearMatMul>});

}  // namespace kiln::ops
