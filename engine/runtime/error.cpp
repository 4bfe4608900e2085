#include "kiln/error.h"

#include <cstdio>

namespace kiln {

std::string byte_size_text(unsigned long long bytes) {
  if (bytes < 1000) return std::to_string(bytes) + " B";
  static const char* const units[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1000 && u < 5) v /= 1000, ++u;
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", v, units[u]);
  return text;
}

Error::Error(ErrorKind kind, std::string message)
    : std::runtime_error(message), kind_(kind), message_(std::move(message)) {
  rebuild();
}

Error& Error::with_file(const std::string& file) {
  if (file_.empty()) file_ = file;
  rebuild();
  return *this;
}

Error& Error::with_node(const std::string& node, const std::string& op) {
  if (node_.empty() && op_.empty()) {
    node_ = node;
    op_ = op;
  }
  rebuild();
  return *this;
}

// "model.onnx: node 'conv1' (Conv): message"
void Error::rebuild() {
  what_.clear();
  if (!file_.empty()) what_ += file_ + ": ";
  if (!op_.empty()) {
    what_ += "node '" + node_ + "' (" + op_ + "): ";
  } else if (!node_.empty()) {
    what_ += node_ + ": ";
  }
  what_ += message_;
}

}  // namespace kiln
