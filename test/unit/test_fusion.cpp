// The graph rewrites of engine/passes/fusion.cpp on hand-built graphs: where each must fire,
// near misses where it must not, and results equal to the unoptimised graph within float
// rounding.
#include <cmath>
#include <random>
#include <vector>

#include "engine/passes/passes.h"
#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

Session session(std::shared_ptr<ir::Graph> g, GraphOptimization level, int64_t opset = 20) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.optimization = level;
  return session_from_model(make_model(std::move(g), opset), so);
}

Tensor random_floats(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t = Tensor::zeros(DataType::Float, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

// Runs `g` unoptimised and at `level` on the same feeds; returns the two sessions' first
// outputs and checks them equal within `tol` (relative to 1 + |value|).
void check_same(const std::function<std::shared_ptr<ir::Graph>()>& make,
                const std::vector<NamedValue>& feeds, GraphOptimization level, double tol,
                LoadStats* optimized_stats = nullptr) {
  Session plain = session(make(), GraphOptimization::None);
  Session opt = session(make(), level);
  if (optimized_stats) *optimized_stats = opt.load_stats();
  const auto a = plain.run(feeds), b = opt.run(feeds);
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    const auto x = a[k].value.tensor().contiguous().to_vector<float>();
    const auto y = b[k].value.tensor().contiguous().to_vector<float>();
    REQUIRE(x.size() == y.size());
    CHECK(a[k].value.tensor().shape() == b[k].value.tensor().shape());
    for (size_t i = 0; i < x.size(); ++i) {
      REQUIRE(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(x[i])));
    }
  }
}

}  // namespace

TEST_CASE("pass-through nodes are removed, look-alikes are kept", "[passes][fusion]") {
  auto make = [] {
    GraphBuilder b;
    b.input("x", DataType::Float, {2, 3}, true);
    b.initializer("one", Tensor::scalar<float>(1.0f));
    b.initializer("zero", Tensor::scalar<float>(0.0f));
    b.initializer("ones", Tensor::from_vector<float>({1, 1, 1}, {1}));  // broadcasts x
    b.initializer("two", Tensor::scalar<float>(2.0f));
    b.node("Identity", {"x"}, {"a"});
    b.node("Mul", {"a", "one"}, {"b"});   // removed
    b.node("Add", {"zero", "b"}, {"c"});  // removed
    b.node("Div", {"c", "one"}, {"d"});   // removed
    b.node("Div", {"one", "d"}, {"e"});   // 1 / d: kept
    b.node("Mul", {"e", "two"}, {"f"});   // not neutral: kept
    b.node("Mul", {"f", "ones"}, {"g"});  // rank-3 ones change the shape: kept
    b.node("Dropout", {"g"}, {"h"});      // inference Dropout: removed
    b.node("Neg", {"h"}, {"out"});
    b.output("out");
    return b.build();
  };
  const std::vector<NamedValue> feeds{{"x", random_floats({2, 3}, 1, 0.5f, 2.0f)}};
  LoadStats stats;
  check_same(make, feeds, GraphOptimization::Basic, 0.0, &stats);
  CHECK(stats.identities_removed == 5);
  CHECK(stats.nodes_planned == stats.nodes_loaded - 5);
  CHECK(stats.fusions == 0);  // Basic does not fuse
}

TEST_CASE("a graph output keeps the node that names it", "[passes][fusion]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {4}, true);
  b.node("Identity", {"x"}, {"y"});
  b.output("y");
  Session s = session(b.build(), GraphOptimization::All);
  CHECK(s.load_stats().identities_removed == 0);
  auto out = s.run({{"x", Tensor::from_vector<float>({4}, {1, 2, 3, 4})}});
  CHECK(out[0].name == "y");
}

TEST_CASE("GELU from Div, Erf, Add and Muls becomes one Gelu", "[passes][fusion]") {
  for (int variant = 0; variant < 2; ++variant) {
    auto make = [variant] {
      GraphBuilder b;
      b.input("x", DataType::Float, {4, 37}, true);
      b.initializer("sqrt2", Tensor::scalar<float>(1.4142135f));
      b.initializer("one", Tensor::scalar<float>(1.0f));
      b.initializer("half", Tensor::scalar<float>(0.5f));
      b.node("Div", {"x", "sqrt2"}, {"d"});
      b.node("Erf", {"d"}, {"e"});
      b.node("Add", {"e", "one"}, {"a"});
      if (variant == 0) {  // (x * (1 + erf)) * 0.5
        b.node("Mul", {"x", "a"}, {"m"});
        b.node("Mul", {"m", "half"}, {"y"});
      } else {  // (x * 0.5) * (1 + erf)
        b.node("Mul", {"half", "x"}, {"h"});
        b.node("Mul", {"h", "a"}, {"y"});
      }
      b.node("Neg", {"y"}, {"z"});
      b.output("z");
      return b.build();
    };
    LoadStats stats;
    check_same(make, {{"x", random_floats({4, 37}, 2, -6.0f, 6.0f)}}, GraphOptimization::All, 1e-6,
               &stats);
    CHECK(stats.fusions == 1);
    CHECK(stats.nodes_planned == 2);  // Gelu, Neg
  }
  // A near miss: the Erf's input is x / 2, not x / sqrt2.
  GraphBuilder b;
  b.input("x", DataType::Float, {4}, true);
  b.initializer("two", Tensor::scalar<float>(2.0f));
  b.initializer("one", Tensor::scalar<float>(1.0f));
  b.initializer("half", Tensor::scalar<float>(0.5f));
  b.node("Div", {"x", "two"}, {"d"});
  b.node("Erf", {"d"}, {"e"});
  b.node("Add", {"e", "one"}, {"a"});
  b.node("Mul", {"x", "a"}, {"m"});
  b.node("Mul", {"m", "half"}, {"y"});
  b.node("Neg", {"y"}, {"z"});
  b.output("z");
  Session s = session(b.build(), GraphOptimization::All);
  CHECK(s.load_stats().fusions == 0);
}

