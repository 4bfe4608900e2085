// com.microsoft.Attention: the multi-head self-attention block with one packed QKV projection,
// as onnxruntime's transformer optimizer writes it for BERT- and GPT-2-style models.
//
//   QKV = input [B, S, D] x weights [D, Dq + Dk + Dv] (+ bias), split into heads
//   K, V = past (2 x [B, N, P, Hk/Hv]) followed by this step's; present = [K; V] when asked
//   out[b, s, n] = softmax(scale Q K^T + mask + attention_bias) V, scale 1/sqrt(Hq) by default
//
// mask_index: 1-D [B] (keys from that end position masked) or [2B] (ends, then starts), 2-D
// [B, T] or 3-D [B, S, T] of 1 (attend) / 0 (masked). A masked key's score gets
// mask_filter_value (-10000 unless given) added, as onnxruntime does, rather than -inf, so a
// row masked throughout still has a softmax; `unidirectional` masks keys after the query's
// position the same way.
//
// The projection is one GEMM (constant weights packed once, shared through the weights
// cache); each (batch, head) task then computes its scores with one GEMM
// reading Q and K in place from the projection (K^T as a column-major view), softmaxes rows
// with the vector kernels and multiplies by V straight into the output.
//
// float16 inputs are widened to float, the block computed in float, and output and present
// narrowed back to float16, as onnxruntime computes half types on the CPU.
//
// com.microsoft QAttention (what onnxruntime's quantize_dynamic makes of Attention) is the same
// block with a quantized projection: uint8 input and 8-bit weights with their scales and zero
// points (the weights' per tensor or per column), multiplied in the int8 GEMM layer and scaled
// back to float with the bias added, as onnxruntime does; its mask_index and past are inputs
// 5 and 8, and it takes no attention_bias.
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/half.h"
#include "ops/core/workspace.h"
#include "ops/linalg/packed_weights.h"
#include "ops/math/gemm.h"
#include "ops/math/kernels.h"
#include "ops/math/qgemm.h"

