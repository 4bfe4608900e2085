// com.microsoft.GroupQueryAttention: causal self-attention with grouped KV heads and a KV
// cache, as onnxruntime-genai's decoders use it, with onnxruntime's CPU semantics.
//
//   query [B, S, N*H] with key and value [B, S, Nkv*H], or packed [B, S, (N + 2 Nkv) H]
//   past_key/past_value [B, Nkv, P, H]; seqlens_k [B] = each batch's total length - 1;
//   total_sequence_length: the batch's longest total (S when this is the first prompt)
//   present_key/present_value [B, Nkv, max(P, total), H]: batch b's past rows [0, T_b - S)
//   followed by this step's S rows (the first prompt has no past rows)
//   out[b, s] = softmax(scale Q K^T (+ softcap) + attention_bias) V over keys
//               (pos - local_window_size, pos], pos = (T_b - S) + s (s on the first prompt)
//
// do_rotary rotates Q and K (cos_cache/sin_cache [max position, rotary dim / 2]) at those
// positions. When the past buffer has room for the whole step (the decoder's max-length
// cache) and this node is its last reader, present_key/present_value are the past tensors
// themselves: only this step's rows are written (the `.place` rule tells the planner so).
// The attention is the shared core (ops/attention/attention_core.h), reading Q in place and K and V
// from present.
//
// Not supported (Unsupported errors): position_ids, head_sink / smooth_softmax, quantized
// caches (k_scale, v_scale, kv_cache_bit_width, quant types), q/k norm weights,
// query_seqlens, sliding_window_cache, causal = 0, output_qk.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/attention/attention_core.h"
#include "ops/attention/rotary.h"
#include "ops/core/common.h"

namespace kiln::ops {
namespace {

enum Input : size_t {
  kQuery,
  kKey,
  kValue,
  kPastKey,
  kPastValue,
  kSeqlensK,
  kTotalSeqLen,
  kCos,
  kSin,
  kPositionIds,
  kAttentionBias,
  kHeadSink,
};

// Sizes of one run.
struct Step {
  int64_t B = 0, S = 0, H = 0, P = 0, present = 0, total = 0;
  int64_t row = 0;  // floats per query row (N*H, or the packed width)
  bool first_prompt = false;
  // Per batch (in the workspace): keys after this step, rows before it.
  int64_t* totals = nullptr;
  int64_t* pasts = nullptr;
};

// The sizes and inputs one run's workspace depends on.
struct Request {
  sdpa::Dims d;  // T: the present's length
  bool rotary = false;
  bool present_k = false, present_v = false;  // no output 1 / 2
  int threads = 1;
};

// The workspace, as both the kernel and group_query_attention_workspace lay it out: the
// batches' lengths, with do_rotary each row's position and the rotated queries, present K and
// V when they are not outputs, and the core's scratch. Parts not taken are empty.
struct Parts {
  WorkspaceLayout layout;
  int totals = -1, pasts = -1, pos = -1, q = -1, present_k = -1, present_v = -1;
  sdpa::CoreParts core;
};

Parts gqa_parts(const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const sdpa::Dims& d = r.d;
  const int64_t present = d.B * d.Hkv * d.T * d.D;
  p.totals = l.add(DataType::Int64, d.B);
  p.pasts = l.add(DataType::Int64, d.B);
  p.pos = l.add(DataType::Int64, r.rotary ? d.B * d.Sq : 0);
  p.q = l.add(DataType::Float, r.rotary ? d.B * d.Sq * d.Hq * d.D : 0);
  p.present_k = l.add(DataType::Float, r.present_k ? present : 0);
  p.present_v = l.add(DataType::Float, r.present_v ? present : 0);
  p.core = sdpa::core_parts(l, d, DataType::Float, r.threads);
  return p;
}

class GroupQueryAttention final : public Kernel {
 public:
  explicit GroupQueryAttention(const NodeInfo& info)
      : heads_(info.attr_int("num_heads")),
        kv_heads_(info.attr_int("kv_num_heads")),
        window_(info.attr_int("local_window_size", -1)),
        rotary_(info.attr_int("do_rotary", 0) != 0),
        interleaved_(info.attr_int("rotary_interleaved", 0) != 0),
        scale_(info.attr_float("scale", 0.0f)),
        softcap_(info.attr_float("softcap", 0.0f)) {
    if (heads_ <= 0 || kv_heads_ <= 0 || heads_ % kv_heads_ != 0) {
      info.fail("num_heads must be a positive multiple of kv_num_heads");
    }
    if (softcap_ < 0) info.fail("softcap must not be negative");
    auto unsupported = [&](const std::string& what) {
      info.fail(what + " is not supported", ErrorKind::Unsupported);
    };
    if (info.attr_int("causal", 1) != 1) unsupported("causal = 0");
    if (info.attr_int("smooth_softmax", 0) != 0) unsupported("smooth_softmax");
    if (info.attr_int("sliding_window_cache", 0) != 0) unsupported("sliding_window_cache");
    if (info.attr_int("qk_output", 0) != 0 || info.has_output(3)) unsupported("output_qk");
    if (info.has_attr("kv_cache_bit_width") || info.attr_string("k_quant_type", "NONE") != "NONE" ||
        info.attr_string("v_quant_type", "NONE") != "NONE") {
      unsupported("a quantized KV cache");
    }
    const char* inputs[] = {"position_ids", "attention_bias", "head_sink",     "k_scale",
                            "v_scale",      "q_norm_weight",  "k_norm_weight", "query_seqlens"};
    for (size_t i = kPositionIds; i < std::min<size_t>(info.num_inputs(), 17); ++i) {
      if (i != kAttentionBias && info.has_input(i)) unsupported(inputs[i - kPositionIds]);
    }
    if (info.num_inputs() > 17) info.fail("takes at most 17 inputs");
  }

