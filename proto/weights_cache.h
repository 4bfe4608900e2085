// WeightsCache: the weights an Environment's sessions share.
//
// Two kinds of entries, both refcounted by the sessions that hold them and dropped when the
// last one goes:
// - Loaded weights, found by content: a fingerprint (type, shape, size and a few sampled
//   blocks) picks candidates and a full byte comparison decides, so two files holding the
//   same weights (an Optimum decoder_model.onnx and decoder_with_past_model.onnx) keep one
//   copy resident, and the duplicate's file pages are given back after the comparison.
// - Prepared forms (a kernel's packed or widened copy of a constant input), keyed by the
//   source weight's storage and byte range plus the name of the packing. The entry holds the
//   source alive, so the key's address cannot be reused while it exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/environment.h"
#include "kiln/tensor.h"

namespace kiln::detail {

class WeightsCache : public std::enable_shared_from_this<WeightsCache> {
 public:
  struct Entry;
  // A session's hold on an entry: the entry lives while a lease does.
  using Lease = std::shared_ptr<const Entry>;

  // Compares the first `n` bytes of a candidate with the weight being loaded, chunk by
  // chunk (the caller may release pages behind each chunk). Returns true when equal.
  using Compare = std::function<bool(const std::byte* cached)>;

  // A loaded weight equal to (dtype, shape, n bytes) already in the cache, or null.
  // `fingerprint` is weight_fingerprint() of the bytes being loaded.
  Lease find_loaded(uint64_t fingerprint, DataType dtype, const Shape& shape, size_t n,
                    const Compare& equal);
  // Adds a loaded weight (its storage must own its bytes or keep their mapping alive).
  // When another thread added an equal weight meanwhile, that one is returned instead.
  Lease add_loaded(uint64_t fingerprint, const Tensor& weight);

  // The prepared form `packing` of `source`, made by `make` when not cached. `made` tells
  // whether this call made it.
  Lease prepared(const Tensor& source, const std::string& packing,
                 const std::function<Tensor(const Tensor&)>& make, bool* made);

  WeightsCacheStats stats() const;

 private:
  friend struct Entry;
  void erase(const Entry& e);

  mutable std::mutex mutex_;
  std::unordered_multimap<uint64_t, std::weak_ptr<const Entry>> loaded_;
  std::unordered_multimap<uint64_t, std::weak_ptr<const Entry>> prepared_;
  uint64_t made_ = 0, hits_ = 0;
};

struct WeightsCache::Entry {
  Tensor tensor;
  uint64_t key = 0;
  bool is_prepared = false;
  Tensor source;        // prepared forms: the weight they were made from
  std::string packing;  // prepared forms: the packing's name
  std::weak_ptr<WeightsCache> cache;
  ~Entry();
};

// Fingerprint of a weight's bytes: type, shape, size and up to three 4 KiB blocks (start,
// middle, end). Equal weights have equal fingerprints; the converse is checked byte by byte.
uint64_t weight_fingerprint(DataType dtype, const Shape& shape, const std::byte* bytes, size_t n);

// The environment's cache (created with the environment).
WeightsCache& weights_cache(const Environment& env);

}  // namespace kiln::detail
