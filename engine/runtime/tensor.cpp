#include "kiln/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "engine/runtime/buffer_pool.h"
#include "kiln/error.h"

namespace kiln {

Storage::~Storage() {
  switch (kind_) {
    case Kind::Pool:
      pool_->release(data_, capacity_);
      break;
    case Kind::Heap:
      std::free(data_);
      break;
    case Kind::Strings: {
      auto* strings = reinterpret_cast<std::string*>(data_);
      for (size_t i = 0; i < string_count_; ++i) strings[i].~basic_string();
      std::free(data_);
      break;
    }
    case Kind::View:
      break;
  }
}

std::shared_ptr<Storage> Storage::heap(size_t bytes) {
  std::shared_ptr<Storage> s = heap_uninitialized(bytes);
  std::memset(s->data_, 0, bytes == 0 ? 64 : (bytes + 63) / 64 * 64);
  return s;
}

namespace {

// 64-byte aligned memory for `bytes` (at least one line), or kiln::Error naming the size.
std::byte* allocate_lines(size_t bytes) {
  if (bytes > kMaxAllocationBytes) {
    throw Error(ErrorKind::Memory, "cannot allocate " + byte_size_text(bytes) + ": out of memory");
  }
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (!p) {
    throw Error(ErrorKind::Memory, "cannot allocate " + byte_size_text(bytes) + ": out of memory");
  }
  return p;
}

}  // namespace

std::shared_ptr<Storage> Storage::heap_uninitialized(size_t bytes) {
  std::byte* p = allocate_lines(bytes);
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = p;
  s->capacity_ = bytes;
  s->kind_ = Kind::Heap;
  return s;
}

std::shared_ptr<Storage> Storage::view(const void* data, size_t bytes,
                                       std::shared_ptr<const void> keepalive, bool writable) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = static_cast<std::byte*>(const_cast<void*>(data));
  s->capacity_ = bytes;
  s->kind_ = Kind::View;
  s->writable_ = writable;
  s->keepalive_ = std::move(keepalive);
  return s;
}

std::shared_ptr<Storage> Storage::file_mapping(const void* data, size_t bytes,
                                               std::shared_ptr<const void> mapping) {
  std::shared_ptr<Storage> s = view(data, bytes, std::move(mapping), false);
  s->file_mapped_ = true;
  return s;
}

std::shared_ptr<Storage> Storage::strings(size_t count) {
  if (count > kMaxAllocationBytes / sizeof(std::string)) {
    throw Error(ErrorKind::Memory,
                "cannot allocate " + std::to_string(count) + " strings: out of memory");
  }
  std::byte* p = allocate_lines(count * sizeof(std::string));
  auto* strings = reinterpret_cast<std::string*>(p);
  for (size_t i = 0; i < count; ++i) new (&strings[i]) std::string();
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = p;
  s->capacity_ = count * sizeof(std::string);
  s->kind_ = Kind::Strings;
  s->string_count_ = count;
  return s;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // Only a tensor with no elements can have dimensions whose product overflows (the
    // element count of any other is at most kMaxElementCount); its strides are never used.
    if (__builtin_mul_overflow(s, shape[i], &s)) s = 0;
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      // Saturates, unless a later dimension is 0 (an empty tensor of huge dimensions).
      for (int64_t e : shape) {
        if (e == 0) return 0;
      }
      return std::numeric_limits<int64_t>::max();
    }
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t checked_numel(const Shape& shape) {
  constexpr int64_t kMax = kMaxElementCount;
  int64_t n = 1;
  bool too_big = false;
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorKind::InvalidArgument,
                  "negative dimension in shape " + shape_to_string(shape));
    }
    if (d > 0 && n > kMax / d) too_big = true;
    n = too_big ? n : n * d;
  }
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  if (too_big) {
    throw Error(ErrorKind::InvalidArgument, "shape " + shape_to_string(shape) + " is too large");
  }
  return n;
}

void throw_element_count_mismatch(int64_t expected, size_t given) {
  throw Error(ErrorKind::InvalidArgument, "tensor of " + std::to_string(expected) +
                                              " elements given " + std::to_string(given) +
                                              " values");
}

Tensor::Tensor(DataType dtype, Shape shape, std::shared_ptr<Storage> storage, size_t byte_offset,
               Shape strides)
    : dtype_(dtype),
      shape_(std::move(shape)),
      strides_(strides.empty() && !shape_.empty() ? contiguous_strides(shape_)
                                                  : std::move(strides)),
      storage_(std::move(storage)),
      offset_(byte_offset) {}

Tensor Tensor::zeros(DataType dtype, Shape shape) {
  const int64_t n = checked_numel(shape);
  try {
    if (dtype == DataType::String) {
      return Tensor(dtype, shape, Storage::strings(static_cast<size_t>(n)));
    }
    return Tensor(dtype, shape, Storage::heap(storage_bytes(dtype, n)));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Memory) throw;
    // The same error, stating the tensor it was for.
    throw Error(ErrorKind::Memory,
                "a " + std::string(data_type_name(dtype)) + " tensor of shape " +
                    shape_to_string(shape) + " needs " +
                    byte_size_text(dtype == DataType::String ? static_cast<uint64_t>(n) * 32
                                                             : storage_bytes(dtype, n)) +
                    ": out of memory");
  }
}

