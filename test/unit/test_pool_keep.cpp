// The pool's end-of-run sweep (SessionOptions::pool_keep_runs), with exact counters: a cached
// buffer that no run took or returned during the last N runs is freed, one in use every run
// never is, the arena goes when no recent run used a layout as large, and a session that
// saw one large input holds, N runs later, only what its recent runs used.
#include "engine/runtime/buffer_pool.h"
#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::detail;
using namespace kiln::testing;

namespace {

constexpr uint64_t kKiB = 1024;

std::shared_ptr<const ArenaLayout> layout_of(uint64_t bytes) {
  auto l = std::make_shared<ArenaLayout>();
  l->bytes = {bytes};
  l->offsets = {0};
  l->in_arena = {true};
  l->arena_bytes = bytes;
  l->lower_bound = bytes;
  return l;
}

}  // namespace

TEST_CASE("pool sweep: a buffer no run used during the last N runs is freed", "[pool]") {
  BufferPool pool;
  PoolCore& core = pool.core();
  core.set_keep_runs(2);

  pool.acquire(kKiB).reset();  // returned during run 1
  PoolCore::Sweep s = core.end_run();
  CHECK(s.bytes_cached == kKiB);
  CHECK(s.buffers_freed == 0);
  s = core.end_run();  // run 2 did not use it: one of the last two runs returned it
  CHECK(s.bytes_cached == kKiB);
  s = core.end_run();  // neither run 2 nor run 3 took or returned it
  CHECK(s.buffers_freed == 1);
  CHECK(s.bytes_freed == kKiB);
  CHECK(s.bytes_cached == 0);
  CHECK(core.bytes_cached == 0);

  // Taken and returned every run: kept however many runs pass, and never allocated again.
  pool.acquire(4 * kKiB).reset();
  const uint64_t allocations = core.allocations;
  for (int run = 0; run < 10; ++run) {
    pool.acquire(4 * kKiB).reset();
    s = core.end_run();
    CHECK(s.buffers_freed == 0);
    CHECK(s.bytes_cached == 4 * kKiB);
  }
  CHECK(core.allocations == allocations);

  // A buffer held by the caller across runs is not cached, so never swept; once returned
  // it is kept for the next two runs.
  auto held = pool.acquire(8 * kKiB);
  for (int run = 0; run < 5; ++run) core.end_run();
  held.reset();
  s = core.end_run();
  CHECK(s.bytes_cached == 8 * kKiB);  // the 4 KiB one went two runs ago
  core.end_run();
  s = core.end_run();
  CHECK(s.bytes_cached == 0);
}

TEST_CASE("pool sweep: keep_runs 0 keeps every cached buffer", "[pool]") {
  BufferPool pool;
  PoolCore& core = pool.core();
  core.set_keep_runs(0);
  pool.acquire(kKiB).reset();
  PoolCore::Sweep s{};
  for (int run = 0; run < 100; ++run) s = core.end_run();
  CHECK(s.buffers_freed == 0);
  CHECK(s.bytes_cached == kKiB);
}

TEST_CASE("pool sweep: the arena goes when no recent run used a layout as large", "[pool]") {
  BufferPool pool;
  PoolCore& core = pool.core();
  core.set_keep_runs(2);
  const auto large = layout_of(64 * kKiB), small = layout_of(kKiB);

  PoolRun r1;
  REQUIRE(core.begin_arena(r1, large));
  core.end_arena(r1);
  PoolCore::Sweep s = core.end_run();
  CHECK(s.arena_capacity == 64 * kKiB);

  PoolRun r2;  // a smaller layout fits the arena there is
  REQUIRE(core.begin_arena(r2, small));
  core.end_arena(r2);
  s = core.end_run();
  CHECK(s.arena_capacity == 64 * kKiB);  // run 1 is one of the last two
  CHECK(r2.allocations == 0);

  PoolRun r3;
  REQUIRE(core.begin_arena(r3, small));
  core.end_arena(r3);
  s = core.end_run();  // runs 2 and 3 needed 1 KiB
  CHECK(s.arena_capacity == 0);
  CHECK(s.bytes_freed == 64 * kKiB);

  PoolRun r4;  // the next run that needs one allocates it at its layout's size
  REQUIRE(core.begin_arena(r4, small));
  CHECK(r4.allocations == 1);
  CHECK(r4.bytes_allocated == kKiB);
  core.end_arena(r4);
  CHECK(core.end_run().arena_capacity == kKiB);

  // A buffer still alive in the arena keeps it, however old.
  PoolRun r5;
  REQUIRE(core.begin_arena(r5, small));
  auto live = core.acquire(kKiB, &r5);
  core.end_arena(r5);
  for (int run = 0; run < 4; ++run) s = core.end_run();
  CHECK(s.arena_capacity == kKiB);
  live.reset();
  s = core.end_run();
  CHECK(s.arena_capacity == 0);
}

