// com.microsoft.MultiHeadAttention: attention over separate, already projected Q, K and V, as
// onnxruntime's CPU kernel computes it.
//
//   Q [B, S, D] (+ bias[0, D)), K [B, L, D] (+ bias[D, 2D)), V [B, L, Dv] (+ bias[2D, 2D+Dv)),
//   or K and V given per head [B, N, L, H] (cross attention with cached K and V, no bias);
//   K, V = past (each [B, N, P, H]) followed by this step's; present_key/present_value = them
//   out[b, s, n] = softmax(scale Q K^T + mask + attention_bias) V, scale 1/sqrt(H) by default
//
// key_padding_mask: 1-D [B] (keys from that end position masked), 2-D [B, T] or 3-D
// [B, S, T] of 1 (attend) / 0 (masked). A masked key's score gets mask_filter_value
// (-10000 unless given) as onnxruntime does, not -inf, so a row masked throughout still has
// a softmax; `unidirectional` masks keys after the query's position the same way.
// The attention itself is the shared core (ops/attention/attention_core.h); masks become one
// additive bias tensor it reads.
//
// Not supported (Unsupported errors): packed QKV / packed KV (5-D inputs, which onnxruntime's
// CPU kernel does not implement either), past_sequence_length (buffer sharing),
// cache_indirection (beam search), the qk output and mask [3B + 2].
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/attention/attention_core.h"
#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// The sizes and inputs one run's workspace depends on.
struct Request {
  sdpa::Dims d;                               // T counts the past
  int64_t L = 0;                              // this step's keys
  bool bias = false;                          // input 3
  bool present_k = false, present_v = false;  // a past without output 1 / 2
  bool mask = false;                          // key_padding_mask or unidirectional
  int64_t mask_heads = 1;                     // heads of the mask (attention_bias's)
  int threads = 1;
};

// The workspace, as both the kernel and multihead_attention_workspace lay it out: Q, K and V
// with their bias added; present K and V when they are not outputs; the additive mask; the
// core's scratch. Parts not taken are empty.
struct Parts {
  WorkspaceLayout layout;
  int q = -1, k = -1, v = -1, present_k = -1, present_v = -1, mask = -1;
  sdpa::CoreParts core;
};

Shape mask_shape(const Request& r) {
  return {r.d.B, r.mask_heads, r.d.Sq, r.d.T};
}

Parts mha_parts(const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const sdpa::Dims& d = r.d;
  const int64_t b = r.bias ? 1 : 0;
  p.q = l.add(DataType::Float, b * d.B * d.Sq * d.Hq * d.D);
  p.k = l.add(DataType::Float, b * d.B * r.L * d.Hkv * d.D);
  p.v = l.add(DataType::Float, b * d.B * r.L * d.Hkv * d.Dv);
  p.present_k = l.add(DataType::Float, r.present_k ? d.B * d.Hkv * d.T * d.D : 0);
  p.present_v = l.add(DataType::Float, r.present_v ? d.B * d.Hkv * d.T * d.Dv : 0);
  p.mask = l.add(DataType::Float, r.mask ? shape_numel(mask_shape(r)) : 0);
  p.core = sdpa::core_parts(l, d, DataType::Float, r.threads);
  return p;
}

class MultiHeadAttention final : public Kernel {
 public:
  explicit MultiHeadAttention(const NodeInfo& info)
      : heads_(info.attr_int("num_heads")),
        unidirectional_(info.attr_int("unidirectional", 0) != 0),
        scale_(info.attr_float("scale", 0.0f)),
        filter_(info.attr_float("mask_filter_value", -10000.0f)) {
    if (heads_ <= 0) info.fail("num_heads must be positive");
    if (info.has_input(8)) {
      info.fail("past_sequence_length (buffer sharing) is not supported", ErrorKind::Unsupported);
    }
    if (info.has_input(9)) info.fail("cache_indirection is not supported", ErrorKind::Unsupported);
    if (info.has_output(3)) info.fail("the qk output is not supported", ErrorKind::Unsupported);
  }

