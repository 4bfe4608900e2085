// WhisperTranscriber against transformers' generate() on the committed random Whisper
// (models/whisper-tiny-random/expected_transcripts.json, made by tools/export/make_whisper.py):
// decoder prompts, tokens, text and segments for greedy decoding, language detection,
// translation, timestamps, beam search, an initial prompt and 70 s of long-form audio.
#include <cmath>
#include <filesystem>
#include <string>

#include "engine/util/json_file.h"
#include "kiln/audio.h"
#include "kiln/error.h"
#include "kiln/transcribe.h"
#include "test/unit/op_test.h"

using namespace kiln;
namespace js = kiln::json;

namespace {

const std::string kWhisper = std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random";

std::vector<int64_t> ints(const js::Json& v) {
  std::vector<int64_t> out;
  for (const auto& x : v) out.push_back(x.get<int64_t>());
  return out;
}

// The options transformers' generate() was called with.
TranscribeOptions options_of(const js::Json& kwargs) {
  TranscribeOptions o;
  if (kwargs.contains("language")) o.language = kwargs["language"].get<std::string>();
  if (kwargs.contains("task")) o.task = kwargs["task"].get<std::string>();
  if (kwargs.contains("return_timestamps")) o.timestamps = kwargs["return_timestamps"].get<bool>();
  if (kwargs.contains("max_new_tokens")) o.max_new_tokens = kwargs["max_new_tokens"].get<int64_t>();
  if (kwargs.contains("num_beams")) o.num_beams = kwargs["num_beams"].get<int64_t>();
  if (kwargs.contains("prompt_ids")) o.prompt = kwargs["prompt_ids"].get<std::string>();
  if (kwargs.contains("condition_on_prev_tokens"))
    o.condition_on_prev_tokens = kwargs["condition_on_prev_tokens"].get<bool>();
  return o;
}

Tensor features_of(const js::Json& c) {
  const std::vector<float> samples = read_audio(kWhisper + "/" + c["input"].get<std::string>());
  return c["feature_extractor_call"].contains("truncation") ? whisper_log_mel_long(samples)
                                                            : whisper_log_mel(samples);
}

}  // namespace

TEST_CASE("Whisper transcription matches transformers' generate() case by case",
          "[transcribe][whisper]") {
  const js::Json refs = js::read_file(kWhisper + "/expected_transcripts.json");
  WhisperTranscriber whisper(kWhisper);
  REQUIRE(whisper.has_tokenizer());
  REQUIRE(whisper.multilingual());
  REQUIRE(refs["cases"].size() >= 8);
  for (const js::Json& c : refs["cases"]) {
    const std::string name = c["name"].get<std::string>();
    INFO("case " << name);
    const Tensor features = features_of(c);
    CHECK(features.dim(2) == c["input_frames"].get<int64_t>());
    const Transcript t = whisper.transcribe_features(features, options_of(c["generate_kwargs"]));
    CHECK(t.prompt == ints(c["decoder_prompt"]));
    CHECK(t.tokens == ints(c["sequence"]));
    CHECK(t.text == c["text"].get<std::string>());
    if (c.contains("detected_language"))
      CHECK(t.language == c["detected_language"].get<std::string>());
    if (c.contains("segments")) {
      REQUIRE(t.segments.size() == c["segments"].size());
      for (size_t i = 0; i < t.segments.size(); ++i) {
        const js::Json& s = c["segments"][i];
        CHECK(t.segments[i].tokens == ints(s["tokens"]));
        CHECK(std::abs(t.segments[i].start - s["start"].get<double>()) < 1e-9);
        CHECK(std::abs(t.segments[i].end - s["end"].get<double>()) < 1e-9);
        CHECK(t.segments[i].text == s["text"].get<std::string>());
      }
    }
    // One encoder run per decoded window (plus none for language detection: it reuses the
    // first window's).
    CHECK(t.encoder_runs == static_cast<int64_t>(c["windows"].size()));
  }
}

TEST_CASE("Whisper streams text and reports per-token log-probabilities", "[transcribe][whisper]") {
  WhisperTranscriber whisper(kWhisper);
  const Tensor features = whisper_log_mel(read_audio(kWhisper + "/sample.wav"));
  TranscribeOptions o;
  o.language = "en";
  o.max_new_tokens = 30;
  std::string streamed;
  int pieces = 0;
  o.on_text = [&](const std::string& piece) {
    streamed += piece;
    ++pieces;
    return true;
  };
  const Transcript t = whisper.transcribe_features(features, o);
  CHECK(pieces > 1);
  CHECK(streamed == t.text);  // this tokenizer config does no clean-up of spaces
  REQUIRE(t.segments.size() == 1);
  REQUIRE(t.segments[0].token_logprobs.size() == t.segments[0].tokens.size());
  double sum = 0;
  for (float lp : t.segments[0].token_logprobs) {
    CHECK(lp <= 0);
    sum += lp;
  }
  // The average includes the end-of-text token when there is one (openai-whisper's rule).
  if (t.tokens.size() == 30) CHECK(std::abs(t.segments[0].avg_logprob - sum / 30) < 1e-9);
  // Stopping from the callback ends the transcription early.
  int calls = 0;
  o.on_text = [&](const std::string&) { return ++calls < 3; };
  const Transcript cut = whisper.transcribe_features(features, o);
  CHECK(calls == 3);
  CHECK(cut.tokens.size() < t.tokens.size());
}

