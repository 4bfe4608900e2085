// The operators this build of kiln implements, as its op registry lists them (docs/ops.md is
// generated from this list).
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct OpSupport {
  static constexpr int kLatestOpset = INT_MAX;
  std::string domain;           // "" is ai.onnx
  std::string op;               // "Conv"
  int since = 1;                // first opset version implemented
  int until = kLatestOpset;     // last one (kLatestOpset: every later one too)
  std::string types;            // element types ("float, double, int64")
  uint32_t in_place = 0;        // bit i: input i may be overwritten when the run owns it
  bool strided_inputs = false;  // reads non-contiguous inputs without a copy
};

// One entry per registered (domain, op, opset range), in registration order.
std::vector<OpSupport> supported_ops();

}  // namespace kiln
