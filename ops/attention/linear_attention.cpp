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

#include "ops/core/common.h"
#include "ops/core/workspace.h"
#include "ops/math/gemm.h"

#include <tbb/task_arena.h>

namespace kiln::ops {
namespace {

// The sizes and types one run's workspace depends on.
struct Request {
  int64_t B = 0, T = 0, Hq = 0, Hk = 0, dk = 0, dv = 0;
  DataType type = DataType::Float;  // query, key, value, decay and beta
  int64_t decay = 0, beta = 0;      // their elements (0: absent)
  bool delta = false;
  bool state_in_float = false;  // output 1 is a float tensor (else the state is kept here)
  int threads = 1;
  int64_t rows() const { return (delta ? 1 : 0) + Hq / Hk; }
  // Tasks (batch, KV head) and the grain parallel_for takes them in.
  int64_t tasks() const { return B * Hk; }
  int64_t grain() const { return grain_for(T * dk * dv * (rows() + 2)); }
};

// The workspace, as both the kernel and linear_attention_workspace lay it out: the inputs
// widened to float when they are of another type; the output and the state in float unless
// they are float outputs; and per thread slot (one when the tasks run on the calling thread)
// a task's product operands [rows, d_k], results [rows, d_v], decay [d_k] and value [d_v].
struct Parts {
  WorkspaceLayout layout;
  int q = -1, k = -1, v = -1, decay = -1, beta = -1, out = -1, state = -1, slots = -1;
  int count = 1;         // thread slots
  int64_t per_slot = 0;  // floats of each slot
};

Parts linear_parts(const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const int64_t widen = r.type == DataType::Float ? 0 : 1;
  p.q = l.add(DataType::Float, widen * r.B * r.T * r.Hq * r.dk);
  p.k = l.add(DataType::Float, widen * r.B * r.T * r.Hk * r.dk);
  p.v = l.add(DataType::Float, widen * r.B * r.T * r.Hk * r.dv);
  p.decay = l.add(DataType::Float, widen * r.decay);
  p.beta = l.add(DataType::Float, widen * r.beta);
  p.out = l.add(DataType::Float, widen * r.B * r.T * r.Hq * r.dv);
  p.state = l.add(DataType::Float, r.state_in_float ? 0 : r.B * r.Hk * r.dk * r.dv);
  p.count = r.tasks() <= r.grain() || r.threads <= 1 ? 1 : r.threads;
  p.per_slot = r.rows() * (r.dk + r.dv) + r.dk + r.dv;
  p.slots = l.add(DataType::Float, r.tasks() > 0 ? p.count * p.per_slot : 0);
  return p;
}

// `t`'s elements (contiguous: the op takes no strided inputs) as floats: in place when they
// are float, else widened into `room`.
const float* floats(const Tensor& t, float* room) {
  if (t.dtype() == DataType::Float) return t.data<const float>();
  dispatch(TypeList<float16, bfloat16>{}, t.dtype(), [&]<typename T>() {
    const T* src = t.data<const T>();
    for (int64_t i = 0; i < t.numel(); ++i) room[i] = static_cast<float>(src[i]);
  });
  return room;
}

// dst (float16 or bfloat16) = the floats of `src`.
void narrow(const float* src, const Tensor& dst) {
  dispatch(TypeList<float16, bfloat16>{}, dst.dtype(), [&]<typename T>() {
    T* d = dst.data<T>();
    for (int64_t i = 0; i < dst.numel(); ++i) d[i] = T(src[i]);
  });
}

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
    if (!type_in(TypeList<float, float16, bfloat16>{}, q.dtype())) {
      ctx.fail("takes float, float16 or bfloat16, got " + q.describe());
    }
    const int64_t state_size = B * Hk * dk * dv;
    const Tensor out_t = ctx.output(0, q.dtype(), {B, T, Hq * dv});
    Tensor st_t;
    if (ctx.has_output(1)) st_t = ctx.output(1, state_type, state_shape);
    Request req;
    req.B = B, req.T = T, req.Hq = Hq, req.Hk = Hk, req.dk = dk, req.dv = dv;
    req.type = q.dtype();
    req.decay = gated_ ? ctx.input(4).numel() : 0;
    req.beta = delta_ ? ctx.input(5).numel() : 0;
    req.delta = delta_;
    req.state_in_float = st_t.defined() && state_type == DataType::Float;
    req.threads = ctx.threads();
    const Parts parts = linear_parts(req);
    const Workspace space(ctx, parts.layout);
    float* const out_p =
        q.dtype() == DataType::Float ? out_t.data<float>() : space.data<float>(parts.out);
    float* const st_p = req.state_in_float ? st_t.data<float>() : space.data<float>(parts.state);
    if (ctx.has_input(3)) {
      const Tensor& past = ctx.input(3);
      if (past.dtype() == DataType::Float) {
        std::copy(past.data<const float>(), past.data<const float>() + state_size, st_p);
      } else {
        floats(past, st_p);
      }
      ctx.count_copy(static_cast<uint64_t>(state_size) * sizeof(float));
    } else {
      std::fill(st_p, st_p + state_size, 0.f);
    }
    const float* const qf = floats(q, space.data<float>(parts.q));
    const float* const kf = floats(k, space.data<float>(parts.k));
    const float* const vf = floats(v, space.data<float>(parts.v));
    const float* const gf = gated_ ? floats(ctx.input(4), space.data<float>(parts.decay)) : nullptr;
    const float* const bf = delta_ ? floats(ctx.input(5), space.data<float>(parts.beta)) : nullptr;
    const float scale = scale_ != 0.0f ? scale_ : 1.0f / std::sqrt(static_cast<float>(dk));

