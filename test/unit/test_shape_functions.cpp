// TopK, Transpose, Expand, Tile, Slice and Resize compute their output shapes with the function
// their shape rule calls: the kernel's output shape is the inferred one, and inputs the kernel
// rejects are rejected by the rule with the same words.
#include <string>
#include <vector>

#include "engine/plan/shape_inference.h"
#include "kiln/error.h"
#include "kiln/session.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Outcome {
  Shape shape;        // the kernel's output 0 (empty when it failed)
  std::string error;  // the kernel's error ("" when it ran)
  Shape inferred;     // the rule's output 0
  std::string why;    // why the rule could not tell ("" when it did)
};

// One node `op` on a float input `x` of `shape` and int64 initializers `ints` (inputs 1...).
Outcome run_and_infer(const std::string& op, const Shape& shape,
                      const std::vector<std::vector<int64_t>>& ints,
                      std::vector<ir::Attribute> attrs = {}, int64_t opset = 18) {
  GraphBuilder b;
  b.input("x", DataType::Float, shape, true);
  std::vector<std::string> inputs{"x"};
  for (size_t i = 0; i < ints.size(); ++i) {
    const std::string name = ints[i].empty() ? "" : "c" + std::to_string(i);
    if (!name.empty())
      b.initializer(name,
                    Tensor::from_vector<int64_t>({static_cast<int64_t>(ints[i].size())}, ints[i]));
    inputs.push_back(name);
  }
  std::vector<std::string> outputs{"y"};
  if (op == "TopK") outputs.push_back("indices");
  b.node(op, inputs, outputs, std::move(attrs));
  for (const std::string& name : outputs) b.output(name);
  const auto graph = b.build();
  Outcome o;
  const ir::Model model = make_model(graph, opset);  // gives the node its opset
  const plan::ShapeInference inferred = plan::infer_shapes(*model.graph, {0}, {});
  o.why = inferred.first_unknown;
  if (o.why.empty()) o.inferred = inferred.values[static_cast<size_t>(graph->outputs[0])].shape;
  try {
    Session s = make_session(b.build(), opset);
    const std::vector<NamedValue> out = s.run({{"x", Tensor::zeros(DataType::Float, shape)}});
    o.shape = out[0].value.tensor().shape();
  } catch (const Error& e) {
    o.error = e.what();
  }
  return o;
}

void check_agree(const Outcome& o) {
  INFO("kernel: " << shape_to_string(o.shape) << " " << o.error
                  << "; rule: " << shape_to_string(o.inferred) << " " << o.why);
  if (o.error.empty()) {
    CHECK(o.why.empty());
    CHECK(o.shape == o.inferred);
  }
}

// The kernel fails with `words`, and the rule leaves the output unknown for the same reason.
void check_rejected(const Outcome& o, const std::string& words) {
  INFO("kernel: " << o.error << "; rule: " << o.why);
  CHECK(o.error.find(words) != std::string::npos);
  CHECK(o.why.find(words) != std::string::npos);
}

}  // namespace

TEST_CASE("kernels compute their output shapes with their shape rule's function", "[contract]") {
  check_agree(run_and_infer("TopK", {3, 7, 2}, {{4}}, {int_attr("axis", 1)}));
  check_rejected(run_and_infer("TopK", {3, 7}, {{9}}), "k = 9 is outside [0, 7]");

  check_agree(run_and_infer("Transpose", {2, 3, 4}, {}, {ints_attr("perm", {2, 0, 1})}));
  check_agree(run_and_infer("Transpose", {2, 3, 4}, {}));

  check_agree(run_and_infer("Expand", {3, 1}, {{2, 1, 5}}));
  check_rejected(run_and_infer("Expand", {3, 1}, {{-2, 1}}), "has a negative dimension");

  check_agree(run_and_infer("Tile", {2, 3}, {{3, 2}}));
  check_rejected(run_and_infer("Tile", {2, 3}, {{3}}), "repeats has 1 entries");
  check_rejected(run_and_infer("Tile", {2, 3}, {{1, -1}}), "repeats has a negative value");

  check_agree(run_and_infer("Slice", {6, 8}, {{1, -7}, {5, 1}, {0, 1}, {2, -3}}));
  check_agree(run_and_infer("Slice", {6, 8}, {{1}, {100}}));
  check_rejected(run_and_infer("Slice", {6, 8}, {{0, 1}, {2, 3}, {1, -1}}), "is repeated");
  check_rejected(run_and_infer("Slice", {6, 8}, {{0}, {2}, {0}, {0}}), "step cannot be 0");
  check_rejected(run_and_infer("Slice", {6, 8}, {{0, 1}, {2}}), "must have the same length");

  // Resize by integer sizes (roi and scales omitted), stretched and with an aspect policy.
  check_agree(run_and_infer("Resize", {1, 1, 4, 6}, {{}, {}, {1, 1, 8, 9}}));
  check_agree(run_and_infer(
      "Resize", {1, 1, 4, 6}, {{}, {}, {7, 9}},
      {ints_attr("axes", {2, 3}), string_attr("keep_aspect_ratio_policy", "not_larger")}));
  check_rejected(run_and_infer("Resize", {1, 1, 4, 6}, {{}, {}, {1, 1, -8, 9}}),
                 "sizes has a negative value -8");
  check_rejected(run_and_infer("Resize", {1, 1, 4, 6}, {{}, {}, {8, 9}}),
                 "sizes has 2 values for 4 axes");
}
