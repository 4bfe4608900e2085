// Constant folding (engine/passes/constant_folding.cpp): where it must fire, the near misses
// where it must not, results equal to the unoptimised run, nested graphs, the weights it
// makes preparable, and sharing of folded values between sessions.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "engine/passes/passes.h"
#include "engine/runtime/session_internal.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"

using namespace kiln;
using namespace kiln::testing;
using kiln::proto::testing::model_bytes;

namespace {

Session session(std::shared_ptr<ir::Graph> g, GraphOptimization level,
                std::shared_ptr<Environment> env = nullptr) {
  SessionOptions so;
  so.environment = env ? env : std::make_shared<Environment>(1);
  so.optimization = level;
  return session_from_model(make_model(std::move(g)), so);
}

std::vector<float> run_x(Session& s, const Tensor& x) {
  return s.run({{"x", x}}).at(0).value.tensor().to_vector<float>();
}

// y = Reshape(x, Concat(Unsqueeze(Gather(Shape(c), 0)), [-1])): the exporters' shape chain,
// on a constant c [4, 6], then MatMul with Cast(int8 weight) * scale.
std::shared_ptr<ir::Graph> shape_chain_graph() {
  GraphBuilder b;
  b.input("x", DataType::Float, {24}, true);
  b.initializer("c", Tensor::zeros(DataType::Float, {4, 6}));
  b.initializer("zero", Tensor::scalar<int64_t>(0));
  b.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
  b.initializer("minus1", Tensor::from_vector<int64_t>({1}, {-1}));
  std::vector<int8_t> q(6 * 5);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(static_cast<int>(i) - 15);
  b.initializer("wq", Tensor::from_vector<int8_t>({6, 5}, q));
  b.initializer("scale", Tensor::scalar<float>(0.125f));
  b.node("Shape", {"c"}, {"shape"});
  b.node("Gather", {"shape", "zero"}, {"rows"}, {int_attr("axis", 0)});
  b.node("Unsqueeze", {"rows", "axes"}, {"rows1"});
  b.node("Concat", {"rows1", "minus1"}, {"target"}, {int_attr("axis", 0)});
  b.node("Reshape", {"x", "target"}, {"x2"});
  b.node("Cast", {"wq"}, {"wf"}, {int_attr("to", 1)});
  b.node("Mul", {"wf", "scale"}, {"w"});
  b.node("MatMul", {"x2", "w"}, {"y"});
  b.output("y");
  return b.build();
}

}  // namespace

TEST_CASE("shape arithmetic and weight dequantization on constants are folded at load",
          "[passes][folding]") {
  Tensor x = Tensor::zeros(DataType::Float, {24});
  for (int i = 0; i < 24; ++i) x.data<float>()[i] = std::sin(static_cast<float>(i));
  Session none = session(shape_chain_graph(), GraphOptimization::None);
  Session basic = session(shape_chain_graph(), GraphOptimization::Basic);
  CHECK(none.load_stats().folded_nodes == 0);
  // Shape, Gather, Unsqueeze, Concat, Cast and Mul; Reshape reads x, MatMul is the output.
  CHECK(basic.load_stats().folded_nodes == 6);
  CHECK(basic.load_stats().folded_bytes > 0);
  // The dequantized weight is now a constant: MatMul packs it when the session is made.
  CHECK(basic.load_stats().weights_prepared_count == 1);
  CHECK(none.load_stats().weights_prepared_count == 0);
  const auto a = run_x(none, x), b = run_x(basic, x);
  REQUIRE(a.size() == 20);
  CHECK(a == b);  // the same kernels ran, once at load instead of in every run
  CHECK(basic.last_run_stats().nodes_run == 2);
  CHECK(none.last_run_stats().nodes_run == 8);
}

TEST_CASE("constant folding leaves alone what it must not fold", "[passes][folding]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {3}, true);
  b.initializer("c", Tensor::from_vector<float>({3}, {1, 2, 3}));
  b.initializer("shape", Tensor::from_vector<int64_t>({1}, {3}));
  b.node("Add", {"x", "c"}, {"a"});                // reads an input
  b.node("RandomNormalLike", {"c"}, {"r"});        // random
  b.node("Mul", {"r", "c"}, {"rm"});               // downstream of random
  b.node("Neg", {"c"}, {"neg_out"});               // a graph output
  b.node("Reshape", {"c", "bad_shape"}, {"bad"});  // fails at load
  b.initializer("bad_shape", Tensor::from_vector<int64_t>({1}, {5}));
  b.node("Add", {"a", "rm"}, {"y"});
  b.node("Add", {"bad", "c"}, {"z"});
  b.output("y").output("neg_out").output("z");
  Session s = session(b.build(), GraphOptimization::All);
  CHECK(s.load_stats().folded_nodes == 0);
  // The node that could not be folded fails at run time with its own message.
  Tensor x = Tensor::from_vector<float>({3}, {0, 0, 0});
  CHECK_THROWS_WITH(s.run({{"x", x}}), Catch::Contains("Reshape"));
}

