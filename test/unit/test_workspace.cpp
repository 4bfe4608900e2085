// Kernels whose scratch is a workspace their contract declares (Conv, ConvTranspose,
// DeformConv, com.microsoft Attention, the ops on the shared attention core: ONNX Attention,
// MultiHeadAttention, GroupQueryAttention, FlexAttention, and LinearAttention,
// LayerNormalization, SkipLayerNormalization, MatMul, Gemm, QGemm, QLinearMatMul, ConvInteger,
// QLinearConv, MatMulNBits, SoftmaxCrossEntropyLoss, Einsum): on two threads, where the per-thread
// parts of their workspaces take a slot per thread, and for float16, whose widened inputs and float
// results are parts too, the arena planned from the contracts equals the one recorded from the run,
// and no kernel takes scratch outside it (RunStats::unplanned_scratch). The results equal those of
// one thread.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/session.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Case {
  std::shared_ptr<ir::Graph> (*graph)();
  std::vector<std::pair<std::string, Shape>> inputs;
  DataType dtype = DataType::Float;
  int64_t opset = 19;
  bool uint8 = false;  // the inputs are uint8 (quantized products)
};

std::vector<NamedValue> feeds(const Case& c) {
  std::mt19937 rng(7);
  std::vector<NamedValue> v;
  for (const auto& [name, shape] : c.inputs) {
    if (c.uint8) {
      v.push_back({name, random_tensor(DataType::UInt8, shape, rng, 0, 255)});
      continue;
    }
    Tensor t = random_tensor(DataType::Float, shape, rng, -1, 1);
    if (c.dtype == DataType::Float16) {
      Tensor h = Tensor::zeros(DataType::Float16, shape);
      for (int64_t i = 0; i < t.numel(); ++i) h.data<float16>()[i] = float16(t.data<float>()[i]);
      t = h;
    } else if (c.dtype == DataType::Double) {
      Tensor d = Tensor::zeros(DataType::Double, shape);
      for (int64_t i = 0; i < t.numel(); ++i) d.data<double>()[i] = t.data<float>()[i];
      t = d;
    }
    v.push_back({name, t});
  }
  return v;
}

// Runs `c` twice on `threads` threads: the first run's arena planned from the contracts,
// the second's recorded from the first. Returns the first run's outputs.
std::vector<NamedValue> check_planned(const Case& c, int threads) {
  Session s = make_session(c.graph(), c.opset, threads);
  std::vector<NamedValue> out = s.run(feeds(c));
  const RunStats first = s.last_run_stats();
  s.run(feeds(c));
  const RunStats second = s.last_run_stats();
  INFO("threads " << threads << ": planned " << first.arena_bytes << " bytes ("
                  << first.arena_missed << " missed), recorded " << second.arena_bytes << " ("
                  << second.arena_missed << " missed)");
  CHECK(first.arena_from_shapes);
  CHECK(first.arena_missed == 0);
  CHECK(second.arena_missed == 0);
  CHECK(first.arena_bytes == second.arena_bytes);
  CHECK(first.arena_served == second.arena_served);
  CHECK(first.unplanned_scratch == 0);
  CHECK(second.unplanned_scratch == 0);
  return out;
}

void check_case(const Case& c) {
  const std::vector<NamedValue> one = check_planned(c, 1);
  const std::vector<NamedValue> two = check_planned(c, 2);
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    require_close(two[i].value.tensor(), one[i].value.tensor(),
                  c.dtype == DataType::Float16 ? 1e-2 : 1e-4, 1e-3);
  }
}

DataType g_dtype = DataType::Float;  // the element type the graphs below are built with

std::shared_ptr<ir::Graph> conv_transpose() {
  GraphBuilder b;
  b.input("x", g_dtype, {1, 64, 32, 32}, true);
  b.input("w", g_dtype, {64, 32, 3, 3}, true);
  b.input("b", g_dtype, {32}, true);
  b.node("ConvTranspose", {"x", "w", "b"}, {"y"}, {ints_attr("strides", {2, 2})});
  b.output("y");
  return b.build();
}

