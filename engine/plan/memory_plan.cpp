#include "engine/plan/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace kiln::plan {

MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers, uint64_t alignment) {
  const size_t n = buffers.size();
  MemoryPlan plan;
  plan.offsets.assign(n, 0);
  std::vector<uint64_t> size(n);
  for (size_t i = 0; i < n; ++i)
    size[i] = (buffers[i].bytes + alignment - 1) / alignment * alignment;

  // Lower bound: the largest sum of sizes alive at one step.
  std::vector<std::pair<int32_t, int64_t>> events;  // (step, +size at first / -size after last)
  for (size_t i = 0; i < n; ++i) {
    events.push_back({buffers[i].first, static_cast<int64_t>(size[i])});
    events.push_back({buffers[i].last + 1, -static_cast<int64_t>(size[i])});
  }
  std::sort(events.begin(), events.end());  // frees (negative) sort before allocations at a step
  int64_t live = 0;
  for (const auto& [step, delta] : events) {
    live += delta;
    plan.lower_bound = std::max(plan.lower_bound, static_cast<uint64_t>(live));
  }

  // Largest first (ties: earlier first use, then index, for a deterministic plan).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (size[a] != size[b]) return size[a] > size[b];
    return buffers[a].first < buffers[b].first;
  });
  std::vector<size_t> placed;
  for (size_t i : order) {
    // Intervals taken, during i's lifetime, by buffers already placed.
    std::vector<std::pair<uint64_t, uint64_t>> taken;
    for (size_t j : placed) {
      if (buffers[j].first <= buffers[i].last && buffers[i].first <= buffers[j].last) {
        taken.push_back({plan.offsets[j], plan.offsets[j] + size[j]});
      }
    }
    std::sort(taken.begin(), taken.end());
    // The lowest gap that fits.
    uint64_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= offset + size[i]) break;
      offset = std::max(offset, end);
    }
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size[i]);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace kiln::plan
