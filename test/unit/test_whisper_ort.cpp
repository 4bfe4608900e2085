// The random Whisper as Optimum's onnxruntime tools rewrite it (models/whisper-tiny-ort, made by
// tools/export/make_whisper_ort.py): kiln's greedy decoding gives onnxruntime's tokens.

#include <string>
#include <vector>

#include "engine/util/json_file.h"
#include "kiln/generate.h"
#include "test/unit/op_test.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-ort";

std::vector<int64_t> greedy_tokens(const std::string& folder) {
  const Tensor features = tooling::read_npy(std::string(KILN_SOURCE_DIR) +
                                            "/models/whisper-tiny-random/sample_features.npy");
  GenerationOptions o;
  o.max_new_tokens = 40;
  return Seq2SeqGenerator(folder).generate(features, o).tokens;
}

// How many of the reference's tokens were chosen by a logit margin of at least `margin`, from
// the start: the steps whose choice does not hang on how one float rounds.
size_t decided_steps(const std::string& file, double margin) {
  const json::Json doc = json::read_file(file);
  size_t n = 0;
  while (n < doc.at("margins").size() && doc.at("margins")[n].get<double>() >= margin) ++n;
  return n;
}

}  // namespace

TEST_CASE("Whisper rewritten by ORTOptimizer O3 decodes onnxruntime's tokens",
          "[generate][whisper][contrib]") {
  const std::string folder = kModels + "/O3";
  CHECK(greedy_tokens(folder) == json_ints(folder + "/expected_tokens.json", "tokens"));
}

TEST_CASE("Whisper quantized by ORTQuantizer decodes onnxruntime's tokens while they are decided",
          "[generate][whisper][contrib]") {
  // Activations are quantized at run time: a float rounded differently before a
  // DynamicQuantizeLinear moves one 8-bit value by a step, which moves logits by up to about
  // 0.1 (see the ort_whisper_quantized_models ctest). Tokens are compared up to the first step
  // onnxruntime chose by a smaller margin than 0.1; after it the two decodings may part.
  for (const char* name : {"avx512-vnni", "avx2"}) {
    INFO(name);
    const std::string folder = kModels + "/" + name;
    const auto want = json_ints(folder + "/expected_tokens.json", "tokens");
    const size_t decided = decided_steps(folder + "/expected_tokens.json", 0.1);
    REQUIRE(decided >= 5);
    const auto got = greedy_tokens(folder);
    REQUIRE(got.size() >= decided);
    CHECK(std::vector<int64_t>(got.begin(), got.begin() + static_cast<int64_t>(decided)) ==
          std::vector<int64_t>(want.begin(), want.begin() + static_cast<int64_t>(decided)));
  }
}

TEST_CASE(
    "Whisper rewritten by ORTOptimizer O4 (float16) decodes onnxruntime's tokens while "
    "they are decided",
    "[generate][whisper][contrib][float16]") {
  // kiln rounds every float16 op's result, onnxruntime drops the rounding between the nodes it
  // runs in float, so logits part by up to about 0.02 (see the ort_float16_models ctest).
  // Tokens are compared up to the first step onnxruntime chose by a smaller margin than 0.05.
  const std::string folder = kModels + "/O4";
  const auto want = json_ints(folder + "/expected_tokens.json", "tokens");
  const size_t decided = decided_steps(folder + "/expected_tokens.json", 0.05);
  REQUIRE(decided >= 5);
  const auto got = greedy_tokens(folder);
  REQUIRE(got.size() >= decided);
  CHECK(std::vector<int64_t>(got.begin(), got.begin() + static_cast<int64_t>(decided)) ==
        std::vector<int64_t>(want.begin(), want.begin() + static_cast<int64_t>(decided)));
}
