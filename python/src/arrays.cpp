#include "arrays.h"

#include <cstring>
#include <mutex>
#include <string_view>

namespace kiln::python {

namespace {

// numpy's name for each kiln element type; the ml_dtypes package provides the ones numpy
// lacks (ONNX's bfloat16, float8, float4 and packed integer types).
struct TypeName {
  DataType type;
  const char* name;
  bool ml_dtypes;
};

constexpr TypeName kTypeNames[] = {
    {DataType::Float, "float32", false},
    {DataType::Double, "float64", false},
    {DataType::Float16, "float16", false},
    {DataType::Int8, "int8", false},
    {DataType::Int16, "int16", false},
    {DataType::Int32, "int32", false},
    {DataType::Int64, "int64", false},
    {DataType::UInt8, "uint8", false},
    {DataType::UInt16, "uint16", false},
    {DataType::UInt32, "uint32", false},
    {DataType::UInt64, "uint64", false},
    {DataType::Bool, "bool", false},
    {DataType::Complex64, "complex64", false},
    {DataType::Complex128, "complex128", false},
    {DataType::BFloat16, "bfloat16", true},
    {DataType::Float8E4M3FN, "float8_e4m3fn", true},
    {DataType::Float8E4M3FNUZ, "float8_e4m3fnuz", true},
    {DataType::Float8E5M2, "float8_e5m2", true},
    {DataType::Float8E5M2FNUZ, "float8_e5m2fnuz", true},
    {DataType::Float8E8M0, "float8_e8m0fnu", true},
    {DataType::Int4, "int4", true},
    {DataType::UInt4, "uint4", true},
    {DataType::Float4E2M1, "float4_e2m1fn", true},
    {DataType::Int2, "int2", true},
    {DataType::UInt2, "uint2", true},
};

[[noreturn]] void invalid_argument(const std::string& message) {
  throw Error(ErrorKind::InvalidArgument, message);
}

py::module_ numpy() {
  return py::module_::import("numpy");
}

bool is_string_kind(const py::dtype& dtype) {
  const char kind = dtype.kind();
  return kind == 'U' || kind == 'S' || kind == 'O';
}

Shape shape_of(const py::array& array) {
  Shape shape(static_cast<size_t>(array.ndim()));
  for (size_t i = 0; i < shape.size(); ++i) shape[i] = array.shape(static_cast<py::ssize_t>(i));
  return shape;
}

std::vector<py::ssize_t> numpy_shape(const Tensor& t) {
  return std::vector<py::ssize_t>(t.shape().begin(), t.shape().end());
}

// The kiln storage at the bottom of an array's chain of bases, if the array views kiln memory.
std::shared_ptr<Storage> kiln_storage_under(const py::array& array) {
  py::object base = array.base();
  while (base && !base.is_none()) {
    if (py::isinstance<StorageRef>(base)) return base.cast<const StorageRef&>().storage();
    if (!py::isinstance<py::array>(base)) return nullptr;
    base = py::reinterpret_borrow<py::array>(base).base();
  }
  return nullptr;
}

// Strides in elements when the array is a valid kiln view of `storage` starting at byte
// `offset`: non-negative whole-element strides, every element inside the storage.
bool view_layout(const py::array& array, const Storage& storage, size_t* offset, Shape* strides) {
  const auto* data = static_cast<const std::byte*>(array.data());
  if (data < storage.data() || data > storage.data() + storage.capacity()) return false;
  *offset = static_cast<size_t>(data - storage.data());
  const auto itemsize = static_cast<int64_t>(array.itemsize());
  int64_t last = 0;
  bool empty = false;
  strides->clear();
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    const int64_t stride = array.strides(i);
    if (stride < 0 || stride % itemsize != 0) return false;
    strides->push_back(stride / itemsize);
    if (array.shape(i) == 0) empty = true;
    last += (array.shape(i) - 1) * stride;
  }
  return empty || *offset + static_cast<size_t>(last + itemsize) <= storage.capacity();
}

bool borrowable(const py::array& array) {
  const int flags = array.flags();
  return (flags & py::array::c_style) && (flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_) &&
         array.dtype().attr("isnative").cast<bool>();
}

std::string describe_dtype(const py::dtype& dtype) {
  return py::str(dtype).cast<std::string>();
}

Tensor strings_tensor(const py::array& array) {
  const Shape shape = shape_of(array);
  const int64_t n = checked_numel(shape);
  Tensor t(DataType::String, shape, Storage::strings(static_cast<size_t>(n)));
  auto* out = t.data<std::string>();
  int64_t i = 0;
  for (py::handle item : array.attr("ravel")().attr("tolist")()) {
    if (py::isinstance<py::bytes>(item)) {
      out[i++] = item.cast<std::string>();
    } else if (py::isinstance<py::str>(item)) {
      py::ssize_t size = 0;
      const char* utf8 = PyUnicode_AsUTF8AndSize(item.ptr(), &size);
      if (!utf8) {  // lone surrogates: no UTF-8 for them
        PyErr_Clear();
        invalid_argument("a string tensor holds " + py::repr(item).cast<std::string>() +
                         ", which has no UTF-8 form");
      }
      out[i++] = std::string(utf8, static_cast<size_t>(size));
    } else {
      invalid_argument("a string tensor holds " + py::repr(item).cast<std::string>() +
                       ", which is neither str nor bytes");
    }
  }
  return t;
}

py::object strings_array(const Tensor& tensor) {
  const Tensor t = tensor.contiguous();
  const auto* items = t.data<const std::string>();
  py::list list;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const std::string& s = items[i];
    PyObject* text = PyUnicode_DecodeUTF8(s.data(), static_cast<py::ssize_t>(s.size()), nullptr);
    if (text) {
      list.append(py::reinterpret_steal<py::object>(text));
    } else {
      PyErr_Clear();  // not UTF-8: handed over as the bytes they are
      list.append(py::bytes(s));
    }
  }
  py::array out = numpy().attr("array")(list, py::dtype("O"));
  return out.attr("reshape")(numpy_shape(t));
}

