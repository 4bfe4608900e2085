// Graph-to-graph transformations applied after loading and before planning.
#pragma once

#include <optional>

#include "engine/ir/graph.h"

namespace kiln::passes {

// The tensor a Constant node produces (value, value_float(s), value_int(s),
// value_string(s), sparse_value), or nullopt when it has none of them.
std::optional<Tensor> constant_node_value(const ir::Node& node);

// Turns every Constant node (in all nested graphs) into an initializer, so that kernels
// see its value at plan time and nothing runs for it. Returns how many were folded.
int fold_constant_nodes(ir::Graph& graph);

}  // namespace kiln::passes
