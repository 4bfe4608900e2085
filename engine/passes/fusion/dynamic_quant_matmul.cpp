#include "engine/passes/fusion/dynamic_quant_matmul.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/passes/fusion/activations.h"

namespace kiln::passes::fusion {
namespace {

// The DynamicQuantizeLinear whose three outputs are `q`, `scale` and `zero`, or null.
ir::Node* dynamic_quantizer(Rewriter& r, ir::ValueId q, ir::ValueId scale, ir::ValueId zero) {
  ir::Node* d = r.producer(q, "DynamicQuantizeLinear");
  if (!d || d->outputs.size() != 3 || d->outputs[0] != q || d->outputs[1] != scale ||
      d->outputs[2] != zero) {
    return nullptr;
  }
  return d;
}

// A constant of `type` with one value or one per column of a 2-D B of n columns (the forms
// both fused ops take).
bool per_column_constant(Rewriter& r, ir::ValueId v, DataType type, int64_t n) {
  const Tensor* t = r.constant(v);
  return t && t->dtype() == type && (t->numel() == 1 ? t->rank() <= 1 : t->rank() == 1) &&
         (t->numel() == 1 || t->dim(0) == n);
}

void remove_if_unused(Rewriter& r, ir::Node* n) {
  if (n && std::all_of(n->outputs.begin(), n->outputs.end(),
                       [&](ir::ValueId v) { return r.unused(v); })) {
    r.remove(n);
  }
}

// The reader of `y` alone adding a constant float bias of n values along the last axis, or
// null.
ir::Node* bias_add(Rewriter& r, ir::ValueId y, int64_t n) {
  ir::Node* add = r.sole_reader(y);
  if (!add || !is(*add, "Add") || add->inputs.size() != 2) return nullptr;
  const Tensor* t = r.constant(other_input(*add, y));
  return t && t->dtype() == DataType::Float && t->rank() == 1 && t->dim(0) == n ? add : nullptr;
}

ir::Node ms_node(const std::string& name, const char* op, std::vector<ir::ValueId> inputs,
                 ir::ValueId output) {
  ir::Node n;
  n.name = name;
  n.op_type = op;
  n.domain = "com.microsoft";
  n.opset = 1;
  n.inputs = std::move(inputs);
  while (!n.inputs.empty() && n.inputs.back() == ir::kNoValue) n.inputs.pop_back();
  n.outputs = {output};
  return n;
}

}  // namespace

int fuse_dynamic_quant_matmul(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node* mm = &r.node(i);
    const bool integer = is(*mm, "MatMulInteger");
    const bool to_float = mm->domain == "com.microsoft" && mm->op_type == "MatMulIntegerToFloat";
    if (!integer && !to_float) continue;
    const size_t zero_at = integer ? 2 : 4;  // A's zero point
    if (mm->inputs.size() <= zero_at) continue;
    const ir::ValueId a = mm->inputs[0], b = mm->inputs[1];
    const Tensor* w = r.constant(b);
    if (!w || w->rank() != 2 || (w->dtype() != DataType::Int8 && w->dtype() != DataType::UInt8)) {
      continue;
    }
    const int64_t n = w->dim(1);
    const ir::ValueId b_zero =
        mm->inputs.size() > zero_at + 1 ? mm->inputs[zero_at + 1] : ir::kNoValue;
    if (b_zero != ir::kNoValue && !per_column_constant(r, b_zero, w->dtype(), n)) continue;
    std::string name = mm->name.empty() ? "matmul" : mm->name;
    if (to_float) {
      ir::Node* d = dynamic_quantizer(r, a, mm->inputs[2], mm->inputs[4]);
      if (!d || !r.single_use(a)) continue;
      const ir::ValueId bias = mm->inputs.size() > 6 ? mm->inputs[6] : ir::kNoValue;
      ir::Node fused = ms_node(name, "DynamicQuantizeMatMul",
                               {d->inputs[0], b, mm->inputs[3], b_zero, bias}, mm->outputs[0]);
      r.remove(mm);
      remove_if_unused(r, d);
      r.add(std::move(fused));
      ++count;
      continue;
    }
    ir::Node* cast = r.sole_reader(mm->outputs[0]);
    const ir::Attribute* to = cast && is(*cast, "Cast") ? cast->attr("to") : nullptr;
    if (!to || to->i != static_cast<int64_t>(DataType::Float)) continue;
    ir::Node* mul = r.sole_reader(cast->outputs[0]);
    if (!mul || !is(*mul, "Mul") || mul->inputs.size() != 2) continue;
    ir::Node* scales = r.producer(other_input(*mul, cast->outputs[0]), "Mul");
    if (!scales || scales->inputs.size() != 2 || !r.single_use(scales->outputs[0])) continue;
    // Mul(a_scale, b_scale), in either order, a_scale from the quantizer of A.
    ir::Node* d = nullptr;
    ir::ValueId b_scale = ir::kNoValue;
    for (int s = 0; s < 2 && !d; ++s) {
      d = dynamic_quantizer(r, a, scales->inputs[s], mm->inputs[2]);
      b_scale = scales->inputs[1 - s];
    }
    if (!d || !per_column_constant(r, b_scale, DataType::Float, n)) continue;
    ir::ValueId out = mul->outputs[0];
    ir::Node* add = bias_add(r, out, n);
    ir::ValueId bias = add ? other_input(*add, out) : ir::kNoValue;
    if (add) out = add->outputs[0];
    ir::Node fused =
        r.single_use(a)
            ? ms_node(name, "DynamicQuantizeMatMul", {d->inputs[0], b, b_scale, b_zero}, out)
            : ms_node(name, "MatMulIntegerToFloat",
                      {a, b, d->outputs[1], b_scale, d->outputs[2], b_zero}, out);
    if (bias != ir::kNoValue) {
      fused.inputs.resize(fused.op_type == "DynamicQuantizeMatMul" ? 4 : 6, ir::kNoValue);
      fused.inputs.push_back(bias);
    }
    for (ir::Node* gone : {mm, cast, mul, scales, add}) {
      if (gone) r.remove(gone);
    }
    remove_if_unused(r, d);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

int fuse_dynamic_quant_activation(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& act = r.node(i);
    if (act.domain != "com.microsoft" || act.op_type != "Gelu" || act.inputs.size() != 1) continue;
    ir::Node* mm = r.producer(act.inputs[0]);
    if (!mm || mm->domain != "com.microsoft" || mm->op_type != "DynamicQuantizeMatMul" ||
        !r.single_use(act.inputs[0])) {
      continue;
    }
    ir::Node fused = *mm;
    fused.domain = "kiln";
    fused.attributes.push_back(activation_attr("Gelu"));
    fused.outputs = {act.outputs[0]};
    r.remove(mm);
    r.remove(&act);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion
