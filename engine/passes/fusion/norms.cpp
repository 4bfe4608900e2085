#include "engine/passes/fusion/norms.h"

#include <optional>
#include <utility>
#include <vector>

namespace kiln::passes::fusion {
namespace {

// The one axis a ReduceMean with keepdims reduces (the `axes` attribute before opset 18, the
// constant second input from 18 on), or nullopt.
std::optional<int64_t> reduced_axis(Rewriter& r, const ir::Node& n) {
  const ir::Attribute* keep = n.attr("keepdims");
  if (keep && keep->i == 0) return std::nullopt;
  if (n.opset >= 18) {
    const Tensor* t = r.constant(n.inputs.size() > 1 ? n.inputs[1] : ir::kNoValue);
    if (!t || t->dtype() != DataType::Int64 || t->numel() != 1) return std::nullopt;
    return t->contiguous().data<const int64_t>()[0];
  }
  const ir::Attribute* axes = n.attr("axes");
  if (!axes || axes->ints.size() != 1 || n.inputs.size() != 1) return std::nullopt;
  return axes->ints[0];
}

// A float constant vector of n values (n > 1: exactly the normalised axis), or null.
const Tensor* norm_param(Rewriter& r, ir::ValueId v, int64_t n) {
  const Tensor* t = r.constant(v);
  if (!t || t->dtype() != DataType::Float || t->rank() != 1 || t->numel() < 1) return nullptr;
  return n < 0 || t->numel() == n ? t : nullptr;
}

}  // namespace

int fuse_layer_norm(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "ReduceMean") || r.node(i).inputs.empty()) continue;
    ir::Node* mean = &r.node(i);
    const ir::ValueId x = mean->inputs[0];
    const int64_t rank = r.rank(x);
    auto last_axis = [rank](std::optional<int64_t> a) {
      return a && (*a == -1 || (rank >= 1 && *a == rank - 1));
    };
    if (!last_axis(reduced_axis(r, *mean))) continue;
    ir::Node* sub = binary_reader(r, mean->outputs[0], "Sub");
    if (!sub || sub->inputs[0] != x || sub->inputs[1] != mean->outputs[0]) continue;
    const ir::ValueId d = sub->outputs[0];
    // d is read by the square and by the Div, and nothing else.
    const std::vector<ir::Node*> dr = r.readers(d);
    if (dr.size() != 2 || r.pinned(d)) continue;
    ir::Node* square = nullptr;
    ir::Node* div = nullptr;
    for (ir::Node* n : dr) {
      if (n->inputs.size() != 2) continue;
      if (is(*n, "Div") && n->inputs[0] == d && n->inputs[1] != d) div = n;
      if (is(*n, "Mul") && n->inputs[0] == d && n->inputs[1] == d) square = n;
      if (is(*n, "Pow") && n->inputs[0] == d) {
        const auto e = r.scalar(n->inputs[1]);
        if (e && *e == 2.0) square = n;
      }
    }
    if (!square || !div) continue;
    ir::Node* var = r.sole_reader(square->outputs[0]);
    if (!var || !is(*var, "ReduceMean") || var->inputs[0] != square->outputs[0] ||
        !last_axis(reduced_axis(r, *var))) {
      continue;
    }
    ir::Node* add_eps = binary_reader(r, var->outputs[0], "Add");
    if (!add_eps) continue;
    const auto eps = r.scalar(other_input(*add_eps, var->outputs[0]));
    const Tensor* eps_t = r.constant(other_input(*add_eps, var->outputs[0]));
    if (!eps || !(*eps >= 0) || eps_t->dtype() != DataType::Float || eps_t->rank() > 1) continue;
    ir::Node* sqrt = r.sole_reader(add_eps->outputs[0]);
    if (!sqrt || !is(*sqrt, "Sqrt") || r.sole_reader(sqrt->outputs[0]) != div ||
        div->inputs[1] != sqrt->outputs[0]) {
      continue;
    }
    // The scale: a Mul reading the quotient alone, with a vector along the last axis.
    const int64_t n = r.last_dim(x);
    ir::Node* mul = binary_reader(r, div->outputs[0], "Mul");
    if (!mul) continue;
    const ir::ValueId gamma = other_input(*mul, div->outputs[0]);
    const Tensor* g = norm_param(r, gamma, -1);
    // A scale of more than one value must run along x's last axis (else it broadcasts x).
    if (!g || (g->numel() > 1 && g->numel() != n)) continue;
    std::vector<ir::Node*> chain{mean, sub, square, var, add_eps, sqrt, div, mul};
    ir::ValueId beta = ir::kNoValue;
    ir::ValueId y = mul->outputs[0];
    if (ir::Node* add = binary_reader(r, y, "Add")) {
      const ir::ValueId b = other_input(*add, y);
      const Tensor* bt = norm_param(r, b, -1);
      if (bt && (bt->numel() == 1 || bt->numel() == n)) {
        beta = b;
        chain.push_back(add);
        y = add->outputs[0];
      }
    }
    ir::Node ln;
    ln.name = mean->name.empty() ? "layer_norm" : mean->name + "/layer_norm";
    ln.op_type = "LayerNormalization";
    ln.opset = 17;
    ln.inputs = {x, gamma};
    if (beta != ir::kNoValue) ln.inputs.push_back(beta);
    ir::Attribute a;
    a.name = "axis";
    a.kind = ir::AttrKind::Int;
    a.i = -1;
    ir::Attribute e;
    e.name = "epsilon";
    e.kind = ir::AttrKind::Float;
    e.f = static_cast<float>(*eps);
    ln.attributes = {a, e};
    ln.outputs = {y};
    for (ir::Node* c : chain) r.remove(c);
    r.add(std::move(ln));
    ++count;
  }
  return count;
}

