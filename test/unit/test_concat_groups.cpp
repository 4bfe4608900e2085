// Concat groups (plan::ConcatGroup): producers write straight into their windows of a Concat's
// output, nested Concats too, so the Concat copies nothing. Each graph runs twice: with its
// input shape declared (the groups form from the shapes inferred at load) and undeclared (no
// groups, every Concat copies); the outputs must be equal bit for bit, and the copy counters
// and arena counters say which path ran.
#include <random>

#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Runs {
  std::vector<Tensor> outputs;
  RunStats first, stats;  // the first run's (its arena planned or recorded) and the last's
};

Session session_for(std::shared_ptr<ir::Graph> g, bool from_shapes) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.arena_from_shapes = from_shapes;
  return session_from_model(make_model(std::move(g), 18), so);
}

// Runs `s` on x three times (the arena planned or recorded on the first) and returns the last.
Runs run3(Session& s, const Tensor& x) {
  Runs r;
  for (int k = 0; k < 3; ++k) {
    auto out = s.run({{"x", x}});
    r.outputs.clear();
    for (auto& o : out) r.outputs.push_back(o.value.tensor().contiguous());
    if (k == 0) r.first = s.last_run_stats();
  }
  r.stats = s.last_run_stats();
  return r;
}

void require_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].shape() == b[k].shape());
    const auto x = a[k].to_vector<float>(), y = b[k].to_vector<float>();
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(x[i] == y[i]);
  }
}

// `make(declared)` builds the graph with x declared as [N, C, H, W] (N symbolic) or undeclared.
// Checks the grouped runs against the ungrouped ones on `x`; returns the grouped run's stats
// (arena planned from shapes).
RunStats check_against_copies(const std::function<std::shared_ptr<ir::Graph>(bool)>& make,
                              const Tensor& x) {
  Session plain = session_for(make(false), true);
  const Runs want = run3(plain, x);
  CHECK(want.stats.bytes_copied_concat > 0);
  for (bool from_shapes : {true, false}) {
    Session grouped = session_for(make(true), from_shapes);
    const Runs got = run3(grouped, x);
    require_equal(got.outputs, want.outputs);
    // Planned from shapes, the first run's buffers all fall where the prediction put them.
    CHECK(got.first.arena_from_shapes == from_shapes);
    CHECK(got.first.arena_missed == 0);
    CHECK(got.stats.arena_missed == 0);
  }
  Session grouped = session_for(make(true), true);
  return run3(grouped, x).stats;
}

void declare_x(GraphBuilder& b, bool declared, std::vector<int64_t> chw) {
  if (!declared) {
    b.input("x", DataType::Float);
    return;
  }
  std::vector<int64_t> shape{-1};
  shape.insert(shape.end(), chw.begin(), chw.end());
  b.input("x", DataType::Float, shape, true);
}

// x declared (or not) with `channels` of 8x8; a = -x, bb = sigmoid(x), `joined` = [a, bb].
void two_branches(GraphBuilder& b, bool declared, int64_t channels, const std::string& joined) {
  declare_x(b, declared, {channels, 8, 8});
  b.node("Neg", {"x"}, {"a"});
  b.node("Sigmoid", {"x"}, {"bb"});
  b.node("Concat", {"a", "bb"}, {joined}, {int_attr("axis", 1)});
}

Tensor random_x(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  return random_tensor(DataType::Float, std::move(shape), rng);
}

// SqueezeNet's fire module: a 1x1 squeeze, then 1x1 and 3x3 expansions concatenated.
std::shared_ptr<ir::Graph> fire(bool declared) {
  std::mt19937 rng(3);
  GraphBuilder b;
  declare_x(b, declared, {8, 16, 16});
  b.initializer("ws", random_tensor(DataType::Float, {4, 8, 1, 1}, rng));
  b.initializer("w1", random_tensor(DataType::Float, {16, 4, 1, 1}, rng));
  b.initializer("w3", random_tensor(DataType::Float, {16, 4, 3, 3}, rng));
  b.initializer("wo", random_tensor(DataType::Float, {8, 32, 1, 1}, rng));
  b.node("Conv", {"x", "ws"}, {"s"});
  b.node("Relu", {"s"}, {"sr"});
  b.node("Conv", {"sr", "w1"}, {"e1"});
  b.node("Relu", {"e1"}, {"e1r"});
  b.node("Conv", {"sr", "w3"}, {"e3"}, {ints_attr("pads", {1, 1, 1, 1})});
  b.node("Relu", {"e3"}, {"e3r"});
  b.node("Concat", {"e1r", "e3r"}, {"c"}, {int_attr("axis", 1)});
  b.node("Conv", {"c", "wo"}, {"y"});
  b.output("y");
  return b.build();
}

}  // namespace

TEST_CASE("a Concat's producers write into its output and it copies nothing", "[concat-groups]") {
  const RunStats s = check_against_copies(fire, random_x({1, 8, 16, 16}, 1));
  CHECK(s.bytes_copied_concat == 0);
}

TEST_CASE("nested Concats (DenseNet's chains) share one buffer", "[concat-groups]") {
  // c1 = [a, b]; c2 = [c1, g(c1)]; c3 = [c2, h(c2)]: c1 and c2 are also read elsewhere.
  auto make = [](bool declared) {
    GraphBuilder b;
    declare_x(b, declared, {16, 8, 8});
    b.node("Relu", {"x"}, {"a"});
    b.node("Neg", {"x"}, {"b"});
    b.node("Concat", {"a", "b"}, {"c1"}, {int_attr("axis", 1)});
    b.node("Sigmoid", {"c1"}, {"g"});
    b.node("Concat", {"c1", "g"}, {"c2"}, {int_attr("axis", 1)});
    b.node("Tanh", {"c2"}, {"h"});
    b.node("Concat", {"c2", "h"}, {"c3"}, {int_attr("axis", 1)});
    b.node("ReduceSum", {"c1"}, {"r1"}, {int_attr("keepdims", 1)});
    b.node("Mul", {"c3", "r1"}, {"y"});
    b.output("y");
    return b.build();
  };
  const RunStats s = check_against_copies(make, random_x({1, 16, 8, 8}, 2));
  CHECK(s.bytes_copied_concat == 0);
}

TEST_CASE("a grouped Concat's inputs are not overwritten while its output lives",
          "[concat-groups]") {
  // After the Concat, b's last reader is an element-wise op that would write over b in
  // place; b is a window of c, which is read after it.
  auto make = [](bool declared) {
    GraphBuilder b;
    two_branches(b, declared, 32, "c");
    b.node("Relu", {"bb"}, {"r"});
    b.node("Exp", {"a"}, {"ea"});
    b.node("Concat", {"r", "ea"}, {"d"}, {int_attr("axis", 1)});
    b.node("Add", {"c", "d"}, {"y"});
    b.output("y");
    return b.build();
  };
  const RunStats s = check_against_copies(make, random_x({1, 32, 8, 8}, 3));
  CHECK(s.bytes_copied_concat == 0);
}

TEST_CASE("Concat groups step aside for other shapes, graph outputs and small outputs",
          "[concat-groups]") {
  SECTION("a batch of 2 where the plan took 1") {
    Session plain = session_for(fire(false), true);
    Session grouped = session_for(fire(true), true);
    for (int64_t n : {1, 2, 1, 3}) {
      const Tensor x = random_x({n, 8, 16, 16}, static_cast<uint32_t>(10 + n));
      const Runs want = run3(plain, x);
      const Runs got = run3(grouped, x);
      require_equal(got.outputs, want.outputs);
      CHECK((got.stats.bytes_copied_concat == 0) == (n == 1));
      CHECK(got.first.arena_missed == 0);
      CHECK(got.stats.arena_missed == 0);
    }
  }
  SECTION("an input that is a graph output keeps its own buffer") {
    auto make = [](bool declared) {
      GraphBuilder b;
      two_branches(b, declared, 32, "c");
      b.node("Relu", {"c"}, {"y"});
      b.output("y");
      b.output("bb");
      return b.build();
    };
    const RunStats s = check_against_copies(make, random_x({1, 32, 8, 8}, 4));
    CHECK(s.bytes_copied_concat == static_cast<uint64_t>(32 * 8 * 8 * 4));  // bb alone
  }
  SECTION("a Concat under 16 KiB copies") {
    auto make = [](bool declared) {
      GraphBuilder b;
      two_branches(b, declared, 4, "y");
      b.output("y");
      return b.build();
    };
    const RunStats s = check_against_copies(make, random_x({1, 4, 8, 8}, 5));
    CHECK(s.bytes_copied_concat == static_cast<uint64_t>(2 * 4 * 8 * 8 * 4));
  }
}

