// ArenaState: a session's activation arena from one run to the next.
//
// A run either uses the arena planned for its signature (its input shapes, then the keys of
// the allocate_input tensors it was given by move), records its pool requests so that the
// next run with that signature gets an arena, or, when the graph's buffers follow from its
// input shapes, plans the arena from predicted buffers before it starts (and records too, so
// later runs get the exact recorded layout). One run at a time records or uses the arena; a
// run that finds either taken is served by the pool. Every arena placement is checked by the
// pool, so a run that diverges from the plan falls back to pool buffers, never to live memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/buffer_pool.h"
#include "kiln/session.h"
#include "kiln/value.h"

namespace kiln::detail {

// An input tensor handed out by allocate_input, waiting for the run it belongs to.
struct AllocatedInput {
  std::string name, key;
  std::weak_ptr<Storage> storage;  // weak: passing it by move must leave it uniquely owned
  uint64_t bytes = 0;              // requested
  // Bytes taken in the arena (0: a pool buffer). The i-th allocation of a cycle is placed
  // at the layout's i-th entry.
  uint64_t arena_bytes = 0;
};

// One run's part in the arena: its pool counters (which the executor advances), the inputs
// allocated for it, and what it records or uses. Destroying it ends its hold on the pool's
// recording and arena, so a run that throws leaves both free.
class ArenaRun {
 public:
  explicit ArenaRun(PoolCore& pool) : pool_(pool) {}
  ~ArenaRun();
  ArenaRun(const ArenaRun&) = delete;
  ArenaRun& operator=(const ArenaRun&) = delete;

  PoolRun counts;

 private:
  friend class ArenaState;
  PoolCore& pool_;
  std::vector<AllocatedInput> allocated_;
  std::vector<bool> held_;  // allocated_[j] was given to the run by move
  std::vector<std::pair<const std::byte*, uint64_t>> held_buffers_;
  std::vector<std::string> held_keys_;
  std::string shapes_, signature_;
  bool from_shapes_ = false, recording_ = false;
  std::shared_ptr<const ArenaLayout> used_;
  std::vector<RecordedBuffer> recorded_;
};

class ArenaState {
 public:
  // The pool requests a run with these inputs will make, predicted before it starts.
  struct Predicted {
    std::vector<RecordedBuffer> buffers;
    // The input values the prediction read besides the shapes (an If's condition given as
    // an input), "" when none: the plan holds for runs with these values.
    std::string values;
  };
  // nullopt when some request cannot be known before the run.
  using Predict = std::function<std::optional<Predicted>(const std::vector<Value>& inputs)>;

  struct Options {
    bool enabled = true;           // SessionOptions::memory_arena
    bool inputs_in_arena = false;  // SessionOptions::inputs_in_arena
  };

  // `predict` null: arenas come from recorded runs only.
  ArenaState(BufferPool& pool, Options options, Predict predict);

  // A buffer for the next run's input `name` (identified by `key`: name, type, shape): its
  // place in the arena while every allocation of the cycle repeats the planned run's,
  // otherwise a pool buffer.
  std::shared_ptr<Storage> allocate_input(const std::string& name, const std::string& key,
                                          uint64_t bytes);

  // A run's phases, in order. take_inputs: the inputs allocated since the last run belong to
  // `run`, whatever becomes of it. begin: given the run's inputs (in graph-input order, named
  // by `names`), uses, records or plans the arena and counts its inputs' places. end: after
  // the graph ran, gives the recording and the arena back and fills the pool counters.
  // finish: plans from the recording, remembers the signature and reports the layout.
  void take_inputs(ArenaRun& run);
  void begin(ArenaRun& run, const std::vector<Value>& inputs, const std::vector<std::string>& names,
             RunStats& stats);
  void end(ArenaRun& run, RunStats& stats);
  void finish(ArenaRun& run, RunStats& stats);

  // The layout runs with its signature use (null before one is planned).
  std::shared_ptr<const ArenaLayout> layout() const;

 private:
  void open_cycle();
  void plan(const std::vector<RecordedBuffer>& recorded, std::string signature, std::string shapes,
            std::vector<std::string> input_keys);
  bool plan_from_shapes(const std::vector<Value>& inputs, const std::string& shapes);
  void find_held_inputs(ArenaRun& run, const std::vector<Value>& inputs,
                        const std::vector<std::string>& names) const;
  size_t start(ArenaRun& run, const std::vector<Value>& inputs);

  BufferPool& pool_;
  const Options options_;
  const Predict predict_;
  mutable std::mutex mutex_;  // never held while a run executes

  std::string last_signature_;             // of the previous run
  std::string arena_signature_;            // of the run `arena_` was planned from
  std::string arena_shapes_;               // the shapes part of arena_signature_
  std::vector<std::string> arena_inputs_;  // keys of the layout's first entries (graph inputs)
  std::shared_ptr<const ArenaLayout> arena_;
  std::string shapes_not_planned_;  // the last input shapes prediction failed for
  // Buffers for the next run's shapes and signature, handed from run to run with their
  // capacity, so that a warm run allocates none.
  std::string spare_shapes_, spare_signature_;
  // Runs in a row whose signature differed from the run before. Input shapes that change at
  // every run (a decode loop's growing caches) make a predicted plan serve one run only, and
  // predicting costs more than the allocations it saves (measured: docs/performance.md,
  // "Figures cited in code comments"): after kMaxFreshPlans such runs, the pool serves them
  // until a run repeats the signature before it.
  int fresh_runs_ = 0;
  static constexpr int kMaxFreshPlans = 2;

  // Inputs handed out by allocate_input since the last run (the next run's "cycle").
  std::vector<AllocatedInput> allocated_;
  bool cycle_open_ = false;
  bool allocated_match_ = true;  // every allocation of the cycle matched arena_inputs_ so far
  // The pool counters of the cycle's allocations: the run's counters include them.
  PoolRun cycle_counts_;
};

}  // namespace kiln::detail
