// FlexAttention (ai.onnx.preview 1): scaled dot-product attention over rank-4 Q/K/V with
// grouped KV heads, where two optional subgraphs rewrite the whole score tensor after Q.K^T
// (score_mod, e.g. masks or biases) and the probabilities after the softmax (prob_mod):
//   scores = score_mod(scale * Q K^T);  probs = prob_mod(softmax(scores));  Y = probs V
// Scores and probabilities are [B, Hq, L, S] tensors of the softmax precision (float unless
// the inputs are double or softmax_precision says otherwise). As in the reference, a row the
// score_mod masks completely (all -inf) softmaxes to NaN.
#include <Eigen/Core>

#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/elementwise.h"

namespace kiln::ops {
namespace {

template <typename C>
using RowMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename C>
using ConstMap = Eigen::Map<const RowMat<C>, 0, Eigen::OuterStride<>>;
template <typename C>
using MutMap = Eigen::Map<RowMat<C>, 0, Eigen::OuterStride<>>;

template <typename D, typename S>
D convert_value(S v) {
  if constexpr (std::is_same_v<D, float16> || std::is_same_v<D, bfloat16>) {
    return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, float16> || std::is_same_v<S, bfloat16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// dst = src with element conversion between float types (same shape, any layouts).
void convert_into(const Tensor& src, const Tensor& dst) {
  dispatch(FloatTypes{}, src.dtype(), [&]<typename S>() {
    dispatch(FloatTypes{}, dst.dtype(), [&]<typename D>() {
      unary_loop<S, D>(src, dst, [](S v) { return convert_value<D>(v); });
    });
  });
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
    const Tensor qc = as_contiguous(ctx, q, ct), kc = as_contiguous(ctx, k, ct),
                 vc = as_contiguous(ctx, v, ct);
    auto solve = [&]<typename C>() {
      const int64_t group = Hq / Hkv;
      Tensor scores = ctx.allocate(ct, score_shape);
      parallel_for(B * Hq, grain_for(L * S * E), [&](int64_t begin, int64_t end) {
        for (int64_t bh = begin; bh < end; ++bh) {
          const int64_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
          ConstMap<C> qm(qc.data<const C>() + bh * L * E, L, E, Eigen::OuterStride<>(E));
          ConstMap<C> km(kc.data<const C>() + kvh * S * E, S, E, Eigen::OuterStride<>(E));
          MutMap<C> sm(scores.data<C>() + bh * L * S, L, S, Eigen::OuterStride<>(S));
          sm.noalias() = (qm * static_cast<C>(scale)) * km.transpose();
        }
      });
      scores = modify(ctx, score_mod_, scores, prec, ct, score_shape);
      // The softmax runs in place unless the scores are a subgraph's value held elsewhere.
      const bool own = scores.storage().use_count() == 1 && scores.storage()->writable();
      Tensor probs = own ? scores : ctx.allocate(ct, score_shape);
      softmax_rows<C>(scores, probs);
      probs = modify(ctx, prob_mod_, probs, prec, ct, score_shape);
      parallel_for(B * Hq, grain_for(L * S * Ev), [&](int64_t begin, int64_t end) {
        for (int64_t bh = begin; bh < end; ++bh) {
          const int64_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
          ConstMap<C> pm(probs.data<const C>() + bh * L * S, L, S, Eigen::OuterStride<>(S));
          ConstMap<C> vm(vc.data<const C>() + kvh * S * Ev, S, Ev, Eigen::OuterStride<>(Ev));
          MutMap<C> ym(y.data<C>() + bh * L * Ev, L, Ev, Eigen::OuterStride<>(Ev));
          if (S == 0) {
            ym.setZero();
          } else {
            ym.noalias() = pm * vm;
          }
        }
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
        Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> in(src.data<const C>() + r * cols,
                                                                cols);
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> out(dst.data<C>() + r * cols, cols);
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
                  .create = make<FlexAttention>});

}  // namespace kiln::ops
