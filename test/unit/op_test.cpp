#include "test/unit/op_test.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "engine/runtime/session_internal.h"
#include "engine/util/json_file.h"
#include "tools/common/compare.h"

namespace kiln::testing {

ir::Attribute int_attr(const std::string& name, int64_t v) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Int;
  a.i = v;
  return a;
}
ir::Attribute float_attr(const std::string& name, float v) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Float;
  a.f = v;
  return a;
}
ir::Attribute ints_attr(const std::string& name, std::vector<int64_t> v) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Ints;
  a.ints = std::move(v);
  return a;
}
ir::Attribute string_attr(const std::string& name, const std::string& v) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::String;
  a.s = v;
  return a;
}
ir::Attribute tensor_attr(const std::string& name, Tensor t) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Tensor;
  a.t = std::move(t);
  return a;
}
ir::Attribute graph_attr(const std::string& name, std::shared_ptr<ir::Graph> g) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Graph;
  a.g = std::move(g);
  return a;
}

// ---- GraphBuilder ----

GraphBuilder::GraphBuilder(std::string name) : name_(std::move(name)) {}

GraphBuilder& GraphBuilder::input(const std::string& name, DataType dtype,
                                  std::vector<int64_t> shape, bool shape_known) {
  ir::TypeInfo t;
  t.kind = Value::Kind::Tensor;
  t.elem = dtype;
  if (shape_known || !shape.empty()) {
    std::vector<ir::Dim> dims;
    for (int64_t d : shape) dims.push_back(ir::Dim{d, ""});
    t.shape = std::move(dims);
  }
  inputs_.emplace_back(name, std::move(t));
  return *this;
}

GraphBuilder& GraphBuilder::initializer(const std::string& name, Tensor t) {
  t.storage()->set_read_only();
  initializers_.emplace_back(name, std::move(t));
  return *this;
}

ir::Node& GraphBuilder::node(const std::string& op, std::vector<std::string> inputs,
                             std::vector<std::string> outputs, std::vector<ir::Attribute> attrs,
                             const std::string& domain) {
  nodes_.push_back({op, domain, std::move(inputs), std::move(outputs), std::move(attrs)});
  return scratch_;
}

GraphBuilder& GraphBuilder::output(const std::string& name) {
  outputs_.push_back(name);
  return *this;
}

std::shared_ptr<ir::Graph> GraphBuilder::build(const ir::Graph* parent) {
  auto graph = std::make_shared<ir::Graph>();
  ir::Graph& g = *graph;
  g.name = name_;
  g.parent = parent;
  for (auto& [name, type] : inputs_) {
    const ir::ValueId id = g.add_value(name, ir::ValueOrigin::GraphInput);
    g.value(id).type = type;
    g.inputs.push_back(id);
  }
  for (auto& [name, t] : initializers_) {
    const ir::ValueId id = g.add_value(name, ir::ValueOrigin::Initializer);
    g.value(id).constant = t;
    g.value(id).type.kind = Value::Kind::Tensor;
    g.value(id).type.elem = t.dtype();
    g.initializers.push_back(id);
  }
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    ir::Node n;
    n.op_type = nodes_[ni].op;
    n.domain = nodes_[ni].domain;
    n.name = nodes_[ni].op + "_" + std::to_string(ni);
    for (const auto& out : nodes_[ni].outputs) {
      if (out.empty()) {
        n.outputs.push_back(ir::kNoValue);
        continue;
      }
      const ir::ValueId id = g.add_value(out, ir::ValueOrigin::NodeOutput);
      g.value(id).producer = static_cast<int32_t>(ni);
      n.outputs.push_back(id);
    }
    n.attributes = nodes_[ni].attrs;
    g.nodes.push_back(std::move(n));
  }
  auto resolve = [&](const std::string& name) {
    ir::ValueId id = g.find(name);
    if (id == ir::kNoValue) {  // not defined here: read from an enclosing graph
      id = g.add_value(name, ir::ValueOrigin::Capture);
      g.captures.push_back(id);
    }
    return id;
  };
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    ir::Node& n = g.nodes[ni];
    for (const auto& in : nodes_[ni].inputs)
      n.inputs.push_back(in.empty() ? ir::kNoValue : resolve(in));
    for (const ir::Attribute& a : n.attributes) {
      if (!a.g) continue;
      const_cast<ir::Graph&>(*a.g).parent = &g;
      for (ir::ValueId c : a.g->captures) {
        const ir::ValueId outer = resolve(a.g->value(c).name);
        if (std::find(n.implicit_inputs.begin(), n.implicit_inputs.end(), outer) ==
            n.implicit_inputs.end()) {
          n.implicit_inputs.push_back(outer);
        }
      }
    }
  }
  for (const auto& out : outputs_) g.outputs.push_back(resolve(out));
  return graph;
}

