// ConvInteger and QLinearConv: N-d grouped convolution of quantized tensors after
// subtracting their zero points (padding therefore contributes zero).
//
// Each task builds the im2col patches of a block of output positions and multiplies them
// with the group's weights in double: the centred operands are small integers, so the sums
// are exact, and there is no int32 overflow to worry about.
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
using ColMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

struct ConvAttrs {
  std::string auto_pad;
  std::vector<int64_t> dilations, kernel_shape, pads, strides;
  int64_t group = 1;

  explicit ConvAttrs(const NodeInfo& info)
      : auto_pad(info.attr_string("auto_pad", "NOTSET")),
        dilations(info.attr_ints("dilations")),
        kernel_shape(info.attr_ints("kernel_shape")),
        pads(info.attr_ints("pads")),
        strides(info.attr_ints("strides")),
        group(info.attr_int("group", 1)) {
    if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
        auto_pad != "VALID") {
      info.fail("unknown auto_pad '" + auto_pad + "'");
    }
    if (group < 1) info.fail("group must be >= 1");
    for (int64_t v : dilations) {
      if (v < 1) info.fail("dilations must be >= 1");
    }
    for (int64_t v : strides) {
      if (v < 1) info.fail("strides must be >= 1");
    }
    for (int64_t v : pads) {
      if (v < 0) info.fail("pads must be >= 0");
    }
  }
};

struct ConvGeometry {
  int64_t N = 0, C = 0, M = 0, Cg = 0, Mg = 0;
  Shape in, kernel, out, stride, dil, pad_begin;  // spatial
  int64_t in_size = 1, kernel_size = 1, out_size = 1;
  Shape out_shape;
};

ConvGeometry geometry(const OpContext& ctx, const ConvAttrs& a, const Tensor& x, const Tensor& w) {
  if (x.rank() < 3) ctx.fail("X must have rank >= 3, got " + shape_to_string(x.shape()));
  if (w.rank() != x.rank())
    ctx.fail("W must have the rank of X, got " + shape_to_string(w.shape()));
  const size_t sp = x.rank() - 2;
  ConvGeometry g;
  g.N = x.dim(0), g.C = x.dim(1), g.M = w.dim(0);
  if (g.C % a.group != 0 || g.M % a.group != 0) ctx.fail("channels are not divisible by group");
  g.Cg = g.C / a.group, g.Mg = g.M / a.group;
  if (w.dim(1) != g.Cg) {
    ctx.fail("W has " + std::to_string(w.dim(1)) + " input channels per group, expected " +
             std::to_string(g.Cg));
  }
  auto per_dim = [&](const std::vector<int64_t>& v, size_t n, const char* what) {
    if (!v.empty() && v.size() != n) ctx.fail(std::string(what) + " has the wrong length");
  };
  per_dim(a.kernel_shape, sp, "kernel_shape");
  per_dim(a.dilations, sp, "dilations");
  per_dim(a.strides, sp, "strides");
  per_dim(a.pads, 2 * sp, "pads");
  g.out_shape = {g.N, g.M};
  for (size_t d = 0; d < sp; ++d) {
    const int64_t in = x.dim(d + 2), k = w.dim(d + 2);
    if (!a.kernel_shape.empty() && a.kernel_shape[d] != k) ctx.fail("kernel_shape differs from W");
    const int64_t s = a.strides.empty() ? 1 : a.strides[d];
    const int64_t dl = a.dilations.empty() ? 1 : a.dilations[d];
    const int64_t span = (k - 1) * dl + 1;
    int64_t pb = a.pads.empty() ? 0 : a.pads[d], pe = a.pads.empty() ? 0 : a.pads[d + sp];
    int64_t out = 0;
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out - 1) * s + span - in);
      pb = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      if (a.auto_pad == "VALID") pb = pe = 0;
      const int64_t room = in + pb + pe - span;
      out = room < 0 ? 0 : room / s + 1;
    }
    if (k < 1 || out < 1) ctx.fail("convolution output would be empty");
    g.in.push_back(in), g.kernel.push_back(k), g.out.push_back(out);
    g.stride.push_back(s), g.dil.push_back(dl), g.pad_begin.push_back(pb);
    g.in_size *= in, g.kernel_size *= k, g.out_size *= out;
    g.out_shape.push_back(out);
  }
  return g;
}

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  lowp::read_as_doubles(t.contiguous(), 0, t.numel(), v.data());
  return v;
}

// x - x_zero_point (a scalar).
std::vector<double> centered_x(const OpContext& ctx, const Tensor& x, const Tensor* zp) {
  std::vector<double> v = as_doubles(x);
  if (!zp) return v;
  if (zp->numel() != 1) ctx.fail("x_zero_point must be a scalar");
  if (zp->dtype() != x.dtype()) ctx.fail("x_zero_point type differs from x's");
  const double z = as_doubles(*zp)[0];
  for (double& e : v) e -= z;
  return v;
}