TEST_CASE("MatMul, its bias Add and an activation become one FusedMatMul", "[passes][fusion]") {
  for (const char* act : {"", "Relu", "Gelu"}) {
    auto make = [act] {
      GraphBuilder b;
      b.input("x", DataType::Float, {2, 5, 24}, true);
      b.initializer("w", random_floats({24, 40}, 3));
      b.initializer("bias", random_floats({40}, 4));
      b.node("MatMul", {"x", "w"}, {"m"});
      b.node("Add", {"bias", "m"}, {"y"});
      if (*act) {
        b.node(act, {"y"}, {"z"});
      } else {
        b.node("Neg", {"y"}, {"z"});
      }
      b.node("Neg", {"z"}, {"out"});
      b.output("out");
      return b.build();
    };
    LoadStats stats;
    INFO("activation " << act);
    check_same(make, {{"x", random_floats({2, 5, 24}, 5)}}, GraphOptimization::All, 1e-5, &stats);
    CHECK(stats.fusions == (*act ? 2 : 1));
    CHECK(stats.nodes_planned == (*act ? 2u : 3u));
  }
  // Near misses: a bias that is an input, and a MatMul output read twice.
  GraphBuilder b;
  b.input("x", DataType::Float, {3, 8}, true);
  b.input("bias", DataType::Float, {6}, true);
  b.initializer("w", random_floats({8, 6}, 6));
  b.initializer("w2", random_floats({8, 6}, 7));
  b.initializer("c", random_floats({6}, 8));
  b.node("MatMul", {"x", "w"}, {"m"});
  b.node("Add", {"m", "bias"}, {"y"});
  b.node("MatMul", {"x", "w2"}, {"m2"});
  b.node("Add", {"m2", "c"}, {"y2"});
  b.node("Neg", {"m2"}, {"n2"});  // m2 has a second reader
  b.output("y").output("y2").output("n2");
  Session s = session(b.build(), GraphOptimization::All);
  CHECK(s.load_stats().fusions == 0);
}

TEST_CASE("scaled dot-product attention becomes one Attention", "[passes][fusion]") {
  const int64_t B = 2, H = 3, L = 70, T = 90, D = 16;
  for (int variant = 0; variant < 3; ++variant) {
    auto make = [&, variant] {
      GraphBuilder b;
      b.input("q", DataType::Float, {B, H, L, D}, true);
      b.input("k", DataType::Float, {B, H, T, D}, true);
      b.input("v", DataType::Float, {B, H, T, D}, true);
      b.input("mask", DataType::Float, {B, 1, 1, T}, true);
      b.initializer("scale", Tensor::scalar<float>(4.0f));
      b.initializer("one", Tensor::scalar<float>(1.0f));
      b.node("Transpose", {"k"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})});
      std::string scores = "s";
      if (variant == 2) {  // torch's scale-1 SDPA: Mul(q, 1), Mul(k^T, 1)
        b.node("Mul", {"q", "one"}, {"q1"});
        b.node("Mul", {"kt", "one"}, {"kt1"});
        b.node("MatMul", {"q1", "kt1"}, {"s"});
      } else {
        b.node("MatMul", {"q", "kt"}, {"s"});
        b.node("Div", {"s", "scale"}, {"s2"});
        scores = "s2";
      }
      if (variant == 1) {
        b.node("Add", {scores, "mask"}, {"s3"});
        scores = "s3";
      }
      b.node("Softmax", {scores}, {"p"}, {int_attr("axis", -1)});
      b.node("MatMul", {"p", "v"}, {"o"});
      b.node("Transpose", {"o"}, {"y"}, {ints_attr("perm", {0, 2, 1, 3})});
      b.output("y");
      return b.build();
    };
    Tensor mask = random_floats({B, 1, 1, T}, 9, -3.0f, 0.0f);
    for (int64_t i = 0; i < B * T; i += 7) mask.data<float>()[i] = -1e9f;  // masked keys
    LoadStats stats;
    INFO("variant " << variant);
    check_same(make,
               {{"q", random_floats({B, H, L, D}, 10)},
                {"k", random_floats({B, H, T, D}, 11)},
                {"v", random_floats({B, H, T, D}, 12)},
                {"mask", mask}},
               GraphOptimization::All, 1e-5, &stats);
    CHECK(stats.fusions == 1);
  }
  // A near miss: Softmax over another axis.
  GraphBuilder b;
  b.input("q", DataType::Float, {1, 2, 4, 8}, true);
  b.input("k", DataType::Float, {1, 2, 8, 4}, true);
  b.input("v", DataType::Float, {1, 2, 4, 8}, true);
  b.node("MatMul", {"q", "k"}, {"s"});
  b.node("Softmax", {"s"}, {"p"}, {int_attr("axis", 2)});
  b.node("MatMul", {"p", "v"}, {"y"});
  b.output("y");
  Session s = session(b.build(), GraphOptimization::All);
  CHECK(s.load_stats().fusions == 0);
}

