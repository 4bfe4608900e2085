// kiln-generate: run a decode loop on an Optimum export folder (Whisper-style seq2seq or a
// decoder-only LM), streaming tokens and reporting per-step time and bytes copied. When the
// folder has tokenizer files the tokens stream as text (special tokens skipped) and a
// decoder-only model takes a text prompt; --ids streams ids instead.
//
// Exit status: 0 ok, 2 any error (missing file, model not following Optimum's naming, bad
// audio), with a one-line message.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/util/json_file.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "kiln/tokenizer.h"
#include "tools/common/cli.h"
#include "tools/common/json_output.h"
#include "tools/common/npy.h"
#include "tools/common/options.h"

namespace {

namespace fs = std::filesystem;
using kiln::tooling::Json;
using kiln::tooling::UsageError;

struct Options {
  std::string dir, audio, features, prompt_ids, prompt_text;
  std::vector<int64_t> prompt;  // --prompt-ids, parsed
  int64_t max_new = -1, min_new = 0;
  int threads = 0;
  bool sample = false, decoder_pair = false, json = false, ids = false;
  float temperature = 1.0f, top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  kiln::WeightPrecision weights = kiln::WeightPrecision::Float32;
};

// The command line into `o`.
void define_options(CLI::App& app, Options& o) {
  using namespace kiln::tooling;
  configure(app);
  app.add_option("MODEL_DIR", o.dir, "an Optimum export folder (seq2seq or decoder-only)")
      ->type_name("");
  app.add_option("--audio", o.audio,
                 "an audio file (WAV, FLAC, Ogg Vorbis/Opus, MP3; any rate and channels; seq2seq)")
      ->type_name("FILE");
  app.add_option("--features", o.features, "log-mel features from a .npy file (seq2seq)")
      ->type_name("FILE");
  app.add_option("--prompt-ids", o.prompt_ids, "prompt token ids, comma-separated (decoder-only)")
      ->type_name("1,2,3");
  app.add_option("--prompt", o.prompt_text,
                 "prompt text, encoded by the folder's tokenizer (decoder-only)")
      ->type_name("TEXT");
  add_int<int64_t>(app, "--max-new-tokens", o.max_new, 0,
                   "tokens to generate at most (default: as many as the reference, or the "
                   "model's limit)");
  add_int<int64_t>(app, "--min-new-tokens", o.min_new, 0, "end-of-text suppressed before this");
  add_int(app, "--threads", o.threads, 1, "thread pool size (default: one per core)");
  add_choice(
      app, "--sampling", o.sample,
      [](const std::string& v) -> std::optional<bool> {
        if (v == "greedy") return false;
        if (v == "sample") return true;
        return std::nullopt;
      },
      "greedy or sample", "greedy (default) or sample");
  add_number(app, "--temperature", o.temperature, 0, "sampling temperature (default 1)");
  add_int<int64_t>(app, "--top-k", o.top_k, 0, "sample from the k likeliest tokens (0: all)");
  add_number(app, "--top-p", o.top_p, 0, "nucleus sampling mass in (0, 1] (default 1)");
  add_int<uint64_t>(app, "--seed", o.seed, 0, "random seed of the sampler (default 0)");
  app.add_flag("--decoder-pair", o.decoder_pair,
               "use decoder_model.onnx + decoder_with_past_model.onnx, not the merged decoder");
  app.add_flag("--json", o.json, "print one JSON object instead of streaming tokens");
  app.add_flag("--ids", o.ids, "stream token ids even when the folder has a tokenizer");
  add_choice(app, "--weights", o.weights, parse_gemm_weights, kGemmWeightsChoices,
             "precision of the packed MatMul/Gemm weights: f32 (default), bf16, f16 or int8 "
             "(per-column int8, activations quantized per row)");
}

int run(const Options& o) {
  const fs::path dir = o.dir;
  if (!fs::is_directory(dir))
    throw kiln::Error(kiln::ErrorKind::Io, "not a folder").with_file(o.dir);
  const fs::path expected_file = dir / "expected_tokens.json";
  const std::string expected_path = expected_file.string();
  kiln::json::Json expected = kiln::json::Json::object();
  if (fs::exists(expected_file)) expected = kiln::json::read_file(expected_path);
  if (!expected.is_object()) {
    throw kiln::Error(kiln::ErrorKind::InvalidArgument, "expected a JSON object")
        .with_file(expected_path);
  }
  auto ints = [&](const char* key) {
    std::vector<int64_t> out;
    const kiln::json::Json& v = expected.at(key);
    if (!v.is_array()) return std::vector<int64_t>{kiln::json::to_int(v, expected_path, key)};
    for (const auto& x : v) out.push_back(kiln::json::to_int(x, expected_path, key));
    return out;
  };

  kiln::GeneratorOptions go;
  go.environment = std::make_shared<kiln::Environment>(o.threads);
  go.use_decoder_pair = o.decoder_pair;
  go.gemm_weights = o.weights;
  kiln::GenerationOptions gen;
  gen.max_new_tokens = o.max_new;
  if (gen.max_new_tokens < 0 && expected.contains("max_new_tokens")) {
    // the length of the reference
    gen.max_new_tokens =
        kiln::json::to_int(expected["max_new_tokens"], expected_path, "max_new_tokens");
  }
  gen.min_new_tokens = o.min_new;
  gen.do_sample = o.sample;
  gen.temperature = o.temperature;
  gen.top_k = o.top_k;
  gen.top_p = o.top_p;
  gen.seed = o.seed;
  // Text needs the tokenizer (tokenizer.json or vocab.json + merges.txt) of the folder.
  std::optional<kiln::Tokenizer> tokenizer;
  if (!o.prompt_text.empty() || ((o.json || !o.ids) && kiln::Tokenizer::exists_in(o.dir)))
    tokenizer = kiln::Tokenizer::from_dir(o.dir);
  std::optional<kiln::TextStream> text;
  if (tokenizer && !o.ids && !o.json) text.emplace(*tokenizer);
  // As text, the prompt comes first (Whisper's is special tokens: nothing shows).
  auto show_prompt = [&](const std::vector<int64_t>& prompt) {
    for (const int64_t t : prompt) std::cout << (text ? text->push(t) : "");
  };
  if (!o.json) {
    gen.on_token = [&](int64_t token, const kiln::StepStats&) {
      if (text) {
        std::cout << text->push(token) << std::flush;
      } else {
        std::cout << token << " " << std::flush;
      }
      return true;
    };
  }

  const auto t0 = std::chrono::steady_clock::now();
  kiln::GenerationResult result;
  const bool seq2seq = fs::exists(dir / "encoder_model.onnx");
  if (seq2seq) {
    if (!o.prompt_ids.empty() || !o.prompt_text.empty())
      throw UsageError("--prompt-ids/--prompt are for decoder-only models");
    kiln::Seq2SeqGenerator g(o.dir, go);
    kiln::Tensor features;
    if (!o.features.empty()) {
      features = kiln::tooling::read_npy(o.features);
    } else {
      const std::string audio = !o.audio.empty() ? o.audio : (dir / "sample.wav").string();
      if (o.audio.empty() && !fs::exists(audio) && fs::exists(dir / "sample_features.npy")) {
        features = kiln::tooling::read_npy((dir / "sample_features.npy").string());
      } else {
        features = kiln::whisper_log_mel(kiln::read_audio(audio));
      }
    }
    show_prompt(g.decoder_prompt());
    result = g.generate(features, gen);
  } else if (fs::exists(dir / "model.onnx")) {
    if (!o.audio.empty() || !o.features.empty())
      throw UsageError("--audio/--features are for encoder-decoder models");
    std::vector<int64_t> prompt;
    if (!o.prompt_ids.empty()) {
      prompt = o.prompt;
    } else if (!o.prompt_text.empty()) {
      prompt = tokenizer->encode(o.prompt_text);
    } else if (expected.contains("prompt")) {
      prompt = ints("prompt");
    } else {
      throw UsageError("no --prompt, no --prompt-ids and no prompt in expected_tokens.json");
    }
    kiln::CausalLmGenerator g(o.dir, go);
    show_prompt(prompt);
    result = g.generate(prompt, gen);
  } else {
    throw kiln::Error(kiln::ErrorKind::Io,
                      "neither encoder_model.onnx nor model.onnx in the folder")
        .with_file(o.dir);
  }
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Compare with the reference when it was made with the same settings (greedy, same input).
  bool compared = false, matches = false;
  if (expected.contains("tokens") && !o.sample && o.audio.empty() && o.features.empty() &&
      o.prompt_ids.empty() && o.prompt_text.empty() && o.max_new < 0) {
    compared = true;
    matches = ints("tokens") == result.tokens;
  }

  double decode_ms = 0;
  for (const auto& s : result.steps) decode_ms += s.ms;
  if (o.json) {
    Json steps = Json::array();
    for (const auto& st : result.steps) {
      steps.push_back({{"past_len", st.past_len},
                       {"ms", st.ms},
                       {"bytes_copied", st.bytes_copied},
                       {"allocations", st.allocations}});
    }
    Json j;
    j["tokens"] = result.tokens;
    j["prompt"] = result.prompt;
    j["text"] = tokenizer ? Json(tokenizer->decode(result.tokens)) : Json(nullptr);
    j["encoder_ms"] = result.encoder_ms;
    j["total_ms"] = total_ms;
    j["matches_expected"] = compared ? Json(matches) : Json(nullptr);
    j["steps"] = std::move(steps);
    kiln::tooling::write_json(std::cout, j);
  } else {
    const double per_token =
        result.tokens.empty() ? 0 : decode_ms / static_cast<double>(result.tokens.size());
    if (text) std::cout << text->finish();
    std::cout << "\n"
              << result.tokens.size() << " tokens in " << decode_ms << " ms ("
              << (per_token > 0 ? 1000.0 / per_token : 0) << " tokens/s, " << per_token
              << " ms/token)";
    if (seq2seq) std::cout << ", encoder " << result.encoder_ms << " ms";
    std::cout << "\n";
    if (compared)
      std::cout << (matches ? "matches expected_tokens.json" : "DIFFERS from expected_tokens.json")
                << "\n";
  }
  return compared && !matches ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Runs a decode loop on an Optimum export folder, streaming tokens.",
               "kiln-generate");
  define_options(app, o);
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  if (o.dir.empty()) return kiln::tooling::usage_error(app, "no model folder given");
  if (!o.audio.empty() + !o.features.empty() + !o.prompt_ids.empty() + !o.prompt_text.empty() > 1) {
    return kiln::tooling::usage_error(
        app, "give at most one of --audio, --features, --prompt-ids, --prompt");
  }
  try {
    if (!o.prompt_ids.empty())
      o.prompt = kiln::tooling::parse_int_list<int64_t>("--prompt-ids", o.prompt_ids, 0);
    return run(o);
  } catch (const UsageError& e) {
    return kiln::tooling::usage_error(app, e.what());
  } catch (const std::exception& e) {
    std::cerr << "\nkiln-generate: " << e.what() << "\n";
    return 2;
  }
}
