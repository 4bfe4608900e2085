// The arena planned from the op contracts (inferred shapes, views, in-place writes and
// workspaces) before a run equals the one recorded from that run, on the ONNX backend's
// light/ CNNs and pytorch-converted/ models: the first run is served wholly by the predicted
// layout (no request misses it) and the layout recorded from it, which serves the second
// run, is the same size.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/session.h"
#include "test/unit/op_test.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> models(const fs::path& root) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(root / "light"))
    if (e.path().extension() == ".onnx") found.push_back(e.path());
  for (const char* folder : {"pytorch-converted"}) {
    for (const auto& e : fs::directory_iterator(root / folder))
      if (fs::exists(e.path() / "model.onnx")) found.push_back(e.path() / "model.onnx");
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Zeros for every input without a default (symbolic dimensions as 1).
std::vector<NamedValue> zero_inputs(const Session& s) {
  std::vector<NamedValue> inputs;
  for (const IoInfo& io : s.inputs()) {
    if (io.has_default || io.kind != Value::Kind::Tensor) continue;
    Shape shape;
    for (int64_t d : io.shape) shape.push_back(d < 0 ? 1 : d);
    inputs.push_back({io.name, Tensor::zeros(io.dtype, shape)});
  }
  return inputs;
}

}  // namespace

TEST_CASE("arenas planned from the op contracts equal the recorded ones on the backend models",
          "[arena][prediction]") {
  const fs::path root = testing::backend_test_data();
  if (root.empty() || !fs::is_directory(root / "light")) {
    WARN(
        "KILN-SKIP: no ONNX backend test data (set ONNX_BACKEND_TEST_DATA or put it in "
        "../shared/onnx-backend-tests beside the checkout)");
    return;
  }
  int ran = 0, predicted = 0;
  std::vector<std::string> wrong, not_predicted;
  for (const fs::path& path : models(root)) {
    SessionOptions so;
    so.environment = std::make_shared<Environment>(1);
    so.memory_arena = true;
    so.arena_from_shapes = true;
    std::string name = path.parent_path().filename().string() + "/" + path.stem().string();
    try {
      Session s(path.string(), so);
      s.run(zero_inputs(s));
      const RunStats first = s.last_run_stats();
      s.run(zero_inputs(s));
      const RunStats second = s.last_run_stats();
      ++ran;
      if (!first.arena_from_shapes) {
        not_predicted.push_back(name);
        continue;
      }
      ++predicted;
      if (first.arena_missed != 0 || second.arena_missed != 0 ||
          first.arena_bytes != second.arena_bytes) {
        wrong.push_back(name + ": predicted " + std::to_string(first.arena_bytes) + " bytes (" +
                        std::to_string(first.arena_missed) + " requests missed it), recorded " +
                        std::to_string(second.arena_bytes) + " (" +
                        std::to_string(second.arena_missed) + " missed)");
      }
    } catch (const Error&) {
      continue;  // models kiln does not run are the conformance tests' subject
    }
  }
  std::string list;
  for (const std::string& w : wrong) list += w + "\n";
  std::string unplanned;
  for (const std::string& n : not_predicted) unplanned += n + " ";
  INFO(wrong.size() << " of " << predicted << " predicted arenas differ:\n" << list);
  INFO("not planned from shapes: " << unplanned);
  CHECK(wrong.empty());
  CHECK(ran >= 80);
  CHECK(predicted >= 60);
}