  void run(OpContext& ctx) override {
    const Tensor& query = ctx.input(0);
    if (query.dtype() != DataType::Float) {
      ctx.fail("takes float input, got " + query.describe(), ErrorKind::Unsupported);
    }
    if (query.rank() == 5 || (ctx.has_input(1) && ctx.input(1).rank() == 5)) {
      ctx.fail("packed QKV / packed KV inputs are not supported", ErrorKind::Unsupported);
    }
    if (!ctx.has_input(1) || !ctx.has_input(2)) ctx.fail("needs key and value");
    const Tensor& key = ctx.input(1);
    const Tensor& value = ctx.input(2);
    if (query.rank() != 3 || query.dim(2) % heads_ != 0) {
      ctx.fail("query " + query.describe() + " must be 3-D with a hidden size divisible by " +
               std::to_string(heads_) + " heads");
    }
    const int64_t B = query.dim(0), S = query.dim(1), D = query.dim(2), H = D / heads_;
    const bool per_head = key.rank() == 4;  // K and V already [B, N, L, H]
    for (const Tensor* t : {&key, &value}) {
      if (t->dtype() != DataType::Float || t->rank() != key.rank() || t->dim(0) != B ||
          (t->rank() != 3 && t->rank() != 4) || (per_head && t->dim(1) != heads_)) {
        ctx.fail("key " + key.describe() + " and value " + value.describe() +
                 " must be float [batch, L, hidden] or [batch, heads, L, head size]");
      }
    }
    const int64_t L = per_head ? key.dim(2) : key.dim(1);
    const int64_t Dv = per_head ? value.dim(3) * heads_ : value.dim(2);
    if ((per_head ? key.dim(3) != H : key.dim(2) != D) || value.dim(per_head ? 2 : 1) != L ||
        Dv % heads_ != 0) {
      ctx.fail("key " + key.describe() + " or value " + value.describe() +
               " does not match query " + query.describe());
    }
    const int64_t Hv = Dv / heads_;

    int64_t P = 0;
    if (ctx.has_input(6) || ctx.has_input(7)) {
      if (!ctx.has_input(6) || !ctx.has_input(7)) {
        ctx.fail("past_key and past_value must be given together");
      }
      const Tensor& pk = ctx.input(6);
      const Tensor& pv = ctx.input(7);
      P = pk.rank() == 4 ? pk.dim(2) : 0;
      if (per_head || pk.dtype() != DataType::Float || pv.dtype() != DataType::Float ||
          pk.shape() != Shape{B, heads_, P, H} || pv.shape() != Shape{B, heads_, P, Hv}) {
        ctx.fail("past_key " + pk.describe() + " / past_value " + pv.describe() +
                 " must be [batch, heads, past, head size] beside 3-D key and value");
      }
    }
    const bool has_past = ctx.has_input(6);
    const int64_t T = P + L;
    const Tensor* attn_bias = attention_bias(ctx, B, S, T);
    if (ctx.has_input(3)) {
      const Tensor& bias = ctx.input(3);
      if (per_head) ctx.fail("bias cannot be combined with per-head key and value");
      if (bias.dtype() != DataType::Float || bias.shape() != Shape{2 * D + Dv}) {
        ctx.fail("bias " + bias.describe() + " must be float [" + std::to_string(2 * D + Dv) + "]");
      }
    }

    // The outputs in the order the contract states them (output 0, then the presents), then
    // the workspace (mha_parts).
    Tensor& out = ctx.output(0, DataType::Float, {B, S, Dv});
    Tensor present_k, present_v;
    if (ctx.has_output(1)) present_k = ctx.output(1, DataType::Float, {B, heads_, T, H});
    if (ctx.has_output(2)) present_v = ctx.output(2, DataType::Float, {B, heads_, T, Hv});
    Request r;
    r.d = {B, heads_, heads_, S, T, H, Hv};
    r.L = L;
    r.bias = ctx.has_input(3);
    r.present_k = has_past && !ctx.has_output(1);
    r.present_v = has_past && !ctx.has_output(2);
    r.mask = ctx.has_input(4) || unidirectional_;
    r.mask_heads = attn_bias && attn_bias->dim(1) != 1 ? heads_ : 1;
    r.threads = ctx.threads();
    const Parts parts = mha_parts(r);
    const Workspace space(ctx, parts.layout);

    Tensor q = sdpa::heads_view(query, heads_), k = key, v = value;
    if (r.bias) {
      const float* pb = ctx.input(3).data<const float>();
      q = sdpa::heads_view(with_bias(query, pb, space.tensor(parts.q, query.shape())), heads_);
      k = with_bias(key, pb + D, space.tensor(parts.k, key.shape()));
      v = with_bias(value, pb + 2 * D, space.tensor(parts.v, value.shape()));
    }
    if (!per_head) {
      k = sdpa::heads_view(k, heads_);
      v = sdpa::heads_view(v, heads_);
    }
    if (has_past) {
      if (!present_k.defined()) present_k = space.tensor(parts.present_k, {B, heads_, T, H});
      if (!present_v.defined()) present_v = space.tensor(parts.present_v, {B, heads_, T, Hv});
      sdpa::append_cache(ctx, ctx.input(6), k, present_k);
      sdpa::append_cache(ctx, ctx.input(7), v, present_v);
      k = present_k;
      v = present_v;
    } else {
      if (present_k.defined()) copy_out(ctx, k, present_k);
      if (present_v.defined()) copy_out(ctx, v, present_v);
    }

    const Tensor y = sdpa::heads_view(out, heads_);
    sdpa::Problem<float> p;
    static_cast<sdpa::Dims&>(p) = r.d;
    p.q = q.data<const float>(), p.lq = sdpa::layout_of(q);
    p.k = k.data<const float>(), p.lk = sdpa::layout_of(k);
    p.v = v.data<const float>(), p.lv = sdpa::layout_of(v);
    p.y = y.data<float>(), p.ly = sdpa::layout_of(y);
    p.scale = scale_ != 0 ? scale_ : 1.0f / std::sqrt(static_cast<float>(H));
    const Tensor mask =
        r.mask ? additive_mask(ctx, B, S, P, T, attn_bias, space.tensor(parts.mask, mask_shape(r)))
        : attn_bias ? *attn_bias
                    : Tensor();
    if (mask.defined()) {
      p.mask = sdpa::MaskKind::Additive;
      p.mask_add = mask.data<const float>();
      p.mask_len = T;
      const Shape& st = mask.strides();
      for (size_t d = 0; d < 4; ++d) p.ms[d] = mask.dim(d) == 1 && d < 3 ? 0 : st[d];
    }
    sdpa::solve(p, space, parts.core);
  }

