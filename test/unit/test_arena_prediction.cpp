// The arena planned from the op contracts (inferred shapes, views, in-place writes,
// workspaces and nested graphs' runs) before a run equals the one recorded from that run, on
// the ONNX backend's light/ CNNs and pytorch-converted/ models, its node cases (If, Loop and
// Scan included) and the merged Whisper decoder: the first run is served wholly by the
// predicted layout (no request misses it) and the layout recorded from it, which serves the
// second run, is the same size.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/error.h"
#include "kiln/session.h"
#include "proto/loader.h"
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

namespace {

// Whether a node of `g` runs nested graphs.
bool has_nested_graphs(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes)
    if (!n.graph_attributes().empty()) return true;
  return false;
}

struct Comparison {
  bool predicted = false;
  std::string wrong;  // empty when the predicted arena equals the recorded one
  RunStats first;     // the run served from the predicted arena
};

// Runs `feeds()` twice: the first run served from the arena planned from shapes, the second
// from the layout recorded in the first.
template <typename Feeds>
Comparison compare_runs(Session& s, const std::string& name, Feeds feeds) {
  s.run(feeds());
  const RunStats first = s.last_run_stats();
  s.run(feeds());
  const RunStats second = s.last_run_stats();
  Comparison c;
  c.predicted = first.arena_from_shapes;
  c.first = first;
  if (c.predicted &&
      (first.arena_missed != 0 || second.arena_missed != 0 ||
       first.arena_bytes != second.arena_bytes || first.arena_served != second.arena_served)) {
    c.wrong = name + ": predicted " + std::to_string(first.arena_bytes) + " bytes (" +
              std::to_string(first.arena_served) + " served, " +
              std::to_string(first.arena_missed) + " missed), recorded " +
              std::to_string(second.arena_bytes) + " (" + std::to_string(second.arena_served) +
              " served, " + std::to_string(second.arena_missed) + " missed)";
  }
  return c;
}

}  // namespace

namespace {

// The comparison of compare_runs on the model of a folder holding model.onnx and
// test_data_set_0/input_K.pb (the backend's node cases, the committed models' test sets),
// its inputs given by move as fresh tensors each run. Throws what loading or running throws.
Comparison compare_case(const fs::path& dir, const std::string& name, bool* has_nested) {
  const fs::path model_path = dir / "model.onnx";
  const fs::path set = dir / "test_data_set_0";
  LoadStats ls;
  const ir::Model m = proto::load_model_file(model_path.string(), ls);
  if (has_nested) *has_nested = has_nested_graphs(*m.graph);
  std::vector<std::pair<std::string, ir::TypeInfo>> inputs;
  for (ir::ValueId id : m.graph->inputs)
    inputs.push_back({m.graph->value(id).name, m.graph->value(id).type});
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  Session s(model_path.string(), so);
  auto feeds = [&] {
    std::vector<NamedValue> v;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const fs::path file = set / ("input_" + std::to_string(k) + ".pb");
      if (fs::exists(file))
        v.push_back(
            {inputs[k].first, proto::read_value_file(file.string(), inputs[k].second, nullptr)});
    }
    return v;
  };
  return compare_runs(s, name, feeds);
}

bool is_case(const fs::path& dir) {
  return fs::exists(dir / "model.onnx") && fs::is_directory(dir / "test_data_set_0");
}

}  // namespace

TEST_CASE(
    "arenas planned from shapes equal the recorded ones on the node cases, If, Loop and "
    "Scan included",
    "[arena][prediction]") {
  const fs::path root = testing::backend_test_data();
  if (root.empty() || !fs::is_directory(root / "node")) {
    WARN("KILN-SKIP: no ONNX backend test data");
    return;
  }
  int ran = 0, predicted = 0, nested = 0, nested_predicted = 0;
  std::vector<std::string> wrong, nested_not_predicted;
  for (const auto& entry : fs::directory_iterator(root / "node")) {
    if (!is_case(entry.path())) continue;
    const std::string name = entry.path().filename().string();
    try {
      bool has_nested = false;
      const Comparison c = compare_case(entry.path(), name, &has_nested);
      ++ran;
      predicted += c.predicted ? 1 : 0;
      nested += has_nested ? 1 : 0;
      nested_predicted += has_nested && c.predicted ? 1 : 0;
      if (has_nested && !c.predicted) nested_not_predicted.push_back(name);
      if (!c.wrong.empty()) wrong.push_back(c.wrong);
    } catch (const Error&) {
      continue;  // cases kiln does not run are the conformance tests' subject
    }
  }
  std::string list, unplanned;
  for (const std::string& w : wrong) list += w + "\n";
  for (const std::string& n : nested_not_predicted) unplanned += n + " ";
  INFO(wrong.size() << " of " << predicted << " predicted arenas differ, of " << ran
                    << " cases run:\n"
                    << list);
  INFO("with nested graphs: " << nested_predicted << " of " << nested
                              << " planned from shapes; not: " << unplanned);
  CHECK(wrong.empty());
  CHECK(ran >= 1700);
  CHECK(predicted >= 1677);
  CHECK(nested_predicted >= 19);
}

