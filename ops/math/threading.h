// One threading policy for the kernels: split work across the current oneTBB arena only in
// tasks big enough to pay for it, one static chunk per thread.
#pragma once

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <cstdint>
#include <type_traits>

#include "engine/util/float_mode.h"
#include "engine/util/tsan.h"

namespace kiln::math {

// Below about a million multiply-adds a task costs more to hand to another thread than it
// takes to run (onnxruntime's MLAS splits at a similar size).
constexpr double kMinTaskWork = 1 << 20;

// Tasks for `work` (multiply-adds or the equivalent) on `threads` threads, none smaller than
// kMinTaskWork: a pure function, so a workspace rule sizes per-task scratch as the kernel does.
inline int tasks_for(double work, int threads) {
  if (threads <= 1 || work < 2 * kMinTaskWork) return 1;
  const double by_work = work / kMinTaskWork;
  return by_work < threads ? static_cast<int>(by_work) : threads;
}

// tasks_for at most the arena's threads (or max_threads when > 0).
inline int task_count(double work, int max_threads = 0) {
  int threads = tbb::this_task_arena::max_concurrency();
  if (max_threads > 0 && max_threads < threads) threads = max_threads;
  return tasks_for(work, threads);
}

// A product of a single row tile (a decode step's GEMV, m <= mr) uses each weight of B for
// only m multiply-adds: its time is B streaming from memory, about this many multiply-adds
// of a compute-bound product per weight (a core's memory bandwidth against its FMA rate: an
// estimate, docs/performance.md, "Figures cited in code comments"). Counted so, a decode
// step's weight is split across threads where its multiply-adds alone would not be.
constexpr double kStreamedWeightWork = 16;

// The work of an m x n x k float product for task_count.
inline double product_work(int64_t m, int64_t n, int64_t k, int mr) {
  const double nk = static_cast<double>(n) * static_cast<double>(k);
  return m <= mr ? nk * kStreamedWeightWork : static_cast<double>(m) * nk;
}

// What the tasks of run_tasks call. oneTBB holds it by reference, so every task knows its
// address before reading anything: the key of the hand-off stated to ThreadSanitizer
// (tsan.h), the tasks seeing the caller's writes and the caller theirs. Each task runs in the
// caller's floating-point mode (float_mode.h: the run's denormal setting).
template <typename F>
struct TaskCall {
  F* body;
  unsigned mode;
  void operator()(int t) const {
    tsan::acquire(this);
    const fp::ModeScope scope(mode);
    (*body)(t);
    tsan::release(this);
  }
};

// Runs body(t) for t in [0, tasks), each on its own thread when tasks > 1.
template <typename F>
void run_tasks(int tasks, F&& body) {
  if (tasks <= 1) {
    body(0);
    return;
  }
  const TaskCall<std::remove_reference_t<F>> call{&body, fp::mode()};
  tsan::release(&call);
  tbb::parallel_for(0, tasks, call, tbb::static_partitioner());
  tsan::acquire(&call);
}

// How a product's [0, m) x [0, n) is cut into blocks of whole tiles, one per task.
struct Split {
  int row_parts = 1, col_parts = 1;
};

enum class SplitPolicy {
  RowsFirst,      // rows when there are enough of them or they are the longer side
  ColumnsFirst,   // columns when there are enough of them or they are the longer side
  LargerOperand,  // columns when B is the larger operand, rows when A is (each task then
                  // reads only its part of the larger one)
};

// The split of an m x n product in mr x nr tiles among `tasks` tasks (never more parts than
// tiles).
inline Split split_for(int tasks, int64_t m, int64_t n, int mr, int nr, SplitPolicy policy) {
  const int64_t row_tiles = (m + mr - 1) / mr, col_tiles = (n + nr - 1) / nr;
  bool by_rows = false;
  switch (policy) {
    case SplitPolicy::RowsFirst:
      by_rows = row_tiles >= 2 * tasks || row_tiles >= col_tiles;
      break;
    case SplitPolicy::ColumnsFirst:
      by_rows = !(col_tiles >= tasks || col_tiles >= row_tiles);
      break;
    case SplitPolicy::LargerOperand:
      by_rows = !((col_tiles >= tasks && (n >= m || row_tiles < tasks)) || col_tiles >= row_tiles);
      break;
  }
  Split s;
  if (by_rows) {
    s.row_parts = static_cast<int>(row_tiles < tasks ? row_tiles : tasks);
  } else {
    s.col_parts = static_cast<int>(col_tiles < tasks ? col_tiles : tasks);
  }
  return s;
}

// The start of part `i` of `parts` over `total` in whole steps (clamped to `total`).
inline int64_t part_edge(int i, int parts, int64_t total, int step) {
  const int64_t tiles = (total + step - 1) / step;
  const int64_t edge = tiles * i / parts * step;
  return edge < total ? edge : total;
}

// Runs body(m0, m1, n0, n1) for every non-empty block of `s` over an m x n product in mr x nr
// tiles, each block on its own thread.
template <typename F>
void run_split(const Split& s, int64_t m, int64_t n, int mr, int nr, F&& body) {
  run_tasks(s.row_parts * s.col_parts, [&](int t) {
    const int ri = t / s.col_parts, ci = t % s.col_parts;
    const int64_t m0 = part_edge(ri, s.row_parts, m, mr),
                  m1 = part_edge(ri + 1, s.row_parts, m, mr);
    const int64_t n0 = part_edge(ci, s.col_parts, n, nr),
                  n1 = part_edge(ci + 1, s.col_parts, n, nr);
    if (m0 < m1 && n0 < n1) body(m0, m1, n0, n1);
  });
}

}  // namespace kiln::math
