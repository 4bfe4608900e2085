// Running the shape rules of the op contracts (ops/core/contract.h) over a graph: the facts
// of every value before any kernel runs. The planner runs it on the shapes of a run's inputs
// (engine/plan/shape_inference.h) and needs values known in full; the passes run it on a
// graph as loaded, where batch and sequence are open and what the graph fixes (ranks, hidden
// sizes, channels, element types) is what they read (engine/passes/shape_folding.cpp, the
// fusions' Rewriter).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "ops/core/contract.h"

namespace kiln::ops {

struct GraphFacts {
  std::vector<ValueFacts> values;  // per ir::ValueId of the graph
  // The first node (in the order visited) whose outputs are not known in full, as "node 'n'
  // (Op): reason"; empty when every node output is.
  std::string first_unknown;
};

struct InferenceOptions {
  // Merge what the model declares of a node's outputs (value_info) into what the rules found:
  // the passes' view. The planner trusts only the rules.
  bool trust_declared = false;
};

// The facts of `graph`'s values, visiting nodes in `order` (a topological order). `inputs`
// gives graph.inputs in order (an entry not known in full takes the input's default value,
// else what it says completed by the input's declared type); `captured` gives
// graph.captures in order. Initializers are known from
// their data (a hollow constant from its declared type). Nested graphs are inferred where
// their op's rule asks (If, Loop, Scan). Never throws for a bad graph: the kernels report
// those when run.
GraphFacts infer_graph(const ir::Graph& graph, const std::vector<int32_t>& order,
                       const std::vector<ValueFacts>& inputs,
                       const std::vector<ValueFacts>& captured, InferenceOptions options = {});

// What load time knows of `graph` (the passes' view): inputs as declared, captured values from
// the enclosing graphs' constants and declared types, declared types merged.
GraphFacts infer_declared(const ir::Graph& graph);

// Runs `node`'s shape rule into `values` (per ir::ValueId of `graph`, its inputs' facts
// there): its outputs' facts, emptied when the rule fails, with the declared types merged
// under options.trust_declared. Returns why an output is not known in full (empty when every
// one is); never throws for a bad node.
std::string infer_node_facts(const ir::Graph& graph, const ir::Node& node,
                             std::vector<ValueFacts>& values, InferenceOptions options = {});

// What `node`'s shape rule says of its outputs given `values` (per ir::ValueId of `graph`: the
// facts of the node's inputs and of the enclosing values its nested graphs read), partial
// where the rule can tell only part, empty where it cannot (or the op has no rule). Throws
// what the rule throws for inputs it rejects.
std::vector<ValueFacts> infer_node(const ir::Graph& graph, const ir::Node& node,
                                   std::vector<ValueFacts>& values, InferenceOptions options = {});

// Whether `node`'s op has a shape rule.
bool has_shape_rule(const ir::Node& node);

}  // namespace kiln::ops
