#include "ops/core/inference.h"

#include <utility>

#include "ops/core/kernel.h"

namespace kiln::ops {
namespace {

using ShapeRule = void (*)(ShapeContext&);

ShapeRule shape_rule(const ir::Node& node) {
  const OpRegistration* reg = find_op(node.domain, node.op_type, node.opset);
  return reg ? reg->shape : nullptr;
}

// Nested graphs (If branches, Loop and Scan bodies) inferred like the main graph, their
// captured values known from the enclosing graph's facts.
class Nested final : public NestedInference {
 public:
  explicit Nested(InferenceOptions options) : options_(options) {}

  std::vector<ValueFacts> outputs(const ir::Graph& graph, const std::vector<ValueFacts>& inputs,
                                  const ir::Graph& enclosing,
                                  const std::vector<ValueFacts>& enclosing_values) override {
    std::vector<ValueFacts> captured;
    for (ir::ValueId id : graph.captures) {
      const ir::ValueId outer = enclosing.find(graph.value(id).name);
      captured.push_back(outer == ir::kNoValue ? ValueFacts{}
                                               : enclosing_values[static_cast<size_t>(outer)]);
    }
    const GraphFacts r =
        infer_graph(graph, ir::topological_order(graph), inputs, captured, options_);
    std::vector<ValueFacts> outs;
    for (ir::ValueId id : graph.outputs) outs.push_back(r.values[static_cast<size_t>(id)]);
    return outs;
  }

 private:
  InferenceOptions options_;
};

// Runs `rule` for `node` into `values`, nested graphs inferred; throws what the rule throws.
void apply(ShapeRule rule, const ir::Graph& graph, const ir::Node& node,
           std::vector<ValueFacts>& values, InferenceOptions options) {
  ShapeContext c(graph, node, values);
  Nested nested(options);
  c.set_nested(&nested);
  rule(c);
}

// What an enclosing graph knows of a value `graph` captures: its constant, else its type.
ValueFacts captured_declared(const ir::Graph& graph, const ir::ValueInfo& v) {
  for (const ir::Graph* outer = graph.parent; outer; outer = outer->parent) {
    const ir::ValueId id = outer->find(v.name);
    if (id == ir::kNoValue) continue;
    const ir::ValueInfo& o = outer->value(id);
    if (o.origin == ir::ValueOrigin::Capture) continue;  // defined further out
    if (o.origin == ir::ValueOrigin::Initializer && !o.hollow && o.constant.defined())
      return facts_of(o.constant);
    return facts_of(o.type.kind != Value::Kind::None ? o.type : v.type);
  }
  return facts_of(v.type);
}

}  // namespace

std::string infer_node_facts(const ir::Graph& graph, const ir::Node& node,
                             std::vector<ValueFacts>& values, InferenceOptions options) {
  std::string why;
  if (const ShapeRule rule = shape_rule(node)) {
    try {
      apply(rule, graph, node, values, options);
    } catch (const UnknownFacts& u) {
      why = u.why;
    } catch (const std::exception& e) {
      why = e.what();
    }
  } else {
    why = "its op has no shape rule";
  }
  if (!why.empty()) {
    for (ir::ValueId id : node.outputs)
      if (id != ir::kNoValue) values[static_cast<size_t>(id)] = ValueFacts{};
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ir::ValueId id = node.outputs[i];
    if (id == ir::kNoValue) continue;
    ValueFacts& v = values[static_cast<size_t>(id)];
    if (options.trust_declared) merge_declared(v, facts_of(graph.value(id).type));
    if (!v.known && why.empty()) why = "output " + std::to_string(i) + " not inferred";
  }
  return why;
}

GraphFacts infer_graph(const ir::Graph& graph, const std::vector<int32_t>& order,
                       const std::vector<ValueFacts>& inputs,
                       const std::vector<ValueFacts>& captured, InferenceOptions options) {
  GraphFacts r;
  r.values.assign(graph.values.size(), ValueFacts{});
  for (size_t k = 0; k < graph.captures.size() && k < captured.size(); ++k)
    r.values[static_cast<size_t>(graph.captures[k])] = captured[k];
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const ir::ValueInfo& info = graph.value(graph.inputs[i]);
    ValueFacts v = i < inputs.size() && inputs[i].known ? inputs[i]
                   : info.constant.defined()            ? facts_of(info.constant)
                   : i < inputs.size()                  ? inputs[i]
                                                        : ValueFacts{};
    if (!v.known) merge_declared(v, facts_of(info.type));
    r.values[static_cast<size_t>(graph.inputs[i])] = std::move(v);
  }
  for (ir::ValueId id : graph.initializers) {
    const ir::ValueInfo& info = graph.value(id);
    r.values[static_cast<size_t>(id)] =
        info.constant.defined() ? facts_of(info.constant) : facts_of(info.type);
  }
  for (int32_t index : order) {
    const ir::Node& node = graph.nodes[static_cast<size_t>(index)];
    const std::string why = infer_node_facts(graph, node, r.values, options);
    if (!why.empty() && r.first_unknown.empty()) r.first_unknown = node.label() + ": " + why;
  }
  return r;
}

GraphFacts infer_declared(const ir::Graph& graph) {
  std::vector<ValueFacts> captured;
  for (ir::ValueId id : graph.captures)
    captured.push_back(captured_declared(graph, graph.value(id)));
  return infer_graph(graph, ir::topological_order(graph), {}, captured,
                     InferenceOptions{.trust_declared = true});
}

std::vector<ValueFacts> infer_node(const ir::Graph& graph, const ir::Node& node,
                                   std::vector<ValueFacts>& values, InferenceOptions options) {
  std::vector<ValueFacts> outs(node.outputs.size());
  const ShapeRule rule = shape_rule(node);
  if (!rule) return outs;
  try {
    apply(rule, graph, node, values, options);
  } catch (const UnknownFacts&) {
    return outs;
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.outputs[i] != ir::kNoValue) outs[i] = values[static_cast<size_t>(node.outputs[i])];
  }
  return outs;
}

bool has_shape_rule(const ir::Node& node) {
  return shape_rule(node) != nullptr;
}

}  // namespace kiln::ops
