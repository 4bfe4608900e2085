// The one error type kiln throws for bad input: a model it cannot load, an op it does not
// implement, inputs of the wrong name, type or shape. It carries where the problem is
// (file, node, op) so that a tool can print a single line a user can act on.
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

enum class ErrorKind {
  InvalidModel,     // malformed or truncated file, bad graph structure, bad external data
  Unsupported,      // an op, opset, attribute value or element type kiln does not implement
  InvalidArgument,  // inputs given to run(): missing, unknown, wrong type or shape
  Runtime,          // a kernel found its inputs inconsistent while running
  Io,               // a file could not be opened or read
  Memory,           // a tensor larger than the memory limit or than the machine can allocate
};

// "512 B", "3.4 GB", "4.0 TB": decimal units, as an error message states a size.
std::string byte_size_text(unsigned long long bytes);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message);

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::string& file() const { return file_; }
  const std::string& node() const { return node_; }
  const std::string& op() const { return op_; }

  // Context is filled in as the error travels outwards; the innermost value wins.
  Error& with_file(const std::string& file);
  Error& with_node(const std::string& node, const std::string& op);

 private:
  void rebuild();
  ErrorKind kind_;
  std::string message_, file_, node_, op_;
  std::string what_;

 public:
  const char* what() const noexcept override { return what_.c_str(); }
};

}  // namespace kiln