  void run(OpContext& ctx) override {
    Step z = sizes(ctx);
    const Tensor& query = ctx.input(kQuery);
    const bool packed = !ctx.has_input(kKey);
    const int64_t N = heads_, Nk = kv_heads_, H = z.H;

    // The outputs in the order the `.place` rule states them (the presents, then the
    // output), then the workspace (gqa_parts).
    const Shape shape{z.B, Nk, z.present, H};
    const bool has_past = ctx.has_input(kPastKey);
    Tensor pk = present(ctx, 1, kPastKey, shape);
    Tensor pv = present(ctx, 2, kPastValue, shape);
    Tensor& out = ctx.output(0, DataType::Float, {z.B, z.S, N * H});
    Request r;
    r.d = {z.B, N, Nk, z.S, z.present, H, H};
    r.rotary = rotary_;
    r.present_k = !ctx.has_output(1);
    r.present_v = !ctx.has_output(2);
    r.threads = ctx.threads();
    const Parts parts = gqa_parts(r);
    const Workspace space(ctx, parts.layout);
    z.totals = space.data<int64_t>(parts.totals);
    z.pasts = space.data<int64_t>(parts.pasts);
    lengths(ctx, z);

    // Q: the query in place, or rotated into the workspace ([B, S, N, H] in both cases).
    const float* q = query.data<const float>();
    int64_t q_row = z.row;
    int64_t* pos = rotary_ ? space.data<int64_t>(parts.pos) : nullptr;
    const float *cos = nullptr, *sin = nullptr;
    int64_t rd = 0;
    if (rotary_) {
      for (int64_t b = 0; b < z.B; ++b) {
        for (int64_t s = 0; s < z.S; ++s) pos[b * z.S + s] = z.pasts[b] + s;
      }
      rd = rotary_dim(ctx, z, pos, &cos, &sin);
      float* q_rot = space.data<float>(parts.q);
      rotate_rows(q, z.row, q_rot, N * H, N, z, pos, rd, cos, sin);
      q = q_rot;
      q_row = N * H;
    }

    // present: the past tensors themselves when they have room, else fresh (past copied).
    const float* key =
        packed ? query.data<const float>() + N * H : ctx.input(kKey).data<const float>();
    const float* value =
        packed ? query.data<const float>() + (N + Nk) * H : ctx.input(kValue).data<const float>();
    const int64_t kv_row = packed ? z.row : Nk * H;
    if (!pk.defined()) pk = space.tensor(parts.present_k, shape);
    if (!pv.defined()) pv = space.tensor(parts.present_v, shape);
    const bool k_in_place = has_past && pk.raw_data() == ctx.input(kPastKey).raw_data();
    const bool v_in_place = has_past && pv.raw_data() == ctx.input(kPastValue).raw_data();
    if (k_in_place || v_in_place) ctx.count_in_place();
    if (!k_in_place) keep_past(ctx, kPastKey, pk, z);
    if (!v_in_place) keep_past(ctx, kPastValue, pv, z);
    const Rotation rot{rotary_ ? rd : 0, cos, sin, pos};
    append(pk, key, kv_row, z, rot);
    append(pv, value, kv_row, z, {});

    sdpa::Problem<float> p;
    static_cast<sdpa::Dims&>(p) = r.d;
    p.q = q, p.lq = {z.S * q_row, H, q_row};
    p.k = pk.data<const float>(), p.lk = {Nk * z.present * H, z.present * H, H};
    p.v = pv.data<const float>(), p.lv = p.lk;
    p.y = out.data<float>(), p.ly = {z.S * N * H, H, N * H};
    p.scale = scale_ != 0 ? scale_ : 1.0f / std::sqrt(static_cast<float>(H));
    p.softcap = softcap_;
    p.causal = true;
    p.left = window_ > 0 ? window_ - 1 : -1;
    p.nonpad = z.totals;
    p.first_pos = z.pasts;
    if (ctx.has_input(kAttentionBias)) add_bias(ctx, ctx.input(kAttentionBias), z, p);
    sdpa::solve(p, space, parts.core);
  }

 private:
  struct Rotation {
    int64_t dim = 0;
    const float* cos = nullptr;
    const float* sin = nullptr;
    const int64_t* pos = nullptr;  // per (batch, row)
  };

  Step sizes(const OpContext& ctx) const {
    const Tensor& query = ctx.input(kQuery);
    if (query.dtype() != DataType::Float) {
      ctx.fail("takes float input, got " + query.describe(), ErrorKind::Unsupported);
    }
    if (query.rank() != 3) ctx.fail("query " + query.describe() + " must be 3-D");
    Step z;
    z.B = query.dim(0), z.S = query.dim(1), z.row = query.dim(2);
    if (ctx.has_input(kKey) != ctx.has_input(kValue)) ctx.fail("key and value go together");
    const int64_t width = ctx.has_input(kKey) ? heads_ : heads_ + 2 * kv_heads_;
    if (z.row % width != 0 || z.row == 0) {
      ctx.fail("query " + query.describe() + " does not split into " + std::to_string(width) +
               " heads");
    }
    z.H = z.row / width;
    if (ctx.has_input(kKey)) {
      for (size_t i : {kKey, kValue}) {
        const Tensor& t = ctx.input(i);
        if (t.dtype() != DataType::Float || t.shape() != Shape{z.B, z.S, kv_heads_ * z.H}) {
          ctx.fail("key/value " + t.describe() + " must be float [" + std::to_string(z.B) + ", " +
                   std::to_string(z.S) + ", " + std::to_string(kv_heads_ * z.H) + "]");
        }
      }
    }
    if (ctx.has_input(kPastKey) != ctx.has_input(kPastValue)) {
      ctx.fail("past_key and past_value must be given together");
    }
    if (ctx.has_input(kPastKey)) {
      const Tensor& pk = ctx.input(kPastKey);
      const Tensor& pv = ctx.input(kPastValue);
      z.P = pk.rank() == 4 ? pk.dim(2) : -1;
      if (pk.dtype() != DataType::Float || pk.shape() != Shape{z.B, kv_heads_, z.P, z.H} ||
          pv.dtype() != DataType::Float || pv.shape() != pk.shape()) {
        ctx.fail("past_key " + pk.describe() + " / past_value " + pv.describe() + " must be [" +
                 std::to_string(z.B) + ", " + std::to_string(kv_heads_) + ", past, " +
                 std::to_string(z.H) + "]");
      }
    }
    const Tensor& seqlens = ctx.input(kSeqlensK);
    const Tensor& total = ctx.input(kTotalSeqLen);
    if (seqlens.dtype() != DataType::Int32 || seqlens.numel() != z.B || seqlens.rank() > 2) {
      ctx.fail("seqlens_k " + seqlens.describe() + " must be int32 [batch] (or [batch, 1])");
    }
    if (total.dtype() != DataType::Int32 || total.numel() != 1) {
      ctx.fail("total_sequence_length " + total.describe() + " must be one int32");
    }
    z.total = total.data<const int32_t>()[0];
    z.first_prompt = z.S == z.total;
    z.present = std::max(z.total, z.P);
    if (z.total < z.S || (!z.first_prompt && !ctx.has_input(kPastKey))) {
      ctx.fail("total_sequence_length " + std::to_string(z.total) +
               " must be the sequence length on a first prompt, and more with a past");
    }
    return z;
  }

