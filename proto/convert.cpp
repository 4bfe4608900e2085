// ONNX protobuf -> engine IR.
#include "proto/onnx_proto.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "kiln/error.h"
#include "kiln/memory.h"
#include "kiln/version.h"
#include "proto/loader.h"
#include "proto/mapped_file.h"
#include "proto/tensor_convert.h"
#include "proto/weights_cache.h"
#include "proto/wire.h"

namespace kiln::proto {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorKind::InvalidModel, message);
}

Tensor convert_sparse(const onnx::SparseTensorProto& sp, Source& src) {
  Tensor values = convert_tensor(sp.values(), src);
  Tensor indices = convert_tensor(sp.indices(), src);
  const std::string& name = sp.values().name();
  Shape shape(sp.dims().begin(), sp.dims().end());
  Tensor dense;
  try {
    dense = Tensor::zeros(values.dtype(), shape);
  } catch (const Error& e) {
    // Too large to allocate stays a memory error; named for the tensor (and by the callers
    // for its node and file).
    throw Error(e.kind() == ErrorKind::Memory ? ErrorKind::Memory : ErrorKind::InvalidModel,
                "sparse tensor '" + name + "': " + e.message());
  }
  if (indices.dtype() != DataType::Int64 || values.rank() != 1) {
    invalid("sparse tensor '" + name + "' needs int64 indices and 1-D values");
  }
  const int64_t nnz = values.dim(0);
  const int64_t total = dense.numel();
  const int64_t* idx = indices.data<const int64_t>();
  const size_t esize = static_cast<size_t>(bits_per_element(values.dtype()) / 8);
  if (values.dtype() == DataType::String || esize == 0) {
    throw Error(ErrorKind::Unsupported, "sparse tensor '" + name + "' of this element type");
  }
  const bool linear = indices.rank() == 1;
  if ((linear && indices.dim(0) != nnz) ||
      (!linear && (indices.rank() != 2 || indices.dim(0) != nnz ||
                   indices.dim(1) != static_cast<int64_t>(shape.size())))) {
    invalid("sparse tensor '" + name + "' has indices of shape " +
            shape_to_string(indices.shape()));
  }
  const Shape strides = contiguous_strides(shape);
  for (int64_t i = 0; i < nnz; ++i) {
    int64_t off = 0;
    if (linear) {
      off = idx[i];
    } else {
      for (size_t d = 0; d < shape.size(); ++d) {
        const int64_t v = idx[i * static_cast<int64_t>(shape.size()) + static_cast<int64_t>(d)];
        if (v < 0 || v >= shape[d]) off = -1 - total;
        off += v * strides[d];
      }
    }
    if (off < 0 || off >= total) invalid("sparse tensor '" + name + "' has an index out of range");
    std::memcpy(dense.raw_data() + static_cast<size_t>(off) * esize,
                values.raw_data() + static_cast<size_t>(i) * esize, esize);
  }
  dense.storage()->set_read_only();
  return dense;
}

ir::TypeInfo convert_type(const onnx::TypeProto& tp) {
  ir::TypeInfo t;
  auto elem = [](int32_t code) {
    return is_known_data_type(code) ? static_cast<DataType>(code) : DataType::Undefined;
  };
  switch (tp.value_case()) {
    case onnx::TypeProto::kTensorType: {
      t.kind = Value::Kind::Tensor;
      t.elem = elem(tp.tensor_type().elem_type());
      if (tp.tensor_type().has_shape()) {
        std::vector<ir::Dim> dims;
        for (const auto& d : tp.tensor_type().shape().dim()) {
          ir::Dim dim;
          if (d.has_dim_value()) dim.value = d.dim_value();
          if (d.has_dim_param()) dim.param = d.dim_param();
          dims.push_back(dim);
        }
        t.shape = std::move(dims);
      }
      break;
    }
    case onnx::TypeProto::kSequenceType:
      t.kind = Value::Kind::Sequence;
      t.inner = std::make_shared<ir::TypeInfo>(convert_type(tp.sequence_type().elem_type()));
      t.elem = t.inner->elem;
      break;
    case onnx::TypeProto::kOptionalType:
      t.kind = Value::Kind::Optional;
      t.inner = std::make_shared<ir::TypeInfo>(convert_type(tp.optional_type().elem_type()));
      t.elem = t.inner->elem;
      break;
    case onnx::TypeProto::kSparseTensorType:
      t.kind = Value::Kind::Tensor;
      t.elem = elem(tp.sparse_tensor_type().elem_type());
      break;
    default:
      break;  // maps and opaque types: left undeclared
  }
  return t;
}

// Lexical scopes: a nested graph sees the values of every enclosing graph.
struct Scope {
  ir::Graph* graph;
  Scope* parent;
};

