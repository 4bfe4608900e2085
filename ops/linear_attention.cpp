// LinearAttention (ai.onnx 27): recurrent linear attention over packed [B, T, H*D] inputs
// with a per-KV-head state S of [d_k, d_v], for prefill (T > 1) and decode (T = 1). Per token:
//   gated rules:  S *= exp(g_t)                       (g_t per head or per key dimension)
//   delta rules:  v_t = beta_t * (v_t - S^T k_t)      (using the decayed S)
//   always:       S += k_t v_t^T;  o_t = scale * S^T q_t for every query head of the group
// The state is kept in float whatever the activation type, as the reference does.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecF = Eigen::Matrix<float, Eigen::Dynamic, 1>;

// A tensor's elements as contiguous floats: read in place when they already are, else a
// widened copy.
struct Floats {
  std::vector<float> own;
  const float* p = nullptr;
  explicit Floats(const Tensor& t) {
    if (!t.defined()) return;
    if (t.dtype() == DataType::Float && t.is_contiguous()) {
      p = t.data<const float>();
      return;
    }
    own.resize(static_cast<size_t>(t.numel()));
    dispatch(TypeList<float, float16, bfloat16>{}, t.dtype(), [&]<typename T>() {
      const Tensor c = t.contiguous();
      const T* src = c.data<const T>();
      for (size_t i = 0; i < own.size(); ++i) own[i] = static_cast<float>(src[i]);
    });
    p = own.data();
  }
};

// A float buffer for an output: the output itself when it is float, else scratch that
// finish() narrows into it.
struct FloatOut {
  Tensor dst;
  std::vector<float> own;
  float* p = nullptr;
  FloatOut(Tensor t, int64_t n) : dst(std::move(t)) {
    if (dst.defined() && dst.dtype() == DataType::Float) {
      p = dst.data<float>();
    } else {
      own.resize(static_cast<size_t>(n));
      p = own.data();
    }
  }
  void finish() const {
    if (!dst.defined() || dst.dtype() == DataType::Float) return;
    dispatch(TypeList<float16, bfloat16>{}, dst.dtype(), [&]<typename T>() {
      T* d = dst.data<T>();
      for (size_t i = 0; i < own.size(); ++i) d[i] = T(own[i]);
    });
  }
};