std::shared_ptr<ir::Graph> deform_conv() {
  GraphBuilder b;
  b.input("x", g_dtype, {1, 16, 32, 32}, true);
  b.input("w", g_dtype, {32, 16, 3, 3}, true);
  b.input("offset", g_dtype, {1, 18, 30, 30}, true);
  b.input("b", g_dtype, {32}, true);
  b.input("mask", g_dtype, {1, 9, 30, 30}, true);
  b.node("DeformConv", {"x", "w", "offset", "b", "mask"}, {"y"});
  b.output("y");
  return b.build();
}

// The filter is a graph input: packed at run time, into the workspace.
std::shared_ptr<ir::Graph> conv() {
  GraphBuilder b;
  b.input("x", g_dtype, {1, 16, 40, 40}, true);
  b.input("w", g_dtype, {32, 16, 3, 3}, true);
  b.input("b", g_dtype, {32}, true);
  b.node("Conv", {"x", "w", "b"}, {"y"}, {ints_attr("pads", {1, 1, 1, 1})});
  b.output("y");
  return b.build();
}

// Two output channels per group run the direct loops; a column stride of 3 makes each task
// pad its input plane into the workspace.
std::shared_ptr<ir::Graph> conv_padded_planes() {
  GraphBuilder b;
  b.input("x", g_dtype, {1, 16, 40, 40}, true);
  b.input("w", g_dtype, {8, 4, 3, 3}, true);
  b.node("Conv", {"x", "w"}, {"y"}, {int_attr("group", 4), ints_attr("strides", {3, 3})});
  b.output("y");
  return b.build();
}

// Weights given at run time (float16: widened in the workspace), past and present.
std::shared_ptr<ir::Graph> attention() {
  GraphBuilder b;
  b.input("x", g_dtype, {2, 8, 64}, true);
  b.input("w", g_dtype, {64, 192}, true);
  b.input("b", g_dtype, {192}, true);
  b.input("past", g_dtype, {2, 2, 4, 3, 16}, true);
  b.node("Attention", {"x", "w", "b", "", "past"}, {"y", "present"},
         {int_attr("num_heads", 4), int_attr("unidirectional", 1)}, "com.microsoft");
  b.output("y");
  b.output("present");
  return b.build();
}

// Grouped heads with a past and no present outputs (present in the workspace), an additive
// mask (float16: converted, as are Q, K, V and Y), long enough query blocks that K and V are
// packed once for the tasks, whose scores are per-thread parts.
std::shared_ptr<ir::Graph> onnx_attention() {
  GraphBuilder b;
  b.input("q", g_dtype, {2, 4, 64, 16}, true);
  b.input("k", g_dtype, {2, 2, 64, 16}, true);
  b.input("v", g_dtype, {2, 2, 64, 16}, true);
  b.input("mask", g_dtype, {64, 72}, true);
  b.input("past_k", g_dtype, {2, 2, 8, 16}, true);
  b.input("past_v", g_dtype, {2, 2, 8, 16}, true);
  b.node("Attention", {"q", "k", "v", "mask", "past_k", "past_v"}, {"y"});
  b.output("y");
  return b.build();
}

// Bias added to Q, K and V, a past without present outputs, unidirectional with a per-head
// attention_bias (one mask in the workspace).
std::shared_ptr<ir::Graph> multihead_attention() {
  GraphBuilder b;
  b.input("q", DataType::Float, {2, 16, 64}, true);
  b.input("k", DataType::Float, {2, 16, 64}, true);
  b.input("v", DataType::Float, {2, 16, 64}, true);
  b.input("bias", DataType::Float, {192}, true);
  b.input("attn_bias", DataType::Float, {1, 4, 16, 24}, true);
  b.input("past_k", DataType::Float, {2, 4, 8, 16}, true);
  b.input("past_v", DataType::Float, {2, 4, 8, 16}, true);
  b.node("MultiHeadAttention", {"q", "k", "v", "bias", "", "attn_bias", "past_k", "past_v"}, {"y"},
         {int_attr("num_heads", 4), int_attr("unidirectional", 1)}, "com.microsoft");
  b.output("y");
  return b.build();
}

