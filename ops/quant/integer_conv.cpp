// ConvInteger and QLinearConv: N-d grouped convolution of quantized tensors after
// subtracting their zero points (padding therefore contributes zero).
//
// Each (image, group) is one product of the int8 GEMM layer (ops/math/qgemm.h): the group's
// filter [Mg x Cg * kernel] is the packed A, packed once when the session is planned when it
// is constant (shared through the weights cache), and the input patches are lowered block
// by block into B (im2col without the whole matrix), padding reading the input's zero
// point. Sums are exact in int32 for every signedness and zero point (per tensor, or per
// output channel for the filter); QLinearConv adds its bias and requantizes each tile as it
// is produced (scale in float, rounding half to even, saturating).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/geometry.h"
#include "ops/core/workspace.h"
#include "ops/math/qgemm.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

struct ConvAttrs {
  WindowAttrs window;
  int64_t group = 1;

  explicit ConvAttrs(const NodeInfo& info)
      : window(window_attrs(info.node())), group(info.attr_int("group", 1)) {
    if (group < 1 || group > kMaxWindowAttr) info.fail("group must be in [1, 2^31]");
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
  ConvGeometry g;
  g.N = x.dim(0), g.C = x.dim(1), g.M = w.dim(0);
  if (g.C % a.group != 0 || g.M % a.group != 0) ctx.fail("channels are not divisible by group");
  g.Cg = g.C / a.group, g.Mg = g.M / a.group;
  if (w.dim(1) != g.Cg) {
    ctx.fail("W has " + std::to_string(w.dim(1)) + " input channels per group, expected " +
             std::to_string(g.Cg));
  }
  const std::vector<WindowAxis> axes = forward_windows(
      spatial_dims(x.shape()), conv_kernel(a.window, spatial_dims(w.shape())), a.window);
  for (const WindowAxis& d : axes) {
    g.in.push_back(d.in), g.kernel.push_back(d.kernel), g.out.push_back(d.out);
    g.stride.push_back(d.stride), g.dil.push_back(d.dilation), g.pad_begin.push_back(d.pad_begin);
    g.in_size *= d.in, g.kernel_size *= d.kernel, g.out_size *= d.out;
  }
  g.out_shape = windowed_shape(g.N, g.M, axes);
  return g;
}

bool is_int8(DataType t) {
  return t == DataType::UInt8 || t == DataType::Int8;
}

// The elements of an 8-bit tensor as int32.
std::vector<int32_t> int8_values(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<int32_t> v(static_cast<size_t>(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) {
    v[static_cast<size_t>(i)] =
        t.dtype() == DataType::Int8 ? c.data<const int8_t>()[i] : c.data<const uint8_t>()[i];
  }
  return v;
}

// x_zero_point (a scalar of x's type; 0 when absent).
int32_t x_zero_point(const OpContext& ctx, const Tensor& x, const Tensor* zp) {
  if (!zp) return 0;
  if (zp->numel() != 1) ctx.fail("x_zero_point must be a scalar");
  if (zp->dtype() != x.dtype()) ctx.fail("x_zero_point type differs from x's");
  return int8_values(*zp)[0];
}

// w_zero_point: one value, or one per output channel (empty when absent).
std::vector<int32_t> w_zero_points(const OpContext& ctx, const Tensor& w, const Tensor* zp) {
  if (!zp) return {};
  if (zp->dtype() != w.dtype()) ctx.fail("w_zero_point type differs from w's");
  const int64_t M = w.dim(0);
  if (zp->numel() != 1 && (zp->rank() != 1 || zp->numel() != M)) {
    ctx.fail("w_zero_point must be a scalar or have one value per output channel");
  }
  return int8_values(*zp);
}

// The filter of each group as a packed int8 A ([Mg x Cg * kernel] each, one after another).
// Bytes of pack_filter's form of a filter of shape `w` in `groups` groups.
int64_t packed_filter_bytes(const Shape& w, int64_t groups) {
  const int64_t m = w.empty() ? 0 : w[0];
  const int64_t mg = m / groups, kk = m == 0 ? 0 : shape_numel(w) / m;
  return groups * math::QPackedA::packed_bytes(mg, kk, math::kernels().int8_gemm);
}

// The filter packed per group (QPackedA panels) into `out` (packed_filter_bytes bytes).
void pack_filter_into(const Tensor& w, int64_t groups, uint8_t* out) {
  const Tensor c = w.contiguous();
  const math::MathKernels& t = math::kernels();
  const int64_t mg = c.dim(0) / groups, kk = c.numel() / std::max<int64_t>(1, c.dim(0));
  const int64_t per = math::QPackedA::packed_bytes(mg, kk, t.int8_gemm);
  const auto* src = reinterpret_cast<const uint8_t*>(c.raw_data());
  for (int64_t g = 0; g < groups; ++g) {
    math::QPackedA::pack_into(
        math::QMatrixView::row_major(src + g * mg * kk, mg, kk, kk, c.dtype() == DataType::Int8),
        out + g * per, t);
  }
}

Tensor pack_filter(const Tensor& w, int64_t groups) {
  const int64_t bytes = packed_filter_bytes(w.shape(), groups);
  Tensor packed(DataType::UInt8, Shape{bytes},
                Storage::heap_uninitialized(static_cast<size_t>(bytes)));
  pack_filter_into(w, groups, reinterpret_cast<uint8_t*>(packed.raw_data()));
  packed.storage()->set_read_only();
  return packed;
}

// The weights cache's name for pack_filter's layout: the level's tile and the groups.
std::string filter_packing_name(int64_t groups) {
  const math::MathKernels& t = math::kernels();
  return std::string("qconv-filter-") + math::isa_name(t.isa) + "-" + t.int8_gemm.layout + "-mr" +
         std::to_string(t.int8_gemm.mr) + "-g" + std::to_string(groups);
}

// Lowers the input patches of one (image, group) into rows (channel, kernel offset) x output
// positions [j0, j0 + nc) at `out` (row stride nc). `x` points at the group's first input
// channel; positions outside the input read `pad`, the input's zero point, which the
// zero-point correction turns into zero.
void fill_patches(const uint8_t* x, const ConvGeometry& g, int64_t j0, int64_t nc, uint8_t pad,
                  uint8_t* out) {
  const size_t sp = g.in.size();
  const size_t last = sp - 1;
  const bool pointwise =
      g.kernel_size == 1 &&
      std::all_of(g.stride.begin(), g.stride.end(), [](int64_t v) { return v == 1; }) &&
      std::all_of(g.pad_begin.begin(), g.pad_begin.end(), [](int64_t v) { return v == 0; }) &&
      g.in == g.out;
  if (pointwise) {
    // 1x1, unit stride, no padding: each row is a run of one input channel.
    for (int64_t c = 0; c < g.Cg; ++c) std::memcpy(out + c * nc, x + c * g.in_size + j0, nc);
    return;
  }
  // The block's runs of positions along the innermost output dimension, the same for every
  // row: where each starts in the block, its length, its first output column and its other
  // output coordinates.
  struct Run {
    int64_t at, len, ow0;
  };
  std::vector<Run> runs;
  std::vector<int64_t> outer;  // sp - 1 coordinates per run
  const int64_t ow = g.out[last], iw = g.in[last], sw = g.stride[last];
  for (int64_t p = j0; p < j0 + nc;) {
    int64_t rem = p / ow;
    const int64_t ow0 = p % ow;
    const size_t first = outer.size();
    outer.resize(first + last);
    for (size_t d = last; d-- > 0;) outer[first + d] = rem % g.out[d], rem /= g.out[d];
    const int64_t len = std::min(j0 + nc - p, ow - ow0);
    runs.push_back({p - j0, len, ow0});
    p += len;
  }
  std::vector<int64_t> kk(sp);
  uint8_t* row = out;
  for (int64_t c = 0; c < g.Cg; ++c) {
    const uint8_t* xc = x + c * g.in_size;
    for (int64_t k = 0; k < g.kernel_size; ++k, row += nc) {
      int64_t kr = k;
      for (size_t d = sp; d-- > 0;) kk[d] = kr % g.kernel[d], kr /= g.kernel[d];
      const int64_t base_w = kk[last] * g.dil[last] - g.pad_begin[last];
      for (size_t r = 0; r < runs.size(); ++r) {
        const Run& run = runs[r];
        uint8_t* dst = row + run.at;
        const int64_t* o = outer.data() + r * last;
        int64_t off = 0;
        bool inside = true;
        for (size_t d = 0; d < last; ++d) {
          const int64_t i = o[d] * g.stride[d] - g.pad_begin[d] + kk[d] * g.dil[d];
          inside = inside && i >= 0 && i < g.in[d];
          off = off * g.in[d] + i;
        }
        if (!inside) {
          std::memset(dst, pad, static_cast<size_t>(run.len));
          continue;
        }
        // Positions [lo, hi) of the run read inside the input row; the others are padding.
        const uint8_t* src = xc + off * iw;
        const int64_t first = run.ow0 * sw + base_w;  // input column of the run's start
        const int64_t lo = std::min(run.len, first >= 0 ? 0 : (-first + sw - 1) / sw);
        const int64_t hi =
            std::clamp<int64_t>(first >= iw ? 0 : (iw - first + sw - 1) / sw, lo, run.len);
        if (lo > 0) std::memset(dst, pad, static_cast<size_t>(lo));
        if (sw == 1) {
          std::memcpy(dst + lo, src + first + lo, static_cast<size_t>(hi - lo));
        } else {
          for (int64_t t = lo; t < hi; ++t) dst[t] = src[first + t * sw];
        }
        if (hi < run.len) std::memset(dst + hi, pad, static_cast<size_t>(run.len - hi));
      }
    }
  }
}

// The requantization of QLinearConv: per output channel multipliers and one zero point.
struct ConvRequant {
  std::vector<float> scales;  // M values
  int32_t zero_point = 0;
  bool y_signed = false;
};

// Y for every image and group: int32 into `y32`, or requantized into `y8` with `rq`.
// `filters` holds pack_filter's form of w; `w_zp` is empty, one value, or one per channel;
// `bias` (M values) may be null.
void convolve(const ConvGeometry& g, int64_t groups, const Tensor& x, const Tensor& w,
              const uint8_t* filters, int32_t x_zp, const std::vector<int32_t>& w_zp,
              const int32_t* bias, int32_t* y32, uint8_t* y8, const ConvRequant* rq) {
  const math::MathKernels& t = math::kernels();
  const int64_t ck = g.Cg * g.kernel_size, P = g.out_size;
  const int64_t per = math::QPackedA::packed_bytes(g.Mg, ck, t.int8_gemm);
  const bool x_signed = x.dtype() == DataType::Int8, w_signed = w.dtype() == DataType::Int8;
  const auto* xd = reinterpret_cast<const uint8_t*>(x.raw_data());
  const auto pad = static_cast<uint8_t>(x_zp);
  const int64_t units = g.N * groups;
  const double work = static_cast<double>(units) * static_cast<double>(g.Mg) *
                      static_cast<double>(ck) * static_cast<double>(P) / 4;
  const int tasks = math::task_count(work);
  // Many (image, group) units: one single-threaded product each; else one after another,
  // each split across the threads.
  const bool by_unit = tasks > 1 && units >= 2 * tasks;
  auto unit_product = [&](int64_t unit) {
    const int64_t n = unit / groups, gi = unit % groups;
    const uint8_t* xg = xd + (n * g.C + gi * g.Cg) * g.in_size;
    const math::QPackedA a(filters + gi * per, g.Mg, ck, w_signed);
    math::QGemmOptions o;
    if (by_unit) o.max_threads = 1;
    o.b_zero = x_zp;
    if (w_zp.size() == 1) o.a_zero = w_zp[0];
    if (w_zp.size() > 1) o.a_zeros = w_zp.data() + gi * g.Mg;
    o.row_bias = bias ? bias + gi * g.Mg : nullptr;
    const int64_t first = (n * g.M + gi * g.Mg) * P;
    math::QGemmOutput out;
    if (rq) {
      out.y = y8 + first;
      out.ldy = P;
      out.y_signed = rq->y_signed;
      out.scales = rq->scales.data() + gi * g.Mg;
      out.scale_rs = 1;
      out.y_zero_points = &rq->zero_point;
    } else {
      out = math::QGemmOutput::int32(y32 + first, P);
    }
    math::qgemm(
        a, P, x_signed,
        [&](int64_t j0, int64_t nc, uint8_t* dst) { fill_patches(xg, g, j0, nc, pad, dst); }, out,
        o);
  };
  if (by_unit) {
    parallel_for(units, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t u = lo; u < hi; ++u) unit_product(u);
    });
  } else {
    for (int64_t u = 0; u < units; ++u) unit_product(u);
  }
}

