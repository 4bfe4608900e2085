// Test support: serialized ONNX models built in code, for loader tests (kept in proto/ so
// that protobuf stays behind this directory). Not part of libkiln.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/data_type.h"
#include "kiln/tensor.h"

namespace kiln::proto::testing {

struct TensorSpec {
  enum class Store { Raw, Typed, External };
  std::string name;
  DataType dtype = DataType::Float;
  std::vector<int64_t> dims;
  std::vector<float> values;  // float data (Raw/Typed/External for Float)
  std::vector<uint8_t> raw;   // overrides `values` for Raw when not empty
  Store store = Store::Raw;
  std::string location;        // External
  std::string offset, length;  // External: "" leaves the key out
};

// A float SparseTensorProto: `values` at the linear `indices` of a tensor of `dims`.
struct SparseSpec {
  std::vector<int64_t> dims;
  std::vector<float> values;
  std::vector<int64_t> indices;
};

struct NodeSpec {
  std::string op;
  std::vector<std::string> inputs, outputs;
  std::string name;
  std::vector<std::pair<std::string, int64_t>> int_attrs;
  std::vector<std::pair<std::string, TensorSpec>> tensor_attrs = {};  // each spec's name unused
  std::vector<std::pair<std::string, SparseSpec>> sparse_attrs = {};
};

struct ModelSpec {
  int64_t opset = 18;
  int64_t ir_version = 8;
  std::vector<std::pair<std::string, std::vector<int64_t>>> inputs;  // float inputs
  std::vector<TensorSpec> initializers;
  std::vector<NodeSpec> nodes;
  std::vector<std::string> outputs;  // float outputs of unknown shape
};

// Serialized ModelProto.
std::string model_bytes(const ModelSpec& spec);
// Offset of the first occurrence of `needle` in `haystack` (npos if absent).
size_t find_bytes(const std::string& haystack, const std::vector<uint8_t>& needle);

}  // namespace kiln::proto::testing
