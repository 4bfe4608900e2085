// The executor and planner on hand-built graphs: values freed after their last use, the
// pool reused across runs, in-place writes only into owned values, captures through
// nested graphs, and exact copy counts.
#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("a value's buffer is reused once its last reader has run", "[executor]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {1024});
  b.node("Exp", {"x"}, {"t1"});
  b.node("Less", {"t1", "x"}, {"t2"});  // last reader of t1
  b.node("Exp", {"x"}, {"t3"});         // gets t1's buffer back from the pool
  b.output("t2").output("t3");
  SessionOptions so;  // the pool alone (the arena would serve t1)
  so.environment = std::make_shared<Environment>(1);
  so.memory_arena = false;
  Session s = session_from_model(make_model(b.build()), so);
  Tensor x = Tensor::zeros(DataType::Float, {1024});
  s.run({{"x", x}});
  CHECK(s.last_run_stats().allocations == 2);
  CHECK(s.last_run_stats().peak_bytes_in_use == 4096 + 1024);
  s.run({{"x", x}});
  CHECK(s.last_run_stats().allocations == 0);  // the second run allocates nothing new
  CHECK(s.last_run_stats().pool_reuses == 3);
}

TEST_CASE("ops write in place only into values the run owns", "[executor][inplace]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {256});
  b.node("Neg", {"x"}, {"a"});
  b.node("Neg", {"a"}, {"b"});
  b.node("Neg", {"b"}, {"c"});
  b.output("c");
  Session s = make_session(b.build());

  SECTION("an input passed by copy is only read") {
    Tensor x = Tensor::from_vector<float>({256}, std::vector<float>(256, 2.0f));
    auto out = s.run({{"x", x}});
    CHECK(x.data<float>()[0] == 2.0f);
    CHECK(out[0].value.tensor().data<float>()[0] == -2.0f);
    CHECK(s.last_run_stats().allocations == 1);  // a; b and c overwrite it
    CHECK(s.last_run_stats().in_place_ops == 2);
  }
  SECTION("an input passed by move is overwritten: no allocation at all") {
    Tensor x = Tensor::from_vector<float>({256}, std::vector<float>(256, 2.0f));
    const std::byte* storage = x.raw_data();
    auto out = s.run({{"x", std::move(x)}});
    CHECK(s.last_run_stats().allocations == 0);
    CHECK(s.last_run_stats().in_place_ops == 3);
    CHECK(out[0].value.tensor().raw_data() == storage);
    CHECK(out[0].value.tensor().data<float>()[0] == -2.0f);
  }
  SECTION("a value read again later is not overwritten") {
    GraphBuilder b2;
    b2.input("x", DataType::Float, {4});
    b2.node("Neg", {"x"}, {"a"});
    b2.node("Exp", {"a"}, {"b"});  // not a's last reader
    b2.node("Add", {"a", "b"}, {"c"});
    b2.output("c");
    Session s2 = make_session(b2.build());
    auto out = s2.run({{"x", Tensor::from_vector<float>({4}, {0, 1, 2, 3})}});
    const auto c = out[0].value.tensor().to_vector<float>();
    for (int i = 0; i < 4; ++i) CHECK(c[static_cast<size_t>(i)] == Approx(-i + std::exp(-i)));
  }
}

TEST_CASE("weights are never written", "[executor][inplace]") {
  GraphBuilder b;
  b.initializer("w", Tensor::from_vector<float>({2}, {1, 2}));
  b.input("x", DataType::Float, {2});
  b.node("Neg", {"w"}, {"a"});
  b.node("Add", {"a", "x"}, {"y"});
  b.output("y");
  Session s = make_session(b.build());
  for (int i = 0; i < 2; ++i) {  // the weight must be intact on the second run
    auto out = s.run({{"x", Tensor::from_vector<float>({2}, {10, 10})}});
    CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{9, 8});
  }
}

