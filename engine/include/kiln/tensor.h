// Storage and Tensor: the bytes, and a typed, shaped, strided window onto them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/data_type.h"
#include "kiln/shape.h"

namespace kiln {

namespace detail {
class PoolCore;
}

// A refcounted byte buffer with a capacity. Shared by every Tensor that views it, which
// is what lets the executor tell whether a value may be overwritten: only a writable
// storage referenced by exactly one tensor can be.
class Storage {
 public:
  enum class Kind {
    Pool,     // borrowed from a session's BufferPool; returned to it when the last view goes
    Heap,     // allocated on its own and freed when the last view goes
    View,     // bytes someone else owns: a mapped model file or a caller's memory
    Strings,  // an array of std::string objects (element type String)
  };

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  Kind kind() const { return kind_; }
  bool writable() const { return writable_; }
  // True for bytes of a read-only, private file mapping: their pages may be given back to
  // the OS (release_pages) and are read from the file again on the next access.
  bool file_mapped() const { return file_mapped_; }
  // Weights are marked read-only after loading, whatever their kind.
  void set_read_only() { writable_ = false; }

  // A 64-byte aligned buffer of `bytes`, zero-filled.
  static std::shared_ptr<Storage> heap(size_t bytes);
  // The same without the fill, for a buffer about to be overwritten in full.
  static std::shared_ptr<Storage> heap_uninitialized(size_t bytes);
  // Bytes owned elsewhere; `keepalive` (e.g. the file mapping) is held as long as the view.
  static std::shared_ptr<Storage> view(const void* data, size_t bytes,
                                       std::shared_ptr<const void> keepalive, bool writable);
  // A read-only view of bytes in a file mapped with PROT_READ and MAP_PRIVATE; `mapping`
  // keeps it alive. Only such bytes can be released with release_pages: anything else
  // (anonymous or caller memory) would lose its contents.
  static std::shared_ptr<Storage> file_mapping(const void* data, size_t bytes,
                                               std::shared_ptr<const void> mapping);
  // `count` default-constructed strings.
  static std::shared_ptr<Storage> strings(size_t count);

 private:
  Storage() = default;
  friend class detail::PoolCore;
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  Kind kind_ = Kind::Heap;
  bool writable_ = true;
  bool file_mapped_ = false;
  size_t string_count_ = 0;
  // View: what keeps the bytes alive. Pool: the pool itself when the storage was adopted
  // (a pool storage made by the pool is kept alive by its recycling allocator instead).
  std::shared_ptr<const void> keepalive_;
  detail::PoolCore* pool_ = nullptr;  // Pool: where the bytes go back
};

// A typed view of a Storage: byte offset, shape and strides (in elements). Copying a
// Tensor copies the handle, never the bytes.
class Tensor {
 public:
  Tensor() = default;
  // Contiguous row-major strides when `strides` is empty.
  Tensor(DataType dtype, Shape shape, std::shared_ptr<Storage> storage, size_t byte_offset = 0,
         Shape strides = {});

  // A new zero-filled contiguous tensor on the heap.
  static Tensor zeros(DataType dtype, Shape shape);
  // A tensor with room to grow along `axis` up to `capacity` without moving: the storage
  // holds shape[axis] = capacity and the returned view covers shape[axis] elements. Ops
  // such as Concat append into the spare room in place when they own the tensor.
  static Tensor with_capacity(DataType dtype, Shape shape, size_t axis, int64_t capacity);
  // A contiguous tensor holding a copy of `values`.
  template <typename T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values);
  template <typename T>
  static Tensor scalar(T value) {
    return from_vector<T>({}, std::vector<T>{value});
  }
  // A read-only view of memory the caller keeps alive for as long as the tensor is used.
  static Tensor borrow(DataType dtype, Shape shape, const void* data);

  bool defined() const { return storage_ != nullptr; }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  size_t rank() const { return shape_.size(); }
  int64_t dim(size_t i) const { return shape_[i]; }
  int64_t numel() const;
  // Bytes the elements occupy when contiguous.
  size_t nbytes() const { return storage_bytes(dtype_, numel()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  std::byte* raw_data() const { return storage_->data() + offset_; }
  template <typename T>
  T* data() const {
    check_type(data_type_of<std::remove_const_t<T>>());
    return reinterpret_cast<T*>(raw_data());
  }

  // The same bytes seen with another shape (the tensor must be contiguous).
  Tensor reshaped(Shape shape) const;
  // Same storage, explicit layout: the building block of view ops (Transpose, Slice...).
  Tensor view(Shape shape, Shape strides, size_t byte_offset) const;
  // A contiguous copy (or this tensor itself if already contiguous).
  Tensor contiguous() const;
  // A fresh, contiguous, writable deep copy.
  Tensor clone() const;
  // Copy the elements into a vector (any layout).
  template <typename T>
  std::vector<T> to_vector() const;

  // "float32[2,3]"
  std::string describe() const;

 private:
  void check_type(DataType requested) const;
  DataType dtype_ = DataType::Undefined;
  Shape shape_;
  Shape strides_;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
};

// Row-major strides, in elements, for `shape`.
Shape contiguous_strides(const Shape& shape);
// Product of the dimensions (1 for a scalar).
int64_t shape_numel(const Shape& shape);
// The same, for shapes about to be allocated: throws kiln::Error on a negative dimension or
// a count too large to be real (so byte sizes never overflow).
int64_t checked_numel(const Shape& shape);
// "[2,3]"
std::string shape_to_string(const Shape& shape);
// Copy `src` (any layout) into `dst` (same dtype and shape, any layout).
void copy_elements(const Tensor& src, const Tensor& dst);
[[noreturn]] void throw_element_count_mismatch(int64_t expected, size_t given);

template <typename T>
Tensor Tensor::from_vector(Shape shape, const std::vector<T>& values) {
  Tensor t = zeros(data_type_of<T>(), std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    throw_element_count_mismatch(t.numel(), values.size());
  }
  T* out = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = contiguous();
  const T* p = c.data<const T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace kiln
