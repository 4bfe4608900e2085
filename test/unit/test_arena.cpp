// The activation arena and input-buffer reuse, with exact counters: the layout planned from a
// recorded run, runs served from it, a run that diverges from the recording staying correct,
// and dead graph inputs serving later buffers.
#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr int64_t kN = 256;  // 1 KiB of float32

Session session_with(std::shared_ptr<ir::Graph> g, bool arena, bool reuse_inputs) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.memory_arena = arena;
  so.reuse_input_buffers = reuse_inputs;
  return session_from_model(make_model(std::move(g)), so);
}

// a = x*x, b = a*a, c = b*b, y = c+c: each product reads its input twice, so nothing runs
// in place; a and c never live at the same time.
std::shared_ptr<ir::Graph> chain() {
  GraphBuilder b;
  b.input("x", DataType::Float, {kN});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Mul", {"a", "a"}, {"b"});
  b.node("Mul", {"b", "b"}, {"c"});
  b.node("Add", {"c", "c"}, {"y"});
  b.output("y");
  return b.build();
}

std::vector<float> expected_chain(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float a = x[i] * x[i], b = a * a, c = b * b;
    y[i] = c + c;
  }
  return y;
}

}  // namespace

TEST_CASE("the arena is planned from a repeated run and serves the runs after it", "[arena]") {
  Session s = session_with(chain(), true, false);
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i)
    x[static_cast<size_t>(i)] = 0.5f + 0.001f * static_cast<float>(i);
  const Tensor input = Tensor::from_vector<float>({kN}, x);
  const auto want = expected_chain(x);

  auto out = s.run({{"x", input}});  // first run with these shapes: nothing recorded
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  CHECK(s.last_run_stats().arena_bytes == 0);

  out = s.run({{"x", input}});  // same shapes again: recorded and planned
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  CHECK(s.last_run_stats().arena_bytes == 2048);  // a and c share an offset
  CHECK(s.last_run_stats().arena_lower_bound == 2048);
  CHECK(s.last_run_stats().arena_served == 0);

  out = s.run({{"x", input}});  // served from the arena; y (an output) from the pool
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  CHECK(s.last_run_stats().arena_served == 3);
  CHECK(s.last_run_stats().arena_missed == 0);
  CHECK(s.last_run_stats().arena_bytes == 2048);

  const Tensor held = out[0].value.tensor();  // the caller keeps an output alive
  out = s.run({{"x", input}});
  CHECK(s.last_run_stats().allocations == 0);  // y from a buffer of an earlier run
  CHECK(s.last_run_stats().arena_missed == 0);
  CHECK(s.last_run_stats().arena_served == 3);
  CHECK(held.to_vector<float>() == want);
  CHECK(out[0].value.tensor().to_vector<float>() == want);

  // Other data with the same shapes: the same plan applies.
  const Tensor other = Tensor::from_vector<float>({kN}, std::vector<float>(kN, 1.0f));
  out = s.run({{"x", other}});
  CHECK(s.last_run_stats().arena_served == 3);  // same shapes, so the same plan applies
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>(kN, 2.0f));
}

TEST_CASE("a run that diverges from the recorded one stays correct", "[arena]") {
  // y = If(cond, then: (x*x)*(x*x) through two buffers, else: x+x): the same input shapes
  // lead to different buffers depending on the data.
  GraphBuilder then_b("big");
  then_b.node("Mul", {"x", "x"}, {"t1"});
  then_b.node("Concat", {"t1", "t1", "t1"}, {"t2"}, {int_attr("axis", 0)});
  then_b.node("ReduceSum", {"t2"}, {"t3"}, {int_attr("keepdims", 1)});
  then_b.node("Add", {"t1", "t3"}, {"r"});
  then_b.output("r");
  GraphBuilder else_b("small");
  else_b.node("Add", {"x", "x"}, {"r2"});
  else_b.output("r2");
  GraphBuilder m;
  m.input("x", DataType::Float, {kN});
  m.input("cond", DataType::Bool, {1});
  m.node("Neg", {"x"}, {"nx"});
  m.node("Neg", {"nx"}, {"px"});
  m.node("If", {"cond"}, {"y"},
         {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
  m.node("Mul", {"y", "px"}, {"z"});
  m.output("z");
  Session s = session_with(m.build(), true, false);
  const std::vector<float> x(kN, 2.0f);
  auto run = [&](bool cond) {
    auto out = s.run({{"x", Tensor::from_vector<float>({kN}, x)},
                      {"cond", Tensor::from_vector<bool>({1}, {cond})}});
    return out[0].value.tensor().to_vector<float>();
  };
  const std::vector<float> then_want(kN, (4.0f + 3.0f * 4.0f * kN) * 2.0f);
  const std::vector<float> else_want(kN, 8.0f);
  CHECK(run(false) == else_want);
  CHECK(run(false) == else_want);  // recorded
  CHECK(run(true) == then_want);   // diverges: bigger and more buffers than planned
  CHECK(s.last_run_stats().arena_missed > 0);
  CHECK(run(false) == else_want);
  CHECK(s.last_run_stats().arena_missed == 0);
  CHECK(run(true) == then_want);
}

TEST_CASE("graph inputs passed by move serve later buffers once dead, when asked",
          "[arena][inputs]") {
  // a = x*x reads x for the last time; b = a*a then needs a buffer of x's size.
  GraphBuilder g;
  g.input("x", DataType::Float, {kN});
  g.node("Mul", {"x", "x"}, {"a"});
  g.node("Mul", {"a", "a"}, {"b"});
  g.output("b");
  const std::vector<float> x(kN, 3.0f), want(kN, 81.0f);
  for (bool reuse : {false, true}) {
    INFO("reuse_input_buffers " << reuse);
    Session s = session_with(g.build(), false, reuse);
    Tensor moved = Tensor::from_vector<float>({kN}, x);
    const std::byte* input_bytes = moved.raw_data();
    auto out = s.run({{"x", std::move(moved)}});
    CHECK(out[0].value.tensor().to_vector<float>() == want);
    CHECK(s.last_run_stats().allocations == (reuse ? 1u : 2u));
    if (reuse) CHECK(out[0].value.tensor().raw_data() == input_bytes);

    const Tensor kept = Tensor::from_vector<float>({kN}, x);  // by copy: never reused
    Session fresh = session_with(g.build(), false, reuse);
    out = fresh.run({{"x", kept}});
    CHECK(fresh.last_run_stats().allocations == 2);
    CHECK(kept.to_vector<float>() == x);
  }
}