ir::Model make_model(std::shared_ptr<ir::Graph> graph, int64_t opset,
                     std::map<std::string, int64_t> extra) {
  ir::Model m;
  m.ir_version = 8;
  m.opsets[""] = opset;
  for (auto& [d, v] : extra) m.opsets[d] = v;
  m.graph = std::move(graph);
  // Nodes take their domain's opset, as the loader does.
  std::function<void(ir::Graph&)> set_opsets = [&](ir::Graph& g) {
    for (ir::Node& n : g.nodes) {
      auto it = m.opsets.find(n.domain);
      n.opset = it == m.opsets.end() ? 1 : it->second;
      for (ir::Attribute& a : n.attributes) {
        if (a.g) set_opsets(*a.g);
      }
    }
  };
  set_opsets(*m.graph);
  return m;
}

Session make_session(std::shared_ptr<ir::Graph> graph, int64_t opset, int threads,
                     GraphOptimization level) {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(threads);
  so.optimization = level;
  return session_from_model(make_model(std::move(graph), opset), so);
}

// ---- OpTest ----

OpTest::OpTest(std::string op, int64_t opset, std::string domain) {
  node_.op_type = std::move(op);
  node_.domain = std::move(domain);
  model_.opsets[""] = opset;
  if (!node_.domain.empty()) model_.opsets[node_.domain] = opset;
  model_.graph = std::make_shared<ir::Graph>();
  model_.graph->name = "op_test";
  node_.name = node_.op_type;
  node_.opset = opset;
}

OpTest& OpTest::input(Value v) {
  ir::Graph& g = *model_.graph;
  const std::string name = "in" + std::to_string(node_.inputs.size());
  const ir::ValueId id = g.add_value(name, ir::ValueOrigin::GraphInput);
  g.value(id).type.kind = v.kind();
  g.value(id).type.elem = v.elem_type();
  g.inputs.push_back(id);
  node_.inputs.push_back(id);
  feeds_.push_back({name, std::move(v)});
  return *this;
}

OpTest& OpTest::constant_input(Tensor t) {
  ir::Graph& g = *model_.graph;
  const ir::ValueId id =
      g.add_value("in" + std::to_string(node_.inputs.size()), ir::ValueOrigin::Initializer);
  t.storage()->set_read_only();
  g.value(id).constant = std::move(t);
  g.value(id).type.kind = Value::Kind::Tensor;
  g.value(id).type.elem = g.value(id).constant.dtype();
  g.initializers.push_back(id);
  node_.inputs.push_back(id);
  return *this;
}

OpTest& OpTest::no_input() {
  node_.inputs.push_back(ir::kNoValue);
  return *this;
}

OpTest& OpTest::attr(const std::string& name, int64_t v) {
  node_.attributes.push_back(int_attr(name, v));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, float v) {
  node_.attributes.push_back(float_attr(name, v));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, const std::string& v) {
  node_.attributes.push_back(string_attr(name, v));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, std::vector<int64_t> v) {
  node_.attributes.push_back(ints_attr(name, std::move(v)));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, std::vector<float> v) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Floats;
  a.floats = std::move(v);
  node_.attributes.push_back(std::move(a));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, std::vector<std::string> v) {
  ir::Attribute a;
  a.name = name;
  a.kind = ir::AttrKind::Strings;
  a.strings = std::move(v);
  node_.attributes.push_back(std::move(a));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, Tensor v) {
  node_.attributes.push_back(tensor_attr(name, std::move(v)));
  return *this;
}
OpTest& OpTest::attr(const std::string& name, std::shared_ptr<ir::Graph> g) {
  node_.attributes.push_back(graph_attr(name, std::move(g)));
  return *this;
}

OpTest& OpTest::outputs(size_t n) {
  n_outputs_ = n;
  return *this;
}

OpTest& OpTest::skip_output(size_t i) {
  if (skipped_.size() <= i) skipped_.resize(i + 1, false);
  skipped_[i] = true;
  return *this;
}

std::vector<Value> OpTest::run() {
  ir::Model model = model_;
  model.graph = std::make_shared<ir::Graph>(*model_.graph);
  ir::Graph& g = *model.graph;
  ir::Node node = node_;
  for (size_t i = 0; i < n_outputs_; ++i) {
    if (i < skipped_.size() && skipped_[i]) {
      node.outputs.push_back(ir::kNoValue);
      continue;
    }
    const ir::ValueId id = g.add_value("out" + std::to_string(i), ir::ValueOrigin::NodeOutput);
    g.value(id).producer = 0;
    node.outputs.push_back(id);
    g.outputs.push_back(id);
  }
  for (ir::Attribute& a : node.attributes) {
    if (!a.g) continue;
    a.g->parent = &g;
    for (ir::ValueId c : a.g->captures) {
      const ir::ValueId outer = g.find(a.g->value(c).name);
      REQUIRE(outer != ir::kNoValue);
      node.implicit_inputs.push_back(outer);
    }
  }
  g.nodes.push_back(std::move(node));
  SessionOptions so;
  so.environment = std::make_shared<Environment>(2);
  Session s = session_from_model(std::move(model), so);
  auto out = owned_ ? s.run(std::move(feeds_)) : s.run(feeds_);
  stats_ = s.last_run_stats();
  std::vector<Value> values;
  for (auto& nv : out) values.push_back(std::move(nv.value));
  return values;
}

