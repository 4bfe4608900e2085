// The activation arena and input-buffer reuse, with exact counters: the layout planned from
// inferred shapes before the first run, the layout planned from a recorded run, runs served
// from it, a run that diverges from the recording staying correct,
// dead graph inputs serving later buffers, and graph inputs placed in the arena.
#include "engine/runtime/session_internal.h"
#include "ops/core/kernel.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr int64_t kN = 256;  // 1 KiB of float32

// Unless `from_shapes`, arenas come from recorded runs only (the tests of that path).
Session session_with(std::shared_ptr<ir::Graph> g, bool arena, bool reuse_inputs,
                     bool inputs_in_arena = false, bool from_shapes = false) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.memory_arena = arena;
  so.reuse_input_buffers = reuse_inputs;
  so.inputs_in_arena = inputs_in_arena;
  so.arena_from_shapes = from_shapes;
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

namespace {

constexpr int64_t kM = 256 * 1024;  // 1 MiB of float32
constexpr uint64_t kMiB = 1 << 20;

// The chain above on a 1 MiB input whose first dimension is not fixed: x is read for the
// last time by the first node, so with inputs in the arena b can take x's place.
std::shared_ptr<ir::Graph> big_chain() {
  GraphBuilder b;
  b.input("x", DataType::Float, {-1});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Mul", {"a", "a"}, {"b"});
  b.node("Mul", {"b", "b"}, {"c"});
  b.node("Add", {"c", "c"}, {"y"});
  b.output("y");
  return b.build();
}

std::vector<float> ramp(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i % 64) / 256.0f;
  return x;
}

// A tensor for `name` from the session, filled with `values`.
Tensor allocated(Session& s, const std::string& name, const std::vector<float>& values) {
  Tensor t = s.allocate_input(name, DataType::Float, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

std::vector<float> output_of(std::vector<NamedValue> out) {
  return out.at(0).value.tensor().to_vector<float>();
}

}  // namespace

TEST_CASE("graph inputs from allocate_input live in the arena and their bytes are reused",
          "[arena][inputs]") {
  const std::vector<float> x = ramp(kM);
  const auto want = expected_chain(x);

  // Without the option the input stays a pool buffer beside the arena of a, b and c.
  Session off = session_with(big_chain(), true, false, false);
  for (int run = 1; run <= 4; ++run) {
    INFO("run " << run);
    CHECK(output_of(off.run({{"x", allocated(off, "x", x)}})) == want);
    CHECK(off.last_run_stats().arena_input_bytes == 0);
  }
  CHECK(off.last_run_stats().arena_bytes == 2 * kMiB);  // a and c share an offset
  CHECK(off.last_run_stats().arena_served == 3);
  CHECK(off.last_run_stats().arena_missed == 0);

  // With it, x is alive from the start of the run to the first node, then b takes its place.
  Session on = session_with(big_chain(), true, false, true);
  const std::byte* placed = nullptr;
  for (int run = 1; run <= 4; ++run) {
    INFO("run " << run);
    Tensor t = allocated(on, "x", x);
    const std::byte* bytes = t.raw_data();
    CHECK(output_of(on.run({{"x", std::move(t)}})) == want);
    const RunStats& st = on.last_run_stats();
    if (run == 1) {  // first run with these shapes: nothing recorded
      CHECK(st.arena_bytes == 0);
      CHECK(st.arena_input_bytes == 0);
    } else if (run == 2) {  // recorded with x among the lifetimes
      CHECK(st.arena_bytes == 2 * kMiB);
      CHECK(st.arena_lower_bound == 2 * kMiB);
      CHECK(st.arena_served == 0);
      CHECK(st.arena_input_bytes == 0);
    } else {  // x, a, b, c from the arena; y (an output) from the pool
      CHECK(st.arena_bytes == 2 * kMiB);
      CHECK(st.arena_lower_bound == 2 * kMiB);
      CHECK(st.arena_served == 4);
      CHECK(st.arena_missed == 0);
      CHECK(st.arena_input_bytes == kMiB);
      // Run 3 obtains the arena itself (2 MiB), run 4 nothing.
      CHECK(st.allocations == (run == 3 ? 1u : 0u));
      CHECK(st.bytes_allocated == (run == 3 ? 2 * kMiB : 0u));
      if (run == 3) placed = bytes;
      CHECK(bytes == placed);  // the same place in the same arena every run
    }
  }
  // The arena holds the input too, and is still smaller than the arena without it plus x.
  CHECK(on.last_run_stats().arena_bytes < off.last_run_stats().arena_bytes + kMiB);
}

TEST_CASE("runs whose inputs are not the planned ones stay correct", "[arena][inputs]") {
  const std::vector<float> x = ramp(kM);
  const auto want = expected_chain(x);
  Session s = session_with(big_chain(), true, false, true);
  for (int run = 1; run <= 3; ++run) CHECK(output_of(s.run({{"x", allocated(s, "x", x)}})) == want);
  REQUIRE(s.last_run_stats().arena_served == 4);
  REQUIRE(s.last_run_stats().arena_input_bytes == kMiB);

  SECTION("an allocated input passed by copy is only read, and its place is not reused") {
    const Tensor kept = allocated(s, "x", x);  // in the arena, where b was planned
    CHECK(output_of(s.run({{"x", kept}})) == want);
    CHECK(kept.to_vector<float>() == x);
    // a and c from the arena; b and the input's planned place missed.
    CHECK(s.last_run_stats().arena_served == 2);
    CHECK(s.last_run_stats().arena_missed == 2);
    CHECK(s.last_run_stats().arena_input_bytes == 0);
  }

  SECTION("inputs made otherwise: the intermediates still use the arena, then it is replanned") {
    CHECK(output_of(s.run({{"x", Tensor::from_vector<float>({kM}, x)}})) == want);
    CHECK(s.last_run_stats().arena_served == 3);
    CHECK(s.last_run_stats().arena_missed == 1);  // x's planned place
    CHECK(s.last_run_stats().arena_input_bytes == 0);
    // The same again: recorded without the input.
    CHECK(output_of(s.run({{"x", Tensor::from_vector<float>({kM}, x)}})) == want);
    CHECK(s.last_run_stats().arena_bytes == 2 * kMiB);
    CHECK(output_of(s.run({{"x", Tensor::from_vector<float>({kM}, x)}})) == want);
    CHECK(s.last_run_stats().arena_served == 3);
    CHECK(s.last_run_stats().arena_missed == 0);
    // Back to allocated inputs: served by the pool, planned again, then placed.
    for (int run = 1; run <= 3; ++run) {
      INFO("run " << run);
      CHECK(output_of(s.run({{"x", allocated(s, "x", x)}})) == want);
      CHECK(s.last_run_stats().arena_missed == 0);
      CHECK(s.last_run_stats().arena_input_bytes == (run == 3 ? kMiB : 0u));
    }
    CHECK(s.last_run_stats().arena_served == 4);
  }

  SECTION("another input shape goes to the pool, and the plan serves its shapes again after") {
    const std::vector<float> half = ramp(kM / 2);
    CHECK(output_of(s.run({{"x", allocated(s, "x", half)}})) == expected_chain(half));
    CHECK(s.last_run_stats().arena_bytes == 0);
    CHECK(s.last_run_stats().arena_served == 0);
    CHECK(s.last_run_stats().arena_missed == 0);
    CHECK(output_of(s.run({{"x", allocated(s, "x", x)}})) == want);
    CHECK(s.last_run_stats().arena_served == 4);
    CHECK(s.last_run_stats().arena_input_bytes == kMiB);
  }

  SECTION("an allocation the run does not use shifts the order: only the intermediates") {
    const Tensor unused = allocated(s, "x", x);  // takes x's planned place and keeps it
    CHECK(output_of(s.run({{"x", allocated(s, "x", x)}})) == want);
    CHECK(s.last_run_stats().arena_served == 2);  // a and c; b overlaps the unused tensor
    CHECK(s.last_run_stats().arena_missed == 2);  // b, and x (allocated second: pool)
    CHECK(unused.to_vector<float>() == x);
  }
}

TEST_CASE("inputs in the arena with several inputs, given in another number or order",
          "[arena][inputs]") {
  // z = (x*x)*(x*x)*w: x dies at the first node, w at the last.
  GraphBuilder b;
  b.input("x", DataType::Float, {kM});
  b.input("w", DataType::Float, {kM});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Mul", {"a", "a"}, {"m"});
  b.node("Mul", {"m", "w"}, {"z"});
  b.output("z");
  Session s = session_with(b.build(), true, false, true);
  const std::vector<float> x = ramp(kM), w(kM, 0.5f);
  std::vector<float> want(kM);
  for (size_t i = 0; i < want.size(); ++i) {
    const float a = x[i] * x[i];
    want[i] = a * a * w[i];
  }
  auto both = [&] {
    Tensor tx = allocated(s, "x", x), tw = allocated(s, "w", w);
    return output_of(s.run({{"x", std::move(tx)}, {"w", std::move(tw)}}));
  };
  for (int run = 1; run <= 3; ++run) CHECK(both() == want);
  REQUIRE(s.last_run_stats().arena_input_bytes == 2 * kMiB);
  REQUIRE(s.last_run_stats().arena_missed == 0);
  const uint64_t served = s.last_run_stats().arena_served;

  // Only x from allocate_input.
  {
    Tensor tx = allocated(s, "x", x);
    CHECK(output_of(s.run({{"x", std::move(tx)}, {"w", Tensor::from_vector<float>({kM}, w)}})) ==
          want);
    CHECK(s.last_run_stats().arena_input_bytes == kMiB);
    CHECK(s.last_run_stats().arena_missed == 1);  // w's place
    CHECK(s.last_run_stats().arena_served == served - 1);
  }
  // Both, allocated in the other order: neither matches the plan's first entry.
  {
    Tensor tw = allocated(s, "w", w), tx = allocated(s, "x", x);
    CHECK(output_of(s.run({{"x", std::move(tx)}, {"w", std::move(tw)}})) == want);
    CHECK(s.last_run_stats().arena_input_bytes == 0);
    CHECK(s.last_run_stats().arena_missed == 2);
  }
  CHECK(both() == want);
  CHECK(s.last_run_stats().arena_missed == 0);
  CHECK(s.last_run_stats().arena_input_bytes == 2 * kMiB);
}

TEST_CASE("an input written in place into an output stays out of the arena", "[arena][inputs]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {kN});
  b.node("Relu", {"x"}, {"y"});
  b.output("y");
  Session s = session_with(b.build(), true, false, true);
  const std::vector<float> x(kN, -1.0f), want(kN, 0.0f);
  for (int run = 1; run <= 4; ++run) {
    INFO("run " << run);
    Tensor t = allocated(s, "x", x);
    const std::byte* bytes = t.raw_data();
    auto out = s.run({{"x", std::move(t)}});
    CHECK(out[0].value.tensor().to_vector<float>() == want);
    CHECK(out[0].value.tensor().raw_data() == bytes);  // Relu wrote into the input
    CHECK(s.last_run_stats().arena_bytes == 0);
    CHECK(s.last_run_stats().arena_missed == 0);
    CHECK(s.last_run_stats().arena_input_bytes == 0);
  }
}

TEST_CASE("allocate_input checks the name, element type and declared shape", "[arena][inputs]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {2, -1});
  b.node("Relu", {"x"}, {"y"});
  b.output("y");
  Session s = session_with(b.build(), true, false, true);
  auto error = [&](const std::string& name, DataType dtype, const Shape& shape) -> std::string {
    try {
      s.allocate_input(name, dtype, shape);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::InvalidArgument);
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error("nope", DataType::Float, {2, 3}), Catch::Contains("not a graph input"));
  CHECK_THAT(error("y", DataType::Float, {2, 3}), Catch::Contains("not a graph input"));
  CHECK_THAT(error("x", DataType::Int64, {2, 3}), Catch::Contains("element type int64"));
  CHECK_THAT(error("x", DataType::Float, {2}), Catch::Contains("rank 1"));
  CHECK_THAT(error("x", DataType::Float, {3, 3}), Catch::Contains("dimension 0 is 3"));
  Tensor t = s.allocate_input("x", DataType::Float, {2, 5});  // any size where not fixed
  CHECK(t.shape() == Shape{2, 5});
  std::fill_n(t.data<float>(), 10, 2.0f);
  auto out = s.run({{"x", std::move(t)}});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>(10, 2.0f));
}

