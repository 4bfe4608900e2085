// A small streaming JSON writer for the tools' --json and --profile output.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kiln::tooling {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(const std::string& k) {
    comma();
    write_string(k);
    out_ << ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(const std::string& s) {
    comma();
    write_string(s);
    return *this;
  }
  JsonWriter& value(const char* s) { return value(std::string(s)); }
  JsonWriter& value(bool b) {
    comma();
    out_ << (b ? "true" : "false");
    return *this;
  }
  JsonWriter& value(double d) {
    comma();
    if (std::isfinite(d)) {
      out_ << d;
    } else {
      out_ << "null";
    }
    return *this;
  }
  JsonWriter& value(int64_t i) {
    comma();
    out_ << i;
    return *this;
  }
  JsonWriter& value(uint64_t i) {
    comma();
    out_ << i;
    return *this;
  }
  JsonWriter& value(int i) { return value(static_cast<int64_t>(i)); }
  JsonWriter& null() {
    comma();
    out_ << "null";
    return *this;
  }
  template <typename T>
  JsonWriter& field(const std::string& k, const T& v) {
    key(k);
    return value(v);
  }

 private:
  JsonWriter& open(char c) {
    comma();
    out_ << c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    out_ << c;
    first_.pop_back();
    return *this;
  }
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ << ',';
      first_.back() = false;
    }
  }
  void write_string(const std::string& s) {
    out_ << '"';
    for (char c : s) {
      switch (c) {
        case '"':
          out_ << "\\\"";
          break;
        case '\\':
          out_ << "\\\\";
          break;
        case '\n':
          out_ << "\\n";
          break;
        case '\r':
          out_ << "\\r";
          break;
        case '\t':
          out_ << "\\t";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            static const char* hex = "0123456789abcdef";
            out_ << "\\u00" << hex[(c >> 4) & 0xf] << hex[c & 0xf];
          } else {
            out_ << c;
          }
      }
    }
    out_ << '"';
  }
  std::ostream& out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace kiln::tooling