// ---- random data and comparisons ----

Tensor random_tensor(DataType dtype, Shape shape, std::mt19937& rng, double lo, double hi) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = dist(rng);
    switch (dtype) {
      case DataType::Float:
        t.data<float>()[i] = static_cast<float>(v);
        break;
      case DataType::Double:
        t.data<double>()[i] = v;
        break;
      case DataType::Float16:
        t.data<float16>()[i] = float16(static_cast<float>(v));
        break;
      case DataType::BFloat16:
        t.data<bfloat16>()[i] = bfloat16(static_cast<float>(v));
        break;
      case DataType::Int8:
        t.data<int8_t>()[i] = static_cast<int8_t>(std::lround(v));
        break;
      case DataType::Int16:
        t.data<int16_t>()[i] = static_cast<int16_t>(std::lround(v));
        break;
      case DataType::Int32:
        t.data<int32_t>()[i] = static_cast<int32_t>(std::lround(v));
        break;
      case DataType::Int64:
        t.data<int64_t>()[i] = std::llround(v);
        break;
      case DataType::UInt8:
        t.data<uint8_t>()[i] = static_cast<uint8_t>(std::lround(std::abs(v)));
        break;
      case DataType::UInt16:
        t.data<uint16_t>()[i] = static_cast<uint16_t>(std::lround(std::abs(v)));
        break;
      case DataType::UInt32:
        t.data<uint32_t>()[i] = static_cast<uint32_t>(std::lround(std::abs(v)));
        break;
      case DataType::UInt64:
        t.data<uint64_t>()[i] = static_cast<uint64_t>(std::llround(std::abs(v)));
        break;
      case DataType::Bool:
        t.data<bool>()[i] = v > (lo + hi) / 2;
        break;
      default:
        FAIL("random_tensor: unsupported type");
    }
  }
  return t;
}

Shape random_shape(size_t rank, int64_t max_dim, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> dist(1, max_dim);
  Shape s(rank);
  for (auto& d : s) d = dist(rng);
  return s;
}

void require_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  const auto c = tooling::compare_values(Value(actual), Value(expected), rtol, atol);
  INFO("actual " << actual.describe() << ", expected " << expected.describe() << ": " << c.message);
  REQUIRE(c.ok);
}

double element(const Tensor& t, int64_t i) {
  // Read in place, the logical index taken through the strides: a copy (or a new handle) per
  // element made references that read element by element slow, and quadratic on views.
  if (!t.is_contiguous()) {
    int64_t at = 0, rest = i;
    for (size_t d = t.rank(); d-- > 0;) {
      at += rest % t.dim(d) * t.strides()[d];
      rest /= t.dim(d);
    }
    i = at;
  }
  switch (t.dtype()) {
    case DataType::Float:
      return t.data<const float>()[i];
    case DataType::Double:
      return t.data<const double>()[i];
    case DataType::Float16:
      return static_cast<float>(t.data<const float16>()[i]);
    case DataType::BFloat16:
      return static_cast<float>(t.data<const bfloat16>()[i]);
    case DataType::Int8:
      return t.data<const int8_t>()[i];
    case DataType::Int16:
      return t.data<const int16_t>()[i];
    case DataType::Int32:
      return t.data<const int32_t>()[i];
    case DataType::Int64:
      return static_cast<double>(t.data<const int64_t>()[i]);
    case DataType::UInt8:
      return t.data<const uint8_t>()[i];
    case DataType::UInt16:
      return t.data<const uint16_t>()[i];
    case DataType::UInt32:
      return t.data<const uint32_t>()[i];
    case DataType::UInt64:
      return static_cast<double>(t.data<const uint64_t>()[i]);
    case DataType::Bool:
      return t.data<const bool>()[i] ? 1 : 0;
    default:
      FAIL("element: unsupported type");
      return 0;
  }
}

std::string backend_test_data() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("ONNX_BACKEND_TEST_DATA")) return env;
  const fs::path beside = fs::path(KILN_SOURCE_DIR) / ".." / "shared" / "onnx-backend-tests";
  return fs::is_directory(beside) ? fs::canonical(beside).string() : std::string();
}

std::vector<int64_t> json_ints(const std::string& file, const std::string& key) {
  const json::Json doc = json::read_file(file);
  std::vector<int64_t> out;
  for (const auto& v : doc.at(key)) out.push_back(json::to_int(v, file, key));
  return out;
}

void require_near(const Tensor& t, const std::vector<double>& want, double tol) {
  REQUIRE(t.numel() == static_cast<int64_t>(want.size()));
  // One assertion, on the first element out of tolerance: a message and an assertion per
  // element cost seconds on tensors of millions (NaN fails, as the comparison is false).
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = element(t, static_cast<int64_t>(i));
    if (std::fabs(got - want[i]) <= tol * (1 + std::fabs(want[i]))) continue;
    INFO("element " << i << " of " << want.size() << " want " << want[i] << " got " << got);
    REQUIRE(std::fabs(got - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

Tensor int32_tensor(Shape shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DataType::Int32, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

}  // namespace kiln::testing