TEST_CASE("nodes inside an If branch fold on the enclosing graph's constants",
          "[passes][folding]") {
  GraphBuilder then_b("then");
  then_b.node("Neg", {"w"}, {"nw"});  // w is captured from the main graph
  then_b.node("Mul", {"x", "nw"}, {"t_out"});
  then_b.output("t_out");
  GraphBuilder else_b("else");
  else_b.node("Identity", {"x"}, {"e_out"});
  else_b.output("e_out");
  GraphBuilder b;
  b.input("x", DataType::Float, {2}, true);
  b.input("cond", DataType::Bool, {}, true);
  b.initializer("w", Tensor::from_vector<float>({2}, {2, 3}));
  auto parent = std::make_shared<ir::Graph>();
  b.node("If", {"cond"}, {"y"},
         {graph_attr("then_branch", then_b.build(parent.get())),
          graph_attr("else_branch", else_b.build(parent.get()))});
  b.output("y");
  auto g = b.build();
  for (auto& a : g->nodes[0].attributes) {
    if (a.g) a.g->parent = g.get();
  }
  Session s = session(g, GraphOptimization::Basic);
  CHECK(s.load_stats().folded_nodes == 1);  // Neg(w) in the then branch
  auto out =
      s.run({{"x", Tensor::from_vector<float>({2}, {1, 1})}, {"cond", Tensor::scalar<bool>(true)}});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{-2, -3});
}

TEST_CASE("sessions of one Environment keep one copy of a folded value", "[passes][folding]") {
  auto env = std::make_shared<Environment>(1);
  Session a = session(shape_chain_graph(), GraphOptimization::Basic, env);
  Session b = session(shape_chain_graph(), GraphOptimization::Basic, env);
  CHECK(a.load_stats().folded_shared_bytes == 0);
  CHECK(b.load_stats().folded_shared_bytes == b.load_stats().folded_bytes);
  CHECK(b.load_stats().folded_bytes > 0);
}

TEST_CASE("before IR version 4 an initializer listed as an input is a constant",
          "[passes][folding][loader]") {
  using proto::testing::ModelSpec;
  using proto::testing::TensorSpec;
  TempDir dir;
  for (const int64_t ir : {3, 8}) {
    ModelSpec spec;
    spec.ir_version = ir;
    spec.opset = 9;
    spec.inputs = {{"x", {2}}, {"w", {2}}};  // IR 3 lists every initializer as an input
    TensorSpec w;
    w.name = "w";
    w.dims = {2};
    w.values = {3, 4};
    spec.initializers = {w};
    spec.nodes = {{"Neg", {"w"}, {"nw"}, "neg", {}}, {"Add", {"x", "nw"}, {"y"}, "add", {}}};
    spec.outputs = {"y"};
    Session s(dir.file("ir" + std::to_string(ir) + ".onnx", model_bytes(spec)));
    auto out = s.run({{"x", Tensor::from_vector<float>({2}, {1, 1})}});
    CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{-2, -3});
    if (ir < 4) {
      CHECK(s.inputs().size() == 1);            // w is not an input a caller may replace
      CHECK(s.load_stats().folded_nodes == 1);  // so Neg(w) folds
    } else {
      CHECK(s.inputs().size() == 2);  // an input with a default value
      CHECK(s.load_stats().folded_nodes == 0);
    }
  }
}

