#include "engine/passes/fusion/identities.h"

#include <optional>
#include <string>

namespace kiln::passes::fusion {
namespace {

// The value `n` merely passes on (its only output equals this input), or kNoValue.
ir::ValueId passes_on(Rewriter& r, const ir::Node& n) {
  if (!n.domain.empty() || n.outputs.empty() || n.outputs[0] == ir::kNoValue) return ir::kNoValue;
  const std::string& op = n.op_type;
  if (op == "Identity" && n.inputs.size() == 1) return n.inputs[0];
  if (op == "Dropout" && !n.inputs.empty()) {
    // Inference Dropout: training_mode absent or constant false, the mask unused.
    if (n.outputs.size() > 1 && !r.unused(n.outputs[1])) return ir::kNoValue;
    if (n.attr("is_test") == nullptr && n.opset < 7) return ir::kNoValue;
    if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) {
      const Tensor* training = r.constant(n.inputs[2]);
      if (!training || training->numel() != 1 || training->dtype() != DataType::Bool ||
          training->contiguous().data<const bool>()[0]) {
        return ir::kNoValue;
      }
    }
    return n.inputs[0];
  }
  if (op == "Cast" && n.inputs.size() == 1) {
    const ir::Attribute* to = n.attr("to");
    const DataType from = r.dtype(n.inputs[0]);
    if (to && from != DataType::Undefined && static_cast<int64_t>(from) == to->i) {
      return n.inputs[0];
    }
    return ir::kNoValue;
  }
  const bool mul = op == "Mul", div = op == "Div", add = op == "Add", sub = op == "Sub";
  if ((mul || div || add || sub) && n.inputs.size() == 2) {
    const double neutral = mul || div ? 1.0 : 0.0;
    // x op c with c a rank-0 constant equal to the neutral element: y is x (a constant of
    // rank 0 cannot broadcast x to a larger shape, and its type is x's).
    for (int side = 0; side < 2; ++side) {
      if (side == 1 && (div || sub)) break;  // 1 / x and 0 - x are not x
      const ir::ValueId c = n.inputs[side == 0 ? 1 : 0];
      const Tensor* t = r.constant(c);
      const std::optional<double> v = r.scalar(c);
      if (t && t->rank() == 0 && v && *v == neutral) return n.inputs[side == 0 ? 0 : 1];
    }
  }
  return ir::kNoValue;
}

}  // namespace

int eliminate_identities(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& n = r.node(i);
    const ir::ValueId in = passes_on(r, n);
    if (in == ir::kNoValue || r.pinned(n.outputs[0])) continue;
    const ir::ValueId out = n.outputs[0];
    r.remove(&n);
    r.replace_uses(out, in);
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion
