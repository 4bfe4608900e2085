#include "kiln/environment.h"

#include <tbb/info.h>
#include <tbb/task_arena.h>

namespace kiln {

struct Environment::Impl {
  explicit Impl(int n) : threads(n), arena(n) {}
  int threads;
  tbb::task_arena arena;
};

static int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const int n = tbb::info::default_concurrency();
  return n > 0 ? n : 1;
}

Environment::Environment(int threads) : impl_(std::make_unique<Impl>(resolve_threads(threads))) {}
Environment::~Environment() = default;

int Environment::threads() const {
  return impl_->threads;
}

void Environment::execute(const std::function<void()>& fn) const {
  impl_->arena.execute(fn);
}

}  // namespace kiln
