// A Plan is everything decided before data arrives: the order nodes run in, how many
// times each value is read (so the executor can free it, or let its last reader write
// into it), and one kernel per node created from its attributes.
#pragma once

#include <memory>
#include <vector>

#include "engine/ir/graph.h"
#include "ops/kernel.h"

namespace kiln::plan {

struct GraphPlan;

struct Step {
  int32_t node_index = -1;
  const ir::Node* node = nullptr;
  const ops::OpRegistration* op = nullptr;
  std::unique_ptr<ops::Kernel> kernel;
  // One plan per graph attribute of the node, in ir::Node::graph_attributes() order.
  std::vector<std::unique_ptr<GraphPlan>> subgraphs;
  // Per subgraph: for each of its captures, the position in node->implicit_inputs.
  std::vector<std::vector<int32_t>> capture_slots;
};

struct GraphPlan {
  const ir::Graph* graph = nullptr;
  std::vector<Step> steps;
  // Per value: reads by nodes (explicit and implicit inputs) plus appearances among the
  // graph's outputs. A value is freed when its count reaches zero.
  std::vector<int32_t> use_counts;
  // This plan's position among the plans of one tree (the root is 0, nested plans follow):
  // the executor keeps each graph's frame buffers under it between runs.
  int32_t index = 0;
  // The root graph's values as inferred at load from its declared inputs, a symbolic leading
  // dimension taken as 1 (NodeInfo::input_shape_hint); empty for nested graphs.
  std::vector<ops::ValueFacts> shape_hints;
};

// Orders the graph and creates its kernels (recursively for nested graphs). Throws
// kiln::Error naming the node for unsupported ops or invalid attributes.
// Kernels ask `preparer` (may be null) for prepared forms of their constant inputs.
std::unique_ptr<GraphPlan> build_plan(const ir::Graph& graph,
                                      ops::WeightPreparer* preparer = nullptr);

// Checks every node's input and output counts (nested graphs too) against its op's
// registration, so that the load-time passes may read the inputs and outputs an op always
// has. A node whose op kiln does not implement at its opset is checked against the loosest
// bounds of the op's other registrations, if any (build_plan reports it as unsupported).
// Throws kiln::Error (InvalidModel) naming the node.
void check_arities(const ir::Graph& graph);

// The execution order alone: a topological order in which, among the nodes ready to run,
// those that never write into their inputs go first. A value read by both Shape and an
// in-place Concat thus reaches Concat with one use left, whatever the order in the file.
std::vector<int32_t> execution_order(const ir::Graph& graph);

}  // namespace kiln::plan
