// One threading policy for the kernels: split work across the current oneTBB arena only in
// tasks big enough to pay for it, one static chunk per thread.
#pragma once

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <cstdint>

namespace kiln::math {

// Below about a million multiply-adds a task costs more to hand to another thread than it
// takes to run (onnxruntime's MLAS splits at a similar size).
constexpr double kMinTaskWork = 1 << 20;

// Tasks for `work` (multiply-adds or the equivalent): at most the arena's threads (or
// max_threads when > 0), and none smaller than kMinTaskWork.
inline int task_count(double work, int max_threads = 0) {
  int threads = tbb::this_task_arena::max_concurrency();
  if (max_threads > 0 && max_threads < threads) threads = max_threads;
  if (threads <= 1 || work < 2 * kMinTaskWork) return 1;
  const double by_work = work / kMinTaskWork;
  return by_work < threads ? static_cast<int>(by_work) : threads;
}

// Runs body(t) for t in [0, tasks), each on its own thread when tasks > 1.
template <typename F>
void run_tasks(int tasks, F&& body) {
  if (tasks <= 1) {
    body(0);
    return;
  }
  tbb::parallel_for(
      0, tasks, [&](int t) { body(t); }, tbb::static_partitioner());
}

}  // namespace kiln::math