// Whether a constant filter `w` is packed once per group through the weights cache.
bool packable_filter(const Tensor* w, int64_t groups) {
  return w && w->rank() >= 3 && is_int8(w->dtype()) && w->numel() > 0 && groups > 0 &&
         w->dim(0) % groups == 0;
}

// A constant filter packed once per group through the weights cache (null when the filter
// is not a constant 8-bit tensor).
std::shared_ptr<const Tensor> prepare_filter(const NodeInfo& info, size_t input, int64_t groups) {
  if (!packable_filter(info.constant_input(input), groups)) return nullptr;
  return info.prepared_input(input, filter_packing_name(groups),
                             [groups](const Tensor& f) { return pack_filter(f, groups); });
}

// The workspace, as the kernels and filter_workspace lay it out: the filter packed at run
// time unless it was packed at load (`at_load`).
WorkspaceLayout filter_parts(const Shape& w, int64_t groups, bool at_load) {
  WorkspaceLayout l;
  if (!at_load) l.add(DataType::UInt8, packed_filter_bytes(w, groups));
  return l;
}

// The filters as pack_filter's form: the prepared one, else packed now into the workspace.
const uint8_t* filters_for(const std::shared_ptr<const Tensor>& prepared, const Tensor& w,
                           int64_t groups, const Workspace& space) {
  if (prepared) return reinterpret_cast<const uint8_t*>(prepared->raw_data());
  uint8_t* room = space.data<uint8_t>(0);
  pack_filter_into(w, groups, room);
  return room;
}

