// kiln-transcribe: speech to text with a Whisper export, as whisper.cpp's whisper-cli and
// transformers' ASR pipeline do it: text on stdout (txt, srt, vtt or json), a progress line
// with tokens/s and the real-time factor on stderr when it is a terminal.
//
// Exit status: 0 ok, 2 any error (missing model file, unreadable audio, unknown language),
// with a one-line message.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/audio.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "kiln/transcribe.h"
#include "tools/common/cli.h"
#include "tools/common/json_output.h"
#include "tools/common/npy.h"
#include "tools/common/options.h"

namespace {

using kiln::tooling::Json;
using kiln::tooling::UsageError;

enum class Format { Txt, Srt, Vtt, Json };

struct Options {
  std::string dir, audio;
  std::string language, task;
  bool timestamps = false, features = false, strict_audio = false;
  int64_t beams = 5, best_of = 1, max_new = -1;
  std::vector<float> temperatures = {0.0f};  // the first; the rest come from the increment
  double temperature_increment = 0;
  std::optional<double> compression_ratio, logprob, no_speech;
  bool condition = false;
  std::string prompt, prompt_ids;
  Format format = Format::Txt;
  int threads = 0;
  uint64_t seed = 0;
  kiln::WeightPrecision weights = kiln::WeightPrecision::Float32;
  std::string vad;
  kiln::VadOptions vad_options;
};

void define_options(CLI::App& app, Options& o) {
  using namespace kiln::tooling;
  configure(app);
  app.add_option("MODEL_DIR", o.dir, "a Whisper export folder (Optimum's layout)")->type_name("");
  app.add_option("AUDIO", o.audio, "an audio file (WAV, FLAC, OGG, MP3; any rate and channels)")
      ->type_name("");
  app.add_flag("--strict-audio", o.strict_audio,
               "a truncated audio file is an error (by default a warning: what decodes is read)");
  app.add_flag("--features", o.features,
               "AUDIO is log-mel features in a .npy file [1, mels, frames] instead");
  app.add_option("--language", o.language,
                 "language code or name, or 'auto' to detect (multilingual models)")
      ->type_name("xx|auto");
  add_choice(
      app, "--task", o.task,
      [](const std::string& v) -> std::optional<std::string> {
        if (v == "transcribe" || v == "translate") return v;
        return std::nullopt;
      },
      "transcribe or translate", "transcribe (default) or translate to English");
  app.add_flag("--timestamps", o.timestamps, "segments with start and end times");
  add_int<int64_t>(app, "--beams", o.beams, 1,
                   "beam search with N beams (default 5, as transformers' ASR pipeline; 1: greedy)",
                   64);
  add_int<int64_t>(app, "--best-of", o.best_of, 1,
                   "samples per fallback temperature; the likeliest is kept (default 1)", 64);
  add_number(app, "--temperature", o.temperatures[0], 0,
             "first decoding temperature (default 0: greedy or beams)");
  add_number(app, "--temperature-increment", o.temperature_increment, 0,
             "fall back to higher temperatures by this step up to 1.0 when a window fails "
             "the thresholds (openai-whisper: 0.2; default 0: no fallback)");
  app.add_option_function<std::string>(
         "--compression-ratio-threshold",
         [&o](const std::string& v) {
           o.compression_ratio = parse_number("--compression-ratio-threshold", v, 0);
         },
         "fall back when the text's zlib compression ratio is above this (e.g. 2.4)")
      ->type_name("X");
  app.add_option_function<std::string>(
         "--logprob-threshold",
         [&o](const std::string& v) {
           o.logprob = -parse_number("--logprob-threshold (as a positive magnitude)",
                                     v.rfind('-', 0) == 0 ? v.substr(1) : v, 0);
         },
         "fall back when the average log-probability is below this (e.g. -1.0)")
      ->type_name("X");
  app.add_option_function<std::string>(
         "--no-speech-threshold",
         [&o](const std::string& v) { o.no_speech = parse_number("--no-speech-threshold", v, 0); },
         "skip a window whose no-speech probability is above this and that fails the "
         "log-probability threshold (e.g. 0.6)")
      ->type_name("X");
  app.add_flag("--condition-on-previous", o.condition,
               "feed each window the text of the previous ones (long audio)");
  app.add_option("--prompt", o.prompt, "an initial prompt (text; needs the tokenizer)")
      ->type_name("TEXT");
  app.add_option("--prompt-ids", o.prompt_ids,
                 "an initial prompt as token ids, <|startofprev|> first, comma-separated")
      ->type_name("1,2,3");
  add_int<int64_t>(app, "--max-new-tokens", o.max_new, 0, "tokens per 30-s window at most");
  add_choice(
      app, "--format", o.format,
      [](const std::string& v) -> std::optional<Format> {
        if (v == "txt") return Format::Txt;
        if (v == "srt") return Format::Srt;
        if (v == "vtt") return Format::Vtt;
        if (v == "json") return Format::Json;
        return std::nullopt;
      },
      "txt, srt, vtt or json", "output: txt (default), srt, vtt or json");
  add_int(app, "--threads", o.threads, 1, "thread pool size (default: one per core)");
  add_int<uint64_t>(app, "--seed", o.seed, 0, "random seed for sampling (default 0)");
  add_choice(app, "--weights", o.weights, parse_gemm_weights, kGemmWeightsChoices,
             "precision of the encoder's and decoder's packed MatMul/Gemm weights: f32 "
             "(default), bf16, f16 or int8 (per-column int8, activations quantized per row)");
  app.add_option("--vad", o.vad,
                 "a Silero VAD ONNX model (faster-whisper's silero_vad_v6.onnx, or the "
                 "silero-vad package's): transcribe only the speech it finds")
      ->type_name("MODEL.onnx");
  kiln::VadOptions& v = o.vad_options;
  add_number(app, "--vad-threshold", v.threshold, 0, "speech probability threshold (default 0.5)");
  add_number(app, "--vad-neg-threshold", v.neg_threshold, 0,
             "silence below this probability (default: threshold - 0.15)");
  add_int<int64_t>(app, "--vad-min-speech-ms", v.min_speech_duration_ms, 0,
                   "shorter speech is dropped (default 250)");
  add_number(app, "--vad-max-speech-s", v.max_speech_duration_s, 0,
             "longer speech is split (default: no limit)");
  add_int<int64_t>(app, "--vad-min-silence-ms", v.min_silence_duration_ms, 0,
                   "shorter silences do not end speech (default 2000)");
  add_int<int64_t>(app, "--vad-pad-ms", v.speech_pad_ms, 0,
                   "padding on each side of speech (default 400)");
}

// "00:01:02,345" (srt) or "00:01:02.345" (vtt).
std::string clock_time(double seconds, char separator) {
  const auto ms = static_cast<int64_t>(std::llround(seconds * 1000));
  std::ostringstream s;
  s << std::setfill('0') << std::setw(2) << ms / 3600000 << ':' << std::setw(2) << ms / 60000 % 60
    << ':' << std::setw(2) << ms / 1000 % 60 << separator << std::setw(3) << ms % 1000;
  return s.str();
}

// A segment's text, or its token ids when the model folder has no tokenizer.
std::string segment_text(const kiln::TranscriptSegment& s) {
  if (!s.text.empty() || s.tokens.empty()) return s.text;
  std::string ids;
  for (int64_t t : s.tokens) ids += (ids.empty() ? "" : " ") + std::to_string(t);
  return ids;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\n") - a + 1);
}

void print(const kiln::Transcript& t, const Options& o, bool has_text) {
  switch (o.format) {
    case Format::Txt:
      if (o.timestamps) {
        for (const auto& s : t.segments) {
          std::cout << "[" << clock_time(s.start, '.') << " --> " << clock_time(s.end, '.') << "]  "
                    << trim(segment_text(s)) << "\n";
        }
      } else if (has_text) {
        std::cout << t.text << "\n";  // as transformers' pipeline gives it (leading space kept)
      } else {
        for (const auto& s : t.segments) std::cout << segment_text(s) << "\n";
      }
      break;
    case Format::Srt: {
      int n = 1;
      for (const auto& s : t.segments) {
        std::cout << n++ << "\n"
                  << clock_time(s.start, ',') << " --> " << clock_time(s.end, ',') << "\n"
                  << trim(segment_text(s)) << "\n\n";
      }
      break;
    }
    case Format::Vtt:
      std::cout << "WEBVTT\n\n";
      for (const auto& s : t.segments) {
        std::cout << clock_time(s.start, '.') << " --> " << clock_time(s.end, '.') << "\n"
                  << trim(segment_text(s)) << "\n\n";
      }
      break;
    case Format::Json: {
      Json segs = Json::array();
      for (const auto& s : t.segments) {
        segs.push_back({{"start", s.start},
                        {"end", s.end},
                        {"text", s.text},
                        {"tokens", s.tokens},
                        {"token_logprobs", s.token_logprobs},
                        {"temperature", s.temperature},
                        {"avg_logprob", s.avg_logprob},
                        {"compression_ratio", s.compression_ratio},
                        {"no_speech_prob", s.no_speech_prob}});
      }
      Json j;
      j["text"] = t.text;
      j["language"] = t.language;
      j["prompt"] = t.prompt;
      j["tokens"] = t.tokens;
      j["segments"] = std::move(segs);
      if (!o.vad.empty()) {
        Json regions = Json::array();
        for (const kiln::SpeechRegion& r : t.speech_regions)
          regions.push_back({{"start", static_cast<double>(r.start) / 16000.0},
                             {"end", static_cast<double>(r.end) / 16000.0}});
        j["speech_regions"] = std::move(regions);
      }
      j["encoder_runs"] = t.encoder_runs;
      j["decoder_steps"] = t.decoder_steps;
      j["fallbacks"] = t.fallbacks;
      j["encoder_ms"] = t.encoder_ms;
      j["decoder_ms"] = t.decoder_ms;
      kiln::tooling::write_json(std::cout, j);
      break;
    }
  }
}

int run(Options& o) {
  kiln::GeneratorOptions go;
  go.environment = std::make_shared<kiln::Environment>(o.threads);
  go.gemm_weights = o.weights;
  kiln::WhisperTranscriber whisper(o.dir, go);

  kiln::TranscribeOptions t;
  t.language = o.language;
  t.task = o.task;
  t.timestamps = o.timestamps;
  t.num_beams = o.beams;
  t.best_of = o.best_of;
  // The first temperature, then openai-whisper's schedule of increments up to 1.0.
  t.temperatures = {o.temperatures[0]};
  for (int i = 1; o.temperature_increment > 0; ++i) {
    const double x = o.temperatures[0] + i * o.temperature_increment;
    if (x > 1.0 + 1e-6) break;
    t.temperatures.push_back(static_cast<float>(x));
  }
  t.compression_ratio_threshold = o.compression_ratio;
  t.logprob_threshold = o.logprob;
  t.no_speech_threshold = o.no_speech;
  t.condition_on_prev_tokens = o.condition;
  t.prompt = o.prompt;
  if (!o.prompt_ids.empty())
    t.prompt_ids = kiln::tooling::parse_int_list<int64_t>("--prompt-ids", o.prompt_ids, 0);
  t.max_new_tokens = o.max_new;
  t.seed = o.seed;
  if (!o.vad.empty()) {
    if (o.features) throw UsageError("--vad takes audio, not --features");
    kiln::SessionOptions vo;
    vo.environment = go.environment;
    t.vad = std::make_shared<kiln::VoiceActivityDetector>(o.vad, vo);
    t.vad_options = o.vad_options;
  }

  const bool progress = isatty(STDERR_FILENO) != 0;
  double audio_seconds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  kiln::Transcript result;
  if (o.features) {
    const kiln::Tensor f = kiln::tooling::read_npy(o.audio);
    audio_seconds = f.rank() == 3 ? static_cast<double>(f.dim(2)) * 0.01 : 0;
    result = whisper.transcribe_features(f, t);
  } else {
    std::string truncated;
    const std::vector<float> samples =
        kiln::read_audio(o.audio, 16000, o.strict_audio ? nullptr : &truncated);
    if (!truncated.empty()) std::cerr << "kiln-transcribe: warning: " << truncated << "\n";
    audio_seconds = static_cast<double>(samples.size()) / 16000.0;
    if (progress) {
      t.on_segment = [&](const kiln::TranscriptSegment& s) {
        std::cerr << "\rkiln-transcribe: " << std::fixed << std::setprecision(1) << s.end << " / "
                  << audio_seconds << " s" << std::flush;
        return true;
      };
    }
    result = whisper.transcribe(samples, t);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  print(result, o, whisper.has_tokenizer());
  if (progress) {
    std::cerr << "\rkiln-transcribe: " << result.tokens.size() << " tokens, " << std::fixed
              << std::setprecision(1)
              << (result.decoder_ms > 0
                      ? 1000.0 * static_cast<double>(result.decoder_steps) / result.decoder_ms
                      : 0.0)
              << " tokens/s, real-time factor " << std::setprecision(3)
              << (audio_seconds > 0 ? seconds / audio_seconds : 0.0) << " (" << std::setprecision(2)
              << seconds << " s for " << audio_seconds << " s of audio)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Transcribes speech with a Whisper export: text on stdout.", "kiln-transcribe");
  define_options(app, o);
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  if (o.dir.empty()) return kiln::tooling::usage_error(app, "no model folder given");
  if (o.audio.empty()) return kiln::tooling::usage_error(app, "no audio file given");
  if (!o.prompt.empty() && !o.prompt_ids.empty())
    return kiln::tooling::usage_error(app, "give --prompt or --prompt-ids, not both");
  try {
    return run(o);
  } catch (const UsageError& e) {
    return kiln::tooling::usage_error(app, e.what());
  } catch (const std::exception& e) {
    std::cerr << "kiln-transcribe: " << e.what() << "\n";
    return 2;
  }
}
