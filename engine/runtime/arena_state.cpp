#include "engine/runtime/arena_state.h"

#include <charconv>

#include "engine/plan/memory_plan.h"

namespace kiln::detail {

ArenaRun::~ArenaRun() {
  if (counts.recording) pool_.end_recording(counts);
  if (counts.in_arena) pool_.end_arena(counts);
}

ArenaState::ArenaState(BufferPool& pool, Options options, Predict predict)
    : pool_(pool), options_(options), predict_(std::move(predict)) {}

std::shared_ptr<const ArenaLayout> ArenaState::layout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_;
}

// Called with `mutex_` held.
void ArenaState::open_cycle() {
  if (cycle_open_) return;
  cycle_open_ = true;
  allocated_.clear();
  allocated_match_ = true;
  cycle_counts_.allocations = 0;
  cycle_counts_.bytes_allocated = 0;
  cycle_counts_.reuses = 0;
}

std::shared_ptr<Storage> ArenaState::allocate_input(const std::string& name, const std::string& key,
                                                    uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  open_cycle();
  const size_t position = allocated_.size();
  std::shared_ptr<Storage> storage;
  if (options_.inputs_in_arena && options_.enabled && arena_) {
    // The layout's entry `position` is meant for this input only if every allocation of
    // the cycle so far repeated the planned run's.
    allocated_match_ =
        allocated_match_ && position < arena_inputs_.size() && arena_inputs_[position] == key;
    if (allocated_match_) {
      storage = pool_.core().acquire_arena_input(arena_, position, bytes, &cycle_counts_);
    }
  }
  const uint64_t arena_bytes = storage ? storage->capacity() : 0;
  if (!storage) storage = pool_.acquire(bytes, &cycle_counts_);
  allocated_.push_back({name, key, storage, bytes, arena_bytes});
  return storage;
}

void ArenaState::take_inputs(ArenaRun& run) {
  std::lock_guard<std::mutex> lock(mutex_);
  open_cycle();
  cycle_open_ = false;
  run.allocated_ = std::move(allocated_);
  allocated_.clear();
  run.counts.allocations = cycle_counts_.allocations.load();
  run.counts.bytes_allocated = cycle_counts_.bytes_allocated.load();
  run.counts.reuses = cycle_counts_.reuses.load();
}

// Plans the arena from the buffers of a run (recorded, or predicted from shapes); the first
// `input_keys.size()` of them are the graph inputs with those keys. Called with `mutex_` held.
void ArenaState::plan(const std::vector<RecordedBuffer>& recorded, std::string signature,
                      std::string shapes, std::vector<std::string> input_keys) {
  std::vector<plan::BufferLifetime> lifetimes;
  std::vector<size_t> index;
  for (size_t i = 0; i < recorded.size(); ++i) {
    // Outlived the run, or empty (an empty range could not be told from a buffer at the same
    // offset when released): stays in the pool.
    if (recorded[i].last < 0 || recorded[i].bytes == 0) continue;
    lifetimes.push_back({recorded[i].bytes, recorded[i].first, recorded[i].last});
    index.push_back(i);
  }
  const plan::MemoryPlan mp = plan::plan_memory(lifetimes);
  auto layout = std::make_shared<ArenaLayout>();
  layout->bytes.resize(recorded.size());
  layout->offsets.resize(recorded.size());
  layout->in_arena.assign(recorded.size(), false);
  for (const RecordedBuffer& b : recorded) layout->steps.push_back(b.first);
  for (size_t k = 0; k < index.size(); ++k) {
    layout->bytes[index[k]] = (lifetimes[k].bytes + 63) / 64 * 64;
    layout->offsets[index[k]] = mp.offsets[k];
    layout->in_arena[index[k]] = true;
  }
  layout->arena_bytes = mp.arena_bytes;
  layout->lower_bound = mp.lower_bound;
  arena_ = std::move(layout);
  arena_signature_ = std::move(signature);
  arena_shapes_ = std::move(shapes);
  arena_inputs_ = std::move(input_keys);
}

// Plans the arena for a run before it starts, from the buffers predicted for its input
// shapes (and the values of inputs the prediction read). False when some buffer cannot be
// known before the run. Called with `mutex_` held.
bool ArenaState::plan_from_shapes(const std::vector<Value>& inputs, const std::string& shapes) {
  if (!predict_ || shapes == shapes_not_planned_) return false;
  std::optional<Predicted> predicted = predict_(inputs);
  if (!predicted) {
    shapes_not_planned_ = shapes;
    return false;
  }
  // A plan made with input values is not for every run with these shapes: its signature
  // matches none, so only this run uses it (and the layout recorded from it replaces it).
  const std::string signature =
      predicted->values.empty() ? shapes + "|" : shapes + "|values " + predicted->values;
  plan(predicted->buffers, signature, shapes, {});
  return true;
}

// inputs_in_arena: the allocated inputs the run owns (given by move under their own name),
// in allocation order. Only they may join the recorded lifetimes.
void ArenaState::find_held_inputs(ArenaRun& run, const std::vector<Value>& inputs,
                                  const std::vector<std::string>& names) const {
  run.held_.assign(run.allocated_.size(), false);
  if (!options_.enabled || !options_.inputs_in_arena) return;
  for (size_t j = 0; j < run.allocated_.size(); ++j) {
    const AllocatedInput& a = run.allocated_[j];
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (names[i] != a.name || !inputs[i].is_tensor()) continue;
      const std::shared_ptr<Storage>& st = inputs[i].tensor().storage();
      const bool same = !a.storage.owner_before(st) && !st.owner_before(a.storage);
      if (same && st && st.use_count() == 1) {
        run.held_[j] = true;
        run.held_buffers_.push_back({st->data(), a.bytes});
        run.held_keys_.push_back(a.key);
      }
    }
  }
}