// An If inside a Loop body, both reading values of the enclosing graphs.
std::shared_ptr<ir::Graph> nested_capture_graph() {
  // then: acc + x (x from the outermost graph); else: acc - y.
  GraphBuilder then_b("then");
  then_b.node("Add", {"acc", "x"}, {"then_out"});
  then_b.output("then_out");
  GraphBuilder else_b("else");
  else_b.node("Sub", {"acc", "y"}, {"else_out"});
  else_b.output("else_out");
  // body(i, cond, acc): even = (i % 2 == 0); acc' = If(even) ...
  GraphBuilder body("body");
  body.input("i", DataType::Int64, {}, true);
  body.input("cond", DataType::Bool, {}, true);
  body.input("acc", DataType::Float, {2}, true);
  body.initializer("two", Tensor::scalar<int64_t>(2));
  body.initializer("zero", Tensor::scalar<int64_t>(0));
  body.node("Mod", {"i", "two"}, {"rem"});
  body.node("Equal", {"rem", "zero"}, {"even"});
  body.node("If", {"even"}, {"acc_next"},
            {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
  body.node("Not", {"cond"}, {"ncond"});
  body.node("Not", {"ncond"}, {"cond_out"});
  body.output("cond_out").output("acc_next");
  GraphBuilder outer("main");
  outer.input("trips", DataType::Int64, {}, true);
  outer.input("x", DataType::Float, {2});
  outer.input("y", DataType::Float, {2});
  outer.input("acc0", DataType::Float, {2});
  outer.initializer("true", Tensor::scalar<bool>(true));
  outer.node("Loop", {"trips", "true", "acc0"}, {"acc"}, {graph_attr("body", body.build())});
  outer.output("acc");
  return outer.build();
}

TEST_CASE("nested graphs see enclosing values through captures at any depth", "[executor][ir]") {
  auto g = nested_capture_graph();
  const ir::Node& loop = g->nodes.at(0);
  const ir::Graph& body = *loop.attr("body")->g;
  // The body reads x and y only on behalf of its If: they are captures of the body and
  // implicit inputs of the Loop node.
  std::vector<std::string> body_captures;
  for (ir::ValueId c : body.captures) body_captures.push_back(body.value(c).name);
  CHECK(body_captures == std::vector<std::string>{"x", "y"});
  std::vector<std::string> loop_implicit;
  for (ir::ValueId v : loop.implicit_inputs) loop_implicit.push_back(g->value(v).name);
  CHECK(loop_implicit == std::vector<std::string>{"x", "y"});
  const ir::Node* if_node = nullptr;
  for (const ir::Node& n : body.nodes) {
    if (n.op_type == "If") if_node = &n;
  }
  REQUIRE(if_node);
  std::vector<std::string> if_implicit;
  for (ir::ValueId v : if_node->implicit_inputs) if_implicit.push_back(body.value(v).name);
  CHECK(if_implicit == std::vector<std::string>{"acc", "x", "y"});

  Session s = make_session(g);
  // 5 iterations: +x at i=0,2,4 and -y at i=1,3.
  auto out = s.run({{"trips", Tensor::scalar<int64_t>(5)},
                    {"x", Tensor::from_vector<float>({2}, {1, 10})},
                    {"y", Tensor::from_vector<float>({2}, {2, 20})},
                    {"acc0", Tensor::from_vector<float>({2}, {0, 0})}});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{3 - 4, 30 - 40});
}

TEST_CASE("a Loop of 1,000 iterations reading a 1 MiB capture copies none of it",
          "[executor][loop]") {
  // body(i, cond, n): reads the whole captured `big` (Less), carries n' = n + 1.
  GraphBuilder body("body");
  body.input("i", DataType::Int64, {}, true);
  body.input("cond", DataType::Bool, {}, true);
  body.input("n", DataType::Float, {}, true);
  body.initializer("one", Tensor::scalar<float>(1));
  body.node("Less", {"big", "n"}, {"below"});
  body.node("Not", {"cond"}, {"c1"});
  body.node("Not", {"c1"}, {"cond_out"});
  body.node("Add", {"n", "one"}, {"n_next"});
  body.output("cond_out").output("n_next");
  GraphBuilder outer("main");
  outer.input("big", DataType::Float, {262144});
  outer.initializer("trips", Tensor::scalar<int64_t>(1000));
  outer.initializer("true", Tensor::scalar<bool>(true));
  outer.initializer("n0", Tensor::scalar<float>(0));
  outer.node("Loop", {"trips", "true", "n0"}, {"n"}, {graph_attr("body", body.build())});
  outer.output("n");
  Session s = make_session(outer.build());
  Tensor big = Tensor::zeros(DataType::Float, {262144});  // 1 MiB
  auto out = s.run({{"big", big}});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{1000});
  CHECK(s.last_run_stats().bytes_copied == 0);
  CHECK(s.last_run_stats().bytes_copied_capture == 0);
  CHECK(s.last_run_stats().nodes_run == 1 + 1000 * 4);
  // Each iteration's 256 KiB of comparisons reuse one pooled buffer; with the first run's
  // output released, the second run allocates nothing.
  out.clear();
  s.run({{"big", big}});
  CHECK(s.last_run_stats().allocations == 0);
}

