// kiln-generate: run a decode loop on an Optimum export folder (Whisper-style seq2seq or a
// decoder-only LM), streaming tokens and reporting per-step time and bytes copied.
//
// Exit status: 0 ok, 2 any error (missing file, model not following Optimum's naming, bad
// audio), with a one-line message.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/generate/json.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "tools/common/json.h"
#include "tools/common/npy.h"

namespace {

namespace fs = std::filesystem;
using kiln::tooling::JsonWriter;

constexpr const char* kUsage =
    "usage: kiln-generate MODEL_DIR [--audio FILE.wav | --features FILE.npy | --prompt-ids 1,2,3]\n"
    "                     [--max-new-tokens N] [--min-new-tokens N] [--threads N]\n"
    "                     [--sampling greedy|sample] [--temperature T] [--top-k K] [--top-p P]\n"
    "                     [--seed S] [--decoder-pair] [--json]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string dir, audio, features, prompt_ids;
  int64_t max_new = -1, min_new = 0;
  int threads = 0;
  bool sample = false, decoder_pair = false, json = false;
  float temperature = 1.0f, top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
};

template <typename T>
T number(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    T x;
    if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(std::stod(v, &used));
    } else {
      x = static_cast<T>(std::stoll(v, &used));
    }
    if (used != v.size()) throw UsageError("");
    return x;
  } catch (const std::exception&) {
    throw UsageError(flag + " needs a number, got '" + v + "'");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--audio")
      o.audio = value();
    else if (a == "--features")
      o.features = value();
    else if (a == "--prompt-ids")
      o.prompt_ids = value();
    else if (a == "--max-new-tokens")
      o.max_new = number<int64_t>(a, value());
    else if (a == "--min-new-tokens")
      o.min_new = number<int64_t>(a, value());
    else if (a == "--threads")
      o.threads = number<int>(a, value());
    else if (a == "--sampling") {
      const std::string s = value();
      if (s != "greedy" && s != "sample") throw UsageError("--sampling is greedy or sample");
      o.sample = s == "sample";
    } else if (a == "--temperature")
      o.temperature = number<float>(a, value());
    else if (a == "--top-k")
      o.top_k = number<int64_t>(a, value());
    else if (a == "--top-p")
      o.top_p = number<float>(a, value());
    else if (a == "--seed")
      o.seed = number<uint64_t>(a, value());
    else if (a == "--decoder-pair")
      o.decoder_pair = true;
    else if (a == "--json")
      o.json = true;
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (!a.empty() && a[0] == '-')
      throw UsageError("unknown option '" + a + "'");
    else if (o.dir.empty())
      o.dir = a;
    else
      throw UsageError("unexpected argument '" + a + "'");
  }
  if (o.dir.empty()) throw UsageError("no model folder given");
  if (!o.audio.empty() + !o.features.empty() + !o.prompt_ids.empty() > 1) {
    throw UsageError("give at most one of --audio, --features, --prompt-ids");
  }
  return o;
}

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(number<int64_t>("--prompt-ids", item));
  if (ids.empty()) throw UsageError("--prompt-ids is empty");
  return ids;
}

int run(const Options& o) {
  const fs::path dir = o.dir;
  if (!fs::is_directory(dir))
    throw kiln::Error(kiln::ErrorKind::Io, "not a folder").with_file(o.dir);
  const fs::path expected_file = dir / "expected_tokens.json";
  kiln::json::Value expected;
  if (fs::exists(expected_file)) expected = kiln::json::parse_file(expected_file.string());

  kiln::GeneratorOptions go;
  go.environment = std::make_shared<kiln::Environment>(o.threads);
  go.use_decoder_pair = o.decoder_pair;
  kiln::GenerationOptions gen;
  gen.max_new_tokens = o.max_new;
  if (gen.max_new_tokens < 0 && expected.find("max_new_tokens")) {
    gen.max_new_tokens = expected.find("max_new_tokens")->as_int();  // the length of the reference
  }
  gen.min_new_tokens = o.min_new;
  gen.do_sample = o.sample;
  gen.temperature = o.temperature;
  gen.top_k = o.top_k;
  gen.top_p = o.top_p;
  gen.seed = o.seed;
  if (!o.json) {
    gen.on_token = [](int64_t token, const kiln::StepStats&) {
      std::cout << token << " " << std::flush;
      return true;
    };
  }

  const auto t0 = std::chrono::steady_clock::now();
  kiln::GenerationResult result;
  const bool seq2seq = fs::exists(dir / "encoder_model.onnx");
  if (seq2seq) {
    if (!o.prompt_ids.empty()) throw UsageError("--prompt-ids is for decoder-only models");
    kiln::Seq2SeqGenerator g(o.dir, go);
    kiln::Tensor features;
    if (!o.features.empty()) {
      features = kiln::tooling::read_npy(o.features);
    } else {
      const std::string wav = !o.audio.empty() ? o.audio : (dir / "sample.wav").string();
      if (o.audio.empty() && !fs::exists(wav) && fs::exists(dir / "sample_features.npy")) {
        features = kiln::tooling::read_npy((dir / "sample_features.npy").string());
      } else {
        features = kiln::whisper_log_mel(kiln::read_wav_16k_mono(wav));
      }
    }
    result = g.generate(features, gen);
  } else if (fs::exists(dir / "model.onnx")) {
    if (!o.audio.empty() || !o.features.empty())
      throw UsageError("--audio/--features are for encoder-decoder models");
    std::vector<int64_t> prompt;
    if (!o.prompt_ids.empty()) {
      prompt = parse_ids(o.prompt_ids);
    } else if (const auto* p = expected.find("prompt")) {
      for (const auto& v : p->as_array()) prompt.push_back(v.as_int());
    } else {
      throw UsageError("no --prompt-ids and no prompt in expected_tokens.json");
    }
    kiln::CausalLmGenerator g(o.dir, go);
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
  if (const auto* want = expected.find("tokens"); want && !o.sample && o.audio.empty() &&
                                                  o.features.empty() && o.prompt_ids.empty() &&
                                                  o.max_new < 0) {
    std::vector<int64_t> w;
    for (const auto& v : want->as_array()) w.push_back(v.as_int());
    compared = true;
    matches = w == result.tokens;
  }

  double decode_ms = 0;
  for (const auto& s : result.steps) decode_ms += s.ms;
  if (o.json) {
    JsonWriter j(std::cout);
    j.begin_object();
    j.key("tokens").begin_array();
    for (int64_t t : result.tokens) j.value(t);
    j.end_array();
    j.key("prompt").begin_array();
    for (int64_t t : result.prompt) j.value(t);
    j.end_array();
    j.field("encoder_ms", result.encoder_ms);
    j.field("total_ms", total_ms);
    if (compared) {
      j.field("matches_expected", matches);
    } else {
      j.key("matches_expected").null();
    }
    j.key("steps").begin_array();
    for (const auto& s : result.steps) {
      j.begin_object();
      j.field("past_len", s.past_len).field("ms", s.ms).field("bytes_copied", s.bytes_copied);
      j.field("allocations", s.allocations);
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::cout << "\n";
  } else {
    const double per_token =
        result.tokens.empty() ? 0 : decode_ms / static_cast<double>(result.tokens.size());
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
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "kiln-generate: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const kiln::Error& e) {
    std::cerr << "\nkiln-generate: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "\nkiln-generate: " << e.what() << "\n";
    return 2;
  }
}
