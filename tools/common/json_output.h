// The tools' JSON output (--json, --profile): nlohmann::ordered_json keeps members in the
// order they are set, which scripts and the CLI tests rely on when they grep the output.
#pragma once

#include <nlohmann/json.hpp>

#include <ostream>

namespace kiln::tooling {

using Json = nlohmann::ordered_json;

// One line of compact JSON. Non-finite numbers print as null; bytes that are not UTF-8 (a
// node or file name) print as U+FFFD instead of failing the whole output.
inline void write_json(std::ostream& out, const Json& j) {
  out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}

}  // namespace kiln::tooling
