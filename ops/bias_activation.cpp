// onnxruntime's contrib activations (domain com.microsoft), which its transformer optimizer
// writes for the feed-forward blocks of BERT- and GPT-style models:
//
//   Gelu(X)              = X (1 + erf(X / sqrt2)) / 2
//   FastGelu(X, bias?)   = the tanh approximation of Gelu of X (+ bias)
//   BiasGelu(A, B)       = Gelu(A + B)
//   QuickGelu(X)         = X sigmoid(alpha X)           (alpha 1.702 unless given)
//   BiasAdd(X, bias, skip) = X + bias + skip             (X and skip [N, S, C])
//   BiasSplitGelu(X, bias) = left * Gelu(right), (X + bias) split in halves along the last axis
//
// A bias holds one value per element of the last axis. Rows of the last axis go to tasks in
// parallel; each row is added by the dispatched row kernels and activated in place by the
// vector kernels, while it is in cache.
#include <string>

#include "ops/common.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTaskElements = 16384;

enum class Kind { Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd, BiasSplitGelu };

template <Kind kKind>
class BiasActivation final : public Kernel {
 public:
  explicit BiasActivation(const NodeInfo& info) : alpha_(info.attr_float("alpha", 1.702f)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float(ctx, x, "input");
    if (x.rank() == 0) ctx.fail("input " + x.describe() + " must have at least one dim");
    if (kKind == Kind::BiasAdd && x.rank() != 3) {
      ctx.fail("input " + x.describe() + " must be 3-D [N, S, C]");
    }
    const int64_t n = x.dim(x.rank() - 1);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    const float* bias = bias_of(ctx, n);
    const float* skip = skip_of(ctx, x);
    const int64_t out_n = kKind == Kind::BiasSplitGelu ? n / 2 : n;
    if (kKind == Kind::BiasSplitGelu && n % 2 != 0) {
      ctx.fail("the last axis of " + x.describe() + " must be even");
    }
    Shape out_shape = x.shape();
    out_shape.back() = out_n;
    Tensor& y = kKind == Kind::BiasSplitGelu ? ctx.output(0, DataType::Float, out_shape)
                                             : ctx.output_reusing(0, 0, DataType::Float, out_shape);
    if (rows == 0) return;
    const float* px = x.data<const float>();
    float* py = y.data<float>();
    const math::MathKernels& k = math::kernels();
    parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
      std::vector<float> half(kKind == Kind::BiasSplitGelu ? static_cast<size_t>(out_n) : 0);
      for (int64_t r = r0; r < r1; ++r) {
        row(k, px + r * n, bias, skip ? skip + r * n : nullptr, py + r * out_n, n, half.data());
      }
    });
  }

 private:
  // One row of n inputs into y (n outputs, n / 2 for BiasSplitGelu, which uses `half`).
  void row(const math::MathKernels& k, const float* x, const float* bias, const float* skip,
           float* y, int64_t n, float* half) const {
    const math::VecMathKernels& vm = k.vec;
    if constexpr (kKind == Kind::BiasSplitGelu) {
      const int64_t h = n / 2;
      k.binary.add(x + h, 1, bias + h, 1, half, h);
      vm.gelu(half, half, h);
      k.binary.add(x, 1, bias, 1, y, h);
      k.binary.mul(y, 1, half, 1, y, h);
      return;
    }
    const float* src = x;
    if (bias) {
      k.binary.add(x, 1, bias, 1, y, n);
      src = y;
    }
    if constexpr (kKind == Kind::BiasAdd) {
      k.binary.add(src, 1, skip, 1, y, n);
    } else if constexpr (kKind == Kind::FastGelu) {
      vm.gelu_tanh(src, y, n);
    } else if constexpr (kKind == Kind::QuickGelu) {
      vm.swish(src, y, n, alpha_);
    } else {
      vm.gelu(src, y, n);
    }
  }

  static void require_float(OpContext& ctx, const Tensor& t, const char* what) {
    if (t.dtype() != DataType::Float) {
      ctx.fail(std::string(what) + " must be float, got " + t.describe(), ErrorKind::Unsupported);
    }
  }

  // The bias input (index 1) as n contiguous floats; null when the op has none or it is
  // omitted.
  static const float* bias_of(OpContext& ctx, int64_t n) {
    if (kKind == Kind::Gelu || kKind == Kind::QuickGelu) return nullptr;
    if (!ctx.has_input(1)) {
      if (kKind == Kind::FastGelu) return nullptr;
      ctx.fail("bias is required");
    }
    const Tensor& b = ctx.input(1);
    require_float(ctx, b, "bias");
    if (b.rank() != 1 || b.dim(0) != n || !b.is_contiguous()) {
      ctx.fail("bias " + b.describe() + " must be 1-D with the " + std::to_string(n) +
               " elements of the input's last axis");
    }
    return b.data<const float>();
  }

  // BiasAdd's skip (index 2): contiguous, of the input's shape.
  static const float* skip_of(OpContext& ctx, const Tensor& x) {
    if (kKind != Kind::BiasAdd) return nullptr;
    const Tensor& s = ctx.input(2);
    require_float(ctx, s, "skip");
    if (s.shape() != x.shape() || !s.is_contiguous()) {
      ctx.fail("skip " + s.describe() + " must have the input's shape " + x.describe());
    }
    return s.data<const float>();
  }

  float alpha_;
};

// BiasSplitGelu halves the last axis; the others keep the input's shape.
void split_gelu_shape(ShapeContext& c) {
  Shape s = c.shape(0);
  if (s.empty()) unknown("a scalar input");
  if (s.back() >= 0) s.back() /= 2;
  c.set(0, c.dtype(0), s);
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "Gelu",
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::Gelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "FastGelu",
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::FastGelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "BiasGelu",
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::BiasGelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QuickGelu",
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::QuickGelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "BiasAdd",
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::BiasAdd>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "BiasSplitGelu",
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .types = "float",
                  .shape = split_gelu_shape,
                  .create = make<BiasActivation<Kind::BiasSplitGelu>>});

}  // namespace kiln::ops