TEST_CASE("Conv, BatchNormalization, a residual Add and an activation become one FusedConv",
          "[passes][fusion]") {
  // Grouped GEMM convolutions and depthwise (direct) ones; Z with the output's shape (made
  // by a node, so it is overwritten in place, or a graph input, so it is copied) or
  // broadcasting from [1, M, 1, 1].
  for (const int64_t group : {int64_t{1}, int64_t{2}, int64_t{8}}) {
    for (const bool broadcast_z : {false, true}) {
      for (const bool z_node : {true, false}) {
        for (const char* act : {"Relu", "Sigmoid"}) {
          const int64_t c = 8, m = 8;
          const Shape z_shape = broadcast_z ? Shape{1, m, 1, 1} : Shape{2, m, 13, 13};
          auto make = [&] {
            GraphBuilder b;
            b.input("x", DataType::Float, {2, c, 13, 13}, true);
            b.input("z_in", DataType::Float, z_shape, true);
            b.initializer("w", random_floats({m, c / group, 3, 3}, 11));
            b.initializer("b", random_floats({m}, 12));
            b.initializer("scale", random_floats({m}, 13, 0.5f, 1.5f));
            b.initializer("shift", random_floats({m}, 14));
            b.initializer("mean", random_floats({m}, 15));
            b.initializer("var", random_floats({m}, 16, 0.5f, 2.0f));
            b.node("Conv", {"x", "w", "b"}, {"c"},
                   {ints_attr("pads", {1, 1, 1, 1}), int_attr("group", group)});
            b.node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"n"},
                   {float_attr("epsilon", 1e-3f)});
            if (z_node) b.node("Neg", {"z_in"}, {"z"});
            b.node("Add", {z_node ? "z" : "z_in", "n"}, {"s"});
            b.node(act, {"s"}, {"r"});
            b.node("Neg", {"r"}, {"out"});
            b.output("out");
            return b.build();
          };
          INFO("group " << group << " broadcast Z " << broadcast_z << " Z from a node " << z_node
                        << " " << act);
          LoadStats stats;
          check_same(
              make,
              {{"x", random_floats({2, c, 13, 13}, 17)}, {"z_in", random_floats(z_shape, 18)}},
              GraphOptimization::All, 1e-5, &stats);
          CHECK(stats.fusions == 2);  // the folded normalization, the FusedConv
          CHECK(stats.nodes_planned == (z_node ? 3u : 2u));  // [Neg,] FusedConv, Neg
        }
      }
    }
  }
}

TEST_CASE("Conv fusions leave shared outputs and run-time filters alone", "[passes][fusion]") {
  // The convolution's output is also a graph output: nothing folds into it. A filter that is
  // an input cannot absorb the normalization (and the ReLU reads the normalization).
  auto make = [] {
    GraphBuilder b;
    b.input("x", DataType::Float, {1, 4, 6, 6}, true);
    b.input("w_in", DataType::Float, {4, 4, 1, 1}, true);
    b.initializer("w", random_floats({4, 4, 1, 1}, 21));
    for (const char* p : {"scale", "shift", "mean"}) b.initializer(p, random_floats({4}, 22));
    b.initializer("var", random_floats({4}, 23, 0.5f, 1.0f));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"n"});
    b.node("Conv", {"x", "w_in"}, {"c2"});
    b.node("BatchNormalization", {"c2", "scale", "shift", "mean", "var"}, {"n2"});
    b.node("Relu", {"n2"}, {"r2"});
    b.output("c").output("n").output("r2");
    return b.build();
  };
  LoadStats stats;
  check_same(make,
             {{"x", random_floats({1, 4, 6, 6}, 24)}, {"w_in", random_floats({4, 4, 1, 1}, 25)}},
             GraphOptimization::All, 1e-5, &stats);
  CHECK(stats.fusions == 0);
  CHECK(stats.nodes_planned == stats.nodes_loaded);
}
