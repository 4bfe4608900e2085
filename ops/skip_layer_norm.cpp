// com.microsoft.SkipLayerNormalization (onnxruntime's contrib op; the graph optimizer makes it
// from a residual Add and the LayerNormalization reading it, engine/passes/fusion.cpp):
//
//   input_skip_bias_sum = input + skip (+ bias)
//   output = (sum - mean) / sqrt(var + epsilon) * gamma (+ beta), over the last axis
//
// Inputs input, skip, gamma, beta (optional), bias (optional); outputs output, mean,
// inv_std_var (both optional, the last axis kept as 1) and input_skip_bias_sum (optional: the
// residual stream, when later nodes read it). gamma, beta and bias hold one value per
// element of the last axis. When input and skip have one shape, each row is summed and
// normalised by one dispatched row kernel while it is in cache; skip (or input) may also
// broadcast numpy-style, which onnxruntime does for a skip of [S, H] or [1, S, H]. float16
// operands are widened to float and the results narrowed back, as onnxruntime's CPU kernel
// does; the statistics stay float.
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/half.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTaskElements = 16384;

class SkipLayerNorm final : public Kernel {
 public:
  explicit SkipLayerNorm(const NodeInfo& info) : epsilon_(info.attr_float("epsilon", 1e-12f)) {
    if (!(epsilon_ >= 0)) info.fail("epsilon must be non-negative");
  }

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const DataType dt = a.dtype();
    if ((dt != DataType::Float && dt != DataType::Float16) || b.dtype() != dt) {
      ctx.fail("takes float or float16 input and skip of one type, got " + a.describe() + " and " +
                   b.describe(),
               ErrorKind::Unsupported);
    }
    if (a.rank() == 0 && b.rank() == 0) ctx.fail("input and skip must have at least one dim");
    const Shape shape = broadcast_shapes(a.shape(), b.shape());
    const int64_t n = shape.back();
    Params params;
    params.gamma = param(ctx, 2, dt, n, "gamma", params.wide[0]);
    params.beta = param(ctx, 3, dt, n, "beta", params.wide[1]);
    params.bias = param(ctx, 4, dt, n, "bias", params.wide[2]);
    // float16 is widened into float scratch first, so its outputs may then take the inputs'
    // storage as float outputs do. (References, not copies: a copy of an input would hold its
    // storage and keep the output from taking it.)
    Tensor wide_a, wide_b;
    if (dt == DataType::Float16) {
      wide_a = widen_to_float(ctx, a);
      wide_b = widen_to_float(ctx, b);
    }
    const Tensor& fa = dt == DataType::Float ? a : wide_a;
    const Tensor& fb = dt == DataType::Float ? b : wide_b;
    Tensor& y = a.shape() == shape ? ctx.output_reusing(0, 0, dt, shape) : ctx.output(0, dt, shape);
    Tensor sum;
    if (ctx.has_output(3)) {
      sum = b.shape() == shape ? ctx.output_reusing(3, 1, dt, shape) : ctx.output(3, dt, shape);
    }
    Shape stat_shape = shape;
    stat_shape.back() = 1;
    Tensor mean, inv_std;
    if (ctx.has_output(1)) mean = ctx.output(1, DataType::Float, stat_shape);
    if (ctx.has_output(2)) inv_std = ctx.output(2, DataType::Float, stat_shape);
    if (dt == DataType::Float) {
      normalize(ctx, fa, fb, shape, params, y, sum, mean, inv_std);
      return;
    }
    Tensor fy = ctx.allocate(DataType::Float, shape);
    Tensor fsum = sum.defined() ? ctx.allocate(DataType::Float, shape) : Tensor();
    normalize(ctx, fa, fb, shape, params, fy, fsum, mean, inv_std);
    narrow_into(fy, y);
    if (sum.defined()) narrow_into(fsum, sum);
  }

 private:
  // gamma, beta and bias as n floats each (null when absent); float16 ones widened into `wide`.
  struct Params {
    const float* gamma = nullptr;
    const float* beta = nullptr;
    const float* bias = nullptr;
    std::vector<float> wide[3];
  };

  // The float computation: y, and `sum` when defined, from a + b (broadcast to `shape`).
  void normalize(OpContext& ctx, const Tensor& a, const Tensor& b, const Shape& shape,
                 const Params& params, Tensor& y, const Tensor& sum_out, const Tensor& mean,
                 const Tensor& inv_std) const {
    const int64_t n = shape.back();
    const int64_t rows = n == 0 ? 0 : numel_of(shape) / n;
    if (rows == 0) return;
    const bool same = a.shape() == shape && b.shape() == shape;
    // The sum: the fourth output when requested, else y itself (normalised in place) or,
    // when an operand broadcasts, a scratch buffer.
    Tensor scratch;
    const Tensor* sum = &sum_out;
    if (!sum_out.defined()) {
      if (!same) scratch = ctx.allocate(DataType::Float, shape);
      sum = same ? &y : &scratch;
    }
    if (!same) {
      binary_loop<float, float, float>(a, b, *sum, [](float x, float z) { return x + z; });
    }
    const float* pa = same ? a.data<const float>() : nullptr;
    const float* pb = same ? b.data<const float>() : nullptr;
    float* ps = sum->data<float>();
    float* py = y.data<float>();
    float* pm = mean.defined() ? mean.data<float>() : nullptr;
    float* pi = inv_std.defined() ? inv_std.data<float>() : nullptr;
    const float *gamma = params.gamma, *beta = params.beta, *bias = params.bias;
    const math::VecMathKernels& vm = math::kernels().vec;
    parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* s = ps + r * n;
        float* m = pm ? pm + r : nullptr;
        float* v = pi ? pi + r : nullptr;
        if (same) {
          vm.skip_layer_norm(pa + r * n, pb + r * n, bias, s, py + r * n, n, gamma, beta, epsilon_,
                             m, v);
        } else if (bias) {
          vm.skip_layer_norm(s, bias, nullptr, s, py + r * n, n, gamma, beta, epsilon_, m, v);
        } else {
          vm.layer_norm(s, py + r * n, n, gamma, beta, epsilon_, m, v);
        }
      }
    });
  }

  // Input i as n contiguous floats of the input's type (widened into `wide` when float16), or
  // null when it is absent.
  static const float* param(OpContext& ctx, size_t i, DataType dt, int64_t n, const char* what,
                            std::vector<float>& wide) {
    if (!ctx.has_input(i)) {
      if (i == 2) ctx.fail("gamma is required");
      return nullptr;
    }
    const Tensor& t = ctx.input(i);
    if (t.dtype() != dt || t.numel() != n || !t.is_contiguous()) {
      ctx.fail(std::string(what) + " " + t.describe() + " must hold " + std::to_string(n) + " " +
               std::string(data_type_name(dt)) + " values (the last axis)");
    }
    if (dt == DataType::Float) return t.data<const float>();
    wide.resize(static_cast<size_t>(n));
    widen_half(t.raw_data(), wide.data(), n);
    return wide.data();
  }

  static int64_t numel_of(const Shape& s) {
    int64_t count = 1;
    for (int64_t d : s) count *= d;
    return count;
  }

  float epsilon_;
};

