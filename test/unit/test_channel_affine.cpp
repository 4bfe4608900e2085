// kiln.ChannelAffine and the fusion that writes it (engine/passes/fusion/channel_affine.cpp):
// chains of per-channel affine ops over axis 1 (inference BatchNormalization, Mul, Add, Sub, Div
// by constants of one value per channel or one for all) and an activation, as one node. Where it
// must fire, near misses where it must not, random chains against a naive reference and the
// unoptimised graph, and the op itself on several threads and in place.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

Session session(std::shared_ptr<ir::Graph> g, GraphOptimization level) {
  return make_session(std::move(g), 20, 1, level);
}

Tensor random_floats(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t = Tensor::zeros(DataType::Float, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = element(t, i);
  return v;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Optimized {
  LoadStats stats;
  std::string graph;
  RunStats run;
};

// Runs the graph `make` builds at None, Basic and All on `feeds`; checks the first outputs
// equal within tol * (1 + |value|) and returns what All made of the graph.
Optimized check_levels(const std::function<std::shared_ptr<ir::Graph>()>& make,
                       const std::vector<NamedValue>& feeds, double tol) {
  Session plain = session(make(), GraphOptimization::None);
  Session basic = session(make(), GraphOptimization::Basic);
  Session all = session(make(), GraphOptimization::All);
  const Tensor want = plain.run(feeds)[0].value.tensor();
  require_near(basic.run(feeds)[0].value.tensor(), doubles(want), 0.0);
  const Tensor got = all.run(feeds)[0].value.tensor();
  CHECK(got.shape() == want.shape());
  require_near(got, doubles(want), tol);
  return {all.load_stats(), all.graph_text(), all.last_run_stats()};
}

}  // namespace

TEST_CASE("BatchNormalization, per-channel Mul and Add and an activation become one ChannelAffine",
          "[passes][fusion]") {
  // DenseNet's dense layers: the normalization reads a Concat (no convolution to fold it
  // into), its scale and shift follow as Mul and Add by Unsqueezed [C, 1, 1] constants, then
  // Relu. The fused node writes over the Concat's output.
  for (const char* act : {"Relu", "Sigmoid", "Tanh", ""}) {
    std::mt19937 rng(7);
    const Tensor scale = random_floats({8}, rng, 0.5f, 1.5f), shift = random_floats({8}, rng),
                 mean = random_floats({8}, rng), var = random_floats({8}, rng, 0.5f, 2.0f),
                 mul = random_floats({8, 1, 1}, rng), add = random_floats({1, 8, 1, 1}, rng);
    auto make = [&] {
      GraphBuilder b;
      b.input("a", DataType::Float, {2, 3, 5, 5}, true);
      b.input("b", DataType::Float, {2, 5, 5, 5}, true);
      b.initializer("scale", scale).initializer("shift", shift).initializer("mean", mean);
      b.initializer("var", var).initializer("mul", mul).initializer("add", add);
      b.node("Concat", {"a", "b"}, {"cat"}, {int_attr("axis", 1)});
      b.node("BatchNormalization", {"cat", "scale", "shift", "mean", "var"}, {"n"},
             {float_attr("epsilon", 1e-3f)});
      b.node("Mul", {"n", "mul"}, {"m"});
      b.node("Add", {"add", "m"}, {"s"});
      if (*act) b.node(act, {"s"}, {"r"});
      b.node("Neg", {*act ? "r" : "s"}, {"out"});
      b.output("out");
      return b.build();
    };
    INFO("activation '" << act << "'");
    const Optimized o = check_levels(
        make,
        {{"a", random_floats({2, 3, 5, 5}, rng, -3, 3)}, {"b", random_floats({2, 5, 5, 5}, rng)}},
        1e-5);
    CHECK(o.stats.fusions == 1);
    CHECK(o.stats.nodes_planned == 3u);  // Concat, ChannelAffine, Neg
    CHECK(count_of(o.graph, "kiln.ChannelAffine(") == 1);
    CHECK(o.run.in_place_ops == 2);  // ChannelAffine over the Concat's output, Neg over it
  }
}

TEST_CASE("per-channel chains that broadcast, run along another axis or are shared stay apart",
          "[passes][fusion]") {
  // x [2, 8, 5, 8] with its channels declared -> Mul(c) -> Add(d) -> Relu -> Neg. Case 0 fuses
  // whole; in the others the Mul (or Div) must stay as it is, and the Add and Relu after it
  // fuse where its output's channels are known (the op contracts' facts tell them, for a graph
  // output too) and d is one value per channel of it. Scalars alone are no per-channel chain.
  struct Case {
    const char* what;
    Shape x, c, d;
    bool c_first, shared, output, divide_by_x;
    uint64_t fusions, nodes;  // fusions made, nodes planned
  };
  const std::vector<Case> cases = {
      {"per channel", {2, 8, 5, 8}, {8, 1, 1}, {1, 8, 1, 1}, false, false, false, false, 1, 2},
      {"scalars", {2, 8, 5, 8}, {}, {1}, true, false, false, false, 0, 4},
      {"per element", {2, 8, 5, 8}, {8, 5, 8}, {8, 1, 1}, false, false, false, false, 1, 3},
      {"along the height", {2, 8, 5, 8}, {5, 1}, {8, 1, 1}, false, false, false, false, 1, 3},
      {"along the last axis", {2, 8, 5, 8}, {8}, {8, 1, 1}, false, false, false, false, 1, 3},
      {"a larger rank", {2, 8, 5, 8}, {1, 1, 8, 1, 1}, {8, 1, 1}, false, false, false, false, 0, 4},
      {"more channels than x",
       {2, 1, 5, 8},
       {1, 8, 1, 1},
       {8, 1, 1},
       false,
       false,
       false,
       false,
       1,
       3},
      {"the Mul read twice", {2, 8, 5, 8}, {8, 1, 1}, {8, 1, 1}, false, true, false, false, 1, 4},
      {"the Mul a graph output",
       {2, 8, 5, 8},
       {8, 1, 1},
       {8, 1, 1},
       false,
       false,
       true,
       false,
       1,
       3},
      {"c / x", {2, 8, 5, 8}, {8, 1, 1}, {8, 1, 1}, true, false, false, true, 1, 3},
  };
  for (const Case& k : cases) {
    std::mt19937 rng(11);
    const Tensor c = random_floats(k.c, rng, 0.5f, 1.5f), d = random_floats(k.d, rng);
    auto make = [&] {
      GraphBuilder b;
      b.input("x", DataType::Float, k.x, true);
      b.initializer("c", c).initializer("d", d);
      const std::vector<std::string> mul_in =
          k.c_first ? std::vector<std::string>{"c", "x"} : std::vector<std::string>{"x", "c"};
      b.node(k.divide_by_x ? "Div" : "Mul", mul_in, {"m"});
      b.node("Add", {"m", "d"}, {"s"});
      b.node("Relu", {"s"}, {"r"});
      b.node("Neg", {"r"}, {"out"});
      b.output("out");
      if (k.shared) {
        b.node("Neg", {"m"}, {"m2"});
        b.output("m2");
      }
      if (k.output) b.output("m");
      return b.build();
    };
    INFO(k.what);
    const Optimized o = check_levels(make, {{"x", random_floats(k.x, rng, 0.5f, 2.0f)}}, 1e-5);
    CHECK(o.stats.fusions == k.fusions);
    CHECK(o.stats.nodes_planned == k.nodes);
    if (&k != &cases[0]) CHECK(count_of(o.graph, k.divide_by_x ? ": Div(" : ": Mul(") == 1);
  }
}

TEST_CASE("a shared value splits a normalization chain into two ChannelAffines",
          "[passes][fusion]") {
  // BatchNormalization -> Mul -> (read twice) Add -> Relu: the Mul's output stays, computed by
  // the first fused node, and the Add and Relu read it as the second.
  std::mt19937 rng(13);
  const Tensor p = random_floats({6}, rng, 0.5f, 1.5f), v = random_floats({6}, rng, 0.5f, 1.5f);
  const Tensor mul = random_floats({6, 1}, rng), add = random_floats({6, 1}, rng);
  auto make = [&] {
    GraphBuilder b;
    b.input("x", DataType::Float, {3, 6, 7}, true);
    b.initializer("p", p).initializer("v", v).initializer("mul", mul).initializer("add", add);
    b.node("Neg", {"x"}, {"nx"});
    b.node("BatchNormalization", {"nx", "p", "p", "p", "v"}, {"n"});
    b.node("Mul", {"n", "mul"}, {"m"});
    b.node("Add", {"m", "add"}, {"s"});
    b.node("Relu", {"s"}, {"r"});
    b.node("Sum", {"r", "m"}, {"out"});
    b.output("out");
    return b.build();
  };
  const Optimized o = check_levels(make, {{"x", random_floats({3, 6, 7}, rng, -2, 2)}}, 1e-5);
  CHECK(o.stats.fusions == 2);
  CHECK(count_of(o.graph, "kiln.ChannelAffine(") == 2);
  CHECK(o.stats.nodes_planned == 4u);  // Neg, two ChannelAffines, Sum
}

TEST_CASE("random chains of per-channel ops fuse and match a naive reference", "[passes][fusion]") {
  // 0 BatchNormalization, 1 Mul, 2 Add, 3 x - c, 4 c - x, 5 x / c; constants [C, 1.., 1],
  // [1, C, 1.., 1], rank 0 or [1]; inputs of rank 2 to 4 with 1 to 7 channels, the chain first
  // on a declared input (its channels known) or, starting with a normalization, after a Neg.
  const char* const acts[] = {"", "Relu", "Sigmoid", "Tanh"};
  std::mt19937 rng(17);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t rank = 2 + static_cast<size_t>(trial % 3);
    std::uniform_int_distribution<int64_t> dim(1, 7);
    Shape shape{1 + trial % 2, dim(rng)};
    for (size_t d = 2; d < rank; ++d) shape.push_back(dim(rng));
    const int64_t ch = shape[1];
    const int steps = 1 + static_cast<int>(rng() % 5);
    struct Step {
      int kind;
      Tensor a, b, c, d;  // a: the constant (BatchNormalization: scale, bias, mean, var)
      bool first;         // the constant is the first operand
    };
    std::vector<Step> chain;
    bool normalizes = false, per_channel = false;
    for (int s = 0; s < steps; ++s) {
      Step st{static_cast<int>(rng() % 6), {}, {}, {}, {}, rng() % 2 == 0};
      if (st.kind == 0) {
        st.a = random_floats({ch}, rng, 0.5f, 1.5f);
        st.b = random_floats({ch}, rng);
        st.c = random_floats({ch}, rng);
        st.d = random_floats({ch}, rng, 0.5f, 2.0f);
        normalizes = true;
      } else {
        const int form = static_cast<int>(rng() % 4);
        Shape cs;
        if (form == 0 || form == 1) {
          if (form == 1) cs.push_back(1);
          cs.push_back(ch);
          for (size_t d = 2; d < rank; ++d) cs.push_back(1);
        } else if (form == 3) {
          cs = {1};
        }
        st.a = random_floats(cs, rng, 0.5f, 1.5f);
        per_channel = per_channel || st.a.numel() > 1;
        if (rng() % 2) {
          for (int64_t i = 0; i < st.a.numel(); ++i) st.a.data<float>()[i] *= -1;
        }
        if (st.kind == 5) st.first = false;  // c / x is not affine (and not made)
      }
      chain.push_back(std::move(st));
    }
    const char* act = acts[rng() % 4];
    const bool after_neg = chain[0].kind == 0 && rng() % 2 == 0;
    auto make = [&] {
      GraphBuilder b;
      b.input("x", DataType::Float, shape, true);
      std::string v = "x";
      if (after_neg) {
        b.node("Neg", {"x"}, {"nx"});
        v = "nx";
      }
      for (size_t s = 0; s < chain.size(); ++s) {
        const Step& st = chain[s];
        const std::string k = "k" + std::to_string(s), out = "v" + std::to_string(s);
        b.initializer(k, st.a);
        if (st.kind == 0) {
          for (const char* p : {"b", "c", "d"}) {
            b.initializer(k + p, *p == 'b' ? st.b : *p == 'c' ? st.c : st.d);
          }
          b.node("BatchNormalization", {v, k, k + "b", k + "c", k + "d"}, {out},
                 {float_attr("epsilon", 1e-4f)});
        } else {
          const char* op = st.kind == 1   ? "Mul"
                           : st.kind == 2 ? "Add"
                           : st.kind == 5 ? "Div"
                                          : "Sub";
          const bool first = st.kind == 4 || (st.kind <= 2 && st.first);
          b.node(op, first ? std::vector<std::string>{k, v} : std::vector<std::string>{v, k},
                 {out});
        }
        v = out;
      }
      if (*act) {
        b.node(act, {v}, {"y"});
        v = "y";
      }
      b.output(v);
      return b.build();
    };
    const Tensor x = random_floats(shape, rng, -2.0f, 2.0f);
    // The reference, in double, element by element.
    int64_t inner = 1;
    for (size_t d = 2; d < rank; ++d) inner *= shape[d];
    std::vector<double> want(static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = i / inner % ch;
      double y = x.data<const float>()[i] * (after_neg ? -1.0 : 1.0);
      for (const Step& st : chain) {
        const double a =
            st.a.numel() == 1 ? st.a.data<const float>()[0] : st.a.data<const float>()[c];
        switch (st.kind) {
          case 0:
            y = (y - st.c.data<const float>()[c]) /
                    std::sqrt(static_cast<double>(st.d.data<const float>()[c]) + 1e-4f) * a +
                st.b.data<const float>()[c];
            break;
          case 1:
            y *= a;
            break;
          case 2:
            y += a;
            break;
          case 3:
            y -= a;
            break;
          case 4:
            y = a - y;
            break;
          default:
            y /= a;
        }
      }
      if (std::string(act) == "Relu") y = y > 0 ? y : 0;
      if (std::string(act) == "Sigmoid") y = 1 / (1 + std::exp(-y));
      if (std::string(act) == "Tanh") y = std::tanh(y);
      want[static_cast<size_t>(i)] = y;
    }
    INFO("trial " << trial << " shape " << shape.size() << "-D, " << steps << " steps, act '" << act
                  << "'");
    const Optimized o = check_levels(make, {{"x", x}}, 1e-4);
    Session s = session(make(), GraphOptimization::All);
    require_near(s.run({{"x", x}})[0].value.tensor(), want, 1e-4);
    // A lone Mul, Add, Sub or Div stays as it is, and so do scalars alone.
    const bool fuses = normalizes || (per_channel && steps + (*act ? 1 : 0) >= 2);
    CHECK(o.stats.fusions == (fuses ? 1 : 0));
    CHECK(o.stats.nodes_planned ==
          (fuses ? 1u : static_cast<uint64_t>(steps) + (*act ? 1u : 0u)) + (after_neg ? 1u : 0u));
  }
}

