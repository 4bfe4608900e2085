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
// broadcast numpy-style, which onnxruntime does for a skip of [S, H] or [1, S, H].
#include <string>

#include "ops/common.h"
#include "ops/elementwise.h"
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
    if (a.dtype() != DataType::Float || b.dtype() != DataType::Float) {
      ctx.fail("takes float input and skip, got " + a.describe() + " and " + b.describe(),
               ErrorKind::Unsupported);
    }
    if (a.rank() == 0 && b.rank() == 0) ctx.fail("input and skip must have at least one dim");
    const Shape shape = broadcast_shapes(a.shape(), b.shape());
    const int64_t n = shape.back();
    const int64_t rows = n == 0 ? 0 : numel_of(shape) / n;
    const float* gamma = param(ctx, 2, n, "gamma");
    const float* beta = param(ctx, 3, n, "beta");
    const float* bias = param(ctx, 4, n, "bias");
    const bool same = a.shape() == shape && b.shape() == shape;
    Tensor& y = a.shape() == shape ? ctx.output_reusing(0, 0, DataType::Float, shape)
                                   : ctx.output(0, DataType::Float, shape);
    // The sum: the fourth output when requested, else y itself (normalised in place) or,
    // when an operand broadcasts, a scratch buffer.
    Tensor sum;
    if (ctx.has_output(3)) {
      sum = b.shape() == shape ? ctx.output_reusing(3, 1, DataType::Float, shape)
                               : ctx.output(3, DataType::Float, shape);
    } else if (same) {
      sum = y;
    } else {
      sum = ctx.allocate(DataType::Float, shape);
    }
    Shape stat_shape = shape;
    stat_shape.back() = 1;
    Tensor mean, inv_std;
    if (ctx.has_output(1)) mean = ctx.output(1, DataType::Float, stat_shape);
    if (ctx.has_output(2)) inv_std = ctx.output(2, DataType::Float, stat_shape);
    if (rows == 0) return;
    if (!same) {
      binary_loop<float, float, float>(a, b, sum, [](float x, float z) { return x + z; });
    }
    const float* pa = same ? a.data<const float>() : nullptr;
    const float* pb = same ? b.data<const float>() : nullptr;
    float* ps = sum.data<float>();
    float* py = y.data<float>();
    float* pm = mean.defined() ? mean.data<float>() : nullptr;
    float* pi = inv_std.defined() ? inv_std.data<float>() : nullptr;
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

 private:
  // Input i as n contiguous floats, or null when it is absent.
  static const float* param(OpContext& ctx, size_t i, int64_t n, const char* what) {
    if (!ctx.has_input(i)) {
      if (i == 2) ctx.fail("gamma is required");
      return nullptr;
    }
    const Tensor& t = ctx.input(i);
    if (t.dtype() != DataType::Float || t.numel() != n || !t.is_contiguous()) {
      ctx.fail(std::string(what) + " " + t.describe() + " must hold " + std::to_string(n) +
               " floats (the last axis)");
    }
    return t.data<const float>();
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
                  .types = "float",
                  .shape = skip_layer_norm_shape,
                  .place = place_skip_layer_norm,
                  .create = make<SkipLayerNorm>});

}  // namespace kiln::ops
