#include "engine/passes/fusion/matmul.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "engine/passes/fusion/activations.h"

namespace kiln::passes::fusion {
namespace {

bool is_fused_matmul(const ir::Node& n) {
  return n.op_type == "FusedMatMul" && (n.domain == "kiln" || n.domain == "com.microsoft");
}

void set_attr(ir::Node& n, const char* name, ir::AttrKind kind, float f, int64_t i) {
  auto it = std::find_if(n.attributes.begin(), n.attributes.end(),
                         [&](const ir::Attribute& a) { return a.name == name; });
  if (it == n.attributes.end()) {
    n.attributes.emplace_back();
    it = n.attributes.end() - 1;
    it->name = name;
  }
  it->kind = kind;
  it->f = f;
  it->i = i;
}

float alpha_of(const ir::Node& n) {
  const ir::Attribute* a = n.attr("alpha");
  return a ? a->f : 1.0f;
}

// `n` as a fused product (a MatMul becomes com.microsoft.FusedMatMul), to take alpha or trans.
ir::Node as_fused_matmul(const ir::Node& n) {
  ir::Node f = n;
  if (!is_fused_matmul(f)) {
    f.domain = "com.microsoft";
    f.op_type = "FusedMatMul";
    f.opset = 1;
  }
  return f;
}

}  // namespace

int fuse_matmul_epilogue(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "MatMul")) continue;
    ir::Node* mm = &r.node(i);
    const ir::ValueId y = mm->outputs[0];
    if (!r.single_use(y)) continue;
    // The Add reading y with a constant bias.
    ir::Node* add = nullptr;
    ir::ValueId bias = ir::kNoValue;
    for (size_t j = 0; j < r.size() && !add; ++j) {
      if (r.removed(j) || !is(r.node(j), "Add") || r.node(j).inputs.size() != 2) continue;
      ir::Node& a = r.node(j);
      if (a.inputs[0] != y && a.inputs[1] != y) continue;
      const ir::ValueId b = other_input(a, y);
      const Tensor* t = r.constant(b);
      if (!t || t->dtype() != DataType::Float || t->rank() != 1) continue;
      const Tensor* w = r.constant(mm->inputs[1]);
      // The bias must run along the product's last axis: B's columns (when B is known) and
      // never broadcast the product to a larger shape (a 1-D product is not fused).
      if (w && w->rank() >= 2 && w->dim(w->rank() - 1) != t->dim(0)) continue;
      // B known and at least 2-D: the product has B's columns as its last axis, so the bias
      // adds along it without broadcasting the product to another shape.
      if (!w || w->dtype() != DataType::Float || w->rank() < 2) continue;
      add = &a;
      bias = b;
    }
    if (!add) continue;
    ir::Node fused;
    fused.name = mm->name.empty() ? "matmul" : mm->name;
    fused.op_type = "FusedMatMul";
    fused.domain = "kiln";
    fused.opset = 1;
    fused.inputs = {mm->inputs[0], mm->inputs[1], bias};
    fused.outputs = {add->outputs[0]};
    r.remove(mm);
    r.remove(add);
    r.add(std::move(fused));
    ++count;
  }
  // An activation reading a fused product alone joins it.
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& act = r.node(i);
    const char* name = activation_of(act);
    if (!name || act.inputs.empty()) continue;
    ir::Node* fm = r.producer(act.inputs[0]);
    if (!fm || fm->domain != "kiln" || fm->op_type != "FusedMatMul" || fm->attr("activation") ||
        !r.single_use(act.inputs[0])) {
      continue;
    }
    ir::Node fused = *fm;
    fused.attributes.push_back(activation_attr(name));
    fused.outputs = {act.outputs[0]};
    r.remove(fm);
    r.remove(&act);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