namespace kiln::ops {
namespace {

struct Sizes {
  int64_t batch = 0, seq = 0, in = 0, heads = 0, past = 0, total = 0;
  int64_t dq = 0, dk = 0, dv = 0;  // hidden sizes of Q, K and V
  int64_t hq() const { return dq / heads; }
  int64_t hv() const { return dv / heads; }
};

// Where Attention and QAttention keep their optional inputs.
struct InputSlots {
  size_t mask = 3, past = 4, attention_bias = 5;
};
constexpr InputSlots kAttentionSlots{3, 4, 5};
constexpr InputSlots kQAttentionSlots{5, 8, 0};

// What the workspace holds beside the projection (workspace_parts).
struct Request {
  bool half = false, quantized = false, present_out = false, has_past = false;
  bool widen_w = false;  // float16 weights that are not an initializer (not packed at load)
  // Elements of the inputs (0 when absent): widened when half; QAttention's weight scales
  // and zero points.
  int64_t x = 0, bias = 0, past = 0, attn_bias = 0, w = 0, scales = 0, zeros = 0;
  int threads = 1;
};

// The workspace of one run, as both the kernel and packed_attention_workspace lay it out: the
// projection [B*S, Dq+Dk+Dv]; present in float when it is not a float output 1; each
// thread's scores [S, T] and mask row [T]; for float16, the inputs and output in float; for
// QAttention, the products of the scales and the weights' zero points. Parts not taken are
// empty.
struct Parts {
  WorkspaceLayout layout;
  int qkv = -1, present = -1, scores = -1, x = -1, bias = -1, past = -1, attn_bias = -1;
  int w = -1, out = -1, mult = -1, zeros = -1;
  int64_t per_thread = 0;  // floats of each thread's slot of `scores`
};

Parts workspace_parts(const Sizes& z, int64_t cols, const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const int64_t rows = z.batch * z.seq, h = r.half ? 1 : 0;
  p.qkv = l.add(DataType::Float, rows * cols);
  const bool present_scratch = (r.has_past || r.present_out) && (r.half || !r.present_out);
  p.present =
      l.add(DataType::Float, present_scratch ? 2 * z.batch * z.heads * z.total * z.hq() : 0);
  p.per_thread = z.seq * z.total + z.total;
  p.scores = l.add(DataType::Float, rows > 0 ? r.threads * p.per_thread : 0);
  p.x = l.add(DataType::Float, h * r.x);
  p.bias = l.add(DataType::Float, h * r.bias);
  p.past = l.add(DataType::Float, h * r.past);
  p.attn_bias = l.add(DataType::Float, h * r.attn_bias);
  p.w = l.add(DataType::Float, r.half && r.widen_w ? r.w : 0);
  p.out = l.add(DataType::Float, h * z.batch * z.seq * z.dv);
  p.mult = l.add(DataType::Float, r.quantized ? r.scales : 0);
  p.zeros = l.add(DataType::Int32, r.quantized ? r.zeros : 0);
  return p;
}

class PackedAttention final : public Kernel {
 public:
  explicit PackedAttention(const NodeInfo& info, bool quantized = false)
      : quantized_(quantized),
        slots_(quantized ? kQAttentionSlots : kAttentionSlots),
        heads_(info.attr_int("num_heads")),
        unidirectional_(info.attr_int("unidirectional", 0) != 0),
        scale_(info.attr_float("scale", 0.0f)),
        filter_(info.attr_float("mask_filter_value", -10000.0f)),
        qkv_sizes_(info.attr_ints("qkv_hidden_sizes")),
        packed_(quantized ? PackedWeight{} : pack_constant_b(info, 1, false)),
        qpacked_(quantized ? pack_constant_qb(info, 1, false) : QPackedWeight{}),
        w_initializer_(info.is_initializer(1)) {
    if (heads_ <= 0) info.fail("num_heads must be positive");
    if (info.attr_int("do_rotary", 0) != 0)
      info.fail("do_rotary is not supported", ErrorKind::Unsupported);
    if (!qkv_sizes_.empty() && qkv_sizes_.size() != 3)
      info.fail("qkv_hidden_sizes must hold 3 sizes");
    if (!quantized && info.has_input(6))
      info.fail("past_sequence_length is not supported", ErrorKind::Unsupported);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    // float16 (x and weights alike): its inputs widened to float, computed as float, and output
    // and present narrowed back, as onnxruntime computes half types on the CPU.
    const bool half = !quantized_ && x.dtype() == DataType::Float16;
    if (quantized_) {
      if (x.dtype() != DataType::UInt8 ||
          (w.dtype() != DataType::UInt8 && w.dtype() != DataType::Int8)) {
        ctx.fail("takes uint8 input and uint8 or int8 weights, got " + x.describe() + " and " +
                     w.describe(),
                 ErrorKind::Unsupported);
      }
    } else {
      if ((x.dtype() != DataType::Float && !half) || w.dtype() != x.dtype()) {
        ctx.fail("takes float or float16 input and weights of one type, got " + x.describe() +
                     " and " + w.describe(),
                 ErrorKind::Unsupported);
      }
    }
    const DataType want = half ? DataType::Float16 : DataType::Float;
    if (x.rank() != 3) ctx.fail("input " + x.describe() + " must be 3-D [batch, sequence, hidden]");
    Sizes z;
    z.batch = x.dim(0), z.seq = x.dim(1), z.in = x.dim(2), z.heads = heads_;
    if (w.rank() != 2 || w.dim(0) != z.in) {
      ctx.fail("weights " + w.describe() + " must be 2-D [" + std::to_string(z.in) + ", 3 hidden]");
    }
    if (qkv_sizes_.empty()) {
      if (w.dim(1) % 3 != 0) ctx.fail("weights " + w.describe() + " must have 3 x hidden columns");
      z.dq = z.dk = z.dv = w.dim(1) / 3;
    } else {
      z.dq = qkv_sizes_[0], z.dk = qkv_sizes_[1], z.dv = qkv_sizes_[2];
    }
    if (z.dq != z.dk || z.dq <= 0 || z.dv <= 0 || z.dq % heads_ != 0 || z.dv % heads_ != 0 ||
        z.dq + z.dk + z.dv != w.dim(1)) {
      ctx.fail("weights " + w.describe() + " do not split into Q, K and V of " +
               std::to_string(heads_) + " heads");
    }
    const int64_t cols = w.dim(1);
    const Tensor* bias_in = nullptr;
    if (ctx.has_input(2)) {
      bias_in = &ctx.input(2);
      if (bias_in->dtype() != want || bias_in->rank() != 1 || bias_in->dim(0) != cols) {
        ctx.fail("bias " + bias_in->describe() + " must be 1-D " +
                 std::string(data_type_name(want)) + " of " + std::to_string(cols));
      }
    }
    if (quantized_ && !bias_in) ctx.fail("QAttention needs its bias (input 2)");
    const Tensor* past_in = nullptr;
    if (ctx.has_input(slots_.past)) {
      past_in = &ctx.input(slots_.past);
      if (past_in->dtype() != want)
        ctx.fail("past " + past_in->describe() + " must have the input's type");
      if (past_in->rank() != 5 || past_in->dim(0) != 2 || past_in->dim(1) != z.batch ||
          past_in->dim(2) != heads_ || past_in->dim(4) != z.hq() || z.dk != z.dv) {
        ctx.fail("past " + past_in->describe() + " must be [2, batch, heads, past, head size]");
      }
      z.past = past_in->dim(3);
    }
    z.total = z.past + z.seq;
    const Mask mask = mask_of(ctx, z);
    const Tensor* attn_bias_in = attention_bias_input(ctx, z, want);

    // The outputs, then the workspace, in the order the contract states them (outputs 0 and
    // 1, then packed_attention_workspace). Float16 outputs are computed in float in the
    // workspace and narrowed into them at the end.
    const Shape out_shape{z.batch, z.seq, z.dv};
    Tensor& out_t = ctx.output(0, want, out_shape);
    Tensor present_t;
    if (ctx.has_output(1)) present_t = ctx.output(1, want, present_shape(z));
    Request r;
    r.half = half;
    r.quantized = quantized_;
    r.present_out = ctx.has_output(1);
    r.has_past = past_in != nullptr;
    r.widen_w = !w_initializer_;
    r.x = x.numel();
    r.bias = bias_in ? bias_in->numel() : 0;
    r.past = past_in ? past_in->numel() : 0;
    r.attn_bias = attn_bias_in ? attn_bias_in->numel() : 0;
    r.w = w.numel();
    r.scales = quantized_ ? ctx.input(4).numel() : 0;
    r.zeros = quantized_ && ctx.has_input(7) ? ctx.input(7).numel() : 0;
    r.threads = ctx.threads();
    const Parts parts = workspace_parts(z, cols, r);
    const Workspace space(ctx, parts.layout);
    // A float16 input widened into its part of the workspace; a float one as it is.
    auto as_float = [&](const Tensor& t, int part) {
      return half ? widen_into(t, space.tensor(part, t.shape())) : t;
    };
    const Tensor xf = quantized_ ? x : as_float(x, parts.x);
    const Tensor bias_f = bias_in ? as_float(*bias_in, parts.bias) : Tensor();
    const float* bias = bias_in ? bias_f.data<const float>() : nullptr;
    const Tensor past_f = past_in ? as_float(*past_in, parts.past) : Tensor();
    const Tensor* past = past_in ? &past_f : nullptr;
    const Tensor attn_bias_f = attn_bias_in ? as_float(*attn_bias_in, parts.attn_bias) : Tensor();
    const BiasPlanes attn_bias = bias_planes(attn_bias_f, z);

    const int64_t rows = z.batch * z.seq;
    Tensor qkv = space.tensor(parts.qkv, {rows, cols});
    Tensor out = half ? space.tensor(parts.out, out_shape) : out_t;
    Tensor present = half ? Tensor() : present_t;
    math::GemmOptions opt;
    opt.bias = bias;
    if (quantized_) {
      quantized_projection(ctx, x, w, bias, z, qkv.data<float>(), cols,
                           space.data<float>(parts.mult), space.data<int32_t>(parts.zeros));
    } else if (const math::MatrixView a =
                   math::MatrixView::row_major(xf.data<const float>(), rows, z.in, z.in);
               packed_ && packed_.k() == z.in && packed_.n() == cols) {
      packed_product(a, packed_, qkv.data<float>(), cols, opt);
    } else {
      // Float16 weights not packed when the session was planned (computed at run time):
      // widened in the workspace, which has room for them unless they are an initializer.
      Tensor wide_w;
      if (half) wide_w = r.widen_w ? as_float(w, parts.w) : widen_to_float(ctx, w);
      const float* pw = half ? wide_w.data<const float>() : w.data<const float>();
      math::sgemm(a, math::MatrixView::row_major(pw, z.in, cols, cols), qkv.data<float>(), cols,
                  opt);
    }

    // K and V of every key: in the projection, or in present (past followed by this step's).
    const float* pq = qkv.data<const float>();
    KeyValues kv{pq + z.dq, pq + z.dq + z.dk, cols, z.seq * cols, z.hq(), 0};
    if (past || ctx.has_output(1)) {
      if (!present.defined()) present = space.tensor(parts.present, present_shape(z));
      kv = with_past(z, past, pq, cols, present);
    }
    if (half && ctx.has_output(1)) narrow_into(present, present_t);
    if (rows == 0) return;
    const float scale = scale_ != 0 ? scale_ : 1.0f / std::sqrt(static_cast<float>(z.hq()));
    float* po = out.data<float>();
    // Each thread's scores [S, T] and mask row [T] are its slot of the workspace.
    float* per_thread = space.data<float>(parts.scores);
    parallel_for(z.batch * heads_, 1, [&](int64_t t0, int64_t t1) {
      int slot = tbb::this_task_arena::current_thread_index();
      if (slot < 0 || slot >= r.threads) slot = 0;
      float* scores = per_thread + slot * parts.per_thread;
      float* row_bias = scores + z.seq * z.total;
      for (int64_t t = t0; t < t1; ++t) {
        head(z, t / heads_, t % heads_, pq, cols, kv, mask, attn_bias, scale, scores, row_bias, po);
      }
    });
    if (half) narrow_into(out, out_t);
  }

