// A Plan is everything decided before data arrives: the order nodes run in, how many
// times each value is read (so the executor can free it, or let its last reader write
// into it), and one kernel per node created from its attributes.
#pragma once

#include <memory>
#include <vector>

#include "engine/ir/graph.h"
#include "ops/core/kernel.h"

namespace kiln::plan {

struct GraphPlan;

// A Concat whose inputs are written where the output will hold them (the root graph, batch 1):
// its output is requested as one buffer when the first of the group's producers starts, each
// producer's output is a view of its window, and the Concat finds its inputs in place. Nested
// Concats whose outputs are windows of an outer one join its group (DenseNet's chains), so a
// block of concatenations copies nothing. Formed from the shapes inferred at load
// (GraphPlan::shape_hints); a run applies them when its inputs have those shapes.
// The steps that request and let go of a group's buffer list it in Step::groups_begin and
// Step::groups_end.
struct ConcatGroup {
  int32_t first_step = 0;  // position in GraphPlan::steps: the buffer is requested as it starts
  DataType dtype = DataType::Float;
  int64_t elements = 0;
};

// Output `output` of a step is the window of group `group` at `byte_offset`, when it is
// allocated (OpContext::output) with `dtype` and `shape`.
struct OutputSlot {
  int32_t output = 0;
  int32_t group = 0;
  uint64_t byte_offset = 0;
  DataType dtype = DataType::Float;
  Shape shape;
};

struct Step {
  int32_t node_index = -1;
  const ir::Node* node = nullptr;
  const ops::OpRegistration* op = nullptr;
  std::unique_ptr<ops::Kernel> kernel;
  // One plan per graph attribute of the node, in ir::Node::graph_attributes() order.
  std::vector<std::unique_ptr<GraphPlan>> subgraphs;
  // Per subgraph: for each of its captures, the position in node->implicit_inputs.
  std::vector<std::vector<int32_t>> capture_slots;
  // Concat groups (ConcatGroup): this step's outputs that are windows of a group, the groups
  // whose buffer is requested as it starts, and those let go when it ends.
  std::vector<OutputSlot> slots;
  std::vector<int32_t> groups_begin, groups_end;
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
  // The root graph's Concat groups (empty for nested graphs).
  std::vector<ConcatGroup> concat_groups;
};

// Step `step`'s window for output `o` when the plan keeps one for it and it is allocated with
// `dtype` and `shape` (the executor's OpContext::output and the arena's prediction), else null.
const OutputSlot* output_slot(const Step& step, size_t o, DataType dtype, const Shape& shape);

// Whether a run whose graph input `i` has `dtype` and `shape` keeps to the shapes the plan's
// Concat groups were formed for (an input without a hint keeps to them).
bool matches_hint(const GraphPlan& plan, size_t i, DataType dtype, const Shape& shape);

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
