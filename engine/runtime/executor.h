// Executor: runs a GraphPlan on values, freeing each value after its last read.
//
// Ownership needs no flags: a tensor may be overwritten when its storage is writable and
// referenced only by the executor's slot (a caller that passed a copy still holds a
// reference; one that passed by move does not), and the node about to run is its last
// reader. Nested graphs receive their captures as values: borrowed handles, or moved in
// when an If node is the last reader of an owned value, so the branch may extend it in place.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "engine/plan/plan.h"
#include "engine/runtime/buffer_pool.h"
#include "kiln/session.h"

namespace kiln {

class WeightRelease;

// The vectors one graph run works in: a slot per value, the remaining use counts, and a
// step's input pointers, contiguous temporaries and outputs. Between runs they keep their
// capacity, so a warm run allocates none of them, and the slots keep the graph's
// initializers bound (handles to read-only weights), so a warm run copies none of those
// handles either.
struct FrameBuffers {
  std::vector<Value> slots;
  std::vector<int32_t> uses;
  std::vector<const Value*> in_ptrs;
  std::vector<Value> temps;
  std::vector<bool> temporary;
  std::vector<Value> outs;
  std::vector<Value> captures;  // a nested graph's captured values, on their way in
  std::vector<Value> results;   // a nested graph's outputs, on their way out (run_subgraph_kept)
  // The root graph's Concat group buffers (plan::ConcatGroup) while the run holds them.
  std::vector<Tensor> groups;
};

// FrameBuffers kept across runs (a session keeps a few, one per run in progress), one set per graph
// of the plan tree (GraphPlan::index): a graph never runs inside itself, and its runs (Loop
// iterations) follow one another.
// The run's graph inputs and outputs are kept here too: the session binds the inputs into
// `inputs` and the executor leaves the outputs in `results`, so a warm run allocates neither.
class ExecutorScratch {
 public:
  FrameBuffers& at(int32_t plan_index) {
    const auto d = static_cast<size_t>(plan_index);
    while (frames_.size() <= d) frames_.push_back(std::make_unique<FrameBuffers>());
    return *frames_[d];
  }

  std::vector<Value> inputs, results;
  std::vector<bool> given;  // which inputs the caller named

 private:
  std::vector<std::unique_ptr<FrameBuffers>> frames_;
};

class Executor {
 public:
  // `scratch` (may be null: the executor keeps its own) must not serve two runs at once.
  // `run` (may be null) is this run's share of the pool: its counters, step and arena.
  Executor(BufferPool& pool, RunStats& stats, std::vector<NodeEvent>* profile,
           ExecutorScratch* scratch = nullptr, detail::PoolRun* run = nullptr)
      : pool_(pool),
        stats_(stats),
        profile_(profile),
        start_(std::chrono::steady_clock::now()),
        scratch_(scratch ? *scratch : own_scratch_),
        run_(run) {}

  // Runs `plan` with `inputs` bound to graph.inputs (in order; an undefined Value takes the
  // input's default) and `captures` bound to graph.captures, both moved from. Leaves
  // graph.outputs in `results` (replacing what it held, keeping its capacity).
  void run(const plan::GraphPlan& plan, std::span<Value> inputs, std::span<Value> captures,
           std::vector<Value>& results, int depth = 0);

  BufferPool& pool() { return pool_; }
  RunStats& stats() { return stats_; }
  // Lets the main graph's mapped weights give their pages back after their last use.
  void set_weight_release(WeightRelease* release) { weight_release_ = release; }
  // Cancellation and deadline, checked before every node and every graph run (each Loop or
  // Scan iteration runs its body graph).
  void set_run_options(const RunOptions* options) { options_ = options; }
  // Counts the denormal floats of every node's outputs (SessionOptions::count_denormals).
  void set_count_denormals(bool on) { count_denormals_ = on; }

 private:
  friend class StepHooks;
  BufferPool& pool_;
  RunStats& stats_;
  std::vector<NodeEvent>* profile_;
  std::chrono::steady_clock::time_point start_;
  ExecutorScratch own_scratch_;
  ExecutorScratch& scratch_;
  detail::PoolRun* run_;
  const RunOptions* options_ = nullptr;
  bool count_denormals_ = false;
  int32_t steps_ = 0;  // steps started in this run, nested graphs included
  bool adopt_inputs_ = false;
  WeightRelease* weight_release_ = nullptr;
  void check_stop() const;

 public:
  // Owned graph inputs (passed by move) join the pool once read for the last time, so
  // later buffers reuse their memory. Their contents are overwritten.
  void set_adopt_inputs(bool on) { adopt_inputs_ = on; }
};

// Allocates a tensor from `pool` for `run` (strings are not pooled); `planned` as in
// PoolCore::acquire.
Tensor allocate_tensor(BufferPool& pool, DataType dtype, const Shape& shape,
                       detail::PoolRun* run = nullptr, bool planned = true);

}  // namespace kiln
