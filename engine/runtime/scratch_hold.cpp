#include "engine/runtime/scratch_hold.h"

namespace kiln {

ScratchHold::ScratchHold(std::mutex& m, std::vector<std::unique_ptr<ExecutorScratch>>& free)
    : mutex(m), free_scratch(free) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!free_scratch.empty()) {
      scratch = std::move(free_scratch.back());
      free_scratch.pop_back();
    }
  }
  if (!scratch) scratch = std::make_unique<ExecutorScratch>();
}

void ScratchHold::release() {
  if (!scratch) return;
  scratch->inputs.clear();
  scratch->results.clear();
  std::lock_guard<std::mutex> lock(mutex);
  free_scratch.push_back(std::move(scratch));
}

}  // namespace kiln
