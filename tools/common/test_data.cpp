#include "tools/common/test_data.h"

#include <filesystem>

#include "kiln/error.h"
#include "kiln/tensor_file.h"

namespace kiln::tooling {

namespace fs = std::filesystem;

std::vector<std::string> numbered_files(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> files;
  for (int k = 0;; ++k) {
    const fs::path p = fs::path(dir) / (prefix + std::to_string(k) + ".pb");
    if (!fs::exists(p)) break;
    files.push_back(p.string());
  }
  return files;
}

TestDataSet read_test_data_set(const std::string& dir, const Session& session,
                               size_t extra_outputs) {
  if (!fs::is_directory(dir)) {
    throw Error(ErrorKind::Io, "test data folder does not exist").with_file(dir);
  }
  TestDataSet set;
  const auto& ins = session.inputs();
  // Candidates by position: the model's inputs in order (files name the input they feed).
  const auto input_files = numbered_files(dir, "input_");
  if (input_files.size() > ins.size()) {
    throw Error(ErrorKind::InvalidArgument, std::to_string(input_files.size()) +
                                                " input files for a model with " +
                                                std::to_string(ins.size()) + " inputs")
        .with_file(dir);
  }
  for (size_t k = 0; k < input_files.size(); ++k) {
    std::string name;
    Value v = read_value_file(input_files[k], ins[k], &name);
    bool known = false;
    for (const auto& io : ins) known = known || io.name == name;
    if (!known) name = ins[k].name;
    set.inputs.push_back({name, std::move(v)});
  }
  const auto output_files = numbered_files(dir, "output_");
  const auto& outs = session.outputs();
  // The model's declared outputs; SessionOptions::extra_outputs come after them.
  if (output_files.size() != outs.size() - extra_outputs) {
    throw Error(ErrorKind::InvalidArgument,
                std::to_string(output_files.size()) + " output files for a model with " +
                    std::to_string(outs.size() - extra_outputs) + " outputs")
        .with_file(dir);
  }
  for (size_t k = 0; k < output_files.size(); ++k) {
    set.outputs.push_back(read_value_file(output_files[k], outs[k]));
  }
  return set;
}

}  // namespace kiln::tooling
