// Test helpers: build one-node graphs in code and run them, make random tensors, and
// compare results with naive references.
//
//   Tensor y = OpTest("Relu", 14).input(x).run1();
//   auto outs = OpTest("Split", 18).input(x).constant_input(split).attr("axis",
//   1).outputs(2).run();
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/kiln.h"

namespace kiln::testing {

class OpTest {
 public:
  OpTest(std::string op, int64_t opset, std::string domain = "");

  OpTest& input(Value v);            // fed at run time
  OpTest& constant_input(Tensor t);  // an initializer: known when the kernel is created
  OpTest& no_input();                // an omitted optional input
  OpTest& attr(const std::string& name, int64_t v);
  OpTest& attr(const std::string& name, int v) { return attr(name, static_cast<int64_t>(v)); }
  OpTest& attr(const std::string& name, float v);
  OpTest& attr(const std::string& name, double v) { return attr(name, static_cast<float>(v)); }
  OpTest& attr(const std::string& name, const std::string& v);
  OpTest& attr(const std::string& name, const char* v) { return attr(name, std::string(v)); }
  OpTest& attr(const std::string& name, std::vector<int64_t> v);
  OpTest& attr(const std::string& name, std::vector<float> v);
  OpTest& attr(const std::string& name, std::vector<std::string> v);
  OpTest& attr(const std::string& name, Tensor v);
  OpTest& attr(const std::string& name, std::shared_ptr<ir::Graph> g);
  OpTest& outputs(size_t n);  // default 1
  // Hands the inputs to the run by move (they may then be overwritten in place; the OpTest
  // can run only once). By default inputs are fed by copy and only read.
  OpTest& owned_inputs() {
    owned_ = true;
    return *this;
  }
  OpTest& skip_output(size_t i);  // leave output i unnamed (optional output not requested)

  // Runs the node; throws kiln::Error like a session would.
  std::vector<Value> run();
  Tensor run1() { return run().at(0).tensor(); }
  // Stats of the last run().
  const RunStats& stats() const { return stats_; }

 private:
  ir::Model model_;
  ir::Node node_;
  std::vector<NamedValue> feeds_;
  size_t n_outputs_ = 1;
  std::vector<bool> skipped_;
  bool owned_ = false;
  RunStats stats_;
};

// Builds a graph in code, for executor, planner and control-flow tests.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name = "g");
  // A graph input; `shape` empty with `rank_known` false means undeclared shape.
  GraphBuilder& input(const std::string& name, DataType dtype, std::vector<int64_t> shape = {},
                      bool shape_known = false);
  GraphBuilder& initializer(const std::string& name, Tensor t);
  // A node; "" in `inputs` marks an omitted optional input.
  ir::Node& node(const std::string& op, std::vector<std::string> inputs,
                 std::vector<std::string> outputs, std::vector<ir::Attribute> attrs = {},
                 const std::string& domain = "");
  GraphBuilder& output(const std::string& name);
  // Finishes the graph. Names not defined here become captures (for nested graphs).
  std::shared_ptr<ir::Graph> build(const ir::Graph* parent = nullptr);

 private:
  struct PendingNode {
    std::string op, domain;
    std::vector<std::string> inputs, outputs;
    std::vector<ir::Attribute> attrs;
  };
  std::string name_;
  std::vector<std::pair<std::string, ir::TypeInfo>> inputs_;
  std::vector<std::pair<std::string, Tensor>> initializers_;
  std::vector<PendingNode> nodes_;
  std::vector<std::string> outputs_;
  ir::Node scratch_;
};

ir::Attribute int_attr(const std::string& name, int64_t v);
ir::Attribute float_attr(const std::string& name, float v);
ir::Attribute ints_attr(const std::string& name, std::vector<int64_t> v);
ir::Attribute string_attr(const std::string& name, const std::string& v);
ir::Attribute tensor_attr(const std::string& name, Tensor t);
ir::Attribute graph_attr(const std::string& name, std::shared_ptr<ir::Graph> g);

// A model whose main graph is `graph` with opset imports {"": opset} (plus `extra`).
ir::Model make_model(std::shared_ptr<ir::Graph> graph, int64_t opset = 18,
                     std::map<std::string, int64_t> extra = {});
// A session of that model on `threads` threads, optimised at `level`.
Session make_session(std::shared_ptr<ir::Graph> graph, int64_t opset = 18, int threads = 1,
                     GraphOptimization level = GraphOptimization::All);

// Uniform random values in [lo, hi] (integers: rounded), deterministic per generator.
Tensor random_tensor(DataType dtype, Shape shape, std::mt19937& rng, double lo = -1, double hi = 1);
// A random shape of `rank` dims each in [1, max_dim].
Shape random_shape(size_t rank, int64_t max_dim, std::mt19937& rng);

// Fails the test (with a description) unless the tensors match like the conformance runner.
void require_close(const Tensor& actual, const Tensor& expected, double rtol = 1e-4,
                   double atol = 1e-5);

// Element i of any numeric tensor as double (any layout, i in row-major order).
double element(const Tensor& t, int64_t i);

// The ONNX backend test data: $ONNX_BACKEND_TEST_DATA, else ../shared/onnx-backend-tests
// beside the checkout, else empty (tests then skip, saying so).
std::string backend_test_data();

// Every element of `t` within tol * (1 + |want|) of `want` (read as double), naming the first
// that is not.
void require_near(const Tensor& t, const std::vector<double>& want, double tol);

// An int32 tensor of this shape holding `v`.
Tensor int32_tensor(Shape shape, const std::vector<int32_t>& v);

// The integers of array `key` in a JSON file (expected_tokens.json and the like).
std::vector<int64_t> json_ints(const std::string& file, const std::string& key);

}  // namespace kiln::testing
