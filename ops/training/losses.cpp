// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
//
// Both see the scores as [N, C, D] (D the product of the trailing dims) and the targets as
// [N, D]. loss[n, d] = -weight[t] * logp[n, t, d] with t = target[n, d]; targets equal to
// ignore_index contribute nothing (and no weight). "mean" divides the summed loss by the
// summed weight of the counted targets (NaN when that is zero, as onnxruntime gives).
// SoftmaxCrossEntropyLoss first takes the log-softmax over C (its optional second output).
#include <Eigen/Core>
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/workspace.h"

namespace kiln::ops {
namespace {

enum class Reduction { None, Sum, Mean };

Reduction parse_reduction(const NodeInfo& info) {
  const std::string r = info.attr_string("reduction", "mean");
  if (r == "none") return Reduction::None;
  if (r == "sum") return Reduction::Sum;
  if (r == "mean") return Reduction::Mean;
  info.fail("reduction must be 'none', 'sum' or 'mean', got '" + r + "'");
}

struct LossShape {
  int64_t batch = 0, classes = 0, inner = 1;
};

// Checks scores [N, C, d...] against targets [N, d...] and weights [C].
LossShape check_shapes(OpContext& ctx, const Tensor& scores, const Tensor& target,
                       const Tensor* weight) {
  if (scores.rank() < 2) ctx.fail("input must have at least 2 dims, got " + scores.describe());
  LossShape s;
  s.batch = scores.dim(0);
  s.classes = scores.dim(1);
  Shape expected{s.batch};
  for (size_t d = 2; d < scores.rank(); ++d) {
    s.inner *= scores.dim(d);
    expected.push_back(scores.dim(d));
  }
  if (target.shape() != expected) {
    ctx.fail("target " + target.describe() + " must have shape " + shape_to_string(expected));
  }
  if (weight && (weight->rank() != 1 || weight->dim(0) != s.classes)) {
    ctx.fail("weight " + weight->describe() + " must have shape [" + std::to_string(s.classes) +
             "]");
  }
  if (weight && weight->dtype() != scores.dtype()) {
    ctx.fail("weight must have the input's element type");
  }
  return s;
}

class LossBase : public Kernel {
 public:
  explicit LossBase(const NodeInfo& info)
      : reduction_(parse_reduction(info)),
        has_ignore_(info.has_attr("ignore_index")),
        ignore_(info.attr_int("ignore_index", 0)) {}

 protected:
  // Output 0: the loss per target element, or a scalar when reduced.
  Tensor& loss_output(OpContext& ctx, DataType dtype, const Tensor& target) const {
    return ctx.output(0, dtype, reduction_ == Reduction::None ? target.shape() : Shape{});
  }

  // Writes output 0 (`y`, loss_output) from log-probabilities `logp(index)` laid out as
  // [N, C, D]. The targets and weights are read where they lie (the executor hands this op
  // contiguous inputs), not copied.
  template <typename T, typename LogP>
  void write_loss(OpContext& ctx, Tensor& y, const LossShape& s, const Tensor& target,
                  const Tensor* weight, LogP logp) const {
    if (target.dtype() != DataType::Int64 && target.dtype() != DataType::Int32) {
      ctx.fail("target must be int32 or int64, got " + target.describe());
    }
    if (!target.is_contiguous() || (weight && !weight->is_contiguous())) {
      ctx.fail("target and weight must be contiguous");
    }
    const int64_t* t64 = target.dtype() == DataType::Int64 ? target.data<const int64_t>() : nullptr;
    const int32_t* t32 = target.dtype() == DataType::Int32 ? target.data<const int32_t>() : nullptr;
    const T* w = weight ? weight->data<const T>() : nullptr;
    const int64_t count = s.batch * s.inner;
    T* out = reduction_ == Reduction::None ? y.data<T>() : nullptr;
    double total = 0, total_weight = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t label = t64 ? t64[i] : static_cast<int64_t>(t32[i]);
      double loss = 0;
      if (!(has_ignore_ && label == ignore_)) {
        if (label < 0 || label >= s.classes) {
          ctx.fail("target " + std::to_string(label) + " is out of range [0, " +
                   std::to_string(s.classes) + ")");
        }
        const int64_t n = i / s.inner, d = i % s.inner;
        const double wt = w ? static_cast<double>(static_cast<compute_t<T>>(w[label])) : 1.0;
        loss = -wt * logp((n * s.classes + label) * s.inner + d);
        total += loss;
        total_weight += wt;
      }
      if (out) out[i] = from_compute<T>(static_cast<compute_t<T>>(loss));
    }
    if (reduction_ == Reduction::None) return;
    const double v = reduction_ == Reduction::Sum ? total : total / total_weight;
    y.data<T>()[0] = from_compute<T>(static_cast<compute_t<T>>(v));
  }

  Reduction reduction_;
  bool has_ignore_;
  int64_t ignore_;
};

class NllLoss final : public LossBase {
 public:
  explicit NllLoss(const NodeInfo& info) : LossBase(info) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& target = ctx.input(1);
    const Tensor* weight = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    const LossShape s = check_shapes(ctx, x, target, weight);
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      const T* p = x.data<const T>();
      Tensor& y = loss_output(ctx, x.dtype(), target);
      write_loss<T>(ctx, y, s, target, weight, [&](int64_t i) {
        return static_cast<double>(static_cast<compute_t<T>>(p[i]));
      });
    });
  }
};

