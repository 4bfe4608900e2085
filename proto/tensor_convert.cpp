// TensorProto -> Tensor (proto/tensor_convert.h): weights as views of the mapping where
// alignment allows, else counted copies; external data; the typed fields.
#include "proto/tensor_convert.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <string>

#include "kiln/error.h"
#include "kiln/memory.h"
#include "proto/mapped_file.h"
#include "proto/weights_cache.h"
#include "proto/wire.h"

namespace kiln::proto {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorKind::InvalidModel, message);
}

size_t element_alignment(DataType t) {
  const int bits = bits_per_element(t);
  if (bits <= 8) return 1;
  const size_t bytes = static_cast<size_t>(bits / 8);
  return bytes > 8 ? 8 : bytes;
}

// Visits the `n` bytes of a weight at `from` in chunks, `fn(offset, length)` returning
// false to stop. From a file mapping, the pages already visited are given back chunk by
// chunk: the caller copies them (the copy is the weight from now on) or compares them with
// an equal weight already loaded, so nothing reads those file bytes again and a large weight
// is never resident twice (the load peak stays near the weights' size).
template <typename Fn>
bool walk_weight_bytes(const std::byte* from, size_t n,
                       const std::shared_ptr<const void>& keepalive, Source& src, Fn&& fn) {
  constexpr size_t kChunk = size_t{1} << 20;
  const std::byte* released = from;  // file bytes before this are already given back
  for (size_t done = 0; done < n;) {
    const size_t len = std::min(kChunk, n - done);
    if (!fn(done, len)) return false;
    done += len;
    if (!keepalive) continue;
    const size_t span = static_cast<size_t>(from + done - released);
    const Tensor visited(DataType::UInt8, {static_cast<int64_t>(span)},
                         Storage::file_mapping(released, span, keepalive));
    const PageRelease r = release_pages(visited);
    if (r.status == PageRelease::Status::NoWholePage) continue;
    // The next range starts where this one's whole pages ended.
    const uintptr_t page = page_size();
    released =
        reinterpret_cast<const std::byte*>(reinterpret_cast<uintptr_t>(from + done) / page * page);
    if (src.stats && r.ok()) src.stats->weights_source_bytes_released += r.bytes;
  }
  return true;
}

// The weight as loaded: a view when aligned (zero copy), else one counted copy.
Tensor load_weight(DataType dtype, Shape shape, const std::byte* bytes, size_t n,
                   const std::shared_ptr<const void>& keepalive, Source& src) {
  const bool aligned = reinterpret_cast<uintptr_t>(bytes) % element_alignment(dtype) == 0;
  const bool native_order =
      std::endian::native == std::endian::little || bits_per_element(dtype) <= 8;
  if (aligned && native_order && n > 0) {
    if (src.stats) src.stats->weights_mapped_bytes += n;
    // A keepalive is always a MappedFile (PROT_READ, MAP_PRIVATE), whose pages may be released.
    return Tensor(dtype, std::move(shape),
                  keepalive ? Storage::file_mapping(bytes, n, keepalive)
                            : Storage::view(bytes, n, nullptr, false));
  }
  Tensor t = n > 0 ? Tensor(dtype, std::move(shape), Storage::heap_uninitialized(n))
                   : Tensor::zeros(dtype, std::move(shape));
  std::byte* to = t.raw_data();
  walk_weight_bytes(bytes, n, keepalive, src, [&](size_t off, size_t len) {
    std::memcpy(to + off, bytes + off, len);
    return true;
  });
  if constexpr (std::endian::native == std::endian::big) {
    // ONNX raw data is little-endian.
    const size_t w = static_cast<size_t>(bits_per_element(dtype) / 8);
    if (w > 1) {
      for (size_t i = 0; i + w <= n; i += w) std::reverse(t.raw_data() + i, t.raw_data() + i + w);
    }
  }
  t.storage()->set_read_only();
  if (src.stats && n > 0) {
    src.stats->weights_copied_bytes += n;
    ++src.stats->weights_copied_count;
  }
  return t;
}

