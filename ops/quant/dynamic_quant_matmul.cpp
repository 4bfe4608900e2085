// com.microsoft DynamicQuantizeMatMul, MatMulIntegerToFloat and QGemm: 8-bit matrix products
// with a float (or, for QGemm, requantized 8-bit) result, as onnxruntime's quantizer writes
// them (DynamicQuantizeLinear + MatMulInteger + scaling fused by its graph optimizer; QGemm
// from static quantization of Gemm).
//
//   DynamicQuantizeMatMul: A (float) quantized per tensor to uint8 as DynamicQuantizeLinear
//     does (straight into the GEMM's packed panels), then Y = float((A_q - za)(B - zb)) * (a_scale
//     * b_scale_j) + bias_j
//   MatMulIntegerToFloat: the same from an 8-bit A with its scale and zero point given
//   QGemm: Y = float((op(A) - za)(op(B) - zb) + C) * (alpha * a_scale * b_scale_j [/ y_scale])
//     (+ y_zero_point, saturated, when y_zero_point is given)
//
// B's scale and zero point are per tensor or per column ([N] for a 2-D B, or B's shape with
// K set to 1 for batched B), as onnxruntime accepts them. Every product runs in the int8 GEMM
// layer (ops/math/qgemm.h), which scales each finished tile to float; a constant 2-D B is
// packed once at session creation (ops/linalg/packed_weights.h).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/workspace.h"
#include "ops/elementwise/activation.h"
#include "ops/linalg/matmul_plan.h"
#include "ops/linalg/packed_weights.h"
#include "ops/math/qgemm.h"
#include "ops/quant/quantize.h"

