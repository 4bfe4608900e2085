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

// Whether every value of type `from` is exactly a value of type `to`.
bool holds_exactly(DataType from, DataType to) {
  using D = DataType;
  if (from == to) return true;
  struct Int {
    D type;
    bool is_signed;
    int bits;
  };
  static const Int kInts[] = {{D::Int8, true, 8},     {D::UInt8, false, 8},  {D::Int16, true, 16},
                              {D::UInt16, false, 16}, {D::Int32, true, 32},  {D::UInt32, false, 32},
                              {D::Int64, true, 64},   {D::UInt64, false, 64}};
  // Floating types by the bits of their significand (the implicit one included); their
  // exponent ranges grow with it here (bfloat16's is float's).
  struct Float {
    D type;
    int significand;
  };
  static const Float kFloats[] = {
      {D::Float16, 11}, {D::BFloat16, 8}, {D::Float, 24}, {D::Double, 53}};
  const Int* fi = nullptr;
  const Int* ti = nullptr;
  const Float* ff = nullptr;
  const Float* tf = nullptr;
  for (const Int& k : kInts) {
    if (k.type == from) fi = &k;
    if (k.type == to) ti = &k;
  }
  for (const Float& k : kFloats) {
    if (k.type == from) ff = &k;
    if (k.type == to) tf = &k;
  }
  if (from == D::Bool) return ti || tf;
  if (fi && ti) {
    if (fi->is_signed && !ti->is_signed) return false;
    return ti->bits > fi->bits || (ti->bits == fi->bits && fi->is_signed == ti->is_signed);
  }
  if (fi && tf) return tf->significand >= fi->bits - (fi->is_signed ? 1 : 0);
  if (ff && tf) {
    if (ff->type == D::Float16 && tf->type == D::BFloat16) return false;  // fewer bits
    if (ff->type == D::BFloat16 && tf->type == D::Float16) return false;  // smaller range
    return tf->significand >= ff->significand;
  }
  return false;
}

}  // namespace

int fold_cast_chains(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& second = r.node(i);
    if (!is(second, "Cast") || second.inputs.size() != 1) continue;
    ir::Node* first = r.producer(second.inputs[0], "Cast");
    if (!first || first->inputs.size() != 1 || !r.single_use(first->outputs[0])) continue;
    const ir::Attribute* to = first->attr("to");
    const DataType from = r.dtype(first->inputs[0]);
    if (!to || from == DataType::Undefined || !holds_exactly(from, static_cast<DataType>(to->i))) {
      continue;
    }
    const ir::ValueId mid = first->outputs[0];
    const ir::ValueId x = first->inputs[0];
    r.remove(first);
    r.replace_uses(mid, x);
    ++count;
  }
  return count;
}

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