TEST_CASE("the plan runs readers that never write in place before an in-place consumer",
          "[plan][inplace]") {
  // Both orders in the file: Neg (in place) listed before or after IsNaN reading x.
  for (bool shape_first : {false, true}) {
    GraphBuilder b;
    b.input("x", DataType::Float, {3});
    if (shape_first) b.node("IsNaN", {"x"}, {"m"});
    b.node("Neg", {"x"}, {"y"});
    if (!shape_first) b.node("IsNaN", {"x"}, {"m"});
    b.output("y").output("m");
    Session s = make_session(b.build());
    Tensor x = Tensor::from_vector<float>({3}, {1, 2, 3});
    auto out = s.run({{"x", std::move(x)}});
    INFO("shape_first " << shape_first);
    CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{-1, -2, -3});
    CHECK(s.last_run_stats().in_place_ops == 1);
  }
}

TEST_CASE("OpTest can hand inputs over by move to test in-place paths", "[executor][inplace]") {
  OpTest shared("Relu", 14);
  shared.input(Tensor::from_vector<float>({4}, {-1, 2, -3, 4}));
  shared.run();
  CHECK(shared.stats().in_place_ops == 0);
  OpTest owned("Relu", 14);
  owned.input(Tensor::from_vector<float>({4}, {-1, 2, -3, 4})).owned_inputs();
  CHECK(owned.run1().to_vector<float>() == std::vector<float>{0, 2, 0, 4});
  CHECK(owned.stats().in_place_ops == 1);
  CHECK(owned.stats().allocations == 0);
}

TEST_CASE("If branches may return outputs of different shapes and ranks", "[executor][if]") {
  // then: a [2,3] matrix and a scalar; else: a [4] vector and a [1,1,2] tensor. The node's
  // declared outputs have no shape, as in exporters' merged decoders.
  GraphBuilder then_b("matrix");
  then_b.node("Reshape", {"x", "shape23"}, {"m"});
  then_b.node("ReduceSum", {"x"}, {"total"}, {int_attr("keepdims", 0)});
  then_b.initializer("shape23", Tensor::from_vector<int64_t>({2}, {2, 3}));
  then_b.output("m").output("total");
  GraphBuilder else_b("vector");
  else_b.node("Slice", {"x", "starts", "ends"}, {"v"});
  else_b.node("Reshape", {"v2", "shape112"}, {"t"});
  else_b.node("Slice", {"x", "starts", "ends2"}, {"v2"});
  else_b.initializer("starts", Tensor::from_vector<int64_t>({1}, {0}));
  else_b.initializer("ends", Tensor::from_vector<int64_t>({1}, {4}));
  else_b.initializer("ends2", Tensor::from_vector<int64_t>({1}, {2}));
  else_b.initializer("shape112", Tensor::from_vector<int64_t>({3}, {1, 1, 2}));
  else_b.output("v").output("t");
  GraphBuilder m;
  m.input("x", DataType::Float, {6});
  m.input("cond", DataType::Bool, {1});
  m.node("If", {"cond"}, {"a", "b"},
         {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
  m.node("Shape", {"a"}, {"a_shape"});
  m.output("a").output("b").output("a_shape");
  Session s = make_session(m.build());
  const std::vector<float> x{1, 2, 3, 4, 5, 6};
  for (bool cond : {true, false, true}) {
    INFO("cond " << cond);
    auto out = s.run({{"x", Tensor::from_vector<float>({6}, x)},
                      {"cond", Tensor::from_vector<bool>({1}, {cond})}});
    const Tensor& a = out[0].value.tensor();
    const Tensor& b = out[1].value.tensor();
    if (cond) {
      CHECK(a.shape() == Shape{2, 3});
      CHECK(a.to_vector<float>() == x);
      CHECK(b.shape() == Shape{});
      CHECK(b.to_vector<float>() == std::vector<float>{21});
      CHECK(out[2].value.tensor().to_vector<int64_t>() == std::vector<int64_t>{2, 3});
    } else {
      CHECK(a.shape() == Shape{4});
      CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
      CHECK(b.shape() == Shape{1, 1, 2});
      CHECK(b.to_vector<float>() == std::vector<float>{1, 2});
      CHECK(out[2].value.tensor().to_vector<int64_t>() == std::vector<int64_t>{4});
    }
  }
}