 private:
  // QAttention's projection: float((x - x_zero) (w - w_zero_j)) * x_scale * w_scale_j + bias_j.
  // `mult` and `zeros` (workspace) hold as many elements as the weight scales and zero points.
  void quantized_projection(OpContext& ctx, const Tensor& x, const Tensor& w, const float* bias,
                            const Sizes& z, float* qkv, int64_t cols, float* mult,
                            int32_t* zeros) const {
    auto scalar = [&](size_t i, const char* what) -> const Tensor& {
      const Tensor& t = ctx.input(i);
      if (t.numel() != 1 || t.rank() > 1) {
        ctx.fail(std::string(what) + " " + t.describe() + " must be a scalar");
      }
      return t;
    };
    auto per_column = [&](const Tensor& t, const char* what) {
      if (!(t.numel() == 1 && t.rank() <= 1) && !(t.rank() == 1 && t.dim(0) == cols)) {
        ctx.fail(std::string(what) + " " + t.describe() + " must be a scalar or 1-D of " +
                 std::to_string(cols));
      }
      return t.numel() > 1;
    };
    const Tensor& xs = scalar(3, "input_scale");
    const Tensor& ws = ctx.input(4);
    for (const Tensor* s : {&xs, &ws}) {
      if (s->dtype() != DataType::Float) ctx.fail("scales must be float, got " + s->describe());
    }
    const bool scale_cols = per_column(ws, "weight_scale");
    for (int64_t j = 0; j < ws.numel(); ++j) {
      mult[j] = ws.data<const float>()[j] * xs.data<const float>()[0];
    }
    math::QGemmOptions o;
    if (ctx.has_input(6)) {
      const Tensor& zx = scalar(6, "input_zero_point");
      if (zx.dtype() != DataType::UInt8) ctx.fail("input_zero_point must be uint8");
      o.a_zero = zx.data<const uint8_t>()[0];
    }
    if (ctx.has_input(7)) {
      const Tensor& t = ctx.input(7);
      if (t.dtype() != w.dtype())
        ctx.fail("weight_zero_point " + t.describe() + " must have the weights' type");
      per_column(t, "weight_zero_point");
      for (int64_t j = 0; j < t.numel(); ++j) {
        zeros[j] =
            w.dtype() == DataType::Int8 ? t.data<const int8_t>()[j] : t.data<const uint8_t>()[j];
      }
      if (t.numel() > 1) {
        o.b_zeros = zeros;
      } else {
        o.b_zero = zeros[0];
      }
    }
    const math::QMatrixView a =
        math::QMatrixView::row_major(x.raw_data(), z.batch * z.seq, z.in, z.in, false);
    const math::QGemmOutput out = math::QGemmOutput::to_float(qkv, cols, mult, scale_cols, bias);
    if (qpacked_ && qpacked_.view.k() == z.in && qpacked_.view.n() == cols) {
      math::qgemm(a, qpacked_.view, out, o);
    } else {
      math::qgemm(
          a,
          math::QMatrixView::row_major(w.raw_data(), z.in, cols, cols, w.dtype() == DataType::Int8),
          out, o);
    }
  }