template <typename C>
using Arr = Eigen::Array<C, Eigen::Dynamic, 1>;

// SoftmaxCrossEntropyLoss's workspace: the log-probabilities in the compute type (float for
// half types), unless they are computed into output 1.
WorkspaceLayout log_prob_parts(DataType x, const Shape& shape, bool has_log_prob) {
  WorkspaceLayout l;
  const bool same_type = x == DataType::Float || x == DataType::Double;
  if (!(same_type && has_log_prob))
    l.add(x == DataType::Double ? DataType::Double : DataType::Float, shape_numel(shape));
  return l;
}

class SoftmaxCrossEntropy final : public LossBase {
 public:
  explicit SoftmaxCrossEntropy(const NodeInfo& info) : LossBase(info) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& target = ctx.input(1);
    const Tensor* weight = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    const LossShape s = check_shapes(ctx, x, target, weight);
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      // The log-probabilities are computed into output 1 when it is wanted in their type
      // (so it is the planned buffer of that output), else into the workspace
      // (log_prob_workspace), taken after the outputs in place_softmax_cross_entropy's order.
      constexpr bool kSameType = std::is_same_v<T, C>;
      const bool into_output = kSameType && ctx.has_output(1);
      Tensor lp;
      if (into_output) lp = ctx.output(1, x.dtype(), x.shape());
      Tensor& y = loss_output(ctx, x.dtype(), target);
      T* out = nullptr;  // output 1 in a half type
      if (!kSameType && ctx.has_output(1)) out = ctx.output(1, x.dtype(), x.shape()).data<T>();
      const WorkspaceLayout layout = log_prob_parts(x.dtype(), x.shape(), ctx.has_output(1));
      const Workspace space(ctx, layout);
      if (!into_output) lp = space.tensor(0, x.shape());
      log_softmax<T, C>(x.data<const T>(), lp.data<C>(), s);
      const C* logp = lp.data<const C>();
      write_loss<T>(ctx, y, s, target, weight,
                    [&](int64_t i) { return static_cast<double>(logp[i]); });
      if constexpr (!kSameType) {
        if (!out) return;
        for (int64_t i = 0; i < lp.numel(); ++i) out[i] = T(logp[i]);
      }
    });
  }

 private:
  // Log-softmax over C of each [C, D] block, vectorised along D.
  template <typename T, typename C>
  static void log_softmax(const T* x, C* y, const LossShape& s) {
    const int64_t block = s.classes * s.inner;
    parallel_for(s.batch, grain_for(block * 8), [&](int64_t n0, int64_t n1) {
      Arr<C> m(s.inner), sum(s.inner);
      for (int64_t n = n0; n < n1; ++n) {
        C* yb = y + n * block;
        for (int64_t i = 0; i < block; ++i) yb[i] = static_cast<C>(x[n * block + i]);
        auto row = [&](int64_t c) { return Eigen::Map<Arr<C>>(yb + c * s.inner, s.inner); };
        if (s.classes == 0) continue;
        m = row(0);
        for (int64_t c = 1; c < s.classes; ++c) m = m.max(row(c));
        sum.setZero();
        for (int64_t c = 0; c < s.classes; ++c) sum += (row(c) - m).exp();
        sum = sum.log();
        for (int64_t c = 0; c < s.classes; ++c) row(c) = (row(c) - m) - sum;
      }
    });
  }
};

// The loss per target element without a reduction, else a scalar; SoftmaxCrossEntropyLoss's
// second output is the log-probabilities, of the scores' shape.
void loss_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.size() < 2) unknown("input must have at least 2 dims");
  Shape expected{x[0]};
  expected.insert(expected.end(), x.begin() + 2, x.end());
  if (c.shape(1) != expected) unknown("target does not fit the input");
  const std::string r = c.attr_string("reduction", "mean");
  if (r != "none" && r != "sum" && r != "mean") unknown("unknown reduction");
  c.set(0, c.dtype(0), r == "none" ? expected : Shape{});
  c.set(1, c.dtype(0), x);
}

// The kernel's workspace (log_prob_parts).
uint64_t log_prob_workspace(const ShapeContext& c) {
  return log_prob_parts(c.dtype(0), c.shape(0), c.has_output(1)).bytes();
}

// SoftmaxCrossEntropy requests the log-probabilities (output 1) first when they are computed
// in place there (float, double), and after the loss otherwise.
void place_softmax_cross_entropy(Placement& p) {
  const DataType t = p.input(0).dtype;
  const bool first = t == DataType::Float || t == DataType::Double;
  if (first) p.allocate(1);
  p.allocate(0);
  if (!first) p.allocate(1);
}

}  // namespace

KILN_REGISTER_OP({.op = "NegativeLogLikelihoodLoss",
                  .since = 12,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16; int32/int64 targets",
                  .shape = loss_shape,
                  .create = make<NllLoss>});
KILN_REGISTER_OP({.op = "SoftmaxCrossEntropyLoss",
                  .since = 12,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "float, double, float16, bfloat16; int32/int64 labels",
                  .shape = loss_shape,
                  .place = place_softmax_cross_entropy,
                  .workspace = log_prob_workspace,
                  .create = make<SoftmaxCrossEntropy>});

}  // namespace kiln::ops