// A read-only tensor over `bytes`. With a weights cache, an equal weight already loaded (by
// another session of the environment, or earlier in this model) is shared instead, and the
// pages of this copy are given back once compared.
Tensor tensor_over(DataType dtype, Shape shape, const std::byte* bytes, size_t n,
                   const std::shared_ptr<const void>& keepalive, Source& src) {
  if (src.stats) src.stats->weights_bytes += n;
  const bool big_endian_copy =
      std::endian::native == std::endian::big && bits_per_element(dtype) > 8;
  if (!src.cache || n == 0 || big_endian_copy) {
    return load_weight(dtype, std::move(shape), bytes, n, keepalive, src);
  }
  const uint64_t fingerprint = detail::weight_fingerprint(dtype, shape, bytes, n);
  auto equal = [&](const std::byte* cached) {
    return walk_weight_bytes(bytes, n, keepalive, src, [&](size_t off, size_t len) {
      return std::memcmp(cached + off, bytes + off, len) == 0;
    });
  };
  if (auto lease = src.cache->find_loaded(fingerprint, dtype, shape, n, equal)) {
    if (src.stats) {
      src.stats->weights_shared_bytes += n;
      ++src.stats->weights_shared_count;
    }
    src.leases->push_back(lease);
    return lease->tensor;
  }
  Tensor t = load_weight(dtype, std::move(shape), bytes, n, keepalive, src);
  // Views of a caller's buffer are not shared: other sessions would outlive the buffer.
  if (!keepalive && t.storage()->kind() == Storage::Kind::View) return t;
  if (t.storage()->file_mapped()) {
    // Reading the fingerprint's blocks mapped them, and the kernel maps more around a fault
    // (fault-around, large folios): give the weight's pages back, so a weight used in place
    // stays out of resident memory until a run reads it.
    release_pages(t);
  }
  auto lease = src.cache->add_loaded(fingerprint, t);
  src.leases->push_back(lease);
  return lease->tensor;
}

bool raw_ref(const onnx::TensorProto& tp, uint64_t& index) {
  const auto& uf = tp.GetReflection()->GetUnknownFields(tp);
  for (int i = 0; i < uf.field_count(); ++i) {
    const auto& f = uf.field(i);
    if (f.number() == static_cast<int>(kRawDataRefField) &&
        f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      index = f.varint();
      return true;
    }
  }
  return false;
}

// External data location: relative, inside the model's folder, no "..", no symlink escape.
// Null when the file is missing (or cannot be located) and `defer` allows a hollow tensor.
std::shared_ptr<MappedFile> external_file(Source& src, const std::string& location,
                                          const std::string& tensor, bool defer) {
  auto it = src.external_files.find(location);
  if (it != src.external_files.end()) return it->second;
  const std::string where = "tensor '" + tensor + "': external data location '" + location + "'";
  if (location.empty() || location.find('\0') != std::string::npos) invalid(where + " is empty");
  if (src.base_dir.empty()) {
    if (defer) return nullptr;
    invalid(where + " cannot be resolved for a model loaded from memory");
  }
  const fs::path loc(location);
  if (loc.is_absolute() || loc.has_root_name() || loc.has_root_directory()) {
    invalid(where + " is absolute; it must be relative to the model's folder");
  }
  for (const auto& part : loc) {
    if (part == "..") invalid(where + " escapes the model's folder");
  }
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::path(src.base_dir), ec);
  const fs::path full = fs::weakly_canonical(fs::path(src.base_dir) / loc, ec);
  if (ec) invalid(where + " cannot be resolved");
  auto b = base.begin();
  auto f = full.begin();
  for (; b != base.end(); ++b, ++f) {
    if (f == full.end() || *b != *f) invalid(where + " escapes the model's folder");
  }
  if (defer && !fs::exists(full, ec) && !ec) return nullptr;
  std::shared_ptr<MappedFile> file;
  try {
    file = MappedFile::open(full.string());
  } catch (const Error& e) {
    throw Error(e.kind(), where + ": " + e.message());
  }
  return src.external_files.emplace(location, std::move(file)).first->second;
}

template <typename Field, typename Fn>
void fill_typed(Tensor& t, const Field& field, int64_t per_element, const char* field_name,
                const std::string& name, Fn convert) {
  const int64_t n = t.numel();
  if (static_cast<int64_t>(field.size()) != n * per_element) {
    invalid("tensor '" + name + "': " + field_name + " holds " + std::to_string(field.size()) +
            " values for shape " + shape_to_string(t.shape()));
  }
  for (int64_t i = 0; i < n * per_element; ++i) convert(i, field.Get(static_cast<int>(i)));
}