    // Per token and KV head, with e the decay (1 when not gated) and S the state before it,
    // one product reads S once and one pass writes it:
    //   [u; r_1 .. r_G] = [k*e; q_1*e; ..; q_G*e] S   (rows times e elementwise; u for delta)
    //   v' = beta (v - u) for delta rules, else v
    //   o_g = scale (r_g + (q_g . k) v')               (= scale S'^T q_g)
    //   S' = diag(e) S + k v'^T
    const int64_t first = delta_ ? 1 : 0, rows = first + group;
    float* const slots = space.data<float>(parts.slots);
    auto body = [&](int64_t begin, int64_t end) {
      int slot = parts.count == 1 ? 0 : tbb::this_task_arena::current_thread_index();
      if (slot < 0 || slot >= parts.count) slot = 0;
      float* const a = slots + slot * parts.per_slot;
      float* const r = a + rows * dk;
      float* const e = r + rows * dv;
      float* const vt = e + dk;
      std::fill(e, e + dk, 1.0f);
      math::GemmOptions single;
      single.max_threads = 1;  // the heads are the tasks
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / Hk, h = bh % Hk;
        float* s = st_p + bh * dk * dv;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t tok = b * T + t;
          const float* kt = kf + (tok * Hk + h) * dk;
          const float* vsrc = vf + (tok * Hk + h) * dv;
          const float* qg = qf + (tok * Hq + h * group) * dk;  // the group's queries
          float* og = out_p + (tok * Hq + h * group) * dv;
          if (gated_) {
            const float* g = gf + (tok * Hk + h) * (decay_width == Hk ? 1 : dk);
            if (decay_width == Hk) {
              std::fill(e, e + dk, std::exp(g[0]));
            } else {
              for (int64_t d = 0; d < dk; ++d) e[d] = std::exp(g[d]);
            }
          }
          if (delta_) {
            for (int64_t d = 0; d < dk; ++d) a[d] = kt[d] * e[d];
          }
          for (int64_t gi = 0; gi < group; ++gi) {
            float* ar = a + (first + gi) * dk;
            for (int64_t d = 0; d < dk; ++d) ar[d] = qg[gi * dk + d] * e[d];
          }
          math::sgemm(math::MatrixView::row_major(a, rows, dk, dk),
                      math::MatrixView::row_major(s, dk, dv, dv), r, dv, single);
          if (delta_) {
            const float beta = bf[tok * beta_width + (beta_width == 1 ? 0 : h)];
            for (int64_t j = 0; j < dv; ++j) vt[j] = beta * (vsrc[j] - r[j]);
          } else {
            std::copy(vsrc, vsrc + dv, vt);
          }
          for (int64_t gi = 0; gi < group; ++gi) {
            const float* q1 = qg + gi * dk;
            float qk = 0.0f;
            for (int64_t d = 0; d < dk; ++d) qk += q1[d] * kt[d];
            const float* rg = r + (first + gi) * dv;
            float* o = og + gi * dv;
            for (int64_t j = 0; j < dv; ++j) o[j] = scale * (rg[j] + qk * vt[j]);
          }
          update_state(s, dk, dv, gated_ ? e : nullptr, kt, vt);
        }
      }
    };
    if (parts.count == 1) {
      body(0, B * Hk);
    } else {
      parallel_for(B * Hk, req.grain(), body);
    }
    if (q.dtype() != DataType::Float) narrow(out_p, out_t);
    if (st_t.defined() && !req.state_in_float) narrow(st_p, st_t);
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
  const int64_t hq = c.attr_int("q_num_heads", 0), hk = c.attr_int("kv_num_heads", 0);
  if (hq <= 0 || hk <= 0 || hq % hk || q.size() != 3 || v.size() != 3 || c.dtype(1) != c.dtype(0) ||
      c.dtype(2) != c.dtype(0) || q[2] % hq || v[2] % hk) {
    unknown("query, key and value do not fit the head counts");
  }
  const int64_t dk = q[2] / hq, dv = v[2] / hk;
  if (k != Shape{q[0], q[1], hk * dk} || v[0] != q[0] || v[1] != q[1]) {
    unknown("key or value does not match query");
  }
  const std::string rule = c.attr_string("update_rule", "gated_delta");
  if (c.has_input(4) != (rule == "gated" || rule == "gated_delta") ||
      c.has_input(5) != (rule == "delta" || rule == "gated_delta")) {
    unknown("decay or beta does not fit update_rule");
  }
  const Shape state{q[0], hk, dk, dv};
  if (c.has_input(3) && c.shape(3) != state) unknown("past_state does not fit");
  c.set(0, c.dtype(0), {q[0], q[1], hq * dv});
  c.set(1, c.has_input(3) ? c.dtype(3) : c.dtype(0), state);
}