class LinearAttention final : public Kernel {
 public:
  explicit LinearAttention(const NodeInfo& info)
      : q_heads_(info.attr_int("q_num_heads")),
        kv_heads_(info.attr_int("kv_num_heads")),
        scale_(info.attr_float("scale", 0.0f)) {
    const std::string rule = info.attr_string("update_rule", "gated_delta");
    if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta") {
      info.fail("update_rule must be linear, gated, delta or gated_delta, got '" + rule + "'");
    }
    gated_ = rule == "gated" || rule == "gated_delta";
    delta_ = rule == "delta" || rule == "gated_delta";
    if (q_heads_ <= 0 || kv_heads_ <= 0 || q_heads_ % kv_heads_) {
      info.fail("q_num_heads must be a positive multiple of kv_num_heads");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& q = ctx.input(0);
    const Tensor& k = ctx.input(1);
    const Tensor& v = ctx.input(2);
    if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3 || k.dtype() != q.dtype() ||
        v.dtype() != q.dtype()) {
      ctx.fail("query, key and value must be [batch, seq, heads*dim] of one type");
    }
    const int64_t B = q.dim(0), T = q.dim(1), Hq = q_heads_, Hk = kv_heads_;
    if (q.dim(2) % Hq || v.dim(2) % Hk) ctx.fail("hidden sizes are not divisible by head counts");
    const int64_t dk = q.dim(2) / Hq, dv = v.dim(2) / Hk, group = Hq / Hk;
    if (k.shape() != Shape{B, T, Hk * dk} || v.dim(0) != B || v.dim(1) != T) {
      ctx.fail("key " + k.describe() + " / value " + v.describe() + " do not match query " +
               q.describe());
    }
    if (gated_ != ctx.has_input(4)) {
      ctx.fail(gated_ ? "this update_rule needs decay" : "this update_rule takes no decay");
    }
    if (delta_ != ctx.has_input(5)) {
      ctx.fail(delta_ ? "this update_rule needs beta" : "this update_rule takes no beta");
    }
    int64_t decay_width = 0, beta_width = 0;
    if (gated_) {
      const Tensor& g = ctx.input(4);
      decay_width = g.rank() == 3 ? g.dim(2) : -1;
      if (g.rank() != 3 || g.dim(0) != B || g.dim(1) != T || g.dtype() != q.dtype() ||
          (decay_width != Hk && decay_width != Hk * dk)) {
        ctx.fail("decay must be [batch, seq, kv_heads] or [batch, seq, kv_heads*d_k], got " +
                 g.describe());
      }
    }
    if (delta_) {
      const Tensor& be = ctx.input(5);
      beta_width = be.rank() == 3 ? be.dim(2) : -1;
      if (be.rank() != 3 || be.dim(0) != B || be.dim(1) != T || be.dtype() != q.dtype() ||
          (beta_width != Hk && beta_width != 1)) {
        ctx.fail("beta must be [batch, seq, kv_heads] or [batch, seq, 1], got " + be.describe());
      }
    }
    const Shape state_shape{B, Hk, dk, dv};
    DataType state_type = q.dtype();
    if (ctx.has_input(3)) {
      const Tensor& ps = ctx.input(3);
      if (ps.shape() != state_shape || !type_in(TypeList<float, float16, bfloat16>{}, ps.dtype())) {
        ctx.fail("past_state must be " + shape_to_string(state_shape) + ", got " + ps.describe());
      }
      state_type = ps.dtype();
    }
    const int64_t state_size = B * Hk * dk * dv;
    FloatOut out(ctx.output(0, q.dtype(), {B, T, Hq * dv}), B * T * Hq * dv);
    FloatOut st(ctx.has_output(1) ? ctx.output(1, state_type, state_shape) : Tensor(), state_size);
    if (ctx.has_input(3)) {
      const Floats past(ctx.input(3));
      std::copy(past.p, past.p + state_size, st.p);
      ctx.count_copy(static_cast<uint64_t>(state_size) * sizeof(float));
    } else {
      std::fill(st.p, st.p + state_size, 0.f);
    }
    const Floats qf(q), kf(k), vf(v);
    const Floats gf(gated_ ? ctx.input(4) : Tensor()), bf(delta_ ? ctx.input(5) : Tensor());
    const float scale = scale_ != 0.0f ? scale_ : 1.0f / std::sqrt(static_cast<float>(dk));

    parallel_for(B * Hk, grain_for(T * dk * dv * (group + 3)), [&](int64_t begin, int64_t end) {
      VecF vt(dv);
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / Hk, h = bh % Hk;
        Eigen::Map<RowMatF> s(st.p + bh * dk * dv, dk, dv);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t tok = b * T + t;
          Eigen::Map<const VecF> kt(kf.p + (tok * Hk + h) * dk, dk);
          vt = Eigen::Map<const VecF>(vf.p + (tok * Hk + h) * dv, dv);
          if (gated_) {
            if (decay_width == Hk) {
              s *= std::exp(gf.p[tok * Hk + h]);
            } else {
              const float* g = gf.p + (tok * Hk + h) * dk;
              for (int64_t d = 0; d < dk; ++d) s.row(d) *= std::exp(g[d]);
            }
          }
          if (delta_) {
            const float beta = bf.p[tok * beta_width + (beta_width == 1 ? 0 : h)];
            vt = beta * (vt - s.transpose() * kt);
          }
          s.noalias() += kt * vt.transpose();
          for (int64_t g = 0; g < group; ++g) {
            const int64_t hq = h * group + g;
            Eigen::Map<const VecF> qt(qf.p + (tok * Hq + hq) * dk, dk);
            Eigen::Map<VecF> o(out.p + (tok * Hq + hq) * dv, dv);
            o.noalias() = scale * (s.transpose() * qt);
          }
        }
      }
    });

    out.finish();
    st.finish();
  }

 private:
  int64_t q_heads_, kv_heads_;
  float scale_;
  bool gated_ = false, delta_ = false;
};

}  // namespace

KILN_REGISTER_OP({.op = "LinearAttention",
                  .since = 27,
                  .min_inputs = 3,
                  .max_inputs = 6,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "float, float16, bfloat16",
                  .create = make<LinearAttention>});

}  // namespace kiln::ops
