#include "engine/generate/json.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace kiln::json {

namespace {
[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, "JSON: " + what);
}
}  // namespace

bool Value::as_bool() const {
  if (kind_ != Kind::Bool) bad("expected a boolean");
  return bool_;
}
double Value::as_number() const {
  if (kind_ != Kind::Number) bad("expected a number");
  return number_;
}
int64_t Value::as_int() const {
  const double n = as_number();
  if (n != std::floor(n) || std::abs(n) > 9.007199254740992e15) bad("expected an integer");
  return static_cast<int64_t>(n);
}
const std::string& Value::as_string() const {
  if (kind_ != Kind::String) bad("expected a string");
  return string_;
}
const std::vector<Value>& Value::as_array() const {
  if (kind_ != Kind::Array) bad("expected an array");
  return array_;
}
const std::map<std::string, Value>& Value::as_object() const {
  if (kind_ != Kind::Object) bad("expected an object");
  return object_;
}
const Value* Value::find(const std::string& key) const {
  if (kind_ != Kind::Object) return nullptr;
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &it->second;
}

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Value document() {
    Value v = value(0);
    skip();
    if (p_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    bad(what + " at offset " + std::to_string(p_));
  }
  void skip() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\r' || s_[p_] == '\t'))
      ++p_;
  }
  bool eat(char c) {
    skip();
    if (p_ < s_.size() && s_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(p_, w.size(), w) == 0) {
      p_ += w.size();
      return true;
    }
    return false;
  }
  Value value(int depth) {
    if (depth > 200) fail("nesting too deep");
    skip();
    if (p_ >= s_.size()) fail("unexpected end");
    Value v;
    const char c = s_[p_];
    if (c == '{') {
      ++p_;
      v.kind_ = Value::Kind::Object;
      if (eat('}')) return v;
      do {
        skip();
        std::string key = string();
        expect(':');
        v.object_[key] = value(depth + 1);
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++p_;
      v.kind_ = Value::Kind::Array;
      if (eat(']')) return v;
      do {
        v.array_.push_back(value(depth + 1));
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind_ = Value::Kind::String;
      v.string_ = string();
    } else if (literal("true")) {
      v.kind_ = Value::Kind::Bool;
      v.bool_ = true;
    } else if (literal("false")) {
      v.kind_ = Value::Kind::Bool;
    } else if (literal("null")) {
      v.kind_ = Value::Kind::Null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t start = p_;
      while (p_ < s_.size() && std::string("+-0123456789.eE").find(s_[p_]) != std::string::npos)
        ++p_;
      try {
        size_t used = 0;
        v.number_ = std::stod(s_.substr(start, p_ - start), &used);
        if (used != p_ - start) fail("bad number");
      } catch (const std::logic_error&) {
        fail("bad number");
      }
      v.kind_ = Value::Kind::Number;
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }
  std::string string() {
    if (p_ >= s_.size() || s_[p_] != '"') fail("expected a string");
    ++p_;
    std::string out;
    while (p_ < s_.size() && s_[p_] != '"') {
      char c = s_[p_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) fail("unterminated escape");
      c = s_[p_++];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (p_ + 4 > s_.size()) fail("bad \\u escape");
          unsigned code = 0;
          try {
            code = static_cast<unsigned>(std::stoul(s_.substr(p_, 4), nullptr, 16));
          } catch (const std::logic_error&) {
            fail("bad \\u escape");
          }
          p_ += 4;
          // UTF-8 encode (surrogate pairs are kept as two code units; config files do not
          // need them).
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xc0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (code & 0x3f));
          }
          break;
        }
        default:
          out += c;
      }
    }
    if (p_ >= s_.size()) fail("unterminated string");
    ++p_;
    return out;
  }
  const std::string& s_;
  size_t p_ = 0;
};

Value Value::parse(const std::string& text) {
  return Parser(text).document();
}

Value parse_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::Io, "cannot open").with_file(path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Value::parse(ss.str());
  } catch (Error& e) {
    e.with_file(path);
    throw;
  }
}

}  // namespace kiln::json
