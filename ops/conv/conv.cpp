// Conv: 1-D, 2-D and 3-D convolution with groups, strides, dilations, explicit or automatic
// padding, and an optional bias.
//
// General float convolutions are products in the GEMM layer (ops/math/gemm.h): the filter
// of each group is packed once when the session is planned (shared through the weights
// cache), and the input patches are lowered straight into the GEMM's B panels block by
// block (im2col without an intermediate matrix); 1x1 convolutions with unit stride and no
// padding pack the input itself. Bias is the GEMM's row epilogue. Convolutions with one
// input channel per group (depthwise) run as direct loops, except long 1-D windows over one
// channel with several filters (audio front ends: use_strided_windows), which are products
// that read the signal as a strided matrix; double uses plain loops.
//
// kiln.FusedConv (made by the graph optimizer, engine/passes/fusion/conv.cpp) is a float
// Conv with an `activation` attribute and an optional fourth input Z added before it:
// y = activation(conv(x, w) + bias + Z), as one pass over y (the GEMM accumulates onto Z and
// applies the activation to each tile while it is in cache). Z with the output's shape is
// overwritten in place when the executor allows; a Z that broadcasts is added afterwards.
//
// com.microsoft.FusedConv (onnxruntime's contrib op; contrib_ops/cpu/fused_conv.cc) is the same
// kernel with onnxruntime's activations: the `activation` string is Relu, Tanh, Sigmoid, or
// LeakyRelu (activation_params: alpha), Clip (min, max) or HardSigmoid (alpha, beta), which
// must come with exactly that many activation_params; absent: none. Z must have the output's
// shape. The first three are fused into the GEMM; the parameterized ones are a second pass
// over y.
#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/conv/conv_direct.h"
#include "ops/conv/conv_filter.h"
#include "ops/conv/conv_gemm.h"
#include "ops/conv/conv_small_maps.h"
#include "ops/conv/conv_strategy.h"
#include "ops/conv/conv_wide.h"
#include "ops/conv/wide_layout.h"
#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/geometry.h"
#include "ops/core/workspace.h"
#include "ops/elementwise/activation.h"

namespace kiln::ops {
namespace {

// The float paths: which one a convolution takes and the types they share
// (ops/conv/conv_strategy.h), the filter's packed forms (ops/conv/conv_filter.h), the direct loops
// (ops/conv/conv_direct.h) and the GEMM paths (ops/conv/conv_gemm.h).
using namespace convolution;

// Lowers input patches of output positions [p0, p1) of one (image, group) into `col`
// ([channels * kernel] x (p1 - p0), row-major).
template <typename T>
void im2col(const T* x, int64_t channels, const Geometry& g, int64_t p0, int64_t p1, T* col) {
  const int64_t blk = p1 - p0, ip = g.in_size(), ohw = g.out[1] * g.out[2];
  T* dst = col;
  for (int64_t c = 0; c < channels; ++c) {
    const T* xc = x + c * ip;
    for (int64_t kd = 0; kd < g.k[0]; ++kd) {
      for (int64_t kh = 0; kh < g.k[1]; ++kh) {
        for (int64_t kw = 0; kw < g.k[2]; ++kw, dst += blk) {
          const int64_t wbase = kw * g.dil[2] - g.pad[2];
          T* d = dst;
          for (int64_t p = p0; p < p1;) {
            const int64_t od = p / ohw, oh = (p % ohw) / g.out[2], ow = p % g.out[2];
            const int64_t run = std::min(p1 - p, g.out[2] - ow);
            const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
            const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
            if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
              std::fill(d, d + run, T(0));
            } else {
              const int64_t base = ow * g.stride[2] + wbase;  // input column of j = 0
              const T* row = xc + (id * g.in[1] + ih) * g.in[2];
              const int64_t lo = first_at_least(base, g.stride[2], 0);
              const int64_t hi = first_at_least(base, g.stride[2], g.in[2]);
              gather_row(d, run, row, base, g.stride[2], lo, hi);
            }
            d += run;
            p += run;
          }
        }
      }
    }
  }
}

// Y[n, m, :] for all n and m; x, w, bias (may be null) and y contiguous. `packed` holds the
// float filter of every group packed for the GEMM (null for depthwise and double).
// `col` (double only) holds kk x op values: one (image, group) lowered.
template <typename T>
void convolve(const T* x, const T* w, const float* packed, const T* bias, T* y, const Sizes& s,
              const Geometry& g, const ConvEpilogue& e = {}, OpContext* ctx = nullptr,
              const ConvSpace& space = {}, T* col = nullptr) {
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size(), kk = s.cg * kp;
  if (op == 0 || s.m == 0 || s.n == 0) return;

  const int64_t units = s.n * s.groups;
  if constexpr (std::is_same_v<T, float>) {
    if (use_direct(s, g)) {
      direct_convolve(x, w, bias, y, s, g, e, space.wide);
    } else {
      gemm_convolve(ctx, x, packed, bias, y, s, g, e, space);
    }
  } else {
    // Double: lower each (image, group) whole, then plain loops (never fused).
    (void)packed;
    (void)e;
    (void)ctx;
    (void)space;
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t n = unit / s.groups, grp = unit % s.groups;
      im2col(x + (n * s.c + grp * s.cg) * ip, s.cg, g, 0, op, col);
      parallel_for(s.mg, grain_for(kk * op), [&](int64_t m0, int64_t m1) {
        for (int64_t mi = m0; mi < m1; ++mi) {
          const int64_t mo = grp * s.mg + mi;
          T* yr = y + (n * s.m + mo) * op;
          std::fill(yr, yr + op, bias ? bias[mo] : T(0));
          const T* wr = w + mo * kk;
          for (int64_t q = 0; q < kk; ++q) {
            const T wv = wr[q];
            const T* cr = col + q * op;
            for (int64_t j = 0; j < op; ++j) yr[j] += wv * cr[j];
          }
        }
      });
    }
  }
}

// An activation with parameters (onnxruntime's LeakyRelu, Clip, HardSigmoid), applied after
// the product.
struct ParamActivation {
  enum class Kind : uint8_t { None, LeakyRelu, Clip, HardSigmoid } kind = Kind::None;
  float a = 0, b = 0;

  void apply(float* y, int64_t n) const {
    switch (kind) {
      case Kind::None:
        return;
      case Kind::LeakyRelu:
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] >= 0 ? y[i] : a * y[i];
        return;
      case Kind::Clip:
        for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(y[i], a), b);
        return;
      case Kind::HardSigmoid:
        for (int64_t i = 0; i < n; ++i) y[i] = std::min(1.0f, std::max(0.0f, a * y[i] + b));
        return;
    }
  }
};

// com.microsoft.FusedConv's activation (onnxruntime's GetFusedActivationAttr): the fused one
// in `fused`, a parameterized one in `post`.
void parse_ort_activation(const NodeInfo& info, math::Activation& fused, ParamActivation& post) {
  const std::string a = info.attr_string("activation", "");
  fused = math::Activation::None;
  if (a.empty()) return;
  if (a == "Relu") fused = math::Activation::Relu;
  if (a == "Tanh") fused = math::Activation::Tanh;
  if (a == "Sigmoid") fused = math::Activation::Sigmoid;
  if (fused != math::Activation::None) return;
  size_t count = 2;
  if (a == "LeakyRelu") {
    post.kind = ParamActivation::Kind::LeakyRelu;
    count = 1;
  } else if (a == "Clip") {
    post.kind = ParamActivation::Kind::Clip;
  } else if (a == "HardSigmoid") {
    post.kind = ParamActivation::Kind::HardSigmoid;
  } else {
    info.fail("unknown activation '" + a + "'", ErrorKind::Unsupported);
  }
  const std::vector<float> params = info.attr_floats("activation_params");
  if (params.size() != count) {
    info.fail(a + " needs " + std::to_string(count) + " activation_params, got " +
              std::to_string(params.size()));
  }
  post.a = params[0];
  post.b = count > 1 ? params[1] : 0.0f;
}

// Whether a constant filter is packed for the GEMM once, at load (not for the direct
// convolutions, which read it as it is; see use_direct).
bool packable_filter(const Tensor& w, int64_t groups) {
  return w.rank() >= 3 && w.numel() > 0 && w.dim(0) % groups == 0 &&
         ((w.dim(1) > 1 && w.dim(0) / groups > 2) || strided_window_filter(w, groups)) &&
         (w.dtype() == DataType::Float || w.dtype() == DataType::Float16 ||
          w.dtype() == DataType::BFloat16);
}

// The workspace of one convolution, as both the kernel and conv_workspace lay it out: for half
// types X, the bias, the filter of the direct loops and Y in float; the packed filter when it
// was not packed at load (`filter_at_load`); the convolution before a broadcasting Z is added
// (kiln.FusedConv); the wide paths' buffers (wide_floats, depthwise_floats) or the direct
// loops' padded planes, one per task on `threads` threads (padded_plane_floats). Double reads
// everything in place.
struct ConvParts {
  WorkspaceLayout layout;
  int x = -1, bias = -1, w = -1, packed = -1, y = -1, conv = -1, wide = -1;
  int source = -1, product = -1, offsets = -1;  // the transposed product's (transposed_sizes)
  int winograd = -1;                            // winograd_plan's
  int col = -1;                                 // double: one (image, group) lowered
  int threads = 1;

  ConvSpace float_space(const Workspace& space) const {
    return {space.data<float>(wide),      space.data<float>(source),   space.data<float>(product),
            space.data<int64_t>(offsets), space.data<float>(winograd), threads};
  }
};

ConvParts conv_parts(DataType dtype, const Sizes& s, const Geometry& g, bool has_bias,
                     bool filter_at_load, bool z_broadcasts, int threads) {
  ConvParts p;
  p.threads = threads;
  WorkspaceLayout& l = p.layout;
  if (dtype == DataType::Double) {
    p.col = l.add(DataType::Double, s.cg * g.k_size() * g.out_size());
    return p;
  }
  const bool half = dtype != DataType::Float;
  const int64_t kk = s.cg * g.k_size(), out = s.n * s.m * g.out_size();
  if (half) {
    p.x = l.add(DataType::Float, s.n * s.c * g.in_size());
    if (has_bias) p.bias = l.add(DataType::Float, s.m);
  }
  if (use_direct(s, g)) {
    if (half) p.w = l.add(DataType::Float, s.m * kk);
  } else if (!filter_at_load) {
    p.packed = l.add(DataType::Float, form_floats(s.groups, s.mg, s.cg, kk, filter_form(s, g)));
  }
  if (half) p.y = l.add(DataType::Float, out);
  if (z_broadcasts) p.conv = l.add(DataType::Float, out);
  // The GEMM's wide path, the depthwise one or the direct loops' padded planes (one at most:
  // the depthwise and padded planes are direct, and the padded planes not depthwise).
  p.wide = l.add(DataType::Float,
                 wide_floats(s, g) + depthwise_floats(s, g) + padded_plane_floats(s, g, threads));
  const TransposedSizes ts = transposed_sizes(s, g);
  p.source = l.add(DataType::Float, ts.source);
  p.product = l.add(DataType::Float, ts.product);
  p.offsets = l.add(DataType::Int64, ts.offsets);
  p.winograd = l.add(DataType::Float,
                     use_winograd(s, g) ? winograd_plan(s, g, threads).workspace_floats() : 0);
  return p;
}

// Which convolution a Conv kernel runs.
enum class ConvKind : uint8_t { Plain, KilnFused, OrtFused };

