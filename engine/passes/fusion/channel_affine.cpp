#include "engine/passes/fusion/channel_affine.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/passes/fusion/activations.h"
#include "engine/passes/fusion/channel_transform.h"

namespace kiln::passes::fusion {
namespace {

// One step of a chain of per-channel affine ops: the node (by index: fusing a chain appends a
// node, which may move the others), the value it reads along the chain and, for a Mul, Add,
// Sub or Div, its constant operand.
struct AffineStep {
  size_t node = 0;
  ir::ValueId x = ir::kNoValue;
  ir::ValueId c = ir::kNoValue;
};

// Node `i` as a step of such a chain by its form alone: an inference BatchNormalization, a
// Mul, Add or Sub with one float constant operand, or x divided by one. Whether the constants
// hold one value per channel is checked once the chain's channels are known.
std::optional<AffineStep> affine_step(Rewriter& r, size_t i) {
  const ir::Node& n = r.node(i);
  if (r.removed(i) || n.outputs.empty() || n.outputs[0] == ir::kNoValue) return std::nullopt;
  if (inference_batchnorm(r, n)) return AffineStep{i, n.inputs[0], ir::kNoValue};
  const bool div = is(n, "Div");
  if ((!is(n, "Mul") && !is(n, "Add") && !is(n, "Sub") && !div) || n.inputs.size() != 2) {
    return std::nullopt;
  }
  for (int s = 0; s < 2; ++s) {
    const Tensor* t = r.constant(n.inputs[s]);
    if (!t || t->dtype() != DataType::Float || r.constant(n.inputs[1 - s])) continue;
    if (div && s == 0) continue;  // c / x is no affine function of x
    return AffineStep{i, n.inputs[1 - s], n.inputs[s]};
  }
  return std::nullopt;
}

// The step reading `v` alone, or nullopt.
std::optional<AffineStep> next_affine_step(Rewriter& r, ir::ValueId v) {
  ir::Node* n = r.sole_reader(v);
  if (!n) return std::nullopt;
  const std::optional<AffineStep> s = affine_step(r, r.index(n));
  return s && s->x == v ? s : std::nullopt;
}

// `t` followed by step `s` on a tensor of rank `rank` (-1: unknown) with `m` channels; false
// (t unchanged) when s's constants are not one float per channel along axis 1 or one for all
// (of a rank that cannot broadcast the tensor to a larger one; the tensor's rank is at least
// 2, as the chain's start tells).
bool compose(Rewriter& r, const AffineStep& s, int64_t rank, int64_t m, ChannelTransform& t) {
  const ir::Node& n = r.node(s.node);
  const auto size = static_cast<size_t>(m);
  if (s.c == ir::kNoValue) return apply_batchnorm(r, n, m, t);
  std::vector<double> v;
  if (rank >= 0) {
    v = per_channel(r, s.c, rank, m);
  } else if (const Tensor* c = r.constant(s.c); c->numel() == 1 && c->rank() <= 1) {
    v.assign(size, static_cast<double>(c->contiguous().data<const float>()[0]));
  }
  if (v.empty()) return false;
  const bool constant_first = n.inputs[0] == s.c;
  for (size_t k = 0; k < size; ++k) {
    if (is(n, "Mul")) {
      t.scale[k] *= v[k];
      t.shift[k] *= v[k];
    } else if (is(n, "Div")) {
      t.scale[k] /= v[k];
      t.shift[k] /= v[k];
    } else if (is(n, "Add")) {
      t.shift[k] += v[k];
    } else if (constant_first) {  // c - y
      t.scale[k] = -t.scale[k];
      t.shift[k] = v[k] - t.shift[k];
    } else {  // y - c
      t.shift[k] -= v[k];
    }
  }
  return true;
}

}  // namespace

int fuse_channel_affine(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const std::optional<AffineStep> head = affine_step(r, i);
    if (!head) continue;
    // A run is taken from its first step (its steps may be listed in any order).
    if (ir::Node* p = r.producer(head->x)) {
      const std::optional<AffineStep> before = affine_step(r, r.index(p));
      if (before && r.single_use(head->x) && p->outputs[0] == head->x) continue;
    }
    std::vector<AffineStep> run{*head};
    while (auto s = next_affine_step(r, r.node(run.back().node).outputs[0])) run.push_back(*s);
    for (size_t pos = 0; pos < run.size();) {
      const AffineStep& first = run[pos];
      const ir::Node& start = r.node(first.node);
      int64_t m = -1;
      if (first.c == ir::kNoValue) {
        const Tensor* scale = r.constant(start.inputs[1]);
        if (scale && scale->rank() == 1) m = scale->dim(0);
      } else {
        m = r.channels(first.x);
      }
      const int64_t rank = r.rank(first.x);
      ChannelTransform t{std::vector<double>(static_cast<size_t>(std::max<int64_t>(m, 0)), 1.0),
                         std::vector<double>(static_cast<size_t>(std::max<int64_t>(m, 0)), 0.0)};
      // The chain's type is X's: told by the graph, or by a Mul, Add, Sub or Div constant
      // (of the other operand's type) or a BatchNormalization's parameters before opset 15
      // (which allows other types for them) along the chain.
      bool is_float = r.float_type(first.x);
      bool normalizes = false, per_channel_values = false;
      size_t end = pos;
      while (m > 0 && end < run.size() && compose(r, run[end], rank, m, t)) {
        const bool bn = run[end].c == ir::kNoValue;
        normalizes = normalizes || bn;
        per_channel_values = per_channel_values || bn || r.constant(run[end].c)->numel() > 1;
        is_float = is_float || !bn || r.node(run[end].node).opset < 15;
        ++end;
      }
      if (end == pos) {
        ++pos;
        continue;
      }
      ir::ValueId y = r.node(run[end - 1].node).outputs[0];
      ir::Node* act = end == run.size() ? r.sole_reader(y) : nullptr;
      const char* act_name = act ? activation_of(*act) : nullptr;
      if (!act_name || act->inputs.empty() || act->inputs[0] != y) act = nullptr;
      if (!is_float || !per_channel_values || (!normalizes && end - pos + (act ? 1 : 0) < 2)) {
        pos = end;
        continue;
      }
      if (act) y = act->outputs[0];
      const std::string base = r.graph().value(y).name;
      ir::Node fused;
      fused.name = start.name.empty() ? "channel_affine" : start.name;
      fused.domain = "kiln";
      fused.op_type = "ChannelAffine";
      fused.opset = 1;
      fused.inputs = {first.x, r.new_constant(base + "/affine_scale", float_vector(t.scale)),
                      r.new_constant(base + "/affine_shift", float_vector(t.shift))};
      fused.outputs = {y};
      if (act) fused.attributes.push_back(activation_attr(act_name));
      if (act) r.remove(act);
      for (size_t k = pos; k < end; ++k) r.remove(&r.node(run[k].node));
      r.add(std::move(fused));
      ++count;
      pos = end;
    }
  }
  return count;
}

}  // namespace kiln::passes::fusion
