// Attention (ai.onnx 23+): multi-head scaled dot-product attention with grouped KV heads
// (GQA/MQA), causal and sliding-window masking, boolean or additive masks, an internal KV
// cache (past_key/past_value -> present_key/present_value), an external one
// (nonpad_kv_seqlen), softcap and the optional qk_matmul_output.
//
// The product itself is the attention core (ops/attention/attention_core.h): work split over
// (batch, query head, block of query rows), each block one product in the GEMM layer reading the
// inputs in place. Half-precision inputs are widened to float once.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/attention/attention_core.h"
#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

using sdpa::append_cache;
using sdpa::convert_into;
using sdpa::convert_value;
using sdpa::heads_view;
using sdpa::kPosLimit;
using sdpa::Layout;
using sdpa::layout_of;
using sdpa::MaskKind;
using sdpa::Problem;

// A 4-D tensor the GEMMs can map: element type `want`, unit stride along the last axis and a
// positive row stride. Returns `t` itself when it already is one, else converted into its
// workspace part `part` (attention_parts), or for a layout the GEMMs cannot read (a last axis
// that is not the innermost, broadcast or reversed rows) a dense copy, as the executor makes
// for an op without strided inputs.
Tensor mappable(OpContext& ctx, const Tensor& t, DataType want, const Workspace& space, int part) {
  const Shape& s = t.strides();
  const bool layout_ok = (t.dim(3) <= 1 || s[3] == 1) && (t.dim(2) <= 1 || s[2] > 0);
  if (t.dtype() == want && layout_ok) return t;
  if (t.dtype() == want) {
    Tensor c = t.contiguous();
    ctx.count_copy(c.nbytes(), CopyCause::Contiguous);
    return c;
  }
  Tensor c = space.tensor(part, t.shape());
  convert_into(t, c);
  return c;
}

// What the workspace of one run holds beside the core's scratch, from the node's sizes and
// types.
struct Request {
  sdpa::Dims d;                                                            // T counts the past
  DataType q = DataType::Float, k = DataType::Float, v = DataType::Float;  // after the cache
  bool present_k = false, present_v = false;  // a past given without output 1 / 2
  bool qk = false;                            // output 3
  DataType mask = DataType::Undefined;        // attn_mask's type (Undefined: none)
  int64_t mask_elements = 0;
  bool nonpad = false;
  int threads = 1;
};

// The workspace, as both the kernel and attention_workspace lay it out: present K and V
// when they are not outputs; Q, K and V, the output, the scores output and an additive mask
// converted to the compute type when they are of another; nonpad_kv_seqlen; the core's
// scratch (packed K/V, each thread's scores). Parts not taken are empty.
struct Parts {
  WorkspaceLayout layout;
  int present_k = -1, present_v = -1, q = -1, k = -1, v = -1, y = -1, qk = -1, mask = -1;
  int nonpad = -1;
  sdpa::CoreParts core;
};

Parts attention_parts(const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const sdpa::Dims& d = r.d;
  const DataType ct = r.q == DataType::Double ? DataType::Double : DataType::Float;
  auto in_ct = [&](DataType t, int64_t n) { return t == ct ? 0 : n; };
  p.present_k = l.add(r.k, r.present_k ? d.B * d.Hkv * d.T * d.D : 0);
  p.present_v = l.add(r.v, r.present_v ? d.B * d.Hkv * d.T * d.Dv : 0);
  p.q = l.add(ct, in_ct(r.q, d.B * d.Hq * d.Sq * d.D));
  p.k = l.add(ct, in_ct(r.k, d.B * d.Hkv * d.T * d.D));
  p.v = l.add(ct, in_ct(r.v, d.B * d.Hkv * d.T * d.Dv));
  p.y = l.add(ct, in_ct(r.q, d.B * d.Hq * d.Sq * d.Dv));
  p.qk = l.add(ct, r.qk ? in_ct(r.q, d.B * d.Hq * d.Sq * d.T) : 0);
  const bool convert_mask = r.mask != DataType::Undefined && r.mask != DataType::Bool;
  p.mask = l.add(ct, convert_mask ? in_ct(r.mask, r.mask_elements) : 0);
  p.nonpad = l.add(DataType::Int64, r.nonpad ? d.B : 0);
  p.core = sdpa::core_parts(l, d, ct, r.threads);
  return p;
}

// K and V with one batch row for a Q of several: every row of Q attends to the same keys and
// values, as the MatMuls an Attention is fused from broadcast them (a beam search's shared
// cross-attention cache). Only without a past, nonpad lengths or present outputs, which
// would need a row per batch.
bool kv_broadcasts(int64_t batch, int64_t k_batch, int64_t v_batch, bool past, bool present) {
  return batch > 1 && k_batch == 1 && v_batch == 1 && !past && !present;
}

// Shared K and V with one query row per batch row and nothing that tells the rows apart (no
// mask, causal or window limit, scores output): the rows are then one block of query rows
// for the one K and V, which each head reads once instead of once per batch row (a beam
// search's cross-attention step). The kernel and the workspace rule both ask.
bool rows_fold(bool shared_kv, int64_t sq, bool causal, bool window, bool mask, bool qk) {
  return shared_kv && sq == 1 && !causal && !window && !mask && !qk;
}

class Attention final : public Kernel {
 public:
  explicit Attention(const NodeInfo& info)
      : causal_(info.attr_int("is_causal", 0) != 0),
        q_heads_(info.attr_int("q_num_heads", 0)),
        kv_heads_(info.attr_int("kv_num_heads", 0)),
        mode_(info.attr_int("qk_matmul_output_mode", 0)),
        has_scale_(info.has_attr("scale")),
        scale_(info.attr_float("scale", 1.0f)),
        softcap_(info.attr_float("softcap", 0.0f)) {
    if (mode_ < 0 || mode_ > 3) info.fail("qk_matmul_output_mode must be 0, 1, 2 or 3");
    if (q_heads_ < 0 || kv_heads_ < 0) info.fail("head counts must be positive");
    if (info.has_attr("softmax_precision")) {
      const int64_t sp = info.attr_int("softmax_precision");
      if (sp != 1 && sp != 10 && sp != 11 && sp != 16) {
        info.fail("softmax_precision must be FLOAT, FLOAT16, DOUBLE or BFLOAT16");
      }
    }
    if (info.opset() < 24 && info.num_inputs() > 6) {
      info.fail("nonpad_kv_seqlen needs opset 24");
    }
    if (info.opset() >= 25) {
      left_ = info.attr_int("left_window_size", -1);
      right_ = info.attr_int("right_window_size", -1);
      if (left_ < -1 || right_ < -1) info.fail("window sizes must be -1 or non-negative");
      left_ = std::min(left_, kPosLimit);
      right_ = std::min(right_, kPosLimit);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& q_in = ctx.input(0);
    const Tensor& k_in = ctx.input(1);
    const Tensor& v_in = ctx.input(2);
    const size_t rank = q_in.rank();
    if ((rank != 3 && rank != 4) || k_in.rank() != rank || v_in.rank() != rank) {
      ctx.fail("Q, K and V must all be 3-D or all 4-D, got " + q_in.describe() + ", " +
               k_in.describe() + ", " + v_in.describe());
    }
    if (k_in.dtype() != q_in.dtype() || !type_in(FloatTypes{}, q_in.dtype()) ||
        !type_in(FloatTypes{}, v_in.dtype())) {
      ctx.fail("Q and K must share a float type and V must be a float type");
    }
    Tensor q = q_in, k = k_in, v = v_in;
    if (rank == 3) {
      if (q_heads_ <= 0 || kv_heads_ <= 0) {
        ctx.fail("3-D inputs need positive q_num_heads and kv_num_heads");
      }
      if (q.dim(2) % q_heads_ || k.dim(2) % kv_heads_ || v.dim(2) % kv_heads_) {
        ctx.fail("hidden sizes " + q.describe() + ", " + k.describe() + ", " + v.describe() +
                 " are not divisible by the head counts");
      }
      q = heads_view(q, q_heads_);
      k = heads_view(k, kv_heads_);
      v = heads_view(v, kv_heads_);
    } else if ((q_heads_ && q_heads_ != q.dim(1)) || (kv_heads_ && kv_heads_ != k.dim(1))) {
      ctx.fail("q_num_heads/kv_num_heads disagree with the 4-D input shapes");
    }
    const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), D = q.dim(3);
    const int64_t Hkv = k.dim(1), S = k.dim(2), Dv = v.dim(3);
    // K and V of one batch row may serve every row of Q (kv_broadcasts).
    const bool shared_kv = kv_broadcasts(B, k.dim(0), v.dim(0),
                                         ctx.has_input(4) || ctx.has_input(5) || ctx.has_input(6),
                                         ctx.has_output(1) || ctx.has_output(2));
    if (!shared_kv && (k.dim(0) != B || v.dim(0) != B)) {
      ctx.fail("Q, K and V shapes disagree: " + q_in.describe() + ", " + k_in.describe() + ", " +
               v_in.describe());
    }
    if (v.dim(1) != Hkv || v.dim(2) != S || k.dim(3) != D) {
      ctx.fail("Q, K and V shapes disagree: " + q_in.describe() + ", " + k_in.describe() + ", " +
               v_in.describe());
    }
    if (Hkv <= 0 || Hq % Hkv != 0) {
      ctx.fail("q_num_heads " + std::to_string(Hq) + " is not a multiple of kv_num_heads " +
               std::to_string(Hkv));
    }

    // KV cache: present = concat(past, new) along the sequence, written once, into outputs
    // 1 and 2 or the workspace.
    const bool has_past = ctx.has_input(4) || ctx.has_input(5);
    if (has_past && !(ctx.has_input(4) && ctx.has_input(5))) {
      ctx.fail("past_key and past_value must be given together");
    }
    int64_t past = 0;
    Tensor present_k, present_v;
    if (has_past) {
      const Tensor& pk = ctx.input(4);
      const Tensor& pv = ctx.input(5);
      past = pk.rank() == 4 ? pk.dim(2) : -1;
      if (pk.rank() != 4 || pv.rank() != 4 || pk.dtype() != k.dtype() || pv.dtype() != v.dtype() ||
          pk.shape() != Shape{B, Hkv, past, D} || pv.shape() != Shape{B, Hkv, past, Dv}) {
        ctx.fail("past_key " + pk.describe() + " / past_value " + pv.describe() +
                 " do not match K and V");
      }
      if (ctx.has_output(1)) present_k = ctx.output(1, k.dtype(), {B, Hkv, past + S, D});
      if (ctx.has_output(2)) present_v = ctx.output(2, v.dtype(), {B, Hkv, past + S, Dv});
    } else {
      if (ctx.has_output(1)) ctx.set_output(1, k);
      if (ctx.has_output(2)) ctx.set_output(2, v);
    }
    const int64_t T = past + S;
    if (ctx.has_input(6) && has_past) {
      ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value");
    }

    const bool fold = rows_fold(shared_kv, Sq, causal_, left_ >= 0 || right_ >= 0, ctx.has_input(3),
                                ctx.has_output(3));
    const DataType ct = q.dtype() == DataType::Double ? DataType::Double : DataType::Float;
    Shape y_shape = rank == 3 ? Shape{B, Sq, Hq * Dv} : Shape{B, Hq, Sq, Dv};
    Tensor y_out = ctx.output(0, q_in.dtype(), y_shape);
    Tensor qk_out;
    if (ctx.has_output(3)) qk_out = ctx.output(3, q_in.dtype(), {B, Hq, Sq, T});

    // The workspace, after the outputs (attention_parts).
    Request r;
    r.d = fold ? sdpa::Dims{1, Hq, Hkv, B, T, D, Dv} : sdpa::Dims{B, Hq, Hkv, Sq, T, D, Dv};
    r.q = q.dtype(), r.k = k.dtype(), r.v = v.dtype();
    r.present_k = has_past && !ctx.has_output(1);
    r.present_v = has_past && !ctx.has_output(2);
    r.qk = ctx.has_output(3);
    if (ctx.has_input(3)) r.mask = ctx.input(3).dtype(), r.mask_elements = ctx.input(3).numel();
    r.nonpad = ctx.has_input(6);
    r.threads = ctx.threads();
    const Parts parts = attention_parts(r);
    const Workspace space(ctx, parts.layout);

    if (has_past) {
      if (!present_k.defined()) present_k = space.tensor(parts.present_k, {B, Hkv, T, D});
      if (!present_v.defined()) present_v = space.tensor(parts.present_v, {B, Hkv, T, Dv});
      append_cache(ctx, ctx.input(4), k, present_k);
      append_cache(ctx, ctx.input(5), v, present_v);
      k = present_k;
      v = present_v;
    }
    const int64_t* nonpad = nullptr;
    if (ctx.has_input(6)) {
      const Tensor& n = ctx.input(6);
      if (n.dtype() != DataType::Int64 || n.shape() != Shape{B}) {
        ctx.fail("nonpad_kv_seqlen must be int64 of shape [batch], got " + n.describe());
      }
      const Tensor copy = space.tensor(parts.nonpad, {B});
      copy_elements(n, copy);
      nonpad = copy.data<const int64_t>();
    }

    Tensor y = y_out.dtype() == ct ? y_out : space.tensor(parts.y, y_shape);
    Tensor qk;
    if (qk_out.defined()) {
      qk = qk_out.dtype() == ct ? qk_out : space.tensor(parts.qk, qk_out.shape());
    }
    const Tensor qc = mappable(ctx, q, ct, space, parts.q);
    const Tensor kc = mappable(ctx, k, ct, space, parts.k);
    const Tensor vc = mappable(ctx, v, ct, space, parts.v);
    const Tensor y4 = rank == 3 ? heads_view(y, Hq) : y;

    auto solve = [&]<typename C>() {
      Problem<C> p;
      static_cast<sdpa::Dims&>(p) = r.d;
      p.q = qc.data<const C>(), p.lq = layout_of(qc);
      p.k = kc.data<const C>(), p.lk = layout_of(kc);
      p.v = vc.data<const C>(), p.lv = layout_of(vc);
      p.y = y4.data<C>(), p.ly = layout_of(y4);
      if (shared_kv) p.lk.batch = p.lv.batch = 0;  // every row of Q reads the one row
      if (fold) {  // the batch rows as query rows of one batch (r.d)
        p.lq.row = p.lq.batch, p.ly.row = p.ly.batch;
        p.lq.batch = p.ly.batch = 0;
      }
      p.qk = qk.defined() ? qk.data<C>() : nullptr;
      p.mode = static_cast<int>(mode_);
      const double scale = has_scale_ ? scale_ : (D > 0 ? 1.0 / std::sqrt(double(D)) : 1.0);
      p.scale = static_cast<C>(scale);
      p.softcap = static_cast<C>(softcap_);
      p.causal = causal_, p.left = left_, p.right = right_;
      p.past = past, p.nonpad = nonpad;
      if (ctx.has_input(3)) setup_mask(ctx, ctx.input(3), ct, space, parts.mask, &p);
      sdpa::solve(p, space, parts.core);
    };
    if (ct == DataType::Double) {
      solve.template operator()<double>();
    } else {
      solve.template operator()<float>();
    }
    if (y.storage() != y_out.storage()) convert_into(y, y_out);
    if (qk.defined() && qk.storage() != qk_out.storage()) convert_into(qk, qk_out);
  }

 private:
  template <typename C>
  static void setup_mask(OpContext& ctx, const Tensor& m, DataType ct, const Workspace& space,
                         int part, Problem<C>* p) {
    if (m.rank() < 1 || m.rank() > 4)
      ctx.fail("attn_mask must have rank 1 to 4, got " + m.describe());
    const int64_t want[3] = {p->B, p->Hq, p->Sq};
    const size_t pad = 4 - m.rank();
    const int64_t len = m.dim(m.rank() - 1);
    if (len > p->T) {
      ctx.fail("attn_mask " + m.describe() + " is longer than the " + std::to_string(p->T) +
               " keys");
    }
    for (size_t d = pad; d < 3; ++d) {
      const int64_t dim = m.dim(d - pad);
      if (dim != 1 && dim != want[d]) {
        ctx.fail("attn_mask " + m.describe() +
                 " does not broadcast to [batch, heads, q_len, keys]");
      }
    }
    Tensor t = m;
    if (m.dtype() == DataType::Bool) {
      p->mask = MaskKind::Bool;
      p->mask_bool = reinterpret_cast<const uint8_t*>(t.raw_data());
    } else {
      if (m.dtype() != ct) {
        if (!type_in(NumericTypes{}, m.dtype())) throw_unsupported_type(m.dtype(), "attn_mask");
        t = space.tensor(part, m.shape());
        dispatch(NumericTypes{}, m.dtype(), [&]<typename M>() {
          unary_loop<M, C>(m, t, [](M x) { return convert_value<C>(x); });
        });
      }
      p->mask = MaskKind::Additive;
      p->mask_add = t.data<const C>();
    }
    for (size_t d = pad; d < 4; ++d) {
      p->ms[d] = t.dim(d - pad) == 1 && d < 3 ? 0 : t.strides()[d - pad];
    }
    p->mask_len = len;
  }