TEST_CASE("random graphs of Concats and element-wise ops give the copying path's results",
          "[concat-groups]") {
  // Values of shape [1, c, 8, 8]; each node is an element-wise op on one value, a sum or
  // product of two of the same width, or a Concat along the channels of two or three values
  // (repeats, earlier Concats, the graph input). Some inner values are graph outputs too.
  int fewer_copies = 0;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    struct Made {
      std::vector<std::string> ops, outputs;
      std::vector<std::vector<std::string>> inputs;
      std::vector<std::string> graph_outputs;
    } m;
    std::mt19937 rng(seed);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    std::vector<std::pair<std::string, int64_t>> values{{"x", 32}};
    const char* unary[] = {"Relu", "Neg", "Sigmoid", "Tanh", "Abs"};
    for (int k = 0; k < 12; ++k) {
      const std::string out = "v" + std::to_string(k);
      const size_t kind = pick(4);
      if (kind == 0 || values.size() < 2) {
        const auto& [a, c] = values[pick(values.size())];
        m.ops.push_back(unary[pick(5)]);
        m.inputs.push_back({a});
        values.push_back({out, c});
      } else if (kind == 1) {
        const auto& [a, c] = values[pick(values.size())];
        std::vector<std::string> same;
        for (const auto& [n, w] : values)
          if (w == c) same.push_back(n);
        m.ops.push_back(pick(2) ? "Add" : "Mul");
        m.inputs.push_back({a, same[pick(same.size())]});
        values.push_back({out, c});
      } else {
        const size_t n = 2 + pick(2);
        std::vector<std::string> in;
        int64_t c = 0;
        for (size_t i = 0; i < n; ++i) {
          const auto& [a, w] = values[pick(values.size())];
          if (c + w > 512) break;
          in.push_back(a);
          c += w;
        }
        if (in.size() < 2) {  // two of the last value
          in = {values.back().first, values.back().first};
          c = 2 * values.back().second;
        }
        m.ops.push_back("Concat");
        m.inputs.push_back(in);
        values.push_back({out, c});
      }
      m.outputs.push_back(out);
      if (pick(6) == 0) m.graph_outputs.push_back(out);
    }
    // Values nothing reads are outputs as well.
    for (const std::string& v : m.outputs) {
      bool read = false;
      for (const auto& in : m.inputs)
        for (const std::string& a : in) read = read || a == v;
      if (!read &&
          std::find(m.graph_outputs.begin(), m.graph_outputs.end(), v) == m.graph_outputs.end())
        m.graph_outputs.push_back(v);
    }
    auto make = [&m](bool declared) {
      GraphBuilder b;
      declare_x(b, declared, {32, 8, 8});
      for (size_t k = 0; k < m.ops.size(); ++k) {
        if (m.ops[k] == "Concat") {
          b.node("Concat", m.inputs[k], {m.outputs[k]}, {int_attr("axis", 1)});
        } else {
          b.node(m.ops[k], m.inputs[k], {m.outputs[k]});
        }
      }
      for (const std::string& o : m.graph_outputs) b.output(o);
      return b.build();
    };
    INFO("seed " << seed);
    const Tensor x = random_x({1, 32, 8, 8}, seed);
    Session plain = session_for(make(false), true);
    const Runs want = run3(plain, x);
    Session grouped = session_for(make(true), true);
    const Runs got = run3(grouped, x);
    require_equal(got.outputs, want.outputs);
    CHECK(got.first.arena_from_shapes);
    CHECK(got.first.arena_missed == 0);
    CHECK(got.stats.bytes_copied_concat <= want.stats.bytes_copied_concat);
    if (got.stats.bytes_copied_concat < want.stats.bytes_copied_concat) ++fewer_copies;
  }
  CHECK(fewer_copies >= 20);  // the groups formed in most graphs
}