class ConvInteger final : public Kernel {
 public:
  explicit ConvInteger(const NodeInfo& info)
      : attrs_(info),
        filters_(prepare_filter(info, 1, attrs_.group)),
        at_load_(filters_ && info.is_initializer(1)) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    for (const Tensor* t : {&x, &w}) {
      if (!is_int8(t->dtype())) throw_unsupported_type(t->dtype(), "ConvInteger input");
    }
    const ConvGeometry g = geometry(ctx, attrs_, x, w);
    const int32_t xz = x_zero_point(ctx, x, ctx.has_input(2) ? &ctx.input(2) : nullptr);
    const std::vector<int32_t> wz =
        w_zero_points(ctx, w, ctx.has_input(3) ? &ctx.input(3) : nullptr);
    Tensor& y = ctx.output(0, DataType::Int32, g.out_shape);
    const WorkspaceLayout layout = filter_parts(w.shape(), attrs_.group, at_load_);
    const Workspace space(ctx, layout);
    if (y.numel() == 0) return;
    const uint8_t* filters = filters_for(filters_, w, attrs_.group, space);
    const Tensor xc = x.contiguous();
    convolve(g, attrs_.group, xc, w, filters, xz, wz, nullptr, y.data<int32_t>(), nullptr, nullptr);
  }

 private:
  ConvAttrs attrs_;
  std::shared_ptr<const Tensor> filters_;
  bool at_load_;  // the filter is an initializer packed at load: no room for it in the workspace
};