class Converter {
 public:
  Converter(Source& src, std::map<std::string, int64_t> opsets, int64_t ir_version)
      : src_(src), opsets_(std::move(opsets)), ir_version_(ir_version) {}

  std::shared_ptr<ir::Graph> convert_graph(const onnx::GraphProto& gp, Scope* parent) {
    auto graph = std::make_shared<ir::Graph>();
    ir::Graph& g = *graph;
    g.name = gp.name();
    g.parent = parent ? parent->graph : nullptr;
    Scope scope{&g, parent};

    for (const auto& in : gp.input()) {
      if (g.find(in.name()) != ir::kNoValue)
        invalid("graph input '" + in.name() + "' is declared twice");
      const ir::ValueId id = g.add_value(in.name(), ir::ValueOrigin::GraphInput);
      g.value(id).type = convert_type(in.type());
      g.inputs.push_back(id);
    }
    auto add_initializer = [&](const std::string& name, Tensor t) {
      ir::ValueId id = g.find(name);
      if (id != ir::kNoValue && g.value(id).origin == ir::ValueOrigin::GraphInput) {
        if (ir_version_ >= 4) {
          g.value(id).constant = std::move(t);  // an input with a default value
          return;
        }
        // Before IR version 4 every initializer had to be listed as a graph input too; such
        // an input is the constant itself, not one a caller may replace (as in onnxruntime).
        g.value(id).origin = ir::ValueOrigin::Initializer;
        std::erase(g.inputs, id);
        ir::ValueInfo& v = g.value(id);
        v.type = ir::tensor_type(t.dtype(), t.shape());
        v.constant = std::move(t);
        g.initializers.push_back(id);
        return;
      }
      if (id != ir::kNoValue) invalid("initializer '" + name + "' is defined twice");
      id = g.add_value(name, ir::ValueOrigin::Initializer);
      ir::ValueInfo& v = g.value(id);
      v.type = ir::tensor_type(t.dtype(), t.shape());
      v.hollow = !t.defined();
      if (t.defined()) v.constant = std::move(t);
      g.initializers.push_back(id);
    };
    for (const auto& init : gp.initializer()) {
      if (init.name().empty()) invalid("an initializer has no name");
      // Only the main graph's initializers may be hollow (Session::set_constant names them),
      // and not those giving a graph input its default value.
      src_.hollow_allowed = !parent && g.find(init.name()) == ir::kNoValue;
      Tensor t = convert_tensor(init, src_);
      src_.hollow_allowed = false;
      add_initializer(init.name(), std::move(t));
    }
    for (const auto& sp : gp.sparse_initializer()) {
      add_initializer(sp.values().name(), convert_sparse(sp, src_));
    }
    // Register every node output before converting any node, so nested graphs can refer
    // to values produced later in the list (ordering is the planner's job).
    g.nodes.resize(static_cast<size_t>(gp.node_size()));
    for (int ni = 0; ni < gp.node_size(); ++ni) {
      const auto& np = gp.node(ni);
      ir::Node& node = g.nodes[static_cast<size_t>(ni)];
      node.name = np.name();
      node.op_type = np.op_type();
      node.domain = np.domain() == "ai.onnx" ? "" : np.domain();
      for (const auto& out : np.output()) {
        if (out.empty()) {
          node.outputs.push_back(ir::kNoValue);
          continue;
        }
        if (g.find(out) != ir::kNoValue) {
          throw Error(ErrorKind::InvalidModel,
                      "output '" + out + "' is already defined in the graph")
              .with_node(node.name, node.op_type);
        }
        const ir::ValueId id = g.add_value(out, ir::ValueOrigin::NodeOutput);
        g.value(id).producer = ni;
        node.outputs.push_back(id);
      }
    }
    for (const auto& vi : gp.value_info()) {
      const ir::ValueId id = g.find(vi.name());
      if (id != ir::kNoValue && g.value(id).type.kind == Value::Kind::None) {
        g.value(id).type = convert_type(vi.type());
      }
    }
    for (int ni = 0; ni < gp.node_size(); ++ni) {
      convert_node(gp.node(ni), g.nodes[static_cast<size_t>(ni)], scope);
    }
    for (const auto& out : gp.output()) {
      const ir::ValueId id = resolve(scope, out.name());
      if (id == ir::kNoValue) {
        invalid("graph '" + g.name + "' output '" + out.name() + "' is not defined");
      }
      if (g.value(id).type.kind == Value::Kind::None) g.value(id).type = convert_type(out.type());
      g.outputs.push_back(id);
    }
    return graph;
  }

 private:
  // Finds `name` in the scope chain, creating capture values in each nested graph between
  // the definition and the use.
  ir::ValueId resolve(Scope& scope, const std::string& name) {
    ir::ValueId id = scope.graph->find(name);
    if (id != ir::kNoValue || !scope.parent) return id;
    const ir::ValueId outer = resolve(*scope.parent, name);
    if (outer == ir::kNoValue) return ir::kNoValue;
    id = scope.graph->add_value(name, ir::ValueOrigin::Capture);
    scope.graph->value(id).type = scope.parent->graph->value(outer).type;
    scope.graph->captures.push_back(id);
    return id;
  }

