// BufferPool: recycles the buffers of a session's intermediate tensors across nodes and
// across runs, so a run that repeats the shapes of an earlier one allocates nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {
namespace detail {

// Where each buffer of a run goes in the activation arena, in the order the run acquires
// them. Buffers that outlived the planned run (outputs handed to the caller) stay in the
// pool (`in_arena` false). `steps` (when given) is the executor step each entry is acquired
// at: a request is matched with the next entry of its own step, so a request the plan did
// not foresee, or a planned one that did not come (the kernel wrote in place), shifts
// nothing after it.
struct ArenaLayout {
  std::vector<uint64_t> bytes, offsets;
  std::vector<bool> in_arena;
  std::vector<int32_t> steps;
  uint64_t arena_bytes = 0;
  uint64_t lower_bound = 0;  // most bytes alive at once in the plan
};

// One buffer acquired while recording: its size and the steps at which it was acquired
// and released (`last` -1: still alive when the recording ended).
struct RecordedBuffer {
  uint64_t bytes = 0;
  int32_t first = 0, last = -1;
};

// One run's share of the pool: its counters, its executor step, and whether it holds the
// pool's recording or arena (one run at a time may; the others are served by the pool). The
// counters are atomic because a run's kernels may allocate from several threads.
struct PoolRun {
  std::atomic<int32_t> step{0};  // the executor step, for recorded lifetimes and the arena
  std::atomic<uint64_t> allocations{0}, bytes_allocated{0}, reuses{0};
  std::atomic<uint64_t> arena_served{0}, arena_missed{0};
  std::atomic<uint64_t> unplanned{0};          // requests outside the plan (OpContext::allocate)
  std::atomic<uint64_t> peak_bytes_in_use{0};  // most pool bytes in use while it ran
  bool recording = false, in_arena = false;    // set by the run's own thread only
  bool from_shapes = false;  // its arena was planned from the op contracts before it ran
};

// The shared state behind a BufferPool. Pool storages hold a reference to it and hand
// their bytes back on destruction, so buffers may outlive the pool object itself. Every
// member function may be called from any thread; `run` (when given) is the run a request
// belongs to, counted there and served from the arena or recorded only if that run holds it.
// A request that is not `planned` (a kernel's unplanned scratch, OpContext::allocate) is
// counted but never served from the arena nor recorded: it takes no place in the sequence
// of requests the arena plans.
class PoolCore : public std::enable_shared_from_this<PoolCore> {
 public:
  ~PoolCore();
  std::shared_ptr<Storage> acquire(size_t bytes, PoolRun* run = nullptr, bool planned = true);
  void release(std::byte* data, size_t capacity);
  // Frees every cached buffer not in use (and the storage blocks not in use).
  void trim();

  // The end of a run of the session (whether it succeeded or not): counts it, frees the
  // cached buffers that no run took or returned during the last `keep_runs` runs, and frees
  // the arena when no run of the last `keep_runs` used a layout as large as it (and nothing
  // lives in it; the next run that needs it allocates it at its layout's size). So under
  // changing shapes the pool holds only what recent runs used, and an arena made for one
  // large input does not stay. keep_runs 0: nothing is freed here.
  struct Sweep {
    uint64_t buffers_freed = 0, bytes_freed = 0;
    uint64_t bytes_cached = 0;    // cached buffers kept for later runs, after the sweep
    uint64_t arena_capacity = 0;  // the arena's bytes after the sweep
  };
  Sweep end_run();
  void set_keep_runs(uint32_t runs);
  // Makes a uniquely owned heap storage a pool buffer: when it is released it serves later
  // requests instead of being freed. False (and nothing changes) for other kinds.
  bool adopt(Storage& s);

  // Records the lifetime of every buffer `run` acquires until end_recording(), and of `held`
  // (pool buffers acquired earlier, the run's graph inputs: data and requested bytes),
  // which come first in the recording, alive from the run's current step. False (nothing
  // recorded) while another run records.
  bool begin_recording(PoolRun& run,
                       const std::vector<std::pair<const std::byte*, uint64_t>>& held = {});
  std::vector<RecordedBuffer> end_recording(PoolRun& run);
  // Serves the run's requests, in order, from one arena laid out by `layout`. A request
  // larger than its planned size, or whose planned range overlaps a live arena buffer (the
  // run diverged from the recorded one), is served by the pool instead. Requests are matched
  // with the layout from index `first` on (the ones before are graph inputs, placed by
  // acquire_arena_input). Only `run`'s requests are served from it. False when the arena
  // cannot be used now: another run is in it, or it must grow while buffers still live in it.
  bool begin_arena(PoolRun& run, std::shared_ptr<const ArenaLayout> layout, size_t first = 0);
  void end_arena(PoolRun& run);
  // A buffer at the place of entry `index` of `layout`, before the run starts (a graph
  // input). Null when the entry does not take `bytes` there or its range is in use.
  // Null too while a run is in the arena. `counts` (when given) counts a growth of the arena.
  std::shared_ptr<Storage> acquire_arena_input(const std::shared_ptr<const ArenaLayout>& layout,
                                               size_t index, size_t bytes,
                                               PoolRun* counts = nullptr);

