// The graph-matching helper every fusion works through: the readers of each value, kept up to
// date as the graph is rewritten; producers; constants followed through captures; and what the
// graph tells of a value before it runs (rank, last axis, channels, element type), read from
// the facts the op contracts' shape rules give on the graph as loaded (ops/core/inference.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/tensor.h"
#include "ops/core/contract.h"

namespace kiln::passes::fusion {

// The node indices reading each value, kept up to date as the graph is rewritten.
class Rewriter {
 public:
  explicit Rewriter(ir::Graph& g);

  ir::Graph& graph() { return g_; }
  size_t size() const { return g_.nodes.size(); }
  bool removed(size_t n) const { return removed_[n]; }
  ir::Node& node(size_t n) { return g_.nodes[n]; }
  size_t index(const ir::Node* n) const { return static_cast<size_t>(n - g_.nodes.data()); }

  // The live node producing `v`, or null.
  ir::Node* producer(ir::ValueId v);
  // The live node producing `v` when it is the ai.onnx `op`, or null.
  ir::Node* producer(ir::ValueId v, const char* op);

  // `v` is read by exactly one node input and nothing else (no graph output, no capture).
  bool single_use(ir::ValueId v) const {
    return v != ir::kNoValue && readers_[static_cast<size_t>(v)] == 1 &&
           !pinned_[static_cast<size_t>(v)];
  }
  // `v` is read by exactly `n` node inputs and nothing else.
  bool used_exactly(ir::ValueId v, int n) const {
    return v != ir::kNoValue && readers_[static_cast<size_t>(v)] == n &&
           !pinned_[static_cast<size_t>(v)];
  }
  // `v` is read by nothing (an unused optional output).
  bool unused(ir::ValueId v) const {
    return v == ir::kNoValue ||
           (readers_[static_cast<size_t>(v)] == 0 && !pinned_[static_cast<size_t>(v)]);
  }
  // A graph output or read by a nested graph: its name must stay.
  bool pinned(ir::ValueId v) const { return pinned_[static_cast<size_t>(v)]; }

  // The constant behind `v` (an initializer here or in an enclosing graph), or null.
  const Tensor* constant(ir::ValueId v) const;
  // The value of a float constant holding one element, or nullopt.
  std::optional<double> scalar(ir::ValueId v) const;
  // What is known of `v` before the run: the facts of the graph as loaded, computed once;
  // a value a rewrite adds gets its facts from its producer's rule when first asked (a
  // rewrite keeps the meaning of the values it keeps, so their facts stay true).
  const ops::ValueFacts& facts(ir::ValueId v);
  // The element type of `v` when known, else Undefined.
  DataType dtype(ir::ValueId v) { return facts(v).dtype; }
  // The rank of `v`, -1 when it cannot be told without running the graph.
  int64_t rank(ir::ValueId v) { return facts(v).rank(); }
  // The size of `v`'s last axis, -1 when not known.
  int64_t last_dim(ir::ValueId v) { return facts(v).dim(-1); }
  // The size of `v`'s axis 1 (its channels), -1 when not known.
  int64_t channels(ir::ValueId v) { return rank(v) >= 2 ? facts(v).dim(1) : -1; }
  // Whether `v` is known to hold float32.
  bool float_type(ir::ValueId v) { return dtype(v) == DataType::Float; }

  // The live nodes reading `v` (each once, however many of its inputs do).
  std::vector<ir::Node*> readers(ir::ValueId v);
  // The one live node reading `v` when `v` has no other use, else null.
  ir::Node* sole_reader(ir::ValueId v);

  // Every node input reading `from` reads `to` instead.
  void replace_uses(ir::ValueId from, ir::ValueId to);
  void remove(ir::Node* n);
  // Appends a node producing `outputs` (values that exist already: their producer moves to it).
  ir::Node& add(ir::Node node);
  // A new initializer of this graph holding `t` (made read-only).
  ir::ValueId new_constant(const std::string& hint, Tensor t);
  ir::ValueId new_value(const std::string& hint);

  // Drops removed nodes and renumbers producers.
  void commit();

 private:
  void reindex();

  ir::Graph& g_;
  std::vector<bool> removed_;
  std::vector<int32_t> readers_;
  std::vector<bool> pinned_;
  std::vector<ops::ValueFacts> facts_;  // per value id
  std::vector<bool> facts_done_;        // facts_[v] holds v's facts
};

// Small matches the patterns share.

inline bool is(const ir::Node& n, const char* op) {
  return n.domain.empty() && n.op_type == op;
}

// The input of `n` other than `v` (n has two inputs, one of them v).
inline ir::ValueId other_input(const ir::Node& n, ir::ValueId v) {
  return n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
}

// The one node reading `v`, when it is a two-input `op`; else null.
ir::Node* binary_reader(Rewriter& r, ir::ValueId v, const char* op);

// A float scalar constant that cannot broadcast `other` to a larger rank: its value, else
// nullopt.
std::optional<double> scalar_factor(Rewriter& r, ir::ValueId c, ir::ValueId other);

}  // namespace kiln::passes::fusion