// w - w_zero_point (a scalar or one per output channel).
std::vector<double> centered_w(const OpContext& ctx, const Tensor& w, const Tensor* zp) {
  std::vector<double> v = as_doubles(w);
  if (!zp) return v;
  if (zp->dtype() != w.dtype()) ctx.fail("w_zero_point type differs from w's");
  const std::vector<double> z = as_doubles(*zp);
  const int64_t M = w.dim(0);
  if (z.size() != 1 && (zp->rank() != 1 || static_cast<int64_t>(z.size()) != M)) {
    ctx.fail("w_zero_point must be a scalar or have one value per output channel");
  }
  const int64_t per = M > 0 ? w.numel() / M : 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    v[static_cast<size_t>(i)] -= z[z.size() == 1 ? 0 : static_cast<size_t>(i / per)];
  }
  return v;
}

// Calls emit(n, g, p0, block) with block = [positions, Mg] for output positions p0...
template <typename Emit>
void conv(const ConvGeometry& g, int64_t group, const std::vector<double>& x,
          const std::vector<double>& w, Emit&& emit) {
  const size_t sp = g.in.size();
  const int64_t ck = g.Cg * g.kernel_size;
  constexpr int64_t kPos = 64;
  const int64_t pblocks = (g.out_size + kPos - 1) / kPos;
  const int64_t tasks = g.N * group * pblocks;
  parallel_for(tasks, grain_for(kPos * ck * g.Mg, 1 << 16), [&](int64_t t0, int64_t t1) {
    RowMat col, res;
    std::vector<int64_t> o(sp), kk(sp);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / (group * pblocks), gi = (t / pblocks) % group;
      const int64_t p0 = (t % pblocks) * kPos, np = std::min(kPos, g.out_size - p0);
      col.resize(np, ck);
      for (int64_t p = 0; p < np; ++p) {
        int64_t rem = p0 + p;
        for (size_t d = sp; d-- > 0;) o[d] = rem % g.out[d], rem /= g.out[d];
        double* row = col.data() + p * ck;
        for (int64_t k = 0; k < g.kernel_size; ++k) {
          int64_t kr = k, off = 0;
          bool inside = true;
          for (size_t d = sp; d-- > 0;) {
            kk[d] = kr % g.kernel[d], kr /= g.kernel[d];
          }
          for (size_t d = 0; d < sp; ++d) {
            const int64_t i = o[d] * g.stride[d] - g.pad_begin[d] + kk[d] * g.dil[d];
            if (i < 0 || i >= g.in[d]) inside = false;
            off = off * g.in[d] + i;
          }
          for (int64_t c = 0; c < g.Cg; ++c) {
            const int64_t ch = gi * g.Cg + c;
            row[c * g.kernel_size + k] =
                inside ? x[static_cast<size_t>((n * g.C + ch) * g.in_size + off)] : 0.0;
          }
        }
      }
      Eigen::Map<const ColMat> wt(w.data() + gi * g.Mg * ck, ck, g.Mg);  // W_g transposed
      res.resize(np, g.Mg);
      res.noalias() = col * wt;
      emit(n, gi, p0, res);
    }
  });
}

class ConvInteger final : public Kernel {
 public:
  explicit ConvInteger(const NodeInfo& info) : attrs_(info) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    for (const Tensor* t : {&x, &w}) {
      if (t->dtype() != DataType::UInt8 && t->dtype() != DataType::Int8) {
        throw_unsupported_type(t->dtype(), "ConvInteger input");
      }
    }
    const ConvGeometry g = geometry(ctx, attrs_, x, w);
    const std::vector<double> cx = centered_x(ctx, x, ctx.has_input(2) ? &ctx.input(2) : nullptr);
    const std::vector<double> cw = centered_w(ctx, w, ctx.has_input(3) ? &ctx.input(3) : nullptr);
    Tensor& y = ctx.output(0, DataType::Int32, g.out_shape);
    int32_t* py = y.data<int32_t>();
    conv(g, attrs_.group, cx, cw, [&](int64_t n, int64_t gi, int64_t p0, const RowMat& r) {
      for (int64_t p = 0; p < r.rows(); ++p) {
        for (int64_t m = 0; m < g.Mg; ++m) {
          const int64_t ch = gi * g.Mg + m;
          py[(n * g.M + ch) * g.out_size + p0 + p] =
              static_cast<int32_t>(static_cast<int64_t>(r(p, m)));
        }
      }
    });
  }

 private:
  ConvAttrs attrs_;
};

