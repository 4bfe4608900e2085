// The dynamically quantized product rewrite of engine/passes/fusion/dynamic_quant_matmul.cpp
// (fuse_dynamic_quant_matmul) on hand-built graphs as onnxruntime's quantize_dynamic writes
// them: where it fires (one node left, results equal to the unoptimised graph bit for bit)
// and the near misses where it must leave the graph alone.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

Session session(std::shared_ptr<ir::Graph> g, GraphOptimization level) {
  return make_session(std::move(g), 20, 1, level);
}

Tensor random_floats(const Shape& shape, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t = Tensor::zeros(DataType::Float, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

Tensor random_bytes(DataType type, const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor t = Tensor::zeros(type, shape);
  auto* p = reinterpret_cast<uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

// The options of one quantize_dynamic chain.
struct Chain {
  DataType w_type = DataType::Int8;
  bool per_column = true;      // b_scale and b_zero of [N], else scalars
  bool b_zero = true;          // MatMulInteger's fourth input
  bool scale_first = true;     // Mul(a_scale, b_scale), else Mul(b_scale, a_scale)
  bool bias = true;            // the Add after the Mul
  int products = 1;            // MatMulIntegers reading the one DynamicQuantizeLinear
  bool foreign_scale = false;  // the sums scaled by Mul(b_scale, b_scale), not A's scale
  bool weights_constant = true;
  bool b_scale_2d = false;     // b_scale of [1, N]: not a form the fused ops take
  bool sum_is_output = false;  // the int32 sums are a graph output too
};

constexpr int64_t kM = 2, kRows = 9, kK = 37, kN = 19;

std::shared_ptr<ir::Graph> chain_graph(const Chain& c) {
  GraphBuilder b;
  b.input("x", DataType::Float, {kM, kRows, kK}, true);
  if (c.weights_constant) {
    b.initializer("w", random_bytes(c.w_type, {kK, kN}, 5));
  } else {
    b.input("w", c.w_type, {kK, kN}, true);
  }
  const Shape cols = c.per_column ? Shape{kN} : Shape{};
  Tensor scale = random_floats(c.b_scale_2d ? Shape{1, kN} : cols, 6, 0.001f, 0.02f);
  b.initializer("w_scale", scale);
  b.initializer("w_zero", random_bytes(c.w_type, cols, 7));
  b.initializer("bias", random_floats({kN}, 8, -1.0f, 1.0f));
  b.node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xz"});
  for (int p = 0; p < c.products; ++p) {
    const std::string s = std::to_string(p);
    b.node("MatMulInteger", {"xq", "w", "xz", c.b_zero ? "w_zero" : ""}, {"sum" + s});
    b.node("Cast", {"sum" + s}, {"sumf" + s},
           {int_attr("to", static_cast<int64_t>(DataType::Float))});
    const std::string a_scale = c.foreign_scale ? "w_scale" : "xs";
    b.node("Mul",
           c.scale_first ? std::vector<std::string>{a_scale, "w_scale"}
                         : std::vector<std::string>{"w_scale", a_scale},
           {"scales" + s});
    b.node("Mul", {"sumf" + s, "scales" + s}, {"y" + s});
    if (c.bias) {
      b.node("Add", {"bias", "y" + s}, {"out" + s});
      b.output("out" + s);
    } else {
      b.output("y" + s);
    }
    if (c.sum_is_output && p == 0) b.output("sum0");
  }
  return b.build();
}

std::vector<NamedValue> feeds(const Chain& c) {
  std::vector<NamedValue> f{{"x", random_floats({kM, kRows, kK}, 3, -2.0f, 3.0f)}};
  if (!c.weights_constant) f.push_back({"w", random_bytes(c.w_type, {kK, kN}, 5)});
  return f;
}

// Runs the chain unoptimised and optimised; the outputs must be equal bit for bit. Returns
// the optimised session's load stats.
LoadStats check_chain(const Chain& c) {
  Session plain = session(chain_graph(c), GraphOptimization::None);
  Session opt = session(chain_graph(c), GraphOptimization::All);
  const auto a = plain.run(feeds(c)), b = opt.run(feeds(c));
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    const Tensor x = a[k].value.tensor().contiguous(), y = b[k].value.tensor().contiguous();
    REQUIRE(x.shape() == y.shape());
    REQUIRE(x.dtype() == y.dtype());
    REQUIRE(std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0);
  }
  return opt.load_stats();
}

}  // namespace

TEST_CASE("quantize_dynamic's MatMulInteger chain becomes one DynamicQuantizeMatMul",
          "[passes][fusion][quant]") {
  for (int variant = 0; variant < 4; ++variant) {
    INFO("variant " << variant);
    Chain c;
    c.w_type = variant % 2 ? DataType::UInt8 : DataType::Int8;
    c.per_column = variant < 2;
    c.b_zero = variant != 3;
    c.scale_first = variant != 1;
    c.bias = variant != 2;
    const LoadStats s = check_chain(c);
    CHECK(s.fusions == 1);
    CHECK(s.nodes_planned == 1);  // DynamicQuantizeMatMul alone
  }
}

TEST_CASE("MatMulInteger chains sharing one quantized A become MatMulIntegerToFloat",
          "[passes][fusion][quant]") {
  Chain c;
  c.products = 3;  // query, key and value
  const LoadStats s = check_chain(c);
  CHECK(s.fusions == 3);
  CHECK(s.nodes_planned == 4);  // the DynamicQuantizeLinear and three products
}

TEST_CASE("MatMulIntegerToFloat reading a DynamicQuantizeLinear alone quantizes as it packs",
          "[passes][fusion][quant]") {
  for (bool bias : {false, true}) {
    auto make = [bias] {
      GraphBuilder b;
      b.input("x", DataType::Float, {kRows, kK}, true);
      b.initializer("w", random_bytes(DataType::Int8, {kK, kN}, 5));
      b.initializer("w_scale", random_floats({kN}, 6, 0.001f, 0.02f));
      b.initializer("bias", random_floats({kN}, 8, -1.0f, 1.0f));
      b.node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xz"});
      std::vector<std::string> in{"xq", "w", "xs", "w_scale", "xz"};
      if (bias) in.insert(in.end(), {"", "bias"});
      b.node("MatMulIntegerToFloat", in, {"y"}, {}, "com.microsoft");
      b.output("y");
      return b.build();
    };
    const std::vector<NamedValue> f{{"x", random_floats({kRows, kK}, 3, -2.0f, 3.0f)}};
    Session plain = session(make(), GraphOptimization::None);
    Session opt = session(make(), GraphOptimization::All);
    const Tensor x = plain.run(f)[0].value.tensor().contiguous();
    const Tensor y = opt.run(f)[0].value.tensor().contiguous();
    REQUIRE(std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0);
    CHECK(opt.load_stats().fusions == 1);
    CHECK(opt.load_stats().nodes_planned == 1);
  }
}

TEST_CASE("dynamically quantized chains the fused ops cannot take are left alone",
          "[passes][fusion][quant]") {
  Chain foreign_scale;
  foreign_scale.foreign_scale = true;
  Chain run_time_weights;
  run_time_weights.weights_constant = false;
  Chain scale_2d;
  scale_2d.b_scale_2d = true;
  Chain sums_read_elsewhere;
  sums_read_elsewhere.sum_is_output = true;
  for (const Chain& c : {foreign_scale, run_time_weights, scale_2d, sums_read_elsewhere}) {
    const LoadStats s = check_chain(c);
    CHECK(s.fusions == 0);
  }
}

TEST_CASE("com.microsoft.Gelu after DynamicQuantizeMatMul joins the product's store",
          "[passes][fusion][quant]") {
  for (const bool shared : {false, true}) {
    auto make = [shared] {
      GraphBuilder b;
      b.input("x", DataType::Float, {kRows, kK}, true);
      b.initializer("w", random_bytes(DataType::Int8, {kK, kN}, 5));
      b.initializer("w_scale", random_floats({kN}, 6, 0.01f, 0.2f));
      b.initializer("bias", random_floats({kN}, 8, -1.0f, 1.0f));
      b.node("DynamicQuantizeMatMul", {"x", "w", "w_scale", "", "bias"}, {"y"}, {},
             "com.microsoft");
      b.node("Gelu", {"y"}, {"g"}, {}, "com.microsoft");
      b.output("g");
      if (shared) b.output("y");  // the product is read elsewhere: left alone
      return b.build();
    };
    INFO("shared " << shared);
    const std::vector<NamedValue> f{{"x", random_floats({kRows, kK}, 3, -2.0f, 3.0f)}};
    Session plain = session(make(), GraphOptimization::None);
    Session opt = session(make(), GraphOptimization::All);
    const Tensor x = plain.run(f)[0].value.tensor().contiguous();
    const Tensor y = opt.run(f)[0].value.tensor().contiguous();
    REQUIRE(std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0);
    CHECK(opt.load_stats().fusions == (shared ? 0 : 1));
    CHECK(opt.load_stats().nodes_planned == (shared ? 2u : 1u));
  }
}