class Conv final : public Kernel {
 public:
  Conv(const NodeInfo& info, ConvKind kind)
      : fused_(kind != ConvKind::Plain),
        ort_(kind == ConvKind::OrtFused),
        activation_(kind == ConvKind::KilnFused ? parse_activation(info) : math::Activation::None),
        group_(info.attr_int("group", 1)),
        window_(window_attrs(info.node())) {
    if (group_ < 1 || group_ > kMaxWindowAttr) info.fail("group must be in [1, 2^31]");
    if (ort_) parse_ort_activation(info, activation_, post_);
    // A constant filter is packed for the GEMM once (not for the direct convolutions, which
    // read it as it is; see use_direct).
    const Tensor* w = info.constant_input(1);
    filter_planned_ = info.is_initializer(1) &&
                      packable_filter(info.graph().value(info.node().inputs[1]).constant, group_);
    if (w && packable_filter(*w, group_)) {
      form_ = hinted_form(info, *w);
      const int64_t groups = group_;
      const FilterForm form = form_;
      packed_ = info.prepared_input(1, packing_name(groups, form), [groups, form](const Tensor& f) {
        return pack_filter(f, groups, form);
      });
      packed_groups_ = group_;
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const bool has_bias = ctx.has_input(2);
    if (x.rank() < 3 || x.rank() > 5) {
      ctx.fail("input must have 1 to 3 spatial dimensions, got " + x.describe(),
               x.rank() > 5 ? ErrorKind::Unsupported : ErrorKind::Runtime);
    }
    if (w.rank() != x.rank())
      ctx.fail("weight " + w.describe() + " does not match " + x.describe());
    if (w.dtype() != x.dtype() || (has_bias && ctx.input(2).dtype() != x.dtype())) {
      ctx.fail("inputs have different element types");
    }
    Sizes s{x.dim(0), x.dim(1), w.dim(0), group_, w.dim(1), 0};
    if (s.cg * s.groups != s.c) {
      ctx.fail("input channels " + std::to_string(s.c) + " do not match weight " + w.describe() +
               " with group " + std::to_string(s.groups));
    }
    if (s.m % s.groups != 0) ctx.fail("output channels are not divisible by group");
    s.mg = s.m / s.groups;
    if (has_bias && (ctx.input(2).rank() != 1 || ctx.input(2).dim(0) != s.m)) {
      ctx.fail("bias " + ctx.input(2).describe() + " must have " + std::to_string(s.m) + " values");
    }
    const std::vector<WindowAxis> axes = forward_windows(
        spatial_dims(x.shape()), conv_kernel(window_, spatial_dims(w.shape())), window_);
    const Geometry g = right_aligned(axes);
    const Shape out_shape = windowed_shape(s.n, s.m, axes);
    if (fused_) {
      if (ort_ && ctx.has_input(3) && ctx.input(3).shape() != out_shape) {
        ctx.fail("Z " + ctx.input(3).describe() + " must have the output's shape " +
                 shape_to_string(out_shape));
      }
      Tensor& y = run_fused(ctx, s, g, out_shape);
      post_.apply(y.data<float>(), y.numel());
      return;
    }

    dispatch(TypeList<float, double, float16, bfloat16>{}, x.dtype(), [&]<typename T>() {
      Tensor& y = ctx.output(0, x.dtype(), out_shape);
      if constexpr (std::is_same_v<T, double>) {
        const ConvParts parts =
            conv_parts(x.dtype(), s, g, has_bias, filter_planned_, false, ctx.threads());
        const Workspace space(ctx, parts.layout);
        convolve<T>(x.data<const T>(), w.data<const T>(), nullptr,
                    has_bias ? ctx.input(2).data<const T>() : nullptr, y.data<T>(), s, g, {},
                    nullptr, {}, space.data<double>(parts.col));
      } else {
        // Float, or a half type computed in float in the workspace (conv_parts), which
        // follows the output.
        const ConvParts parts =
            conv_parts(x.dtype(), s, g, has_bias, filter_planned_, false, ctx.threads());
        const Workspace space(ctx, parts.layout);
        auto widen = [&](const Tensor& t, int part) {
          if (t.dtype() == DataType::Float) return t;
          Tensor f = space.tensor(part, t.shape());
          unary_loop<T, float>(t, f, [](T v) { return static_cast<float>(v); });
          return f;
        };
        const Tensor fx = widen(x, parts.x);
        const Tensor fb = has_bias ? widen(ctx.input(2), parts.bias) : Tensor();
        Tensor fw, packed_now;
        const float* packed = filter(
            ctx, s, g, [&](const Tensor& t) { return widen(t, parts.w); },
            space.data<float>(parts.packed), fw, packed_now);
        const bool is_float = std::is_same_v<T, float>;
        Tensor fy = is_float ? y : space.tensor(parts.y, out_shape);
        convolve<float>(fx.data<const float>(), fw.defined() ? fw.data<const float>() : nullptr,
                        packed, has_bias ? fb.data<const float>() : nullptr, fy.data<float>(), s, g,
                        {}, &ctx, parts.float_space(space));
        if (!is_float) unary_loop<float, T>(fy, y, [](float v) { return T(v); });
      }
    });
  }

 private:
  // The filter as the convolution reads it: for the direct loops `fw` (widened to float by
  // `widen`), else the packed GEMM form returned (the cached one, or packed into
  // `room`, the workspace's part for it, from a filter computed at run time; scratch in
  // `packed_now` only should a filter the rule saw packed at load not be).
  template <typename Widen>
  const float* filter(OpContext& ctx, const Sizes& s, const Geometry& g, const Widen& widen,
                      float* room, Tensor& fw, Tensor& packed_now) const {
    const Tensor& w = ctx.input(1);
    if (use_direct(s, g)) {
      fw = widen(w);  // direct loops read the filter as it is
      return nullptr;
    }
    const FilterForm form = filter_form(s, g);
    if (packed_ && packed_groups_ == s.groups) {
      if (form == form_) return packed_->data<const float>();
      return other_form(w, s.groups, form);
    }
    const int64_t floats = packed_filter_floats(w, s.groups, form);
    if (floats == 0) return nullptr;  // an empty product reads no filter
    if (!room) {
      packed_now = ctx.allocate(DataType::Float, Shape{floats});
      room = packed_now.data<float>();
    }
    pack_filter_into(w, s.groups, form, room);
    return room;
  }

  // The name of the weights cache's packed filter in one form.
  static std::string packing_name(int64_t groups, FilterForm form) {
    const math::MathKernels& t = math::kernels();
    const std::string level = math::isa_name(t.isa), g = "-g" + std::to_string(groups);
    switch (form) {
      case FilterForm::Transposed:
        return "conv-filter-t-" + level + "-nr" + std::to_string(t.gemm.nr) + g;
      case FilterForm::Winograd4:
        return "conv-filter-winograd4-" + level + "-mr" + std::to_string(t.gemm.mr) + g;
      case FilterForm::Winograd2:
        return "conv-filter-winograd2-" + level + "-mr" + std::to_string(t.gemm.mr) + g;
      case FilterForm::Packed:
        break;
    }
    return "conv-filter-" + level + "-mr" + std::to_string(t.gemm.mr) + g;
  }

  // The form the input's shape as inferred at load makes the convolution read (filter_form);
  // the plain packed form when the shape is not known.
  FilterForm hinted_form(const NodeInfo& info, const Tensor& w) const {
    const Shape* x = info.input_shape_hint(0);
    if (!x || x->size() != w.rank() || w.rank() < 3 || (*x)[1] != w.dim(1) * group_)
      return FilterForm::Packed;
    try {
      const Geometry g = right_aligned(forward_windows(
          spatial_dims(*x), conv_kernel(window_, spatial_dims(w.shape())), window_));
      return filter_form(Sizes{(*x)[0], (*x)[1], w.dim(0), group_, w.dim(1), w.dim(0) / group_}, g);
    } catch (const Error&) {
      return FilterForm::Packed;  // the run reports a bad shape
    }
  }

  // The constant filter in a form the load-time shape did not choose (a run on maps of
  // another size): packed on the first such run and kept.
  const float* other_form(const Tensor& w, int64_t groups, FilterForm form) const {
    const std::lock_guard<std::mutex> lock(other_mutex_);
    std::shared_ptr<const Tensor>& other = others_[static_cast<size_t>(form)];
    if (!other) other = std::make_shared<const Tensor>(pack_filter(w, groups, form));
    return other->data<const float>();
  }

  // kiln.FusedConv: y = activation(conv + bias + Z); returns y.
  Tensor& run_fused(OpContext& ctx, const Sizes& s, const Geometry& g, const Shape& out_shape) {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::Float) ctx.fail("takes float inputs, got " + x.describe());
    const bool has_bias = ctx.has_input(2), has_z = ctx.has_input(3);
    const float* bias = has_bias ? ctx.input(2).data<const float>() : nullptr;
    ConvEpilogue e;
    e.activation = activation_;
    const Tensor* z = has_z ? &ctx.input(3) : nullptr;
    if (z && z->dtype() != DataType::Float) ctx.fail("Z " + z->describe() + " must be float");
    // Z of another shape broadcasts (to the convolution's shape or beyond): the sum is a
    // broadcasting Add of the convolution, made in the workspace.
    const bool z_broadcasts = z && z->shape() != out_shape;
    Shape sum_shape = out_shape;
    if (z_broadcasts) {
      try {
        sum_shape = broadcast_shapes(out_shape, z->shape());
      } catch (const Error&) {
        ctx.fail("Z " + z->describe() + " does not broadcast to the convolution's output " +
                 shape_to_string(out_shape));
      }
    }
    Tensor* out = nullptr;
    if (z && !z_broadcasts) {
      // Accumulate onto Z: in place when Z dies here, else onto a copy of it.
      e.accumulate = true;
      out = ctx.can_overwrite(3) ? &ctx.output_reusing(0, 3, DataType::Float, out_shape)
                                 : &ctx.output(0, DataType::Float, out_shape);
      if (out->raw_data() == z->raw_data()) {
        ctx.count_in_place();
      } else {
        copy_elements(*z, *out);
        ctx.count_copy(static_cast<uint64_t>(out->nbytes()));
      }
    } else {
      out = &ctx.output(0, DataType::Float, sum_shape);
    }
    Tensor& y = *out;
    // The workspace follows the output.
    const ConvParts parts =
        conv_parts(DataType::Float, s, g, has_bias, filter_planned_, z_broadcasts, ctx.threads());
    const Workspace space(ctx, parts.layout);
    Tensor fw, packed_now;
    const float* packed = filter(
        ctx, s, g, [](const Tensor& t) { return t; }, space.data<float>(parts.packed), fw,
        packed_now);
    const float* w = fw.defined() ? fw.data<const float>() : nullptr;
    const ConvSpace cs = parts.float_space(space);
    if (!z_broadcasts) {
      convolve<float>(x.data<const float>(), w, packed, bias, y.data<float>(), s, g, e, &ctx, cs);
      return y;
    }
    Tensor conv = space.tensor(parts.conv, out_shape);
    convolve<float>(x.data<const float>(), w, packed, bias, conv.data<float>(), s, g, {}, &ctx, cs);
    binary_loop<float, float, float>(conv, *z, y, [](float a, float b) { return a + b; });
    apply_activation(activation_, y.data<float>(), y.numel());
    return y;
  }

