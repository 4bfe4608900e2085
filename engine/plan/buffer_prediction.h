// Buffer prediction: the pool requests a run of a plan will make, in order, with the steps
// at which each buffer is acquired and released, derived from inferred shapes before the
// run. It follows the executor's rules: views (Reshape, Transpose, Slice, ...) share their
// input's buffer, a kernel that may write into an input does so when the input is owned by
// the run, read for the last time, contiguous and of the output's type and shape, and a
// non-contiguous input of a kernel that needs contiguous data is copied outside the pool.
// Each op's contract (ops/core/contract.h) says which outputs are views and which may be written
// over an input; a kernel's workspace (OpRegistration::workspace) is a buffer of its step
// alone, after its outputs. Unplanned scratch (OpContext::allocate) is outside the plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/plan.h"
#include "engine/plan/shape_inference.h"

namespace kiln::plan {

struct PredictedBuffer {
  uint64_t bytes = 0;
  int32_t first = 0;  // the executor's step that acquires it (steps count from 1)
  int32_t last = -1;  // the step at which it is released; -1 when it outlives the run
};

struct BufferPrediction {
  bool complete = false;
  std::string why;                       // when not complete: the node that could not be predicted
  std::vector<PredictedBuffer> buffers;  // in request order
};

// Predicts the buffers of one run of `plan` from the inferred values of its graph. Nested
// graphs run as their op's placement rule states (If's taken branch, each Loop or Scan
// iteration), each run's values inferred from the values it is given; their steps are
// numbered among the others as the executor numbers them. `owned_inputs` (by graph input, may be
// shorter) marks the graph inputs the run owns alone (given by move): kernels may write over them
// at their last use, as over the run's own buffers. `threads`: the threads kernels run on (the
// session's environment's), which per-thread workspaces are sized for.
BufferPrediction predict_buffers(const GraphPlan& plan, const std::vector<ops::ValueFacts>& values,
                                 const std::vector<bool>& owned_inputs = {}, int threads = 1);

}  // namespace kiln::plan