TEST_CASE("empty inputs and intermediates stay out of the arena", "[arena][inputs]") {
  Session s = session_with(big_chain(), true, false, true);
  for (int run = 1; run <= 4; ++run) {
    INFO("run " << run);
    Tensor t = s.allocate_input("x", DataType::Float, {0});
    auto out = s.run({{"x", std::move(t)}});
    CHECK(out[0].value.tensor().numel() == 0);
    CHECK(s.last_run_stats().arena_bytes == 0);
    CHECK(s.last_run_stats().arena_served == 0);
    CHECK(s.last_run_stats().arena_missed == 0);
    CHECK(s.last_run_stats().arena_input_bytes == 0);
  }
  // The 1 MiB input after them: planned and placed as usual.
  const std::vector<float> x = ramp(kM);
  for (int run = 1; run <= 3; ++run) {
    CHECK(output_of(s.run({{"x", allocated(s, "x", x)}})) == expected_chain(x));
  }
  CHECK(s.last_run_stats().arena_served == 4);
  CHECK(s.last_run_stats().arena_input_bytes == kMiB);
}

TEST_CASE("the arena is planned from inferred shapes before the first run", "[arena][shapes]") {
  Session s = session_with(chain(), true, false, false, true);
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 7);
  const Tensor input = Tensor::from_vector<float>({kN}, x);
  const auto want = expected_chain(x);

  auto out = s.run({{"x", input}});  // the first run with these shapes is served already
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  const RunStats first = s.last_run_stats();
  CHECK(first.arena_from_shapes);
  CHECK(first.arena_bytes == 2048);  // a and c share an offset, as in the recorded plan
  CHECK(first.arena_lower_bound == 2048);
  CHECK(first.arena_served == 3);
  CHECK(first.arena_missed == 0);
  CHECK(first.allocations == 2);  // the arena and y

  out = s.run({{"x", input}});  // the layout recorded in the first run serves the others
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  CHECK_FALSE(s.last_run_stats().arena_from_shapes);
  CHECK(s.last_run_stats().arena_bytes == 2048);
  CHECK(s.last_run_stats().arena_served == 3);
  CHECK(s.last_run_stats().allocations == 1);  // y, while the caller still holds the first
  out.clear();
  out = s.run({{"x", input}});
  CHECK(s.last_run_stats().allocations == 0);
}

