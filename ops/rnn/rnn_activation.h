// The activations of the recurrent ops (ops/rnn/rnn.cpp): f, g and h of each direction, by the
// names and alpha/beta lists of the ONNX attributes.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/core/kernel.h"

namespace kiln::ops::rnn {

// n values at p as an Eigen array (the vectorised tanh and logistic of the cell arithmetic).
template <typename C>
using ArrayMap = Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>>;
template <typename C>
ArrayMap<C> array(C* p, int64_t n) {
  return ArrayMap<C>(p, n);
}

struct Activation {
  enum Kind {
    Relu,
    Tanh,
    Sigmoid,
    Affine,
    LeakyRelu,
    ThresholdedRelu,
    ScaledTanh,
    HardSigmoid,
    Elu,
    Softsign,
    Softplus
  };
  Kind kind = Tanh;
  float alpha = 0, beta = 0;

  template <typename C>
  void apply(C* p, int64_t n) const {
    const C a = static_cast<C>(alpha), b = static_cast<C>(beta);
    auto each = [&](auto f) {
      for (int64_t i = 0; i < n; ++i) p[i] = f(p[i]);
    };
    switch (kind) {
      case Relu:
        return each([](C x) { return x > C(0) ? x : C(0); });
      case Tanh:  // Eigen's vectorised forms: these two dominate the cell arithmetic
        array(p, n) = array(p, n).tanh();
        return;
      case Sigmoid:
        array(p, n) = array(p, n).logistic();
        return;
      case Affine:
        return each([&](C x) { return a * x + b; });
      case LeakyRelu:
        return each([&](C x) { return x >= C(0) ? x : a * x; });
      case ThresholdedRelu:
        return each([&](C x) { return x >= a ? x : C(0); });
      case ScaledTanh:
        return each([&](C x) { return a * std::tanh(b * x); });
      case HardSigmoid:
        return each([&](C x) { return std::min(C(1), std::max(C(0), a * x + b)); });
      case Elu:
        return each([&](C x) { return x >= C(0) ? x : a * std::expm1(x); });
      case Softsign:
        return each([](C x) { return x / (C(1) + std::abs(x)); });
      case Softplus:
        return each([](C x) { return x > C(20) ? x : std::log1p(std::exp(x)); });
    }
  }
};

// Parses one activation name, taking its alpha/beta from the lists in order (ORT's rule:
// values are consumed only by functions that use them; missing ones take defaults).
Activation parse_activation(const NodeInfo& info, const std::string& name,
                            const std::vector<float>& alphas, size_t& ai,
                            const std::vector<float>& betas, size_t& bi);

}  // namespace kiln::ops::rnn
