// LinearAttention (ai.onnx 27): recurrent linear attention over packed [B, T, H*D] inputs
// with a per-KV-head state S of [d_k, d_v], for prefill (T > 1) and decode (T = 1). Per token:
//   gated rules:  S *= exp(g_t)                       (g_t per head or per key dimension)
//   delta rules:  v_t = beta_t * (v_t - S^T k_t)      (using the decayed S)
//   always:       S += k_t v_t^T;  o_t = scale * S^T q_t for every query head of the group
// The state is kept in float whatever the activation type, as the reference does. The reads
// of S for all of a token's queries (and the delta rule's S^T k) are one small product in the
// GEMM layer (ops/math/gemm.h), with the decay folded into its left operand; the decay and the
// rank-1 update then rewrite S in one pass.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/math/gemm.h"

namespace kiln::ops {
namespace {

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

// s (dk x dv, row-major) = diag(e) s + k v^T; e null: no decay.
void update_state(float* __restrict s, int64_t dk, int64_t dv, const float* __restrict e,
                  const float* __restrict k, const float* __restrict v) {
  for (int64_t d = 0; d < dk; ++d) {
    float* __restrict row = s + d * dv;
    const float kd = k[d];
    if (e) {
      const float ed = e[d];
      for (int64_t j = 0; j < dv; ++j) row[j] = ed * row[j] + kd * v[j];
    } else {
      for (int64_t j = 0; j < dv; ++j) row[j] += kd * v[j];
    }
  }
}

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

    // Per token and KV head, with e the decay (1 when not gated) and S the state before it,
    // one product reads S once and one pass writes it:
    //   [u; r_1 .. r_G] = [k*e; q_1*e; ..; q_G*e] S   (rows times e elementwise; u for delta)
    //   v' = beta (v - u) for delta rules, else v
    //   o_g = scale (r_g + (q_g . k) v')               (= scale S'^T q_g)
    //   S' = diag(e) S + k v'^T
    const int64_t first = delta_ ? 1 : 0, rows = first + group;
    parallel_for(B * Hk, grain_for(T * dk * dv * (rows + 2)), [&](int64_t begin, int64_t end) {
      std::vector<float> a(static_cast<size_t>(rows * dk)), r(static_cast<size_t>(rows * dv));
      std::vector<float> e(static_cast<size_t>(dk), 1.0f), vt(static_cast<size_t>(dv));
      math::GemmOptions single;
      single.max_threads = 1;  // the heads are the tasks
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / Hk, h = bh % Hk;
        float* s = st.p + bh * dk * dv;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t tok = b * T + t;
          const float* kt = kf.p + (tok * Hk + h) * dk;
          const float* vsrc = vf.p + (tok * Hk + h) * dv;
          const float* qg = qf.p + (tok * Hq + h * group) * dk;  // the group's queries
          float* og = out.p + (tok * Hq + h * group) * dv;
          if (gated_) {
            const float* g = gf.p + (tok * Hk + h) * (decay_width == Hk ? 1 : dk);
            if (decay_width == Hk) {
              std::fill(e.begin(), e.end(), std::exp(g[0]));
            } else {
              for (int64_t d = 0; d < dk; ++d) e[d] = std::exp(g[d]);
            }
          }
          if (delta_) {
            for (int64_t d = 0; d < dk; ++d) a[d] = kt[d] * e[d];
          }
          for (int64_t gi = 0; gi < group; ++gi) {
            float* ar = a.data() + (first + gi) * dk;
            for (int64_t d = 0; d < dk; ++d) ar[d] = qg[gi * dk + d] * e[d];
          }
          math::sgemm(math::MatrixView::row_major(a.data(), rows, dk, dk),
                      math::MatrixView::row_major(s, dk, dv, dv), r.data(), dv, single);
          if (delta_) {
            const float beta = bf.p[tok * beta_width + (beta_width == 1 ? 0 : h)];
            for (int64_t j = 0; j < dv; ++j) vt[j] = beta * (vsrc[j] - r[j]);
          } else {
            std::copy(vsrc, vsrc + dv, vt.begin());
          }
          for (int64_t gi = 0; gi < group; ++gi) {
            const float* q1 = qg + gi * dk;
            float qk = 0.0f;
            for (int64_t d = 0; d < dk; ++d) qk += q1[d] * kt[d];
            const float* rg = r.data() + (first + gi) * dv;
            float* o = og + gi * dv;
            for (int64_t j = 0; j < dv; ++j) o[j] = scale * (rg[j] + qk * vt[j]);
          }
          update_state(s, dk, dv, gated_ ? e.data() : nullptr, kt, vt.data());
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

// The output [batch, seq, q_heads * d_v] and the state [batch, kv_heads, d_k, d_v], of
// past_state's type when given.
void linear_attention_shape(ShapeContext& c) {
  const Shape& q = c.shape(0);
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  const int64_t hq = c.attr_i("q_num_heads", 0), hk = c.attr_i("kv_num_heads", 0);
  if (hq <= 0 || hk <= 0 || hq % hk || q.size() != 3 || v.size() != 3 || c.dtype(1) != c.dtype(0) ||
      c.dtype(2) != c.dtype(0) || q[2] % hq || v[2] % hk) {
    unknown("query, key and value do not fit the head counts");
  }
  const int64_t dk = q[2] / hq, dv = v[2] / hk;
  if (k != Shape{q[0], q[1], hk * dk} || v[0] != q[0] || v[1] != q[1]) {
    unknown("key or value does not match query");
  }
  const std::string rule = c.attr_s("update_rule", "gated_delta");
  if (c.has(4) != (rule == "gated" || rule == "gated_delta") ||
      c.has(5) != (rule == "delta" || rule == "gated_delta")) {
    unknown("decay or beta does not fit update_rule");
  }
  const Shape state{q[0], hk, dk, dv};
  if (c.has(3) && c.shape(3) != state) unknown("past_state does not fit");
  c.set(0, c.dtype(0), {q[0], q[1], hq * dv});
  c.set(1, c.has(3) ? c.dtype(3) : c.dtype(0), state);
}

}  // namespace

KILN_REGISTER_OP({.op = "LinearAttention",
                  .since = 27,
                  .min_inputs = 3,
                  .max_inputs = 6,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "float, float16, bfloat16",
                  .shape = linear_attention_shape,
                  .create = make<LinearAttention>});

}  // namespace kiln::ops