class QLinearConv final : public Kernel {
 public:
  explicit QLinearConv(const NodeInfo& info) : attrs_(info) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(3);
    for (const Tensor* t : {&x, &w}) {
      if (t->dtype() != DataType::UInt8 && t->dtype() != DataType::Int8) {
        throw_unsupported_type(t->dtype(), "QLinearConv input");
      }
    }
    const Tensor* y_zp = ctx.has_input(7) ? &ctx.input(7) : nullptr;
    const DataType out_t = y_zp ? y_zp->dtype() : x.dtype();
    if (out_t != DataType::UInt8 && out_t != DataType::Int8) {
      throw_unsupported_type(out_t, "QLinearConv output");
    }
    const ConvGeometry g = geometry(ctx, attrs_, x, w);
    const std::vector<double> cx = centered_x(ctx, x, ctx.has_input(2) ? &ctx.input(2) : nullptr);
    const std::vector<double> cw = centered_w(ctx, w, ctx.has_input(5) ? &ctx.input(5) : nullptr);
    const Tensor& xs = ctx.input(1);
    const Tensor& ws = ctx.input(4);
    const Tensor& ys = ctx.input(6);
    for (const Tensor* s : {&xs, &ws, &ys}) {
      if (s->dtype() != DataType::Float) throw_unsupported_type(s->dtype(), "QLinearConv scale");
    }
    if (xs.numel() != 1 || ys.numel() != 1) ctx.fail("x_scale and y_scale must be scalars");
    const std::vector<double> wsv = as_doubles(ws);
    if (wsv.size() != 1 && (ws.rank() != 1 || static_cast<int64_t>(wsv.size()) != g.M)) {
      ctx.fail("w_scale must be a scalar or have one value per output channel");
    }
    if (y_zp && y_zp->numel() != 1) ctx.fail("y_zero_point must be a scalar");
    const double zy = y_zp ? as_doubles(*y_zp)[0] : 0.0;
    std::vector<double> bias(static_cast<size_t>(g.M), 0.0);
    if (ctx.has_input(8)) {
      const Tensor& b = ctx.input(8);
      if (b.dtype() != DataType::Int32) throw_unsupported_type(b.dtype(), "QLinearConv bias");
      if (b.numel() != g.M) ctx.fail("bias must have one value per output channel");
      bias = as_doubles(b);
    }
    // numpy: float32 multiplier, applied to the int32 result in float64.
    std::vector<double> mult(static_cast<size_t>(g.M));
    const float fxs = static_cast<float>(as_doubles(xs)[0]),
                fys = static_cast<float>(as_doubles(ys)[0]);
    for (int64_t m = 0; m < g.M; ++m) {
      const float wm = static_cast<float>(wsv[wsv.size() == 1 ? 0 : static_cast<size_t>(m)]);
      mult[static_cast<size_t>(m)] = static_cast<double>((fxs * wm) / fys);
    }
    const double lo = out_t == DataType::Int8 ? -128 : 0, hi = out_t == DataType::Int8 ? 127 : 255;
    Tensor& y = ctx.output(0, out_t, g.out_shape);
    std::byte* py = y.raw_data();
    conv(g, attrs_.group, cx, cw, [&](int64_t n, int64_t gi, int64_t p0, const RowMat& r) {
      for (int64_t p = 0; p < r.rows(); ++p) {
        for (int64_t m = 0; m < g.Mg; ++m) {
          const int64_t ch = gi * g.Mg + m;
          const double acc = static_cast<double>(
              static_cast<int32_t>(static_cast<int64_t>(r(p, m) + bias[static_cast<size_t>(ch)])));
          const double v = acc * mult[static_cast<size_t>(ch)] + zy;
          const double q = std::isnan(v) ? 0.0 : std::nearbyint(std::clamp(v, lo, hi));
          const int64_t at = (n * g.M + ch) * g.out_size + p0 + p;
          if (out_t == DataType::Int8) {
            reinterpret_cast<int8_t*>(py)[at] = static_cast<int8_t>(q);
          } else {
            reinterpret_cast<uint8_t*>(py)[at] = static_cast<uint8_t>(q);
          }
        }
      }
    });
  }

 private:
  ConvAttrs attrs_;
};

}  // namespace

KILN_REGISTER_OP({.op = "ConvInteger",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 -> int32",
                  .create = make<ConvInteger>});
KILN_REGISTER_OP({.op = "QLinearConv",
                  .since = 10,
                  .min_inputs = 8,
                  .max_inputs = 9,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 with float scales, int32 bias",
                  .create = make<QLinearConv>});

}  // namespace kiln::ops
