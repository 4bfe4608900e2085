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

#include "ops/attention_core.h"
#include "ops/common.h"
#include "ops/elementwise.h"
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

// `t` as a tensor of type `want` (itself when it already is one; the products read any
// strides).
Tensor as_type(OpContext& ctx, const Tensor& t, DataType want) {
  if (t.dtype() == want) return t;
  Tensor c = ctx.allocate(want, t.shape());
  convert_into(t, c);
  return c;
}

// `t` as a contiguous tensor of type `want` (itself when it already is one).
Tensor as_contiguous(OpContext& ctx, const Tensor& t, DataType want) {
  if (t.dtype() == want && t.is_contiguous()) return t;
  Tensor c = ctx.allocate(want, t.shape());
  if (t.dtype() == want) {
    copy_elements(t, c);
    ctx.count_copy(c.nbytes(), CopyCause::Contiguous);
  } else {
    convert_into(t, c);
  }
  return c;
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
    const DataType prec = precision_ != DataType::Undefined ? precision_
                          : q.dtype() == DataType::Double   ? DataType::Double
                                                            : DataType::Float;
    const DataType ct = q.dtype() == DataType::Double || prec == DataType::Double ? DataType::Double
                                                                                  : DataType::Float;
    const Shape score_shape{B, Hq, L, S};
    const double scale = has_scale_ ? scale_ : (E > 0 ? 1.0 / std::sqrt(double(E)) : 1.0);

    Tensor y_out = ctx.output(0, q.dtype(), {B, Hq, L, Ev});
    Tensor y = y_out.dtype() == ct ? y_out : ctx.allocate(ct, y_out.shape());
    const Tensor qc = as_type(ctx, q, ct), kc = as_type(ctx, k, ct), vc = as_type(ctx, v, ct);
    auto solve = [&]<typename C>() {
      const int64_t group = Hq / Hkv;
      // The element offset of the matrix of batch b, head h in a [B, H, rows, cols] tensor.
      auto head = [&](const Tensor& t, int64_t b, int64_t h) {
        return b * t.strides()[0] + h * t.strides()[1];
      };
      Tensor scores = ctx.allocate(ct, score_shape);
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
      scores = modify(ctx, score_mod_, scores, prec, ct, score_shape);
      // The softmax runs in place unless the scores are a subgraph's value held elsewhere.
      const bool own = scores.storage().use_count() == 1 && scores.storage()->writable();
      Tensor probs = own ? scores : ctx.allocate(ct, score_shape);
      softmax_rows<C>(scores, probs);
      probs = modify(ctx, prob_mod_, probs, prec, ct, score_shape);
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
  // Rounds `t` (type ct) to the softmax precision, runs subgraph `index` on it (when set) and
  // returns the result as a contiguous ct tensor.
  static Tensor modify(OpContext& ctx, int index, Tensor t, DataType prec, DataType ct,
                       const Shape& shape) {
    if (prec == ct && index < 0) return t;
    Tensor p = as_contiguous(ctx, t, prec);
    if (index >= 0) {
      std::vector<Value> outs = ctx.run_subgraph(index, {Value(p)}, CaptureMode::Borrow);
      if (outs.size() != 1 || !outs[0].is_tensor() || outs[0].tensor().dtype() != prec ||
          outs[0].tensor().shape() != shape) {
        ctx.fail("a modifier subgraph must return one " + std::string(data_type_name(prec)) +
                 shape_to_string(shape) + " tensor");
      }
      p = outs[0].tensor();
    }
    return as_contiguous(ctx, p, ct);
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
                  .create = make<FlexAttention>});

}  // namespace kiln::ops
