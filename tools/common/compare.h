// Comparing outputs with expected values the way onnxruntime's backend-test runner does:
// |actual - expected| <= atol + rtol * |expected| for floating types (NaN matches NaN),
// exact equality for integers, bools and strings, and identical dtype and shape.
#pragma once

#include <string>

#include "kiln/value.h"

namespace kiln::tooling {

struct Comparison {
  bool ok = true;
  double max_abs_err = 0;  // worst |actual - expected| over floating elements
  std::string message;     // why it failed ("" when ok)
};

Comparison compare_values(const Value& actual, const Value& expected, double rtol, double atol);

}  // namespace kiln::tooling