namespace {

// x [batch?, seq?, 64] -> Reshape [0, -1, 2, 32] -> Transpose -> [batch?, 2, seq?, 32]; the
// scale 1 / sqrt(head size) computed from Shape -> Slice(-1:) (static: 32) or from
// Shape -> Gather(axis) (a symbolic dimension when `dim` is 0 or 2).
std::shared_ptr<ir::Graph> dynamic_scale_graph(bool slice_last, int64_t dim) {
  GraphBuilder b;
  b.input("x", DataType::Float, {-1, -1, 64}, true);
  b.initializer("target", Tensor::from_vector<int64_t>({4}, {0, -1, 2, 32}));
  b.initializer("minus1", Tensor::from_vector<int64_t>({1}, {-1}));
  b.initializer("big", Tensor::from_vector<int64_t>({1}, {std::numeric_limits<int64_t>::max()}));
  b.initializer("index", Tensor::scalar<int64_t>(dim));
  b.initializer("one", Tensor::scalar<float>(1.0f));
  b.node("Reshape", {"x", "target"}, {"heads"});
  b.node("Transpose", {"heads"}, {"t"}, {ints_attr("perm", {0, 2, 1, 3})});
  b.node("Shape", {"t"}, {"shape"});
  if (slice_last) {
    b.node("Slice", {"shape", "minus1", "big"}, {"d"});
  } else {
    b.node("Gather", {"shape", "index"}, {"d"}, {int_attr("axis", 0)});
  }
  b.node("Cast", {"d"}, {"df"}, {int_attr("to", 1)});
  b.node("Sqrt", {"df"}, {"root"});
  b.node("Div", {"one", "root"}, {"s"});
  b.node("Mul", {"t", "s"}, {"y"});
  b.output("y");
  return b.build();
}

}  // namespace

TEST_CASE("values computed from fixed dimensions of symbolic shapes are folded",
          "[passes][folding]") {
  std::mt19937 rng(3);
  for (const int64_t batch : {int64_t{1}, int64_t{3}}) {
    for (const int64_t seq : {int64_t{2}, int64_t{5}}) {
      const Tensor x = random_tensor(DataType::Float, {batch, seq, 64}, rng);
      // The head size (32) is fixed by the graph: the whole scale chain folds.
      for (const auto& [slice_last, dim] :
           {std::pair{true, int64_t{0}}, {false, int64_t{3}}, {false, int64_t{1}}}) {
        INFO("slice " << slice_last << " dim " << dim);
        Session none = session(dynamic_scale_graph(slice_last, dim), GraphOptimization::None);
        Session basic = session(dynamic_scale_graph(slice_last, dim), GraphOptimization::Basic);
        // Slice/Gather, Cast, Sqrt and Div fold; Shape is left without readers.
        CHECK(basic.load_stats().folded_nodes == 4);
        CHECK(basic.load_stats().nodes_planned == 3);  // Reshape, Transpose, Mul
        CHECK(run_x(none, x) == run_x(basic, x));
      }
      // Near misses: the batch and sequence dimensions are symbolic and stay computed.
      for (const int64_t dim : {int64_t{0}, int64_t{2}}) {
        INFO("dim " << dim);
        Session none = session(dynamic_scale_graph(false, dim), GraphOptimization::None);
        Session basic = session(dynamic_scale_graph(false, dim), GraphOptimization::Basic);
        CHECK(basic.load_stats().folded_nodes == 0);
        CHECK(basic.load_stats().nodes_planned == 8);
        CHECK(run_x(none, x) == run_x(basic, x));
      }
    }
  }
}

TEST_CASE("shape folding follows Concat, Unsqueeze and integer arithmetic on shapes",
          "[passes][folding]") {
  // Reshape(x [n?, 6], Concat(Unsqueeze(Gather(Shape(x), 1) * 2), [-1])): 12 is known, so the
  // target [12, -1] folds; Gather(Shape(x), 0) * 2 (n? * 2) does not.
  for (const int64_t axis : {int64_t{1}, int64_t{0}}) {
    auto make = [axis] {
      GraphBuilder b;
      b.input("x", DataType::Float, {-1, 6}, true);
      b.initializer("axis", Tensor::scalar<int64_t>(axis));
      b.initializer("two", Tensor::scalar<int64_t>(2));
      b.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
      b.initializer("minus1", Tensor::from_vector<int64_t>({1}, {-1}));
      b.node("Shape", {"x"}, {"shape"});
      b.node("Gather", {"shape", "axis"}, {"d"}, {int_attr("axis", 0)});
      b.node("Mul", {"d", "two"}, {"d2"});
      b.node("Unsqueeze", {"d2", "axes"}, {"d2v"});
      b.node("Concat", {"d2v", "minus1"}, {"target"}, {int_attr("axis", 0)});
      b.node("Reshape", {"x", "target"}, {"y"});
      b.output("y");
      return b.build();
    };
    INFO("axis " << axis);
    Session none = session(make(), GraphOptimization::None);
    Session basic = session(make(), GraphOptimization::Basic);
    CHECK(basic.load_stats().folded_nodes == (axis == 1 ? 4 : 0));
    CHECK(basic.load_stats().nodes_planned == (axis == 1 ? 1u : 6u));
    const Tensor x = Tensor::from_vector<float>({4, 6}, std::vector<float>(24, 1.5f));
    const auto a = none.run({{"x", x}}), b = basic.run({{"x", x}});
    CHECK(a[0].value.tensor().shape() == b[0].value.tensor().shape());
    CHECK(b[0].value.tensor().shape() == (axis == 1 ? Shape{12, 2} : Shape{8, 3}));
  }
}

TEST_CASE("shape folding reaches into If branches through the values they capture",
          "[passes][folding]") {
  // The branch computes Reshape(x, [Gather(Shape(x), 1) * 2, -1]) on the captured x [n?, 6]:
  // 12 follows from x's fixed dimension, as in the main graph (merged decoders keep their
  // whole step inside such a branch). With axis 0 (n?) nothing may fold.
  for (const int64_t axis : {int64_t{1}, int64_t{0}}) {
    auto make = [axis] {
      GraphBuilder then_b("then");
      then_b.node("Shape", {"x"}, {"shape"});
      then_b.node("Gather", {"shape", "axis"}, {"d"}, {int_attr("axis", 0)});
      then_b.node("Mul", {"d", "two"}, {"d2"});
      then_b.node("Unsqueeze", {"d2", "axes"}, {"d2v"});
      then_b.node("Concat", {"d2v", "minus1"}, {"target"}, {int_attr("axis", 0)});
      then_b.node("Reshape", {"x", "target"}, {"t_out"});
      then_b.output("t_out");
      GraphBuilder else_b("else");
      else_b.node("Reshape", {"x", "flat"}, {"e_out"});
      else_b.output("e_out");
      GraphBuilder b;
      b.input("x", DataType::Float, {-1, 6}, true);
      b.input("cond", DataType::Bool, {}, true);
      b.initializer("axis", Tensor::scalar<int64_t>(axis));
      b.initializer("two", Tensor::scalar<int64_t>(2));
      b.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
      b.initializer("minus1", Tensor::from_vector<int64_t>({1}, {-1}));
      b.initializer("flat", Tensor::from_vector<int64_t>({2}, {-1, 12}));
      auto parent = std::make_shared<ir::Graph>();
      b.node("If", {"cond"}, {"y"},
             {graph_attr("then_branch", then_b.build(parent.get())),
              graph_attr("else_branch", else_b.build(parent.get()))});
      b.output("y");
      auto g = b.build();
      for (auto& a : g->nodes[0].attributes) {
        if (a.g) a.g->parent = g.get();
      }
      return g;
    };
    INFO("axis " << axis);
    Session none = session(make(), GraphOptimization::None);
    Session basic = session(make(), GraphOptimization::Basic);
    CHECK(basic.load_stats().folded_nodes == (axis == 1 ? 4 : 0));
    CHECK(basic.load_stats().nodes_planned == (axis == 1 ? 3u : 8u));  // If + branches
    const Tensor x = Tensor::from_vector<float>({4, 6}, std::vector<float>(24, 1.5f));
    for (const bool cond : {true, false}) {
      const auto a = none.run({{"x", x}, {"cond", Tensor::scalar<bool>(cond)}});
      const auto b = basic.run({{"x", x}, {"cond", Tensor::scalar<bool>(cond)}});
      CHECK(a[0].value.tensor().shape() == b[0].value.tensor().shape());
      const Shape want = !cond ? Shape{2, 12} : axis == 1 ? Shape{12, 2} : Shape{8, 3};
      CHECK(a[0].value.tensor().shape() == want);
    }
  }
}

