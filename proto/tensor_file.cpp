// ONNX test-data files: serialized TensorProto / SequenceProto / OptionalProto.
#include "proto/onnx_proto.h"

#include <cstring>
#include <fstream>

#include "kiln/error.h"
#include "kiln/tensor_file.h"
#include "proto/loader.h"
#include "proto/mapped_file.h"
#include "proto/tensor_convert.h"
#include "proto/wire.h"

namespace kiln::proto {
namespace {

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, what).with_file(path);
}

Value convert_sequence(const onnx::SequenceProto& sp, Source& src, const std::string& path);

Value convert_optional(const onnx::OptionalProto& op, Source& src, const std::string& path) {
  using OP = onnx::OptionalProto;
  switch (op.elem_type()) {
    case OP::TENSOR:
      if (!op.has_tensor_value())
        return Value::empty_optional(Value::Kind::Tensor, DataType::Undefined);
      return Value::optional(convert_tensor(op.tensor_value(), src));
    case OP::SEQUENCE:
      if (!op.has_sequence_value()) {
        return Value::empty_optional(Value::Kind::Sequence, DataType::Undefined);
      }
      return Value::optional(convert_sequence(op.sequence_value(), src, path));
    case OP::UNDEFINED:
      return Value::empty_optional(Value::Kind::Tensor, DataType::Undefined);
    default:
      bad_file(path, "optional values of this element kind are not supported");
  }
}

Value convert_sequence(const onnx::SequenceProto& sp, Source& src, const std::string& path) {
  if (sp.elem_type() != onnx::SequenceProto::TENSOR && sp.elem_type() != 0) {
    bad_file(path, "sequences of non-tensors are not supported");
  }
  std::vector<Tensor> items;
  DataType elem = DataType::Undefined;
  for (const auto& tp : sp.tensor_values()) {
    items.push_back(convert_tensor(tp, src));
    elem = items.back().dtype();
  }
  return Value::sequence(elem, std::move(items));
}

}  // namespace

Value read_value_file(const std::string& path, const ir::TypeInfo& expected, std::string* name) {
  auto file = MappedFile::open(path);
  Source src;
  src.base = file->data();
  src.size = file->size();
  src.keepalive = file;
  try {
    switch (expected.kind) {
      case Value::Kind::Sequence: {
        Skeleton sk = make_skeleton(file->data(), file->size(), WireMessage::Sequence);
        src.raw = std::move(sk.raw_data);
        onnx::SequenceProto sp;
        if (!sp.ParseFromString(sk.bytes)) bad_file(path, "not a SequenceProto");
        if (name) *name = sp.name();
        return convert_sequence(sp, src, path);
      }
      case Value::Kind::Optional: {
        Skeleton sk = make_skeleton(file->data(), file->size(), WireMessage::Optional);
        src.raw = std::move(sk.raw_data);
        onnx::OptionalProto op;
        if (!op.ParseFromString(sk.bytes)) bad_file(path, "not an OptionalProto");
        if (name) *name = op.name();
        return convert_optional(op, src, path);
      }
      default: {
        Skeleton sk = make_skeleton(file->data(), file->size(), WireMessage::Tensor);
        src.raw = std::move(sk.raw_data);
        onnx::TensorProto tp;
        if (!tp.ParseFromString(sk.bytes)) bad_file(path, "not a TensorProto");
        if (name) *name = tp.name();
        return convert_tensor(tp, src);
      }
    }
  } catch (Error& e) {
    e.with_file(path);
    throw;
  }
}

void write_tensor_file(const std::string& path, const Tensor& tensor, const std::string& name) {
  onnx::TensorProto tp;
  tp.set_name(name);
  tp.set_data_type(static_cast<int32_t>(tensor.dtype()));
  for (int64_t d : tensor.shape()) tp.add_dims(d);
  Tensor c = tensor.contiguous();
  if (c.dtype() == DataType::String) {
    const std::string* s = c.data<const std::string>();
    for (int64_t i = 0; i < c.numel(); ++i) tp.add_string_data(s[i]);
  } else {
    tp.set_raw_data(reinterpret_cast<const char*>(c.raw_data()), c.nbytes());
  }
  std::ofstream out(path, std::ios::binary);
  if (!out || !tp.SerializeToOstream(&out)) {
    throw Error(ErrorKind::Io, "cannot write tensor file").with_file(path);
  }
}

}  // namespace kiln::proto

namespace kiln {

Value read_value_file(const std::string& path, const IoInfo& expected, std::string* name) {
  ir::TypeInfo type;
  type.kind = expected.kind;
  type.elem = expected.dtype;
  return proto::read_value_file(path, type, name);
}

}  // namespace kiln
