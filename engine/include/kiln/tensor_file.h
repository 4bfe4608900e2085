// ONNX test-data files: a serialized TensorProto, SequenceProto or OptionalProto per value,
// as the ONNX backend test sets hold a model's inputs and expected outputs
// (test_data_set_N/input_K.pb, output_K.pb).
#pragma once

#include <string>

#include "kiln/session.h"
#include "kiln/value.h"

namespace kiln {

// Reads the value at `path` for a model input or output described by `expected` (its kind
// picks TensorProto, SequenceProto or OptionalProto; its element type is checked). Sets
// `name`, when given, to the name the file records. A file that cannot be read or does not
// hold such a value is a kiln::Error naming the file.
Value read_value_file(const std::string& path, const IoInfo& expected, std::string* name = nullptr);

}  // namespace kiln
