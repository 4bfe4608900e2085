// Zero-copy support: a protobuf wire-format pass over a serialized ONNX message that
// produces a "skeleton" of it, identical except that every TensorProto.raw_data field on
// the way to weights is replaced by a reference (field kRawDataRefField, a varint index
// into `raw_data`). Protobuf then parses the small skeleton, and weights are read straight
// from the original (mapped) bytes. Bytes it does not need to look inside are copied
// verbatim, so anything it does not know about still parses normally.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::proto {

// The largest legal field number; kiln drops it from input TensorProtos before using it.
constexpr uint32_t kRawDataRefField = 536870911;

struct ByteRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};

enum class WireMessage {
  Model,
  Graph,
  Node,
  Attribute,
  Tensor,
  SparseTensor,
  Function,
  Sequence,
  Optional,
  Map
};

struct Skeleton {
  std::string bytes;
  std::vector<ByteRange> raw_data;  // offsets into the original buffer
};

// Throws kiln::Error (InvalidModel) when the bytes are not a well-formed message.
Skeleton make_skeleton(const std::byte* data, size_t size, WireMessage root);

}  // namespace kiln::proto
