// Liveness-based placement of buffers in one arena, greedy by size and first fit: the
// largest buffers are placed first, each at the lowest offset where it overlaps no
// already-placed buffer that is alive at the same time. (XNNPACK's planner,
// src/memory-planner.c, also places the largest first but is best fit: it takes the
// smallest gap that holds the buffer, else the end of the live blocks.)
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::plan {

struct BufferLifetime {
  uint64_t bytes = 0;
  int32_t first = 0;  // first step at which the buffer is alive (written)
  int32_t last = 0;   // last step at which it is alive (read); first <= last
};

struct MemoryPlan {
  std::vector<uint64_t> offsets;  // per buffer, in bytes, multiples of `alignment`
  uint64_t arena_bytes = 0;       // size of the arena the offsets fit in
  uint64_t lower_bound = 0;       // most bytes alive at any one step: no plan can be smaller
};

// Every buffer's size is rounded up to `alignment` (a power of two).
MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers, uint64_t alignment = 64);

}  // namespace kiln::plan