class QLinearConv final : public Kernel {
 public:
  explicit QLinearConv(const NodeInfo& info)
      : attrs_(info),
        filters_(prepare_filter(info, 3, attrs_.group)),
        at_load_(filters_ && info.is_initializer(3)) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(3);
    for (const Tensor* t : {&x, &w}) {
      if (!is_int8(t->dtype())) throw_unsupported_type(t->dtype(), "QLinearConv input");
    }
    const Tensor* y_zp = ctx.has_input(7) ? &ctx.input(7) : nullptr;
    const DataType out_t = y_zp ? y_zp->dtype() : x.dtype();
    if (!is_int8(out_t)) throw_unsupported_type(out_t, "QLinearConv output");
    const ConvGeometry g = geometry(ctx, attrs_, x, w);
    const int32_t xz = x_zero_point(ctx, x, ctx.has_input(2) ? &ctx.input(2) : nullptr);
    const std::vector<int32_t> wz =
        w_zero_points(ctx, w, ctx.has_input(5) ? &ctx.input(5) : nullptr);
    const Tensor& xs = ctx.input(1);
    const Tensor& ws = ctx.input(4);
    const Tensor& ys = ctx.input(6);
    for (const Tensor* s : {&xs, &ws, &ys}) {
      if (s->dtype() != DataType::Float) throw_unsupported_type(s->dtype(), "QLinearConv scale");
    }
    if (xs.numel() != 1 || ys.numel() != 1) ctx.fail("x_scale and y_scale must be scalars");
    if (ws.numel() != 1 && (ws.rank() != 1 || ws.numel() != g.M)) {
      ctx.fail("w_scale must be a scalar or have one value per output channel");
    }
    if (y_zp && y_zp->numel() != 1) ctx.fail("y_zero_point must be a scalar");
    std::vector<int32_t> bias;
    if (ctx.has_input(8)) {
      const Tensor& b = ctx.input(8);
      if (b.dtype() != DataType::Int32) throw_unsupported_type(b.dtype(), "QLinearConv bias");
      if (b.numel() != g.M) ctx.fail("bias must have one value per output channel");
      bias = b.contiguous().to_vector<int32_t>();
    }
    // The multiplier of each output channel, formed in float as numpy forms it.
    ConvRequant rq;
    rq.y_signed = out_t == DataType::Int8;
    rq.zero_point = y_zp ? int8_values(*y_zp)[0] : 0;
    const Tensor wsc = ws.contiguous();
    const float fxs = xs.contiguous().data<const float>()[0];
    const float fys = ys.contiguous().data<const float>()[0];
    rq.scales.resize(static_cast<size_t>(g.M));
    for (int64_t m = 0; m < g.M; ++m) {
      const float wm = wsc.data<const float>()[ws.numel() == 1 ? 0 : m];
      rq.scales[static_cast<size_t>(m)] = (fxs * wm) / fys;
    }
    Tensor& y = ctx.output(0, out_t, g.out_shape);
    const WorkspaceLayout layout = filter_parts(w.shape(), attrs_.group, at_load_);
    const Workspace space(ctx, layout);
    if (y.numel() == 0) return;
    const uint8_t* filters = filters_for(filters_, w, attrs_.group, space);
    const Tensor xc = x.contiguous();
    convolve(g, attrs_.group, xc, w, filters, xz, wz, bias.empty() ? nullptr : bias.data(), nullptr,
             reinterpret_cast<uint8_t*>(y.raw_data()), &rq);
  }

 private:
  ConvAttrs attrs_;
  std::shared_ptr<const Tensor> filters_;
  bool at_load_;  // the filter is an initializer packed at load: no room for it in the workspace
};

