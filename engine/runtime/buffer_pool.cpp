#include "engine/runtime/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <new>

#include <sys/mman.h>

namespace kiln {

constexpr size_t kAlignment = 64;
// Buffers from this size on are mappings of their own (page-aligned), so that freeing one gives
// its pages back to the system at once, whatever else lives in the heap around it.
constexpr size_t kMapBytes = size_t{256} << 10;
constexpr size_t kPageBytes = 4096;

size_t pool_size_class(size_t bytes) {
  if (bytes <= 1024)
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  const size_t top = std::bit_floor(bytes);  // 2^k <= bytes
  const size_t quarter = top / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

namespace detail {

PoolCore::~PoolCore() {
  for (const Cached& c : free_) free_block(c.data);
  free_block(arena_);
  free_storage_blocks();
}

namespace {

// Places a pool Storage and its shared_ptr counts in one of the pool's storage blocks. It
// holds the pool: its copy in the counts block gives the block back after the storage's last
// handle is gone, which may be after the last BufferPool referring to the pool.
template <typename T>
struct StorageBlockAllocator {
  using value_type = T;
  std::shared_ptr<PoolCore> pool;

  explicit StorageBlockAllocator(std::shared_ptr<PoolCore> p) noexcept : pool(std::move(p)) {}
  template <typename U>
  StorageBlockAllocator(const StorageBlockAllocator<U>& other) noexcept : pool(other.pool) {}

  T* allocate(size_t n) {
    static_assert(sizeof(T) <= PoolCore::kStorageBlockBytes &&
                  alignof(T) <= alignof(std::max_align_t));
    if (n != 1) return std::allocator<T>().allocate(n);
    return static_cast<T*>(pool->take_storage_block());
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n != 1) return std::allocator<T>().deallocate(p, n);
    pool->give_storage_block(p);
  }
  template <typename U>
  bool operator==(const StorageBlockAllocator<U>& other) const noexcept {
    return pool == other.pool;
  }
};

void raise_to(std::atomic<uint64_t>& peak, uint64_t now) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

std::shared_ptr<Storage> PoolCore::make_storage(std::byte* data, size_t capacity, PoolRun* run) {
  const uint64_t now = bytes_in_use += capacity;
  raise_to(peak_bytes_in_use, now);
  if (run) raise_to(run->peak_bytes_in_use, now);
  // Storage's constructor is private; a local class of a friend's member may call it, and
  // lets allocate_shared put the Storage and its counts in one recycled block.
  struct PoolStorage : Storage {};
  std::shared_ptr<Storage> s =
      std::allocate_shared<PoolStorage>(StorageBlockAllocator<PoolStorage>(shared_from_this()));
  s->data_ = data;
  s->capacity_ = capacity;
  s->kind_ = Storage::Kind::Pool;
  s->pool_ = this;
  return s;
}

void* PoolCore::take_storage_block() {
  {
    std::lock_guard<std::mutex> lock(blocks_mutex_);
    if (FreeBlock* b = free_blocks_) {
      free_blocks_ = b->next;
      return b;
    }
  }
  return ::operator new(kStorageBlockBytes);
}

void PoolCore::give_storage_block(void* block) noexcept {
  std::lock_guard<std::mutex> lock(blocks_mutex_);
  free_blocks_ = new (block) FreeBlock{free_blocks_};
}

void PoolCore::free_storage_blocks() {
  std::lock_guard<std::mutex> lock(blocks_mutex_);
  while (FreeBlock* b = free_blocks_) {
    free_blocks_ = b->next;
    ::operator delete(b);
  }
}

// Called with mutex_ held: the range of entry `index`, if it takes `bytes` and overlaps no
// live arena buffer.
std::byte* PoolCore::place_in_arena(const ArenaLayout& l, size_t index, size_t bytes,
                                    size_t& capacity) {
  if (index >= l.bytes.size() || !l.in_arena[index] || bytes > l.bytes[index]) return nullptr;
  const uint64_t begin = l.offsets[index], end = begin + l.bytes[index];
  if (end > arena_capacity_) return nullptr;
  // The live buffer starting last before `end` is the only one that can overlap.
  auto it = std::lower_bound(
      arena_live_.begin(), arena_live_.end(), end,
      [](const std::pair<uint64_t, uint64_t>& e, uint64_t v) { return e.first < v; });
  if (it != arena_live_.begin() && std::prev(it)->second > begin) return nullptr;
  // Live buffers never overlap, so `begin` sorts right before `it`.
  arena_live_.insert(it, {begin, end});
  capacity = l.bytes[index];
  return arena_ + begin;
}

// Called with mutex_ held while an arena is active. `missed`: the request was planned in
// the arena (or not planned at all) and is not served from it.
std::byte* PoolCore::acquire_from_arena(size_t bytes, size_t& capacity, bool& missed) {
  const ArenaLayout& l = *layout_;
  if (!l.steps.empty()) {
    const int32_t step = arena_run_->step.load(std::memory_order_relaxed);
    while (arena_next_ < l.steps.size() && l.steps[arena_next_] < step) ++arena_next_;
    if (arena_next_ >= l.steps.size() || l.steps[arena_next_] != step) {
      missed = true;  // not foreseen by the plan
      return nullptr;
    }
  }
  const size_t index = arena_next_++;
  std::byte* data = place_in_arena(l, index, bytes, capacity);
  // Buffers planned outside the arena (they outlive the run) are no miss.
  missed = !data && (index >= l.in_arena.size() || l.in_arena[index]);
  return data;
}

// Called with mutex_ held. The arena moves only while nothing lives in it.
bool PoolCore::reserve_arena(uint64_t bytes, PoolRun* run) {
  if (bytes <= arena_capacity_) return true;
  if (!arena_live_.empty()) return false;
  // An arena over the memory limit is not made: the run takes its buffers from the pool,
  // where the first output that goes over the limit fails with its node and size.
  if (memory_limit > 0 && bytes > memory_limit) return false;
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  std::byte* fresh = allocate_block(rounded);
  if (!fresh) return false;
  free_block(arena_);
  arena_ = fresh;
  arena_capacity_ = rounded;
  ++allocations;
  bytes_allocated += rounded;
  if (run) {
    ++run->allocations;
    run->bytes_allocated += rounded;
  }
  return true;
}

std::shared_ptr<Storage> PoolCore::acquire_arena_input(
    const std::shared_ptr<const ArenaLayout>& layout, size_t index, size_t bytes, PoolRun* counts) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (arena_run_ || !reserve_arena(layout->arena_bytes, counts)) return nullptr;
  note_arena_use(layout->arena_bytes);
  size_t capacity = 0;
  std::byte* data = place_in_arena(*layout, index, bytes, capacity);
  if (!data) return nullptr;
  return make_storage(data, capacity, counts);
}

std::shared_ptr<Storage> PoolCore::acquire(size_t bytes, PoolRun* run, bool planned) {
  const size_t cls = pool_size_class(bytes);
  std::byte* data = nullptr;
  size_t capacity = cls;
  if (!planned && run) ++run->unplanned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (planned && run && arena_run_ == run) {
      bool missed = false;
      data = acquire_from_arena(bytes, capacity, missed);
      if (data) {
        ++arena_served;
        ++run->arena_served;
      } else {
        if (missed) {
          ++arena_missed;
          ++run->arena_missed;
        }
        capacity = cls;
      }
    }
    // Best fit among cached buffers no more than twice the size class.
    auto it = data ? free_.end()
                   : std::lower_bound(free_.begin(), free_.end(), cls,
                                      [](const Cached& e, size_t v) { return e.capacity < v; });
    if (it != free_.end() && it->capacity <= 2 * cls) {
      capacity = it->capacity;
      data = it->data;
      free_.erase(it);
      bytes_cached -= capacity;
      ++reuses;
      if (run) ++run->reuses;
    }
  }
  if (!data) {
    if (capacity < kMapBytes) {
      data = allocate_block(capacity);
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      data = allocate_block(capacity);
    }
    if (!data) throw std::bad_alloc();
    ++allocations;
    bytes_allocated += capacity;
    if (run) {
      ++run->allocations;
      run->bytes_allocated += capacity;
    }
  }
  // Recorded wherever served: a run in an arena planned from shapes records the exact one.
  if (planned && run && run->recording) {
    std::lock_guard<std::mutex> lock(mutex_);
    recorded_live_[data] = recorded_.size();
    recorded_.push_back({bytes, run->step.load(std::memory_order_relaxed), -1});
  }
  return make_storage(data, capacity, run);
}

void PoolCore::release(std::byte* data, size_t capacity) {
  bytes_in_use -= capacity;
  std::lock_guard<std::mutex> lock(mutex_);
  if (recorder_) {
    // Only the recording run's buffers are in recorded_live_: the step is that run's.
    auto it = recorded_live_.find(data);
    if (it != recorded_live_.end()) {
      recorded_[it->second].last = recorder_->step.load(std::memory_order_relaxed);
      recorded_live_.erase(it);
    }
  }
  if (arena_ && data >= arena_ && data < arena_ + arena_capacity_) {
    const auto offset = static_cast<uint64_t>(data - arena_);
    auto it = std::lower_bound(
        arena_live_.begin(), arena_live_.end(), offset,
        [](const std::pair<uint64_t, uint64_t>& e, uint64_t v) { return e.first < v; });
    if (it != arena_live_.end() && it->first == offset) arena_live_.erase(it);
    return;
  }
  auto at = std::upper_bound(free_.begin(), free_.end(), capacity,
                             [](size_t v, const Cached& e) { return v < e.capacity; });
  free_.insert(at, {capacity, data, runs_ended_});
  bytes_cached += capacity;
}

bool PoolCore::adopt(Storage& s) {
  if (s.kind_ != Storage::Kind::Heap || !s.writable_ || s.capacity_ == 0) return false;
  s.kind_ = Storage::Kind::Pool;
  s.pool_ = this;
  s.keepalive_ = shared_from_this();  // its counts block is not the pool's: it holds the pool
  bytes_in_use += s.capacity_;
  return true;
}

bool PoolCore::begin_recording(PoolRun& run,
                               const std::vector<std::pair<const std::byte*, uint64_t>>& held) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recorder_) return false;
  recorder_ = &run;
  run.recording = true;
  recorded_.clear();
  recorded_live_.clear();
  for (const auto& [data, bytes] : held) {
    recorded_live_[data] = recorded_.size();
    recorded_.push_back({bytes, run.step.load(std::memory_order_relaxed), -1});
  }
  return true;
}

std::vector<RecordedBuffer> PoolCore::end_recording(PoolRun& run) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recorder_ != &run) return {};
  recorder_ = nullptr;
  run.recording = false;
  recorded_live_.clear();
  return std::move(recorded_);
}

bool PoolCore::begin_arena(PoolRun& run, std::shared_ptr<const ArenaLayout> layout, size_t first) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Buffers still live in the arena (the run's inputs, another run's buffers, or an earlier
  // run's buffer the caller kept) are safe: every request is checked against them.
  if (arena_run_ || !reserve_arena(layout->arena_bytes, &run)) return false;
  note_arena_use(layout->arena_bytes);
  layout_ = std::move(layout);
  arena_next_ = first;
  arena_run_ = &run;
  run.in_arena = true;
  return true;
}

void PoolCore::end_arena(PoolRun& run) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (arena_run_ != &run) return;
  arena_run_ = nullptr;
  run.in_arena = false;
}

// Called with mutex_ held for blocks of kMapBytes or more. Null when the system has no
// memory for it.
std::byte* PoolCore::allocate_block(size_t bytes) {
  if (bytes < kMapBytes) return static_cast<std::byte*>(std::aligned_alloc(kAlignment, bytes));
  const size_t length = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* data = static_cast<std::byte*>(p);
  auto at = std::lower_bound(
      mapped_.begin(), mapped_.end(), data,
      [](const std::pair<std::byte*, size_t>& e, std::byte* v) { return e.first < v; });
  mapped_.insert(at, {data, length});
  return data;
}

// Called with mutex_ held (or from the destructor): a block of allocate_block's, or a heap
// buffer the pool adopted.
void PoolCore::free_block(std::byte* data) {
  if (!data) return;
  auto it = std::lower_bound(
      mapped_.begin(), mapped_.end(), data,
      [](const std::pair<std::byte*, size_t>& e, std::byte* v) { return e.first < v; });
  if (it != mapped_.end() && it->first == data) {
    munmap(data, it->second);
    mapped_.erase(it);
    return;
  }
  std::free(data);
}

void PoolCore::set_keep_runs(uint32_t runs) {
  std::lock_guard<std::mutex> lock(mutex_);
  keep_runs_ = runs;
  arena_used_.assign(runs, 0);
}

// Called with mutex_ held.
void PoolCore::note_arena_use(uint64_t bytes) {
  if (keep_runs_ == 0) return;
  uint64_t& used = arena_used_[runs_ended_ % keep_runs_];
  used = std::max(used, bytes);
}

PoolCore::Sweep PoolCore::end_run() {
  Sweep sweep;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sweep_locked(sweep);
  }
  return sweep;
}

// Called with mutex_ held.
void PoolCore::sweep_locked(Sweep& sweep) {
  ++runs_ended_;
  if (keep_runs_ > 0) {
    // Kept: buffers returned during the last keep_runs_ runs (or since the last one ended).
    const uint64_t oldest_kept = runs_ended_ > keep_runs_ ? runs_ended_ - keep_runs_ : 0;
    auto kept = std::remove_if(free_.begin(), free_.end(), [&](const Cached& c) {
      if (c.returned_at >= oldest_kept) return false;
      ++sweep.buffers_freed;
      sweep.bytes_freed += c.capacity;
      free_block(c.data);
      return true;
    });
    free_.erase(kept, free_.end());
    bytes_cached -= sweep.bytes_freed;
    // The ring entry of the run that ended keep_runs_ runs ago makes room for the next one.
    const uint64_t recent = *std::max_element(arena_used_.begin(), arena_used_.end());
    arena_used_[runs_ended_ % keep_runs_] = 0;
    if (arena_ && arena_capacity_ > recent && !arena_run_ && arena_live_.empty()) {
      free_block(arena_);
      arena_ = nullptr;
      ++sweep.buffers_freed;
      sweep.bytes_freed += arena_capacity_;
      arena_capacity_ = 0;
    }
  }
  sweep.bytes_cached = bytes_cached;
  sweep.arena_capacity = arena_capacity_;
}

void PoolCore::trim() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Cached& c : free_) free_block(c.data);
    free_.clear();
    bytes_cached = 0;
  }
  free_storage_blocks();
}

}  // namespace detail

BufferPool::BufferPool() : core_(std::make_shared<detail::PoolCore>()) {}

}  // namespace kiln