  void convert_node(const onnx::NodeProto& np, ir::Node& node, Scope& scope) {
    try {
      auto it = opsets_.find(node.domain);
      if (it == opsets_.end()) {
        invalid("domain '" + (node.domain.empty() ? std::string("ai.onnx") : node.domain) +
                "' is not among the model's opset imports");
      }
      node.opset = it->second;
      for (const auto& in : np.input()) {
        if (in.empty()) {
          node.inputs.push_back(ir::kNoValue);
          continue;
        }
        const ir::ValueId id = resolve(scope, in);
        if (id == ir::kNoValue) invalid("input '" + in + "' is not defined");
        node.inputs.push_back(id);
      }
      for (const auto& ap : np.attribute()) node.attributes.push_back(convert_attribute(ap, scope));
      if (node.domain == "kiln") restore_onnx_node(node);
      // Nested graphs' captures become this node's implicit inputs.
      for (const auto& a : node.attributes) {
        std::vector<const ir::Graph*> subs;
        if (a.g) subs.push_back(a.g.get());
        for (const auto& sg : a.graphs) subs.push_back(sg.get());
        for (const ir::Graph* sub : subs) {
          for (ir::ValueId c : sub->captures) {
            const ir::ValueId outer = resolve(scope, sub->value(c).name);
            bool seen = false;
            for (ir::ValueId x : node.implicit_inputs) seen = seen || x == outer;
            if (!seen) node.implicit_inputs.push_back(outer);
          }
        }
      }
    } catch (Error& e) {
      e.with_node(node.name, node.op_type);
      throw;
    }
  }

  // A node saved from a kiln session at a newer ai.onnx version than its file imports
  // (save_model) is an ai.onnx node again.
  static void restore_onnx_node(ir::Node& node) {
    auto it = std::find_if(node.attributes.begin(), node.attributes.end(),
                           [](const ir::Attribute& a) { return a.name == kOnnxOpsetAttribute; });
    if (it == node.attributes.end()) return;
    if (it->kind != ir::AttrKind::Int || it->i < 1 || it->i > kMaxOnnxOpset)
      invalid(std::string("attribute '") + kOnnxOpsetAttribute + "' must be an ai.onnx opset");
    node.domain.clear();
    node.opset = it->i;
    node.attributes.erase(it);
  }

  ir::Attribute convert_attribute(const onnx::AttributeProto& ap, Scope& scope) {
    ir::Attribute a;
    a.name = ap.name();
    if (!ap.ref_attr_name().empty()) {
      throw Error(ErrorKind::Unsupported,
                  "attribute '" + a.name + "' refers to a function attribute");
    }
    using AP = onnx::AttributeProto;
    int type = ap.type();
    if (type == AP::UNDEFINED) {  // very old files: infer from what is set
      if (ap.has_f())
        type = AP::FLOAT;
      else if (ap.has_i())
        type = AP::INT;
      else if (ap.has_s())
        type = AP::STRING;
      else if (ap.has_t())
        type = AP::TENSOR;
      else if (ap.has_g())
        type = AP::GRAPH;
      else if (ap.floats_size())
        type = AP::FLOATS;
      else if (ap.ints_size())
        type = AP::INTS;
      else if (ap.strings_size())
        type = AP::STRINGS;
      else if (ap.tensors_size())
        type = AP::TENSORS;
      else if (ap.graphs_size())
        type = AP::GRAPHS;
    }
    switch (type) {
      case AP::FLOAT:
        a.kind = ir::AttrKind::Float;
        a.f = ap.f();
        break;
      case AP::INT:
        a.kind = ir::AttrKind::Int;
        a.i = ap.i();
        break;
      case AP::STRING:
        a.kind = ir::AttrKind::String;
        a.s = ap.s();
        break;
      case AP::TENSOR:
        a.kind = ir::AttrKind::Tensor;
        a.t = convert_tensor(ap.t(), src_);
        break;
      case AP::SPARSE_TENSOR:
        a.kind = ir::AttrKind::SparseTensor;
        a.t = convert_sparse(ap.sparse_tensor(), src_);
        break;
      case AP::GRAPH:
        a.kind = ir::AttrKind::Graph;
        a.g = convert_graph(ap.g(), &scope);
        break;
      case AP::FLOATS:
        a.kind = ir::AttrKind::Floats;
        a.floats.assign(ap.floats().begin(), ap.floats().end());
        break;
      case AP::INTS:
        a.kind = ir::AttrKind::Ints;
        a.ints.assign(ap.ints().begin(), ap.ints().end());
        break;
      case AP::STRINGS:
        a.kind = ir::AttrKind::Strings;
        a.strings.assign(ap.strings().begin(), ap.strings().end());
        break;
      case AP::TENSORS:
        a.kind = ir::AttrKind::Tensors;
        for (const auto& t : ap.tensors()) a.tensors.push_back(convert_tensor(t, src_));
        break;
      case AP::GRAPHS:
        a.kind = ir::AttrKind::Graphs;
        for (const auto& g : ap.graphs()) a.graphs.push_back(convert_graph(g, &scope));
        break;
      case AP::TYPE_PROTO:
        a.kind = ir::AttrKind::TypeProto;
        a.type = convert_type(ap.tp());
        break;
      default:
        throw Error(ErrorKind::Unsupported,
                    "attribute '" + a.name + "' has unsupported type " + std::to_string(type));
    }
    return a;
  }

