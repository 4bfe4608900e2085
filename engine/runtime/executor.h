// Executor: runs a GraphPlan on values, freeing each value after its last read.
//
// Ownership needs no flags: a tensor may be overwritten when its storage is writable and
// referenced only by the executor's slot (a caller that passed a copy still holds a
// reference; one that passed by move does not), and the node about to run is its last
// reader. Nested graphs receive their captures as values: borrowed handles, or moved in
// when an If node is the last reader of an owned value, so the branch may extend it in place.
#pragma once

#include <chrono>
#include <vector>

#include "engine/plan/plan.h"
#include "engine/runtime/buffer_pool.h"
#include "kiln/session.h"

namespace kiln {

class WeightRelease;

class Executor {
 public:
  Executor(BufferPool& pool, RunStats& stats, std::vector<NodeEvent>* profile)
      : pool_(pool), stats_(stats), profile_(profile), start_(std::chrono::steady_clock::now()) {}

  // Runs `plan` with `inputs` bound to graph.inputs (in order; an undefined Value takes the
  // input's default) and `captures` bound to graph.captures. Returns graph.outputs.
  std::vector<Value> run(const plan::GraphPlan& plan, std::vector<Value> inputs,
                         std::vector<Value> captures, int depth = 0);

  BufferPool& pool() { return pool_; }
  RunStats& stats() { return stats_; }
  // Lets the main graph's mapped weights give their pages back after their last use.
  void set_weight_release(WeightRelease* release) { weight_release_ = release; }

 private:
  friend class StepHooks;
  BufferPool& pool_;
  RunStats& stats_;
  std::vector<NodeEvent>* profile_;
  std::chrono::steady_clock::time_point start_;
  int32_t steps_ = 0;  // steps started in this run, nested graphs included
  bool adopt_inputs_ = false;
  WeightRelease* weight_release_ = nullptr;

 public:
  // Owned graph inputs (passed by move) join the pool once read for the last time, so
  // later buffers reuse their memory. Their contents are overwritten.
  void set_adopt_inputs(bool on) { adopt_inputs_ = on; }
};

// Allocates a tensor from `pool` (strings are not pooled).
Tensor allocate_tensor(BufferPool& pool, DataType dtype, const Shape& shape);

}  // namespace kiln