  // Where the keys and values of (b, h) are: rows of `row` floats, a batch `batch` apart,
  // head h at column h * head (values), plus the head offset for present's layout.
  struct KeyValues {
    const float* k;
    const float* v;
    int64_t row, batch, head_k;
    int64_t head_stride;  // 0: heads side by side in a row; else present's [B, N, T, H]
    const float* key(int64_t b, int64_t h) const {
      return k + b * batch + (head_stride ? h * head_stride : h * head_k);
    }
    const float* value(int64_t b, int64_t h, int64_t hv) const {
      return v + b * batch + (head_stride ? h * head_stride : h * hv);
    }
  };

  struct Mask {
    const Tensor* t = nullptr;  // int32 mask_index
    int kind = 0;               // 0 none, 1 ends [B], 2 ends and starts [2B], 3 [B, T], 4 [B, S, T]
  };

  Mask mask_of(OpContext& ctx, const Sizes& z) const {
    if (!ctx.has_input(slots_.mask)) return {};
    const Tensor& m = ctx.input(slots_.mask);
    if (m.dtype() != DataType::Int32) ctx.fail("mask_index " + m.describe() + " must be int32");
    if (m.rank() == 1 && m.dim(0) == z.batch) return {&m, 1};
    if (m.rank() == 1 && m.dim(0) == 2 * z.batch) return {&m, 2};
    if (m.rank() == 2 && m.dim(0) == z.batch && m.dim(1) == z.total) return {&m, 3};
    if (m.rank() == 3 && m.dim(0) == z.batch && m.dim(1) == z.seq && m.dim(2) == z.total) {
      return {&m, 4};
    }
    ctx.fail("mask_index " + m.describe() + " must be [B], [2B], [B, T] or [B, S, T] with B " +
             std::to_string(z.batch) + ", S " + std::to_string(z.seq) + ", T " +
             std::to_string(z.total));
  }