 private:
  // dst = t [B, L, n] + bias[n] (broadcast over rows); returns dst.
  static Tensor with_bias(const Tensor& t, const float* bias, Tensor dst) {
    const int64_t n = t.dim(2), rows = t.dim(0) * t.dim(1);
    const float* src = t.data<const float>();
    float* out = dst.data<float>();
    parallel_for(rows, grain_for(n), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t j = 0; j < n; ++j) out[i * n + j] = src[i * n + j] + bias[j];
      }
    });
    return dst;
  }

  // present = t ([B, N, L, H], any row layout), the present state without a past.
  static void copy_out(OpContext& ctx, const Tensor& t, const Tensor& present) {
    sdpa::copy_heads(t, present);
    ctx.count_copy(present.nbytes(), CopyCause::Kernel);
  }

  // attention_bias [B or 1, N or 1, S, T] (checked), or null when absent.
  const Tensor* attention_bias(const OpContext& ctx, int64_t B, int64_t S, int64_t T) const {
    if (!ctx.has_input(5)) return nullptr;
    const Tensor& a = ctx.input(5);
    if (a.dtype() != DataType::Float || a.rank() != 4 || (a.dim(0) != 1 && a.dim(0) != B) ||
        (a.dim(1) != 1 && a.dim(1) != heads_) || a.dim(2) != S || a.dim(3) != T) {
      ctx.fail("attention_bias " + a.describe() + " must be float [B or 1, N or 1, " +
               std::to_string(S) + ", " + std::to_string(T) + "]");
    }
    return &a;
  }

  // The additive mask [B, N or 1, S, T] of key_padding_mask, unidirectional and
  // attention_bias `bias` (null: none), into `m` (its workspace part).
  Tensor additive_mask(OpContext& ctx, int64_t B, int64_t S, int64_t P, int64_t T,
                       const Tensor* bias, Tensor m) const {
    const Tensor* pad = ctx.has_input(4) ? &ctx.input(4) : nullptr;
    const int kind = pad ? padding_kind(ctx, *pad, B, S, T) : 0;
    const int64_t NB = m.dim(1);
    float* pm = m.data<float>();
    const int32_t* pd = pad ? pad->data<const int32_t>() : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NB; ++h) {
        for (int64_t i = 0; i < S; ++i) {
          float* row = pm + ((b * NB + h) * S + i) * T;
          std::fill(row, row + T, 0.0f);
          if (kind == 1) {
            std::fill(row + std::clamp<int64_t>(pd[b], 0, T), row + T, filter_);
          } else if (kind != 0) {
            const int32_t* keep = pd + (kind == 2 ? b * T : (b * S + i) * T);
            for (int64_t j = 0; j < T; ++j) {
              if (keep[j] == 0) row[j] = filter_;
            }
          }
          if (unidirectional_) std::fill(row + std::min(T, P + i + 1), row + T, filter_);
          if (bias) {
            const Shape& bs = bias->strides();
            const float* add = bias->data<const float>() + (bias->dim(0) == 1 ? 0 : b * bs[0]) +
                               (bias->dim(1) == 1 ? 0 : h * bs[1]) + i * bs[2];
            for (int64_t j = 0; j < T; ++j) row[j] += add[j];
          }
        }
      }
    }
    return m;
  }

  // 1: key lengths [B]; 2: [B, T]; 3: [B, S, T].
  static int padding_kind(const OpContext& ctx, const Tensor& m, int64_t B, int64_t S, int64_t T) {
    if (m.dtype() != DataType::Int32)
      ctx.fail("key_padding_mask " + m.describe() + " must be int32");
    if (m.shape() == Shape{B}) return 1;
    if (m.rank() == 1 && m.dim(0) == 3 * B + 2) {
      ctx.fail("key_padding_mask of [3 * batch + 2] is not supported", ErrorKind::Unsupported);
    }
    if (m.shape() == Shape{B, T}) return 2;
    if (m.shape() == Shape{B, S, T}) return 3;
    ctx.fail("key_padding_mask " + m.describe() + " must be [B], [B, T] or [B, S, T] with B " +
             std::to_string(B) + ", S " + std::to_string(S) + ", T " + std::to_string(T));
  }

  int64_t heads_;
  bool unidirectional_;
  float scale_, filter_;
};