int fuse_skip_layer_norm(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "LayerNormalization")) continue;
    ir::Node* ln = &r.node(i);
    if (ln->opset < 17 || ln->inputs.size() < 2) continue;
    bool statistics_used = false;
    for (size_t o = 1; o < ln->outputs.size(); ++o) {
      statistics_used = statistics_used || !r.unused(ln->outputs[o]);
    }
    const ir::Attribute* stash = ln->attr("stash_type");
    if (statistics_used || (stash && stash->i != 1)) continue;
    const ir::ValueId sum = ln->inputs[0];
    ir::Node* add = r.producer(sum, "Add");
    if (!add || add->inputs.size() != 2) continue;
    const int64_t rank = r.rank(sum);
    const ir::Attribute* axis = ln->attr("axis");
    if (axis && axis->i != -1 && (rank < 1 || axis->i != rank - 1)) continue;
    const int64_t n = r.last_dim(sum);
    const Tensor* gamma = norm_param(r, ln->inputs[1], -1);
    if (!gamma || (gamma->numel() == 1 && n != 1) || (n >= 0 && gamma->numel() != n)) continue;
    const bool has_beta = ln->inputs.size() > 2 && ln->inputs[2] != ir::kNoValue;
    if (has_beta && !norm_param(r, ln->inputs[2], gamma->numel())) continue;
    const ir::Attribute* eps = ln->attr("epsilon");
    ir::Node fused;
    fused.name = ln->name.empty() ? "skip_layer_norm" : ln->name + "/skip";
    fused.domain = "com.microsoft";
    fused.op_type = "SkipLayerNormalization";
    fused.opset = 1;
    fused.inputs = {add->inputs[0], add->inputs[1], ln->inputs[1]};
    if (has_beta) fused.inputs.push_back(ln->inputs[2]);
    ir::Attribute e;
    e.name = "epsilon";
    e.kind = ir::AttrKind::Float;
    e.f = eps ? eps->f : 1e-5f;  // LayerNormalization's default, not SkipLayerNormalization's
    fused.attributes = {e};
    fused.outputs = {ln->outputs[0]};
    // Other readers of the sum read the fused node's fourth output.
    if (!r.single_use(sum)) fused.outputs = {ln->outputs[0], ir::kNoValue, ir::kNoValue, sum};
    r.remove(add);
    r.remove(ln);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion
