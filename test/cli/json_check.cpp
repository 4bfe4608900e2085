// kiln-json-check FILE CHECK...: parses FILE as JSON and checks it, for the CLI tests (which
// must run without Python). A CHECK is a path of object keys and array indices separated by
// slashes ("steps/4/past_len"; keys may contain dots), alone (the member exists), as
// PATH=VALUE (a number, string or bool equal to VALUE), PATH=@OTHER (equal to the value at
// path OTHER), or PATH#=N (an array of N elements). Exit status: 0 when every check holds, 1
// otherwise (with one line per failed check), 2 when FILE is not JSON.
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/util/json_file.h"
#include "kiln/error.h"

namespace {

using Value = kiln::json::Json;

const Value* lookup(const Value& root, const std::string& path) {
  const Value* v = &root;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (v->is_array()) {
      size_t used = 0;
      size_t i = 0;
      try {
        i = std::stoul(part, &used);
      } catch (const std::exception&) {
        return nullptr;
      }
      if (used != part.size() || i >= v->size()) return nullptr;
      v = &(*v)[i];
    } else if (v->is_object()) {
      const auto it = v->find(part);
      if (it == v->end()) return nullptr;
      v = &*it;
    } else {
      return nullptr;
    }
  }
  return v;
}

std::string render(const Value& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::fabs(d) < 1e15) return std::to_string(static_cast<int64_t>(d));
    std::ostringstream os;
    os << d;
    return os.str();
  }
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) return "[array of " + std::to_string(v.size()) + "]";
  return "{object}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kiln-json-check FILE [PATH | PATH=VALUE | PATH=@PATH | PATH#=N]...\n";
    return 2;
  }
  Value root;
  try {
    root = kiln::json::read_file(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "kiln-json-check: " << e.what() << "\n";
    return 2;
  }
  int failed = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string check = argv[i];
    std::string path = check, want;
    bool length = false, compare = false;
    if (const size_t eq = check.find('='); eq != std::string::npos) {
      compare = true;
      want = check.substr(eq + 1);
      path = check.substr(0, eq);
      if (!path.empty() && path.back() == '#') {
        length = true;
        path.pop_back();
      }
    }
    if (!want.empty() && want[0] == '@') {
      const Value* other = lookup(root, want.substr(1));
      want = other ? render(*other) : "(missing " + want.substr(1) + ")";
    }
    const Value* v = lookup(root, path);
    std::string got;
    bool ok = v != nullptr;
    if (ok && compare) {
      if (length) {
        got = v->is_array() ? std::to_string(v->size()) : "(not an array)";
      } else {
        got = render(*v);
      }
      ok = got == want;
    }
    if (!ok) {
      std::cout << "check failed: " << check << (v ? " (got " + got + ")" : " (missing)") << "\n";
      ++failed;
    }
  }
  return failed ? 1 : 0;
}