  // The spatial axes right-aligned in three dimensions.
  bool fused_;
  bool ort_;  // com.microsoft.FusedConv
  math::Activation activation_;
  ParamActivation post_;
  int64_t group_;
  WindowAttrs window_;
  std::shared_ptr<const Tensor> packed_;  // the weights cache's packed filter
  int64_t packed_groups_ = 0;
  FilterForm form_ = FilterForm::Packed;  // packed_'s form
  mutable std::mutex other_mutex_;
  mutable std::array<std::shared_ptr<const Tensor>, kFilterForms> others_;  // other_form's
  // The filter is an initializer packed at load: the workspace has no room to pack it
  // (conv_parts' `filter_at_load`, as the workspace rule decides it).
  bool filter_planned_ = false;
};

Shape conv_output_shape(const ShapeContext& c) {
  return ops::conv_output_shape(c.shape(0), c.shape(1), window_attrs(c.node()));
}

// Partial facts: the filter's output channels and rank (the batch and each spatial size
// where the input's is known).
ValueFacts conv_partial(const ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const ValueFacts& w = c.facts(1);
  ValueFacts out =
      windowed_facts(x, x.ranked ? x.rank() : w.rank(), w.dim(0), w.dim(1) * c.attr_int("group", 1),
                     [&](const Shape& probe) -> Shape {
                       if (!w.known) unknown("filter not known");
                       return ops::conv_output_shape(probe, w.shape, window_attrs(c.node()));
                     });
  if (out.dtype == DataType::Undefined) out.dtype = w.dtype;  // X and W share their type
  return out;
}