  // Each batch's total and past length from seqlens_k (checked), into z.totals and z.pasts.
  static void lengths(const OpContext& ctx, Step& z) {
    const int32_t* sk = ctx.input(kSeqlensK).data<const int32_t>();
    for (int64_t b = 0; b < z.B; ++b) {
      const int64_t t = int64_t{sk[b]} + 1;
      const int64_t past = z.first_prompt ? 0 : t - z.S;
      if (t < 1 || t > z.total || past < 0 || past > z.P) {
        ctx.fail("seqlens_k[" + std::to_string(b) + "] = " + std::to_string(sk[b]) +
                 " does not fit total_sequence_length " + std::to_string(z.total) + ", past of " +
                 std::to_string(z.P) + " and " + std::to_string(z.S) + " new rows");
      }
      z.totals[b] = t;
      z.pasts[b] = past;
    }
  }

  static int64_t rotary_dim(const OpContext& ctx, const Step& z, const int64_t* pos,
                            const float** cos, const float** sin) {
    if (!ctx.has_input(kCos) || !ctx.has_input(kSin))
      ctx.fail("do_rotary needs cos_cache and sin_cache");
    const Tensor& c = ctx.input(kCos);
    const Tensor& s = ctx.input(kSin);
    if (c.dtype() != DataType::Float || c.rank() != 2 || s.shape() != c.shape() ||
        s.dtype() != DataType::Float || c.dim(1) * 2 > z.H || c.dim(1) == 0) {
      ctx.fail("cos_cache " + c.describe() + " / sin_cache " + s.describe() +
               " must be float [max position, rotary dim / 2] with rotary dim <= " +
               std::to_string(z.H));
    }
    const int64_t most = z.B * z.S > 0 ? *std::max_element(pos, pos + z.B * z.S) : 0;
    if (z.B * z.S > 0 && most >= c.dim(0)) {
      ctx.fail("position " + std::to_string(most) + " is outside the rotary caches " +
               c.describe());
    }
    *cos = c.data<const float>();
    *sin = s.data<const float>();
    return c.dim(1) * 2;
  }

  // dst rows ([B, S] of `dst_row` floats) = src rows rotated, `heads` heads of H each.
  void rotate_rows(const float* src, int64_t src_row, float* dst, int64_t dst_row, int64_t heads,
                   const Step& z, const int64_t* pos, int64_t rd, const float* cos,
                   const float* sin) const {
    parallel_for(z.B * z.S, grain_for(heads * z.H * 4), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t at = pos[r] * (rd / 2);
        for (int64_t h = 0; h < heads; ++h) {
          rotate_head(src + r * src_row + h * z.H, dst + r * dst_row + h * z.H, z.H, rd, cos + at,
                      sin + at, interleaved_);
        }
      }
    });
  }