// Sub-byte types: ml_dtypes keeps one element per byte (the code in the low bits), kiln packs
// them (element i in bits (i % per_byte) * bits of byte i / per_byte, as ONNX does).
Tensor packed_tensor(const py::array& array, DataType type, uint64_t* copied) {
  const int bits = bits_per_element(type);
  const py::array codes =
      numpy().attr("ascontiguousarray")(array).attr("view")(py::dtype("uint8")).cast<py::array>();
  Tensor t = Tensor::zeros(type, shape_of(array));
  const auto* in = static_cast<const uint8_t*>(codes.data());
  auto* out = reinterpret_cast<uint8_t*>(t.raw_data());
  const int per_byte = 8 / bits;
  const auto mask = static_cast<uint8_t>((1u << bits) - 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[i / per_byte] |= static_cast<uint8_t>((in[i] & mask) << ((i % per_byte) * bits));
  }
  *copied += t.nbytes();
  return t;
}

py::object packed_array(const Tensor& tensor) {
  const Tensor t = tensor.contiguous();
  const int bits = bits_per_element(t.dtype());
  const int per_byte = 8 / bits;
  const auto mask = static_cast<uint8_t>((1u << bits) - 1);
  py::array_t<uint8_t> codes(numpy_shape(t));
  auto* out = codes.mutable_data();
  const auto* in = reinterpret_cast<const uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[i] = static_cast<uint8_t>((in[i / per_byte] >> ((i % per_byte) * bits)) & mask);
  }
  return codes.attr("view")(numpy_dtype(t.dtype()));
}

std::mutex& pending_mutex() {
  static std::mutex m;
  return m;
}
std::vector<PyObject*>& pending_references() {
  static std::vector<PyObject*> objects;
  return objects;
}

}  // namespace

py::dtype numpy_dtype(DataType t) {
  if (t == DataType::String) return py::dtype("O");
  for (const TypeName& n : kTypeNames) {
    if (n.type != t) continue;
    if (!n.ml_dtypes) return py::dtype(n.name);
    try {
      return py::dtype::from_args(py::module_::import("ml_dtypes").attr(n.name));
    } catch (py::error_already_set&) {
      throw Error(ErrorKind::Unsupported, std::string("numpy has no ") +
                                              std::string(data_type_name(t)) +
                                              " type: install the ml_dtypes package");
    }
  }
  throw Error(ErrorKind::Unsupported,
              "no numpy type for element type " + std::string(data_type_name(t)));
}