TEST_CASE("Whisper options are checked with one clear error", "[transcribe][whisper]") {
  WhisperTranscriber whisper(kWhisper);
  const Tensor features = whisper_log_mel(read_audio(kWhisper + "/sample.wav"));
  auto error_of = [&](TranscribeOptions o) -> std::string {
    try {
      whisper.transcribe_features(features, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TranscribeOptions o;
  o.language = "klingon";
  CHECK_THAT(error_of(o), Catch::Contains("unknown language 'klingon'"));
  o.language = "italian";  // a Whisper language this model's vocabulary lacks
  CHECK_THAT(error_of(o), Catch::Contains("not one this model knows"));
  o = {};
  o.task = "summarize";
  CHECK_THAT(error_of(o), Catch::Contains("unknown task 'summarize'"));
  o = {};
  o.num_beams = 0;
  CHECK_THAT(error_of(o), Catch::Contains("num_beams"));
  o = {};
  o.no_speech_threshold = 0.6;
  CHECK_THAT(error_of(o), Catch::Contains("needs a log-probability"));
  o = {};
  o.max_new_tokens = 446;
  CHECK_THAT(error_of(o), Catch::Contains("exceed the model's 448"));
  o = {};
  o.prompt = "a";
  o.prompt_ids = {496, 1};
  CHECK_THAT(error_of(o), Catch::Contains("not both"));
  CHECK_THROWS_AS(whisper.transcribe_features(Tensor::zeros(DataType::Float, {80, 3000}), {}),
                  Error);
  CHECK_THROWS_AS(WhisperTranscriber(kWhisper + "/missing"), Error);
}

// The real Whisper tiny.en (models/cache/whisper-tiny.en, made on demand by
// tools/export/make_whisper_real.py from a PyPI wheel; not committed): speech made with
// espeak-ng in WAV, FLAC, Ogg, MP3 and 70 s of long form, against transformers' pipeline.
TEST_CASE("real Whisper tiny.en: kiln's text and tokens are transformers' pipeline's",
          "[transcribe][whisper-real]") {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/models/cache/whisper-tiny.en";
  if (!std::filesystem::exists(dir + "/references.json")) {
    WARN("KILN-SKIP: no " << dir
                          << "/references.json; make it with: make whisper-real "
                             "(models/README.md)");
    return;
  }
  const js::Json refs = js::read_file(dir + "/references.json");
  WhisperTranscriber whisper(dir);
  REQUIRE(!whisper.multilingual());
  for (auto file = refs["files"].begin(); file != refs["files"].end(); ++file) {
    const std::vector<float> samples = read_audio(dir + "/audio/" + file.key());
    for (auto result = file.value()["results"].begin(); result != file.value()["results"].end();
         ++result) {
      INFO(file.key() << ", " << result.key());
      const js::Json& r = result.value();
      TranscribeOptions o;
      o.timestamps = result.key() == "timestamps" || samples.size() > 30 * 16000;
      o.num_beams = result.key() == "beam3" ? 3 : result.key() == "pipeline_default" ? 5 : 1;
      const Transcript t = whisper.transcribe(samples, o);
      CHECK(t.tokens == ints(r["generate_tokens"]));
      CHECK(t.text == r["text"].get<std::string>());
      if (r.contains("generate_segments")) {
        REQUIRE(t.segments.size() == r["generate_segments"].size());
        for (size_t i = 0; i < t.segments.size(); ++i) {
          const js::Json& s = r["generate_segments"][i];
          CHECK(t.segments[i].tokens == ints(s["tokens"]));
          CHECK(std::abs(t.segments[i].start - s["start"].get<double>()) < 1e-6);
          CHECK(std::abs(t.segments[i].end - s["end"].get<double>()) < 1e-6);
        }
      }
    }
  }
}

TEST_CASE("Whisper falls back to higher temperatures and skips silent windows",
          "[transcribe][whisper]") {
  WhisperTranscriber whisper(kWhisper);
  const Tensor features = whisper_log_mel(read_audio(kWhisper + "/sample.wav"));
  TranscribeOptions o;
  o.language = "en";
  o.max_new_tokens = 20;
  const Transcript greedy = whisper.transcribe_features(features, o);
  REQUIRE(greedy.segments.size() == 1);
  const TranscriptSegment& g = greedy.segments[0];
  CHECK(g.temperature == 0);
  CHECK(g.compression_ratio > 0);

  // Thresholds the greedy result passes: no fallback, the same tokens.
  o.temperatures = {0.0f, 0.5f, 1.0f};
  o.compression_ratio_threshold = g.compression_ratio + 1;
  o.logprob_threshold = g.avg_logprob - 1;
  Transcript t = whisper.transcribe_features(features, o);
  CHECK(t.fallbacks == 0);
  CHECK(t.tokens == greedy.tokens);

  // A threshold nothing passes: every temperature is tried and the last result is kept.
  o.compression_ratio_threshold = 0.01;
  o.best_of = 3;
  o.seed = 5;
  t = whisper.transcribe_features(features, o);
  CHECK(t.fallbacks == 2);
  REQUIRE(t.segments.size() == 1);
  CHECK(t.segments[0].temperature == 1.0f);
  // Sampling is reproducible from the seed.
  CHECK(whisper.transcribe_features(features, o).tokens == t.tokens);

  // A window judged silent (no-speech probability over the threshold and a failed
  // log-probability threshold) is skipped: no segment.
  o = {};
  o.language = "en";
  o.max_new_tokens = 20;
  o.logprob_threshold = 0.0;  // every decode fails it
  o.no_speech_threshold = 0.0;
  t = whisper.transcribe_features(features, o);
  CHECK(t.segments.empty());
  CHECK(t.tokens.empty());
  o.no_speech_threshold = 1.0;  // never silent: the result stays
  CHECK(whisper.transcribe_features(features, o).tokens == greedy.tokens);
}