  // attention_bias [B or 1, N or 1, S, T]: its data and the strides of batch and head (0 where
  // it broadcasts).
  struct BiasPlanes {
    const float* data = nullptr;
    int64_t batch = 0, head = 0;
    const float* row(int64_t b, int64_t h, int64_t i, int64_t t) const {
      return data ? data + b * batch + h * head + i * t : nullptr;
    }
  };

  // attention_bias (checked against the sizes), or null when absent.
  const Tensor* attention_bias_input(OpContext& ctx, const Sizes& z, DataType want) const {
    if (quantized_ || !ctx.has_input(slots_.attention_bias)) return nullptr;
    const Tensor& a = ctx.input(slots_.attention_bias);
    if (a.dtype() != want)
      ctx.fail("attention_bias " + a.describe() + " must have the input's type");
    if (a.rank() != 4 || (a.dim(0) != 1 && a.dim(0) != z.batch) ||
        (a.dim(1) != 1 && a.dim(1) != heads_) || a.dim(2) != z.seq || a.dim(3) != z.total) {
      ctx.fail("attention_bias " + a.describe() + " must be [B or 1, N or 1, S, T]");
    }
    return &a;
  }

  // The planes of a float attention_bias `a` (undefined: none).
  static BiasPlanes bias_planes(const Tensor& a, const Sizes& z) {
    if (!a.defined()) return {};
    const int64_t plane = z.seq * z.total;
    return {a.data<const float>(), a.dim(0) == 1 ? 0 : a.dim(1) * plane, a.dim(1) == 1 ? 0 : plane};
  }

  Shape present_shape(const Sizes& z) const { return {2, z.batch, heads_, z.total, z.hq()}; }