  Source& src_;
  std::map<std::string, int64_t> opsets_;
  int64_t ir_version_ = 0;
};

ir::Model convert_model(Source& src, const std::string& path) {
  try {
    Skeleton sk = make_skeleton(src.base, src.size, WireMessage::Model);
    src.raw = std::move(sk.raw_data);
    onnx::ModelProto mp;
    if (!mp.ParseFromString(sk.bytes)) invalid("not a valid ONNX model (protobuf parse failed)");
    if (!mp.has_graph()) invalid("not a valid ONNX model (no graph)");
    ir::Model model;
    model.path = path;
    model.ir_version = mp.ir_version();
    model.producer_name = mp.producer_name();
    model.producer_version = mp.producer_version();
    model.domain = mp.domain();
    model.model_version = mp.model_version();
    model.has_model_version = mp.has_model_version();
    model.doc_string = mp.doc_string();
    for (const auto& kv : mp.metadata_props()) model.metadata[kv.key()] = kv.value();
    for (const auto& op : mp.opset_import()) {
      const std::string domain = op.domain() == "ai.onnx" ? "" : op.domain();
      model.opsets[domain] = op.version();
    }
    if (model.ir_version > kMaxIrVersion) {
      throw Error(ErrorKind::Unsupported, "IR version " + std::to_string(model.ir_version) +
                                              " is newer than kiln reads (up to " +
                                              std::to_string(kMaxIrVersion) + ")");
    }
    if (auto it = model.opsets.find(""); it != model.opsets.end() && it->second > kMaxOnnxOpset) {
      throw Error(ErrorKind::Unsupported,
                  "opset " + std::to_string(it->second) +
                      " of the ai.onnx domain is newer than kiln implements (up to " +
                      std::to_string(kMaxOnnxOpset) + ")");
    }
    if (mp.opset_import_size() == 0) {
      // Only IR versions 1-2 predate opset imports; later files without them are invalid
      // (or truncated right after their graph).
      if (mp.ir_version() >= 3) invalid("not a valid ONNX model (no opset imports)");
      model.opsets[""] = 1;
    }
    if (mp.functions_size() > 0) {
      // Nodes that call them are reported as unsupported ops when the session is planned.
    }
    Converter conv(src, model.opsets, model.ir_version);
    model.graph = conv.convert_graph(mp.graph(), nullptr);
    model.graph_doc_string = mp.graph().doc_string();
    ir::validate(model);
    return model;
  } catch (Error& e) {
    e.with_file(path);
    throw;
  }
}

}  // namespace

ir::Model load_model_file(const std::string& path, LoadStats& stats, const LoadOptions& options) {
  std::shared_ptr<MappedFile> file;
  try {
    file = MappedFile::open(path);
  } catch (Error& e) {
    e.with_file(path);
    throw;
  }
  if (file->size() == 0) throw Error(ErrorKind::InvalidModel, "empty file").with_file(path);
  Source src;
  src.base = file->data();
  src.size = file->size();
  src.keepalive = file;
  src.base_dir = fs::path(path).parent_path().string();
  if (src.base_dir.empty()) src.base_dir = ".";
  src.stats = &stats;
  src.defer_missing_external = options.defer_missing_external;
  src.cache = options.weights_cache;
  src.leases = options.leases;
  return convert_model(src, path);
}

ir::Model load_model_buffer(const void* data, size_t size, const std::string& base_dir,
                            LoadStats& stats, const LoadOptions& options) {
  if (!data || size == 0)
    throw Error(ErrorKind::InvalidModel, "empty buffer").with_file("<memory>");
  Source src;
  src.base = static_cast<const std::byte*>(data);
  src.size = size;
  src.base_dir = base_dir;
  src.stats = &stats;
  src.defer_missing_external = options.defer_missing_external;
  src.cache = options.weights_cache;
  src.leases = options.leases;
  return convert_model(src, "<memory>");
}

}  // namespace kiln::proto
