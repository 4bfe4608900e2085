#include "engine/passes/fusion/attention.h"

#include <optional>
#include <utility>
#include <vector>

namespace kiln::passes::fusion {
namespace {

// Where(IsNaN(p), 0, p) over the probabilities `p` (Optimum's exports of scaled dot-product
// attention with a mask: a row whose keys are all masked is NaN after Softmax and becomes
// zeros): the Where and the IsNaN, else null. Attention gives such a row zeros itself (only
// a NaN reaching the scores from Q or K differs: Attention keeps it, the Where zeroed it).
std::pair<ir::Node*, ir::Node*> nan_to_zero(Rewriter& r, ir::ValueId probs) {
  ir::Node* where = r.producer(probs, "Where");
  if (!where || where->inputs.size() != 3 || !r.single_use(probs)) return {nullptr, nullptr};
  ir::Node* isnan = r.producer(where->inputs[0], "IsNaN");
  const std::optional<double> zero = r.scalar(where->inputs[1]);
  if (!isnan || !r.single_use(where->inputs[0]) || !zero || *zero != 0.0 ||
      isnan->inputs[0] != where->inputs[2] || !r.used_exactly(where->inputs[2], 2)) {
    return {nullptr, nullptr};
  }
  return {where, isnan};
}

}  // namespace

int fuse_attention(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "MatMul")) continue;
    ir::Node* pv = &r.node(i);
    const auto [where, isnan] = nan_to_zero(r, pv->inputs[0]);
    const ir::ValueId probs = where ? where->inputs[2] : pv->inputs[0];
    ir::Node* softmax = r.producer(probs, "Softmax");
    if (!softmax || !(where || r.single_use(probs)) || softmax->opset < 13) continue;
    const ir::Attribute* axis = softmax->attr("axis");
    if (axis && axis->i != -1 && axis->i != 3) continue;
    ir::ValueId s = softmax->inputs[0];
    if (!r.single_use(s)) continue;
    std::vector<ir::Node*> chain{pv, softmax};
    if (where) chain.insert(chain.end(), {where, isnan});
    ir::ValueId mask = ir::kNoValue;
    double scale = 1.0;
    ir::Node* n = r.producer(s);
    // Optional additive mask: the operand produced by the scores chain is the scores.
    if (n && is(*n, "Add") && n->inputs.size() == 2) {
      const bool first = r.producer(n->inputs[0], "MatMul") || r.producer(n->inputs[0], "Mul") ||
                         r.producer(n->inputs[0], "Div");
      const ir::ValueId scores = first ? n->inputs[0] : n->inputs[1];
      mask = first ? n->inputs[1] : n->inputs[0];
      const int64_t mr = r.rank(mask);
      if (mr < 1 || mr > 4 || !r.single_use(scores)) continue;  // Attention's mask ranks
      chain.push_back(n);
      s = scores;
      n = r.producer(s);
    }
    if (n && (is(*n, "Mul") || is(*n, "Div")) && n->inputs.size() == 2) {
      const bool mul = is(*n, "Mul");
      std::optional<double> c = r.scalar(n->inputs[1]);
      ir::ValueId scores = n->inputs[0];
      if (!c && mul) {
        c = r.scalar(n->inputs[0]);
        scores = n->inputs[1];
      }
      if (!c || *c == 0.0 || !r.single_use(scores)) continue;
      scale = mul ? *c : 1.0 / *c;
      chain.push_back(n);
      s = scores;
      n = r.producer(s);
    }
    if (!n || !is(*n, "MatMul") || !r.single_use(s)) continue;
    ir::Node* qk = n;
    chain.push_back(qk);
    ir::ValueId q = qk->inputs[0], kt = qk->inputs[1];
    const ir::ValueId v = pv->inputs[1];
    // Scales on the operands instead (Q * s and K^T * s, as BERT exports write the
    // 1/sqrt(head size) split between them): into the one scale.
    bool bad_operand_scale = false;
    for (ir::ValueId* operand : {&q, &kt}) {
      ir::Node* m = r.producer(*operand);
      if (!m || !is(*m, "Mul") || m->inputs.size() != 2 || !r.single_use(*operand)) continue;
      const std::optional<double> c1 = scalar_factor(r, m->inputs[1], m->inputs[0]);
      const std::optional<double> c0 =
          c1 ? std::nullopt : scalar_factor(r, m->inputs[0], m->inputs[1]);
      if (!c1 && !c0) continue;
      const ir::ValueId x = c1 ? m->inputs[0] : m->inputs[1];
      const double c = c1 ? *c1 : *c0;
      if (c == 0.0 || r.rank(x) != 4) {
        bad_operand_scale = true;
        break;
      }
      scale *= c;
      chain.push_back(m);
      *operand = x;
    }
    if (bad_operand_scale) continue;
    // Attention reads a mask shorter than the keys as masking the keys past it: a mask that
    // broadcasts along the keys (last axis 1) means something else.
    if (mask != ir::kNoValue && r.last_dim(mask) == 1 && r.last_dim(kt) != 1) continue;
    if (r.rank(q) != 4 || r.rank(kt) != 4 || r.rank(v) != 4) continue;
    // K = K^T with its last two axes swapped back.
    const ir::ValueId k = r.new_value(r.graph().value(kt).name + "/untransposed");
    ir::Node transpose;
    transpose.name = qk->name + "/k";
    transpose.op_type = "Transpose";
    transpose.opset = 13;
    ir::Attribute perm;
    perm.name = "perm";
    perm.kind = ir::AttrKind::Ints;
    perm.ints = {0, 1, 3, 2};
    transpose.attributes = {perm};
    transpose.inputs = {kt};
    transpose.outputs = {k};
    ir::Node attention;
    attention.name = pv->name.empty() ? "attention" : pv->name + "/attention";
    attention.op_type = "Attention";
    attention.opset = 23;
    attention.inputs = {q, k, v};
    if (mask != ir::kNoValue) attention.inputs.push_back(mask);
    ir::Attribute sc;
    sc.name = "scale";
    sc.kind = ir::AttrKind::Float;
    sc.f = static_cast<float>(scale);
    attention.attributes = {sc};
    attention.outputs = {pv->outputs[0]};
    for (ir::Node* d : chain) r.remove(d);
    r.add(std::move(transpose));
    r.add(std::move(attention));
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion
