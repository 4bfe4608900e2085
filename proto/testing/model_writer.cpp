#include "proto/testing/model_writer.h"

#include <cstring>

#include "proto/onnx_proto.h"

namespace kiln::proto::testing {

namespace {

// `t`'s type, dims and data (as `t.store` says) into `tp`.
void fill_tensor(onnx::TensorProto* tp, const TensorSpec& t) {
  tp->set_data_type(static_cast<int32_t>(t.dtype));
  for (int64_t d : t.dims) tp->add_dims(d);
  switch (t.store) {
    case TensorSpec::Store::Raw:
      if (!t.raw.empty()) {
        tp->set_raw_data(t.raw.data(), t.raw.size());
      } else {
        tp->set_raw_data(t.values.data(), t.values.size() * sizeof(float));
      }
      break;
    case TensorSpec::Store::Typed:
      for (float v : t.values) tp->add_float_data(v);
      break;
    case TensorSpec::Store::External: {
      tp->set_data_location(onnx::TensorProto::EXTERNAL);
      auto add = [&](const char* k, const std::string& v) {
        auto* e = tp->add_external_data();
        e->set_key(k);
        e->set_value(v);
      };
      add("location", t.location);
      if (!t.offset.empty()) add("offset", t.offset);
      if (!t.length.empty()) add("length", t.length);
      break;
    }
  }
}

}  // namespace

std::string model_bytes(const ModelSpec& spec) {
  onnx::ModelProto m;
  m.set_ir_version(spec.ir_version);
  m.set_producer_name("kiln-tests");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(spec.opset);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("test");
  for (const auto& [name, dims] : spec.inputs) {
    auto* in = g->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  for (const TensorSpec& t : spec.initializers) {
    auto* tp = g->add_initializer();
    tp->set_name(t.name);
    fill_tensor(tp, t);
  }
  for (const NodeSpec& n : spec.nodes) {
    auto* np = g->add_node();
    np->set_op_type(n.op);
    np->set_name(n.name);
    for (const auto& i : n.inputs) np->add_input(i);
    for (const auto& o : n.outputs) np->add_output(o);
    for (const auto& [k, v] : n.int_attrs) {
      auto* a = np->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    }
    for (const auto& [k, t] : n.tensor_attrs) {
      auto* a = np->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::TENSOR);
      fill_tensor(a->mutable_t(), t);
    }
    for (const auto& [k, sparse] : n.sparse_attrs) {
      auto* a = np->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::SPARSE_TENSOR);
      auto* sp = a->mutable_sparse_tensor();
      for (int64_t d : sparse.dims) sp->add_dims(d);
      auto* values = sp->mutable_values();
      values->set_name(n.name + "_" + k);
      values->set_data_type(onnx::TensorProto::FLOAT);
      values->add_dims(static_cast<int64_t>(sparse.values.size()));
      for (float v : sparse.values) values->add_float_data(v);
      auto* indices = sp->mutable_indices();
      indices->set_data_type(onnx::TensorProto::INT64);
      indices->add_dims(static_cast<int64_t>(sparse.indices.size()));
      for (int64_t i : sparse.indices) indices->add_int64_data(i);
    }
  }
  for (const auto& name : spec.outputs) {
    auto* out = g->add_output();
    out->set_name(name);
    out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  return m.SerializeAsString();
}

size_t find_bytes(const std::string& haystack, const std::vector<uint8_t>& needle) {
  if (needle.empty() || needle.size() > haystack.size()) return std::string::npos;
  for (size_t i = 0; i + needle.size() <= haystack.size(); ++i) {
    if (std::memcmp(haystack.data() + i, needle.data(), needle.size()) == 0) return i;
  }
  return std::string::npos;
}

}  // namespace kiln::proto::testing