// The kernel's workspace (linear_parts) for these shapes on c.threads() threads.
uint64_t linear_attention_workspace(const ShapeContext& c) {
  const Shape& q = c.shape(0);
  const Shape& v = c.shape(2);
  const int64_t hq = c.attr_int("q_num_heads", 0), hk = c.attr_int("kv_num_heads", 0);
  if (hq <= 0 || hk <= 0 || hq % hk || q.size() != 3 || v.size() != 3 || q[2] < 0 || v[2] < 0)
    unknown("query, key and value do not fit the head counts");
  Request r;
  r.B = q[0], r.T = q[1], r.Hq = hq, r.Hk = hk, r.dk = q[2] / hq, r.dv = v[2] / hk;
  if (r.B < 0 || r.T < 0) unknown("sizes");
  r.type = c.dtype(0);
  r.decay = c.has_input(4) ? numel_or_unknown(c.shape(4)) : 0;
  r.beta = c.has_input(5) ? numel_or_unknown(c.shape(5)) : 0;
  const std::string rule = c.attr_string("update_rule", "gated_delta");
  r.delta = rule == "delta" || rule == "gated_delta";
  const DataType state = c.has_input(3) ? c.dtype(3) : r.type;
  r.state_in_float = c.has_output(1) && state == DataType::Float;
  r.threads = c.threads();
  return linear_parts(r).layout.bytes();
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
                  .workspace = linear_attention_workspace,
                  .create = make<LinearAttention>});

}  // namespace kiln::ops
