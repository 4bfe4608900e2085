// Internal to proto/: TensorProto -> Tensor, shared by the model loader and the test-data
// reader.
#pragma once

#include "proto/onnx_proto.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/session.h"
#include "kiln/tensor.h"
#include "proto/mapped_file.h"
#include "proto/weights_cache.h"
#include "proto/wire.h"

namespace kiln::proto {

// Where the bytes of a message came from, so raw_data references can be resolved.
struct Source {
  const std::byte* base = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keepalive;  // the mapping, or null for caller memory
  std::vector<ByteRange> raw;
  std::string base_dir;  // for external data; empty: not allowed
  std::map<std::string, std::shared_ptr<MappedFile>> external_files;
  LoadStats* stats = nullptr;
  // Missing external data files give hollow tensors (dtype and shape, no storage) when both
  // are set: the option, and the converter being at a main-graph initializer.
  bool defer_missing_external = false;
  bool hollow_allowed = false;
  // Equal weights are shared through the cache when set; each one used is leased here.
  detail::WeightsCache* cache = nullptr;
  std::vector<std::shared_ptr<const detail::WeightsCache::Entry>>* leases = nullptr;
};

// Throws Error(InvalidModel) naming the tensor on inconsistent data. Returns a tensor
// without storage (a hollow constant) only as Source::hollow_allowed permits.
Tensor convert_tensor(const onnx::TensorProto& tp, Source& src);

}  // namespace kiln::proto
