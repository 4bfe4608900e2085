// Environment: what sessions share. It owns the thread pool (a oneTBB task_arena) on
// which every kernel of every session created from it runs.
#pragma once

#include <functional>
#include <memory>

namespace kiln {

class Environment {
 public:
  // threads <= 0: one per available core.
  explicit Environment(int threads = 0);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  int threads() const;
  // Runs `fn` inside this environment's arena, so tbb::parallel_for inside it uses these
  // threads and no others.
  void execute(const std::function<void()>& fn) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