void conv_shape(ShapeContext& c) {
  if (!c.facts(0).known || !c.facts(1).known) {
    c.set(0, conv_partial(c));
    return;
  }
  c.set(0, c.dtype(0), conv_output_shape(c));
}

// The kernel's workspace (conv_parts) for these shapes on c.threads() threads.
uint64_t conv_workspace(const ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  const Shape out = conv_output_shape(c);
  const int64_t groups = c.attr_int("group", 1);
  if (groups <= 0 || w[0] % groups != 0) unknown("bad group");
  const Sizes s{x[0], x[1], w[0], groups, w[1], w[0] / groups};
  const WindowAttrs a = window_attrs(c.node());
  const Geometry g =
      right_aligned(forward_windows(spatial_dims(x), conv_kernel(a, spatial_dims(w)), a));
  const Tensor* filter = c.constant_input(1);
  const bool z_broadcasts = c.has_input(3) && c.shape(3) != out;
  return conv_parts(c.dtype(0), s, g, c.has_input(2), filter && packable_filter(*filter, groups),
                    z_broadcasts, c.threads())
      .layout.bytes();
}

// kiln.FusedConv: the convolution plus Z, which may broadcast.
void fused_conv_shape(ShapeContext& c) {
  if (!c.inputs_known()) {
    ValueFacts out = conv_partial(c);
    const ValueFacts& z = c.facts(3);
    if (c.has_input(3) && (!z.ranked || !out.ranked)) out.ranked = false;
    if (c.has_input(3) && out.ranked) {
      const DataType dtype = out.dtype;
      out = broadcast_facts({&out, &z});
      out.dtype = dtype;
    }
    c.set(0, std::move(out));
    return;
  }
  const Shape out = conv_output_shape(c);
  c.set(0, c.dtype(0), c.has_input(3) ? broadcast_shapes(out, c.shape(3)) : out);
}

}  // namespace

KILN_REGISTER_OP({.op = "Conv",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = conv_shape,
                  .workspace = conv_workspace,
                  .create = [](const NodeInfo& info) -> std::unique_ptr<Kernel> {
                    return std::make_unique<Conv>(info, ConvKind::Plain);
                  }});

KILN_REGISTER_OP({.domain = "kiln",
                  .op = "FusedConv",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(3),
                  .types = "float",
                  .shape = fused_conv_shape,
                  .workspace = conv_workspace,
                  .create = [](const NodeInfo& info) -> std::unique_ptr<Kernel> {
                    return std::make_unique<Conv>(info, ConvKind::KilnFused);
                  }});

// onnxruntime's com.microsoft.FusedConv: float only; Z has the output's shape.
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "FusedConv",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(3),
                  .types = "float",
                  .shape = conv_shape,
                  .workspace = conv_workspace,
                  .create = [](const NodeInfo& info) -> std::unique_ptr<Kernel> {
                    return std::make_unique<Conv>(info, ConvKind::OrtFused);
                  }});

}  // namespace kiln::ops
