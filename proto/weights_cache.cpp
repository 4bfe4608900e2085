#include "proto/weights_cache.h"

#include <algorithm>
#include <cstring>

namespace kiln::detail {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 32);
}

uint64_t mix_bytes(uint64_t h, const std::byte* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix(h, tail ^ (n - i));
}

uint64_t describe_key(DataType dtype, const Shape& shape, size_t n) {
  uint64_t h = mix(0x6b696c6eULL, static_cast<uint64_t>(dtype));
  for (int64_t d : shape) h = mix(h, static_cast<uint64_t>(d));
  return mix(h, n);
}

bool same_layout(const Tensor& t, DataType dtype, const Shape& shape, size_t n) {
  return t.dtype() == dtype && t.shape() == shape && t.nbytes() == n;
}

const std::byte* bytes_of(const Tensor& t) {
  return t.storage()->data() + t.byte_offset();
}

}  // namespace

uint64_t weight_fingerprint(DataType dtype, const Shape& shape, const std::byte* bytes, size_t n) {
  constexpr size_t kBlock = 4096;
  uint64_t h = describe_key(dtype, shape, n);
  if (n <= 3 * kBlock) return mix_bytes(h, bytes, n);
  h = mix_bytes(h, bytes, kBlock);
  h = mix_bytes(h, bytes + (n / 2 - kBlock / 2), kBlock);
  return mix_bytes(h, bytes + (n - kBlock), kBlock);
}

WeightsCache::Entry::~Entry() {
  if (auto c = cache.lock()) c->erase(*this);
}

void WeightsCache::erase(const Entry& e) {
  std::lock_guard lock(mutex_);
  auto& map = e.is_prepared ? prepared_ : loaded_;
  auto [lo, hi] = map.equal_range(e.key);
  for (auto it = lo; it != hi;) it = it->second.expired() ? map.erase(it) : std::next(it);
}

WeightsCache::Lease WeightsCache::find_loaded(uint64_t fingerprint, DataType dtype,
                                              const Shape& shape, size_t n, const Compare& equal) {
  // Handles taken under the lock are released after it: dropping the last one runs
  // Entry::~Entry, which takes the lock again.
  std::vector<Lease> seen;
  std::lock_guard lock(mutex_);
  auto [lo, hi] = loaded_.equal_range(fingerprint);
  for (auto it = lo; it != hi; ++it) {
    Lease e = it->second.lock();
    if (!e) continue;
    seen.push_back(e);
    if (same_layout(e->tensor, dtype, shape, n) && equal(bytes_of(e->tensor))) return e;
  }
  return nullptr;
}

WeightsCache::Lease WeightsCache::add_loaded(uint64_t fingerprint, const Tensor& weight) {
  auto e = std::make_shared<Entry>();
  e->tensor = weight;
  e->key = fingerprint;
  e->cache = weak_from_this();
  std::vector<Lease> seen;
  std::lock_guard lock(mutex_);
  auto [lo, hi] = loaded_.equal_range(fingerprint);
  const size_t n = weight.nbytes();
  for (auto it = lo; it != hi; ++it) {
    Lease other = it->second.lock();
    if (!other) continue;
    seen.push_back(other);
    if (same_layout(other->tensor, weight.dtype(), weight.shape(), n) &&
        std::memcmp(bytes_of(other->tensor), bytes_of(weight), n) == 0) {
      e->cache.reset();  // never inserted: nothing to erase
      return other;
    }
  }
  loaded_.emplace(fingerprint, e);
  return e;
}

WeightsCache::Lease WeightsCache::prepared(const Tensor& source, const std::string& packing,
                                           const std::function<Tensor(const Tensor&)>& make,
                                           bool* made) {
  uint64_t key = describe_key(source.dtype(), source.shape(), source.nbytes());
  key = mix(key, reinterpret_cast<uintptr_t>(source.storage().get()));
  key = mix(key, source.byte_offset());
  key = mix_bytes(key, reinterpret_cast<const std::byte*>(packing.data()), packing.size());
  auto matches = [&](const Entry& e) {
    return e.packing == packing && e.source.storage() == source.storage() &&
           e.source.byte_offset() == source.byte_offset() && e.source.dtype() == source.dtype() &&
           e.source.shape() == source.shape() && e.source.strides() == source.strides();
  };
  auto lookup = [&](std::vector<Lease>& seen) -> Lease {
    auto [lo, hi] = prepared_.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      Lease e = it->second.lock();
      if (!e) continue;
      seen.push_back(e);
      if (matches(*e)) return e;
    }
    return nullptr;
  };
  if (made) *made = false;
  {
    std::vector<Lease> seen;
    std::lock_guard lock(mutex_);
    if (Lease e = lookup(seen)) {
      ++hits_;
      return e;
    }
  }
  // Made outside the lock: sessions created concurrently prepare different weights in
  // parallel; two making the same form keep the first one added.
  auto e = std::make_shared<Entry>();
  e->tensor = make(source);
  e->key = key;
  e->is_prepared = true;
  e->source = source;
  e->packing = packing;
  e->cache = weak_from_this();
  std::vector<Lease> seen;
  std::lock_guard lock(mutex_);
  if (Lease other = lookup(seen)) {
    ++hits_;
    e->cache.reset();
    return other;
  }
  prepared_.emplace(key, e);
  ++made_;
  if (made) *made = true;
  return e;
}

WeightsCacheStats WeightsCache::stats() const {
  WeightsCacheStats s;
  std::vector<Lease> seen;
  std::lock_guard lock(mutex_);
  for (const auto* map : {&loaded_, &prepared_}) {
    for (const auto& [key, weak] : *map) {
      Lease e = weak.lock();
      if (!e) continue;
      ++s.entries;
      s.bytes += e->tensor.nbytes();
      ++(e->is_prepared ? s.prepared_entries : s.loaded_entries);
      s.references += static_cast<uint64_t>(e.use_count() - 1);
      seen.push_back(std::move(e));
    }
  }
  // The handles in `seen` count once more each; they are dropped after the lock.
  s.prepared_made = made_;
  s.prepared_hits = hits_;
  return s;
}

}  // namespace kiln::detail
