// Static shape inference for the planner: the element type and shape of every value of a
// graph from the shapes of a run's inputs, before any kernel runs, by each op's shape rule (its
// contract, ops/core/contract.h). Small integer tensors computed from shapes (Shape -> Gather ->
// Concat -> Reshape, as exporters write them) carry their values too, so the shapes they define are
// known. A value is unknown when its op has no shape rule, or depends on data that is not
// known before the run. Never throws for a bad graph: the kernels report those when run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/tensor.h"
#include "ops/core/contract.h"
#include "ops/core/inference.h"

namespace kiln::plan {

// The facts of every value of a graph (ops/core/inference.h).
using ShapeInference = ops::GraphFacts;

// Infers the values of `graph`, visiting nodes in `order` (a topological order). `inputs`
// gives graph.inputs in order (an entry not known in full takes the input's default value or
// its declared type). Initializers are known from their data (or a hollow constant's
// declared shape). Nested graphs are inferred where their op's rule asks (If, Loop, Scan).
inline ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                                   const std::vector<ops::ValueFacts>& inputs) {
  return ops::infer_graph(graph, order, inputs, {});
}
// The same for one run of a nested graph: `captured` gives graph.captures in order.
inline ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                                   const std::vector<ops::ValueFacts>& inputs,
                                   const std::vector<ops::ValueFacts>& captured) {
  return ops::infer_graph(graph, order, inputs, captured);
}

// What `node`'s shape rule says of its outputs given `values` (per ir::ValueId of `graph`);
// known in full only where the rule can tell. The executor's contract check
// (KILN_CHECK_CONTRACTS) compares them with what the kernel produced. Throws what the rule
// throws for inputs it rejects.
inline std::vector<ops::ValueFacts> infer_node(const ir::Graph& graph, const ir::Node& node,
                                               std::vector<ops::ValueFacts>& values) {
  return ops::infer_node(graph, node, values);
}

// Whether `node`'s op has a shape rule (its outputs may still be unknown when they depend
// on data known only when run).
inline bool shape_inference_covers(const ir::Node& node) {
  return ops::has_shape_rule(node);
}

// The facts of `t` (data kept for small integer / bool tensors).
inline ops::ValueFacts inferred_from(const Tensor& t) {
  return ops::facts_of(t);
}

}  // namespace kiln::plan