// Rotated queries and keys, grouped heads, the batch's lengths from constant inputs, present
// in the workspace.
std::shared_ptr<ir::Graph> group_query_attention() {
  GraphBuilder b;
  b.input("q", DataType::Float, {1, 4, 64}, true);
  b.input("k", DataType::Float, {1, 4, 32}, true);
  b.input("v", DataType::Float, {1, 4, 32}, true);
  b.input("past_k", DataType::Float, {1, 2, 6, 16}, true);
  b.input("past_v", DataType::Float, {1, 2, 6, 16}, true);
  b.input("cos", DataType::Float, {16, 8}, true);
  b.input("sin", DataType::Float, {16, 8}, true);
  Tensor seqlens = Tensor::zeros(DataType::Int32, {1});
  seqlens.data<int32_t>()[0] = 9;
  b.initializer("seqlens", seqlens);
  b.initializer("total", Tensor::scalar<int32_t>(10));
  b.node("GroupQueryAttention",
         {"q", "k", "v", "past_k", "past_v", "seqlens", "total", "cos", "sin"}, {"y"},
         {int_attr("num_heads", 4), int_attr("kv_num_heads", 2), int_attr("do_rotary", 1)},
         "com.microsoft");
  b.output("y");
  return b.build();
}

// Grouped heads; float16 inputs computed in float, float ones with float16 probabilities
// (rounded in the workspace and widened back).
std::shared_ptr<ir::Graph> flex_attention() {
  GraphBuilder b;
  b.input("q", g_dtype, {2, 4, 24, 16}, true);
  b.input("k", g_dtype, {2, 2, 40, 16}, true);
  b.input("v", g_dtype, {2, 2, 40, 8}, true);
  std::vector<ir::Attribute> attrs;
  if (g_dtype == DataType::Float) attrs.push_back(int_attr("softmax_precision", 10));
  b.node("FlexAttention", {"q", "k", "v"}, {"y"}, attrs, "ai.onnx.preview");
  b.output("y");
  return b.build();
}

// The gated delta rule with grouped heads, a past state and the state output (float16:
// inputs widened, output and state kept in float), a product's rows per thread slot.
std::shared_ptr<ir::Graph> linear_attention() {
  GraphBuilder b;
  b.input("q", g_dtype, {2, 8, 64}, true);
  b.input("k", g_dtype, {2, 8, 32}, true);
  b.input("v", g_dtype, {2, 8, 32}, true);
  b.input("past", g_dtype, {2, 2, 16, 16}, true);
  b.input("decay", g_dtype, {2, 8, 2}, true);
  b.input("beta", g_dtype, {2, 8, 2}, true);
  b.node("LinearAttention", {"q", "k", "v", "past", "decay", "beta"}, {"y", "state"},
         {int_attr("q_num_heads", 4), int_attr("kv_num_heads", 2)});
  b.output("y");
  b.output("state");
  return b.build();
}

// `shape` of g_dtype, random: an initializer's value.
Tensor constant(Shape shape, unsigned seed) {
  std::mt19937 rng(seed);
  const Tensor t = random_tensor(DataType::Float, shape, rng, -1, 1);
  if (g_dtype == DataType::Float) return t;
  Tensor h = Tensor::zeros(g_dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) h.data<float16>()[i] = float16(t.data<float>()[i]);
  return h;
}

// A scale that varies over the leading dims (expanded per row), a bias of the normalised
// shape (read in place for float, widened for float16); rows enough for a task per thread.
std::shared_ptr<ir::Graph> layer_norm() {
  GraphBuilder b;
  b.input("x", g_dtype, {4, 64, 256}, true);
  b.input("scale", g_dtype, {64, 256}, true);
  b.input("bias", g_dtype, {256}, true);
  b.node("LayerNormalization", {"x", "scale", "bias"}, {"y", "mean", "inv_std"},
         {int_attr("axis", -1)});
  b.output("y");
  b.output("mean");
  b.output("inv_std");
  return b.build();
}

