#include "engine/ir/graph.h"

#include <algorithm>
#include <queue>
#include <string>

#include "kiln/error.h"

namespace kiln::ir {

const Attribute* Node::attr(const std::string& attr_name) const {
  for (const Attribute& a : attributes) {
    if (a.name == attr_name) return &a;
  }
  return nullptr;
}

std::vector<const Attribute*> Node::graph_attributes() const {
  std::vector<const Attribute*> out;
  for (const Attribute& a : attributes) {
    if (a.kind == AttrKind::Graph) out.push_back(&a);
  }
  return out;
}

std::string Node::label() const {
  return "node '" + name + "' (" + op_type + ")";
}

ValueId Graph::add_value(std::string value_name, ValueOrigin origin) {
  const auto id = static_cast<ValueId>(values.size());
  ValueInfo info;
  info.name = std::move(value_name);
  info.origin = origin;
  if (!info.name.empty()) by_name_[info.name] = id;
  values.push_back(std::move(info));
  return id;
}

ValueId Graph::find(const std::string& value_name) const {
  auto it = by_name_.find(value_name);
  return it == by_name_.end() ? kNoValue : it->second;
}

namespace {

[[noreturn]] void invalid(const Node& node, const std::string& message) {
  throw Error(ErrorKind::InvalidModel, message).with_node(node.name, node.op_type);
}

// Ops whose nested graphs kiln needs, and the attributes that must hold them.
void check_required_subgraphs(const Node& node) {
  if (!node.domain.empty() && node.domain != "ai.onnx") return;
  std::vector<const char*> required;
  if (node.op_type == "If") required = {"then_branch", "else_branch"};
  if (node.op_type == "Loop" || node.op_type == "Scan") required = {"body"};
  for (const char* name : required) {
    const Attribute* a = node.attr(name);
    if (!a || a->kind != AttrKind::Graph || !a->g) {
      invalid(node, std::string("missing graph attribute '") + name + "'");
    }
  }
}

void validate_graph(const Graph& g) {
  const auto n_values = static_cast<ValueId>(g.values.size());
  auto check_id = [&](const Node& node, ValueId id, const char* what) {
    if (id == kNoValue) return;
    if (id < 0 || id >= n_values) invalid(node, std::string("refers to an undefined ") + what);
  };
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& node = g.nodes[ni];
    for (ValueId id : node.inputs) check_id(node, id, "input value");
    for (ValueId id : node.implicit_inputs) check_id(node, id, "captured value");
    for (ValueId id : node.outputs) {
      check_id(node, id, "output value");
      if (id == kNoValue) continue;
      const ValueInfo& v = g.value(id);
      if (v.origin != ValueOrigin::NodeOutput || v.producer != static_cast<int32_t>(ni)) {
        invalid(node, "output '" + v.name + "' is already defined elsewhere in the graph");
      }
    }
    check_required_subgraphs(node);
    for (const Attribute& a : node.attributes) {
      if (a.kind == AttrKind::Graph && a.g) validate_graph(*a.g);
      for (const auto& sub : a.graphs) {
        if (sub) validate_graph(*sub);
      }
    }
  }
  for (ValueId id : g.outputs) {
    if (id < 0 || id >= n_values) {
      throw Error(ErrorKind::InvalidModel, "graph '" + g.name + "' has an undefined output");
    }
  }
  (void)topological_order(g);
}

}  // namespace

void validate(const Model& model) {
  if (!model.graph) throw Error(ErrorKind::InvalidModel, "model has no graph");
  const Graph& g = *model.graph;
  if (g.outputs.empty()) throw Error(ErrorKind::InvalidModel, "the graph has no outputs");
  for (ValueId id : g.inputs) {
    if (id < 0 || id >= static_cast<ValueId>(g.values.size())) continue;  // validate_graph says
    const ValueInfo& v = g.value(id);
    const bool initializer =
        std::find(g.initializers.begin(), g.initializers.end(), id) != g.initializers.end();
    if (!initializer && v.type.kind == Value::Kind::None) {
      throw Error(ErrorKind::InvalidModel, "graph input '" + v.name + "' has no type");
    }
  }
  validate_graph(g);
}

std::vector<int32_t> topological_order(const Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<std::vector<int32_t>> consumers(n);
  std::vector<int32_t> pending(n, 0);
  for (size_t ni = 0; ni < n; ++ni) {
    const Node& node = g.nodes[ni];
    auto depend = [&](ValueId id) {
      if (id == kNoValue) return;
      const ValueInfo& v = g.value(id);
      if (v.origin != ValueOrigin::NodeOutput || v.producer < 0) return;
      consumers[static_cast<size_t>(v.producer)].push_back(static_cast<int32_t>(ni));
      ++pending[ni];
    };
    for (ValueId id : node.inputs) depend(id);
    for (ValueId id : node.implicit_inputs) depend(id);
  }
  // Kahn's algorithm, always taking the lowest-numbered ready node, so that a graph already
  // in order keeps its order.
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;
  for (size_t ni = 0; ni < n; ++ni) {
    if (pending[ni] == 0) ready.push(static_cast<int32_t>(ni));
  }
  std::vector<int32_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const int32_t ni = ready.top();
    ready.pop();
    order.push_back(ni);
    for (int32_t c : consumers[static_cast<size_t>(ni)]) {
      if (--pending[static_cast<size_t>(c)] == 0) ready.push(c);
    }
  }
  if (order.size() != n) {
    for (size_t ni = 0; ni < n; ++ni) {
      if (pending[ni] > 0) invalid(g.nodes[ni], "is part of a cycle");
    }
  }
  return order;
}

std::optional<Tensor> constant_node_value(const Node& node) {
  for (const Attribute& a : node.attributes) {
    if (a.name == "value" || a.name == "sparse_value") {
      if (a.t.defined()) return a.t;
    } else if (a.name == "value_float") {
      return Tensor::scalar<float>(a.f);
    } else if (a.name == "value_floats") {
      return Tensor::from_vector<float>({static_cast<int64_t>(a.floats.size())}, a.floats);
    } else if (a.name == "value_int") {
      return Tensor::scalar<int64_t>(a.i);
    } else if (a.name == "value_ints") {
      return Tensor::from_vector<int64_t>({static_cast<int64_t>(a.ints.size())}, a.ints);
    } else if (a.name == "value_string") {
      return Tensor::scalar<std::string>(a.s);
    } else if (a.name == "value_strings") {
      return Tensor::from_vector<std::string>({static_cast<int64_t>(a.strings.size())}, a.strings);
    }
  }
  return std::nullopt;
}

}  // namespace kiln::ir