DataType kiln_type(const py::dtype& dtype) {
  if (is_string_kind(dtype)) return DataType::String;
  const std::string name = dtype.attr("name").cast<std::string>();
  for (const TypeName& n : kTypeNames) {
    if (name == n.name) return n.type;
  }
  return DataType::Undefined;
}

Value Feed::convert(py::handle value, const IoInfo* declared, bool donate) {
  const auto sequence = [&](py::handle list) {
    std::vector<Tensor> items;
    for (py::handle item : list) items.push_back(tensor(item, false));
    DataType elem = declared->dtype;
    if (elem == DataType::Undefined && !items.empty()) elem = items.front().dtype();
    return Value::sequence(elem, std::move(items));
  };
  const bool is_list = py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value);
  if (declared && declared->kind == Value::Kind::Sequence) {
    if (!is_list) invalid_argument("a sequence input: give a list");
    return sequence(value);
  }
  if (declared && declared->kind == Value::Kind::Optional) {
    if (value.is_none()) {
      const Value::Kind inner = declared->optional_kind == Value::Kind::Sequence
                                    ? Value::Kind::Sequence
                                    : Value::Kind::Tensor;
      return Value::empty_optional(inner, declared->dtype);
    }
    if (is_list) return Value::optional(sequence(value));
    return Value::optional(Value(tensor(value, false)));
  }
  return Value(tensor(value, donate));
}

Tensor Feed::tensor(py::handle value, bool donate) {
  const py::array array = py::isinstance<py::array>(value)
                              ? py::reinterpret_borrow<py::array>(value)
                              : numpy().attr("asarray")(value).cast<py::array>();
  const py::dtype dtype = array.dtype();
  const DataType type = kiln_type(dtype);
  if (type == DataType::Undefined) {
    invalid_argument("numpy type " + describe_dtype(dtype) + " has no ONNX element type");
  }
  if (type == DataType::String) {
    bytes_copied_ += static_cast<uint64_t>(array.size()) * sizeof(std::string);
    return strings_tensor(array);
  }
  if (bits_per_element(type) < 8) return packed_tensor(array, type, &bytes_copied_);
  const Shape shape = shape_of(array);

  // Kiln's own memory (an earlier output, with_capacity): fed as that storage. Donated, it
  // becomes a view of the same bytes that only the run holds, so the run may write into it.
  if (std::shared_ptr<Storage> root = kiln_storage_under(array)) {
    size_t offset = 0;
    Shape strides;
    if (dtype.attr("isnative").cast<bool>() && view_layout(array, *root, &offset, &strides)) {
      if (!donate) return Tensor(type, shape, std::move(root), offset, std::move(strides));
      const bool writable = root->writable() && array.writeable();
      std::shared_ptr<Storage> view = Storage::view(root->data(), root->capacity(), root, writable);
      donated_.emplace_back(view, root);
      return Tensor(type, shape, std::move(view), offset, std::move(strides));
    }
  }
  if (borrowable(array)) {
    const size_t bytes = static_cast<size_t>(array.nbytes());
    return Tensor(
        type, shape,
        Storage::view(array.data(), bytes, hold_reference(array), donate && array.writeable()));
  }
  return copy_of(array, type);
}

// One copy into a contiguous buffer of kiln's, in native byte order (numpy does the copy).
Tensor Feed::copy_of(const py::array& array, DataType type) {
  Tensor t(type, shape_of(array), Storage::heap_uninitialized(static_cast<size_t>(array.nbytes())));
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(s * static_cast<py::ssize_t>(array.itemsize()));
  const py::object keep = py::cast(StorageRef(t.storage(), py::none()));
  const py::array destination(numpy_dtype(type), numpy_shape(t), strides, t.raw_data(), keep);
  numpy().attr("copyto")(destination, array);
  bytes_copied_ += t.nbytes();
  return t;
}

std::shared_ptr<Storage> Feed::rebase(const std::shared_ptr<Storage>& storage) const {
  for (const auto& [view, root] : donated_) {
    const bool same = !view.owner_before(storage) && !storage.owner_before(view);
    if (same) return root;
  }
  return storage;
}

