// SessionOptions::optimized_model_path: the graph a session runs, written back as ONNX. The
// saved file, loaded without optimisation, must be the same graph (same node count, same
// outputs), including nested graphs (the Whisper merged decoder's If) and fused nodes.
#include <filesystem>

#include "kiln/generate.h"
#include "kiln/tensor_file.h"
#include "proto/loader.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/models";

// Writes `model` optimised to `out`; returns the session that wrote it.
Session save_optimized(const std::string& model, const fs::path& out) {
  SessionOptions so;
  so.optimized_model_path = out.string();
  Session s(model, so);
  REQUIRE(fs::exists(out));
  return s;
}

std::vector<NamedValue> test_inputs(const Session& s, const std::string& data_dir) {
  std::vector<NamedValue> in;
  for (size_t i = 0; i < s.inputs().size(); ++i) {
    const std::string file = data_dir + "/input_" + std::to_string(i) + ".pb";
    in.push_back({s.inputs()[i].name, read_value_file(file, s.inputs()[i])});
  }
  return in;
}

}  // namespace

TEST_CASE("a saved optimised model is the graph the session ran", "[save_optimized]") {
  for (const std::string name :
       {"tiny-cnn", "bert-tiny-ort-optimized/O2", "gpt2-tiny-ort-optimized/O2"}) {
    INFO(name);
    const std::string dir = kModels + "/" + name;
    TempDir tmp;
    const fs::path out = tmp.path / "model.onnx";
    Session original = save_optimized(dir + "/model.onnx", out);
    SessionOptions none;
    none.optimization = GraphOptimization::None;
    Session saved(out.string(), none);
    CHECK(saved.load_stats().nodes_loaded == original.load_stats().nodes_planned);
    REQUIRE(saved.inputs().size() == original.inputs().size());
    const auto in = test_inputs(original, dir + "/test_data_set_0");
    const auto want = original.run(in);
    const auto got = saved.run(in);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("output " << want[i].name);
      CHECK(got[i].name == want[i].name);
      require_close(got[i].value.tensor().contiguous(), want[i].value.tensor().contiguous(), 1e-5,
                    1e-6);
    }
  }
}

TEST_CASE("the optimised Whisper models, saved and reloaded, decode the same tokens",
          "[save_optimized][whisper]") {
  // The merged decoder's fusions sit inside its If branches: the saved file carries them.
  const std::string src = kModels + "/whisper-tiny-random";
  TempDir tmp;
  for (const auto& entry : fs::directory_iterator(src)) {
    if (entry.is_regular_file() && entry.path().extension() != ".onnx")
      fs::copy_file(entry.path(), tmp.path / entry.path().filename());
  }
  uint64_t fused = 0;
  for (const char* model : {"encoder_model.onnx", "decoder_model_merged.onnx"})
    fused += save_optimized(src + "/" + model, tmp.path / model).load_stats().fusions;
  CHECK(fused > 0);
  GeneratorOptions go;
  go.optimization = GraphOptimization::None;
  Seq2SeqGenerator g(tmp.path.string(), go);
  GenerationOptions o;
  o.max_new_tokens = 40;
  const Tensor features = tooling::read_npy(src + "/sample_features.npy");
  CHECK(g.generate(features, o).tokens == json_ints(src + "/expected_tokens.json", "tokens"));
}

TEST_CASE("saving fails with one error naming the file or the constant", "[save_optimized]") {
  SessionOptions so;
  so.optimized_model_path = "/nonexistent-dir/model.onnx";
  REQUIRE_THROWS_WITH(Session(kModels + "/tiny-cnn/model.onnx", so),
                      Catch::Contains("/nonexistent-dir/model.onnx"));
  // A constant whose data is to come later (a hollow constant) cannot be written.
  TempDir tmp;
  proto::testing::ModelSpec spec;
  spec.inputs = {{"x", {2, 2}}};
  proto::testing::TensorSpec w;
  w.name = "w";
  w.dims = {2, 2};
  w.values = {1, 2, 3, 4};
  w.store = proto::testing::TensorSpec::Store::External;
  w.location = "missing.bin";
  spec.initializers = {w};
  proto::testing::NodeSpec matmul;
  matmul.op = "MatMul";
  matmul.inputs = {"x", "w"};
  matmul.outputs = {"y"};
  spec.nodes = {matmul};
  spec.outputs = {"y"};
  const std::string path = tmp.file("model.onnx", proto::testing::model_bytes(spec));
  so.defer_missing_weights = true;
  so.optimized_model_path = (tmp.path / "saved.onnx").string();
  REQUIRE_THROWS_WITH(Session(path, so), Catch::Contains("constant 'w' has no data yet") &&
                                             Catch::Contains("saved.onnx"));
}

TEST_CASE("weights beyond the embedding limit go to an external data file, mapped on reload",
          "[save_optimized]") {
  const std::string dir = kModels + "/tiny-cnn";
  LoadStats stats;
  const ir::Model model = proto::load_model_file(dir + "/model.onnx", stats);
  TempDir tmp;
  const fs::path out = tmp.path / "model.onnx";
  proto::save_model(model, out.string(), /*embedded_limit=*/0);
  REQUIRE(fs::exists(tmp.path / "model.onnx.data"));
  CHECK(fs::file_size(tmp.path / "model.onnx.data") > fs::file_size(out));
  Session saved(out.string());
  CHECK(saved.load_stats().weights_mapped_bytes > 0);
  Session original(dir + "/model.onnx");
  const auto in = test_inputs(original, dir + "/test_data_set_0");
  require_close(saved.run(in)[0].value.tensor(), original.run(in)[0].value.tensor(), 0, 0);
}
