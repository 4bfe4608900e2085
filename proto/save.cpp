// The engine's IR written back as an ONNX file: what a session runs after its graph passes
// (SessionOptions::optimized_model_path, `onnx-run --save-optimized`), as onnxruntime's
// optimized_model_filepath does. Nodes are written in an order where producers come first,
// nested graphs name the outer values they read, and fused nodes keep their domains
// (com.microsoft, kiln), which the opset imports then list.
#include "proto/onnx_proto.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "kiln/error.h"
#include "proto/loader.h"

namespace kiln::proto {
namespace {

namespace fs = std::filesystem;

// Weights at least this large go to the external data file when the model's weights are too
// many for one protobuf message.
constexpr uint64_t kExternalMinBytes = 1024;
constexpr uint64_t kExternalAlign = 4096;  // so the reloaded weights can be mapped in place

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, what);
}

void write_type(const ir::TypeInfo& t, onnx::TypeProto& tp) {
  switch (t.kind) {
    case Value::Kind::Tensor: {
      auto* tt = tp.mutable_tensor_type();
      tt->set_elem_type(static_cast<int32_t>(t.elem));
      if (t.shape) {
        auto* shape = tt->mutable_shape();
        for (const ir::Dim& d : *t.shape) {
          auto* dim = shape->add_dim();
          if (d.value >= 0)
            dim->set_dim_value(d.value);
          else if (!d.param.empty())
            dim->set_dim_param(d.param);
        }
      }
      break;
    }
    case Value::Kind::Sequence:
      if (t.inner) write_type(*t.inner, *tp.mutable_sequence_type()->mutable_elem_type());
      break;
    case Value::Kind::Optional:
      if (t.inner) write_type(*t.inner, *tp.mutable_optional_type()->mutable_elem_type());
      break;
    default:
      break;  // undeclared: left empty, as in the file it came from
  }
}

// Tensors are written raw (strings as string_data); large weights, when the model needs it,
// to the external data file.
class Writer {
 public:
  Writer(const std::string& path, bool external, int64_t ai_onnx_opset)
      : path_(path), ai_onnx_opset_(ai_onnx_opset) {
    if (!external) return;
    data_name_ = fs::path(path).filename().string() + ".data";
    data_.open(fs::path(path).parent_path() / data_name_, std::ios::binary | std::ios::trunc);
    if (!data_) throw Error(ErrorKind::Io, "cannot write external data").with_file(path + ".data");
  }

  void tensor(const Tensor& t, const std::string& name, onnx::TensorProto& tp) {
    if (!t.defined()) {
      fail("constant '" + name +
           "' has no data yet (a hollow constant): give it with "
           "Session::set_constant before saving, or save the model it came from");
    }
    tp.set_name(name);
    tp.set_data_type(static_cast<int32_t>(t.dtype()));
    for (int64_t d : t.shape()) tp.add_dims(d);
    const Tensor c = t.contiguous();
    if (c.dtype() == DataType::String) {
      const std::string* s = c.data<const std::string>();
      for (int64_t i = 0; i < c.numel(); ++i) tp.add_string_data(s[i]);
      return;
    }
    const char* bytes = reinterpret_cast<const char*>(c.raw_data());
    const uint64_t n = c.nbytes();
    if (!data_.is_open() || n < kExternalMinBytes) {
      tp.set_raw_data(bytes, n);
      return;
    }
    const uint64_t offset = (offset_ + kExternalAlign - 1) / kExternalAlign * kExternalAlign;
    static const char zeros[kExternalAlign] = {};
    data_.write(zeros, static_cast<std::streamsize>(offset - offset_));
    data_.write(bytes, static_cast<std::streamsize>(n));
    offset_ = offset + n;
    tp.set_data_location(onnx::TensorProto::EXTERNAL);
    auto entry = [&](const char* key, const std::string& value) {
      auto* kv = tp.add_external_data();
      kv->set_key(key);
      kv->set_value(value);
    };
    entry("location", data_name_);
    entry("offset", std::to_string(offset));
    entry("length", std::to_string(n));
  }

