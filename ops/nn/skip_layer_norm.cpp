// com.microsoft.SkipLayerNormalization (onnxruntime's contrib op; the graph optimizer makes it
// from a residual Add and the LayerNormalization reading it, engine/passes/fusion/norms.cpp):
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

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/half.h"
#include "ops/core/workspace.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTaskElements = 16384;

// The workspace, as the kernel and skip_layer_norm_workspace lay it out: for float16, input,
// skip, gamma, beta, bias (those present), y and the sum (when an output) in float; the sum
// when an operand broadcasts and the sum is not an output.
struct SkipParts {
  WorkspaceLayout layout;
  int a = -1, b = -1, param[3] = {-1, -1, -1}, y = -1, sum = -1;
};

SkipParts skip_parts(DataType dt, const Shape& a, const Shape& b, const bool has_param[3],
                     bool sum_out) {
  SkipParts p;
  const Shape shape = broadcast_shapes(a, b);
  const int64_t n = shape.empty() ? 0 : shape.back(), total = shape_numel(shape);
  const bool half = dt == DataType::Float16;
  const bool same = a == shape && b == shape;
  if (half) {
    p.a = p.layout.add(DataType::Float, shape_numel(a));
    p.b = p.layout.add(DataType::Float, shape_numel(b));
    for (int i = 0; i < 3; ++i)
      if (has_param[i]) p.param[i] = p.layout.add(DataType::Float, n);
    p.y = p.layout.add(DataType::Float, total);
  }
  if ((half && sum_out) || (!same && !sum_out)) p.sum = p.layout.add(DataType::Float, total);
  return p;
}

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
    const char* names[] = {"gamma", "beta", "bias"};
    bool has_param[3];
    for (size_t i = 0; i < 3; ++i) has_param[i] = check_param(ctx, i + 2, dt, n, names[i]);
    // The outputs (float16 ones may take the inputs' storage: the inputs are widened into the
    // workspace before anything is written), then the workspace (skip_layer_norm_workspace).
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
    const SkipParts parts = skip_parts(dt, a.shape(), b.shape(), has_param, sum.defined());
    const Workspace space(ctx, parts.layout);
    const float* params[3] = {nullptr, nullptr, nullptr};
    for (size_t i = 0; i < 3; ++i) {
      if (!has_param[i]) continue;
      const Tensor& t = ctx.input(i + 2);
      if (dt == DataType::Float) {
        params[i] = t.data<const float>();
      } else {
        params[i] = space.data<float>(parts.param[i]);
        widen_half(t.raw_data(), space.data<float>(parts.param[i]), n);
      }
    }
    if (dt == DataType::Float) {
      normalize(a, b, shape, params, y, sum, mean, inv_std, space, parts.sum);
      return;
    }
    const Tensor fa = widen_into(a, space.tensor(parts.a, a.shape()));
    const Tensor fb = widen_into(b, space.tensor(parts.b, b.shape()));
    Tensor fy = space.tensor(parts.y, shape);
    const Tensor fsum = sum.defined() ? space.tensor(parts.sum, shape) : Tensor();
    normalize(fa, fb, shape, params, fy, fsum, mean, inv_std, space,
              sum.defined() ? -1 : parts.sum);
    narrow_into(fy, y);
    if (sum.defined()) narrow_into(fsum, sum);
  }

 private:
  // The float computation: y, and `sum` when defined, from a + b (broadcast to `shape`);
  // gamma, beta and bias as n floats each (null when absent). The sum, when not an output and
  // an operand broadcasts, goes to workspace part `sum_part`.
  void normalize(const Tensor& a, const Tensor& b, const Shape& shape, const float* const params[3],
                 Tensor& y, const Tensor& sum_out, const Tensor& mean, const Tensor& inv_std,
                 const Workspace& space, int sum_part) const {
    const int64_t n = shape.back();
    const int64_t rows = n == 0 ? 0 : numel_of(shape) / n;
    if (rows == 0) return;
    const bool same = a.shape() == shape && b.shape() == shape;
    // The sum: the fourth output when requested, else y itself (normalised in place) or,
    // when an operand broadcasts, the workspace.
    Tensor scratch;
    const Tensor* sum = &sum_out;
    if (!sum_out.defined()) {
      if (!same) scratch = space.tensor(sum_part, shape);
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
    const float *gamma = params[0], *beta = params[1], *bias = params[2];
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

  // Whether input i (gamma, beta, bias) is present; it must hold n values of the inputs' type.
  static bool check_param(OpContext& ctx, size_t i, DataType dt, int64_t n, const char* what) {
    if (!ctx.has_input(i)) {
      if (i == 2) ctx.fail("gamma is required");
      return false;
    }
    const Tensor& t = ctx.input(i);
    if (t.dtype() != dt || t.numel() != n || !t.is_contiguous()) {
      ctx.fail(std::string(what) + " " + t.describe() + " must hold " + std::to_string(n) + " " +
               std::string(data_type_name(dt)) + " values (the last axis)");
    }
    return true;
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
// The kernel's workspace (skip_parts) for these shapes.
uint64_t skip_layer_norm_workspace(const ShapeContext& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  if (a.empty() && b.empty()) unknown("a scalar input");
  const bool has_param[3] = {c.has_input(2), c.has_input(3), c.has_input(4)};
  return skip_parts(c.dtype(0), a, b, has_param, c.has_output(3)).layout.bytes();
}

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
                  .workspace = skip_layer_norm_workspace,
                  .create = make<SkipLayerNorm>});

}  // namespace kiln::ops
