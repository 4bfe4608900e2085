// WeightRelease: gives the pages of mapped weights back once a run no longer reads them
// (SessionOptions::release_weights_after_use).
//
// A weight is done with when no live value of the main graph's frame views its storage:
// its own slot is freed after its last reader (a node reading it through a nested graph's
// capture counts as a reader) and so are the views made of it (a Transpose or Reshape of a
// weight shares its storage). Counting live slots per storage, rather than watching the
// initializer alone, keeps a weight resident until the MatMul reading its transposed view
// has run. Values that escape as graph outputs are never released.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/session.h"

namespace kiln {

class WeightRelease {
 public:
  // Tracks `graph`'s initializers whose bytes lie in a read-only file mapping.
  explicit WeightRelease(const ir::Graph& graph);

  // Starts a run: no slot holds anything yet; results are counted in `stats`.
  void start_run(RunStats& stats);
  // A slot of the main graph's frame now holds `v`.
  void hold(const Value& v);
  // A slot holding `v` is about to be cleared.
  void drop(const Value& v);
  // After a step has freed its inputs and stored its outputs: releases the weights no slot
  // views any more. Deferred to here so that a step's output viewing its input weight
  // (Transpose, Reshape) keeps the weight resident.
  void end_step();

 private:
  struct Weight {
    std::string name;  // of the (first) initializer viewing it, for messages
    Tensor bytes;      // the whole storage, as released
    int32_t live = 0;  // slots viewing it in the current run
  };
  Weight* find(const Value& v);

  std::unordered_map<const Storage*, size_t> index_;
  std::vector<Weight> weights_;
  std::vector<size_t> dropped_;  // weights whose last view went during this step
  RunStats* stats_ = nullptr;
};

}  // namespace kiln
