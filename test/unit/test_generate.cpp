// The decode-loop API on the committed Optimum exports: Whisper's front end, tokens identical
// to transformers' greedy generate(), logits close to onnxruntime's, and clear errors.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "engine/generate/decoding.h"
#include "engine/util/json_file.h"
#include "kiln/generate.h"
#include "test/unit/op_test.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

const std::string kWhisper = std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random";
const std::string kGpt2 = std::string(KILN_SOURCE_DIR) + "/models/gpt2-tiny-random";

}  // namespace

TEST_CASE("log-mel features match transformers' WhisperFeatureExtractor within 1e-4",
          "[generate][audio]") {
  const std::vector<float> samples = read_audio(kWhisper + "/sample.wav");
  CHECK(samples.size() == 32000);
  const Tensor mel = whisper_log_mel(samples);
  const Tensor want = tooling::read_npy(kWhisper + "/sample_features.npy");
  REQUIRE(mel.shape() == want.shape());
  require_close(mel, want, 0, 1e-4);
}

TEST_CASE("read_wav_16k_mono refuses other WAV files with one clear error", "[generate][audio]") {
  const fs::path dir = fs::temp_directory_path() / "kiln-wav-test";
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream((dir / name).string(), std::ios::binary) << bytes;
    return (dir / name).string();
  };
  // A valid header template: PCM, channels, rate, 16 bits, then 4 data bytes.
  auto wav = [](uint16_t channels, uint32_t rate, uint16_t bits) {
    std::string h = "RIFF";
    auto u32 = [&](uint32_t v) {
      for (int i = 0; i < 4; ++i) h += static_cast<char>((v >> (8 * i)) & 0xff);
    };
    auto u16 = [&](uint16_t v) {
      h += static_cast<char>(v & 0xff);
      h += static_cast<char>(v >> 8);
    };
    u32(36 + 4);
    h += "WAVEfmt ";
    u32(16);
    u16(1);
    u16(channels);
    u32(rate);
    u32(rate * channels * bits / 8);
    u16(static_cast<uint16_t>(channels * bits / 8));
    u16(bits);
    h += "data";
    u32(4);
    h += std::string(4, '\0');
    return h;
  };
  auto error_of = [](const std::string& path) -> std::string {
    try {
      read_wav_16k_mono(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(read_wav_16k_mono(write("ok.wav", wav(1, 16000, 16))).size() == 2);
  CHECK_THAT(error_of(write("rate.wav", wav(1, 44100, 16))),
             Catch::Contains("sample rate 44100 Hz"));
  CHECK_THAT(error_of(write("stereo.wav", wav(2, 16000, 16))),
             Catch::Contains("2 channels: expected mono"));
  CHECK_THAT(error_of(write("bits.wav", wav(1, 16000, 8))), Catch::Contains("8 bits per sample"));
  CHECK_THAT(error_of(write("text.wav", "hello, this is not audio")),
             Catch::Contains("text.wav: not a readable audio file"));
  CHECK_THAT(error_of(write("cut.wav", wav(1, 16000, 16).substr(0, 30))),
             Catch::Contains("cut.wav: not a readable audio file"));
  fs::remove_all(dir);
}

TEST_CASE("Whisper with the merged decoder reproduces transformers' greedy tokens",
          "[generate][whisper]") {
  Seq2SeqGenerator g(kWhisper);
  // Start of transcript, then the language, task and no-timestamps tokens the generation
  // config forces.
  const std::vector<int64_t> prompt = {482, 483, 494, 498};
  CHECK(g.decoder_prompt() == prompt);
  CHECK(json_ints(kWhisper + "/expected_tokens.json", "decoder_prompt") == prompt);
  const Tensor features = whisper_log_mel(read_audio(kWhisper + "/sample.wav"));
  GenerationOptions o;
  o.max_new_tokens = 40;
  const GenerationResult r = g.generate(features, o);
  CHECK(r.tokens == json_ints(kWhisper + "/expected_tokens.json", "tokens"));
  REQUIRE(r.steps.size() == 40);
  // The cache is extended in place: from the second step on, each step copies the same
  // bytes whatever the cache length, and allocates nothing once the pool is warm.
  // A step copies 2,032 bytes whatever the cache length: one token's keys and values over
  // the 2 decoder layers (d_model 64, float: 1,024 bytes), its token and position embeddings
  // (2 x 256) and the small integer tensors of the shape arithmetic left after folding (496).
  CHECK(r.steps[1].bytes_copied == 2032);
  for (size_t i = 2; i < r.steps.size(); ++i) {
    CHECK(r.steps[i].bytes_copied == r.steps[1].bytes_copied);
    CHECK(r.steps[i].past_len == static_cast<int64_t>(prompt.size() + i) - 1);
  }
  CHECK(r.steps.back().allocations == 0);
}

TEST_CASE("Whisper with the decoder pair and at opset 14 gives the same tokens",
          "[generate][whisper]") {
  const Tensor features = tooling::read_npy(kWhisper + "/sample_features.npy");
  const auto expected = json_ints(kWhisper + "/expected_tokens.json", "tokens");
  GenerationOptions o;
  o.max_new_tokens = 40;
  GeneratorOptions pair;
  pair.use_decoder_pair = true;
  CHECK(Seq2SeqGenerator(kWhisper, pair).generate(features, o).tokens == expected);
  CHECK(Seq2SeqGenerator(kWhisper + "/opset14").generate(features, o).tokens == expected);
}

TEST_CASE("merged-decoder logits match onnxruntime at steps 1, 2 and 20", "[generate][whisper]") {
  // Drives the merged decoder the way the generator (and Optimum) do, feeding the
  // reference tokens, and compares the last position's logits.
  const Tensor features = tooling::read_npy(kWhisper + "/sample_features.npy");
  Session enc(kWhisper + "/encoder_model.onnx");
  Session dec(kWhisper + "/decoder_model_merged.onnx");
  const Tensor hidden = enc.run({{"input_features", features}})[0].value.tensor();
  auto tokens = json_ints(kWhisper + "/expected_tokens.json", "tokens");
  auto sequence = json_ints(kWhisper + "/expected_tokens.json", "decoder_prompt");
  const size_t prompt_len = sequence.size();
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  std::map<std::string, Tensor> past;
  for (const IoInfo& io : dec.inputs()) {
    if (io.name.rfind("past_key_values", 0) == 0)
      past[io.name] = Tensor::zeros(DataType::Float, {1, io.shape[1], 0, io.shape[3]});
  }
  std::vector<int64_t> ids(sequence.begin(), sequence.begin() + static_cast<long>(prompt_len));
  for (int step = 0; step <= 20; ++step) {
    std::vector<NamedValue> in = {
        {"input_ids", Tensor::from_vector<int64_t>({1, static_cast<int64_t>(ids.size())}, ids)},
        {"encoder_hidden_states", hidden},
        {"use_cache_branch", Tensor::from_vector<bool>({1}, {step > 0})}};
    for (auto& [name, t] : past) in.push_back({name, t});
    auto out = dec.run(std::move(in));
    for (auto& o : out) {
      if (o.name.rfind("present.", 0) != 0) continue;
      const std::string p = "past_key_values." + o.name.substr(8);
      if (step == 0 || p.find(".decoder.") != std::string::npos) past[p] = o.value.tensor();
    }
    if (step == 1 || step == 2 || step == 20) {
      const Tensor& logits = out[0].value.tensor();
      const int64_t vocab = logits.dim(2);
      Tensor last = logits.contiguous().view(
          {1, vocab}, {vocab, 1}, static_cast<size_t>((logits.dim(1) - 1) * vocab) * sizeof(float));
      const Tensor want =
          tooling::read_npy(kWhisper + "/reference_logits_step" + std::to_string(step) + ".npy");
      INFO("step " << step);
      require_close(last.contiguous(), want, 1e-3, 1e-4);
    }
    ids = {sequence[prompt_len + static_cast<size_t>(step)]};
  }
}

TEST_CASE("GPT-2 reproduces transformers' greedy tokens with the cache extended in place",
          "[generate][gpt2]") {
  CausalLmGenerator g(kGpt2);
  GenerationOptions o;
  o.max_new_tokens = 40;
  const GenerationResult r = g.generate(json_ints(kGpt2 + "/expected_tokens.json", "prompt"), o);
  CHECK(r.tokens == json_ints(kGpt2 + "/expected_tokens.json", "tokens"));
  // The KV caches add nothing per step; the only growth is the model's own Gather of a bool
  // attention-mask row of past + 1 elements: exactly one byte per position.
  for (size_t i = 2; i < r.steps.size(); ++i) {
    CHECK(r.steps[i].bytes_copied == r.steps[1].bytes_copied + (i - 1));
  }
  CHECK(CausalLmGenerator(kGpt2 + "/opset14")
            .generate(json_ints(kGpt2 + "/expected_tokens.json", "prompt"), o)
            .tokens == r.tokens);
}

TEST_CASE("sampling is reproducible with a seed, stops at stop tokens, honours min_new_tokens",
          "[generate][gpt2]") {
  CausalLmGenerator g(kGpt2);
  const auto prompt = json_ints(kGpt2 + "/expected_tokens.json", "prompt");
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.do_sample = true;
  o.temperature = 0.8f;
  o.top_k = 20;
  o.top_p = 0.9f;
  o.seed = 123;
  const auto a = g.generate(prompt, o).tokens;
  CHECK(a == g.generate(prompt, o).tokens);
  o.seed = 124;
  CHECK(a != g.generate(prompt, o).tokens);
  // Greedy with the first greedy token as a stop token: one token, then stop...
  GenerationOptions greedy;
  greedy.max_new_tokens = 10;
  const int64_t first = g.generate(prompt, greedy).tokens[0];
  greedy.stop_tokens = {first};
  CHECK(g.generate(prompt, greedy).tokens == std::vector<int64_t>{first});
  // ...unless min_new_tokens holds it back.
  greedy.min_new_tokens = 3;
  const auto held = g.generate(prompt, greedy).tokens;
  CHECK(held.size() >= 3);
  CHECK(held[0] != first);
  // A callback can stop streaming.
  GenerationOptions streamed;
  streamed.max_new_tokens = 10;
  int seen = 0;
  streamed.on_token = [&](int64_t, const StepStats&) { return ++seen < 4; };
  CHECK(g.generate(prompt, streamed).tokens.size() == 4);
}

TEST_CASE("model folders that are incomplete or not Optimum exports give one clear error",
          "[generate]") {
  const fs::path dir = fs::temp_directory_path() / "kiln-generate-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto error_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of([&] { Seq2SeqGenerator g(dir.string()); }),
             Catch::Contains("config.json: missing"));
  fs::copy_file(kWhisper + "/config.json", dir / "config.json");
  CHECK_THAT(error_of([&] { Seq2SeqGenerator g(dir.string()); }),
             Catch::Contains("encoder_model.onnx: missing"));
  // A model whose inputs do not follow Optimum's naming: the tiny CNN as a "decoder".
  fs::copy_file(kWhisper + "/encoder_model.onnx", dir / "encoder_model.onnx");
  fs::copy_file(std::string(KILN_SOURCE_DIR) + "/models/tiny-cnn/model.onnx",
                dir / "decoder_model_merged.onnx");
  CHECK_THAT(error_of([&] { Seq2SeqGenerator g(dir.string()); }),
             Catch::Contains("has no input 'input_ids'"));
  fs::remove_all(dir);
}

TEST_CASE("bad JSON in a model folder is one error naming the file", "[generate][json]") {
  const fs::path dir = fs::temp_directory_path() / "kiln-generate-json-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto error_of = [&](const std::string& config) -> std::string {
    std::ofstream(dir / "config.json") << config;
    try {
      CausalLmGenerator g(dir.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string file = (dir / "config.json").string();
  CHECK_THAT(error_of("{\"eos_token_id\": [1, 2,}"),
             Catch::Contains(file + ": invalid JSON: parse error at line 1, column 24"));
  CHECK_THAT(error_of(""), Catch::Contains(file + ": invalid JSON"));
  CHECK_THAT(error_of("{\"eos_token_id\": \"two\"}"),
             Catch::Contains(file + ": eos_token_id: expected an integer, got a string"));
  CHECK_THAT(error_of("{\"eos_token_id\": [1.5]}"),
             Catch::Contains(file + ": eos_token_id: expected an integer, got 1.5"));
  CHECK_THAT(error_of("{\"n_positions\": 18446744073709551615}"),
             Catch::Contains(file + ": n_positions: integer out of range"));
  // Well-formed: the next complaint is the missing model.
  CHECK_THAT(error_of("{\"eos_token_id\": 2.0, \"n_positions\": 64}"),
             Catch::Contains("model.onnx: missing from the model folder"));
  fs::remove_all(dir);
}

TEST_CASE("json::to_int takes integral numbers only", "[generate][json]") {
  CHECK(json::to_int(json::Json::parse("42"), "f", "k") == 42);
  CHECK(json::to_int(json::Json::parse("-7"), "f", "k") == -7);
  CHECK(json::to_int(json::Json::parse("3.0"), "f", "k") == 3);
  CHECK_THROWS_WITH(json::to_int(json::Json::parse("null"), "f", "k"),
                    Catch::Contains("f: k: expected an integer, got null"));
  CHECK_THROWS_WITH(json::to_int(json::Json::parse("true"), "f", "k"),
                    Catch::Contains("expected an integer, got a boolean"));
  CHECK_THROWS_WITH(json::to_int(json::Json::parse("1e300"), "f", "k"),
                    Catch::Contains("expected an integer"));
}

TEST_CASE("the generator's argmax gives std::max_element's index", "[generate][argmax]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {1, 7, 8, 9, 511, 512, 513, 1030, 51865}) {
    std::vector<float> x(n);
    for (float& v : x) v = u(rng);
    const auto expect = [&] {
      return static_cast<int64_t>(std::max_element(x.begin(), x.end()) - x.begin());
    };
    CHECK(detail::argmax(x) == expect());
    // Ties keep the first; the same largest value in a later block does not win.
    const size_t first = n / 3, second = n - 1;
    x[first] = x[second] = 9.0f;
    CHECK(detail::argmax(x) == expect());
    // NaNs after the first element are skipped; -inf everywhere gives index 0.
    x[second / 2] = nan;
    CHECK(detail::argmax(x) == expect());
    std::fill(x.begin(), x.end(), -inf);
    CHECK(detail::argmax(x) == 0);
    x[n - 1] = inf;
    CHECK(detail::argmax(x) == expect());
    x[0] = nan;  // max_element keeps a NaN first element
    CHECK(detail::argmax(x) == expect());
  }
}