  // Output `out` (present): past input `in` itself when this node may write over it and it
  // has the present's shape (the `.place` rule below says the same), else a fresh output
  // (keep_past fills it); undefined when the node has no such output (the workspace's).
  static Tensor present(OpContext& ctx, size_t out, size_t in, const Shape& shape) {
    if (!ctx.has_output(out)) return Tensor();
    if (ctx.has_input(in) && ctx.input(in).shape() == shape && ctx.can_overwrite(in)) {
      Tensor shared = ctx.input(in);
      ctx.set_output(out, shared);
      return shared;
    }
    return ctx.output(out, DataType::Float, shape);
  }

  // A present `t` that is not the past itself: batch b's first pasts[b] rows copied from the
  // past input `in` and the rows after this step's zeroed, as onnxruntime leaves them.
  static void keep_past(OpContext& ctx, size_t in, const Tensor& t, const Step& z) {
    const int64_t H = t.dim(3), cap = t.dim(2), Nk = t.dim(1);
    const float* past = ctx.has_input(in) ? ctx.input(in).data<const float>() : nullptr;
    float* dst = t.data<float>();
    uint64_t copied = 0;
    for (int64_t b = 0; b < z.B; ++b) {
      const int64_t keep = z.pasts[b], end = keep + z.S;
      for (int64_t h = 0; h < Nk; ++h) {
        float* plane = dst + (b * Nk + h) * cap * H;
        if (keep > 0) {
          std::memcpy(plane, past + (b * Nk + h) * z.P * H,
                      static_cast<size_t>(keep * H) * sizeof(float));
          copied += static_cast<uint64_t>(keep * H) * sizeof(float);
        }
        std::fill(plane + end * H, plane + cap * H, 0.0f);
      }
    }
    if (copied) ctx.count_copy(copied, CopyCause::Concat);
  }

  // Writes this step's rows of K or V (rows of `src_row` floats, kv heads side by side) into
  // present at each batch's past length, rotated when `rot.dim` > 0.
  void append(Tensor& present, const float* src, int64_t src_row, const Step& z,
              const Rotation& rot) const {
    const int64_t Nk = kv_heads_, H = z.H, cap = present.dim(2);
    float* dst = present.data<float>();
    parallel_for(z.B * Nk, grain_for(z.S * H), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / Nk, h = t % Nk;
        float* plane = dst + t * cap * H + z.pasts[b] * H;
        for (int64_t s = 0; s < z.S; ++s) {
          const float* from = src + (b * z.S + s) * src_row + h * H;
          if (rot.dim > 0) {
            const int64_t at = rot.pos[b * z.S + s] * (rot.dim / 2);
            rotate_head(from, plane + s * H, H, rot.dim, rot.cos + at, rot.sin + at, interleaved_);
          } else {
            std::memcpy(plane + s * H, from, static_cast<size_t>(H) * sizeof(float));
          }
        }
      }
    });
  }

  // attention_bias [B or 1, N or 1, S, L <= present]: added to the scores of the first L keys.
  void add_bias(const OpContext& ctx, const Tensor& a, const Step& z,
                sdpa::Problem<float>& p) const {
    if (a.dtype() != DataType::Float || a.rank() != 4 || (a.dim(0) != 1 && a.dim(0) != z.B) ||
        (a.dim(1) != 1 && a.dim(1) != heads_) || a.dim(2) != z.S || a.dim(3) > z.present) {
      ctx.fail("attention_bias " + a.describe() + " must be float [B or 1, N or 1, " +
               std::to_string(z.S) + ", total]");
    }
    p.mask = sdpa::MaskKind::Additive;
    p.mask_add = a.data<const float>();
    p.mask_len = a.dim(3);
    const Shape& st = a.strides();
    for (size_t d = 0; d < 4; ++d) p.ms[d] = a.dim(d) == 1 && d < 3 ? 0 : st[d];
  }

  int64_t heads_, kv_heads_, window_;
  bool rotary_, interleaved_;
  float scale_, softcap_;
};