// The skip broadcasts and the sum is no output: the sum is a workspace part.
std::shared_ptr<ir::Graph> skip_layer_norm_broadcast() {
  GraphBuilder b;
  b.input("x", g_dtype, {4, 32, 128}, true);
  b.input("skip", g_dtype, {32, 128}, true);
  b.input("gamma", g_dtype, {128}, true);
  b.input("beta", g_dtype, {128}, true);
  b.node("SkipLayerNormalization", {"x", "skip", "gamma", "beta"}, {"y"}, {}, "com.microsoft");
  b.output("y");
  return b.build();
}

// Every output, a bias; input and skip of one shape.
std::shared_ptr<ir::Graph> skip_layer_norm_sum() {
  GraphBuilder b;
  b.input("x", g_dtype, {4, 32, 128}, true);
  b.input("skip", g_dtype, {4, 32, 128}, true);
  b.input("gamma", g_dtype, {128}, true);
  b.input("beta", g_dtype, {128}, true);
  b.input("bias", g_dtype, {128}, true);
  b.node("SkipLayerNormalization", {"x", "skip", "gamma", "beta", "bias"},
         {"y", "mean", "inv_std", "sum"}, {}, "com.microsoft");
  b.output("y");
  b.output("mean");
  b.output("inv_std");
  b.output("sum");
  return b.build();
}

// B given at run time (widened into the workspace for float16) and B an initializer (packed
// at load: no part for it).
std::shared_ptr<ir::Graph> matmul() {
  GraphBuilder b;
  b.input("a", g_dtype, {2, 3, 40, 48}, true);
  b.input("b", g_dtype, {48, 56}, true);
  b.initializer("w", constant({56, 24}, 3));
  b.node("MatMul", {"a", "b"}, {"ab"});
  b.node("MatMul", {"ab", "w"}, {"y"});
  b.output("y");
  return b.build();
}

// C a row of Y (the epilogue's bias, a part for float too) and C of Y's shape; B transposed.
std::shared_ptr<ir::Graph> gemm() {
  GraphBuilder b;
  b.input("a", g_dtype, {64, 48}, true);
  b.input("b", g_dtype, {40, 48}, true);
  b.input("c", g_dtype, {40}, true);
  b.input("w", g_dtype, {40, 32}, true);
  b.input("full", g_dtype, {64, 32}, true);
  b.node("Gemm", {"a", "b", "c"}, {"ab"}, {int_attr("transB", 1), float_attr("beta", 0.5f)});
  b.node("Gemm", {"ab", "w", "full"}, {"y"}, {float_attr("alpha", 2.0f)});
  b.output("y");
  return b.build();
}

Tensor scalar(DataType dtype, float v) {
  Tensor t = Tensor::zeros(dtype, {});
  if (dtype == DataType::Float) t.data<float>()[0] = v;
  if (dtype == DataType::UInt8) t.data<uint8_t>()[0] = static_cast<uint8_t>(v);
  return t;
}

// QGemm's int32 sums, and QLinearMatMul's into a float8 output.
std::shared_ptr<ir::Graph> quantized_products() {
  GraphBuilder b;
  b.input("a", DataType::UInt8, {48, 64}, true);
  b.input("b", DataType::UInt8, {64, 40}, true);
  b.initializer("sa", scalar(DataType::Float, 0.02f));
  b.initializer("za", scalar(DataType::UInt8, 128));
  b.initializer("sb", scalar(DataType::Float, 0.01f));
  b.initializer("zb", scalar(DataType::UInt8, 120));
  b.initializer("sy", scalar(DataType::Float, 0.5f));
  b.initializer("zy", Tensor::zeros(DataType::Float8E4M3FN, {}));
  b.node("QGemm", {"a", "sa", "za", "b", "sb", "zb"}, {"y"}, {}, "com.microsoft");
  b.node("QLinearMatMul", {"a", "sa", "za", "b", "sb", "zb", "sy", "zy"}, {"q8"});
  b.output("y");
  b.output("q8");
  return b.build();
}

