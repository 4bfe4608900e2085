// A small JSON reader for model folders (config.json, generation_config.json, ...).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::json {

class Value {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Typed access; throw kiln::Error (InvalidArgument) on a kind mismatch.
  bool as_bool() const;
  double as_number() const;
  int64_t as_int() const;  // the number must be integral
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  const std::map<std::string, Value>& as_object() const;

  // Object member, or null if absent (or this is not an object).
  const Value* find(const std::string& key) const;

  static Value parse(const std::string& text);  // throws kiln::Error on malformed text

 private:
  friend class Parser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Value> array_;
  std::map<std::string, Value> object_;
};

// Reads and parses a file; errors name the file.
Value parse_file(const std::string& path);

}  // namespace kiln::json
