// Hostile sizes and invalid models: sizes checked before anything is allocated, byte counts
// that cannot wrap, and models onnxruntime refuses refused here too, each with one clear error.
#include <cstring>
#include <limits>

#include "engine/runtime/session_internal.h"
#include "kiln/version.h"
#include "ops/core/kernel.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::proto::testing;

namespace {

// A .npy file of float32 with header shape `shape_text` followed by `data_bytes` bytes.
std::string npy_bytes(const std::string& shape_text, size_t data_bytes) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out += std::string(data_bytes, '\0');
  return out;
}

std::string npy_error(const std::string& path) {
  try {
    tooling::read_npy(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string load_error(const std::string& path) {
  try {
    Session s(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ModelSpec add_model(TensorSpec w) {
  ModelSpec m;
  m.inputs = {{"x", {4}}};
  m.initializers = {std::move(w)};
  m.nodes = {{"Add", {"x", "w"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  return m;
}

std::string run_error(Session& s, std::vector<NamedValue> inputs) {
  try {
    s.run(std::move(inputs));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("byte sizes of huge element counts are refused, never wrapped", "[limits]") {
  // 2^60 float32 elements are 2^65 bytes: a byte count that would wrap to 0.
  CHECK_THROWS_AS(storage_bytes(DataType::Float, int64_t{1} << 60), Error);
  CHECK(storage_bytes(DataType::Float, int64_t{1} << 40) == size_t{1} << 42);
  CHECK_THROWS_AS(Tensor::zeros(DataType::Float, {int64_t{1} << 30, int64_t{1} << 30}), Error);
  // More than any machine has: a kiln::Error of kind Memory stating the size, not bad_alloc.
  try {
    Tensor::zeros(DataType::Float, {int64_t{1} << 50});
    FAIL("allocated 4.5 PB");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Memory);
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("float32 tensor of shape [1125899906842624]") &&
                   Catch::Contains("needs 4.5 PB"));
  }
  // An empty tensor may have dimensions whose product overflows: no arithmetic wraps.
  const int64_t big = int64_t{1} << 48;
  CHECK(Tensor::zeros(DataType::Float, {big, big, 0}).numel() == 0);
  CHECK(Tensor::zeros(DataType::Float, {0, big, big}).numel() == 0);
  CHECK(shape_numel({big, big, 0}) == 0);
  CHECK(shape_numel({big, big}) == std::numeric_limits<int64_t>::max());
  CHECK(byte_size_text(512) == "512 B");
  CHECK(byte_size_text(3'600'000'000ULL) == "3.6 GB");
}

TEST_CASE(".npy headers are checked against the file before anything is allocated", "[limits]") {
  TempDir dir;
  // 2^60 elements: the byte count must not wrap to 0 and pass the size check.
  CHECK_THAT(npy_error(dir.file("wrap.npy", npy_bytes("(1073741824, 1073741824)", 0))),
             Catch::Contains("wrap.npy") && Catch::Contains("too large"));
  CHECK_THAT(npy_error(dir.file("wrap32.npy", npy_bytes("(4294967296, 4294967296)", 0))),
             Catch::Contains("wrap32.npy") && Catch::Contains("too large"));
  // 4.4 TB claimed by a short file: rejected by the size check (allocating first would fail).
  CHECK_THAT(npy_error(dir.file("huge.npy", npy_bytes("(1099511627776,)", 16))),
             Catch::Contains("holds 16 data bytes") && Catch::Contains("needs 4398046511104"));
  CHECK_THAT(npy_error(dir.file("short.npy", npy_bytes("(20000, 20000)", 16))),
             Catch::Contains("needs 1600000000"));
  CHECK_THAT(npy_error(dir.path.string()), Catch::Contains("not a regular file"));
  CHECK(tooling::read_npy(dir.file("ok.npy", npy_bytes("(2, 2)", 16))).shape() == Shape{2, 2});
}

TEST_CASE("typed tensor fields are counted before the tensor is allocated", "[limits]") {
  TempDir dir;
  // One float for a [2^40] tensor: allocating 4.4 TB first would fail with bad_alloc.
  TensorSpec w;
  w.name = "w";
  w.dims = {int64_t{1} << 40};
  w.values = {1.0f};
  w.store = TensorSpec::Store::Typed;
  CHECK_THAT(load_error(dir.file("typed.onnx", model_bytes(add_model(w)))),
             Catch::Contains("typed.onnx") && Catch::Contains("float_data holds 1 values") &&
                 Catch::Contains("needs 1099511627776"));
}

TEST_CASE("a Constant node of huge dims with one value is refused before allocating", "[limits]") {
  TempDir dir;
  ModelSpec m;
  m.inputs = {{"x", {4}}};
  m.nodes = {{"Constant", {}, {"c"}, "big", {}}, {"Add", {"x", "c"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  TensorSpec value;
  value.dims = {30000, 30000};
  value.values = {1.0f};
  value.store = TensorSpec::Store::Typed;
  m.nodes[0].tensor_attrs = {{"value", value}};
  CHECK_THAT(load_error(dir.file("const.onnx", model_bytes(m))),
             Catch::Contains("float_data holds 1 values") && Catch::Contains("needs 900000000"));
}

TEST_CASE("a sparse Constant too large to allocate names its file, node and tensor", "[limits]") {
  TempDir dir;
  ModelSpec m;
  m.inputs = {{"x", {4}}};
  m.nodes = {{"Constant", {}, {"c"}, "sparse_big", {}}, {"Add", {"x", "c"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  m.nodes[0].sparse_attrs = {{"sparse_value", {{1000000, 1000000}, {1.0f}, {0}}}};
  const std::string path = dir.file("sparse.onnx", model_bytes(m));
  try {
    Session s(path);
    FAIL("loaded");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Memory);
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("sparse.onnx") && Catch::Contains("node 'sparse_big' (Constant)") &&
                   Catch::Contains("sparse tensor 'sparse_big_sparse_value'") &&
                   Catch::Contains("4.0 TB"));
  }
  // The same small loads and runs.
  m.nodes[0].sparse_attrs = {{"sparse_value", {{4}, {2.0f}, {3}}}};
  Session small(dir.file("small.onnx", model_bytes(m)));
  const auto out = small.run({{"x", Tensor::from_vector<float>({4}, {1, 1, 1, 1})}});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{1, 1, 1, 3});
}

TEST_CASE("models newer than kiln reads are refused, naming the supported version", "[limits]") {
  TempDir dir;
  TensorSpec w;
  w.name = "w";
  w.dims = {4};
  w.values = {1, 2, 3, 4};
  ModelSpec opset = add_model(w);
  opset.opset = 99;
  CHECK_THAT(
      load_error(dir.file("opset.onnx", model_bytes(opset))),
      Catch::Contains("opset 99") && Catch::Contains("up to " + std::to_string(kMaxOnnxOpset)));
  ModelSpec ir = add_model(w);
  ir.ir_version = 99;
  CHECK_THAT(load_error(dir.file("ir.onnx", model_bytes(ir))),
             Catch::Contains("IR version 99") &&
                 Catch::Contains("up to " + std::to_string(kMaxIrVersion)));
  // The limit is the newest opset the op registry implements.
  int newest = 0;
  for (const ops::OpRegistration& r : ops::all_ops()) {
    if (std::string(r.domain).empty()) newest = std::max(newest, r.since);
  }
  CHECK(newest == kMaxOnnxOpset);
  ModelSpec none = add_model(w);
  none.outputs.clear();
  CHECK_THAT(load_error(dir.file("none.onnx", model_bytes(none))),
             Catch::Contains("the graph has no outputs"));
}

TEST_CASE("a negative Loop trip count runs no iteration", "[limits][loop]") {
  // body(i, cond, n) -> (cond, n + 1), stopping itself after 3 iterations.
  GraphBuilder body("body");
  body.input("i", DataType::Int64, {}, true);
  body.input("cond", DataType::Bool, {}, true);
  body.input("n", DataType::Float, {}, true);
  body.initializer("one", Tensor::scalar<float>(1));
  body.initializer("two", Tensor::scalar<int64_t>(2));
  body.node("Less", {"i", "two"}, {"go"});
  body.node("Add", {"n", "one"}, {"n_next"});
  body.output("go").output("n_next");
  GraphBuilder outer("main");
  outer.input("trips", DataType::Int64, {}, true);
  outer.input("go", DataType::Bool, {}, true);
  outer.initializer("n0", Tensor::scalar<float>(0));
  outer.node("Loop", {"trips", "go", "n0"}, {"n"}, {graph_attr("body", body.build())});
  outer.output("n");
  Session s = make_session(outer.build());
  auto run = [&](int64_t trips, bool go) {
    auto out = s.run({{"trips", Tensor::scalar<int64_t>(trips)}, {"go", Tensor::scalar<bool>(go)}});
    return out[0].value.tensor().to_vector<float>()[0];
  };
  CHECK(run(-1, true) == 0);  // not "no limit": 0 iterations, as onnxruntime
  CHECK(run(-5, true) == 0);
  CHECK(run(10, true) == 3);  // the body stops itself
  CHECK(run(2, true) == 2);
}

TEST_CASE("a Loop or Scan body returning another count of values than the node has is refused",
          "[limits][loop]") {
  // Loop body(i, cond, n) -> (cond, n + 1, n, extra...): one loop-carried value and, for a
  // node with one output, no scan outputs.
  auto loop = [](int body_scans, int node_outputs) {
    GraphBuilder body("body");
    body.input("i", DataType::Int64, {}, true);
    body.input("cond", DataType::Bool, {}, true);
    body.input("n", DataType::Float, {}, true);
    body.initializer("one", Tensor::scalar<float>(1));
    body.node("Identity", {"cond"}, {"cond_out"});
    body.node("Add", {"n", "one"}, {"n_next"});
    body.output("cond_out").output("n_next");
    for (int k = 0; k < body_scans; ++k) {
      body.node("Identity", {"n"}, {"scan" + std::to_string(k)});
      body.output("scan" + std::to_string(k));
    }
    GraphBuilder outer("main");
    outer.initializer("trips", Tensor::scalar<int64_t>(3));
    outer.initializer("go", Tensor::scalar<bool>(true));
    outer.input("n0", DataType::Float, {}, true);
    std::vector<std::string> outs;
    for (int k = 0; k < node_outputs; ++k) outs.push_back("out" + std::to_string(k));
    outer.node("Loop", {"trips", "go", "n0"}, outs, {graph_attr("body", body.build())});
    for (const std::string& o : outs) outer.output(o);
    return outer.build();
  };
  // Two scan outputs more than the node declares (onnxruntime: "returned type information for
  // 4 outputs. Expected 2").
  CHECK_THROWS_WITH(make_session(loop(2, 1)),
                    Catch::Contains("node 'Loop_0' (Loop)") &&
                        Catch::Contains("the body has 4 outputs; expected 2"));
  CHECK_THROWS_WITH(make_session(loop(0, 2)),
                    Catch::Contains("the body has 2 outputs; expected 3"));
  // Matching counts load and run: 3 iterations, the scan output stacked.
  Session s = make_session(loop(1, 2));
  const auto out = s.run({{"n0", Tensor::scalar<float>(0)}});
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>{3});
  CHECK(out[1].value.tensor().to_vector<float>() == std::vector<float>{0, 1, 2});

  // Scan body(state, x) -> (state + x, extra): one state, one scan input.
  auto scan = [](int node_outputs) {
    GraphBuilder body("body");
    body.input("s", DataType::Float, {1}, true);
    body.input("x", DataType::Float, {1}, true);
    body.node("Add", {"s", "x"}, {"s_next"});
    body.node("Identity", {"x"}, {"y"});
    body.output("s_next").output("y");
    GraphBuilder outer("main");
    outer.input("s0", DataType::Float, {1}, true);
    outer.input("xs", DataType::Float, {3, 1}, true);
    std::vector<std::string> outs;
    for (int k = 0; k < node_outputs; ++k) outs.push_back("out" + std::to_string(k));
    outer
        .node("Scan", {"s0", "xs"}, outs,
              {graph_attr("body", body.build()), int_attr("num_scan_inputs", 1)})
        .name = "the_scan";
    for (const std::string& o : outs) outer.output(o);
    return outer.build();
  };
  CHECK_THROWS_WITH(make_session(scan(1)),
                    Catch::Contains("node 'Scan_0' (Scan)") &&
                        Catch::Contains("the body has 2 outputs; expected 1"));
  CHECK_NOTHROW(make_session(scan(2)));
}

TEST_CASE("run-time values are checked against the types the model declares", "[limits]") {
  SECTION("If branches that declare different element types are refused at load") {
    GraphBuilder then_b("then");
    then_b.node("Identity", {"x"}, {"a"});
    then_b.output("a");
    GraphBuilder else_b("else");
    else_b.node("Cast", {"x"}, {"b"}, {int_attr("to", 7)});
    else_b.output("b");
    auto tg = then_b.build(), eg = else_b.build();
    tg->value(tg->outputs[0]).type = ir::tensor_type(DataType::Float, {2});
    eg->value(eg->outputs[0]).type = ir::tensor_type(DataType::Int64, {2});
    GraphBuilder m;
    m.input("x", DataType::Float, {2});
    m.input("c", DataType::Bool, {});
    m.node("If", {"c"}, {"y"}, {graph_attr("then_branch", tg), graph_attr("else_branch", eg)});
    m.output("y");
    CHECK_THROWS_WITH(make_session(m.build()),
                      Catch::Contains("float32 in then_branch but int64 in else_branch"));
  }
  SECTION("an If branch whose output is not its declared type fails the run") {
    GraphBuilder then_b("then");
    then_b.node("Cast", {"x"}, {"a"}, {int_attr("to", 7)});
    then_b.output("a");
    auto tg = then_b.build();
    tg->value(tg->outputs[0]).type = ir::tensor_type(DataType::Float, {2});
    GraphBuilder else_b("else");
    else_b.node("Identity", {"x"}, {"b"});
    else_b.output("b");
    GraphBuilder m;
    m.input("x", DataType::Float, {2});
    m.input("c", DataType::Bool, {});
    m.node("If", {"c"}, {"y"},
           {graph_attr("then_branch", tg), graph_attr("else_branch", else_b.build())});
    m.output("y");
    Session s = make_session(m.build());
    const Tensor x = Tensor::from_vector<float>({2}, {1, 2});
    CHECK_THAT(run_error(s, {{"x", x}, {"c", Tensor::scalar<bool>(true)}}),
               Catch::Contains("(If)") && Catch::Contains("declared float32 but is int64"));
    CHECK(run_error(s, {{"x", x}, {"c", Tensor::scalar<bool>(false)}}).empty());
  }
  SECTION("a graph output of another type than declared fails the run") {
    GraphBuilder m;
    m.input("x", DataType::Float, {2});
    m.node("Cast", {"x"}, {"y"}, {int_attr("to", 1)});
    m.output("y");
    auto g = m.build();
    g->value(g->outputs[0]).type = ir::tensor_type(DataType::Int64, {2});
    Session s = make_session(g);
    CHECK_THAT(run_error(s, {{"x", Tensor::from_vector<float>({2}, {1, 2})}}),
               Catch::Contains("graph output 'y' is declared int64 but is float32"));
  }
  SECTION("a loop-carried value that changes type fails the run") {
    GraphBuilder body("body");
    body.input("i", DataType::Int64, {}, true);
    body.input("cond", DataType::Bool, {}, true);
    body.input("n", DataType::Float, {}, true);
    body.node("Cast", {"n"}, {"n_next"}, {int_attr("to", 7)});
    body.node("Identity", {"cond"}, {"cond_out"});
    body.output("cond_out").output("n_next");
    GraphBuilder outer("main");
    outer.initializer("trips", Tensor::scalar<int64_t>(3));
    outer.initializer("go", Tensor::scalar<bool>(true));
    outer.input("n0", DataType::Float, {}, true);
    outer.node("Loop", {"trips", "go", "n0"}, {"n"}, {graph_attr("body", body.build())});
    outer.output("n");
    Session s = make_session(outer.build());
    CHECK_THAT(run_error(s, {{"n0", Tensor::scalar<float>(1)}}),
               Catch::Contains("loop-carried value 0 changes from float32 to int64"));
  }
}

TEST_CASE("ConvTranspose refuses output_padding not smaller than the stride or dilation",
          "[limits]") {
  auto run = [](int64_t opad) {
    return OpTest("ConvTranspose", 11)
        .input(Tensor::zeros(DataType::Float, {1, 1, 3, 3}))
        .input(Tensor::zeros(DataType::Float, {1, 1, 2, 2}))
        .attr("strides", std::vector<int64_t>{2, 2})
        .attr("output_padding", std::vector<int64_t>{opad, opad})
        .run1();
  };
  CHECK(run(1).shape() == Shape{1, 1, 7, 7});
  CHECK_THROWS_WITH(run(2), Catch::Contains("output_padding 2 must be smaller than the stride"));
}

TEST_CASE("SessionOptions::memory_limit fails the node whose output would go over it", "[limits]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {1, 1, 1}, true);
  b.initializer("shape", Tensor::from_vector<int64_t>({3}, {1000, 1000, 1000}));
  b.node("Tile", {"x", "shape"}, {"y"});
  b.output("y");
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.memory_limit = 1'000'000;
  Session s = session_from_model(make_model(b.build()), so);
  const std::string err = run_error(s, {{"x", Tensor::from_vector<float>({1, 1, 1}, {1})}});
  CHECK_THAT(err, Catch::Contains("(Tile)") && Catch::Contains("float32[1000,1000,1000]") &&
                      Catch::Contains("needs 4.0 GB, over the memory limit of 1.0 MB"));
  // A graph planned from shapes: its arena is not made over the limit either; the node fails.
  GraphBuilder planned;
  planned.input("x", DataType::Float, {1000, 1000}, true);
  planned.node("Neg", {"x"}, {"y"});
  planned.node("Exp", {"y"}, {"z"});
  planned.output("z");
  Session p = session_from_model(make_model(planned.build()), so);
  CHECK_THAT(run_error(p, {{"x", Tensor::zeros(DataType::Float, {1000, 1000})}}),
             Catch::Contains("(Neg)") && Catch::Contains("over the memory limit of 1.0 MB"));
  // ConstantOfShape to an enormous shape, and a Constant of huge dims with one value.
  GraphBuilder fill;
  fill.input("shape", DataType::Int64, {2}, true);
  fill.node("ConstantOfShape", {"shape"}, {"y"});
  fill.output("y");
  Session f = session_from_model(make_model(fill.build()), so);
  CHECK_THAT(run_error(f, {{"shape", Tensor::from_vector<int64_t>({2}, {1000000, 1000000})}}),
             Catch::Contains("(ConstantOfShape)") && Catch::Contains("needs 4.0 TB"));
  // Within the limit the same session runs.
  SessionOptions roomy = so;
  roomy.memory_limit = 64'000'000;
  GraphBuilder small;
  small.input("x", DataType::Float, {1}, true);
  small.initializer("shape", Tensor::from_vector<int64_t>({2}, {100, 100}));
  small.node("Expand", {"x", "shape"}, {"y"});
  small.output("y");
  Session ok = session_from_model(make_model(small.build()), roomy);
  CHECK(run_error(ok, {{"x", Tensor::from_vector<float>({1}, {1})}}).empty());
}

TEST_CASE("a broadcast view too large to copy fails naming the node that reads it", "[limits]") {
  // Expand gives a view of x's one value; Neg needs it dense: 4 TB, refused by the allocator
  // (no memory_limit set), named for the node, its op and the model.
  GraphBuilder b;
  b.input("x", DataType::Float, {1}, true);
  b.initializer("shape", Tensor::from_vector<int64_t>({2}, {1000000, 1000000}));
  b.node("Expand", {"x", "shape"}, {"wide"});
  b.node("Neg", {"wide"}, {"y"});
  b.output("y");
  Session s = make_session(b.build());
  const std::string err = run_error(s, {{"x", Tensor::from_vector<float>({1}, {1})}});
  CHECK_THAT(err, Catch::Contains("node 'Neg_1' (Neg)") &&
                      Catch::Contains("float32[1000000,1000000]") &&
                      Catch::Contains("needs 4.0 TB: out of memory"));
}

TEST_CASE("constant folding at load keeps to SessionOptions::memory_limit", "[limits][folding]") {
  // Range over constants of 67M elements (512 MiB), what a fuzzed RMSNormalization made of
  // its axis: with a 1 MB limit it is not computed at load; the run fails at the Range.
  GraphBuilder b;
  b.input("x", DataType::Float, {3}, true);
  b.initializer("start", Tensor::scalar<int64_t>(-67108863));
  b.initializer("limit", Tensor::scalar<int64_t>(2));
  b.initializer("delta", Tensor::scalar<int64_t>(1));
  b.node("Range", {"start", "limit", "delta"}, {"axes"});
  b.node("ReduceSum", {"x", "axes"}, {"y"});
  b.output("y");
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.memory_limit = 1'000'000;
  Session s = session_from_model(make_model(b.build()), so);
  CHECK(s.load_stats().folded_nodes == 0);
  CHECK_THAT(run_error(s, {{"x", Tensor::zeros(DataType::Float, {3})}}),
             Catch::Contains("(Range)") && Catch::Contains("over the memory limit of 1.0 MB"));
  // Without a limit a small Range folds as before.
  GraphBuilder small;
  small.input("x", DataType::Float, {3}, true);
  small.initializer("start", Tensor::scalar<int64_t>(0));
  small.initializer("limit", Tensor::scalar<int64_t>(1));
  small.initializer("delta", Tensor::scalar<int64_t>(1));
  small.node("Range", {"start", "limit", "delta"}, {"axes"});
  small.node("ReduceSum", {"x", "axes"}, {"y"});
  small.output("y");
  Session ok = session_from_model(make_model(small.build()), so);
  CHECK(ok.load_stats().folded_nodes == 1);
  CHECK(run_error(ok, {{"x", Tensor::zeros(DataType::Float, {3})}}).empty());
}

TEST_CASE("LayerNormalization takes a scale with leading dims of 1 beyond the axis", "[limits]") {
  // Found by the graph fuzzer: a scale of higher rank than the normalised axes.
  Tensor x = Tensor::from_vector<float>({2, 1, 4}, {1, 2, 3, 4, 4, 3, 2, 1});
  Tensor scale = Tensor::from_vector<float>({1, 1, 4}, {1, 2, 3, 4});
  Tensor flat = Tensor::from_vector<float>({4}, {1, 2, 3, 4});
  const Tensor a = OpTest("LayerNormalization", 17).input(x).input(scale).attr("axis", 2).run1();
  const Tensor b = OpTest("LayerNormalization", 17).input(x).input(flat).attr("axis", 2).run1();
  CHECK(a.shape() == Shape{2, 1, 4});
  CHECK(a.to_vector<float>() == b.to_vector<float>());
}
