// Static shape inference checked against the ONNX backend node cases: for every case whose
// model loads and plans, the element types and shapes inferred from its inputs (with the
// values of small integer inputs, as an exporter's constants would give them) equal those of
// its expected outputs wherever they are inferred, and inferred integer values equal the
// expected ones.
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/passes/passes.h"
#include "engine/plan/plan.h"
#include "engine/plan/shape_inference.h"
#include "kiln/error.h"
#include "ops/core/inference.h"
#include "ops/core/kernel.h"
#include "proto/loader.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

std::string describe(const ops::ValueFacts& v) {
  return std::string(data_type_name(v.dtype)) + shape_to_string(v.shape);
}

}  // namespace

TEST_CASE("inferred shapes equal the outputs of the ONNX backend node cases", "[shapes]") {
  const fs::path root = testing::backend_test_data();
  if (root.empty() || !fs::is_directory(root / "node")) {
    WARN(
        "SKIPPED: no ONNX backend test data (set ONNX_BACKEND_TEST_DATA or put it in "
        "../shared/onnx-backend-tests beside the checkout)");
    return;
  }
  int planned = 0, fully_inferred = 0, outputs_inferred = 0, values_checked = 0;
  std::vector<std::string> wrong;
  for (const auto& entry : fs::directory_iterator(root / "node")) {
    const fs::path model_path = entry.path() / "model.onnx";
    const fs::path set = entry.path() / "test_data_set_0";
    if (!fs::exists(model_path) || !fs::is_directory(set)) continue;
    ir::Model m;
    std::unique_ptr<plan::GraphPlan> p;
    try {
      LoadStats ls;
      m = proto::load_model_file(model_path.string(), ls);
      passes::fold_constant_nodes(*m.graph);
      p = plan::build_plan(*m.graph);
    } catch (const Error&) {
      continue;  // unsupported ops and invalid models are other tests' subject
    }
    ++planned;
    const ir::Graph& g = *m.graph;
    std::vector<ops::ValueFacts> given(g.inputs.size());
    // The node cases give every input, in order.
    for (size_t k = 0; k < g.inputs.size(); ++k) {
      const fs::path file = set / ("input_" + std::to_string(k) + ".pb");
      const ir::TypeInfo& type = g.value(g.inputs[k]).type;
      if (!fs::exists(file) || type.kind != Value::Kind::Tensor) continue;
      const Value v = proto::read_value_file(file.string(), type, nullptr);
      if (v.is_tensor()) given[k] = plan::inferred_from(v.tensor());
    }
    std::vector<int32_t> order;
    for (const plan::Step& s : p->steps) order.push_back(s.node_index);
    const plan::ShapeInference r = plan::infer_shapes(g, order, given);
    if (r.first_unknown.empty()) ++fully_inferred;
    for (size_t k = 0; k < g.outputs.size(); ++k) {
      const ops::ValueFacts& got = r.values[static_cast<size_t>(g.outputs[k])];
      const fs::path file = set / ("output_" + std::to_string(k) + ".pb");
      const ir::TypeInfo& type = g.value(g.outputs[k]).type;
      if (!got.known || !fs::exists(file) || type.kind != Value::Kind::Tensor) continue;
      const Value v = proto::read_value_file(file.string(), type, nullptr);
      if (!v.is_tensor()) continue;
      const ops::ValueFacts want = plan::inferred_from(v.tensor());
      ++outputs_inferred;
      const std::string where = entry.path().filename().string() + " output " + std::to_string(k);
      if (got.dtype != want.dtype || got.shape != want.shape) {
        wrong.push_back(where + ": inferred " + describe(got) + ", expected " + describe(want));
      } else if (got.has_data && want.has_data) {
        ++values_checked;
        if (got.data != want.data) wrong.push_back(where + ": inferred values differ");
      }
    }
  }
  std::string list;
  for (size_t i = 0; i < wrong.size() && i < 20; ++i) list += wrong[i] + "\n";
  INFO(wrong.size() << " wrong of " << outputs_inferred << " outputs inferred:\n" << list);
  CHECK(wrong.empty());
  INFO("planned " << planned << ", fully inferred " << fully_inferred << ", outputs inferred "
                  << outputs_inferred << ", integer values checked " << values_checked);
  CHECK(outputs_inferred >= 1800);
  CHECK(values_checked >= 20);
}

// The node cases again with partial inputs: the first dimension of every input open (the
// batch of an exported model), or every dimension open. Whatever the rules still tell (type,
// rank, dimensions, elements) must be what the case's outputs have: partial facts are never
// wrong, only incomplete.
TEST_CASE("partial facts agree with the outputs of the ONNX backend node cases", "[shapes]") {
  const fs::path root = testing::backend_test_data();
  if (root.empty() || !fs::is_directory(root / "node")) {
    WARN(
        "SKIPPED: no ONNX backend test data (set ONNX_BACKEND_TEST_DATA or put it in "
        "../shared/onnx-backend-tests beside the checkout)");
    return;
  }
  int ranks = 0, dims = 0, elems = 0;
  std::vector<std::string> wrong;
  for (const auto& entry : fs::directory_iterator(root / "node")) {
    const fs::path model_path = entry.path() / "model.onnx";
    const fs::path set = entry.path() / "test_data_set_0";
    if (!fs::exists(model_path) || !fs::is_directory(set)) continue;
    ir::Model m;
    try {
      LoadStats ls;
      m = proto::load_model_file(model_path.string(), ls);
      passes::fold_constant_nodes(*m.graph);
      plan::build_plan(*m.graph);
    } catch (const Error&) {
      continue;
    }
    ir::Graph& g = *m.graph;
    for (const bool all_open : {false, true}) {
      // The declared input shapes open as the given facts are (else they would fill them in).
      for (ir::ValueId id : g.inputs) {
        ir::TypeInfo& type = g.value(id).type;
        if (type.kind != Value::Kind::Tensor || !type.shape) continue;
        for (size_t d = 0; d < type.shape->size() && (all_open || d == 0); ++d)
          (*type.shape)[d] = ir::Dim{-1, ""};
      }
      std::vector<ops::ValueFacts> given(g.inputs.size());
      for (size_t k = 0; k < g.inputs.size(); ++k) {
        const fs::path file = set / ("input_" + std::to_string(k) + ".pb");
        const ir::TypeInfo& type = g.value(g.inputs[k]).type;
        if (!fs::exists(file) || type.kind != Value::Kind::Tensor) continue;
        const Value v = proto::read_value_file(file.string(), type, nullptr);
        if (!v.is_tensor()) continue;
        const Shape& shape = v.tensor().shape();
        Shape open = shape;
        for (size_t d = 0; d < open.size() && (all_open || d == 0); ++d) open[d] = ops::kUnknownDim;
        // A scalar keeps its value (as a constant would); any other input loses its values.
        given[k] = shape.empty() ? plan::inferred_from(v.tensor())
                                 : ops::ranked_facts(v.tensor().dtype(), open);
      }
      const ops::GraphFacts r = ops::infer_graph(g, ir::topological_order(g), given, {});
      for (size_t k = 0; k < g.outputs.size(); ++k) {
        const ops::ValueFacts& got = r.values[static_cast<size_t>(g.outputs[k])];
        const fs::path file = set / ("output_" + std::to_string(k) + ".pb");
        const ir::TypeInfo& type = g.value(g.outputs[k]).type;
        if (!fs::exists(file) || type.kind != Value::Kind::Tensor) continue;
        const Value v = proto::read_value_file(file.string(), type, nullptr);
        if (!v.is_tensor()) continue;
        const ops::ValueFacts want = plan::inferred_from(v.tensor());
        const std::string where = entry.path().filename().string() + " output " +
                                  std::to_string(k) + (all_open ? " (all open)" : " (batch open)");
        if (got.dtype != DataType::Undefined && got.dtype != want.dtype) {
          wrong.push_back(where + ": type " + std::string(data_type_name(got.dtype)));
          continue;
        }
        if (!got.ranked) continue;
        ++ranks;
        if (got.shape.size() != want.shape.size()) {
          wrong.push_back(where + ": rank " + std::to_string(got.shape.size()) + ", expected " +
                          describe(want));
          continue;
        }
        for (size_t d = 0; d < got.shape.size(); ++d) {
          if (got.shape[d] == ops::kUnknownDim) continue;
          ++dims;
          if (got.shape[d] != want.shape[d]) {
            wrong.push_back(where + ": " + shape_to_string(got.shape) + ", expected " +
                            describe(want));
            break;
          }
        }
        for (size_t e = 0; want.has_data && e < got.num_elems() && e < want.data.size(); ++e) {
          const std::optional<int64_t> x = got.elem(e);
          if (!x) continue;
          ++elems;
          if (*x != want.data[e]) {
            wrong.push_back(where + ": element " + std::to_string(e));
            break;
          }
        }
      }
    }
  }
  std::string list;
  for (size_t i = 0; i < wrong.size() && i < 20; ++i) list += wrong[i] + "\n";
  INFO(wrong.size() << " wrong:\n" << list);
  CHECK(wrong.empty());
  INFO("ranks " << ranks << ", dimensions " << dims << ", elements " << elems << " checked");
  CHECK(ranks >= 1000);
  CHECK(dims >= 1000);
}

TEST_CASE("If is inferred through its branches", "[shapes]") {
  // then: x captured, concatenated with itself; else: x doubled. The branches differ in
  // shape, so the output is known only when the condition is.
  auto build = [](bool same_shapes) {
    GraphBuilder then_b("then");
    if (same_shapes) {
      then_b.node("Neg", {"x"}, {"t"});
    } else {
      then_b.node("Concat", {"x", "x"}, {"t"}, {int_attr("axis", 0)});
    }
    then_b.output("t");
    GraphBuilder else_b("else");
    else_b.node("Add", {"x", "x"}, {"e"});
    else_b.output("e");
    GraphBuilder b;
    b.input("x", DataType::Float, {3, 4});
    b.input("cond", DataType::Bool, {});
    b.node("If", {"cond"}, {"y"},
           {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
    b.output("y");
    return make_model(b.build()).graph;  // nodes take the model's opset
  };
  auto infer = [](const ir::Graph& g, std::optional<bool> cond) {
    std::vector<ops::ValueFacts> given(2);
    if (cond) given[1] = plan::inferred_from(Tensor::scalar<bool>(*cond));
    return plan::infer_shapes(g, ir::topological_order(g), given);
  };
  const auto differ = build(false);
  const ir::ValueId y = differ->outputs[0];
  const auto taken = infer(*differ, true);
  CHECK(taken.first_unknown.empty());
  CHECK(taken.values[static_cast<size_t>(y)].shape == Shape{6, 4});
  CHECK(infer(*differ, false).values[static_cast<size_t>(y)].shape == Shape{3, 4});
  const auto open = infer(*differ, std::nullopt);
  CHECK_FALSE(open.values[static_cast<size_t>(y)].known);
  CHECK_THAT(open.first_unknown, Catch::Contains("branches differ"));
  const auto same = build(true);
  const auto agreed = infer(*same, std::nullopt);
  CHECK(agreed.first_unknown.empty());
  CHECK(agreed.values[static_cast<size_t>(same->outputs[0])].shape == Shape{3, 4});
}

TEST_CASE("Loop is inferred through its body", "[shapes]") {
  // body(i, cond, acc): acc + x (carried, [2, 3]); item = Slice(xs, [i], [i+1]) ([1, 3]);
  // its condition stays true. With trip count M: acc [2, 3], items stacked to [M, 1, 3].
  auto build = [](std::optional<int64_t> trips) {
    GraphBuilder body("body");
    body.input("i", DataType::Int64, {});
    body.input("c", DataType::Bool, {});
    body.input("acc", DataType::Float, {2, 3});
    body.initializer("one", Tensor::from_vector<int64_t>({1}, {1}));
    body.initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
    body.node("Identity", {"c"}, {"c_out"});
    body.node("Add", {"acc", "x"}, {"acc_out"});
    body.node("Unsqueeze", {"i", "axes"}, {"start"});
    body.node("Add", {"start", "one"}, {"end"});
    body.node("Slice", {"xs", "start", "end"}, {"item"});
    body.output("c_out");
    body.output("acc_out");
    body.output("item");
    GraphBuilder b;
    b.input("x", DataType::Float, {2, 3});
    b.input("xs", DataType::Float, {100, 3});
    b.input("m", DataType::Int64, {});
    if (trips) b.initializer("m_value", Tensor::scalar<int64_t>(*trips));
    b.initializer("go", Tensor::scalar<bool>(true));
    b.node("Loop", {trips ? "m_value" : "m", "go", "x"}, {"acc", "items"},
           {graph_attr("body", body.build())});
    b.output("acc");
    b.output("items");
    return make_model(b.build()).graph;
  };
  auto infer = [](const ir::Graph& g) {
    return plan::infer_shapes(g, ir::topological_order(g), std::vector<ops::ValueFacts>(3));
  };
  for (int64_t trips : {0, 5, 64}) {
    INFO("trip count " << trips << " (each iteration's slice start known)");
    const auto g = build(trips);
    const auto r = infer(*g);
    CHECK(r.first_unknown.empty());
    CHECK(r.values[static_cast<size_t>(g->outputs[0])].shape == Shape{2, 3});
    // No iteration: the kernel shapes the empty output from the body's declared item
    // (undeclared here).
    const Shape items = trips == 0 ? Shape{0} : Shape{trips, 1, 3};
    CHECK(r.values[static_cast<size_t>(g->outputs[1])].shape == items);
  }
  // Longer: inferred once for all iterations, without the iteration number's value, so the
  // slice (whose length follows from it) stays unknown, and with it the node's outputs.
  const auto long_loop = build(65);
  CHECK_THAT(infer(*long_loop).first_unknown, Catch::Contains("Loop"));
  // M only known when run: inferred once too, so likewise unknown.
  const auto open = build(std::nullopt);
  const auto r = infer(*open);
  CHECK_FALSE(r.values[static_cast<size_t>(open->outputs[1])].known);
  CHECK_THAT(r.first_unknown, Catch::Contains("body output 2 is unknown"));
}

TEST_CASE("a long Loop keeps the shapes its body keeps", "[shapes]") {
  // body(i, cond, acc): acc + acc and an item -acc of acc's shape. M = 1000: the final acc
  // is known, and the items stack to [1000, 4]. With M given only when run, the final acc is
  // known when the node has no scan output.
  auto build = [](bool m_known, bool items) {
    GraphBuilder body("body");
    body.input("i", DataType::Int64, {});
    body.input("c", DataType::Bool, {});
    body.input("acc", DataType::Float, {4});
    body.node("Identity", {"c"}, {"c_out"});
    body.node("Add", {"acc", "acc"}, {"acc_out"});
    body.output("c_out");
    body.output("acc_out");
    if (items) {
      body.node("Neg", {"acc"}, {"item"});
      body.output("item");
    }
    GraphBuilder b;
    b.input("x", DataType::Float, {4});
    b.input("m_input", DataType::Int64, {});
    b.initializer("m", Tensor::scalar<int64_t>(1000));
    std::vector<std::string> outs{"acc"};
    if (items) outs.push_back("items");
    b.node("Loop", {m_known ? "m" : "m_input", "", "x"}, outs, {graph_attr("body", body.build())});
    for (const std::string& o : outs) b.output(o);
    return make_model(b.build()).graph;
  };
  auto infer = [](const ir::Graph& g) {
    return plan::infer_shapes(g, ir::topological_order(g), {});
  };
  const auto g = build(true, true);
  const auto r = infer(*g);
  CHECK(r.first_unknown.empty());
  CHECK(r.values[static_cast<size_t>(g->outputs[0])].shape == Shape{4});
  CHECK(r.values[static_cast<size_t>(g->outputs[1])].shape == Shape{1000, 4});
  const auto open = build(false, false);
  const auto ro = infer(*open);
  CHECK(ro.first_unknown.empty());
  CHECK(ro.values[static_cast<size_t>(open->outputs[0])].shape == Shape{4});
  const auto open_items = build(false, true);
  CHECK_THAT(infer(*open_items).first_unknown, Catch::Contains("trip count M"));
}

TEST_CASE("every registered op states its output facts (a shape rule)", "[shapes][contract]") {
  std::string missing;
  size_t ops_seen = 0;
  for (const ops::OpRegistration& r : ops::all_ops()) {
    ++ops_seen;
    if (!r.shape) missing += std::string(r.domain) + "." + r.op + " ";
  }
  INFO("ops without a shape rule: " << missing);
  CHECK(ops_seen > 200);
  CHECK(missing.empty());
}

TEST_CASE("partial facts keep ranks, fixed dimensions and the names of open ones", "[shapes]") {
  // x [batch, seq, 64] -> MatMul [64, 32] -> Add -> Reshape [0, 0, 2, 16] -> Transpose
  // -> Shape -> Gather(3) (16, folded by the passes); image [n, 3, h, 32] -> Conv 8x3x3x3
  // (pads 1) -> MaxPool 2x2 -> ReduceMean over the channels.
  GraphBuilder b;
  b.input("x", DataType::Float, {-1, -1, 64}, true);
  b.input("image", DataType::Float, {-1, 3, -1, 32}, true);
  b.initializer("w", Tensor::zeros(DataType::Float, {64, 32}));
  b.initializer("bias", Tensor::zeros(DataType::Float, {32}));
  b.initializer("target", Tensor::from_vector<int64_t>({4}, {0, 0, 2, 16}));
  b.initializer("three", Tensor::scalar<int64_t>(3));
  b.initializer("filter", Tensor::zeros(DataType::Float, {8, 3, 3, 3}));
  b.initializer("channels", Tensor::from_vector<int64_t>({1}, {1}));
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Add", {"h", "bias"}, {"hb"});
  b.node("Reshape", {"hb", "target"}, {"heads"});
  b.node("Transpose", {"heads"}, {"t"}, {ints_attr("perm", {0, 2, 1, 3})});
  b.node("Shape", {"t"}, {"shape"});
  b.node("Gather", {"shape", "three"}, {"head_size"}, {int_attr("axis", 0)});
  b.node("Conv", {"image", "filter"}, {"c"}, {ints_attr("pads", {1, 1, 1, 1})});
  b.node("MaxPool", {"c"}, {"p"},
         {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})});
  b.node("ReduceMean", {"p", "channels"}, {"m"}, {int_attr("keepdims", 0)});
  b.output("t").output("head_size").output("m");
  std::shared_ptr<ir::Graph> g = make_model(b.build()).graph;  // nodes take the model's opset
  // The model names its open dimensions.
  (*g->value(g->inputs[0]).type.shape)[0].param = "batch";
  (*g->value(g->inputs[0]).type.shape)[1].param = "seq";
  (*g->value(g->inputs[1]).type.shape)[0].param = "n";
  const ops::GraphFacts r = ops::infer_declared(*g);
  auto facts = [&](const char* name) { return r.values[static_cast<size_t>(g->find(name))]; };
  const ops::ValueFacts t = facts("t");
  CHECK_FALSE(t.known);
  CHECK(t.dtype == DataType::Float);
  CHECK(t.shape == Shape{ops::kUnknownDim, 2, ops::kUnknownDim, 16});
  CHECK(t.dim_name(0) == "batch");
  CHECK(t.dim_name(2) == "seq");
  const ops::ValueFacts shape = facts("shape");
  CHECK(shape.known);
  CHECK_FALSE(shape.has_data);
  CHECK(shape.elem(1) == 2);
  CHECK_FALSE(shape.elem(2).has_value());
  const ops::ValueFacts head = facts("head_size");
  REQUIRE(head.has_data);
  CHECK(head.data == std::vector<int64_t>{16});
  const ops::ValueFacts c = facts("c");
  CHECK(c.shape == Shape{ops::kUnknownDim, 8, ops::kUnknownDim, 32});
  CHECK(c.dim_name(0) == "n");
  CHECK(facts("p").shape == Shape{ops::kUnknownDim, 8, ops::kUnknownDim, 16});
  CHECK(facts("m").shape == Shape{ops::kUnknownDim, ops::kUnknownDim, 16});
  // The planner sees none of it as known, and says which node stopped it.
  const plan::ShapeInference planned = plan::infer_shapes(*g, ir::topological_order(*g), {});
  CHECK_FALSE(planned.values[static_cast<size_t>(g->find("t"))].known);
  CHECK_FALSE(planned.first_unknown.empty());
}
