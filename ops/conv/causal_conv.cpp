// CausalConvWithState (ai.onnx 27): depthwise causal 1-D convolution that carries its left
// context between calls. Each channel c of input [B, C, L] is convolved with its own kernel
// weight[c, 0, :] (length k) over past_state ++ input (past_state [B, C, k-1], zeros when
// absent), plus bias[c], optionally followed by SiLU; present_state is the last k-1 positions
// of that padded sequence, ready to be passed back as the next past_state.
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class CausalConvWithState final : public Kernel {
 public:
  explicit CausalConvWithState(const NodeInfo& info) {
    const std::string act = info.attr_string("activation", "none");
    if (act == "silu" || act == "swish") {
      silu_ = true;
    } else if (act != "none") {
      info.fail("activation must be 'none', 'silu' or 'swish', got '" + act + "'");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    if (x.rank() != 3) ctx.fail("input must be [batch, channels, length], got " + x.describe());
    const int64_t B = x.dim(0), C = x.dim(1), L = x.dim(2);
    if (w.rank() != 3 || w.dim(0) != C || w.dim(1) != 1 || w.dim(2) < 1 || w.dtype() != x.dtype()) {
      ctx.fail("weight must be [channels, 1, k] with k >= 1 and the input's type, got " +
               w.describe());
    }
    const int64_t K = w.dim(2), P = K - 1;
    const Tensor* bias = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    if (bias && (bias->shape() != Shape{C} || bias->dtype() != x.dtype())) {
      ctx.fail("bias must be [channels] of the input's type, got " + bias->describe());
    }
    const Tensor* past = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    if (past && (past->shape() != Shape{B, C, P} || past->dtype() != x.dtype())) {
      ctx.fail("past_state must be [batch, channels, k-1] = " + shape_to_string({B, C, P}) +
               " of the input's type, got " + past->describe());
    }
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    Tensor state;
    if (ctx.has_output(1)) state = ctx.output(1, x.dtype(), {B, C, P});

    dispatch(TypeList<float, float16, bfloat16>{}, x.dtype(), [&]<typename T>() {
      const T* in = x.data<const T>();
      const T* wt = w.data<const T>();
      const T* bs = bias ? bias->data<const T>() : nullptr;
      const T* ps = past ? past->data<const T>() : nullptr;
      T* out = y.data<T>();
      T* st = state.defined() ? state.data<T>() : nullptr;
      parallel_for(B * C, grain_for((L + P) * K), [&](int64_t begin, int64_t end) {
        std::vector<float> padded(static_cast<size_t>(L + P));
        for (int64_t bc = begin; bc < end; ++bc) {
          const int64_t c = bc % C;
          for (int64_t i = 0; i < P; ++i) padded[i] = ps ? static_cast<float>(ps[bc * P + i]) : 0.f;
          for (int64_t t = 0; t < L; ++t) padded[P + t] = static_cast<float>(in[bc * L + t]);
          const T* k = wt + c * K;
          const float b0 = bs ? static_cast<float>(bs[c]) : 0.f;
          for (int64_t t = 0; t < L; ++t) {
            float acc = b0;
            for (int64_t j = 0; j < K; ++j) acc += static_cast<float>(k[j]) * padded[t + j];
            // The convolution result is rounded to T before the activation, as a separate
            // Conv followed by SiLU would.
            float v = static_cast<float>(from_compute<T>(acc));
            if (silu_) v = v / (1.f + std::exp(-v));
            out[bc * L + t] = from_compute<T>(v);
          }
          if (st) {
            for (int64_t i = 0; i < P; ++i) st[bc * P + i] = from_compute<T>(padded[L + i]);
          }
        }
      });
    });
  }

 private:
  bool silu_ = false;
};

// y has x's shape; the state is [batch, channels, k - 1].
void causal_conv_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() != 3 || w.size() != 3 || w[0] != x[1] || w[1] != 1 || w[2] < 1 ||
      c.dtype(1) != c.dtype(0)) {
    unknown("input or weight does not fit");
  }
  c.set(0, c.dtype(0), x);
  c.set(1, c.dtype(0), {x[0], x[1], w[2] - 1});
}

}  // namespace

KILN_REGISTER_OP({.op = "CausalConvWithState",
                  .since = 27,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "float, float16, bfloat16",
                  .shape = causal_conv_shape,
                  .create = make<CausalConvWithState>});

}  // namespace kiln::ops
