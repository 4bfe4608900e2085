#include "engine/runtime/buffer_pool.h"

#include <bit>
#include <cstdlib>
#include <new>

namespace kiln {

constexpr size_t kAlignment = 64;

size_t pool_size_class(size_t bytes) {
  if (bytes <= 1024)
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  const size_t top = std::bit_floor(bytes);  // 2^k <= bytes
  const size_t quarter = top / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

namespace detail {

PoolCore::~PoolCore() {
  for (auto& [cap, p] : free_) std::free(p);
}

std::shared_ptr<Storage> PoolCore::acquire(size_t bytes) {
  const size_t cls = pool_size_class(bytes);
  std::byte* data = nullptr;
  size_t capacity = cls;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Best fit among cached buffers no more than twice the size class.
    auto it = free_.lower_bound(cls);
    if (it != free_.end() && it->first <= 2 * cls) {
      capacity = it->first;
      data = it->second;
      free_.erase(it);
      bytes_cached -= capacity;
      ++reuses;
    }
  }
  if (!data) {
    data = static_cast<std::byte*>(std::aligned_alloc(kAlignment, capacity));
    if (!data) throw std::bad_alloc();
    ++allocations;
    bytes_allocated += capacity;
  }
  const uint64_t now = bytes_in_use += capacity;
  uint64_t peak = peak_bytes_in_use.load();
  while (now > peak && !peak_bytes_in_use.compare_exchange_weak(peak, now)) {
  }
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->capacity_ = capacity;
  s->kind_ = Storage::Kind::Pool;
  s->pool_ = shared_from_this();
  return s;
}

void PoolCore::release(std::byte* data, size_t capacity) {
  bytes_in_use -= capacity;
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(capacity, data);
  bytes_cached += capacity;
}

void PoolCore::trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [cap, p] : free_) std::free(p);
  free_.clear();
  bytes_cached = 0;
}

}  // namespace detail

BufferPool::BufferPool() : core_(std::make_shared<detail::PoolCore>()) {}

}  // namespace kiln