  void finish() {
    if (data_.is_open() && !data_.flush())
      throw Error(ErrorKind::Io, "cannot write external data").with_file(path_ + ".data");
  }

  void graph(const ir::Graph& g, onnx::GraphProto& gp) {
    gp.set_name(g.name);
    auto value_info = [&](ir::ValueId id, onnx::ValueInfoProto& vi) {
      vi.set_name(g.value(id).name);
      if (g.value(id).type.kind != Value::Kind::None)
        write_type(g.value(id).type, *vi.mutable_type());
    };
    for (ir::ValueId id : g.inputs) {
      value_info(id, *gp.add_input());
      // An input with a default value: the value is an initializer of the same name.
      if (g.value(id).constant.defined())
        tensor(g.value(id).constant, g.value(id).name, *gp.add_initializer());
    }
    for (ir::ValueId id : g.initializers)
      tensor(g.value(id).constant, g.value(id).name, *gp.add_initializer());
    auto name_of = [&](ir::ValueId id) {
      return id == ir::kNoValue ? std::string() : g.value(id).name;
    };
    for (int32_t index : ir::topological_order(g)) {
      const ir::Node& n = g.nodes[static_cast<size_t>(index)];
      onnx::NodeProto& np = *gp.add_node();
      np.set_name(n.name);
      np.set_op_type(n.op_type);
      if (!n.domain.empty()) np.set_domain(n.domain);
      if (n.domain.empty() && n.opset > ai_onnx_opset_) {
        // A pass made this node at a newer ai.onnx version than the file imports (e.g.
        // Attention-23 in an opset-18 model); one file holds one version per domain, so the
        // node goes to the kiln domain with its version, which the loader turns back.
        np.set_domain("kiln");
        auto* v = np.add_attribute();
        v->set_name(kOnnxOpsetAttribute);
        v->set_type(onnx::AttributeProto::INT);
        v->set_i(n.opset);
      }
      for (ir::ValueId id : n.inputs) np.add_input(name_of(id));
      for (ir::ValueId id : n.outputs) np.add_output(name_of(id));
      for (const ir::Attribute& a : n.attributes) {
        try {
          attribute(a, *np.add_attribute());
        } catch (Error& e) {
          e.with_node(n.name, n.op_type);
          throw;
        }
      }
      // Declared types of intermediate values, as the file gave them.
      for (ir::ValueId id : n.outputs) {
        if (id == ir::kNoValue || g.value(id).type.kind == Value::Kind::None) continue;
        if (std::find(g.outputs.begin(), g.outputs.end(), id) != g.outputs.end()) continue;
        value_info(id, *gp.add_value_info());
      }
    }
    for (ir::ValueId id : g.outputs) value_info(id, *gp.add_output());
  }

 private:
  void attribute(const ir::Attribute& a, onnx::AttributeProto& ap) {
    using AP = onnx::AttributeProto;
    ap.set_name(a.name);
    switch (a.kind) {
      case ir::AttrKind::Float:
        ap.set_type(AP::FLOAT);
        ap.set_f(a.f);
        break;
      case ir::AttrKind::Int:
        ap.set_type(AP::INT);
        ap.set_i(a.i);
        break;
      case ir::AttrKind::String:
        ap.set_type(AP::STRING);
        ap.set_s(a.s);
        break;
      case ir::AttrKind::Tensor:
      case ir::AttrKind::SparseTensor:  // loaded as dense: written dense
        ap.set_type(AP::TENSOR);
        tensor(a.t, "", *ap.mutable_t());
        break;
      case ir::AttrKind::Graph:
        ap.set_type(AP::GRAPH);
        graph(*a.g, *ap.mutable_g());
        break;
      case ir::AttrKind::Floats:
        ap.set_type(AP::FLOATS);
        for (float f : a.floats) ap.add_floats(f);
        break;
      case ir::AttrKind::Ints:
        ap.set_type(AP::INTS);
        for (int64_t i : a.ints) ap.add_ints(i);
        break;
      case ir::AttrKind::Strings:
        ap.set_type(AP::STRINGS);
        for (const std::string& s : a.strings) ap.add_strings(s);
        break;
      case ir::AttrKind::Tensors:
        ap.set_type(AP::TENSORS);
        for (const Tensor& t : a.tensors) tensor(t, "", *ap.add_tensors());
        break;
      case ir::AttrKind::Graphs:
        ap.set_type(AP::GRAPHS);
        for (const auto& sub : a.graphs) graph(*sub, *ap.add_graphs());
        break;
      case ir::AttrKind::TypeProto:
        ap.set_type(AP::TYPE_PROTO);
        write_type(a.type, *ap.mutable_tp());
        break;
      default:
        fail("attribute '" + a.name + "' has a kind that cannot be written");
    }
  }