Tensor Tensor::with_capacity(DataType dtype, Shape shape, size_t axis, int64_t capacity) {
  if (axis >= shape.size() || capacity < shape[axis]) {
    throw Error(ErrorKind::InvalidArgument, "with_capacity: axis " + std::to_string(axis) +
                                                " capacity " + std::to_string(capacity) +
                                                " does not fit shape " + shape_to_string(shape));
  }
  if (dtype == DataType::String || bits_per_element(dtype) < 8) {
    throw Error(ErrorKind::Unsupported, "with_capacity: element type " +
                                            std::string(data_type_name(dtype)) + " not supported");
  }
  Shape full = shape;
  full[axis] = capacity;
  Tensor t = zeros(dtype, full);
  return Tensor(dtype, std::move(shape), t.storage_, 0, contiguous_strides(full));
}

Tensor Tensor::borrow(DataType dtype, Shape shape, const void* data) {
  const size_t bytes = storage_bytes(dtype, shape_numel(shape));
  return Tensor(dtype, std::move(shape), Storage::view(data, bytes, nullptr, false));
}

int64_t Tensor::numel() const {
  return shape_numel(shape_);
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

void Tensor::check_type(DataType requested) const {
  if (!storage_) throw Error(ErrorKind::Runtime, "access to an undefined tensor");
  if (requested != dtype_) {
    // Storage-compatible integer views are a programming error, never user input.
    throw Error(ErrorKind::Runtime, "tensor of type " + std::string(data_type_name(dtype_)) +
                                        " read as " + std::string(data_type_name(requested)));
  }
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel() || !is_contiguous()) {
    throw Error(ErrorKind::Runtime, "cannot view " + describe() + " as " + shape_to_string(shape));
  }
  return Tensor(dtype_, std::move(shape), storage_, offset_);
}

Tensor Tensor::view(Shape shape, Shape strides, size_t byte_offset) const {
  return Tensor(dtype_, std::move(shape), storage_, byte_offset, std::move(strides));
}

namespace {

// dst[i * ds] = src[i * ss] for i < n, elements of T.
template <typename T>
void copy_strided(const std::byte* src, int64_t ss, std::byte* dst, int64_t ds, int64_t n) {
  const T* f = reinterpret_cast<const T*>(src);
  T* t = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) t[i * ds] = f[i * ss];
}

}  // namespace

void copy_elements(const Tensor& src, const Tensor& dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  const bool is_string = src.dtype() == DataType::String;
  const auto esize = static_cast<int64_t>(bits_per_element(src.dtype()) / 8);
  if (!is_string && src.is_contiguous() && dst.is_contiguous()) {
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
    return;
  }
  if (esize == 0 || (is_string && bits_per_element(src.dtype()) % 8 != 0)) {
    throw Error(ErrorKind::Unsupported, "strided copy of " + src.describe());
  }
  // The dimensions with adjacent ones merged where both sides are dense across them (a
  // transpose of [N, g, c, H, W] that keeps H and W copies rows of H * W, not of W), and
  // dimensions of size 1 dropped. Shape keeps a few inline: no allocation for common ranks.
  Shape shape, ss, ds;
  for (size_t d = 0; d < src.rank(); ++d) {
    const int64_t size = src.shape()[d], s = src.strides()[d], t = dst.strides()[d];
    if (size == 1) continue;
    if (!shape.empty() && ss.back() == s * size && ds.back() == t * size) {
      shape.back() *= size;
      ss.back() = s;
      ds.back() = t;
      continue;
    }
    shape.push_back(size);
    ss.push_back(s);
    ds.push_back(t);
  }
  if (shape.empty()) {  // one element
    shape.push_back(1);
    ss.push_back(1);
    ds.push_back(1);
  }
  // Odometer over all but the last dimension. Offsets are signed: views may have negative
  // strides. memcpy runs along the last dimension when both sides are dense there.
  const size_t rank = shape.size();
  const int64_t inner = shape[rank - 1], si = ss[rank - 1], di = ds[rank - 1];
  Shape idx(rank, 0);
  const std::byte* sp = src.raw_data();
  std::byte* dp = dst.raw_data();
  for (int64_t done = 0; done < n; done += inner) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d + 1 < rank; ++d) {
      so += idx[d] * ss[d];
      doff += idx[d] * ds[d];
    }
    if (is_string) {
      auto* f = reinterpret_cast<const std::string*>(sp) + so;
      auto* t = reinterpret_cast<std::string*>(dp) + doff;
      for (int64_t i = 0; i < inner; ++i) t[i * di] = f[i * si];
    } else if (si == 1 && di == 1) {
      std::memcpy(dp + doff * esize, sp + so * esize, static_cast<size_t>(inner * esize));
    } else {
      const std::byte* f = sp + so * esize;
      std::byte* t = dp + doff * esize;
      switch (esize) {
        case 1:
          copy_strided<uint8_t>(f, si, t, di, inner);
          break;
        case 2:
          copy_strided<uint16_t>(f, si, t, di, inner);
          break;
        case 4:
          copy_strided<uint32_t>(f, si, t, di, inner);
          break;
        case 8:
          copy_strided<uint64_t>(f, si, t, di, inner);
          break;
        default:
          for (int64_t i = 0; i < inner; ++i) {
            std::memcpy(t + i * di * esize, f + i * si * esize, static_cast<size_t>(esize));
          }
      }
    }
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

Tensor Tensor::contiguous() const {
  if (!storage_ || is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = zeros(dtype_, shape_);
  copy_elements(*this, out);
  return out;
}

std::string Tensor::describe() const {
  return std::string(data_type_name(dtype_)) + shape_to_string(shape_);
}

}  // namespace kiln
