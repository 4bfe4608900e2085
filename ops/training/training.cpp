// Optimiser steps of the ai.onnx.preview.training domain: Adagrad, Adam and Momentum.
// Inputs are the learning rate R, the step count T, then one group of tensors per kind
// (X..., G..., and the optimiser's state: H... / V..., H... / V...); outputs are the new X
// values followed by the new state, group by group. Element math is done in double.
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

enum class Optimizer { Adagrad, Adam, Momentum };

class OptimizerStep final : public Kernel {
 public:
  OptimizerStep(const NodeInfo& info, Optimizer kind) : kind_(kind) {
    // Groups of inputs per optimised tensor: X, G, then 1 (Adagrad: H; Momentum: V) or
    // 2 (Adam: V, H) state tensors.
    states_ = kind == Optimizer::Adam ? 2 : 1;
    const size_t per = 2 + states_;
    if (info.num_inputs() < 2 + per || (info.num_inputs() - 2) % per != 0) {
      info.fail("expected R, T and " + std::to_string(per) + " inputs per optimised tensor");
    }
    tensors_ = (info.num_inputs() - 2) / per;
    if (info.num_outputs() > tensors_ * (1 + states_)) info.fail("too many outputs");
    epsilon_ = info.attr_float("epsilon", 1e-6f);
    norm_ = info.attr_float("norm_coefficient", 0.0f);
    if (kind == Optimizer::Adagrad) {
      decay_ = info.attr_float("decay_factor", 0.0f);
    } else if (kind == Optimizer::Adam) {
      alpha_ = info.attr_float("alpha", 0.9f);
      beta_ = info.attr_float("beta", 0.999f);
      norm_post_ = info.attr_float("norm_coefficient_post", 0.0f);
    } else {
      alpha_ = info.attr_float("alpha");
      beta_ = info.attr_float("beta");
      norm_ = info.attr_float("norm_coefficient");
      const std::string mode = info.attr_string("mode");
      if (mode != "standard" && mode != "nesterov") {
        info.fail("mode must be 'standard' or 'nesterov', got '" + mode + "'");
      }
      nesterov_ = mode == "nesterov";
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& r = ctx.input(0);
    const Tensor& t = ctx.input(1);
    if (r.numel() != 1 || !type_in(TypeList<float, double>{}, r.dtype())) {
      ctx.fail("R must be a float or double scalar, got " + r.describe());
    }
    if (t.numel() != 1 || t.dtype() != DataType::Int64) {
      ctx.fail("T must be an int64 scalar, got " + t.describe());
    }
    const double lr = scalar_as_double(r);
    const int64_t step = to_int64s(t)[0];
    for (size_t i = 0; i < tensors_; ++i) {
      const Tensor& x = ctx.input(2 + i);
      std::vector<const Tensor*> in;  // G, then the states
      for (size_t k = 1; k <= 1 + states_; ++k) in.push_back(&ctx.input(2 + k * tensors_ + i));
      for (const Tensor* u : in) {
        if (u->shape() != x.shape() || u->dtype() != x.dtype()) {
          ctx.fail("input " + u->describe() + " does not match X " + x.describe());
        }
      }
      dispatch(TypeList<float, double>{}, x.dtype(), [&]<typename T>() {
        // Outputs: X_new, then each state; absent ones are not written (null).
        std::vector<T*> outs;
        for (size_t k = 0; k <= states_; ++k) {
          const size_t o = k * tensors_ + i;
          outs.push_back(ctx.has_output(o) ? ctx.output(o, x.dtype(), x.shape()).data<T>()
                                           : nullptr);
        }
        update<T>(lr, step, x, in, outs);
      });
    }
  }

 private:
  template <typename T>
  void update(double lr, int64_t step, const Tensor& xt, const std::vector<const Tensor*>& in,
              const std::vector<T*>& outs) const {
    const T* x = xt.data<const T>();
    const T* g = in[0]->data<const T>();
    const T* s1 = in[1]->data<const T>();
    const T* s2 = states_ == 2 ? in[2]->data<const T>() : nullptr;
    T* xo = outs[0];
    T* o1 = outs[1];
    T* o2 = states_ == 2 ? outs[2] : nullptr;
    auto store = [](T* out, int64_t j, double v) {
      if (out) out[j] = static_cast<T>(v);
    };
    const int64_t n = xt.numel();
    const double tf = static_cast<double>(step);
    if (kind_ == Optimizer::Adagrad) {
      const double rate = lr / (1 + tf * decay_);
      for (int64_t j = 0; j < n; ++j) {
        const double gr = norm_ * x[j] + g[j];
        const double h = s1[j] + gr * gr;
        store(o1, j, h);
        store(xo, j, x[j] - rate * gr / (std::sqrt(h) + epsilon_));
      }
    } else if (kind_ == Optimizer::Adam) {
      const double rate =
          step > 0 ? lr * std::sqrt(1 - std::pow(beta_, tf)) / (1 - std::pow(alpha_, tf)) : lr;
      for (int64_t j = 0; j < n; ++j) {
        const double gr = norm_ * x[j] + g[j];
        const double v = alpha_ * s1[j] + (1 - alpha_) * gr;
        const double h = beta_ * s2[j] + (1 - beta_) * gr * gr;
        store(o1, j, v);
        store(o2, j, h);
        const double xn = x[j] - rate * v / (std::sqrt(h) + epsilon_);
        store(xo, j, (1 - norm_post_) * xn);
      }
    } else {
      const double beta = step > 0 ? beta_ : 1.0;
      for (int64_t j = 0; j < n; ++j) {
        const double gr = norm_ * x[j] + g[j];
        const double v = alpha_ * s1[j] + beta * gr;
        store(o1, j, v);
        store(xo, j, nesterov_ ? x[j] - lr * (gr + alpha_ * v) : x[j] - lr * v);
      }
    }
  }

  Optimizer kind_;
  size_t states_ = 1, tensors_ = 0;
  double epsilon_ = 0, norm_ = 0, decay_ = 0, alpha_ = 0, beta_ = 0, norm_post_ = 0;
  bool nesterov_ = false;
};

template <Optimizer kKind>
std::unique_ptr<Kernel> make_optimizer(const NodeInfo& info) {
  return std::make_unique<OptimizerStep>(info, kKind);
}

// Outputs k * tensors + i (the new X, then each state) have the shape of X_i.
void optimizer_shape(ShapeContext& c) {
  const size_t states = c.node().op_type == "Adam" ? 2 : 1, per = 2 + states;
  if (c.num_inputs() < 2 + per || (c.num_inputs() - 2) % per != 0) unknown("input count");
  const size_t tensors = (c.num_inputs() - 2) / per;
  if (numel_or_unknown(c.shape(0)) != 1 || !type_in(TypeList<float, double>{}, c.dtype(0)) ||
      numel_or_unknown(c.shape(1)) != 1 || c.dtype(1) != DataType::Int64) {
    unknown("R must be a float scalar and T an int64 one");
  }
  for (size_t i = 0; i < tensors; ++i) {
    if (!type_in(TypeList<float, double>{}, c.dtype(2 + i))) unknown("X must be float or double");
    for (size_t k = 1; k <= states + 1; ++k) {
      if (c.shape(2 + k * tensors + i) != c.shape(2 + i) ||
          c.dtype(2 + k * tensors + i) != c.dtype(2 + i)) {
        unknown("an input does not match X");
      }
    }
    for (size_t k = 0; k <= states; ++k) c.set(k * tensors + i, c.dtype(2 + i), c.shape(2 + i));
  }
}

}  // namespace

KILN_REGISTER_OP({.domain = "ai.onnx.preview.training",
                  .op = "Adagrad",
                  .since = 1,
                  .min_inputs = 5,
                  .min_outputs = 1,
                  .types = "float, double",
                  .shape = optimizer_shape,
                  .create = make_optimizer<Optimizer::Adagrad>});
KILN_REGISTER_OP({.domain = "ai.onnx.preview.training",
                  .op = "Adam",
                  .since = 1,
                  .min_inputs = 6,
                  .min_outputs = 1,
                  .types = "float, double",
                  .shape = optimizer_shape,
                  .create = make_optimizer<Optimizer::Adam>});
KILN_REGISTER_OP({.domain = "ai.onnx.preview.training",
                  .op = "Momentum",
                  .since = 1,
                  .min_inputs = 5,
                  .min_outputs = 1,
                  .types = "float, double",
                  .shape = optimizer_shape,
                  .create = make_optimizer<Optimizer::Momentum>});

}  // namespace kiln::ops