// QLinearMatMul of float8 inputs (cast from the uint8 inputs): A and B decoded and centred in
// double and a batch's double product in the workspace.
std::shared_ptr<ir::Graph> float8_product() {
  GraphBuilder b;
  b.input("a", DataType::UInt8, {2, 16, 24}, true);
  b.input("b", DataType::UInt8, {24, 20}, true);
  b.initializer("sa", scalar(DataType::Float, 0.02f));
  b.initializer("za", Tensor::zeros(DataType::Float8E4M3FN, {}));
  b.initializer("sb", scalar(DataType::Float, 0.01f));
  b.initializer("zb", Tensor::zeros(DataType::Float8E4M3FN, {}));
  b.initializer("sy", scalar(DataType::Float, 0.5f));
  b.initializer("zy", scalar(DataType::UInt8, 100));
  b.node("Cast", {"a"}, {"a8"}, {int_attr("to", 17)});
  b.node("Cast", {"b"}, {"b8"}, {int_attr("to", 17)});
  b.node("QLinearMatMul", {"a8", "sa", "za", "b8", "sb", "zb", "sy", "zy"}, {"y"});
  b.output("y");
  return b.build();
}

// ConvInteger and QLinearConv with a filter given at run time: packed into the workspace.
std::shared_ptr<ir::Graph> integer_convs() {
  GraphBuilder b;
  b.input("x", DataType::UInt8, {1, 4, 10, 10}, true);
  b.input("w", DataType::UInt8, {8, 4, 3, 3}, true);
  b.initializer("sx", scalar(DataType::Float, 0.02f));
  b.initializer("zx", scalar(DataType::UInt8, 128));
  b.initializer("sw", scalar(DataType::Float, 0.01f));
  b.initializer("zw", scalar(DataType::UInt8, 120));
  b.initializer("sy", scalar(DataType::Float, 0.5f));
  b.initializer("zy", scalar(DataType::UInt8, 100));
  b.node("ConvInteger", {"x", "w", "zx", "zw"}, {"y"}, {ints_attr("pads", {1, 1, 1, 1})});
  b.node("QLinearConv", {"x", "sx", "zx", "w", "sw", "zw", "sy", "zy"}, {"q"});
  b.output("y");
  b.output("q");
  return b.build();
}

// SoftmaxCrossEntropyLoss with the log-probabilities as an output (float: computed there, no
// workspace; float16: in float in the workspace) and without (the workspace for both).
std::shared_ptr<ir::Graph> softmax_cross_entropy() {
  std::mt19937 rng(9);
  GraphBuilder b;
  b.input("x", g_dtype, {4, 10, 6}, true);
  b.initializer("t", random_tensor(DataType::Int64, {4, 6}, rng, 0, 9));
  b.node("SoftmaxCrossEntropyLoss", {"x", "t"}, {"loss", "log_prob"});
  b.node("SoftmaxCrossEntropyLoss", {"x", "t"}, {"each"}, {string_attr("reduction", "none")});
  b.output("loss");
  b.output("log_prob");
  b.output("each");
  return b.build();
}

// MatMulNBits: many rows (panels per task, A^T packed), few rows streamed in float and
// quantized to int8 (accuracy_level 4). K 256, N 1024, 4-bit blocks of 32: the many
// rows are work for two tasks, each with a panel of its own (256 columns, kPanelFloats).
std::shared_ptr<ir::Graph> matmul_nbits() {
  std::mt19937 rng(5);
  GraphBuilder b;
  b.input("a", DataType::Float, {2, 24, 256}, true);
  b.input("row", DataType::Float, {3, 256}, true);
  b.initializer("q", random_tensor(DataType::UInt8, {1024, 8, 16}, rng, 0, 255));
  b.initializer("s", random_tensor(DataType::Float, {8192}, rng, 0.01, 0.1));
  const std::vector<ir::Attribute> attrs = {int_attr("K", 256), int_attr("N", 1024),
                                            int_attr("bits", 4), int_attr("block_size", 32)};
  std::vector<ir::Attribute> int8 = attrs;
  int8.push_back(int_attr("accuracy_level", 4));
  b.node("MatMulNBits", {"a", "q", "s"}, {"y"}, attrs, "com.microsoft");
  b.node("MatMulNBits", {"row", "q", "s"}, {"r"}, attrs, "com.microsoft");
  b.node("MatMulNBits", {"row", "q", "s"}, {"r8"}, int8, "com.microsoft");
  b.output("y");
  b.output("r");
  b.output("r8");
  return b.build();
}

