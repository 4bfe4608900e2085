#include "engine/passes/fusion/activations.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

namespace kiln::passes::fusion {
namespace {

// `x` equals `want` up to the rounding of a constant written in float.
bool near(double x, double want) {
  return std::abs(x - want) <= 1e-6 * std::abs(want) + 1e-7;
}

// The outer part both GELU forms share, around f (erf(x / sqrt2) or tanh(...)): 1 + f, then
// (x * (1 + f)) * 0.5 or (x * 0.5) * (1 + f), in any operand order. Appends its nodes to
// `drop` and returns the node whose output is the GELU, or null.
ir::Node* gelu_outer(Rewriter& r, ir::ValueId x, ir::ValueId f, std::vector<ir::Node*>& drop) {
  if (!r.single_use(f)) return nullptr;
  ir::Node* one = nullptr;
  for (size_t j = 0; j < r.size() && !one; ++j) {
    if (r.removed(j) || !is(r.node(j), "Add") || r.node(j).inputs.size() != 2) continue;
    ir::Node& a = r.node(j);
    if (a.inputs[0] != f && a.inputs[1] != f) continue;
    const auto c = r.scalar(other_input(a, f));
    if (c && *c == 1.0) one = &a;
  }
  if (!one || !r.single_use(one->outputs[0])) return nullptr;
  ir::Node* m1 = nullptr;  // the Mul reading 1 + f
  for (size_t j = 0; j < r.size() && !m1; ++j) {
    if (r.removed(j) || !is(r.node(j), "Mul") || r.node(j).inputs.size() != 2) continue;
    ir::Node& m = r.node(j);
    if (m.inputs[0] == one->outputs[0] || m.inputs[1] == one->outputs[0]) m1 = &m;
  }
  if (!m1) return nullptr;
  const ir::ValueId partner = other_input(*m1, one->outputs[0]);
  if (partner == x) {
    // (x * (1 + f)) * 0.5
    if (!r.single_use(m1->outputs[0])) return nullptr;
    for (size_t j = 0; j < r.size(); ++j) {
      if (r.removed(j) || !is(r.node(j), "Mul") || r.node(j).inputs.size() != 2) continue;
      ir::Node& m = r.node(j);
      if (m.inputs[0] != m1->outputs[0] && m.inputs[1] != m1->outputs[0]) continue;
      const auto c = r.scalar(other_input(m, m1->outputs[0]));
      if (!c || *c != 0.5) continue;
      drop.insert(drop.end(), {one, m1, &m});
      return &m;
    }
    return nullptr;
  }
  // (x * 0.5) * (1 + f)
  ir::Node* half = r.producer(partner, "Mul");
  if (!half || !r.single_use(partner) || half->inputs.size() != 2) return nullptr;
  bool ok = false;
  for (int s = 0; s < 2; ++s) {
    const auto c = r.scalar(half->inputs[s]);
    ok = ok || (c && *c == 0.5 && half->inputs[1 - s] == x);
  }
  if (!ok) return nullptr;
  drop.insert(drop.end(), {one, m1, half});
  return m1;
}

// One Gelu (opset 20, `approximate` "tanh" or none) in place of `drop`, named after `last`.
void replace_with_gelu(Rewriter& r, ir::ValueId x, ir::Node* last,
                       const std::vector<ir::Node*>& drop, bool tanh) {
  ir::Node gelu;
  gelu.name = last->name.empty() ? "gelu" : last->name + "/gelu";
  gelu.op_type = "Gelu";
  gelu.opset = 20;
  gelu.inputs = {x};
  gelu.outputs = {last->outputs[0]};
  if (tanh) {
    ir::Attribute a;
    a.name = "approximate";
    a.kind = ir::AttrKind::String;
    a.s = "tanh";
    gelu.attributes = {a};
  }
  for (ir::Node* d : drop) r.remove(d);
  r.add(std::move(gelu));
}

// The Mul node computing c * v (either operand order, c a float scalar near `want`) when its
// output is read once: the node and v, else null.
std::pair<ir::Node*, ir::ValueId> scaled(Rewriter& r, ir::ValueId out, double want) {
  ir::Node* m = r.producer(out, "Mul");
  if (!m || m->inputs.size() != 2 || !r.single_use(out)) return {nullptr, ir::kNoValue};
  for (int s = 0; s < 2; ++s) {
    const auto c = r.scalar(m->inputs[s]);
    if (c && near(*c, want)) return {m, m->inputs[1 - s]};
  }
  return {nullptr, ir::kNoValue};
}

}  // namespace

int fuse_gelu(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Erf")) continue;
    ir::Node* erf = &r.node(i);
    // Erf's input: x / sqrt2 or x * (1 / sqrt2).
    ir::Node* scale = r.producer(erf->inputs[0]);
    if (!scale || !r.single_use(erf->inputs[0]) || scale->inputs.size() != 2) continue;
    ir::ValueId x = ir::kNoValue;
    if (is(*scale, "Div")) {
      const auto c = r.scalar(scale->inputs[1]);
      if (c && near(*c, std::sqrt(2.0))) x = scale->inputs[0];
    } else if (is(*scale, "Mul")) {
      for (int s = 0; s < 2 && x == ir::kNoValue; ++s) {
        const auto c = r.scalar(scale->inputs[s]);
        if (c && near(*c, 1.0 / std::sqrt(2.0))) x = scale->inputs[1 - s];
      }
    }
    if (x == ir::kNoValue) continue;
    std::vector<ir::Node*> drop{scale, erf};
    ir::Node* last = gelu_outer(r, x, erf->outputs[0], drop);
    if (!last) continue;
    replace_with_gelu(r, x, last, drop, false);
    ++count;
  }
  return count;
}

