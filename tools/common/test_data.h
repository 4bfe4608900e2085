// The ONNX backend-test layout: DIR/input_K.pb and DIR/output_K.pb.
#pragma once

#include <string>
#include <vector>

#include "kiln/session.h"

namespace kiln::tooling {

struct TestDataSet {
  std::vector<NamedValue> inputs;  // named for Session::run
  std::vector<Value> outputs;      // expected, in the model's output order
};

// Inputs are matched by the name stored in each file, or else by position among the
// inputs that have no default value; outputs are the session's first ones (the last
// `extra_outputs` are SessionOptions::extra_outputs, which the files do not hold). Throws
// kiln::Error naming the file on bad data.
TestDataSet read_test_data_set(const std::string& dir, const Session& session,
                               size_t extra_outputs = 0);

// Files named PREFIX0.pb, PREFIX1.pb, ... in `dir`, in numeric order.
std::vector<std::string> numbered_files(const std::string& dir, const std::string& prefix);

}  // namespace kiln::tooling