namespace {

// y = ((x*x)*(x*x)) + ... over a vector of any length: buffers proportional to n.
std::shared_ptr<ir::Graph> dynamic_chain() {
  GraphBuilder b;
  b.input("x", DataType::Float, {-1});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Mul", {"a", "a"}, {"b"});
  b.node("Add", {"b", "a"}, {"y"});
  b.output("y");
  return b.build();
}

Session dynamic_session(uint32_t keep_runs) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.pool_keep_runs = keep_runs;
  return session_from_model(make_model(dynamic_chain()), so);
}

uint64_t held_bytes(const RunStats& s) {
  return s.pool_bytes_cached + s.arena_capacity;
}

}  // namespace

TEST_CASE("a session holds only what its last N runs used, not every length it has seen",
          "[pool][arena]") {
  constexpr uint32_t kKeep = 4;
  Session s = dynamic_session(kKeep);
  const auto run_length = [&](int64_t n) {
    const auto out = s.run({{"x", Tensor::zeros(DataType::Float, {n})}});
    CHECK(out[0].value.tensor().shape() == Shape{n});
    return s.last_run_stats();
  };

  // Small runs reach a steady state.
  RunStats st{};
  for (int run = 0; run < 3 * static_cast<int>(kKeep); ++run) st = run_length(256);
  const uint64_t steady = held_bytes(st);
  CHECK(st.allocations == 0);
  CHECK(steady > 0);
  CHECK(steady < 16 * kKiB);

  // One run at a length 1024 times larger: its buffers (1 MiB each) are kept...
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  st = run_length(1 << 18);
  CHECK(held_bytes(st) >= kMiB);
  uint64_t freed = 0;
  for (uint32_t run = 1; run < kKeep; ++run) {
    st = run_length(256);
    CHECK(held_bytes(st) >= 2 * kMiB);  // its output came back after it ended, too
    CHECK(st.pool_bytes_freed == 0);    // still one of the last kKeep runs
  }
  // ... until kKeep runs have passed without them: the arena and the buffers it returned go
  // then, its output (returned when the caller dropped it, after that run's end) one run later.
  st = run_length(256);
  freed += st.pool_bytes_freed;
  CHECK(freed >= kMiB);
  CHECK(held_bytes(st) > steady);
  st = run_length(256);
  freed += st.pool_bytes_freed;
  CHECK(freed >= 2 * kMiB);
  CHECK(held_bytes(st) == steady);
  // The small runs' own buffers were never swept: what is allocated again is the arena
  // (freed at the run before, at the small layout's size now), once.
  CHECK(st.allocations == 1);
  CHECK(st.bytes_allocated == st.arena_capacity);
  st = run_length(256);
  CHECK(st.allocations == 0);
  CHECK(held_bytes(st) == steady);
}

TEST_CASE("under repeated shapes the sweep frees nothing a run needs", "[pool][arena]") {
  Session s = dynamic_session(2);
  RunStats first{};
  for (int run = 0; run < 40; ++run) {
    s.run({{"x", Tensor::zeros(DataType::Float, {1000})}});
    const RunStats& st = s.last_run_stats();
    if (run == 3) first = st;
    if (run > 3) {
      CHECK(st.allocations == 0);
      CHECK(held_bytes(st) == held_bytes(first));
    }
  }
  CHECK(s.last_run_stats().arena_served > 0);
}
