// Shared by the fuzz harnesses: session options that keep a run small, and a run with
// zero-filled inputs for models whose inputs have small shapes.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "kiln/kiln.h"

namespace kiln::fuzz {

inline SessionOptions session_options() {
  static const std::shared_ptr<Environment> env = std::make_shared<Environment>(1);
  SessionOptions options;
  options.environment = env;
  options.share_weights = false;
  options.memory_limit = uint64_t{256} << 20;  // a fuzzed model gets an error, not 40 GB
  return options;
}

// Runs `session` once with zero inputs when every input is a tensor of at most 4096 elements
// (symbolic dimensions taken as 1).
inline void run_with_zeros(Session& session) {
  std::vector<NamedValue> inputs;
  for (const IoInfo& io : session.inputs()) {
    if (io.has_default) continue;
    if (io.kind != Value::Kind::Tensor || io.dtype == DataType::Undefined) return;
    Shape shape;
    int64_t n = 1;
    for (int64_t d : io.shape) {
      shape.push_back(d < 0 ? 1 : d);
      n *= shape.back();
      if (n > 4096) return;
    }
    inputs.push_back({io.name, Tensor::zeros(io.dtype, shape)});
  }
  if (!session.missing_constants().empty()) return;
  session.run(std::move(inputs));
}

// Writes `size` bytes to this process's scratch file for `harness` (readers that take a path)
// and returns its path.
inline std::string scratch_file(const char* harness, const uint8_t* data, size_t size) {
  const std::string path =
      std::string("/tmp/kiln-fuzz-") + harness + "-" + std::to_string(static_cast<long>(getpid()));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// An exception other than kiln::Error escaped: library text would reach a user.
[[noreturn]] inline void finding(const std::exception& e) {
  std::cerr << "non-kiln exception escaped: " << e.what() << "\n";
  std::abort();
}

}  // namespace kiln::fuzz