int fold_into_matmul(Rewriter& r) {
  int count = 0;
  // The product scaled afterwards.
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node* op = &r.node(i);
    if ((!is(*op, "Mul") && !is(*op, "Div")) || op->inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      if (side == 1 && is(*op, "Div")) break;  // c / y is not a scaled y
      const ir::ValueId y = op->inputs[static_cast<size_t>(side)];
      const ir::ValueId c = op->inputs[static_cast<size_t>(1 - side)];
      ir::Node* mm = r.producer(y);
      if (!mm || !(is(*mm, "MatMul") || is_fused_matmul(*mm)) || mm->attr("activation") ||
          !r.single_use(y)) {
        continue;
      }
      auto s = scalar_factor(r, c, y);
      if (!s || (is(*op, "Div") && *s == 0.0)) continue;
      const double factor = is(*op, "Div") ? 1.0 / *s : *s;
      ir::Node fused = as_fused_matmul(*mm);
      if (fused.inputs.size() > 2 && fused.inputs[2] != ir::kNoValue) {
        const Tensor* bias = r.constant(fused.inputs[2]);
        if (!bias || bias->dtype() != DataType::Float) continue;
        const Tensor bc = bias->contiguous();
        Tensor scaled(DataType::Float, bias->shape(),
                      Storage::heap_uninitialized(storage_bytes(DataType::Float, bias->numel())));
        for (int64_t k = 0; k < bias->numel(); ++k) {
          scaled.data<float>()[k] =
              static_cast<float>(static_cast<double>(bc.data<const float>()[k]) * factor);
        }
        fused.inputs[2] =
            r.new_constant(r.graph().value(op->outputs[0]).name + "/bias", std::move(scaled));
      }
      set_attr(fused, "alpha", ir::AttrKind::Float,
               static_cast<float>(static_cast<double>(alpha_of(fused)) * factor), 0);
      fused.outputs = {op->outputs[0]};
      r.remove(mm);
      r.remove(op);
      r.add(std::move(fused));
      ++count;
      break;
    }
  }
  // Scaled or transposed operands.
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    if (!is(r.node(i), "MatMul") && !is_fused_matmul(r.node(i))) continue;
    if (r.node(i).inputs.size() < 2) continue;
    // The fused products take floats: a MatMul's type is told by a float operand (a scalar
    // Mul's constant says it too, below).
    const bool float_product = is_fused_matmul(r.node(i)) ||
                               r.dtype(r.node(i).inputs[0]) == DataType::Float ||
                               r.dtype(r.node(i).inputs[1]) == DataType::Float;
    ir::Node fused = as_fused_matmul(r.node(i));
    std::vector<ir::Node*> drop;
    for (size_t k = 0; k < 2; ++k) {
      const ir::ValueId v = fused.inputs[k];
      ir::Node* p = r.producer(v);
      if (!p || !r.single_use(v)) continue;
      if ((is(*p, "Mul") || is(*p, "Div")) && p->inputs.size() == 2) {
        for (int side = 0; side < 2; ++side) {
          if (side == 1 && is(*p, "Div")) break;
          const ir::ValueId x = p->inputs[static_cast<size_t>(side)];
          const auto s = scalar_factor(r, p->inputs[static_cast<size_t>(1 - side)], x);
          if (!s || (is(*p, "Div") && *s == 0.0)) continue;
          const double factor = is(*p, "Div") ? 1.0 / *s : *s;
          set_attr(fused, "alpha", ir::AttrKind::Float,
                   static_cast<float>(static_cast<double>(alpha_of(fused)) * factor), 0);
          fused.inputs[k] = x;
          drop.push_back(p);
          break;
        }
      } else if (is(*p, "Transpose") && float_product) {
        const char* name = k == 0 ? "transA" : "transB";
        const ir::Attribute* perm = p->attr("perm");
        const ir::Attribute* trans = fused.attr(name);
        if (!perm || perm->ints.size() < 2 || (trans && trans->i != 0)) continue;
        const size_t n = perm->ints.size();
        bool swaps_last = perm->ints[n - 1] == static_cast<int64_t>(n - 2) &&
                          perm->ints[n - 2] == static_cast<int64_t>(n - 1);
        for (size_t d = 0; d + 2 < n; ++d) swaps_last = swaps_last && perm->ints[d] == int64_t(d);
        if (!swaps_last) continue;
        set_attr(fused, name, ir::AttrKind::Int, 0.0f, 1);
        fused.inputs[k] = p->inputs[0];
        drop.push_back(p);
      }
    }
    if (drop.empty()) continue;
    r.remove(&r.node(i));
    for (ir::Node* d : drop) r.remove(d);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion
