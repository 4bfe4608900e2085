// JSON files of model folders (config.json, generation_config.json, expected_tokens.json),
// read with nlohmann-json. What goes wrong is a kiln::Error that names the file.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "kiln/error.h"

namespace kiln::json {

using Json = nlohmann::json;

// The parsed file. A file that cannot be read is ErrorKind::Io, malformed text
// ErrorKind::InvalidArgument with the library's line and column.
inline Json read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Io, "cannot open").with_file(path);
  try {
    return Json::parse(in);
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, ..." without the tag.
    std::string_view what = e.what();
    if (const size_t tag_end = what.find("] "); tag_end != std::string_view::npos)
      what.remove_prefix(tag_end + 2);
    throw Error(ErrorKind::InvalidArgument, "invalid JSON: " + std::string(what)).with_file(path);
  }
}

// `v` as an integer: an integer literal, or a number with an integral value that a double
// holds exactly (2.0). Anything else is ErrorKind::InvalidArgument naming `file` and `what`.
inline int64_t to_int(const Json& v, const std::string& file, const std::string& what) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw Error(ErrorKind::InvalidArgument, what + ": integer out of range").with_file(file);
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::abs(d) <= 9.007199254740992e15) return static_cast<int64_t>(d);
  }
  const std::string got =
      v.is_number() ? v.dump()
                    : (v.is_null() ? std::string("null") : std::string("a ") + v.type_name());
  throw Error(ErrorKind::InvalidArgument, what + ": expected an integer, got " + got)
      .with_file(file);
}

}  // namespace kiln::json