int fuse_gelu_tanh(Rewriter& r) {
  int count = 0;
  const double sqrt_2_over_pi = std::sqrt(2.0 / 3.14159265358979323846);
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Tanh") || r.node(i).inputs.size() != 1) continue;
    ir::Node* tanh = &r.node(i);
    const auto [outer_scale, inner] = scaled(r, tanh->inputs[0], sqrt_2_over_pi);
    ir::Node* sum = outer_scale ? r.producer(inner, "Add") : nullptr;
    if (!sum || sum->inputs.size() != 2 || !r.single_use(inner)) continue;
    // x + 0.044715 * Pow(x, 3), in either order.
    ir::ValueId x = ir::kNoValue;
    ir::Node *cube_scale = nullptr, *cube = nullptr;
    for (int s = 0; s < 2 && x == ir::kNoValue; ++s) {
      const auto [m, p] = scaled(r, sum->inputs[s], 0.044715);
      ir::Node* pow = m ? r.producer(p, "Pow") : nullptr;
      if (!pow || pow->inputs.size() != 2 || !r.single_use(p) ||
          pow->inputs[0] != sum->inputs[1 - s]) {
        continue;
      }
      const auto e = r.scalar(pow->inputs[1]);
      if (!e || *e != 3.0) continue;
      x = pow->inputs[0];
      cube_scale = m;
      cube = pow;
    }
    if (x == ir::kNoValue) continue;
    std::vector<ir::Node*> drop{cube, cube_scale, sum, outer_scale, tanh};
    ir::Node* last = gelu_outer(r, x, tanh->outputs[0], drop);
    if (!last) continue;
    replace_with_gelu(r, x, last, drop, true);
    ++count;
  }
  return count;
}

int fuse_swish(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Sigmoid") || r.node(i).inputs.size() != 1) continue;
    ir::Node* sigmoid = &r.node(i);
    const ir::ValueId z = sigmoid->inputs[0], s = sigmoid->outputs[0];
    ir::Node* mul = binary_reader(r, s, "Mul");
    if (!mul || mul->inputs[0] == mul->inputs[1]) continue;
    const ir::ValueId x = other_input(*mul, s);
    std::vector<ir::Node*> chain{sigmoid, mul};
    double alpha = 1.0;
    if (x != z) {
      ir::Node* scale = r.producer(z, "Mul");
      if (!scale || scale->inputs.size() != 2 || !r.single_use(z)) continue;
      const int side = scale->inputs[0] == x ? 0 : scale->inputs[1] == x ? 1 : -1;
      if (side < 0) continue;
      const auto c = scalar_factor(r, scale->inputs[static_cast<size_t>(1 - side)], x);
      if (!c) continue;
      alpha = *c;
      chain.push_back(scale);
    }
    ir::Node swish;
    swish.name = mul->name.empty() ? "swish" : mul->name + "/swish";
    swish.op_type = "Swish";
    swish.opset = 24;
    swish.inputs = {x};
    swish.outputs = {mul->outputs[0]};
    ir::Attribute a;
    a.name = "alpha";
    a.kind = ir::AttrKind::Float;
    a.f = static_cast<float>(alpha);
    swish.attributes = {a};
    for (ir::Node* c : chain) r.remove(c);
    r.add(std::move(swish));
    ++count;
  }
  return count;
}

ir::Attribute activation_attr(const char* name) {
  ir::Attribute a;
  a.name = "activation";
  a.kind = ir::AttrKind::String;
  a.s = name;
  return a;
}

const char* activation_of(const ir::Node& n) {
  if (is(n, "Relu")) return "Relu";
  if (is(n, "Sigmoid")) return "Sigmoid";
  if (is(n, "Tanh")) return "Tanh";
  if (is(n, "Gelu")) {
    const ir::Attribute* a = n.attr("approximate");
    return a && a->s == "tanh" ? "GeluTanh" : "Gelu";
  }
  if (is(n, "Swish")) {
    const ir::Attribute* a = n.attr("alpha");
    const float alpha = a ? a->f : 1.0f;
    if (alpha == 1.0f) return "Silu";
    if (alpha == 1.702f) return "QuickGelu";  // math::kQuickGeluAlpha
  }
  return nullptr;
}

}  // namespace kiln::passes::fusion