namespace kiln::ops {
namespace {

bool is_int8(DataType t) {
  return t == DataType::UInt8 || t == DataType::Int8;
}

// Values of a scale or zero point of B, per tensor or per column: `per_matrix` values per
// batch matrix of B (1 or N).
struct BParam {
  std::vector<float> values{1.0f};
  int64_t per_matrix = 1;
  bool per_column() const { return per_matrix > 1 || values.size() > 1; }
  const float* of(int64_t b_batch) const {
    return values.data() +
           (values.size() > static_cast<size_t>(per_matrix) ? b_batch * per_matrix : 0);
  }
};

// onnxruntime's accepted forms: one value, [N] for a 2-D B, or B's shape with K set to 1.
BParam b_param(const OpContext& ctx, const Tensor& v, const Tensor& b, const char* what) {
  BParam p;
  const int64_t n = b.rank() >= 2 ? b.shape().back() : 1;
  bool ok = v.numel() == 1 && v.rank() <= 1;
  if (!ok && v.rank() == 1 && b.rank() == 2) ok = v.dim(0) == n;
  if (!ok && v.rank() == b.rank() && b.rank() >= 2) {
    Shape want = b.shape();
    want[want.size() - 2] = 1;
    ok = v.shape() == want;
  }
  if (!ok) {
    ctx.fail(std::string(what) + " " + v.describe() +
                 " must be a scalar, [N] for a 2-D B, or B's shape with K set to 1 (B is " +
                 b.describe() + ")",
             ErrorKind::Unsupported);
  }
  p.per_matrix = v.numel() == 1 ? 1 : n;
  p.values.resize(static_cast<size_t>(v.numel()));
  const Tensor c = v.contiguous();
  if (v.dtype() == DataType::Float) {
    std::copy_n(c.data<const float>(), v.numel(), p.values.begin());
  } else {
    for (int64_t i = 0; i < v.numel(); ++i) {
      p.values[static_cast<size_t>(i)] = v.dtype() == DataType::Int8
                                             ? static_cast<float>(c.data<const int8_t>()[i])
                                             : static_cast<float>(c.data<const uint8_t>()[i]);
    }
  }
  return p;
}

void check_scale(const OpContext& ctx, const Tensor& s, const char* what) {
  if (s.dtype() != DataType::Float)
    ctx.fail(std::string(what) + " must be float, got " + s.describe());
}

// A scalar (one-element) quantization parameter as float.
float scalar_of(const OpContext& ctx, const Tensor& t, const char* what) {
  if (t.numel() != 1 || t.rank() > 1) {
    ctx.fail(std::string(what) + " " + t.describe() + " must be a scalar (per tensor)",
             ErrorKind::Unsupported);
  }
  const Tensor c = t.contiguous();
  switch (t.dtype()) {
    case DataType::Float:
      return c.data<const float>()[0];
    case DataType::UInt8:
      return c.data<const uint8_t>()[0];
    case DataType::Int8:
      return c.data<const int8_t>()[0];
    default:
      ctx.fail(std::string(what) + " has an unexpected type: " + t.describe());
  }
}

// A of a product to float: 8-bit values, or float values quantized with A's scale and zero
// point as they are packed (DynamicQuantizeMatMul: no quantized tensor is written).
struct ASource {
  const uint8_t* q = nullptr;
  const float* f = nullptr;
  bool is_signed = false;
};

// The product of A (contiguous, `a_shape`) and B scaled to float into y: the body shared by
// DynamicQuantizeMatMul and MatMulIntegerToFloat.
void matmul_to_float(OpContext& ctx, const ASource& a, const Shape& a_shape, float a_scale,
                     int32_t a_zero, const Tensor& b, const QPackedWeight& packed,
                     const Tensor& b_scale, const Tensor* b_zero, const Tensor* bias,
                     math::Activation activation = math::Activation::None) {
  if (!is_int8(b.dtype())) ctx.fail("B must be uint8 or int8, got " + b.describe());
  check_scale(ctx, b_scale, "B's scale");
  if (b_zero && b_zero->dtype() != b.dtype()) {
    ctx.fail("B's zero point " + b_zero->describe() + " must have B's type");
  }
  const MatMulPlan p = plan_matmul(ctx, a_shape, b.shape());
  const BParam scales = b_param(ctx, b_scale, b, "B's scale");
  BParam zeros;
  zeros.values = {0.0f};
  if (b_zero) zeros = b_param(ctx, *b_zero, b, "B's zero point");
  if (bias && (bias->dtype() != DataType::Float || bias->numel() != p.N || bias->rank() != 1)) {
    ctx.fail("bias " + bias->describe() + " must be 1-D float of " + std::to_string(p.N));
  }
  Tensor& y = ctx.output(0, DataType::Float, p.out);
  if (y.numel() == 0) return;
  float* py = y.data<float>();
  if (p.K == 0) {  // an empty sum: only the bias
    for (int64_t r = 0; r < y.numel() / p.N; ++r) {
      for (int64_t j = 0; j < p.N; ++j) py[r * p.N + j] = bias ? bias->data<const float>()[j] : 0;
    }
    return;
  }
  const Tensor bc = b.contiguous();
  const auto* bd = reinterpret_cast<const uint8_t*>(bc.raw_data());
  const bool b_signed = b.dtype() == DataType::Int8;
  // One B for every output batch (a 2-D weight): the batches of A stack into one product.
  const bool one_b = b.rank() <= 2;
  const bool use_packed = packed && one_b && packed.view.k() == p.K && packed.view.n() == p.N;
  const int64_t products = one_b ? 1 : static_cast<int64_t>(p.a_batch.size());
  const int64_t rows = one_b ? y.numel() / p.N : p.M;
  std::vector<float> multipliers(static_cast<size_t>(scales.values.size()));
  for (size_t i = 0; i < multipliers.size(); ++i) multipliers[i] = a_scale * scales.values[i];
  std::vector<int32_t> zb_cols(zeros.per_column() ? static_cast<size_t>(p.N) : 0);
  for (int64_t bi = 0; bi < products; ++bi) {
    const int64_t ab = one_b ? 0 : p.a_batch[static_cast<size_t>(bi)];
    const int64_t bb = one_b ? 0 : p.b_batch[static_cast<size_t>(bi)];
    math::QGemmOptions o;
    o.a_zero = a_zero;
    if (zeros.per_column()) {
      const float* z = zeros.of(bb);
      for (int64_t j = 0; j < p.N; ++j)
        zb_cols[static_cast<size_t>(j)] = static_cast<int32_t>(z[j]);
      o.b_zeros = zb_cols.data();
    } else {
      o.b_zero = static_cast<int32_t>(zeros.values[0]);
    }
    const float* mult =
        multipliers.data() + (scales.values.size() > static_cast<size_t>(scales.per_matrix)
                                  ? bb * scales.per_matrix
                                  : 0);
    math::QGemmOutput out =
        math::QGemmOutput::to_float(py + bi * p.M * p.N, p.N, mult, scales.per_column(),
                                    bias ? bias->data<const float>() : nullptr);
    out.f_activation = activation;
    const math::QMatrixView bv =
        math::QMatrixView::row_major(bd + bb * p.K * p.N, p.K, p.N, p.N, b_signed);
    if (a.f) {
      const math::QFloatA af{a.f + ab * p.M * p.K,      rows, p.K, p.K, a_scale,
                             static_cast<float>(a_zero)};
      use_packed ? math::qgemm(af, packed.view, out, o) : math::qgemm(af, bv, out, o);
    } else {
      const math::QMatrixView av =
          math::QMatrixView::row_major(a.q + ab * p.M * p.K, rows, p.K, p.K, a.is_signed);
      use_packed ? math::qgemm(av, packed.view, out, o) : math::qgemm(av, bv, out, o);
    }
  }
}

class DynamicQuantizeMatMul final : public Kernel {
 public:
  explicit DynamicQuantizeMatMul(const NodeInfo& info)
      : packed_(pack_constant_qb(info, 1, false)), activation_(parse_activation(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    if (a.dtype() != DataType::Float) ctx.fail("A must be float, got " + a.describe());
    const Tensor ac = a.contiguous();
    const float* af = ac.data<const float>();
    const DynamicQuant dq = dynamic_quant_params(af, a.numel());
    matmul_to_float(ctx, ASource{.f = af}, a.shape(), dq.scale, dq.zero_point, ctx.input(1),
                    packed_, ctx.input(2), ctx.has_input(3) ? &ctx.input(3) : nullptr,
                    ctx.has_input(4) ? &ctx.input(4) : nullptr, activation_);
  }

 private:
  QPackedWeight packed_;
  math::Activation activation_;
};

class MatMulIntegerToFloat final : public Kernel {
 public:
  explicit MatMulIntegerToFloat(const NodeInfo& info) : packed_(pack_constant_qb(info, 1, false)) {}

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    if (!is_int8(a.dtype())) ctx.fail("A must be uint8 or int8, got " + a.describe());
    const Tensor& a_scale = ctx.input(2);
    check_scale(ctx, a_scale, "A's scale");
    int32_t za = 0;
    if (ctx.has_input(4)) {
      const Tensor& z = ctx.input(4);
      if (z.dtype() != a.dtype())
        ctx.fail("A's zero point " + z.describe() + " must have A's type");
      za = static_cast<int32_t>(scalar_of(ctx, z, "A's zero point"));
    }
    const Tensor ac = a.contiguous();
    const ASource as{.q = reinterpret_cast<const uint8_t*>(ac.raw_data()),
                     .is_signed = a.dtype() == DataType::Int8};
    matmul_to_float(ctx, as, a.shape(), scalar_of(ctx, a_scale, "A's scale"), za, ctx.input(1),
                    packed_, ctx.input(3), ctx.has_input(5) ? &ctx.input(5) : nullptr,
                    ctx.has_input(6) ? &ctx.input(6) : nullptr);
  }

 private:
  QPackedWeight packed_;
};

// QGemm's workspace, as the kernel and qgemm_workspace lay it out: Y's int32 sums.
WorkspaceLayout qgemm_parts(int64_t m, int64_t n) {
  WorkspaceLayout l;
  l.add(DataType::Int32, m * n);
  return l;
}

class QGemm final : public Kernel {
 public:
  explicit QGemm(const NodeInfo& info)
      : alpha_(info.attr_float("alpha", 1.0f)),
        trans_a_(info.attr_int("transA", 0) != 0),
        trans_b_(info.attr_int("transB", 0) != 0),
        packed_(pack_constant_qb(info, 3, trans_b_)) {}

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(3);
    for (const Tensor* t : {&a, &b}) {
      if (!is_int8(t->dtype()) || t->rank() != 2) {
        ctx.fail("A and B must be 2-D uint8 or int8, got " + t->describe());
      }
    }
    const int64_t m = a.dim(trans_a_ ? 1 : 0), k = a.dim(trans_a_ ? 0 : 1);
    const int64_t n = b.dim(trans_b_ ? 0 : 1);
    if (b.dim(trans_b_ ? 1 : 0) != k) {
      ctx.fail("A " + a.describe() + " and B " + b.describe() + " do not agree on K");
    }
    const Tensor& a_scale = ctx.input(1);
    const Tensor& b_scale = ctx.input(4);
    for (const Tensor* s : {&a_scale, &b_scale}) check_scale(ctx, *s, "scale");
    const Tensor& a_zero = ctx.input(2);
    if (a_zero.dtype() != a.dtype())
      ctx.fail("A's zero point " + a_zero.describe() + " must have A's type");
    const int32_t za = static_cast<int32_t>(scalar_of(ctx, a_zero, "A's zero point"));
    const Tensor* b_zero = ctx.has_input(5) ? &ctx.input(5) : nullptr;
    const std::vector<float> sb = per_column(ctx, b_scale, n, "B's scale");
    std::vector<float> zb{0.0f};
    if (b_zero) {
      if (b_zero->dtype() != b.dtype())
        ctx.fail("B's zero point " + b_zero->describe() + " must have B's type");
      zb = per_column(ctx, *b_zero, n, "B's zero point");
    }
    const Tensor* c = ctx.has_input(6) ? &ctx.input(6) : nullptr;
    const Tensor* y_scale = ctx.has_input(7) ? &ctx.input(7) : nullptr;
    const Tensor* y_zero = ctx.has_input(8) ? &ctx.input(8) : nullptr;
    float ys = 1.0f;
    if (y_scale) {
      check_scale(ctx, *y_scale, "y_scale");
      ys = scalar_of(ctx, *y_scale, "y_scale");
    }
    const float sa = scalar_of(ctx, a_scale, "A's scale");
    // onnxruntime's output scale: alpha * a_scale * b_scale_j, divided by y_scale when given.
    std::vector<float> scales(sb.size());
    for (size_t j = 0; j < sb.size(); ++j) {
      scales[j] = alpha_ * sa * sb[j];
      if (y_scale) scales[j] /= ys;
    }
    const CBias cb = c_bias(ctx, c, m, n);
    const DataType out_t = y_zero ? y_zero->dtype() : DataType::Float;
    if (y_zero && !is_int8(out_t))
      ctx.fail("y_zero_point must be uint8 or int8, got " + y_zero->describe());
    Tensor& y = ctx.output(0, out_t, {m, n});
    if (m == 0 || n == 0) return;

    // The int32 sums (the workspace, qgemm_workspace), with C entering as a row or column bias
    // (a full [M, N] C is added after).
    const WorkspaceLayout layout = qgemm_parts(m, n);
    const Workspace space(ctx, layout);
    int32_t* sums = space.data<int32_t>(0);
    if (k == 0) {
      std::fill(sums, sums + m * n, 0);
    } else {
      math::QGemmOptions o;
      o.a_zero = za;
      std::vector<int32_t> zb_cols;
      if (zb.size() > 1) {
        zb_cols.assign(zb.begin(), zb.end());
        o.b_zeros = zb_cols.data();
      } else {
        o.b_zero = static_cast<int32_t>(zb[0]);
      }
      o.row_bias = cb.rows.empty() ? nullptr : cb.rows.data();
      o.col_bias = cb.cols.empty() ? nullptr : cb.cols.data();
      const Tensor ac = a.contiguous();
      const math::QMatrixView av =
          trans_a_
              ? math::QMatrixView{ac.raw_data(), m, k, 1, m, a.dtype() == DataType::Int8}
              : math::QMatrixView::row_major(ac.raw_data(), m, k, k, a.dtype() == DataType::Int8);
      const math::QGemmOutput out = math::QGemmOutput::int32(sums, n);
      if (packed_ && packed_.view.k() == k && packed_.view.n() == n) {
        math::qgemm(av, packed_.view, out, o);
      } else {
        const Tensor bc = b.contiguous();
        const math::QMatrixView bv =
            trans_b_
                ? math::QMatrixView{bc.raw_data(), k, n, 1, k, b.dtype() == DataType::Int8}
                : math::QMatrixView::row_major(bc.raw_data(), k, n, n, b.dtype() == DataType::Int8);
        math::qgemm(av, bv, out, o);
      }
    }
    if (k == 0) add_bias_rows_cols(cb, sums, m, n);
    if (!cb.full.empty()) {
      for (int64_t i = 0; i < m * n; ++i) {
        sums[i] = static_cast<int32_t>(static_cast<uint32_t>(sums[i]) +
                                       static_cast<uint32_t>(cb.full[static_cast<size_t>(i)]));
      }
    }
    write_output(y, sums, m, n, scales, y_zero);
  }

 private:
  // C as int32 row or column biases, or a full [M, N] matrix (fields empty when not used).
  struct CBias {
    std::vector<int32_t> rows, cols, full;
  };

  static CBias c_bias(const OpContext& ctx, const Tensor* c, int64_t m, int64_t n) {
    CBias cb;
    if (!c) return cb;
    if (c->dtype() != DataType::Int32) ctx.fail("C must be int32, got " + c->describe());
    const Tensor cc = c->contiguous();
    const int32_t* v = cc.data<const int32_t>();
    const Shape& s = c->shape();
    if (c->numel() == 1 && s.size() <= 2) {
      cb.cols.assign(static_cast<size_t>(n), v[0]);
    } else if ((s.size() == 1 && s[0] == n) || (s.size() == 2 && s[0] == 1 && s[1] == n)) {
      cb.cols.assign(v, v + n);
    } else if (s.size() == 2 && s[0] == m && s[1] == 1) {
      cb.rows.assign(v, v + m);
    } else if (s.size() == 2 && s[0] == m && s[1] == n) {
      cb.full.assign(v, v + m * n);
    } else {
      ctx.fail("C " + c->describe() + " does not broadcast to [" + std::to_string(m) + ", " +
               std::to_string(n) + "]");
    }
    return cb;
  }

  static void add_bias_rows_cols(const CBias& cb, int32_t* sums, int64_t m, int64_t n) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        int32_t& v = sums[i * n + j];
        if (!cb.rows.empty()) v += cb.rows[static_cast<size_t>(i)];
        if (!cb.cols.empty()) v += cb.cols[static_cast<size_t>(j)];
      }
    }
  }

  // One value, or N of them (a 1-D tensor).
  static std::vector<float> per_column(const OpContext& ctx, const Tensor& t, int64_t n,
                                       const char* what) {
    if (t.numel() == 1 && t.rank() <= 1) return {scalar_of(ctx, t, what)};
    if (t.rank() != 1 || t.dim(0) != n) {
      ctx.fail(std::string(what) + " " + t.describe() +
               " must be a scalar or 1-D of N = " + std::to_string(n));
    }
    std::vector<float> v(static_cast<size_t>(n));
    const Tensor c = t.contiguous();
    for (int64_t j = 0; j < n; ++j) {
      v[static_cast<size_t>(j)] = t.dtype() == DataType::Float  ? c.data<const float>()[j]
                                  : t.dtype() == DataType::Int8 ? c.data<const int8_t>()[j]
                                                                : c.data<const uint8_t>()[j];
    }
    return v;
  }

  // float(sums) * scale, then with a zero point rounded half to even and saturated to 8 bits.
  static void write_output(Tensor& y, const int32_t* sums, int64_t m, int64_t n,
                           const std::vector<float>& scales, const Tensor* y_zero) {
    const bool by_col = scales.size() > 1;
    if (!y_zero) {
      float* f = y.data<float>();
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          f[i * n + j] = static_cast<float>(sums[i * n + j]) * scales[by_col ? j : 0];
        }
      }
      return;
    }
    const bool s8 = y.dtype() == DataType::Int8;
    const Tensor zc = y_zero->contiguous();
    const float zp = s8 ? zc.data<const int8_t>()[0] : zc.data<const uint8_t>()[0];
    const float lo = s8 ? -128.0f : 0.0f, hi = s8 ? 127.0f : 255.0f;
    auto* out = reinterpret_cast<uint8_t*>(y.raw_data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float v =
            std::nearbyint(static_cast<float>(sums[i * n + j]) * scales[by_col ? j : 0]);
        const float q = std::clamp(v + zp, lo, hi);
        out[i * n + j] =
            s8 ? static_cast<uint8_t>(static_cast<int8_t>(q)) : static_cast<uint8_t>(q);
      }
    }
  }

  float alpha_;
  bool trans_a_, trans_b_;
  QPackedWeight packed_;
};

void matmul_to_float_shape(ShapeContext& c) {
  c.set(0, DataType::Float, matmul_shape_of(c.shape(0), c.shape(1)));
}

// [M, N]: float, or y_zero_point's type.
// QGemm's workspace: the int32 sums of Y (qgemm_parts) for these shapes.
uint64_t qgemm_workspace(const ShapeContext& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(3);
  if (a.size() != 2 || b.size() != 2) unknown("A or B not 2-D");
  return qgemm_parts(a[c.attr_int("transA", 0) ? 1 : 0], b[c.attr_int("transB", 0) ? 0 : 1])
      .bytes();
}

void qgemm_shape(ShapeContext& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(3);
  if (a.size() != 2 || b.size() != 2) unknown("A or B not 2-D");
  const int64_t m = a[c.attr_int("transA", 0) ? 1 : 0];
  const int64_t n = b[c.attr_int("transB", 0) ? 0 : 1];
  c.set(0, c.has_input(8) ? c.dtype(8) : DataType::Float, {m, n});
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "DynamicQuantizeMatMul",
                  .since = 1,
                  .min_inputs = 3,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float A; uint8, int8 B",
                  .shape = matmul_to_float_shape,
                  .create = make<DynamicQuantizeMatMul>});
// The same with an `activation` attribute (ops/elementwise/activation.h) applied to each finished
// tile: made by the graph optimizer from DynamicQuantizeMatMul and the activation reading it.
KILN_REGISTER_OP({.domain = "kiln",
                  .op = "DynamicQuantizeMatMul",
                  .since = 1,
                  .min_inputs = 3,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float A; uint8, int8 B",
                  .shape = matmul_to_float_shape,
                  .create = make<DynamicQuantizeMatMul>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "MatMulIntegerToFloat",
                  .since = 1,
                  .min_inputs = 4,
                  .max_inputs = 7,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 -> float",
                  .shape = matmul_to_float_shape,
                  .create = make<MatMulIntegerToFloat>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QGemm",
                  .since = 1,
                  .min_inputs = 5,
                  .max_inputs = 9,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 -> float, uint8, int8",
                  .shape = qgemm_shape,
                  .workspace = qgemm_workspace,
                  .create = make<QGemm>});

}  // namespace kiln::ops
