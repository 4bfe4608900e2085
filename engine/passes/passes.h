// Graph-to-graph transformations applied after loading and before planning.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "engine/ir/graph.h"
#include "kiln/session.h"

namespace kiln::passes {

// Turns every Constant node (in all nested graphs) into an initializer, so that kernels
// see its value at plan time and nothing runs for it. Returns how many were folded.
int fold_constant_nodes(ir::Graph& graph);

struct FoldStats {
  int nodes = 0;       // nodes evaluated at load and removed
  uint64_t bytes = 0;  // bytes of the initializers they became
};

// Runs, once, every node (in all nested graphs) whose inputs are all constants (initializers
// of its graph or of an enclosing one) with its own kernel, and turns its outputs into
// initializers; initializers read only by folded nodes are dropped. Left alone: random ops,
// nodes with nested graphs or without inputs, nodes producing graph outputs, nodes whose
// outputs come to more than `max_bytes` (default 1 GiB: folding must not turn a small model
// into a huge resident one; a session with a memory limit passes that, so a hostile size fails
// at run time with the limit's error instead of being allocated at load), and any node whose
// kernel fails (it fails again, with its message, at run time). `keep` (optional) receives
// each folded tensor and returns the one to store (the session shares equal ones between
// sessions through the weights cache).
inline constexpr uint64_t kMaxFoldedBytes = uint64_t{1} << 30;
FoldStats fold_constants(ir::Graph& graph, const std::function<Tensor(Tensor)>& keep = {},
                         uint64_t max_bytes = kMaxFoldedBytes);

// Shape-aware folding of the graph and then of each nested graph, which sees what the
// enclosing one found of the values it captures (fold_constants runs it): shapes are tracked with
// the dimensions the graph fixes (declared input dimensions, constants, op rules) and the
// others unknown, with the elements of small integer tensors computed from them (Shape,
// Gather, Slice, Concat, Unsqueeze, Cast, integer Add/Sub/Mul, ...). An integer output
// whose every element is known becomes an initializer; nodes left without readers are
// removed. A dimension that is symbolic or unknown is never assumed.
FoldStats fold_static_shapes(ir::Graph& graph, const std::function<Tensor(Tensor)>& keep = {});

// Removes the nodes of `g` marked in `removed` (one flag per node) and renumbers the producers
// of the values the others make.
void remove_nodes(ir::Graph& g, const std::vector<bool>& removed);

// Forgets the initializers of `g` that no node, nested graph or graph output reads (their
// storage goes when nothing else holds it).
void drop_unused_initializers(ir::Graph& g);

struct OptimizeStats {
  int identities_removed = 0;  // Identity, inference Dropout, x*1, x/1, x+0, x-0, same-type Cast
  // fusions made (GELU, SiLU, LayerNorm, skip LayerNorm, MatMul + bias [+ activation],
  // attention, scales and transposes into products, Conv + ...)
  int fused = 0;
};

// The graph rewrites of engine/passes/fusion/ (their order: fusion/pipeline.cpp), on every
// nested graph too: at Basic the identity eliminations, at All also the fusions. Results change
// by float rounding at most.
OptimizeStats optimize(ir::Graph& graph, GraphOptimization level);

}  // namespace kiln::passes