namespace {

py::object tensor_to_python(const Tensor& t, const Feed& feed, const py::object& owner,
                            const void* owner_begin, size_t owner_size) {
  if (!t.defined()) return py::none();
  if (t.dtype() == DataType::String) return strings_array(t);
  if (bits_per_element(t.dtype()) < 8) return packed_array(t);
  const std::shared_ptr<Storage> storage = feed.rebase(t.storage());
  // An output that is one of the weights of a session loaded from bytes views those bytes.
  const auto* begin = static_cast<const std::byte*>(owner_begin);
  const bool in_owner = owner_begin && t.raw_data() >= begin && t.raw_data() < begin + owner_size;
  const py::object base = py::cast(StorageRef(storage, in_owner ? owner : py::none()));
  const auto itemsize = static_cast<py::ssize_t>(bits_per_element(t.dtype()) / 8);
  std::vector<py::ssize_t> strides;
  bool overlapping = false;
  for (size_t i = 0; i < t.rank(); ++i) {
    strides.push_back(t.strides()[i] * itemsize);
    overlapping = overlapping || (t.strides()[i] == 0 && t.dim(i) > 1);
  }
  // The storage is rebased only for donated views, which cover the original from its start,
  // so the tensor's byte offset holds for it too.
  const py::array array(numpy_dtype(t.dtype()), numpy_shape(t), strides,
                        storage->data() + t.byte_offset(), base);
  // Read-only memory (weights, inputs borrowed read-only) and broadcast views, where one
  // element stands for several, are handed out read-only.
  if (!storage->writable() || overlapping) array.attr("flags").attr("writeable") = false;
  return array;
}

}  // namespace

py::object to_python(const Value& value, const Feed& feed, const py::object& owner,
                     const void* owner_begin, size_t owner_size) {
  switch (value.kind()) {
    case Value::Kind::None:
      return py::none();
    case Value::Kind::Tensor:
      return tensor_to_python(value.tensor(), feed, owner, owner_begin, owner_size);
    case Value::Kind::Sequence: {
      py::list items;
      for (const Tensor& t : value.items()) {
        items.append(tensor_to_python(t, feed, owner, owner_begin, owner_size));
      }
      return items;
    }
    case Value::Kind::Optional:
      if (!value.has_element()) return py::none();
      return to_python(value.element(), feed, owner, owner_begin, owner_size);
  }
  return py::none();
}

py::array with_capacity(const std::vector<int64_t>& shape, const py::dtype& dtype, int64_t axis,
                        int64_t capacity) {
  const DataType type = kiln_type(dtype);
  if (type == DataType::Undefined || type == DataType::String || bits_per_element(type) < 8) {
    invalid_argument("with_capacity: numpy type " + describe_dtype(dtype) +
                     " is not a fixed-size ONNX element type of whole bytes");
  }
  // Checked here: the engine checks the shape with `capacity` along `axis`, so a negative
  // dimension there would only fail in numpy.
  for (int64_t d : shape) {
    if (d < 0) {
      invalid_argument("with_capacity: negative dimension in shape " + shape_to_string(shape));
    }
  }
  if (axis < 0) axis += static_cast<int64_t>(shape.size());
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size())) {
    invalid_argument("with_capacity: axis " + std::to_string(axis) +
                     " is outside a shape of rank " + std::to_string(shape.size()));
  }
  if (capacity < shape[static_cast<size_t>(axis)]) {
    invalid_argument("with_capacity: capacity " + std::to_string(capacity) +
                     " is less than the dimension " +
                     std::to_string(shape[static_cast<size_t>(axis)]));
  }
  const Tensor t = Tensor::with_capacity(type, shape, static_cast<size_t>(axis), capacity);
  return to_python(Value(t), Feed(), py::none(), nullptr, 0).cast<py::array>();
}

std::shared_ptr<const void> hold_reference(py::handle object) {
  PyObject* held = object.ptr();
  Py_INCREF(held);
  return std::shared_ptr<const void>(held, [](PyObject* o) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing to release into
    if (PyGILState_Check()) {
      Py_DECREF(o);
      return;
    }
    // A kiln thread (or a run with the GIL released): taking the GIL here could deadlock
    // with a thread that holds it while waiting for kiln's thread pool.
    std::lock_guard<std::mutex> lock(pending_mutex());
    pending_references().push_back(o);
  });
}

void release_pending_references() {
  std::vector<PyObject*> objects;
  {
    std::lock_guard<std::mutex> lock(pending_mutex());
    objects.swap(pending_references());
  }
  for (PyObject* o : objects) Py_DECREF(o);
}

}  // namespace kiln::python
