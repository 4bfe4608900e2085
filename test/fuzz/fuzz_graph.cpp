// libFuzzer harness, structure-aware: the bytes choose a small graph of supported ops (inputs
// of random shapes, int64 constants for shape-like inputs, random attributes), which is
// serialized, loaded, optimised and run. Most graphs are invalid somewhere: each must give a
// kiln::Error. A crash, a sanitizer report or another exception is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "proto/onnx_proto.h"
#include "test/fuzz/fuzz_common.h"

namespace {

enum class AttrKind { Int, Ints, Float };

struct AttrSpec {
  const char* name;
  AttrKind kind;
  int64_t lo, hi;  // value range (Float: tenths)
  int max_len;     // Ints: up to this many values
};

// Inputs: 'f' a float value, 'i' an int64 value, '?' an optional float value.
struct OpSpec {
  const char* op;
  const char* inputs;
  int outputs;
  char output_kind;  // 'f' or 'i'
  std::vector<AttrSpec> attrs;
};

const std::vector<OpSpec>& ops() {
  static const std::vector<OpSpec> table = {
      {"Relu", "f", 1, 'f', {}},
      {"Neg", "f", 1, 'f', {}},
      {"Exp", "f", 1, 'f', {}},
      {"Sigmoid", "f", 1, 'f', {}},
      {"Tanh", "f", 1, 'f', {}},
      {"Sqrt", "f", 1, 'f', {}},
      {"Erf", "f", 1, 'f', {}},
      {"Identity", "f", 1, 'f', {}},
      {"Softmax", "f", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"LogSoftmax", "f", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Add", "ff", 1, 'f', {}},
      {"Sub", "ff", 1, 'f', {}},
      {"Mul", "ff", 1, 'f', {}},
      {"Div", "ff", 1, 'f', {}},
      {"Pow", "ff", 1, 'f', {}},
      {"Max", "ff", 1, 'f', {}},
      {"MatMul", "ff", 1, 'f', {}},
      {"Gemm",
       "ff?",
       1,
       'f',
       {{"transA", AttrKind::Int, 0, 1, 0},
        {"transB", AttrKind::Int, 0, 1, 0},
        {"alpha", AttrKind::Float, -20, 20, 0}}},
      {"Reshape", "fi", 1, 'f', {{"allowzero", AttrKind::Int, 0, 1, 0}}},
      {"Transpose", "f", 1, 'f', {{"perm", AttrKind::Ints, -1, 4, 5}}},
      {"Concat", "ff", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Concat", "fff", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Slice", "fii", 1, 'f', {}},
      {"Slice", "fiiii", 1, 'f', {}},
      {"Gather", "fi", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Unsqueeze", "fi", 1, 'f', {}},
      {"Squeeze", "fi", 1, 'f', {}},
      {"Flatten", "f", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Expand", "fi", 1, 'f', {}},
      {"Tile", "fi", 1, 'f', {}},
      {"Split", "f", 2, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Pad", "fi", 1, 'f', {}},
      {"ReduceSum", "fi", 1, 'f', {{"keepdims", AttrKind::Int, 0, 1, 0}}},
      {"ReduceMean", "f", 1, 'f', {{"keepdims", AttrKind::Int, 0, 1, 0}}},
      {"ArgMax", "f", 1, 'i', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"Shape", "f", 1, 'i', {}},
      {"ConstantOfShape", "i", 1, 'f', {}},
      {"Conv",
       "ff?",
       1,
       'f',
       {{"strides", AttrKind::Ints, 0, 3, 3},
        {"pads", AttrKind::Ints, -1, 3, 6},
        {"dilations", AttrKind::Ints, 0, 3, 3},
        {"group", AttrKind::Int, 0, 3, 0}}},
      {"ConvTranspose",
       "ff",
       1,
       'f',
       {{"strides", AttrKind::Ints, 0, 3, 3}, {"output_padding", AttrKind::Ints, 0, 3, 3}}},
      {"MaxPool",
       "f",
       1,
       'f',
       {{"kernel_shape", AttrKind::Ints, 0, 4, 3},
        {"strides", AttrKind::Ints, 0, 3, 3},
        {"pads", AttrKind::Ints, 0, 3, 6},
        {"ceil_mode", AttrKind::Int, 0, 1, 0}}},
      {"AveragePool",
       "f",
       1,
       'f',
       {{"kernel_shape", AttrKind::Ints, 0, 4, 3},
        {"strides", AttrKind::Ints, 0, 3, 3},
        {"count_include_pad", AttrKind::Int, 0, 1, 0}}},
      {"GlobalAveragePool", "f", 1, 'f', {}},
      {"LayerNormalization", "ff?", 1, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"BatchNormalization", "fffff", 1, 'f', {}},
      {"TopK", "fi", 2, 'f', {{"axis", AttrKind::Int, -5, 5, 0}}},
      {"CumSum", "fi", 1, 'f', {{"reverse", AttrKind::Int, 0, 1, 0}}},
      {"Resize", "f??", 1, 'f', {}},
      {"Where", "ff", 1, 'f', {}},  // the first input becomes a Cast to bool below
  };
  return table;
}

struct Pool {
  std::vector<std::string> floats, ints;
};

std::string pick(FuzzedDataProvider& fdp, const std::vector<std::string>& from) {
  return from[fdp.ConsumeIntegralInRange<size_t>(0, from.size() - 1)];
}

void add_attr(onnx::NodeProto& node, const AttrSpec& spec, FuzzedDataProvider& fdp) {
  if (!fdp.ConsumeBool()) return;  // attributes are often left at their defaults
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(spec.name);
  switch (spec.kind) {
    case AttrKind::Int:
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(fdp.ConsumeIntegralInRange<int64_t>(spec.lo, spec.hi));
      break;
    case AttrKind::Ints: {
      a->set_type(onnx::AttributeProto::INTS);
      const int n = fdp.ConsumeIntegralInRange<int>(0, spec.max_len);
      for (int k = 0; k < n; ++k)
        a->add_ints(fdp.ConsumeIntegralInRange<int64_t>(spec.lo, spec.hi));
      break;
    }
    case AttrKind::Float:
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(static_cast<float>(fdp.ConsumeIntegralInRange<int64_t>(spec.lo, spec.hi)) / 10);
      break;
  }
}

void set_tensor_type(onnx::ValueInfoProto& v, int elem, const std::vector<int64_t>& dims) {
  onnx::TypeProto_Tensor* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
}

std::vector<int64_t> random_shape(FuzzedDataProvider& fdp) {
  std::vector<int64_t> dims(fdp.ConsumeIntegralInRange<size_t>(0, 4));
  for (int64_t& d : dims) d = fdp.ConsumeIntegralInRange<int64_t>(0, 5);
  return dims;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(18);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("fuzz");
  Pool pool;
  std::vector<std::pair<std::string, std::vector<int64_t>>> graph_inputs;

  const int n_inputs = fdp.ConsumeIntegralInRange<int>(1, 3);
  for (int k = 0; k < n_inputs; ++k) {
    const std::string name = "x" + std::to_string(k);
    std::vector<int64_t> dims = random_shape(fdp);
    set_tensor_type(*g->add_input(), onnx::TensorProto::FLOAT, dims);
    g->mutable_input(g->input_size() - 1)->set_name(name);
    graph_inputs.push_back({name, dims});
    pool.floats.push_back(name);
  }
  const int n_consts = fdp.ConsumeIntegralInRange<int>(1, 4);
  for (int k = 0; k < n_consts; ++k) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name("c" + std::to_string(k));
    t->set_data_type(onnx::TensorProto::INT64);
    const int n = fdp.ConsumeIntegralInRange<int>(0, 6);
    if (fdp.ConsumeBool() || n != 1) t->add_dims(n);
    for (int v = 0; v < n; ++v) t->add_int64_data(fdp.ConsumeIntegralInRange<int64_t>(-3, 6));
    pool.ints.push_back(t->name());
  }

  const int n_nodes = fdp.ConsumeIntegralInRange<int>(1, 6);
  std::string last;
  for (int k = 0; k < n_nodes && fdp.remaining_bytes() > 0; ++k) {
    const OpSpec& spec = ops()[fdp.ConsumeIntegralInRange<size_t>(0, ops().size() - 1)];
    onnx::NodeProto* node = g->add_node();
    node->set_op_type(spec.op);
    node->set_name("n" + std::to_string(k));
    for (const char* c = spec.inputs; *c; ++c) {
      if (*c == 'i') {
        node->add_input(pick(fdp, pool.ints));
      } else if (*c == '?' && fdp.ConsumeBool()) {
        node->add_input("");
      } else {
        node->add_input(pick(fdp, pool.floats));
      }
    }
    if (std::string(spec.op) == "Where") {
      // Where's condition: a bool made from a float value.
      onnx::NodeProto* cast = g->add_node();
      cast->set_op_type("Cast");
      cast->set_name("cast" + std::to_string(k));
      cast->add_input(node->input(0));
      cast->add_output("b" + std::to_string(k));
      onnx::AttributeProto* to = cast->add_attribute();
      to->set_name("to");
      to->set_type(onnx::AttributeProto::INT);
      to->set_i(onnx::TensorProto::BOOL);
      node->set_input(0, "b" + std::to_string(k));
      node->add_input(pick(fdp, pool.floats));
      std::swap(*g->mutable_node(g->node_size() - 1), *g->mutable_node(g->node_size() - 2));
      node = g->mutable_node(g->node_size() - 1);
    }
    for (const AttrSpec& a : spec.attrs) add_attr(*node, a, fdp);
    for (int o = 0; o < spec.outputs; ++o) {
      const std::string out = "v" + std::to_string(k) + "_" + std::to_string(o);
      node->add_output(out);
      (spec.output_kind == 'i' && o == 0 ? pool.ints : pool.floats).push_back(out);
      last = out;
    }
  }
  if (last.empty()) return 0;
  g->add_output()->set_name(last);

  std::string bytes;
  if (!model.SerializeToString(&bytes)) return 0;
  try {
    kiln::Session session =
        kiln::Session::from_memory(bytes.data(), bytes.size(), kiln::fuzz::session_options());
    std::vector<kiln::NamedValue> inputs;
    for (const auto& [name, dims] : graph_inputs) {
      kiln::Tensor x = kiln::Tensor::zeros(kiln::DataType::Float, dims);
      float* p = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i) {
        p[i] = static_cast<float>(fdp.ConsumeIntegralInRange<int>(-8, 8)) / 4;
      }
      inputs.push_back({name, std::move(x)});
    }
    session.run(std::move(inputs));
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  return 0;
}