  bool causal_;
  int64_t q_heads_, kv_heads_, mode_;
  bool has_scale_;
  float scale_, softcap_;
  int64_t left_ = -1, right_ = -1;
};

// The sizes the kernel reads off Q, K and V ([B, Hq, Sq, D], [B, Hkv, S, D], [B, Hkv, S, Dv]),
// 3-D inputs split into heads by q_num_heads/kv_num_heads; unknown() when they are not
// known or disagree (the kernel then fails the node).
struct AttentionSizes {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, S = 0, D = 0, Dv = 0, past = 0;
  size_t rank = 0;
  bool shared_kv = false;
};

AttentionSizes attention_sizes(const ShapeContext& c) {
  const Shape& q = c.shape(0);
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  AttentionSizes z;
  z.rank = q.size();
  if ((z.rank != 3 && z.rank != 4) || k.size() != z.rank || v.size() != z.rank) {
    unknown("Q, K and V of another rank");
  }
  for (const Shape* s : {&q, &k, &v})
    for (int64_t d : *s)
      if (d < 0) unknown("sizes");
  if (z.rank == 3) {
    const int64_t qh = c.attr_int("q_num_heads", 0), kvh = c.attr_int("kv_num_heads", 0);
    if (qh <= 0 || kvh <= 0 || q[2] % qh || k[2] % kvh || v[2] % kvh) unknown("head counts");
    z = {q[0], qh, kvh, q[1], k[1], q[2] / qh, v[2] / kvh, 0, 3};
  } else {
    z = {q[0], q[1], k[1], q[2], k[2], q[3], v[3], 0, 4};
  }
  const bool shared_kv =
      kv_broadcasts(z.B, k[0], v[0], c.has_input(4) || c.has_input(5) || c.has_input(6),
                    c.has_output(1) || c.has_output(2));
  z.shared_kv = shared_kv;
  if ((!shared_kv && (k[0] != z.B || v[0] != z.B)) ||
      (z.rank == 4 && (v[1] != z.Hkv || v[2] != z.S)) || (z.rank == 3 && v[1] != z.S) ||
      (z.rank == 4 && k[3] != z.D) || (z.rank == 3 && k[2] / z.Hkv != z.D) || z.Hkv <= 0 ||
      z.Hq % z.Hkv) {
    unknown("Q, K and V disagree");
  }
  if (c.has_input(4) != c.has_input(5)) unknown("past_key without past_value");
  if (c.has_input(4)) {
    const Shape& pk = c.shape(4);
    if (pk.size() != 4 || pk[2] < 0) unknown("past of another rank");
    z.past = pk[2];
  }
  return z;
}

