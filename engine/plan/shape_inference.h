// Static shape inference: the element type and shape of every value of a graph from the
// shapes of its inputs, before any kernel runs. Small integer tensors computed from shapes
// (Shape -> Gather -> Concat -> Reshape, as exporters write them) carry their values too,
// so the shapes they define are known. Covers the common ops of CNNs and transformer
// encoders; a value is unknown when its op is not covered, or depends on data that is not
// known before the run. Never throws for a bad graph: the kernels report those when run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/tensor.h"

namespace kiln::plan {

struct InferredValue {
  bool known = false;
  DataType dtype = DataType::Undefined;
  Shape shape;
  // The values of an integer or bool tensor of at most kMaxInferredData elements, when
  // they follow from constants and shapes (bool as 0/1).
  bool has_data = false;
  std::vector<int64_t> data;
};

constexpr int64_t kMaxInferredData = 64;

struct ShapeInference {
  std::vector<InferredValue> values;  // per ir::ValueId of the graph
  // The first node (in `order`) whose outputs could not be inferred, as "node 'n' (Op):
  // reason"; empty when every node output is known.
  std::string first_unknown;
};

// Infers the values of `graph`, visiting nodes in `order` (a topological order). `inputs`
// gives graph.inputs in order (an unknown entry takes the input's declared fixed shape, or
// its default value). Initializers are known from their data (or a hollow constant's
// declared shape). Nodes with nested graphs are not covered.
ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<InferredValue>& inputs);

// Whether infer_shapes has a rule for `node`'s op (its outputs may still be unknown when
// they depend on data known only when run).
bool shape_inference_covers(const ir::Node& node);

// The value of `t` as an InferredValue (data kept for small integer / bool tensors).
InferredValue inferred_from(const Tensor& t);

}  // namespace kiln::plan