  std::string path_;
  int64_t ai_onnx_opset_ = 0;
  std::string data_name_;
  std::ofstream data_;
  uint64_t offset_ = 0;
};

// The domains used by the graph's nodes (nested graphs included) with their opsets; ai.onnx
// nodes newer than the file's `ai_onnx` import are written in the kiln domain.
void collect_domains(const ir::Graph& g, int64_t ai_onnx, std::map<std::string, int64_t>& out) {
  for (const ir::Node& n : g.nodes) {
    const bool newer = n.domain.empty() && n.opset > ai_onnx;
    out.emplace(newer ? std::string("kiln") : n.domain, newer ? 1 : std::max<int64_t>(n.opset, 1));
    for (const ir::Attribute* a : n.graph_attributes()) {
      if (a->g) collect_domains(*a->g, ai_onnx, out);
      for (const auto& sub : a->graphs) collect_domains(*sub, ai_onnx, out);
    }
  }
}

uint64_t weight_bytes(const ir::Graph& g) {
  uint64_t total = 0;
  for (const ir::ValueInfo& v : g.values) {
    if (v.constant.defined() && v.constant.dtype() != DataType::String)
      total += v.constant.nbytes();
  }
  for (const ir::Node& n : g.nodes) {
    for (const ir::Attribute& a : n.attributes) {
      if (a.t.defined() && a.t.dtype() != DataType::String) total += a.t.nbytes();
      if (a.g) total += weight_bytes(*a.g);
      for (const auto& sub : a.graphs) total += weight_bytes(*sub);
    }
  }
  return total;
}

}  // namespace

void save_model(const ir::Model& model, const std::string& path, uint64_t embedded_limit) {
  try {
    if (!model.graph) fail("the model has no graph");
    onnx::ModelProto mp;
    mp.set_ir_version(model.ir_version);
    if (!model.producer_name.empty()) mp.set_producer_name(model.producer_name);
    if (!model.producer_version.empty()) mp.set_producer_version(model.producer_version);
    if (!model.domain.empty()) mp.set_domain(model.domain);
    if (model.has_model_version) mp.set_model_version(model.model_version);
    if (!model.doc_string.empty()) mp.set_doc_string(model.doc_string);
    for (const auto& [key, value] : model.metadata) {
      auto* kv = mp.add_metadata_props();
      kv->set_key(key);
      kv->set_value(value);
    }
    std::map<std::string, int64_t> opsets = model.opsets;
    const int64_t ai_onnx = opsets.count("") ? opsets[""] : 1;
    collect_domains(*model.graph, ai_onnx, opsets);  // keeps the model's own versions
    for (const auto& [domain, version] : opsets) {
      auto* op = mp.add_opset_import();
      op->set_domain(domain);
      op->set_version(version);
    }
    Writer writer(path, weight_bytes(*model.graph) > embedded_limit, ai_onnx);
    writer.graph(*model.graph, *mp.mutable_graph());
    if (!model.graph_doc_string.empty()) mp.mutable_graph()->set_doc_string(model.graph_doc_string);
    writer.finish();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out || !mp.SerializeToOstream(&out) || !out.flush())
      throw Error(ErrorKind::Io, "cannot write the model");
  } catch (Error& e) {
    e.with_file(path);
    throw;
  }
}

}  // namespace kiln::proto