// The typed field that holds a tensor's values, and how many entries it has.
struct TypedField {
  const char* name;
  int64_t count;
  int64_t per_element = 1;  // 2 for complex values
  bool packed = false;      // sub-byte types: one packed byte per entry
};

TypedField typed_field(const onnx::TensorProto& tp, DataType dtype) {
  switch (dtype) {
    case DataType::Float:
      return {"float_data", tp.float_data_size()};
    case DataType::Complex64:
      return {"float_data", tp.float_data_size(), 2};
    case DataType::Double:
      return {"double_data", tp.double_data_size()};
    case DataType::Complex128:
      return {"double_data", tp.double_data_size(), 2};
    case DataType::Int64:
      return {"int64_data", tp.int64_data_size()};
    case DataType::UInt32:
    case DataType::UInt64:
      return {"uint64_data", tp.uint64_data_size()};
    case DataType::String:
      return {"string_data", tp.string_data_size()};
    case DataType::Int4:
    case DataType::UInt4:
    case DataType::Float4E2M1:
    case DataType::Int2:
    case DataType::UInt2:
      return {"int32_data", tp.int32_data_size(), 1, true};
    default:
      return {"int32_data", tp.int32_data_size()};
  }
}

}  // namespace

Tensor convert_tensor(const onnx::TensorProto& tp, Source& src) {
  const std::string& name = tp.name();
  if (!is_known_data_type(tp.data_type())) {
    invalid("tensor '" + name + "' has unknown element type " + std::to_string(tp.data_type()));
  }
  const auto dtype = static_cast<DataType>(tp.data_type());
  Shape shape;
  int64_t numel = 1;
  for (int64_t d : tp.dims()) {
    if (d < 0) invalid("tensor '" + name + "' has a negative dimension");
    if (d > 0 && numel > (int64_t{1} << 50) / d) invalid("tensor '" + name + "' is too large");
    numel *= d;
    shape.push_back(d);
  }
  if (tp.has_segment()) {
    throw Error(ErrorKind::Unsupported, "tensor '" + name + "' is segmented");
  }
  const size_t expected = storage_bytes(dtype, numel);
  auto check_size = [&](uint64_t got, const char* where) {
    if (got != expected) {
      invalid("tensor '" + name + "' of type " + std::string(data_type_name(dtype)) +
              " and shape " + shape_to_string(shape) + " needs " + std::to_string(expected) +
              " bytes but its " + where + " has " + std::to_string(got));
    }
  };

  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    uint64_t offset = 0, length = 0;
    bool has_length = false;
    for (const auto& kv : tp.external_data()) {
      try {
        if (kv.key() == "location") location = kv.value();
        if (kv.key() == "offset") offset = std::stoull(kv.value());
        if (kv.key() == "length") length = std::stoull(kv.value()), has_length = true;
      } catch (const std::exception&) {
        invalid("tensor '" + name + "': bad external data " + kv.key() + " '" + kv.value() + "'");
      }
    }
    if (dtype == DataType::String) invalid("tensor '" + name + "': strings cannot be external");
    if (!has_length) length = expected;
    check_size(length, "external data length");
    const bool defer = src.defer_missing_external && src.hollow_allowed;
    const std::shared_ptr<MappedFile> file = external_file(src, location, name, defer);
    if (!file) {
      // A hollow constant: its type and shape now, its bytes from Session::set_constant.
      if (src.stats) {
        ++src.stats->weights_deferred_count;
        src.stats->weights_deferred_bytes += expected;
      }
      return Tensor(dtype, std::move(shape), nullptr);
    }
    if (offset > file->size() || length > file->size() - offset) {
      invalid("tensor '" + name + "': external data (offset " + std::to_string(offset) +
              ", length " + std::to_string(length) + ") runs past the end of '" + location + "' (" +
              std::to_string(file->size()) + " bytes)");
    }
    return tensor_over(dtype, std::move(shape), file->data() + offset, length, file, src);
  }

  uint64_t ref = 0;
  if (raw_ref(tp, ref)) {
    if (ref >= src.raw.size()) invalid("tensor '" + name + "': bad raw data reference");
    if (dtype == DataType::String) invalid("tensor '" + name + "': strings cannot be raw data");
    const ByteRange r = src.raw[ref];
    check_size(r.size, "raw_data");
    return tensor_over(dtype, std::move(shape), src.base + r.offset, r.size, src.keepalive, src);
  }
  if (tp.has_raw_data()) {
    if (dtype == DataType::String) invalid("tensor '" + name + "': strings cannot be raw data");
    check_size(tp.raw_data().size(), "raw_data");
    Tensor t = Tensor::zeros(dtype, std::move(shape));
    std::memcpy(t.raw_data(), tp.raw_data().data(), expected);
    if (src.stats) {
      src.stats->weights_bytes += expected;
      src.stats->weights_copied_bytes += expected;
      ++src.stats->weights_copied_count;
    }
    t.storage()->set_read_only();
    return t;
  }

  // Typed fields: always one copy into the tensor, allocated once the field is known to hold
  // exactly the shape's values (a short field never costs the shape's memory).
  const TypedField field = typed_field(tp, dtype);
  const int64_t wanted = field.packed ? static_cast<int64_t>(expected) : numel * field.per_element;
  if (field.count != wanted) {
    invalid("tensor '" + name + "': " + field.name + " holds " + std::to_string(field.count) +
            (field.packed ? " packed bytes" : " values") + " for shape " + shape_to_string(shape) +
            " (needs " + std::to_string(wanted) + ")");
  }
  Tensor t = Tensor::zeros(dtype, shape);
  std::byte* out = t.raw_data();
  switch (dtype) {
    case DataType::Float:
    case DataType::Complex64:
      fill_typed(t, tp.float_data(), dtype == DataType::Complex64 ? 2 : 1, "float_data", name,
                 [&](int64_t i, float v) { reinterpret_cast<float*>(out)[i] = v; });
      break;
    case DataType::Double:
    case DataType::Complex128:
      fill_typed(t, tp.double_data(), dtype == DataType::Complex128 ? 2 : 1, "double_data", name,
                 [&](int64_t i, double v) { reinterpret_cast<double*>(out)[i] = v; });
      break;
    case DataType::Int64:
      fill_typed(t, tp.int64_data(), 1, "int64_data", name,
                 [&](int64_t i, int64_t v) { reinterpret_cast<int64_t*>(out)[i] = v; });
      break;
    case DataType::UInt32:
      fill_typed(t, tp.uint64_data(), 1, "uint64_data", name, [&](int64_t i, uint64_t v) {
        reinterpret_cast<uint32_t*>(out)[i] = static_cast<uint32_t>(v);
      });
      break;
    case DataType::UInt64:
      fill_typed(t, tp.uint64_data(), 1, "uint64_data", name,
                 [&](int64_t i, uint64_t v) { reinterpret_cast<uint64_t*>(out)[i] = v; });
      break;
    case DataType::String: {
      fill_typed(t, tp.string_data(), 1, "string_data", name,
                 [&](int64_t i, const std::string& v) { t.data<std::string>()[i] = v; });
      break;
    }
    case DataType::Int4:
    case DataType::UInt4:
    case DataType::Float4E2M1:
    case DataType::Int2:
    case DataType::UInt2: {
      // Packed: each int32_data entry holds one byte of packed elements.
      const int64_t bytes = static_cast<int64_t>(expected);
      if (tp.int32_data_size() != bytes) {
        invalid("tensor '" + name + "': int32_data holds " + std::to_string(tp.int32_data_size()) +
                " packed bytes, expected " + std::to_string(bytes));
      }
      for (int64_t i = 0; i < bytes; ++i) {
        out[i] = static_cast<std::byte>(tp.int32_data(static_cast<int>(i)) & 0xff);
      }
      break;
    }
    default: {
      // int32_data carries int32, and the narrower types one value per entry.
      const int bits = bits_per_element(dtype);
      fill_typed(t, tp.int32_data(), 1, "int32_data", name, [&](int64_t i, int32_t v) {
        if (bits == 32) {
          reinterpret_cast<int32_t*>(out)[i] = v;
        } else if (bits == 16) {
          reinterpret_cast<uint16_t*>(out)[i] = static_cast<uint16_t>(v);
        } else {
          reinterpret_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(v);
        }
      });
      break;
    }
  }
  if (src.stats) {
    const uint64_t n = dtype == DataType::String ? 0 : expected;
    src.stats->weights_bytes += n;
    src.stats->weights_copied_bytes += n;
    ++src.stats->weights_copied_count;
  }
  t.storage()->set_read_only();
  return t;
}

}  // namespace kiln::proto
