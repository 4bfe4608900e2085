// The engine's graph IR: values, nodes, attributes and nested graphs, free of protobuf.
//
// Values are numbered per graph. A nested graph (If branch, Loop/Scan body) that reads a
// value of an enclosing graph gets a local value of origin Capture with the same name; the
// node owning the nested graph lists the enclosing value among its implicit inputs. This
// makes captures ordinary uses in the outer graph: use counts, ordering and liveness treat
// them like any other input.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/tensor.h"
#include "kiln/value.h"

namespace kiln::ir {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

struct Dim {
  int64_t value = -1;  // -1 when not a fixed number
  std::string param;   // symbolic name, if any
};

// The declared type of a value: a tensor (element type + optional shape), or a sequence /
// optional of an inner type.
struct TypeInfo {
  Value::Kind kind = Value::Kind::None;  // None: not declared
  DataType elem = DataType::Undefined;
  std::optional<std::vector<Dim>> shape;
  std::shared_ptr<TypeInfo> inner;  // for Sequence and Optional
};

// The type of a tensor with this element type and this fixed shape (an initializer's).
inline TypeInfo tensor_type(DataType elem, const Shape& shape) {
  TypeInfo t;
  t.kind = Value::Kind::Tensor;
  t.elem = elem;
  std::vector<Dim> dims;
  for (int64_t d : shape) dims.push_back(Dim{d, ""});
  t.shape = std::move(dims);
  return t;
}

enum class ValueOrigin { GraphInput, Initializer, NodeOutput, Capture };

struct ValueInfo {
  std::string name;
  ValueOrigin origin = ValueOrigin::NodeOutput;
  TypeInfo type;
  int32_t producer = -1;  // node index for NodeOutput
  Tensor constant;        // Initializer data, or a graph input's default value
  // A hollow constant: an initializer whose data arrives after planning
  // (Session::set_constant). `type` holds its element type and shape; `constant` stays
  // undefined until then, so kernels never see it as a known value at plan time.
  bool hollow = false;
};

struct Graph;

enum class AttrKind {
  Undefined,
  Float,
  Int,
  String,
  Tensor,
  Graph,
  Floats,
  Ints,
  Strings,
  Tensors,
  Graphs,
  TypeProto,
  TypeProtos,
  SparseTensor,
};

struct Attribute {
  std::string name;
  AttrKind kind = AttrKind::Undefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  TypeInfo type;
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;            // "" for ai.onnx
  int64_t opset = 0;             // the model's opset import for `domain`
  std::vector<ValueId> inputs;   // kNoValue for an omitted optional input
  std::vector<ValueId> outputs;  // kNoValue for an omitted optional output
  // Enclosing-graph values read by nested graphs (transitively), in first-use order.
  std::vector<ValueId> implicit_inputs;
  std::vector<Attribute> attributes;

  const Attribute* attr(const std::string& name) const;
  // Graph-valued attributes in declaration order (then_branch, else_branch, body...).
  std::vector<const Attribute*> graph_attributes() const;
  // "node 'name' (Op)" or "node #index (Op)" for messages.
  std::string label() const;
};

struct Graph {
  std::string name;
  std::vector<ValueInfo> values;
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<ValueId> initializers;
  std::vector<ValueId> captures;  // values of origin Capture, named as the outer value
  const Graph* parent = nullptr;

  ValueId add_value(std::string name, ValueOrigin origin);
  ValueId find(const std::string& name) const;  // kNoValue if absent
  const ValueInfo& value(ValueId id) const { return values[static_cast<size_t>(id)]; }
  ValueInfo& value(ValueId id) { return values[static_cast<size_t>(id)]; }

 private:
  std::unordered_map<std::string, ValueId> by_name_;
};

struct Model {
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opsets;  // domain ("" = ai.onnx) -> version
  std::string producer_name, producer_version, domain, doc_string;
  int64_t model_version = 0;
  bool has_model_version = false;  // the file sets model_version (0 is a valid version)
  std::string graph_doc_string;    // the main graph's doc_string (its name is graph->name)
  std::map<std::string, std::string> metadata;
  std::shared_ptr<Graph> graph;
  std::string path;  // file it came from ("<memory>" for buffers)
};

// Structural checks every loaded graph passes before planning: values defined exactly
// once, node inputs defined, nested graphs present where an op requires them, no cycles.
// Throws kiln::Error (InvalidModel) naming the node.
void validate(const Model& model);

// Node indices in an order where every node runs after the producers of its inputs
// (implicit inputs included). Throws on a cycle, naming a node on it.
std::vector<int32_t> topological_order(const Graph& graph);

// The tensor a Constant node produces (value, value_float(s), value_int(s),
// value_string(s), sparse_value), or nullopt when it has none of them. Read by the pass
// folding Constant nodes and by the Constant kernel (graphs built without that pass).
std::optional<Tensor> constant_node_value(const Node& node);

}  // namespace kiln::ir
