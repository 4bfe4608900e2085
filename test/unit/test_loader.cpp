// The loader: zero-copy weights from the mapping, counted copies, external data, and every
// rejection of bad files with a message that names the problem.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "proto/loader.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"

using namespace kiln;
using kiln::testing::TempDir;
using namespace kiln::proto::testing;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// y = x + w, with w an initializer stored as `w`.
ModelSpec add_model(TensorSpec w) {
  ModelSpec m;
  m.inputs = {{"x", {4}}};
  m.initializers = {std::move(w)};
  m.nodes = {{"Add", {"x", "w"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  return m;
}

TensorSpec weight(std::vector<float> values, TensorSpec::Store store = TensorSpec::Store::Raw) {
  TensorSpec t;
  t.name = "w";
  t.dims = {static_cast<int64_t>(values.size())};
  t.values = std::move(values);
  t.store = store;
  return t;
}

std::vector<float> run_add(Session& s) {
  auto out = s.run({{"x", Tensor::from_vector<float>({4}, {1, 2, 3, 4})}});
  return out.at(0).value.tensor().to_vector<float>();
}

std::string load_error(const std::string& path) {
  try {
    Session s(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("embedded raw weights are used in place from the mapping when aligned", "[loader]") {
  TempDir dir;
  const std::vector<float> w = {10, 20, 30, 40};
  // Pad the tensor name until the raw bytes land on a 4-byte boundary in the file.
  std::string bytes;
  for (int pad = 0; pad < 8; ++pad) {
    TensorSpec t = weight(w);
    t.name = "w" + std::string(static_cast<size_t>(pad), '_');
    ModelSpec m = add_model(t);
    m.nodes[0].inputs[1] = t.name;
    bytes = model_bytes(m);
    if (find_bytes(bytes, float_bytes(w)) % 4 == 0) break;
  }
  REQUIRE(find_bytes(bytes, float_bytes(w)) % 4 == 0);
  Session s(dir.file("model.onnx", bytes));
  CHECK(run_add(s) == std::vector<float>{11, 22, 33, 44});
  CHECK(s.load_stats().weights_bytes == 16);
  CHECK(s.load_stats().weights_mapped_bytes == 16);
  CHECK(s.load_stats().weights_copied_bytes == 0);
}

TEST_CASE("misaligned raw weights are copied once, and the copy is counted", "[loader]") {
  TempDir dir;
  const std::vector<float> w = {1, 2, 3, 4};
  std::string bytes;
  for (int pad = 0; pad < 8; ++pad) {
    TensorSpec t = weight(w);
    t.name = "w" + std::string(static_cast<size_t>(pad), '_');
    ModelSpec m = add_model(t);
    m.nodes[0].inputs[1] = t.name;
    bytes = model_bytes(m);
    if (find_bytes(bytes, float_bytes(w)) % 4 != 0) break;
  }
  REQUIRE(find_bytes(bytes, float_bytes(w)) % 4 != 0);
  Session s(dir.file("model.onnx", bytes));
  CHECK(run_add(s) == std::vector<float>{2, 4, 6, 8});
  CHECK(s.load_stats().weights_copied_bytes == 16);
  CHECK(s.load_stats().weights_copied_count == 1);
  CHECK(s.load_stats().weights_mapped_bytes == 0);
}

TEST_CASE("typed float_data weights are copied and counted", "[loader]") {
  TempDir dir;
  Session s(dir.file("model.onnx",
                     model_bytes(add_model(weight({1, 1, 1, 1}, TensorSpec::Store::Typed)))));
  CHECK(run_add(s) == std::vector<float>{2, 3, 4, 5});
  CHECK(s.load_stats().weights_copied_bytes == 16);
}

TEST_CASE("a model loads from a caller's buffer with weights viewed in place", "[loader]") {
  const std::vector<float> w = {5, 5, 5, 5};
  std::string bytes = model_bytes(add_model(weight(w)));
  // Copy into 8-byte-aligned memory so the weights' alignment is that of the file offset.
  std::vector<uint64_t> buffer((bytes.size() + 7) / 8);
  std::memcpy(buffer.data(), bytes.data(), bytes.size());
  Session s = Session::from_memory(buffer.data(), bytes.size());
  CHECK(run_add(s) == std::vector<float>{6, 7, 8, 9});
  CHECK(s.load_stats().weights_mapped_bytes + s.load_stats().weights_copied_bytes == 16);
  CHECK(s.path() == "<memory>");
}

TEST_CASE("external data is mapped from a file beside the model", "[loader]") {
  TempDir dir;
  std::string blob(8, 'x');  // 8 bytes of padding before the tensor
  const auto w = float_bytes({1, 2, 3, 4});
  blob.append(reinterpret_cast<const char*>(w.data()), w.size());
  dir.file("weights/w.bin", blob);
  TensorSpec t = weight({1, 2, 3, 4}, TensorSpec::Store::External);
  t.location = "weights/w.bin";
  t.offset = "8";
  t.length = "16";
  Session s(dir.file("model.onnx", model_bytes(add_model(t))));
  CHECK(run_add(s) == std::vector<float>{2, 4, 6, 8});
  CHECK(s.load_stats().weights_mapped_bytes == 16);
  CHECK(s.load_stats().weights_copied_bytes == 0);
}

TEST_CASE("external data that escapes the model's folder or the file is rejected", "[loader]") {
  TempDir dir;
  dir.file("w.bin", std::string(16, '\0'));
  auto model_with = [&](const std::string& location, const std::string& offset,
                        const std::string& length) {
    TensorSpec t = weight({0, 0, 0, 0}, TensorSpec::Store::External);
    t.location = location;
    t.offset = offset;
    t.length = length;
    return dir.file("model.onnx", model_bytes(add_model(t)));
  };
  CHECK_THAT(load_error(model_with("../w.bin", "", "")),
             Catch::Contains("escapes the model's folder"));
  CHECK_THAT(load_error(model_with("sub/../../w.bin", "", "")), Catch::Contains("escapes"));
  CHECK_THAT(load_error(model_with("/etc/passwd", "", "")), Catch::Contains("absolute"));
  CHECK_THAT(load_error(model_with("w.bin", "8", "16")), Catch::Contains("runs past the end"));
  CHECK_THAT(load_error(model_with("w.bin", "99999999", "16")),
             Catch::Contains("runs past the end"));
  CHECK_THAT(load_error(model_with("w.bin", "0", "12")), Catch::Contains("needs 16 bytes"));
  CHECK_THAT(load_error(model_with("w.bin", "zero", "16")),
             Catch::Contains("bad external data offset"));
  CHECK_THAT(load_error(model_with("missing.bin", "", "")), Catch::Contains("cannot open"));
  // A symlink inside the folder that points outside it.
  fs::create_symlink("/etc/hostname", dir.path / "link.bin");
  CHECK_THAT(load_error(model_with("link.bin", "", "")), Catch::Contains("escapes"));
  // Every message names the model file and the tensor.
  const std::string msg = load_error(model_with("../w.bin", "", ""));
  CHECK_THAT(msg, Catch::Contains("model.onnx"));
  CHECK_THAT(msg, Catch::Contains("tensor 'w'"));
}

TEST_CASE("a tensor whose data does not match its shape is rejected", "[loader]") {
  TempDir dir;
  TensorSpec t = weight({1, 2, 3, 4});
  t.raw = {1, 2, 3};  // 3 bytes for 4 floats
  CHECK_THAT(load_error(dir.file("a.onnx", model_bytes(add_model(t)))),
             Catch::Contains("needs 16 bytes"));
  TensorSpec typed = weight({1, 2, 3}, TensorSpec::Store::Typed);
  typed.dims = {4};
  CHECK_THAT(load_error(dir.file("b.onnx", model_bytes(add_model(typed)))),
             Catch::Contains("float_data holds 3"));
}

TEST_CASE("garbage, truncated, empty and missing files give one clear error", "[loader]") {
  TempDir dir;
  std::string garbage(512, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 7919 + 13) % 251);
  CHECK_THAT(load_error(dir.file("garbage.onnx", garbage)), Catch::Contains("garbage.onnx"));
  const std::string good = model_bytes(add_model(weight({1, 2, 3, 4})));
  // Every truncation of a valid model fails cleanly (never crashes).
  for (size_t n = 1; n < good.size(); ++n) {
    const std::string err = load_error(dir.file("t.onnx", good.substr(0, n)));
    INFO("truncated to " << n << " bytes");
    CHECK_FALSE(err.empty());
  }
  CHECK_THAT(load_error(dir.file("empty.onnx", "")), Catch::Contains("empty file"));
  CHECK_THAT(load_error((dir.path / "nope.onnx").string()), Catch::Contains("cannot open"));
}

TEST_CASE("graph errors name the node: undefined input, duplicate output, unsupported op",
          "[loader]") {
  TempDir dir;
  ModelSpec undefined;
  undefined.inputs = {{"x", {4}}};
  undefined.nodes = {{"Add", {"x", "nowhere"}, {"y"}, "add1", {}}};
  undefined.outputs = {"y"};
  const std::string e1 = load_error(dir.file("u.onnx", model_bytes(undefined)));
  CHECK_THAT(e1, Catch::Contains("node 'add1' (Add)"));
  CHECK_THAT(e1, Catch::Contains("input 'nowhere' is not defined"));

  ModelSpec dup;
  dup.inputs = {{"x", {4}}};
  dup.nodes = {{"Relu", {"x"}, {"y"}, "r1", {}}, {"Relu", {"x"}, {"y"}, "r2", {}}};
  dup.outputs = {"y"};
  CHECK_THAT(load_error(dir.file("d.onnx", model_bytes(dup))), Catch::Contains("already defined"));

  ModelSpec unsupported;
  unsupported.inputs = {{"x", {4}}};
  unsupported.nodes = {{"NoSuchOp", {"x"}, {"y"}, "n1", {}}};
  unsupported.outputs = {"y"};
  const std::string e3 = load_error(dir.file("n.onnx", model_bytes(unsupported)));
  CHECK_THAT(e3, Catch::Contains("node 'n1' (NoSuchOp)"));
  CHECK_THAT(e3, Catch::Contains("unsupported op 'NoSuchOp' (domain ai.onnx, opset 18)"));

  ModelSpec cycle;
  cycle.inputs = {{"x", {4}}};
  cycle.nodes = {{"Add", {"x", "b"}, {"a"}, "c1", {}}, {"Relu", {"a"}, {"b"}, "c2", {}}};
  cycle.outputs = {"b"};
  CHECK_THAT(load_error(dir.file("c.onnx", model_bytes(cycle))), Catch::Contains("cycle"));
}

TEST_CASE("wrong inputs at run time give one clear error", "[loader][session]") {
  TempDir dir;
  Session s(dir.file("model.onnx", model_bytes(add_model(weight({1, 2, 3, 4})))));
  auto run_error = [&](std::vector<NamedValue> in) -> std::string {
    try {
      s.run(std::move(in));
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::InvalidArgument);
      return e.what();
    }
    return "";
  };
  CHECK_THAT(run_error({}), Catch::Contains("missing input 'x: float32[4]'"));
  CHECK_THAT(run_error({{"z", Tensor::zeros(DataType::Float, {4})}}),
             Catch::Contains("unknown input 'z'"));
  CHECK_THAT(run_error({{"x", Tensor::zeros(DataType::Float, {5})}}),
             Catch::Contains("dimension 0 must be 4"));
  CHECK_THAT(run_error({{"x", Tensor::zeros(DataType::Int64, {4})}}),
             Catch::Contains("wrong element type"));
  CHECK_THAT(run_error({{"x", Tensor::zeros(DataType::Float, {2, 2})}}),
             Catch::Contains("wrong rank"));
}

TEST_CASE("model_info reports the file's descriptive fields", "[loader][session]") {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/models/";
  const ModelInfo cnn = Session(dir + "tiny-cnn/model.onnx").model_info();
  CHECK(cnn.producer_name == "kiln-export");
  CHECK(cnn.graph_name == "tiny_cnn");
  CHECK(cnn.ir_version > 0);
  CHECK_FALSE(cnn.has_model_version);
  CHECK(cnn.metadata.empty());
  // The graph's name survives optimisation, which rewrites the graph.
  const ModelInfo gpt2 = Session(dir + "gpt2-tiny-random/model.onnx").model_info();
  CHECK(gpt2.producer_name == "pytorch");
  CHECK(gpt2.graph_name == "main_graph");
  CHECK(gpt2.description.empty());
}