// input + skip (broadcast), normalised over the last axis; the statistics keep it as 1, the
// fourth output is the sum.
void skip_layer_norm_shape(ShapeContext& c) {
  const Shape out = broadcast_shapes(c.shape(0), c.shape(1));
  if (out.empty()) unknown("a scalar input");
  Shape stat = out;
  stat.back() = 1;
  c.set(0, c.dtype(0), out);
  c.set(1, DataType::Float, stat);
  c.set(2, DataType::Float, stat);
  c.set(3, c.dtype(0), out);
}

// As the kernel takes its outputs, in its order: y over the input and the sum (the fourth
// output) over the skip, each when it has the output's shape, then the statistics.
void place_skip_layer_norm(Placement& p) {
  const Shape& shape = p.output(0).shape;
  if (p.input(0).shape == shape) {
    p.reuse_or_allocate(0, inputs(0));
  } else {
    p.allocate(0);
  }
  if (p.node().outputs.size() > 3) {
    if (p.input(1).shape == shape) {
      p.reuse_or_allocate(3, inputs(1));
    } else {
      p.allocate(3);
    }
  }
  p.allocate(1);
  p.allocate(2);
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "SkipLayerNormalization",
                  .since = 1,
                  .min_inputs = 3,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .in_place = inputs(0, 1),
                  .types = "float, float16 (statistics float)",
                  .shape = skip_layer_norm_shape,
                  .place = place_skip_layer_norm,
                  .create = make<SkipLayerNorm>});

}  // namespace kiln::ops