  // The room of one pool Storage with its shared_ptr counts. Every storage the pool makes
  // takes one, and a block whose storage has no handle left (strong or weak) serves the next,
  // so a warm run makes no heap allocation per tensor. A block returns only once nothing can
  // observe its storage any more: use counts, and with them in-place decisions, never see
  // a recycled one.
  static constexpr size_t kStorageBlockBytes = 128;
  void* take_storage_block();
  void give_storage_block(void* block) noexcept;

  // Pool totals over all runs.

  std::atomic<uint64_t> arena_served{0};
  std::atomic<uint64_t> arena_missed{0};

  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> bytes_allocated{0};
  std::atomic<uint64_t> reuses{0};
  std::atomic<uint64_t> bytes_in_use{0};
  std::atomic<uint64_t> peak_bytes_in_use{0};
  std::atomic<uint64_t> bytes_cached{0};
  uint64_t memory_limit = 0;  // SessionOptions::memory_limit (0: none)

 private:
  std::shared_ptr<Storage> make_storage(std::byte* data, size_t capacity, PoolRun* run);
  std::byte* acquire_from_arena(size_t bytes, size_t& capacity, bool& missed);
  std::byte* place_in_arena(const ArenaLayout& l, size_t index, size_t bytes, size_t& capacity);
  bool reserve_arena(uint64_t bytes, PoolRun* run);

  std::mutex mutex_;
  // A cached buffer, stamped with the number of runs ended when it was returned.
  struct Cached {
    size_t capacity;
    std::byte* data;
    uint64_t returned_at;
  };
  // Sorted vectors rather than node-based maps: after warm-up, taking and returning a buffer
  // allocates nothing. Cached buffers of one capacity keep the order they were returned in.
  std::vector<Cached> free_;  // by capacity
  uint64_t runs_ended_ = 0;
  uint32_t keep_runs_ = 0;
  // The largest layout each of the last keep_runs_ runs placed in the arena (a ring indexed
  // by runs_ended_ at the time).
  std::vector<uint64_t> arena_used_;
  void note_arena_use(uint64_t bytes);
  std::byte* allocate_block(size_t bytes);
  void free_block(std::byte* data);
  // The blocks that are mappings of their own, with their lengths, by address.
  std::vector<std::pair<std::byte*, size_t>> mapped_;
  void sweep_locked(Sweep& sweep);
  PoolRun* recorder_ = nullptr;  // the run recording, if any
  std::vector<RecordedBuffer> recorded_;
  std::map<const std::byte*, size_t> recorded_live_;  // buffer -> index in recorded_
  std::shared_ptr<const ArenaLayout> layout_;
  PoolRun* arena_run_ = nullptr;  // the run in the arena, if any
  size_t arena_next_ = 0;
  std::byte* arena_ = nullptr;
  size_t arena_capacity_ = 0;
  // (offset, end) of the live arena buffers, by offset.
  std::vector<std::pair<uint64_t, uint64_t>> arena_live_;

  // Storage blocks not in use, linked through their own bytes (so keeping one allocates
  // nothing). A lock of their own: a block is taken and given back beside, not inside, the
  // buffer's own turn with mutex_.
  struct FreeBlock {
    FreeBlock* next;
  };
  std::mutex blocks_mutex_;
  FreeBlock* free_blocks_ = nullptr;
  void free_storage_blocks();
};

}  // namespace detail

// Rounds a request up to its size class: multiples of 64 bytes below 1 KiB, then four
// classes per power of two, so a buffer serves requests up to ~19% smaller than itself.
size_t pool_size_class(size_t bytes);

class BufferPool {
 public:
  BufferPool();
  std::shared_ptr<Storage> acquire(size_t bytes, detail::PoolRun* run = nullptr,
                                   bool planned = true) {
    return core_->acquire(bytes, run, planned);
  }
  detail::PoolCore& core() { return *core_; }
  void trim() { core_->trim(); }

 private:
  std::shared_ptr<detail::PoolCore> core_;
};

}  // namespace kiln