  // present = past followed by this step's K and V ([2, B, N, T, H]) into `present`: float
  // output 1, or the workspace's (no output, or a float16 one the caller narrows it into).
  KeyValues with_past(const Sizes& z, const Tensor* past, const float* pq, int64_t cols,
                      Tensor& present) const {
    const int64_t hk = z.hq();
    float* pp = present.data<float>();
    const float* old = past ? past->data<const float>() : nullptr;
    const int64_t plane = z.total * hk, half = z.batch * heads_ * plane;
    for (int64_t kvi = 0; kvi < 2; ++kvi) {
      for (int64_t b = 0; b < z.batch; ++b) {
        for (int64_t h = 0; h < heads_; ++h) {
          float* dst = pp + kvi * half + (b * heads_ + h) * plane;
          if (z.past > 0) {
            std::memcpy(dst,
                        old + kvi * z.batch * heads_ * z.past * hk + (b * heads_ + h) * z.past * hk,
                        static_cast<size_t>(z.past * hk) * sizeof(float));
          }
          const float* src = pq + b * z.seq * cols + z.dq + kvi * z.dk + h * hk;
          for (int64_t s = 0; s < z.seq; ++s) {
            std::memcpy(dst + (z.past + s) * hk, src + s * cols,
                        static_cast<size_t>(hk) * sizeof(float));
          }
        }
      }
    }
    return {pp, pp + half, hk, heads_ * plane, hk, plane};
  }

  // The additive mask of query row i of batch b over the T keys, into `out`.
  void mask_row(const Sizes& z, const Mask& m, int64_t b, int64_t i, float* out) const {
    std::fill(out, out + z.total, 0.0f);
    if (m.kind == 1 || m.kind == 2) {
      const int32_t* e = m.t->data<const int32_t>();
      const int64_t end = std::clamp<int64_t>(e[b], 0, z.total);
      std::fill(out + end, out + z.total, filter_);
      if (m.kind == 2) {
        const int64_t start = std::clamp<int64_t>(e[z.batch + b], 0, z.total);
        std::fill(out, out + start, filter_);
      }
    } else if (m.kind == 3 || m.kind == 4) {
      const int32_t* v =
          m.t->data<const int32_t>() + (m.kind == 3 ? b * z.total : (b * z.seq + i) * z.total);
      for (int64_t j = 0; j < z.total; ++j) {
        if (v[j] == 0) out[j] = filter_;
      }
    }
    if (unidirectional_) std::fill(out + std::min(z.total, z.past + i + 1), out + z.total, filter_);
  }

  void head(const Sizes& z, int64_t b, int64_t h, const float* pq, int64_t cols,
            const KeyValues& kv, const Mask& m, const BiasPlanes& attn_bias, float scale, float* s,
            float* rb, float* out) const {
    const int64_t hq = z.hq(), hv = z.hv(), T = z.total;
    const float* q = pq + b * z.seq * cols + h * hq;
    math::GemmOptions one;
    one.alpha = scale;
    one.max_threads = 1;
    // scores [S, T] = scale Q K^T (K^T read as a column-major view of K's rows).
    math::sgemm(math::MatrixView::row_major(q, z.seq, hq, cols),
                math::MatrixView::col_major(kv.key(b, h), hq, T, kv.row), s, T, one);
    const math::VecMathKernels& vm = math::kernels().vec;
    const bool masked = m.kind != 0 || unidirectional_;
    for (int64_t i = 0; i < z.seq; ++i) {
      float* row = s + i * T;
      const float* add = attn_bias.row(b, h, i, T);
      if (masked) {
        mask_row(z, m, b, i, rb);
        if (add) math::kernels().binary.add(rb, 1, add, 1, rb, T);
        add = rb;
      }
      const float sum = vm.softmax_numerators(row, add, T);
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < T; ++j) row[j] *= inv;
    }
    math::GemmOptions pv;
    pv.max_threads = 1;
    math::sgemm(math::MatrixView::row_major(s, z.seq, T, T),
                math::MatrixView::row_major(kv.value(b, h, hv), T, hv, kv.row),
                out + b * z.seq * z.dv + h * hv, z.dv, pv);
  }

  bool quantized_;
  InputSlots slots_;
  int64_t heads_;
  bool unidirectional_;
  float scale_, filter_;
  std::vector<int64_t> qkv_sizes_;
  PackedWeight packed_;    // the weights when constant
  QPackedWeight qpacked_;  // QAttention's, likewise
  bool w_initializer_;     // the weights are an initializer (packed: no room to widen them)
};

std::unique_ptr<Kernel> make_qattention(const NodeInfo& info) {
  return std::make_unique<PackedAttention>(info, true);
}

// output [B, S, Dv]; present [2, B, N, P + S, H].
void packed_attention_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() != 3 || w.size() != 2 || w[1] < 0) unknown("input or weights of another rank");
  const int64_t heads = c.attr_int("num_heads", 0);
  if (heads <= 0) unknown("num_heads");
  const std::vector<int64_t> sizes = c.attr_ints("qkv_hidden_sizes");
  const int64_t dv = sizes.size() == 3 ? sizes[2] : w[1] / 3;
  const int64_t dk = sizes.size() == 3 ? sizes[1] : w[1] / 3;
  // QAttention's outputs are float; its past is input 8.
  const bool quantized = c.node().op_type == "QAttention";
  const DataType out = quantized ? DataType::Float : c.dtype(0);
  const size_t past_input = quantized ? 8 : 4;
  c.set(0, out, {x[0], x[1], dv});
  if (c.has_output(1)) {
    int64_t past = 0;
    if (c.has_input(past_input)) {
      const Shape& p = c.shape(past_input);
      if (p.size() != 5) unknown("past of another rank");
      past = p[3];
    }
    const int64_t total = past < 0 || x[1] < 0 ? -1 : past + x[1];
    c.set(1, out, {2, x[0], heads, total, dk / heads});
  }
}

// The kernel's workspace (workspace_parts) for these shapes on c.threads() threads.
uint64_t attention_workspace(const ShapeContext& c, bool quantized) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() != 3 || w.size() != 2) unknown("input or weights of another rank");
  const InputSlots slots = quantized ? kQAttentionSlots : kAttentionSlots;
  Sizes z;
  z.batch = x[0], z.seq = x[1], z.in = x[2], z.heads = c.attr_int("num_heads", 0);
  const std::vector<int64_t> sizes = c.attr_ints("qkv_hidden_sizes");
  z.dq = sizes.size() == 3 ? sizes[0] : w[1] / 3;
  z.dk = sizes.size() == 3 ? sizes[1] : w[1] / 3;
  z.dv = sizes.size() == 3 ? sizes[2] : w[1] / 3;
  if (z.heads <= 0 || z.dq <= 0 || z.dq % z.heads != 0) unknown("heads");
  if (c.has_input(slots.past)) {
    if (c.shape(slots.past).size() != 5) unknown("past of another rank");
    z.past = c.shape(slots.past)[3];
  }
  z.total = z.past + z.seq;
  auto elements = [&](size_t i) { return c.has_input(i) ? numel_or_unknown(c.shape(i)) : 0; };
  Request r;
  r.half = !quantized && c.dtype(0) == DataType::Float16;
  r.quantized = quantized;
  r.present_out = c.has_output(1);
  r.has_past = c.has_input(slots.past);
  r.widen_w = c.constant_input(1) == nullptr;
  r.x = elements(0);
  r.bias = elements(2);
  r.past = elements(slots.past);
  r.attn_bias = quantized ? 0 : elements(slots.attention_bias);
  r.w = elements(1);
  r.scales = quantized ? elements(4) : 0;
  r.zeros = quantized ? elements(7) : 0;
  r.threads = c.threads();
  return workspace_parts(z, w[1], r).layout.bytes();
}

uint64_t packed_attention_workspace(const ShapeContext& c) {
  return attention_workspace(c, false);
}

uint64_t qattention_workspace(const ShapeContext& c) {
  return attention_workspace(c, true);
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "Attention",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 7,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "float, float16",
                  .shape = packed_attention_shape,
                  .workspace = packed_attention_workspace,
                  .create = make<PackedAttention>});

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QAttention",
                  .since = 1,
                  .min_inputs = 5,
                  .max_inputs = 9,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "uint8 input; uint8, int8 weights -> float",
                  .shape = packed_attention_shape,
                  .workspace = qattention_workspace,
                  .create = make_qattention});

}  // namespace kiln::ops
