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
// vector kernels, while it is in cache. float16 rows are widened to float first and narrowed
// back after, as onnxruntime's CPU kernels compute half types.
#include <cstddef>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/half.h"
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
    const DataType dt = x.dtype();
    if (dt != DataType::Float && dt != DataType::Float16) {
      ctx.fail("input must be float or float16, got " + x.describe(), ErrorKind::Unsupported);
    }
    if (x.rank() == 0) ctx.fail("input " + x.describe() + " must have at least one dim");
    if (kKind == Kind::BiasAdd && x.rank() != 3) {
      ctx.fail("input " + x.describe() + " must be 3-D [N, S, C]");
    }
    const int64_t n = x.dim(x.rank() - 1);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    std::vector<float> wide_bias;
    const float* bias = bias_of(ctx, dt, n, wide_bias);
    const Tensor* skip = skip_of(ctx, x);
    const int64_t out_n = kKind == Kind::BiasSplitGelu ? n / 2 : n;
    if (kKind == Kind::BiasSplitGelu && n % 2 != 0) {
      ctx.fail("the last axis of " + x.describe() + " must be even");
    }
    Shape out_shape = x.shape();
    out_shape.back() = out_n;
    Tensor& y = kKind == Kind::BiasSplitGelu ? ctx.output(0, dt, out_shape)
                                             : ctx.output_reusing(0, 0, dt, out_shape);
    if (rows == 0) return;
    if (dt == DataType::Float16) {
      run_half(x, bias, skip, y, rows, n, out_n);
      return;
    }
    const float* px = x.data<const float>();
    const float* ps = skip ? skip->data<const float>() : nullptr;
    float* py = y.data<float>();
    const math::MathKernels& k = math::kernels();
    parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
      std::vector<float> half(kKind == Kind::BiasSplitGelu ? static_cast<size_t>(out_n) : 0);
      for (int64_t r = r0; r < r1; ++r) {
        row(k, px + r * n, bias, ps ? ps + r * n : nullptr, py + r * out_n, n, half.data());
      }
    });
  }

 private:
  // float16: each row widened into float, computed as float rows are and narrowed back while
  // it is in cache.
  void run_half(const Tensor& x, const float* bias, const Tensor* skip, Tensor& y, int64_t rows,
                int64_t n, int64_t out_n) const {
    const std::byte* px = x.raw_data();
    const std::byte* ps = skip ? skip->raw_data() : nullptr;
    std::byte* py = y.raw_data();
    constexpr int64_t kHalf = sizeof(uint16_t);
    const math::MathKernels& k = math::kernels();
    parallel_for(rows, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
      // Row buffers: x, skip, y and BiasSplitGelu's gelu half.
      std::vector<float> buf(static_cast<size_t>(3 * n + out_n));
      float* xs = buf.data();
      float* ss = xs + n;
      float* ys = ss + n;
      float* hs = ys + n;
      for (int64_t r = r0; r < r1; ++r) {
        widen_half(px + r * n * kHalf, xs, n);
        if (ps) widen_half(ps + r * n * kHalf, ss, n);
        row(k, xs, bias, ps ? ss : nullptr, ys, n, hs);
        narrow_half(ys, py + r * out_n * kHalf, out_n);
      }
    });
  }

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

  // The bias input (index 1) as n contiguous floats (widened into `wide` when float16); null
  // when the op has none or it is omitted.
  static const float* bias_of(OpContext& ctx, DataType dt, int64_t n, std::vector<float>& wide) {
    if (kKind == Kind::Gelu || kKind == Kind::QuickGelu) return nullptr;
    if (!ctx.has_input(1)) {
      if (kKind == Kind::FastGelu) return nullptr;
      ctx.fail("bias is required");
    }
    const Tensor& b = ctx.input(1);
    require_type(ctx, b, dt, "bias");
    if (b.rank() != 1 || b.dim(0) != n || !b.is_contiguous()) {
      ctx.fail("bias " + b.describe() + " must be 1-D with the " + std::to_string(n) +
               " elements of the input's last axis");
    }
    if (dt == DataType::Float) return b.data<const float>();
    wide.resize(static_cast<size_t>(n));
    widen_half(b.raw_data(), wide.data(), n);
    return wide.data();
  }

  // BiasAdd's skip (index 2): contiguous, of the input's shape and type.
  static const Tensor* skip_of(OpContext& ctx, const Tensor& x) {
    if (kKind != Kind::BiasAdd) return nullptr;
    const Tensor& s = ctx.input(2);
    require_type(ctx, s, x.dtype(), "skip");
    if (s.shape() != x.shape() || !s.is_contiguous()) {
      ctx.fail("skip " + s.describe() + " must have the input's shape " + x.describe());
    }
    return &s;
  }

  static void require_type(OpContext& ctx, const Tensor& t, DataType dt, const char* what) {
    if (t.dtype() != dt) {
      ctx.fail(std::string(what) + " must have the input's type " +
                   std::string(data_type_name(dt)) + ", got " + t.describe(),
               ErrorKind::Unsupported);
    }
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
                  .types = "float, float16",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::Gelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "FastGelu",
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .types = "float, float16",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::FastGelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "BiasGelu",
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .in_place = inputs(0),
                  .types = "float, float16",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::BiasGelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QuickGelu",
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .in_place = inputs(0),
                  .types = "float, float16",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::QuickGelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "BiasAdd",
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .in_place = inputs(0),
                  .types = "float, float16",
                  .shape = same_shape,
                  .create = make<BiasActivation<Kind::BiasAdd>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "BiasSplitGelu",
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .types = "float, float16",
                  .shape = split_gelu_shape,
                  .create = make<BiasActivation<Kind::BiasSplitGelu>>});

}  // namespace kiln::ops
