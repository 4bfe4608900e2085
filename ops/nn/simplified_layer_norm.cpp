// onnxruntime's RMS norms ("simplified" layer norms: no mean subtracted, no beta), which its
// transformer optimizer and int4 model builder write for T5-, Llama- and Phi-style models:
//
//   SimplifiedLayerNormalization(X, scale)          (registered by onnxruntime in the ai.onnx
//       Y = X * inv_std_var * scale                  domain, opset 1)
//       inv_std_var = 1 / sqrt(mean(X^2) + epsilon) over the axes [axis, rank)
//   com.microsoft.SkipSimplifiedLayerNormalization(input, skip, gamma, bias?)
//       sum = input + skip (+ bias); output = the RMS norm of sum over the last axis, times gamma
//       outputs output, mean (of sum), inv_std_var (both with the last axis kept as 1) and
//       input_skip_bias_sum
//
// Rows go to tasks in parallel; each is summed by the row kernels and normalised by the
// dispatched rms_norm kernel while it is in cache.
#include <string>

#include "ops/core/common.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTaskElements = 16384;

// Input i as n contiguous floats; null when it is absent and optional.
const float* row_param(OpContext& ctx, size_t i, int64_t n, const char* what, bool required) {
  if (!ctx.has_input(i)) {
    if (required) ctx.fail(std::string(what) + " is required");
    return nullptr;
  }
  const Tensor& t = ctx.input(i);
  if (t.dtype() != DataType::Float || t.numel() != n || !t.is_contiguous()) {
    ctx.fail(std::string(what) + " " + t.describe() + " must hold " + std::to_string(n) +
             " floats (the normalised axes)");
  }
  return t.data<const float>();
}

void require_float(OpContext& ctx, const Tensor& t, const char* what) {
  if (t.dtype() != DataType::Float) {
    ctx.fail(std::string(what) + " must be float, got " + t.describe(), ErrorKind::Unsupported);
  }
}

class SimplifiedLayerNorm final : public Kernel {
 public:
  explicit SimplifiedLayerNorm(const NodeInfo& info)
      : axis_(info.attr_int("axis", -1)), epsilon_(info.attr_float("epsilon", 1e-5f)) {
    if (!(epsilon_ >= 0)) info.fail("epsilon must be non-negative");
    if (info.attr_int("stash_type", 1) != 1)
      info.fail("stash_type must be 1", ErrorKind::Unsupported);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float(ctx, x, "X");
    if (x.rank() == 0) ctx.fail("X must have at least one dim");
    const auto axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank())));
    int64_t rows = 1, n = 1;
    Shape stat_shape = x.shape();
    for (size_t d = 0; d < x.rank(); ++d) {
      (d < axis ? rows : n) *= x.dim(d);
      if (d >= axis) stat_shape[d] = 1;
    }
    const float* scale = row_param(ctx, 1, n, "scale", true);
    Tensor& y = ctx.output_reusing(0, 0, DataType::Float, x.shape());
    Tensor inv_std;
    if (ctx.has_output(1)) inv_std = ctx.output(1, DataType::Float, stat_shape);
    if (rows == 0 || n == 0) return;
    const float* px = x.data<const float>();
    float* py = y.data<float>();
    float* pi = inv_std.defined() ? inv_std.data<float>() : nullptr;
    const math::VecMathKernels& vm = math::kernels().vec;
    parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        vm.rms_norm(px + r * n, py + r * n, n, scale, epsilon_, pi ? pi + r : nullptr);
      }
    });
  }

 private:
  int64_t axis_;
  float epsilon_;
};

class SkipSimplifiedLayerNorm final : public Kernel {
 public:
  explicit SkipSimplifiedLayerNorm(const NodeInfo& info)
      : epsilon_(info.attr_float("epsilon", 1e-12f)) {
    if (!(epsilon_ >= 0)) info.fail("epsilon must be non-negative");
  }

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    require_float(ctx, a, "input");
    require_float(ctx, b, "skip");
    if (a.rank() < 2 || a.rank() > 3) ctx.fail("input " + a.describe() + " must be 2-D or 3-D");
    // onnxruntime's skip is the input's shape, or [S, H] / [1, S, H] repeated over the batch.
    const int64_t n = a.dim(a.rank() - 1), rows = n == 0 ? 0 : a.numel() / n;
    const bool repeats = b.rank() >= 2 && b.dim(b.rank() - 1) == n &&
                         b.dim(b.rank() - 2) == a.dim(a.rank() - 2) &&
                         (b.rank() == 2 || b.dim(0) == 1);
    if (!(b.shape() == a.shape() || repeats)) {
      ctx.fail("skip " + b.describe() + " must have the input's shape " + a.describe() +
               " or be [S, H] / [1, S, H]");
    }
    const float* gamma = row_param(ctx, 2, n, "gamma", true);
    const float* bias = row_param(ctx, 3, n, "bias", false);
    Shape stat_shape = a.shape();
    stat_shape.back() = 1;
    Tensor& y = ctx.output_reusing(0, 0, DataType::Float, a.shape());
    Tensor mean, inv_std, sum;
    if (ctx.has_output(1)) mean = ctx.output(1, DataType::Float, stat_shape);
    if (ctx.has_output(2)) inv_std = ctx.output(2, DataType::Float, stat_shape);
    // The sum is written into y (normalised in place) unless the fourth output wants it.
    sum = ctx.has_output(3) ? ctx.output(3, DataType::Float, a.shape()) : y;
    if (rows == 0) return;
    const float* pa = a.data<const float>();
    const float* pb = b.data<const float>();
    const int64_t skip_rows = b.numel() / n;
    float* ps = sum.data<float>();
    float* py = y.data<float>();
    float* pm = mean.defined() ? mean.data<float>() : nullptr;
    float* pi = inv_std.defined() ? inv_std.data<float>() : nullptr;
    const math::MathKernels& k = math::kernels();
    parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* s = ps + r * n;
        k.binary.add(pa + r * n, 1, pb + (r % skip_rows) * n, 1, s, n);
        if (bias) k.binary.add(s, 1, bias, 1, s, n);
        if (pm) pm[r] = k.vec.sum(s, n) / static_cast<float>(n);
        k.vec.rms_norm(s, py + r * n, n, gamma, epsilon_, pi ? pi + r : nullptr);
      }
    });
  }

 private:
  float epsilon_;
};

// Y has X's shape; inv_std_var keeps the axes before `axis` and 1 for the others.
void simplified_layer_norm_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.empty()) unknown("a scalar input");
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = c.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) unknown("axis out of range");
  Shape stat = x;
  for (int64_t d = axis; d < rank; ++d) stat[static_cast<size_t>(d)] = 1;
  c.set(0, c.dtype(0), x);
  c.set(1, DataType::Float, stat);
}

// output and input_skip_bias_sum have the input's shape; the statistics keep the last axis as
// 1.
void skip_simplified_layer_norm_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.empty()) unknown("a scalar input");
  Shape stat = x;
  stat.back() = 1;
  c.set(0, c.dtype(0), x);
  c.set(1, DataType::Float, stat);
  c.set(2, DataType::Float, stat);
  c.set(3, c.dtype(0), x);
}

}  // namespace

KILN_REGISTER_OP({.op = "SimplifiedLayerNormalization",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = simplified_layer_norm_shape,
                  .create = make<SimplifiedLayerNorm>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "SkipSimplifiedLayerNormalization",
                  .since = 1,
                  .min_inputs = 3,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = skip_simplified_layer_norm_shape,
                  .create = make<SkipSimplifiedLayerNorm>});

}  // namespace kiln::ops