// Uses, records or plans the arena for `run`; returns how many of the layout's first entries
// are graph inputs when it uses one. Called with `mutex_` held.
size_t ArenaState::start(ArenaRun& run, const std::vector<Value>& inputs) {
  PoolCore& pool = pool_.core();
  fresh_runs_ = run.signature_ == last_signature_ ? 0 : fresh_runs_ + 1;
  // Inputs are alive from before the first step (counts.step is 0).
  if (arena_ && run.signature_ == arena_signature_) {
    if (pool.begin_arena(run.counts, arena_, arena_inputs_.size())) run.used_ = arena_;
  } else if (run.held_keys_.empty() && fresh_runs_ <= kMaxFreshPlans &&
             plan_from_shapes(inputs, run.shapes_)) {
    if (pool.begin_arena(run.counts, arena_, 0)) {
      run.used_ = arena_;
      run.from_shapes_ = run.counts.from_shapes = true;
    }
    pool.begin_recording(run.counts);
  } else if (run.signature_ == last_signature_) {
    pool.begin_recording(run.counts, run.held_buffers_);
  } else if (arena_ && run.shapes_ == arena_shapes_) {
    // Planned for other inputs from allocate_input: the intermediates may still use it.
    if (pool.begin_arena(run.counts, arena_, arena_inputs_.size())) run.used_ = arena_;
  }
  return run.used_ ? arena_inputs_.size() : 0;
}

namespace {

// Appends what identifies `v` in a signature: a tensor's element type and shape as
// Tensor::describe writes them ("float32[1,6,3,64];"), without a temporary string.
void append_key(std::string& s, const Value& v) {
  if (!v.defined()) {
    s += "-;";
    return;
  }
  if (!v.is_tensor()) {
    s += v.describe();
    s += ';';
    return;
  }
  const Tensor& t = v.tensor();
  s += data_type_name(t.dtype());
  s += '[';
  char digits[24];
  for (size_t i = 0; i < t.rank(); ++i) {
    if (i) s += ',';
    const auto r = std::to_chars(digits, digits + sizeof(digits), t.dim(i));
    s.append(digits, r.ptr);
  }
  s += "];";
}

}  // namespace

void ArenaState::begin(ArenaRun& run, const std::vector<Value>& inputs,
                       const std::vector<std::string>& names, RunStats& stats) {
  run.counts.peak_bytes_in_use = pool_.core().bytes_in_use.load();
  find_held_inputs(run, inputs, names);
  size_t arena_inputs = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (options_.enabled) {
      // Written into the spare buffers, which keep their capacity from run to run.
      run.shapes_.swap(spare_shapes_);
      run.signature_.swap(spare_signature_);
      run.shapes_.clear();
      run.signature_.clear();
      for (const Value& v : inputs) append_key(run.shapes_, v);
      run.signature_ += run.shapes_;
      run.signature_ += '|';
      for (const std::string& k : run.held_keys_) run.signature_ += k;
      arena_inputs = start(run, inputs);
    }
  }
  run.recording_ = run.counts.recording;
  for (size_t j = 0; j < run.allocated_.size(); ++j) {
    if (run.held_[j] && run.allocated_[j].arena_bytes > 0) {
      ++stats.arena_served;
      stats.arena_input_bytes += run.allocated_[j].arena_bytes;
    }
  }
  if (!run.used_) return;
  // Planned inputs not in their place: made otherwise, not given by move, or diverging.
  for (size_t j = 0; j < arena_inputs; ++j) {
    const bool placed =
        j < run.allocated_.size() && run.held_[j] && run.allocated_[j].arena_bytes > 0;
    if (run.used_->in_arena[j] && !placed) ++stats.arena_missed;
  }
}

void ArenaState::end(ArenaRun& run, RunStats& stats) {
  PoolCore& pool = pool_.core();
  if (run.recording_) run.recorded_ = pool.end_recording(run.counts);
  if (run.used_) pool.end_arena(run.counts);
  stats.arena_from_shapes = run.from_shapes_;
  stats.arena_served += run.counts.arena_served;
  stats.arena_missed += run.counts.arena_missed;
  stats.allocations = run.counts.allocations;
  stats.bytes_allocated = run.counts.bytes_allocated;
  stats.pool_reuses = run.counts.reuses;
  stats.unplanned_scratch = run.counts.unplanned;
  stats.peak_bytes_in_use = run.counts.peak_bytes_in_use;
}

void ArenaState::finish(ArenaRun& run, RunStats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (run.recording_) plan(run.recorded_, run.signature_, run.shapes_, std::move(run.held_keys_));
  if (options_.enabled) {
    // The run's signature becomes the last one; the buffers it replaces serve the next run.
    last_signature_.swap(run.signature_);
    spare_signature_.swap(run.signature_);
    spare_shapes_.swap(run.shapes_);
  }
  // The layout this run used, or the one it recorded.
  const ArenaLayout* layout = run.used_ ? run.used_.get() : run.recording_ ? arena_.get() : nullptr;
  if (layout) {
    stats.arena_bytes = layout->arena_bytes;
    stats.arena_lower_bound = layout->lower_bound;
  }
}

}  // namespace kiln::detail
