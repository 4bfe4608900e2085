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
#include "ops/kernel.h"
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
