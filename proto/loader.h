// proto/: the only code that sees protobuf. It turns ONNX files (and test-data files)
// into the engine's IR and values; nothing downstream knows they came from protobuf.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/ir/graph.h"
#include "kiln/session.h"
#include "kiln/value.h"
#include "proto/weights_cache.h"

namespace kiln::proto {

struct LoadOptions {
  // Main-graph initializers whose external data file does not exist (or cannot be located:
  // a buffer without base_dir) become hollow constants instead of a load error.
  bool defer_missing_external = false;
  // Share weights equal to ones already in this cache (and add the others to it); the
  // entries used are appended to `leases`, which must then be set too.
  detail::WeightsCache* weights_cache = nullptr;
  std::vector<std::shared_ptr<const detail::WeightsCache::Entry>>* leases = nullptr;
};

// Maps `path` and converts it. Initializers are read-only views into the mapping (or into
// mapped external-data files) wherever alignment allows; copies are counted in `stats`.
ir::Model load_model_file(const std::string& path, LoadStats& stats,
                          const LoadOptions& options = {});

// The same from a caller's buffer, which must outlive every tensor of the model. External
// data is resolved against `base_dir` (empty: external data is rejected, or deferred).
ir::Model load_model_buffer(const void* data, size_t size, const std::string& base_dir,
                            LoadStats& stats, const LoadOptions& options = {});

// Reads a serialized TensorProto, SequenceProto or OptionalProto (the ONNX test-data
// layout). `expected` picks which; kind None means TensorProto. Sets `name` from the proto.
Value read_value_file(const std::string& path, const ir::TypeInfo& expected, std::string* name);

// A saved node of the ai.onnx domain at a newer version than its file imports (a pass made
// it) is written in the kiln domain with this attribute giving its ai.onnx version; loading
// turns it back.
inline constexpr const char* kOnnxOpsetAttribute = "onnx_opset";

// Writes `model` as an ONNX file at `path`, nodes in dependency order. Weights are embedded,
// unless they exceed `embedded_limit` bytes (protobuf's limit is 2 GiB): then those of 1 KiB
// or more go to `path`.data beside it, each at a 4096-byte aligned offset, so a reload maps
// them in place. Throws kiln::Error naming the file (and node) on failure, e.g. a hollow
// constant without data.
void save_model(const ir::Model& model, const std::string& path,
                uint64_t embedded_limit = uint64_t{1} << 30);

// Serializes a tensor as a TensorProto file.
void write_tensor_file(const std::string& path, const Tensor& tensor, const std::string& name);

}  // namespace kiln::proto
