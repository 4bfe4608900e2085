// Environment: what sessions share. It owns the thread pool (a oneTBB task_arena) on
// which every kernel of every session created from it runs, and the weights cache: sessions
// created from one Environment keep one copy of identical weights (compared byte by byte at
// load) and of the prepared forms kernels make of them (SessionOptions::share_weights).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace kiln {

class Environment;
namespace detail {
class WeightsCache;
WeightsCache& weights_cache(const Environment& env);
}  // namespace detail

// The weights cache of an Environment. Entries are refcounted by the sessions using them:
// when the last such session is destroyed they are freed and `entries` counts down.
struct WeightsCacheStats {
  uint64_t entries = 0;           // weights and prepared forms held now
  uint64_t bytes = 0;             // their bytes
  uint64_t loaded_entries = 0;    // of `entries`: weights as loaded
  uint64_t prepared_entries = 0;  // of `entries`: prepared forms (packed, widened, ...)
  uint64_t references = 0;        // session holds on entries, now
  uint64_t prepared_made = 0;     // prepared forms made since the environment was created
  uint64_t prepared_hits = 0;     // requests for a prepared form that found it made already
};

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

  WeightsCacheStats weights_cache_stats() const;

 private:
  friend detail::WeightsCache& detail::weights_cache(const Environment& env);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
