#include "ops/elementwise/activation.h"

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
  if (a == "QuickGelu") return math::Activation::QuickGelu;
  if (a == "Sigmoid") return math::Activation::Sigmoid;
  if (a == "Tanh") return math::Activation::Tanh;
  info.fail("unknown activation '" + a + "'", ErrorKind::Unsupported);
}

void apply_activation(math::Activation a, float* y, int64_t n) {
  math::activate(a, y, n, math::kernels());
}

}  // namespace kiln::ops