// Y ([B, Sq, Hq*Dv] for 3-D inputs, else [B, Hq, Sq, Dv]), present_key/value (the past
// extended by K and V, or K and V themselves in heads without a past) and the scores.
void attention_shape(ShapeContext& c) {
  if (!c.inputs_known()) {
    // Partial facts: Y has Q's rank (3 or 4), the present keys and values and the scores are
    // 4-D.
    const ValueFacts& q = c.facts(0);
    ValueFacts y = typed_facts(q.dtype);
    if (q.ranked) {
      for (size_t k = 0; k < q.shape.size(); ++k) append_dim(y, kUnknownDim);
    }
    c.set(0, std::move(y));
    const DataType types[] = {c.facts(1).dtype, c.facts(2).dtype, q.dtype};
    for (size_t o = 1; o < 4; ++o) c.set(o, ranked_facts(types[o - 1], Shape(4, kUnknownDim)));
    return;
  }
  const AttentionSizes z = attention_sizes(c);
  const int64_t T = z.past + z.S;
  c.set(0, c.dtype(0), z.rank == 3 ? Shape{z.B, z.Sq, z.Hq * z.Dv} : Shape{z.B, z.Hq, z.Sq, z.Dv});
  c.set(1, c.dtype(1), {z.B, z.Hkv, T, z.D});
  c.set(2, c.dtype(2), {z.B, z.Hkv, T, z.Dv});
  c.set(3, c.dtype(0), {z.B, z.Hq, z.Sq, T});
}