TEST_CASE("planning from shapes follows views and in-place writes", "[arena][shapes]") {
  // a = x*x                  A (1 KiB), alive from step 1
  // r = Reshape(a, [16,16])  a view of A
  // b = Relu(r)              in place: r owns A alone and is read for the last time
  // c = b*b                  C (1 KiB); b is read twice, so not in place; A dies here
  // d = Sigmoid(c)           in place in C
  // e = d + x                in place in C (x is the caller's, never written)
  // y = e*e                  the output, from the pool
  // A lives over steps 1-4 and C over 4-7, so they overlap: 2 KiB, the lower bound.
  GraphBuilder b;
  b.input("x", DataType::Float, {kN});
  b.initializer("shape", Tensor::from_vector<int64_t>({2}, {16, 16}));
  b.initializer("flat", Tensor::from_vector<int64_t>({1}, {kN}));
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Reshape", {"a", "shape"}, {"r"});
  b.node("Relu", {"r"}, {"b"});
  b.node("Mul", {"b", "b"}, {"c"});
  b.node("Sigmoid", {"c"}, {"d"});
  b.node("Reshape", {"d", "flat"}, {"d2"});
  b.node("Add", {"d2", "x"}, {"e"});
  b.node("Mul", {"e", "e"}, {"y"});
  b.output("y");
  Session s = session_with(b.build(), true, false, false, true);
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i - 128);
  // In double: sigmoid(c) + x cancels where x is near -0.5, so a float reference would differ
  // from the kernel's float sigmoid by more than its few ulp; the margin covers those ulp.
  std::vector<double> want(kN);
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = std::max(double(x[i]) * x[i], 0.0), c = a * a;
    const double e = 1.0 / (1.0 + std::exp(-c)) + x[i];
    want[i] = e * e;
  }
  auto out = s.run({{"x", Tensor::from_vector<float>({kN}, x)}});
  const std::vector<float> got = out[0].value.tensor().to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i] == Approx(want[i]).epsilon(1e-6).margin(1e-7));
  }
  const RunStats first = s.last_run_stats();
  CHECK(first.arena_from_shapes);
  CHECK(first.in_place_ops == 3);
  CHECK(first.arena_bytes == 2048);
  CHECK(first.arena_lower_bound == 2048);
  CHECK(first.arena_served == 2);
  CHECK(first.arena_missed == 0);
  s.run({{"x", Tensor::from_vector<float>({kN}, x)}});
  CHECK(s.last_run_stats().arena_bytes == first.arena_bytes);  // the recorded plan agrees
  CHECK(s.last_run_stats().arena_served == 2);
}

