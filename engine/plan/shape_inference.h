// Static shape inference: the element type and shape of every value of a graph from the
// shapes of its inputs, before any kernel runs, by each op's shape rule (its contract,
// ops/contract.h). Small integer tensors computed from shapes (Shape -> Gather -> Concat ->
// Reshape, as exporters write them) carry their values too, so the shapes they define are
// known. A value is unknown when its op has no shape rule, or depends on data that is not
// known before the run. Never throws for a bad graph: the kernels report those when run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/tensor.h"
#include "ops/contract.h"

namespace kiln::plan {

constexpr int64_t kMaxInferredData = ops::kMaxKnownData;

struct ShapeInference {
  std::vector<ops::ValueFacts> values;  // per ir::ValueId of the graph
  // The first node (in `order`) whose outputs could not be inferred, as "node 'n' (Op):
  // reason"; empty when every node output is known.
  std::string first_unknown;
};

// Infers the values of `graph`, visiting nodes in `order` (a topological order). `inputs`
// gives graph.inputs in order (an unknown entry takes the input's declared fixed shape, or
// its default value). Initializers are known from their data (or a hollow constant's
// declared shape). Nested graphs are inferred where their op's rule asks (If, Loop, Scan).
ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<ops::ValueFacts>& inputs);
// The same for one run of a nested graph: `captured` gives graph.captures in order.
ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<ops::ValueFacts>& inputs,
                            const std::vector<ops::ValueFacts>& captured);

// What `node`'s shape rule says of its outputs given `values` (per ir::ValueId of `graph`: the
// facts of the node's inputs and of the enclosing values its nested graphs read); entries are
// unknown where the rule cannot tell (or the op has none). The executor's contract check
// (KILN_CHECK_CONTRACTS) compares them with what the kernel produced. Throws what the rule
// throws for inputs it rejects.
std::vector<ops::ValueFacts> infer_node(const ir::Graph& graph, const ir::Node& node,
                                        std::vector<ops::ValueFacts>& values);

// Whether `node`'s op has a shape rule (its outputs may still be unknown when they depend
// on data known only when run).
bool shape_inference_covers(const ir::Node& node);

// The facts of `t` (data kept for small integer / bool tensors).
inline ops::ValueFacts inferred_from(const Tensor& t) {
  return ops::facts_of(t);
}

}  // namespace kiln::plan
