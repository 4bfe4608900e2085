// ArenaState's transitions, driven directly with pool requests (no graph): a new signature
// runs from the pool, a repeated one is recorded, the recorded layout serves the runs after
// it, shapes predicted before a run plan it at once (and a failed prediction is not tried
// again for those shapes), a run that ends early frees the recording and the arena, one run
// at a time uses the arena, and allocate_input places the planned inputs.
#include <catch2/catch.hpp>

#include <optional>

#include "engine/runtime/arena_state.h"

using namespace kiln;
using namespace kiln::detail;

namespace {

constexpr uint64_t kBytes = 1024;

Value input_of(int64_t n) {
  return Tensor::zeros(DataType::Float, {n});
}

// One run of a graph in three steps: step 1 takes A, step 2 takes B and frees A, step 3
// frees B. The inputs are dropped at step 1, after A is taken (their last read).
RunStats run_once(ArenaState& state, BufferPool& pool, std::vector<Value> inputs) {
  ArenaRun run(pool.core());
  state.take_inputs(run);
  RunStats stats;
  state.begin(run, inputs, {"x"}, stats);
  run.counts.step = 1;
  auto a = pool.acquire(kBytes, &run.counts);
  inputs.clear();
  run.counts.step = 2;
  auto b = pool.acquire(kBytes, &run.counts);
  a.reset();
  run.counts.step = 3;
  b.reset();
  state.end(run, stats);
  state.finish(run, stats);
  return stats;
}

// A and B overlap at step 2: the planned arena holds both.
constexpr uint64_t kArena = 2 * kBytes;

}  // namespace

TEST_CASE("ArenaState: new shapes run from the pool, repeated ones are recorded, then served",
          "[arena_state]") {
  BufferPool pool;
  ArenaState state(pool, {}, nullptr);
  RunStats first = run_once(state, pool, {input_of(4)});
  CHECK(first.arena_bytes == 0);
  CHECK(first.arena_served == 0);
  CHECK(state.layout() == nullptr);

  RunStats recorded = run_once(state, pool, {input_of(4)});
  REQUIRE(state.layout() != nullptr);
  CHECK(recorded.arena_served == 0);
  CHECK(recorded.arena_bytes == kArena);
  CHECK(recorded.arena_lower_bound == kArena);
  CHECK(state.layout()->in_arena == std::vector<bool>{true, true});

  RunStats served = run_once(state, pool, {input_of(4)});
  CHECK(served.arena_served == 2);
  CHECK(served.arena_missed == 0);
  CHECK(served.arena_bytes == kArena);
  CHECK_FALSE(served.arena_from_shapes);

  // Other shapes: the pool, and the layout stays for the shapes it was planned from.
  const auto layout = state.layout();
  RunStats other = run_once(state, pool, {input_of(8)});
  CHECK(other.arena_served == 0);
  CHECK(other.arena_bytes == 0);
  CHECK(state.layout() == layout);
  CHECK(run_once(state, pool, {input_of(4)}).arena_served == 2);
}

TEST_CASE("ArenaState: predicted buffers plan the first run; a failed prediction is not retried",
          "[arena_state]") {
  BufferPool pool;
  int calls = 0;
  ArenaState state(pool, {}, [&](const std::vector<Value>& in) {
    ++calls;
    std::optional<ArenaState::Predicted> out;
    if (in[0].tensor().dim(0) == 4)
      out = ArenaState::Predicted{{{kBytes, 1, 2}, {kBytes, 2, 3}}, ""};
    return out;
  });
  RunStats first = run_once(state, pool, {input_of(4)});
  CHECK(calls == 1);
  CHECK(first.arena_from_shapes);
  CHECK(first.arena_served == 2);
  CHECK(first.arena_bytes == kArena);
  // The first run was recorded too: its exact layout serves the next, without predicting.
  RunStats second = run_once(state, pool, {input_of(4)});
  CHECK(calls == 1);
  CHECK_FALSE(second.arena_from_shapes);
  CHECK(second.arena_served == 2);

  CHECK(run_once(state, pool, {input_of(8)}).arena_served == 0);
  CHECK(calls == 2);
  // Same unpredictable shapes again: not predicted again, recorded instead (a repeat).
  RunStats repeat = run_once(state, pool, {input_of(8)});
  CHECK(calls == 2);
  CHECK(repeat.arena_bytes == kArena);
  CHECK(run_once(state, pool, {input_of(8)}).arena_served == 2);
}

TEST_CASE("ArenaState: a disabled arena never records nor serves", "[arena_state]") {
  BufferPool pool;
  ArenaState state(pool, {.enabled = false}, nullptr);
  for (int i = 0; i < 3; ++i) {
    RunStats st = run_once(state, pool, {input_of(4)});
    CHECK(st.arena_served == 0);
    CHECK(st.arena_bytes == 0);
  }
  CHECK(state.layout() == nullptr);
}

TEST_CASE("ArenaState: a run that ends early frees the recording and the arena", "[arena_state]") {
  BufferPool pool;
  ArenaState state(pool, {}, nullptr);
  run_once(state, pool, {input_of(4)});
  {
    // Begins recording (a repeat), then stops as if its kernel threw: never ended.
    ArenaRun run(pool.core());
    state.take_inputs(run);
    RunStats stats;
    state.begin(run, {input_of(4)}, {"x"}, stats);
    CHECK(run.counts.recording);
  }
  CHECK(state.layout() == nullptr);
  // The recording is free again: this repeat records and plans.
  CHECK(run_once(state, pool, {input_of(4)}).arena_bytes == kArena);
  {
    ArenaRun run(pool.core());
    state.take_inputs(run);
    RunStats stats;
    state.begin(run, {input_of(4)}, {"x"}, stats);
    CHECK(run.counts.in_arena);
  }
  CHECK(run_once(state, pool, {input_of(4)}).arena_served == 2);
}

TEST_CASE("ArenaState: one run at a time uses the arena, the other the pool", "[arena_state]") {
  BufferPool pool;
  ArenaState state(pool, {}, nullptr);
  run_once(state, pool, {input_of(4)});
  run_once(state, pool, {input_of(4)});
  ArenaRun holder(pool.core());
  state.take_inputs(holder);
  RunStats held;
  state.begin(holder, {input_of(4)}, {"x"}, held);
  CHECK(holder.counts.in_arena);
  RunStats beside = run_once(state, pool, {input_of(4)});
  CHECK(beside.arena_served == 0);
  CHECK(beside.arena_bytes == 0);
  state.end(holder, held);
  state.finish(holder, held);
  CHECK(run_once(state, pool, {input_of(4)}).arena_served == 2);
}

TEST_CASE("ArenaState: allocate_input places inputs of the planned run in the arena",
          "[arena_state]") {
  BufferPool pool;
  ArenaState state(pool, {.enabled = true, .inputs_in_arena = true}, nullptr);
  const std::string key = "x:float32[256];";
  auto run_allocated = [&] {
    std::shared_ptr<Storage> st = state.allocate_input("x", key, kBytes);
    std::vector<Value> in;
    in.emplace_back(Tensor(DataType::Float, {256}, std::move(st)));
    return run_once(state, pool, std::move(in));
  };
  CHECK(run_allocated().arena_input_bytes == 0);
  RunStats recorded = run_allocated();  // a repeat: recorded with the input first
  REQUIRE(state.layout() != nullptr);
  CHECK(state.layout()->in_arena.size() == 3);
  CHECK(recorded.arena_bytes == kArena);  // the input dies before B: B takes its place
  RunStats served = run_allocated();
  CHECK(served.arena_input_bytes == kBytes);
  CHECK(served.arena_served == 3);
  CHECK(served.arena_missed == 0);
  // Another key in the planned input's place: a pool buffer, counted as missed.
  std::shared_ptr<Storage> st = state.allocate_input("x", "x:float32[128];", kBytes / 2);
  std::vector<Value> in;
  in.emplace_back(Tensor(DataType::Float, {128}, std::move(st)));
  RunStats other = run_once(state, pool, std::move(in));
  CHECK(other.arena_input_bytes == 0);
}