// ConvInteger: int32 sums of the convolution's shape.
void conv_integer_shape(ShapeContext& c) {
  c.set(0, DataType::Int32, conv_output_shape(c.shape(0), c.shape(1), window_attrs(c.node())));
}

// QLinearConv: X is input 0 and W input 3; the output has y_zero_point's type.
void qlinear_conv_shape(ShapeContext& c) {
  c.set(0, c.has_input(7) ? c.dtype(7) : c.dtype(0),
        conv_output_shape(c.shape(0), c.shape(3), window_attrs(c.node())));
}

// The kernels' workspace (filter_parts) for filter input `input`.
template <size_t kInput>
uint64_t filter_workspace(const ShapeContext& c) {
  const Shape& w = c.shape(kInput);
  const int64_t groups = c.attr_int("group", 1);
  if (w.size() < 3 || groups < 1 || w[0] % groups != 0) unknown("bad filter or group");
  return filter_parts(w, groups, packable_filter(c.constant_input(kInput), groups)).bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "ConvInteger",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 -> int32",
                  .shape = conv_integer_shape,
                  .workspace = filter_workspace<1>,
                  .create = make<ConvInteger>});
KILN_REGISTER_OP({.op = "QLinearConv",
                  .since = 10,
                  .min_inputs = 8,
                  .max_inputs = 9,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8 with float scales, int32 bias",
                  .shape = qlinear_conv_shape,
                  .workspace = filter_workspace<3>,
                  .create = make<QLinearConv>});

}  // namespace kiln::ops
