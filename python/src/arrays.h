// numpy arrays <-> kiln values, without copying where the layouts allow.
//
// Inputs: a C-contiguous, aligned array of a type kiln stores the same way is borrowed (a kiln
// Storage viewing its memory, holding a reference to the array); an array that views kiln's
// own memory (an earlier output) is fed as a view of that storage; anything else is copied
// once. Outputs: a numpy array viewing the kiln tensor's bytes, whose base is a StorageRef
// holding the storage. Strings and the sub-byte types (int4, uint4, int2, uint2, float4)
// are converted, which copies.
//
// Donation: a donated input is given to the run as a storage of its own (a view of the same
// bytes, so the run is its only user), which is what lets kiln overwrite it or append into
// its spare capacity (a KV cache's Concat); the outputs that come back in that storage are
// rebased onto the original one, so passing them again next step never copies.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::python {

namespace py = pybind11;

// The base object of every numpy array viewing kiln's memory: it keeps the storage alive.
// `owner` is another object that memory depends on (the bytes a session was loaded from,
// when an output views one of its weights).
class StorageRef {
 public:
  StorageRef(std::shared_ptr<Storage> storage, py::object owner)
      : storage_(std::move(storage)), owner_(std::move(owner)) {}
  const std::shared_ptr<Storage>& storage() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  py::object owner_;
};

// The numpy dtype for a kiln element type (ml_dtypes' for bfloat16, float8, int4, ...).
py::dtype numpy_dtype(DataType t);
// The kiln element type of a numpy dtype; Undefined when kiln has no such type.
DataType kiln_type(const py::dtype& dtype);

// Converts the values fed to one run and remembers the donated storages it made, so the
// outputs can be rebased onto the memory the caller holds.
class Feed {
 public:
  // `declared` is the graph input's description, used to read a list as a sequence and None
  // as an empty optional; null for a name the model does not have (the run reports it).
  Value convert(py::handle value, const IoInfo* declared, bool donate);
  // Bytes copied converting inputs (layouts kiln cannot view, byte order, sub-byte packing).
  uint64_t bytes_copied() const { return bytes_copied_; }
  // The storage an output in `storage` should be handed out from: the caller's original
  // storage when `storage` is a donated view this feed made, else `storage` itself.
  std::shared_ptr<Storage> rebase(const std::shared_ptr<Storage>& storage) const;

 private:
  Tensor tensor(py::handle value, bool donate);
  Tensor copy_of(const py::array& array, DataType dtype);
  uint64_t bytes_copied_ = 0;
  // Donated views (weak: the run owns them) and the storage each one views.
  std::vector<std::pair<std::weak_ptr<Storage>, std::shared_ptr<Storage>>> donated_;
};

// A run's output as Python: a numpy array (viewing the tensor when possible), a list for a
// sequence, None or the element for an optional. `owner` is kept alive by arrays viewing it.
py::object to_python(const Value& value, const Feed& feed, const py::object& owner,
                     const void* owner_begin, size_t owner_size);

// A zero-filled array of `shape` whose storage has room for `capacity` along `axis`
// (Tensor::with_capacity): donated to a run, a Concat along that axis appends in place.
py::array with_capacity(const std::vector<int64_t>& shape, const py::dtype& dtype, int64_t axis,
                        int64_t capacity);

// Python references held by kiln storages (borrowed arrays) are released on whatever thread
// frees the storage; without the GIL they wait here until release_pending_references().
std::shared_ptr<const void> hold_reference(py::handle object);
void release_pending_references();

}  // namespace kiln::python
