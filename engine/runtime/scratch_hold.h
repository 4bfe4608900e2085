// ScratchHold: a run's loan of one of the session's executor scratches.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "engine/runtime/executor.h"

namespace kiln {

// Lends a run an executor scratch of the session (a new one when all are in use) and gives
// it back when the run ends, normally or by an exception, emptied of the run's values.
struct ScratchHold {
  std::mutex& mutex;
  std::vector<std::unique_ptr<ExecutorScratch>>& free_scratch;
  std::unique_ptr<ExecutorScratch> scratch;

  ScratchHold(std::mutex& m, std::vector<std::unique_ptr<ExecutorScratch>>& free);
  ScratchHold(const ScratchHold&) = delete;
  ScratchHold& operator=(const ScratchHold&) = delete;
  ~ScratchHold() { release(); }
  // Drops the run's inputs and results (their buffers go back to the pool) and gives the
  // scratch back.
  void release();
};

}  // namespace kiln