TEST_CASE("ChannelAffine splits planes and rows across threads and writes over its input", "[nn]") {
  // Over 2 M elements the work is split in two (OpTest runs two threads) at a point inside a
  // plane (4-D) or a row of channels (2-D); activations applied after the affine step.
  std::mt19937 rng(19);
  for (const Shape& shape : {Shape{1, 3, 700, 1000}, Shape{2100, 1000}, Shape{2, 5, 3, 7}}) {
    for (const char* act : {"", "Relu", "Sigmoid"}) {
      const int64_t ch = shape[1];
      const Tensor x = random_floats(shape, rng, -3, 3);
      const Tensor scale = random_floats({ch}, rng), shift = random_floats({ch}, rng);
      int64_t inner = 1;
      for (size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
      std::vector<double> want(static_cast<size_t>(x.numel()));
      for (int64_t i = 0; i < x.numel(); ++i) {
        const int64_t c = i / inner % ch;
        double y = static_cast<double>(x.data<const float>()[i]) * scale.data<const float>()[c] +
                   shift.data<const float>()[c];
        if (std::string(act) == "Relu") y = y > 0 ? y : 0;
        if (std::string(act) == "Sigmoid") y = 1 / (1 + std::exp(-y));
        want[static_cast<size_t>(i)] = y;
      }
      INFO(shape.size() << "-D, " << x.numel() << " elements, act '" << act << "'");
      OpTest t("ChannelAffine", 1, "kiln");
      t.input(x.clone()).constant_input(scale).constant_input(shift).owned_inputs();
      if (*act) t.attr("activation", act);
      require_near(t.run1(), want, 1e-6);
      CHECK(t.stats().in_place_ops == 1);
    }
  }
  // A scale of another length fails naming it.
  OpTest bad("ChannelAffine", 1, "kiln");
  bad.input(random_floats({1, 4, 2, 2}, rng))
      .constant_input(random_floats({3}, rng))
      .constant_input(random_floats({4}, rng));
  CHECK_THROWS_WITH(bad.run(), Catch::Contains("scale") && Catch::Contains("one per channel"));
}

TEST_CASE("the fusions see the channels of any op whose contract tells them", "[passes][fusion]") {
  // image [n?, 3, h?, w?] -> Conv 8x3x3x3 -> op -> Mul [8, 1, 1] -> Add [1, 8, 1, 1] -> Neg. The
  // channels after the op come from its shape rule (no list of channel-keeping ops in the
  // passes), so the Mul and Add become one ChannelAffine after every one of these ops;
  // after Flatten the channels are gone and the chain stays as it is.
  for (const char* op : {"Softplus", "HardSigmoid", "Abs", "Elu", "Flatten"}) {
    std::mt19937 rng(5);
    const Tensor w = random_floats({8, 3, 3, 3}, rng),
                 c = random_floats({8, 1, 1}, rng, 0.5f, 1.5f),
                 d = random_floats({1, 8, 1, 1}, rng);
    const bool flatten = std::string(op) == "Flatten";
    auto make = [&] {
      GraphBuilder b;
      b.input("image", DataType::Float, {-1, 3, -1, -1}, true);
      b.initializer("w", w).initializer("c", c).initializer("d", d);
      b.node("Conv", {"image", "w"}, {"y"}, {ints_attr("pads", {1, 1, 1, 1})});
      b.node(op, {"y"}, {"z"});
      b.node("Mul", {"z", "c"}, {"m"});
      b.node("Add", {"m", "d"}, {"s"});
      b.node("Neg", {"s"}, {"out"});
      b.output("out");
      return make_model(b.build()).graph;
    };
    INFO(op);
    const Optimized o =
        check_levels(make, {{"image", random_floats({2, 3, 5, 4}, rng, -1.0f, 1.0f)}}, 1e-5);
    CHECK(count_of(o.graph, "ChannelAffine(") == (flatten ? 0 : 1));
    CHECK(count_of(o.graph, ": Mul(") == (flatten ? 1 : 0));
  }
}
