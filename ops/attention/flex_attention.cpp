// FlexAttention (ai.onnx.preview 1): scaled dot-product attention over rank-4 Q/K/V with
// grouped KV heads, where two optional subgraphs rewrite the whole score tensor after Q.K^T
// (score_mod, e.g. masks or biases) and the probabilities after the softmax (prob_mod):
//   scores = score_mod(scale * Q K^T);  probs = prob_mod(softmax(scores));  Y = probs V
// Scores and probabilities are [B, Hq, L, S] tensors of the softmax precision (float unless
// the inputs are double or softmax_precision says otherwise). As in the reference, a row the
// score_mod masks completely (all -inf) softmaxes to NaN. Both products per head run in the
// GEMM layer (ops/math/gemm.h), which reads Q, K and V through their strides (K^T as a
// transposed view) without contiguous copies.
#include <Eigen/Core>

#include <cmath>
#include <string>
#include <vector>

#include "ops/attention/attention_core.h"
#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/workspace.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

using sdpa::convert_into;

// Runs product(i) for i in [0, heads), each a matrix product of `macs` multiply-adds: one
// single-threaded product per head when there are enough heads for every task, else one
// after another, each split across the threads by the GEMM layer.
template <typename F>
void per_head(int64_t heads, double macs, F&& product) {
  const int tasks = math::task_count(static_cast<double>(heads) * macs);
  if (tasks > 1 && heads >= 2 * tasks) {
    math::GemmOptions o;
    o.max_threads = 1;
    parallel_for(heads, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) product(i, o);
    });
  } else {
    for (int64_t i = 0; i < heads; ++i) product(i, math::GemmOptions{});
  }
}

// The sizes and types one run's workspace depends on.
struct Request {
  int64_t B = 0, Hq = 0, Hkv = 0, L = 0, S = 0, E = 0, Ev = 0;
  DataType type = DataType::Float;  // Q, K and V's
  DataType prec = DataType::Float;  // the softmax precision
  bool modifiers = false;           // score_mod or prob_mod
};

// The compute type: double for double inputs or precision, else float.
DataType compute_type(const Request& r) {
  return r.type == DataType::Double || r.prec == DataType::Double ? DataType::Double
                                                                  : DataType::Float;
}

// The workspace, as both the kernel and flex_attention_workspace lay it out: Q, K, V and Y
// in the compute type when the inputs are of another; the scores; the scores rounded to the
// softmax precision when it is not the compute type; and a second score buffer for what a
// rounding or a modifier gives back in another type or layout. Parts not taken are empty.
struct Parts {
  WorkspaceLayout layout;
  int q = -1, k = -1, v = -1, y = -1, scores = -1, rounded = -1, other = -1;
};

Parts flex_parts(const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const DataType ct = compute_type(r);
  const int64_t convert = r.type == ct ? 0 : 1, scores = r.B * r.Hq * r.L * r.S;
  p.q = l.add(ct, convert * r.B * r.Hq * r.L * r.E);
  p.k = l.add(ct, convert * r.B * r.Hkv * r.S * r.E);
  p.v = l.add(ct, convert * r.B * r.Hkv * r.S * r.Ev);
  p.y = l.add(ct, convert * r.B * r.Hq * r.L * r.Ev);
  p.scores = l.add(ct, scores);
  p.rounded = l.add(r.prec, r.prec != ct ? scores : 0);
  p.other = l.add(ct, r.prec != ct || r.modifiers ? scores : 0);
  return p;
}

// Whether `t`'s data lies in `part` (a tensor of the workspace).
bool inside(const Tensor& t, const Tensor& part) {
  return part.defined() && part.numel() > 0 && t.raw_data() >= part.raw_data() &&
         t.raw_data() < part.raw_data() + part.nbytes();
}

DataType precision_type(int64_t code) {
  switch (code) {
    case 1:
      return DataType::Float;
    case 10:
      return DataType::Float16;
    case 11:
      return DataType::Double;
    case 16:
      return DataType::BFloat16;
    default:
      return DataType::Undefined;
  }
}

class FlexAttention final : public Kernel {
 public:
  explicit FlexAttention(const NodeInfo& info)
      : has_scale_(info.has_attr("scale")), scale_(info.attr_float("scale", 1.0f)) {
    if (info.has_attr("softmax_precision")) {
      precision_ = precision_type(info.attr_int("softmax_precision"));
      if (precision_ == DataType::Undefined) {
        info.fail("softmax_precision must be FLOAT, FLOAT16, DOUBLE or BFLOAT16");
      }
    }
    for (const char* name : {"score_mod", "prob_mod"}) {
      int& index = name[0] == 's' ? score_mod_ : prob_mod_;
      if (!info.has_attr(name)) continue;
      index = info.subgraph_index(name);
      const ir::Graph& g = info.subgraph(index);
      if (g.inputs.size() != 1 || g.outputs.size() != 1) {
        info.fail(std::string(name) + " must have exactly one input and one output");
      }
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& q = ctx.input(0);
    const Tensor& k = ctx.input(1);
    const Tensor& v = ctx.input(2);
    if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) {
      ctx.fail("Q, K and V must be rank 4, got " + q.describe() + ", " + k.describe() + ", " +
               v.describe());
    }
    if (!type_in(FloatTypes{}, q.dtype()) || k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
      ctx.fail("Q, K and V must share one float type");
    }
    const int64_t B = q.dim(0), Hq = q.dim(1), L = q.dim(2), E = q.dim(3);
    const int64_t Hkv = k.dim(1), S = k.dim(2), Ev = v.dim(3);
    if (k.dim(0) != B || v.dim(0) != B || v.dim(1) != Hkv || v.dim(2) != S || k.dim(3) != E) {
      ctx.fail("Q, K and V shapes disagree: " + q.describe() + ", " + k.describe() + ", " +
               v.describe());
    }
    if (Hkv <= 0 || Hq % Hkv) {
      ctx.fail("q heads " + std::to_string(Hq) + " are not a multiple of kv heads " +
               std::to_string(Hkv));
    }
    Request r;
    r.B = B, r.Hq = Hq, r.Hkv = Hkv, r.L = L, r.S = S, r.E = E, r.Ev = Ev;
    r.type = q.dtype();
    r.prec = precision_ != DataType::Undefined ? precision_
             : q.dtype() == DataType::Double   ? DataType::Double
                                               : DataType::Float;
    r.modifiers = score_mod_ >= 0 || prob_mod_ >= 0;
    const DataType prec = r.prec, ct = compute_type(r);
    const Shape score_shape{B, Hq, L, S};
    const double scale = has_scale_ ? scale_ : (E > 0 ? 1.0 / std::sqrt(double(E)) : 1.0);

    Tensor y_out = ctx.output(0, q.dtype(), {B, Hq, L, Ev});
    const Parts parts = flex_parts(r);
    const Workspace space(ctx, parts.layout);
    // `t` in the compute type: itself (the products read any strides), else converted into
    // its part.
    auto as_ct = [&](const Tensor& t, int part) {
      if (t.dtype() == ct) return t;
      Tensor c = space.tensor(part, t.shape());
      convert_into(t, c);
      return c;
    };
    Tensor y = y_out.dtype() == ct ? y_out : space.tensor(parts.y, y_out.shape());
    const Tensor qc = as_ct(q, parts.q), kc = as_ct(k, parts.k), vc = as_ct(v, parts.v);
    const Tensor scores_part = space.tensor(parts.scores, score_shape);
    const Tensor other_part =
        r.prec != ct || r.modifiers ? space.tensor(parts.other, score_shape) : Tensor();
    auto solve = [&]<typename C>() {
      const int64_t group = Hq / Hkv;
      // The element offset of the matrix of batch b, head h in a [B, H, rows, cols] tensor.
      auto head = [&](const Tensor& t, int64_t b, int64_t h) {
        return b * t.strides()[0] + h * t.strides()[1];
      };
      Tensor scores = scores_part;
      // scores[bh] (L x S) = scale * Q[bh] (L x E) * K[kv head]^T (E x S)
      per_head(B * Hq, static_cast<double>(L) * static_cast<double>(S) * static_cast<double>(E),
               [&](int64_t bh, math::GemmOptions o) {
                 const int64_t b = bh / Hq, h = bh % Hq, kvh = h / group;
                 // Float scales Q as it is packed; double (whose alpha would round to float)
                 // scales the product.
                 if constexpr (std::is_same_v<C, float>) o.alpha = static_cast<float>(scale);
                 C* sp = scores.data<C>() + bh * L * S;
                 math::gemm<C>(qc.data<const C>() + head(qc, b, h), L, E, qc.strides()[2],
                               qc.strides()[3], kc.data<const C>() + head(kc, b, kvh), S,
                               kc.strides()[3], kc.strides()[2], sp, S, o);
                 if constexpr (std::is_same_v<C, double>) {
                   for (int64_t i = 0; i < L * S; ++i) sp[i] *= scale;
                 }
               });
      scores = modify(ctx, score_mod_, scores, prec, ct, score_shape, space, parts, other_part);
      // The softmax runs in place on the workspace or a subgraph's value held nowhere else,
      // else into the scores' part (its scores are no longer read).
      const bool own = scores.storage() == scores_part.storage() ||
                       (scores.storage().use_count() == 1 && scores.storage()->writable());
      Tensor probs = own ? scores : scores_part;
      softmax_rows<C>(scores, probs);
      // A prob_mod result to convert goes to the part the probabilities are not in.
      const Tensor& spare = inside(probs, other_part) ? scores_part : other_part;
      probs = modify(ctx, prob_mod_, probs, prec, ct, score_shape, space, parts, spare);
      // Y[bh] (L x Ev) = P[bh] (L x S) * V[kv head] (S x Ev)
      per_head(B * Hq, static_cast<double>(L) * static_cast<double>(S) * static_cast<double>(Ev),
               [&](int64_t bh, const math::GemmOptions& o) {
                 const int64_t b = bh / Hq, h = bh % Hq, kvh = h / group;
                 math::gemm<C>(probs.data<const C>() + bh * L * S, L, S, S, 1,
                               vc.data<const C>() + head(vc, b, kvh), Ev, vc.strides()[2],
                               vc.strides()[3], y.data<C>() + bh * L * Ev, Ev, o);
               });
    };
    if (ct == DataType::Double) {
      solve.template operator()<double>();
    } else {
      solve.template operator()<float>();
    }
    if (y.storage() != y_out.storage()) convert_into(y, y_out);
  }

 private:
  // Rounds `t` (type ct) to the softmax precision (in the workspace's `rounded` part), runs
  // subgraph `index` on it (when set) and returns the result as a contiguous ct tensor: the
  // result itself when it is one, else converted into `spare`, a score part `t` is not in.
  static Tensor modify(OpContext& ctx, int index, Tensor t, DataType prec, DataType ct,
                       const Shape& shape, const Workspace& space, const Parts& parts,
                       const Tensor& spare) {
    if (prec == ct && index < 0) return t;
    Tensor p = t;
    if (prec != ct) {
      p = space.tensor(parts.rounded, shape);
      convert_into(t, p);
    }
    if (index >= 0) {
      std::vector<Value> outs = ctx.run_subgraph(index, {Value(p)}, CaptureMode::Borrow);
      if (outs.size() != 1 || !outs[0].is_tensor() || outs[0].tensor().dtype() != prec ||
          outs[0].tensor().shape() != shape) {
        ctx.fail("a modifier subgraph must return one " + std::string(data_type_name(prec)) +
                 shape_to_string(shape) + " tensor");
      }
      p = outs[0].tensor();
    }
    if (p.dtype() == ct && p.is_contiguous()) return p;
    if (p.dtype() == ct) {
      copy_elements(p, spare);
      ctx.count_copy(spare.nbytes(), CopyCause::Contiguous);
    } else {
      convert_into(p, spare);
    }
    return spare;
  }

  // dst = softmax(src) over rows of n columns; dst may be src.
  template <typename C>
  static void softmax_rows(const Tensor& src, const Tensor& dst) {
    const int64_t cols = src.dim(3), rows = src.numel() / std::max<int64_t>(cols, 1);
    parallel_for(rows, grain_for(cols * 8), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const C* row_in = src.data<const C>() + r * cols;
        C* row_out = dst.data<C>() + r * cols;
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> in(row_in, cols);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> out(row_out, cols);
        if (cols == 0) continue;
        const C mx = in.maxCoeff();
        out = (in - mx).exp();
        out /= out.sum();
      }
    });
  }

  bool has_scale_;
  float scale_;
  DataType precision_ = DataType::Undefined;
  int score_mod_ = -1, prob_mod_ = -1;
};

// [batch, q_heads, q_len, v_dim].
void flex_attention_shape(ShapeContext& c) {
  const Shape& q = c.shape(0);
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  if (q.size() != 4 || k.size() != 4 || v.size() != 4 || !type_in(FloatTypes{}, c.dtype(0)) ||
      c.dtype(1) != c.dtype(0) || c.dtype(2) != c.dtype(0)) {
    unknown("Q, K and V must be rank 4 of one float type");
  }
  if (k[0] != q[0] || v[0] != q[0] || v[1] != k[1] || v[2] != k[2] || k[3] != q[3] || k[1] <= 0 ||
      q[1] % k[1]) {
    unknown("Q, K and V shapes disagree");
  }
  c.set(0, c.dtype(0), {q[0], q[1], q[2], v[3]});
}

// The kernel's workspace (flex_parts) for these shapes.
uint64_t flex_attention_workspace(const ShapeContext& c) {
  const Shape& q = c.shape(0);
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) unknown("Q, K and V must be rank 4");
  Request r;
  r.B = q[0], r.Hq = q[1], r.L = q[2], r.E = q[3], r.Hkv = k[1], r.S = k[2], r.Ev = v[3];
  for (int64_t n : {r.B, r.Hq, r.L, r.E, r.Hkv, r.S, r.Ev})
    if (n < 0) unknown("sizes");
  r.type = c.dtype(0);
  r.prec = r.type == DataType::Double ? DataType::Double : DataType::Float;
  if (c.has_attr("softmax_precision")) {
    r.prec = precision_type(c.attr_int("softmax_precision", 1));
    if (r.prec == DataType::Undefined) unknown("softmax_precision");
  }
  r.modifiers = c.has_attr("score_mod") || c.has_attr("prob_mod");
  return flex_parts(r).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.domain = "ai.onnx.preview",
                  .op = "FlexAttention",
                  .since = 1,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = flex_attention_shape,
                  .workspace = flex_attention_workspace,
                  .create = make<FlexAttention>});

}  // namespace kiln::ops