TEST_CASE("shapes computed by the graph (Shape, Gather, Concat, Reshape) plan every new length",
          "[arena][shapes]") {
  // a = x*x (n x 64 floats), s = Shape(a), g = Gather(s, 0), u = Unsqueeze(g),
  // t = Concat(u, [8, 8]) appended in place (G's 64 bytes have room for 3 values),
  // r = Reshape(a, t), z = Softmax(r) in place, y = z*z.
  // Buffers: A (256n bytes, steps 1-8), S (16 bytes, 2-3), G (8 bytes, 3-6): the two small
  // ones take 64 bytes each and overlap at step 3, so the arena is 256n + 128.
  GraphBuilder b;
  b.input("x", DataType::Float, {-1, 64});
  b.initializer("zero", Tensor::from_vector<int64_t>({}, {0}));
  b.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
  b.initializer("eights", Tensor::from_vector<int64_t>({2}, {8, 8}));
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Shape", {"a"}, {"s"});
  b.node("Gather", {"s", "zero"}, {"g"});
  b.node("Unsqueeze", {"g", "axes"}, {"u"});
  b.node("Concat", {"u", "eights"}, {"t"}, {int_attr("axis", 0)});
  b.node("Reshape", {"a", "t"}, {"r"});
  b.node("Softmax", {"r"}, {"z"}, {int_attr("axis", -1)});
  b.node("Mul", {"z", "z"}, {"y"});
  b.output("y");
  Session s = session_with(b.build(), true, false, false, true);
  // Each length is new to the run before it: the first two such runs in a row are planned
  // from shapes, the third (length 4) is left to the pool, as a decode loop's growing shapes
  // would be; the same length again is planned.
  const int64_t lengths[] = {2, 3, 4, 4};
  for (int run = 0; run < 4; ++run) {
    const int64_t n = lengths[run];
    INFO("run " << run << ", n = " << n);
    const Tensor x = Tensor::from_vector<float>({n, 64}, std::vector<float>(n * 64, 1.0f));
    auto out = s.run({{"x", x}});
    CHECK(out[0].value.tensor().shape() == Shape{n, 8, 8});
    // Softmax over 8 equal values is 1/8 everywhere.
    CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>(n * 64, 1.0f / 64));
    const RunStats& st = s.last_run_stats();
    CHECK(st.in_place_ops == 2);  // Concat and Softmax
    if (run == 2) {
      CHECK_FALSE(st.arena_from_shapes);
      CHECK(st.arena_bytes == 0);
      continue;
    }
    CHECK(st.arena_from_shapes);
    CHECK(st.arena_bytes == static_cast<uint64_t>(256 * n + 128));
    CHECK(st.arena_lower_bound == static_cast<uint64_t>(256 * n + 128));
    CHECK(st.arena_served == 3);
    CHECK(st.arena_missed == 0);
  }
}