// Einsum: three operands contracted through an intermediate product, and a label of one
// operand summed out first with an operand whose contracted labels must be gathered
// (float16: every operand widened and the result computed in float).
std::shared_ptr<ir::Graph> einsum() {
  GraphBuilder b;
  b.input("a", g_dtype, {4, 16, 24}, true);
  b.input("b", g_dtype, {4, 24, 20}, true);
  b.input("c", g_dtype, {20, 12}, true);
  b.input("x", g_dtype, {16, 12, 10, 3}, true);
  b.input("z", g_dtype, {10, 12, 14}, true);
  b.node("Einsum", {"a", "b", "c"}, {"y"}, {string_attr("equation", "bij,bjk,kl->bil")});
  b.node("Einsum", {"x", "z"}, {"w"}, {string_attr("equation", "abcs,cbd->ad")});
  b.output("y");
  b.output("w");
  return b.build();
}

}  // namespace

TEST_CASE("kernels with per-thread and float16 workspaces are planned from their contracts",
          "[arena][workspace]") {
  for (DataType dtype : {DataType::Float, DataType::Float16}) {
    g_dtype = dtype;
    INFO(data_type_name(dtype));
    SECTION(std::string("ConvTranspose ") + std::string(data_type_name(dtype))) {
      check_case(
          {conv_transpose, {{"x", {1, 64, 32, 32}}, {"w", {64, 32, 3, 3}}, {"b", {32}}}, dtype});
    }
    SECTION(std::string("DeformConv ") + std::string(data_type_name(dtype))) {
      check_case({deform_conv,
                  {{"x", {1, 16, 32, 32}},
                   {"w", {32, 16, 3, 3}},
                   {"offset", {1, 18, 30, 30}},
                   {"b", {32}},
                   {"mask", {1, 9, 30, 30}}},
                  dtype});
    }
    SECTION(std::string("Conv ") + std::string(data_type_name(dtype))) {
      check_case({conv, {{"x", {1, 16, 40, 40}}, {"w", {32, 16, 3, 3}}, {"b", {32}}}, dtype});
    }
    SECTION(std::string("Conv direct, padded planes ") + std::string(data_type_name(dtype))) {
      check_case({conv_padded_planes, {{"x", {1, 16, 40, 40}}, {"w", {8, 4, 3, 3}}}, dtype});
    }
    SECTION(std::string("Attention ") + std::string(data_type_name(dtype))) {
      check_case({attention,
                  {{"x", {2, 8, 64}}, {"w", {64, 192}}, {"b", {192}}, {"past", {2, 2, 4, 3, 16}}},
                  dtype});
    }
    SECTION(std::string("ONNX Attention ") + std::string(data_type_name(dtype))) {
      check_case({onnx_attention,
                  {{"q", {2, 4, 64, 16}},
                   {"k", {2, 2, 64, 16}},
                   {"v", {2, 2, 64, 16}},
                   {"mask", {64, 72}},
                   {"past_k", {2, 2, 8, 16}},
                   {"past_v", {2, 2, 8, 16}}},
                  dtype,
                  23});
    }
    SECTION(std::string("LinearAttention ") + std::string(data_type_name(dtype))) {
      check_case({linear_attention,
                  {{"q", {2, 8, 64}},
                   {"k", {2, 8, 32}},
                   {"v", {2, 8, 32}},
                   {"past", {2, 2, 16, 16}},
                   {"decay", {2, 8, 2}},
                   {"beta", {2, 8, 2}}},
                  dtype,
                  27});
    }
    SECTION(std::string("FlexAttention ") + std::string(data_type_name(dtype))) {
      check_case({flex_attention,
                  {{"q", {2, 4, 24, 16}}, {"k", {2, 2, 40, 16}}, {"v", {2, 2, 40, 8}}},
                  dtype});
    }
    SECTION(std::string("LayerNormalization ") + std::string(data_type_name(dtype))) {
      check_case({layer_norm, {{"x", {4, 64, 256}}, {"scale", {64, 256}}, {"bias", {256}}}, dtype});
    }
    SECTION(std::string("SkipLayerNormalization ") + std::string(data_type_name(dtype))) {
      check_case({skip_layer_norm_broadcast,
                  {{"x", {4, 32, 128}}, {"skip", {32, 128}}, {"gamma", {128}}, {"beta", {128}}},
                  dtype});
      check_case({skip_layer_norm_sum,
                  {{"x", {4, 32, 128}},
                   {"skip", {4, 32, 128}},
                   {"gamma", {128}},
                   {"beta", {128}},
                   {"bias", {128}}},
                  dtype});
    }
    SECTION(std::string("SoftmaxCrossEntropyLoss ") + std::string(data_type_name(dtype))) {
      check_case({softmax_cross_entropy, {{"x", {4, 10, 6}}}, dtype});
    }
    SECTION(std::string("MatMul ") + std::string(data_type_name(dtype))) {
      check_case({matmul, {{"a", {2, 3, 40, 48}}, {"b", {48, 56}}}, dtype});
    }
    SECTION(std::string("Einsum ") + std::string(data_type_name(dtype))) {
      check_case({einsum,
                  {{"a", {4, 16, 24}},
                   {"b", {4, 24, 20}},
                   {"c", {20, 12}},
                   {"x", {16, 12, 10, 3}},
                   {"z", {10, 12, 14}}},
                  dtype});
    }
    SECTION(std::string("Gemm ") + std::string(data_type_name(dtype))) {
      check_case(
          {gemm,
           {{"a", {64, 48}}, {"b", {40, 48}}, {"c", {40}}, {"w", {40, 32}}, {"full", {64, 32}}},
           dtype});
    }
  }
}

// The contrib attention ops take float only.
TEST_CASE("the attention ops' scratch is planned from their contracts", "[arena][workspace]") {
  g_dtype = DataType::Float;
  SECTION("MultiHeadAttention") {
    check_case({multihead_attention,
                {{"q", {2, 16, 64}},
                 {"k", {2, 16, 64}},
                 {"v", {2, 16, 64}},
                 {"bias", {192}},
                 {"attn_bias", {1, 4, 16, 24}},
                 {"past_k", {2, 4, 8, 16}},
                 {"past_v", {2, 4, 8, 16}}}});
  }
  SECTION("GroupQueryAttention") {
    check_case({group_query_attention,
                {{"q", {1, 4, 64}},
                 {"k", {1, 4, 32}},
                 {"v", {1, 4, 32}},
                 {"past_k", {1, 2, 6, 16}},
                 {"past_v", {1, 2, 6, 16}},
                 {"cos", {16, 8}},
                 {"sin", {16, 8}}}});
  }
}

TEST_CASE(
    "the integer products' int32 sums, float8 products and run-time filters are planned "
    "from their contracts",
    "[arena][workspace]") {
  check_case({quantized_products, {{"a", {48, 64}}, {"b", {64, 40}}}, DataType::Float, 19, true});
  check_case({float8_product, {{"a", {2, 16, 24}}, {"b", {24, 20}}}, DataType::Float, 21, true});
  check_case(
      {integer_convs, {{"x", {1, 4, 10, 10}}, {"w", {8, 4, 3, 3}}}, DataType::Float, 19, true});
}

TEST_CASE("MatMulNBits's prepared A, packed A^T and panels are planned from its contract",
          "[arena][workspace]") {
  check_case({matmul_nbits, {{"a", {2, 24, 256}}, {"row", {3, 256}}}});
}

TEST_CASE("double Conv lowers into its planned workspace", "[arena][workspace]") {
  g_dtype = DataType::Double;
  check_case(
      {conv, {{"x", {1, 16, 40, 40}}, {"w", {32, 16, 3, 3}}, {"b", {32}}}, DataType::Double});
  g_dtype = DataType::Float;
}
