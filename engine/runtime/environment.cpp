#include "kiln/environment.h"

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/runtime/weights_cache.h"
#include "kiln/version.h"
#include "ops/math/tsan.h"

namespace kiln {

struct Environment::Impl {
  explicit Impl(int n) : threads(n), arena(n), cache(std::make_shared<detail::WeightsCache>()) {}
  int threads;
  tbb::task_arena arena;
  std::shared_ptr<detail::WeightsCache> cache;
};

static int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const int n = tbb::info::default_concurrency();
  return n > 0 ? n : 1;
}

// KILN_ISA is checked here, so a bad value is an error when the first Environment (or
// Session) is made rather than in the middle of a run.
Environment::Environment(int threads) : impl_(std::make_unique<Impl>(resolve_threads(threads))) {
  isa_level();
}
Environment::~Environment() = default;

int Environment::threads() const {
  return impl_->threads;
}

void Environment::execute(const std::function<void()>& fn) const {
  // The arena may run `fn` on another thread when all its slots are taken: the hand-off is
  // stated both ways for ThreadSanitizer, exceptions included.
  struct OnExit {
    const void* sync;
    bool release;
    ~OnExit() { release ? tsan::release(sync) : tsan::acquire(sync); }
  };
  const int sync = 0;
  tsan::release(&sync);
  const OnExit back{&sync, false};
  impl_->arena.execute([&] {
    tsan::acquire(&sync);
    const OnExit done{&sync, true};
    fn();
  });
}

WeightsCacheStats Environment::weights_cache_stats() const {
  return impl_->cache->stats();
}

namespace detail {
WeightsCache& weights_cache(const Environment& env) {
  return *env.impl_->cache;
}
}  // namespace detail

}  // namespace kiln
