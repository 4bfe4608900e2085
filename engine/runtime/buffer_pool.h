// BufferPool: recycles the buffers of a session's intermediate tensors across nodes and
// across runs, so a run that repeats the shapes of an earlier one allocates nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "kiln/tensor.h"

namespace kiln {
namespace detail {

// The shared state behind a BufferPool. Pool storages hold a reference to it and hand
// their bytes back on destruction, so buffers may outlive the pool object itself.
class PoolCore : public std::enable_shared_from_this<PoolCore> {
 public:
  ~PoolCore();
  std::shared_ptr<Storage> acquire(size_t bytes);
  void release(std::byte* data, size_t capacity);
  // Frees every cached buffer not in use.
  void trim();

  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> bytes_allocated{0};
  std::atomic<uint64_t> reuses{0};
  std::atomic<uint64_t> bytes_in_use{0};
  std::atomic<uint64_t> peak_bytes_in_use{0};
  std::atomic<uint64_t> bytes_cached{0};

 private:
  std::mutex mutex_;
  std::multimap<size_t, std::byte*> free_;  // capacity -> buffer
};

}  // namespace detail

// Rounds a request up to its size class: multiples of 64 bytes below 1 KiB, then four
// classes per power of two, so a buffer serves requests up to ~19% smaller than itself.
size_t pool_size_class(size_t bytes);

class BufferPool {
 public:
  BufferPool();
  std::shared_ptr<Storage> acquire(size_t bytes) { return core_->acquire(bytes); }
  detail::PoolCore& core() { return *core_; }
  void trim() { core_->trim(); }

 private:
  std::shared_ptr<detail::PoolCore> core_;
};

}  // namespace kiln