// In the kernel's order: present_key/value made for a past, else K and V viewed in heads
// (heads_view's strides); then Y and the scores.
void place_attention(Placement& p) {
  const ir::Node& node = p.node();
  const bool has_past = node.inputs.size() > 4 && node.inputs[4] != ir::kNoValue;
  const auto produced = [&](size_t o) {
    return o < node.outputs.size() && node.outputs[o] != ir::kNoValue;
  };
  for (size_t o : {size_t{1}, size_t{2}}) {
    if (!produced(o)) continue;
    if (has_past) {
      p.allocate(o);
      continue;
    }
    Shape s = p.strides(o);
    if (s.size() == 3) {
      const int64_t d = p.output(o).shape[3];
      s = {s[0], d * s[2], s[1], s[2]};
    }
    p.view(o, o, std::move(s));
  }
  p.allocate(0);
  if (produced(3)) p.allocate(3);
}

// The kernel's workspace (attention_parts) for these shapes on c.threads() threads.
uint64_t attention_workspace(const ShapeContext& c) {
  const AttentionSizes z = attention_sizes(c);
  const bool window = c.opset() >= 25 && (c.attr_int("left_window_size", -1) >= 0 ||
                                          c.attr_int("right_window_size", -1) >= 0);
  const bool fold = rows_fold(z.shared_kv, z.Sq, c.attr_int("is_causal", 0) != 0, window,
                              c.has_input(3), c.has_output(3));
  Request r;
  r.d = fold ? sdpa::Dims{1, z.Hq, z.Hkv, z.B, z.past + z.S, z.D, z.Dv}
             : sdpa::Dims{z.B, z.Hq, z.Hkv, z.Sq, z.past + z.S, z.D, z.Dv};
  r.q = c.dtype(0), r.k = c.dtype(1), r.v = c.dtype(2);
  r.present_k = c.has_input(4) && !c.has_output(1);
  r.present_v = c.has_input(4) && !c.has_output(2);
  r.qk = c.has_output(3);
  if (c.has_input(3)) r.mask = c.dtype(3), r.mask_elements = numel_or_unknown(c.shape(3));
  r.nonpad = c.has_input(6);
  r.threads = c.threads();
  return attention_parts(r).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "Attention",
                  .since = 23,
                  .min_inputs = 3,
                  .max_inputs = 7,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = attention_shape,
                  .place = place_attention,
                  .workspace = attention_workspace,
                  .create = make<Attention>});

}  // namespace kiln::ops