// The present's length: total_sequence_length's value, or the past's when longer.
int64_t present_length(const ShapeContext& c) {
  const std::vector<int64_t>& total = c.data(kTotalSeqLen);
  if (total.size() != 1) unknown("total_sequence_length");
  int64_t present = total[0];
  if (c.has_input(kPastKey)) {
    const Shape& pk = c.shape(kPastKey);
    if (pk.size() != 4 || pk[2] < 0) unknown("past of another rank");
    present = std::max(present, pk[2]);
  }
  return present;
}

// output [B, S, N*H]; present [B, Nkv, max(past, total_sequence_length), H] when that total
// is known before the run.
void group_query_attention_shape(ShapeContext& c) {
  const Shape& q = c.shape(kQuery);
  const int64_t n = c.attr_int("num_heads", 0), nk = c.attr_int("kv_num_heads", 0);
  if (q.size() != 3 || q[2] < 0 || n <= 0 || nk <= 0) unknown("query or head counts");
  const int64_t h = q[2] / (c.has_input(kKey) ? n : n + 2 * nk);
  c.set(0, c.dtype(kQuery), {q[0], q[1], n * h});
  if (!c.has_output(1) && !c.has_output(2)) return;
  const int64_t present = present_length(c);
  for (size_t o : {size_t{1}, size_t{2}}) c.set(o, c.dtype(kQuery), {q[0], nk, present, h});
}

// present_key/present_value are past_key/past_value themselves when the kernel may write over
// them and they already have the present's shape (see GroupQueryAttention::present).
void place_group_query_attention(Placement& p) {
  const ir::Node& node = p.node();
  // In the kernel's order: the presents, then the output.
  for (size_t o : {size_t{1}, size_t{2}}) {
    if (o >= node.outputs.size() || node.outputs[o] == ir::kNoValue) continue;
    const size_t in = o + 2;
    const bool has_past = in < node.inputs.size() && node.inputs[in] != ir::kNoValue;
    if (has_past && p.writable(in) && p.contiguous(in) && p.input(in).shape == p.output(o).shape) {
      p.view(o, in, {});
    } else {
      p.allocate(o);
    }
  }
  p.allocate(0);
}

// The kernel's workspace (gqa_parts) for these shapes on c.threads() threads; the present's
// length is total_sequence_length's value (or the past's when longer).
uint64_t group_query_attention_workspace(const ShapeContext& c) {
  const Shape& q = c.shape(kQuery);
  const int64_t n = c.attr_int("num_heads", 0), nk = c.attr_int("kv_num_heads", 0);
  if (q.size() != 3 || q[0] < 0 || q[1] < 0 || q[2] <= 0 || n <= 0 || nk <= 0 || n % nk) {
    unknown("query or head counts");
  }
  const int64_t h = q[2] / (c.has_input(kKey) ? n : n + 2 * nk);
  const int64_t present = present_length(c);
  if (present < 0) unknown("total_sequence_length");
  Request r;
  r.d = {q[0], n, nk, q[1], present, h, h};
  r.rotary = c.attr_int("do_rotary", 0) != 0;
  r.present_k = !c.has_output(1);
  r.present_v = !c.has_output(2);
  r.threads = c.threads();
  return gqa_parts(r).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "GroupQueryAttention",
                  .since = 1,
                  .min_inputs = 7,
                  .max_inputs = 17,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .in_place = inputs(3, 4),
                  .types = "float",
                  .shape = group_query_attention_shape,
                  .place = place_group_query_attention,
                  .workspace = group_query_attention_workspace,
                  .create = make<GroupQueryAttention>});

}  // namespace kiln::ops