// The committed models written by onnxruntime's tools (com.microsoft attention, quantized,
// int4 and fused ops, whose kernels take workspace): every one runs, is planned from shapes,
// and its plan equals the recorded one.
TEST_CASE("arenas planned from shapes equal the recorded ones on the committed model folders",
          "[arena][prediction]") {
  const fs::path models = fs::path(KILN_SOURCE_DIR) / "models";
  std::vector<fs::path> dirs;
  for (auto it = fs::recursive_directory_iterator(models); it != fs::recursive_directory_iterator();
       ++it) {
    if (it->path().filename() == "cache") {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory() && is_case(it->path())) dirs.push_back(it->path());
  }
  std::sort(dirs.begin(), dirs.end());
  std::vector<std::string> wrong, unplanned;
  uint64_t served = 0;
  for (const fs::path& dir : dirs) {
    const std::string name = fs::relative(dir, models).string();
    const Comparison c = compare_case(dir, name, nullptr);
    if (!c.predicted) unplanned.push_back(name);
    if (!c.wrong.empty()) wrong.push_back(c.wrong);
    served += c.first.arena_served;
  }
  std::string list, not_planned;
  for (const std::string& w : wrong) list += w + "\n";
  for (const std::string& n : unplanned) not_planned += n + " ";
  INFO(dirs.size() << " folders; differ:\n" << list << "not planned from shapes: " << not_planned);
  CHECK(dirs.size() >= 30);
  CHECK(wrong.empty());
  CHECK(unplanned.empty());
  CHECK(served > 0);
}

TEST_CASE("the merged Whisper decoder's first run is planned through its If",
          "[arena][prediction]") {
  // Both branches: the first step (no cache: else_branch) and a cached step (then_branch),
  // past keys and values given by move as the generator gives them.
  const std::string path =
      std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random/decoder_model_merged.onnx";
  for (const int64_t past : {int64_t{0}, int64_t{4}}) {
    INFO("past length " << past);
    SessionOptions so;
    so.environment = std::make_shared<Environment>(1);
    Session s(path, so);
    auto feeds = [&] {
      std::vector<NamedValue> v;
      const int64_t tokens = past == 0 ? 4 : 1, frames = 1500;
      v.push_back({"input_ids",
                   Tensor::from_vector<int64_t>({1, tokens}, std::vector<int64_t>(tokens, 7))});
      v.push_back({"encoder_hidden_states", Tensor::zeros(DataType::Float, {1, frames, 64})});
      for (int layer = 0; layer < 2; ++layer) {
        for (const char* kind : {"key", "value"}) {
          const std::string p = "past_key_values." + std::to_string(layer);
          v.push_back({p + ".decoder." + kind, Tensor::zeros(DataType::Float, {1, 4, past, 16})});
          v.push_back({p + ".encoder." + kind,
                       Tensor::zeros(DataType::Float, {1, 4, past == 0 ? 0 : frames, 16})});
        }
      }
      v.push_back({"use_cache_branch", Tensor::from_vector<bool>({1}, {past > 0})});
      return v;
    };
    const Comparison c = compare_runs(s, "decoder_model_merged", feeds);
    INFO("arena " << c.first.arena_bytes << " bytes, lower bound " << c.first.arena_lower_bound
                  << ", " << c.first.arena_served << " requests served, " << c.first.arena_missed
                  << " missed");
    CHECK(c.predicted);
    CHECK(c.wrong == "");
    CHECK(c.first.arena_served > 0);
  }
}
