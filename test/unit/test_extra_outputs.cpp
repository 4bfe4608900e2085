// SessionOptions::extra_outputs: values a graph computes returned after its outputs, equal to
// the same values declared as outputs, with the rest of the graph still optimized.
#include <string>
#include <vector>

#include "engine/runtime/session_internal.h"
#include "kiln/error.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// x [2, 8] -> MatMul w -> Add b -> Gelu written out (0.5 x (1 + erf(x / sqrt 2))) -> Neg.
std::shared_ptr<ir::Graph> gelu_chain(const std::vector<std::string>& outputs) {
  GraphBuilder b;
  b.input("x", DataType::Float, {2, 8}, true);
  std::vector<float> w(8 * 8), bias(8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * static_cast<float>(i);
  b.initializer("w", Tensor::from_vector<float>({8, 8}, w));
  b.initializer("b", Tensor::from_vector<float>({8}, bias));
  b.initializer("root2", Tensor::scalar<float>(1.4142135f));
  b.initializer("one", Tensor::scalar<float>(1.0f));
  b.initializer("half", Tensor::scalar<float>(0.5f));
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Add", {"h", "b"}, {"hb"});
  b.node("Div", {"hb", "root2"}, {"d"});
  b.node("Erf", {"d"}, {"e"});
  b.node("Add", {"e", "one"}, {"e1"});
  b.node("Mul", {"hb", "e1"}, {"m"});
  b.node("Mul", {"m", "half"}, {"g"});
  b.node("Neg", {"g"}, {"y"});
  for (const std::string& o : outputs) b.output(o);
  return b.build();
}

Session make(std::shared_ptr<ir::Graph> g, std::vector<std::string> extra) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.extra_outputs = std::move(extra);
  return session_from_model(make_model(std::move(g)), so);
}

}  // namespace

TEST_CASE("extra outputs return inner values as declared outputs would", "[session]") {
  const Tensor x =
      Tensor::from_vector<float>({2, 8}, {0.1f, -0.4f, 0.9f, 1.3f, -2.0f, 0.0f, 0.7f, -0.3f, 1.1f,
                                          0.2f, -0.8f, 0.5f, 0.3f, -1.2f, 0.6f, 0.05f});
  Session plain = make(gelu_chain({"y"}), {});
  Session declared = make(gelu_chain({"y", "hb", "e"}), {});
  Session extra = make(gelu_chain({"y"}), {"hb", "e"});
  REQUIRE(extra.outputs().size() == 3);
  CHECK(extra.outputs()[1].name == "hb");
  CHECK(extra.outputs()[2].name == "e");
  const auto want = declared.run({{"x", x}});
  const auto got = extra.run({{"x", x}});
  REQUIRE(got.size() == 3);
  for (size_t k = 0; k < 3; ++k) {
    INFO(got[k].name);
    CHECK(got[k].name == want[k].name);
    CHECK(got[k].value.tensor().contiguous().to_vector<float>() ==
          want[k].value.tensor().contiguous().to_vector<float>());
  }
  // Without them the product takes its bias and the Gelu whole; with them the values they
  // name stay, and y is the same up to float rounding.
  CHECK(plain.graph_text().find("Erf(") == std::string::npos);
  CHECK(extra.graph_text().find("Erf(") != std::string::npos);
  const auto fused = plain.run({{"x", x}})[0].value.tensor().contiguous().to_vector<float>();
  const auto apart = got[0].value.tensor().contiguous().to_vector<float>();
  REQUIRE(fused.size() == apart.size());
  for (size_t i = 0; i < fused.size(); ++i) CHECK(fused[i] == Approx(apart[i]).margin(1e-6));
  // A name the graph lacks, or one already an output, fails naming it.
  CHECK_THROWS_WITH(make(gelu_chain({"y"}), {"nothing"}),
                    Catch::Contains("extra output 'nothing'"));
  CHECK_THROWS_WITH(make(gelu_chain({"y"}), {"y"}), Catch::Contains("already an output"));
}
