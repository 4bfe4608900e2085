#include "engine/passes/fusion/rewriter.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "engine/passes/passes.h"
#include "ops/core/inference.h"

namespace kiln::passes::fusion {

Rewriter::Rewriter(ir::Graph& g) : g_(g), removed_(g.nodes.size(), false) {
  reindex();
  facts_ = ops::infer_declared(g).values;
  facts_done_.assign(facts_.size(), true);
}

ir::Node* Rewriter::producer(ir::ValueId v) {
  if (v == ir::kNoValue) return nullptr;
  const ir::ValueInfo& info = g_.value(v);
  if (info.origin != ir::ValueOrigin::NodeOutput || info.producer < 0) return nullptr;
  const auto p = static_cast<size_t>(info.producer);
  return p < g_.nodes.size() && !removed_[p] ? &g_.nodes[p] : nullptr;
}

ir::Node* Rewriter::producer(ir::ValueId v, const char* op) {
  ir::Node* n = producer(v);
  return n && n->domain.empty() && n->op_type == op ? n : nullptr;
}

const Tensor* Rewriter::constant(ir::ValueId v) const {
  if (v == ir::kNoValue) return nullptr;
  const ir::Graph* graph = &g_;
  const ir::ValueInfo* info = &graph->value(v);
  while (info->origin == ir::ValueOrigin::Capture && graph->parent) {
    graph = graph->parent;
    const ir::ValueId outer = graph->find(info->name);
    if (outer == ir::kNoValue) return nullptr;
    info = &graph->value(outer);
  }
  if (info->origin != ir::ValueOrigin::Initializer || !info->constant.defined()) return nullptr;
  return &info->constant;
}

std::optional<double> Rewriter::scalar(ir::ValueId v) const {
  const Tensor* t = constant(v);
  if (!t || t->numel() != 1) return std::nullopt;
  if (t->dtype() == DataType::Float) return t->contiguous().data<const float>()[0];
  if (t->dtype() == DataType::Double) return t->contiguous().data<const double>()[0];
  return std::nullopt;
}

const ops::ValueFacts& Rewriter::facts(ir::ValueId v) {
  static const ops::ValueFacts none;
  if (v == ir::kNoValue) return none;
  const auto id = static_cast<size_t>(v);
  if (facts_.size() < g_.values.size()) {
    facts_.resize(g_.values.size());
    facts_done_.resize(g_.values.size(), false);
  }
  if (facts_done_[id]) return facts_[id];
  facts_done_[id] = true;  // a cycle (a malformed graph) finds it unknown
  const ir::ValueInfo& info = g_.value(v);
  if (const Tensor* t = constant(v)) {
    facts_[id] = ops::facts_of(*t);
  } else if (ir::Node* p = producer(v)) {
    for (ir::ValueId in : p->inputs) facts(in);
    ops::infer_node_facts(g_, *p, facts_, ops::InferenceOptions{.trust_declared = true});
    for (ir::ValueId out : p->outputs)
      if (out != ir::kNoValue) facts_done_[static_cast<size_t>(out)] = true;
  } else {
    facts_[id] = ops::facts_of(info.type);
  }
  return facts_[id];
}

std::vector<ir::Node*> Rewriter::readers(ir::ValueId v) {
  std::vector<ir::Node*> out;
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (removed_[n]) continue;
    ir::Node& node = g_.nodes[n];
    if (std::find(node.inputs.begin(), node.inputs.end(), v) != node.inputs.end()) {
      out.push_back(&node);
    }
  }
  return out;
}

ir::Node* Rewriter::sole_reader(ir::ValueId v) {
  if (!single_use(v)) return nullptr;
  const std::vector<ir::Node*> r = readers(v);
  return r.size() == 1 ? r[0] : nullptr;
}

void Rewriter::replace_uses(ir::ValueId from, ir::ValueId to) {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (removed_[n]) continue;
    for (ir::ValueId& id : g_.nodes[n].inputs) {
      if (id == from) id = to;
    }
  }
  reindex();
}

void Rewriter::remove(ir::Node* n) {
  const auto index = static_cast<size_t>(n - g_.nodes.data());
  removed_[index] = true;
  reindex();
}

ir::Node& Rewriter::add(ir::Node node) {
  const auto index = static_cast<int32_t>(g_.nodes.size());
  for (ir::ValueId id : node.outputs) {
    if (id == ir::kNoValue) continue;
    ir::ValueInfo& v = g_.value(id);
    v.origin = ir::ValueOrigin::NodeOutput;
    v.producer = index;
    // A value new to this rewrite is inferred from its producer when asked; one that existed
    // keeps its facts (the rewrite keeps its meaning).
    if (static_cast<size_t>(id) >= facts_.size()) continue;
    if (!facts_[static_cast<size_t>(id)].ranked &&
        facts_[static_cast<size_t>(id)].dtype == DataType::Undefined) {
      facts_done_[static_cast<size_t>(id)] = false;
    }
  }
  g_.nodes.push_back(std::move(node));
  removed_.push_back(false);
  reindex();
  return g_.nodes.back();
}

ir::ValueId Rewriter::new_constant(const std::string& hint, Tensor t) {
  const ir::ValueId id = new_value(hint);
  ir::ValueInfo& v = g_.value(id);
  v.origin = ir::ValueOrigin::Initializer;
  v.type = ir::tensor_type(t.dtype(), t.shape());
  t.storage()->set_read_only();
  v.constant = std::move(t);
  g_.initializers.push_back(id);
  reindex();
  return id;
}

ir::ValueId Rewriter::new_value(const std::string& hint) {
  std::string name = hint;
  for (int i = 1; g_.find(name) != ir::kNoValue; ++i) name = hint + "_" + std::to_string(i);
  return g_.add_value(name, ir::ValueOrigin::NodeOutput);
}

void Rewriter::commit() {
  remove_nodes(g_, removed_);
  removed_.assign(g_.nodes.size(), false);
  reindex();
}

void Rewriter::reindex() {
  readers_.assign(g_.values.size(), 0);
  pinned_.assign(g_.values.size(), false);
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (removed_[n]) continue;
    for (ir::ValueId id : g_.nodes[n].inputs) {
      if (id != ir::kNoValue) ++readers_[static_cast<size_t>(id)];
    }
    for (ir::ValueId id : g_.nodes[n].implicit_inputs) pinned_[static_cast<size_t>(id)] = true;
  }
  for (ir::ValueId id : g_.outputs) pinned_[static_cast<size_t>(id)] = true;
}

// The one node reading `v`, when it is a two-input `op`; else null.
ir::Node* binary_reader(Rewriter& r, ir::ValueId v, const char* op) {
  ir::Node* n = r.sole_reader(v);
  return n && is(*n, op) && n->inputs.size() == 2 ? n : nullptr;
}

// A float scalar constant that cannot broadcast `other` to a larger rank: its value, else
// nullopt.
std::optional<double> scalar_factor(Rewriter& r, ir::ValueId c, ir::ValueId other) {
  const Tensor* t = r.constant(c);
  const auto v = r.scalar(c);
  if (!t || !v || t->dtype() != DataType::Float || !std::isfinite(*v)) return std::nullopt;
  if (t->rank() > 0 && r.rank(other) < static_cast<int64_t>(t->rank())) return std::nullopt;
  return v;
}

}  // namespace kiln::passes::fusion
