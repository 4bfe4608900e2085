#include "ops/activation.h"

#include <string>

#include "ops/math/kernels.h"

namespace kiln::ops {

math::Activation parse_activation(const NodeInfo& info) {
  const std::string a = info.attr_string("activation", "");
  if (a.empty()) return math::Activation::None;
  if (a == "Relu") return math::Activation::Relu;
  if (a == "Gelu") return math::Activation::Gelu;
  if (a == "GeluTanh") return math::Activation::GeluTanh;
  if (a == "Silu") return math::Activation::Silu;
  if (a == "Sigmoid") return math::Activation::Sigmoid;
  if (a == "Tanh") return math::Activation::Tanh;
  info.fail("unknown activation '" + a + "'", ErrorKind::Unsupported);
}

void apply_activation(math::Activation a, float* y, int64_t n) {
  const math::VecMathKernels& vec = math::kernels().vec;
  switch (a) {
    case math::Activation::None:
      return;
    case math::Activation::Relu:
      for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
      return;
    case math::Activation::Gelu:
      return vec.gelu(y, y, n);
    case math::Activation::GeluTanh:
      return vec.gelu_tanh(y, y, n);
    case math::Activation::Silu:
      return vec.silu(y, y, n);
    case math::Activation::Sigmoid:
      return vec.sigmoid(y, y, n);
    case math::Activation::Tanh:
      return vec.tanh(y, y, n);
  }
}

}  // namespace kiln::ops