// output [B, S, Dv]; present_key/present_value [B, N, P + L, H].
void multihead_attention_shape(ShapeContext& c) {
  const Shape& q = c.shape(0);
  const int64_t heads = c.attr_int("num_heads", 0);
  if (q.size() != 3 || heads <= 0 || !c.has_input(1) || !c.has_input(2))
    unknown("query of another rank");
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  if (k.size() != v.size() || (k.size() != 3 && k.size() != 4)) unknown("packed key and value");
  const bool per_head = k.size() == 4;
  const int64_t hv = per_head ? v[3] : (v[2] < 0 ? -1 : v[2] / heads);
  const int64_t h = q[2] < 0 ? -1 : q[2] / heads;
  c.set(0, c.dtype(0), {q[0], q[1], hv < 0 ? -1 : hv * heads});
  int64_t total = per_head ? k[2] : k[1];
  if (c.has_input(6)) {
    const Shape& pk = c.shape(6);
    if (pk.size() != 4) unknown("past of another rank");
    total = total < 0 || pk[2] < 0 ? -1 : total + pk[2];
  }
  if (c.has_output(1)) c.set(1, c.dtype(0), {q[0], heads, total, h});
  if (c.has_output(2)) c.set(2, c.dtype(0), {q[0], heads, total, hv});
}

// The kernel's workspace (mha_parts) for these shapes on c.threads() threads.
uint64_t multihead_attention_workspace(const ShapeContext& c) {
  const Shape& q = c.shape(0);
  const int64_t heads = c.attr_int("num_heads", 0);
  if (q.size() != 3 || heads <= 0 || q[2] < 0 || !c.has_input(1) || !c.has_input(2))
    unknown("query");
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  if (k.size() != v.size() || (k.size() != 3 && k.size() != 4)) unknown("packed key and value");
  const bool per_head = k.size() == 4;
  Request r;
  r.L = per_head ? k[2] : k[1];
  const int64_t hv = per_head ? v[3] : v[2] / heads;
  int64_t past = 0;
  if (c.has_input(6)) {
    if (c.shape(6).size() != 4) unknown("past of another rank");
    past = c.shape(6)[2];
  }
  r.d = {q[0], heads, heads, q[1], past + r.L, q[2] / heads, hv};
  for (int64_t n : {q[0], q[1], r.L, hv, past})
    if (n < 0) unknown("sizes");
  r.bias = c.has_input(3);
  r.present_k = c.has_input(6) && !c.has_output(1);
  r.present_v = c.has_input(6) && !c.has_output(2);
  r.mask = c.has_input(4) || c.attr_int("unidirectional", 0) != 0;
  if (c.has_input(5)) {
    if (c.shape(5).size() != 4) unknown("attention_bias of another rank");
    r.mask_heads = c.shape(5)[1] != 1 ? heads : 1;
  }
  r.threads = c.threads();
  return mha_parts(r).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "MultiHeadAttention",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 10,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .types = "float",
                  .shape = multihead_attention_shape,
                  .workspace = multihead_attention_workspace,
                  .create = make<MultiHeadAttention>});

}  // namespace kiln::ops