TEST_CASE("a Reshape target given as an input is planned from its values", "[arena][shapes]") {
  // The target's shape does not fix y's shape, its values do: the plan reads them (they are
  // known when the run starts) after shapes alone could not give it.
  GraphBuilder b;
  b.input("x", DataType::Float, {kN});
  b.input("target", DataType::Int64, {2});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("Reshape", {"a", "target"}, {"r"});
  b.node("Mul", {"r", "r"}, {"c"});
  b.node("Mul", {"c", "c"}, {"y"});
  b.output("y");
  Session s = session_with(b.build(), true, false, false, true);
  const Tensor x = Tensor::from_vector<float>({kN}, std::vector<float>(kN, 2.0f));
  const Tensor target = Tensor::from_vector<int64_t>({2}, {16, 16});
  auto out = s.run({{"x", x}, {"target", target}});
  CHECK(out[0].value.tensor().shape() == Shape{16, 16});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>(kN, 256.0f));
  CHECK(s.last_run_stats().arena_from_shapes);
  CHECK(s.last_run_stats().arena_bytes == 2048);
  CHECK(s.last_run_stats().arena_served == 2);
  CHECK(s.last_run_stats().arena_missed == 0);
  s.run({{"x", x}, {"target", target}});  // the layout recorded in the first run
  CHECK_FALSE(s.last_run_stats().arena_from_shapes);
  CHECK(s.last_run_stats().arena_bytes == 2048);
  CHECK(s.last_run_stats().arena_served == 2);
}

TEST_CASE("shapes known only when run fall back to a recorded arena", "[arena][shapes]") {
  // NonZero's output length depends on the data of a float tensor: nothing before the run
  // gives it, so the arena comes from a recorded run.
  GraphBuilder b;
  b.input("x", DataType::Float, {kN});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("NonZero", {"a"}, {"n"});
  b.node("Mul", {"n", "n"}, {"c"});
  b.node("Mul", {"c", "c"}, {"y"});
  b.output("y");
  Session s = session_with(b.build(), true, false, false, true);
  const Tensor x = Tensor::from_vector<float>({kN}, std::vector<float>(kN, 2.0f));
  std::vector<int64_t> want(kN);
  for (int64_t i = 0; i < kN; ++i) want[static_cast<size_t>(i)] = i * i * i * i;
  for (int run = 0; run < 3; ++run) {
    auto out = s.run({{"x", x}});
    CHECK(out[0].value.tensor().to_vector<int64_t>() == want);
    CHECK_FALSE(s.last_run_stats().arena_from_shapes);
  }
  // Recorded on the 2nd run, used on the 3rd: n and c (2 KiB each) overlap at step 3, a
  // (1 KiB, steps 1-2) shares c's place.
  CHECK(s.last_run_stats().arena_bytes == 4096);
  CHECK(s.last_run_stats().arena_served == 3);
}