TEST_CASE("a Shape whose length only its declared type tells keeps the constants after it",
          "[passes][folding]") {
  // Reshape(g, Concat(Unsqueeze(Gather(Shape(g), 0)), [-1, 2, 32])) with g the output of a
  // com.microsoft op the rules do not follow: Shape(g) has 3 unknown elements when its type
  // is declared, so the head size 32 of the Reshape is known and Sqrt(Cast(Slice(Shape(.),
  // -1))) folds (onnxruntime's saved models declare such types); undeclared, it folds too:
  // Unsqueeze(Gather(.)) has one element whatever Shape(g)'s length, so the target has four.
  for (const bool declared : {true, false}) {
    auto make = [declared] {
      GraphBuilder b;
      b.input("x", DataType::Float, {-1, -1, 64}, true);
      b.initializer("zero", Tensor::scalar<int64_t>(0));
      b.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
      b.initializer("rest", Tensor::from_vector<int64_t>({3}, {-1, 2, 32}));
      b.initializer("last", Tensor::from_vector<int64_t>({1}, {-1}));
      b.initializer("end", Tensor::from_vector<int64_t>({1}, {1000}));
      b.node("Gelu", {"x"}, {"g"}, {}, "com.microsoft");
      b.node("Shape", {"g"}, {"shape"});
      b.node("Gather", {"shape", "zero"}, {"batch"}, {int_attr("axis", 0)});
      b.node("Unsqueeze", {"batch", "axes"}, {"batch1"});
      b.node("Concat", {"batch1", "rest"}, {"target"}, {int_attr("axis", 0)});
      b.node("Reshape", {"g", "target"}, {"heads"});
      b.node("Shape", {"heads"}, {"heads_shape"});
      b.node("Slice", {"heads_shape", "last", "end"}, {"head_size"});
      b.node("Cast", {"head_size"}, {"head_size_f"}, {int_attr("to", 1)});
      b.node("Sqrt", {"head_size_f"}, {"root"});
      b.node("Mul", {"heads", "root"}, {"y"});
      b.output("y");
      std::shared_ptr<ir::Graph> g = b.build();
      if (declared) g->value(g->find("shape")).type = ir::tensor_type(DataType::Int64, {3});
      return g;
    };
    INFO("declared " << declared);
    Session none = session(make(), GraphOptimization::None);
    Session basic = session(make(), GraphOptimization::Basic);
    CHECK(basic.load_stats().folded_nodes == 3);  // Slice, Cast, Sqrt
    std::mt19937 rng(5);
    const Tensor x = random_tensor(DataType::Float, {2, 3, 64}, rng);
    CHECK(run_x(none, x) == run_x(basic, x));
  }
}

TEST_CASE("shape folding follows Gemm, Split and Flatten", "[passes][folding]") {
  // y = Reshape(part, [-1, Gather(Shape(part), index)]) where part is one output of a Split of
  // Gemm(x [n?, 6], W [6, 10]) (variant 0: sizes [4, 6]; 1: an even split), or
  // Flatten(x3 [n?, 2, 3]) (variant 2). Axis 1 is fixed (6, 5, 6) and folds; axis 0 is n?.
  for (int variant = 0; variant < 3; ++variant) {
    for (const int64_t index : {int64_t{1}, int64_t{0}}) {
      auto make = [variant, index] {
        GraphBuilder b;
        if (variant == 2) {
          b.input("x", DataType::Float, {-1, 2, 3}, true);
          b.node("Flatten", {"x"}, {"part"}, {int_attr("axis", 1)});
        } else {
          b.input("x", DataType::Float, {-1, 6}, true);
          std::vector<float> w(60);
          for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i);
          b.initializer("w", Tensor::from_vector<float>({6, 10}, w));
          b.node("Gemm", {"x", "w"}, {"h"});
          if (variant == 0) {
            b.initializer("sizes", Tensor::from_vector<int64_t>({2}, {4, 6}));
            b.node("Split", {"h", "sizes"}, {"first", "part"}, {int_attr("axis", 1)});
          } else {
            b.node("Split", {"h"}, {"first", "part"},
                   {int_attr("axis", 1), int_attr("num_outputs", 2)});
          }
        }
        b.initializer("index", Tensor::scalar<int64_t>(index));
        b.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
        b.initializer("minus1", Tensor::from_vector<int64_t>({1}, {-1}));
        b.node("Shape", {"part"}, {"shape"});
        b.node("Gather", {"shape", "index"}, {"d"}, {int_attr("axis", 0)});
        b.node("Unsqueeze", {"d", "axes"}, {"dv"});
        b.node("Concat", {"minus1", "dv"}, {"target"}, {int_attr("axis", 0)});
        b.node("Reshape", {"part", "target"}, {"y"});
        b.output("y");
        return b.build();
      };
      INFO("variant " << variant << " index " << index);
      Session none = session(make(), GraphOptimization::None);
      Session basic = session(make(), GraphOptimization::Basic);
      const size_t producers = variant == 2 ? 1 : 2;  // Flatten, or Gemm and Split
      // Gather, Unsqueeze and Concat fold (the Shape is left without readers).
      CHECK(basic.load_stats().folded_nodes == (index == 1 ? 3u : 0u));
      CHECK(basic.load_stats().nodes_planned == producers + (index == 1 ? 1 : 5));
      std::mt19937 rng(5);
      const Tensor x =
          random_tensor(DataType::Float, variant == 2 ? Shape{3, 2, 3} : Shape{3, 6}, rng);
      const auto a = none.run({{"x", x}}), c = basic.run({{"x", x}});
      CHECK(a[0].value.tensor().shape() == c[0].value.tensor().shape());
      CHECK(a[0].value.tensor().to_vector<float>() == c[0].value.tensor().to_vector<float>());
    }
  }
}
