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
#include "proto/loader.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

std::string describe(const plan::InferredValue& v) {
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
    std::vector<plan::InferredValue> given(g.inputs.size());
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
      const plan::InferredValue& got = r.values[static_cast<size_t>(g.outputs[k])];
      const fs::path file = set / ("output_" + std::to_string(k) + ".pb");
      const ir::TypeInfo& type = g.value(g.outputs[k]).type;
      if (!got.known || !fs::exists(file) || type.kind != Value::Kind::Tensor) continue;
      const Value v = proto::read_value_file(file.string(), type, nullptr);
      if (!v.is_tensor()) continue;
      const plan::InferredValue want = plan::inferred_from(v.tensor());
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
    std::vector<plan::InferredValue> given(2);
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
