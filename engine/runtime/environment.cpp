#include "kiln/environment.h"

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/util/tsan.h"
#include "kiln/version.h"
#include "proto/weights_cache.h"

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

namespace {

// Runs the function given to Environment::execute. The arena may run it on another thread
// when all its slots are taken: the hand-off is stated both ways for ThreadSanitizer, keyed
// on this object's address, which the running thread knows before reading anything.
struct ArenaCall {
  const std::function<void()>* fn;
  void operator()() const {
    tsan::acquire(this);
    struct Done {
      const void* sync;
      ~Done() { tsan::release(sync); }
    } done{this};
    (*fn)();
  }
};

}  // namespace

void Environment::execute(const std::function<void()>& fn) const {
  const ArenaCall call{&fn};
  tsan::release(&call);
  struct Back {
    const void* sync;
    ~Back() { tsan::acquire(sync); }  // exceptions included
  } back{&call};
  impl_->arena.execute(call);
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
