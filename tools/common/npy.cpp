#include "tools/common/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "kiln/error.h"

namespace kiln::tooling {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw Error(ErrorKind::InvalidArgument, "not a readable .npy file: " + why).with_file(path);
}

struct Descr {
  const char* code;
  DataType dtype;
};
constexpr Descr kDescrs[] = {
    {"<f4", DataType::Float},  {"<f8", DataType::Double}, {"<f2", DataType::Float16},
    {"|i1", DataType::Int8},   {"<i2", DataType::Int16},  {"<i4", DataType::Int32},
    {"<i8", DataType::Int64},  {"|u1", DataType::UInt8},  {"<u2", DataType::UInt16},
    {"<u4", DataType::UInt32}, {"<u8", DataType::UInt64}, {"|b1", DataType::Bool},
    {"<i1", DataType::Int8},   {"<u1", DataType::UInt8},
};

// The value of `key` in the header dict, as raw text up to the next top-level comma.
std::string dict_value(const std::string& header, const std::string& key) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t p = header.find(':', k);
  if (p == std::string::npos) return "";
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p < header.size() && header[p] == '(') {
    const size_t e = header.find(')', p);
    return e == std::string::npos ? "" : header.substr(p, e - p + 1);
  }
  size_t e = p;
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  return header.substr(p, e - p);
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorKind::Io, "not a regular file").with_file(path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Io, "cannot open").with_file(path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) bad(path, "no magic");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, pos = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    pos = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(path, "truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    pos = 12;
  } else {
    bad(path, "unknown format version " + std::to_string(major));
  }
  if (pos + header_len > bytes.size()) bad(path, "truncated header");
  const std::string header(bytes.data() + pos, header_len);
  pos += header_len;
  std::string descr = dict_value(header, "descr");
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"'))
    descr = descr.substr(1, descr.size() - 2);
  DataType dtype = DataType::Undefined;
  for (const auto& d : kDescrs) {
    if (descr == d.code) dtype = d.dtype;
  }
  if (dtype == DataType::Undefined) bad(path, "unsupported dtype '" + descr + "'");
  if (dict_value(header, "fortran_order").find("True") != std::string::npos) {
    bad(path, "Fortran-ordered arrays are not supported");
  }
  const std::string shape_text = dict_value(header, "shape");
  if (shape_text.empty() || shape_text.front() != '(') bad(path, "no shape");
  Shape shape;
  std::stringstream ss(shape_text.substr(1, shape_text.size() - 2));
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    try {
      const long long d = std::stoll(item.substr(b));
      if (d < 0) bad(path, "negative dimension");
      shape.push_back(d);
    } catch (const std::logic_error&) {
      bad(path, "bad shape " + shape_text);
    }
  }
  // The size the shape needs, checked against the file before anything is allocated.
  int64_t count = 0;
  size_t needed = 0;
  try {
    count = checked_numel(shape);
    needed = storage_bytes(dtype, count);
  } catch (const Error& e) {
    bad(path, "shape " + shape_to_string(shape) + ": " + e.message());
  }
  if (bytes.size() - pos != needed) {
    bad(path, "holds " + std::to_string(bytes.size() - pos) + " data bytes, shape " +
                  shape_to_string(shape) + " needs " + std::to_string(needed));
  }
  Tensor t = Tensor::zeros(dtype, shape);
  if (needed > 0) std::memcpy(t.raw_data(), bytes.data() + pos, needed);
  return t;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  const char* code = nullptr;
  for (const auto& d : kDescrs) {
    if (d.dtype == tensor.dtype()) {
      code = d.code;
      break;
    }
  }
  if (!code) {
    throw Error(ErrorKind::Unsupported, "cannot write " + tensor.describe() + " as .npy")
        .with_file(path);
  }
  std::string shape = "(";
  for (size_t i = 0; i < tensor.rank(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(tensor.dim(i));
  }
  shape += tensor.rank() == 1 ? ",)" : ")";
  std::string header =
      "{'descr': '" + std::string(code) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  // Made dense before the file is opened: a broadcast view may stand for more bytes than
  // exist, which must fail naming the file and leave none behind.
  Tensor c;
  try {
    c = tensor.contiguous();
  } catch (Error& e) {
    e.with_file(path);
    throw;
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(ErrorKind::Io, "cannot write").with_file(path);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out << header;
  out.write(reinterpret_cast<const char*>(c.raw_data()), static_cast<std::streamsize>(c.nbytes()));
  if (!out) throw Error(ErrorKind::Io, "write failed").with_file(path);
}

}  // namespace kiln::tooling
