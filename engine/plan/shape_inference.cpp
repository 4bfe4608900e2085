#include "engine/plan/shape_inference.h"

#include <utility>

#include "ops/kernel.h"

namespace kiln::plan {

namespace {

InferredValue declared(const ir::ValueInfo& info) {
  InferredValue v;
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

ShapeRule shape_rule(const ir::Node& node) {
  const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset);
  return reg ? reg->shape : nullptr;
}

}  // namespace

bool shape_inference_covers(const ir::Node& node) {
  return node.graph_attributes().empty() && shape_rule(node) != nullptr;
}

ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<InferredValue>& inputs) {
  ShapeInference r;
  r.values.assign(graph.values.size(), InferredValue{});
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const ir::ValueInfo& info = graph.value(graph.inputs[i]);
    InferredValue v = i < inputs.size() && inputs[i].known ? inputs[i]
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
    } else if (!node.graph_attributes().empty()) {
      why = "has nested graphs";
    } else {
      ops::ShapeContext c(graph, node, r.values);
      try {
        rule(c);
        for (size_t i = 0; i < node.outputs.size() && why.empty(); ++i) {
          if (c.has_out(i) && !r.values[static_cast<size_t>(node.outputs[i])].known)
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
        if (id != ir::kNoValue) r.values[static_cast<size_t>(id)] = InferredValue{};
      if (r.first_unknown.empty()) r.first_unknown = node.label() + ": " + why;
    }
  }
  return r;
}

}  // namespace kiln::plan
