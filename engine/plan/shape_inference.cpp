#include "engine/plan/shape_inference.h"

#include <utility>

#include "ops/kernel.h"

namespace kiln::plan {

namespace {

ops::ValueFacts declared(const ir::ValueInfo& info) {
  ops::ValueFacts v;
  const ir::TypeInfo& type = info.type;
  if (type.kind != Value::Kind::Tensor || !type.shape || type.elem == DataType::Undefined) return v;
  for (const ir::Dim& d : *type.shape) {
    if (d.value < 0) return v;
    v.shape.push_back(d.value);
  }
  v.known = true;
  v.dtype = type.elem;
  return v;
}

using ShapeRule = void (*)(ops::ShapeContext&);

ShapeInference infer(const ir::Graph& graph, const std::vector<int32_t>& order,
                     const std::vector<ops::ValueFacts>& inputs,
                     const std::vector<ops::ValueFacts>& captured);

// Nested graphs (If branches, Loop and Scan bodies) inferred like the main graph, their captured
// values known from the enclosing graph's facts.
class Nested final : public ops::NestedInference {
 public:
  std::vector<ops::ValueFacts> outputs(
      const ir::Graph& graph, const std::vector<ops::ValueFacts>& inputs,
      const ir::Graph& enclosing, const std::vector<ops::ValueFacts>& enclosing_values) override {
    std::vector<ops::ValueFacts> captured;
    for (ir::ValueId id : graph.captures) {
      const ir::ValueId outer = enclosing.find(graph.value(id).name);
      captured.push_back(outer == ir::kNoValue ? ops::ValueFacts{}
                                               : enclosing_values[static_cast<size_t>(outer)]);
    }
    const ShapeInference r = infer(graph, ir::topological_order(graph), inputs, captured);
    std::vector<ops::ValueFacts> outs;
    for (ir::ValueId id : graph.outputs) outs.push_back(r.values[static_cast<size_t>(id)]);
    return outs;
  }
};

ShapeRule shape_rule(const ir::Node& node) {
  const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset);
  return reg ? reg->shape : nullptr;
}

ShapeInference infer(const ir::Graph& graph, const std::vector<int32_t>& order,
                     const std::vector<ops::ValueFacts>& inputs,
                     const std::vector<ops::ValueFacts>& captured) {
  ShapeInference r;
  r.values.assign(graph.values.size(), ops::ValueFacts{});
  for (size_t k = 0; k < graph.captures.size() && k < captured.size(); ++k)
    r.values[static_cast<size_t>(graph.captures[k])] = captured[k];
  Nested nested;
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const ir::ValueInfo& info = graph.value(graph.inputs[i]);
    ops::ValueFacts v = i < inputs.size() && inputs[i].known ? inputs[i]
                        : info.constant.defined()            ? inferred_from(info.constant)
                                                             : declared(info);
    r.values[static_cast<size_t>(graph.inputs[i])] = std::move(v);
  }
  for (ir::ValueId id : graph.initializers) {
    const ir::ValueInfo& info = graph.value(id);
    r.values[static_cast<size_t>(id)] =
        info.constant.defined() ? inferred_from(info.constant) : declared(info);
  }
  for (int32_t index : order) {
    const ir::Node& node = graph.nodes[static_cast<size_t>(index)];
    std::string why;
    const ShapeRule rule = shape_rule(node);
    if (!rule) {
      why = "its op has no shape rule";
    } else {
      ops::ShapeContext c(graph, node, r.values);
      c.set_nested(&nested);
      try {
        rule(c);
        for (size_t i = 0; i < node.outputs.size() && why.empty(); ++i) {
          if (c.has_output(i) && !r.values[static_cast<size_t>(node.outputs[i])].known)
            why = "output " + std::to_string(i) + " not inferred";
        }
      } catch (const ops::UnknownFacts& u) {
        why = u.why;
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      for (ir::ValueId id : node.outputs)
        if (id != ir::kNoValue) r.values[static_cast<size_t>(id)] = ops::ValueFacts{};
      if (r.first_unknown.empty()) r.first_unknown = node.label() + ": " + why;
    }
  }
  return r;
}

}  // namespace

std::vector<ops::ValueFacts> infer_node(const ir::Graph& graph, const ir::Node& node,
                                        std::vector<ops::ValueFacts>& values) {
  std::vector<ops::ValueFacts> outs(node.outputs.size());
  const ShapeRule rule = shape_rule(node);
  if (!rule) return outs;
  ops::ShapeContext c(graph, node, values);
  Nested nested;
  c.set_nested(&nested);
  try {
    rule(c);
  } catch (const ops::UnknownFacts&) {
    return outs;
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.outputs[i] != ir::kNoValue) outs[i] = values[static_cast<size_t>(node.outputs[i])];
  }
  return outs;
}

bool shape_inference_covers(const ir::Node& node) {
  return shape_rule(node) != nullptr;
}

ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<ops::ValueFacts>& inputs) {
  return infer(graph, order, inputs, {});
}

ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<ops::ValueFacts>& inputs,
                            const std::vector<ops::ValueFacts>& captured) {
  return infer(graph, order, inputs, captured);
}

}  // namespace kiln::plan