TEST_CASE("a kernel's workspace is planned into the arena with its step's lifetime",
          "[arena][shapes]") {
  // A 3x3 convolution over rows wide enough for the wide path: its padded input channels
  // and wide product are the kernel's workspace (the only buffer of the run besides y).
  GraphBuilder b;
  b.input("x", DataType::Float, {1, 8, 6, 32});
  std::vector<float> w(16 * 8 * 9);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
  b.initializer("w", Tensor::from_vector<float>({16, 8, 3, 3}, w));
  b.node("Conv", {"x", "w"}, {"y"}, {ints_attr("pads", {1, 1, 1, 1})});
  b.output("y");
  Session s = session_with(b.build(), true, false, false, true);
  std::vector<float> x(8 * 6 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.125f * static_cast<float>(i % 5);
  auto out = s.run({{"x", Tensor::from_vector<float>({1, 8, 6, 32}, x)}});
  const RunStats first = s.last_run_stats();
  CHECK(first.arena_from_shapes);
  CHECK(first.arena_served == 1);  // the workspace
  CHECK(first.arena_missed == 0);
  CHECK(first.arena_bytes > 0);
  const Tensor y1 = out[0].value.tensor();
  out = s.run({{"x", Tensor::from_vector<float>({1, 8, 6, 32}, x)}});
  CHECK(s.last_run_stats().arena_bytes == first.arena_bytes);  // the recorded plan agrees
  CHECK(s.last_run_stats().arena_served == 1);
  CHECK(out[0].value.tensor().to_vector<float>() == y1.to_vector<float>());
}

TEST_CASE("Resize with initializer scales is planned from shapes, and shares its input at scale 1",
          "[arena][shapes]") {
  // a = x*x, r = Resize(a, scales) (nearest), y = r*r; scales 2 give a fresh [1, 1, 8, 8],
  // scales 1 give `a` itself (the kernel shares it), and both are known before the run.
  for (const float scale : {2.0f, 1.0f}) {
    INFO("scale " << scale);
    GraphBuilder b;
    b.input("x", DataType::Float, {1, 1, 4, 4});
    b.initializer("scales", Tensor::from_vector<float>({4}, {1, 1, scale, scale}));
    b.node("Mul", {"x", "x"}, {"a"});
    b.node("Resize", {"a", "", "scales"}, {"r"}, {string_attr("mode", "nearest")});
    b.node("Mul", {"r", "r"}, {"y"});
    b.output("y");
    Session s = session_with(b.build(), true, false, false, true);
    std::vector<float> x(16);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    auto out = s.run({{"x", Tensor::from_vector<float>({1, 1, 4, 4}, x)}});
    const auto n = static_cast<int64_t>(4 * scale);
    const Tensor& y = out[0].value.tensor();
    REQUIRE(y.shape() == Shape{1, 1, n, n});
    const std::vector<float> got = y.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        // Nearest with half_pixel coordinates: output i reads input floor(i / scale).
        const float v = x[static_cast<size_t>(i * 4 / n * 4 + j * 4 / n)];
        CHECK(got[static_cast<size_t>(i * n + j)] == v * v * v * v);
      }
    }
    const RunStats& st = s.last_run_stats();
    CHECK(st.arena_from_shapes);
    CHECK(st.arena_missed == 0);
    // a (64 bytes) and, at scale 2, r (256 bytes); at scale 1 r is a, with no bytes of its own.
    CHECK(st.arena_bytes == (scale == 2.0f ? 320u : 64u));
  }
}

namespace {

// An op whose contract understates its workspace: its rule declares 256 bytes, its kernel
// takes 1 KiB, so its request misses the arena planned from the contracts.
class WrongWorkspace final : public ops::Kernel {
 public:
  explicit WrongWorkspace(const ops::NodeInfo&) {}
  void run(ops::OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0, DataType::Float, x.shape());
    Tensor scratch = ctx.workspace(DataType::Float, 256);
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<const float>()[i];
  }
};

KILN_REGISTER_OP({.domain = "kiln.test",
                  .op = "WrongWorkspace",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float",
                  .shape = [](ops::ShapeContext& c) { c.same(0, 0); },
                  .workspace = [](const ops::ShapeContext&) -> uint64_t { return 256; },
                  .create = ops::make<WrongWorkspace>});

}  // namespace

TEST_CASE(
    "a workspace rule that disagrees with its kernel misses the plan, and fails the contract check",
    "[arena][shapes][contract]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {4, 4});
  b.node("Mul", {"x", "x"}, {"a"});
  b.node("WrongWorkspace", {"a"}, {"y"}, {}, "kiln.test");
  b.output("y");
  Session s = session_with(b.build(), true, false, false, true);
  auto run = [&] { return s.run({{"x", Tensor::zeros(DataType::Float, {4, 4})}}); };
  const char* check = std::getenv("KILN_CHECK_CONTRACTS");
  if (check && *check && std::string(check) != "0") {
    CHECK_THROWS_WITH(run(), Catch::Contains("WrongWorkspace") &&
                                 Catch::Contains("missed the arena planned from the op contracts"));
  } else {
    run();
    CHECK(s.last_run_stats().arena_from_shapes);
    CHECK(s.last_run_stats().arena_missed == 1);
  }
}
