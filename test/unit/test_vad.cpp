// Voice-activity detection: faster-whisper's region rules on given probabilities, the time
// map, a VAD-shaped model whose probabilities follow the energy of each window
// (models/vad-energy, tools/export/make_vad_test.py), and transcription through it.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/util/json_file.h"
#include "kiln/error.h"
#include "kiln/transcribe.h"
#include "kiln/vad.h"
#include "test/unit/op_test.h"

using namespace kiln;

namespace {

const std::string kVad = std::string(KILN_SOURCE_DIR) + "/models/vad-energy/model.onnx";

// Window probabilities: 1 in [from, to) of each span, 0 elsewhere, `windows` in all.
std::vector<float> bursts(int64_t windows, const std::vector<std::pair<int64_t, int64_t>>& on) {
  std::vector<float> p(static_cast<size_t>(windows), 0.0f);
  for (const auto& [from, to] : on)
    for (int64_t i = from; i < to; ++i) p[static_cast<size_t>(i)] = 1.0f;
  return p;
}

// A 440 Hz tone of amplitude 0.5 over [from, to) seconds of `seconds` of silence.
std::vector<float> tone(double seconds, const std::vector<std::pair<double, double>>& on) {
  std::vector<float> s(static_cast<size_t>(seconds * 16000), 0.0f);
  for (const auto& [from, to] : on)
    for (auto i = static_cast<size_t>(from * 16000); i < static_cast<size_t>(to * 16000); ++i)
      s[i] = 0.5f * static_cast<float>(std::sin(2 * M_PI * 440.0 * static_cast<double>(i) / 16000));
  return s;
}

}  // namespace

TEST_CASE("speech regions follow faster-whisper's rules", "[vad]") {
  const VadOptions o;  // threshold 0.5, 250 ms, 2 s of silence, 400 ms of padding
  const int64_t n = 400 * 512;
  // Windows 10-39: the region starts at window 10 (less the padding, at most to 0) and ends
  // where the silence began, 2 s of it later, plus the padding.
  auto one = speech_regions_from_probabilities(bursts(400, {{10, 40}}), n, o);
  REQUIRE(one.size() == 1);
  CHECK(one[0].start == 0);
  CHECK(one[0].end == 40 * 512 + 6400);
  // A silence of 1 s does not end it.
  auto joined = speech_regions_from_probabilities(bursts(400, {{10, 40}, {71, 101}}), n, o);
  REQUIRE(joined.size() == 1);
  CHECK(joined[0].end == 101 * 512 + 6400);
  // One of 3 s does; each side is padded.
  auto two = speech_regions_from_probabilities(bursts(400, {{10, 40}, {134, 164}}), n, o);
  REQUIRE(two.size() == 2);
  CHECK(two[0].end == 40 * 512 + 6400);
  CHECK(two[1].start == 134 * 512 - 6400);
  CHECK(two[1].end == 164 * 512 + 6400);
  // Padding that would overlap splits the silence between the two.
  VadOptions close = o;
  close.min_silence_duration_ms = 100;
  auto halves = speech_regions_from_probabilities(bursts(400, {{10, 40}, {50, 80}}), n, close);
  REQUIRE(halves.size() == 2);
  CHECK(halves[0].end == 40 * 512 + 5 * 512);
  CHECK(halves[1].start == 50 * 512 - 5 * 512);
  // 160 ms of speech is less than the minimum.
  CHECK(speech_regions_from_probabilities(bursts(400, {{100, 105}}), n, o).empty());
  // Speech up to the end runs to the end.
  auto open = speech_regions_from_probabilities(bursts(400, {{390, 400}}), n, o);
  REQUIRE(open.size() == 1);
  CHECK(open[0].end == n);
  // Probabilities between the two thresholds continue speech, never start it.
  std::vector<float> hold = bursts(400, {{10, 20}});
  for (size_t i = 20; i < 200; ++i) hold[i] = 0.4f;
  auto held = speech_regions_from_probabilities(hold, n, o);
  REQUIRE(held.size() == 1);
  CHECK(held[0].end == 200 * 512 + 6400);
  // A maximum duration splits 10 s of speech into pieces no longer than it.
  VadOptions split = o;
  split.max_speech_duration_s = 2.0;
  auto pieces = speech_regions_from_probabilities(bursts(400, {{0, 313}}), n, split);
  CHECK(pieces.size() >= 5);
  for (const SpeechRegion& r : pieces) CHECK(r.end - r.start <= 32000 + 2 * 6400);
  VadOptions bad = o;
  bad.threshold = 1.5f;
  CHECK_THROWS_AS(speech_regions_from_probabilities({}, 0, bad), Error);
}

TEST_CASE("times in the laid-out speech map back to the original audio", "[vad]") {
  // Regions [1 s, 2 s) and [4 s, 5 s): 1 s of silence before the first, 3 s before the second.
  const SpeechTimeMap map({{16000, 32000}, {64000, 80000}});
  CHECK(map.original_time(0.5) == Approx(1.5));
  CHECK(map.original_time(1.0, true) == Approx(2.0));  // the end of the first region
  CHECK(map.original_time(1.0) == Approx(4.0));        // the start of the second
  CHECK(map.original_time(1.25) == Approx(4.25));
  CHECK(map.original_time(2.0, true) == Approx(5.0));
  CHECK(map.original_time(3.0) == Approx(6.0));  // past the end: the last region's offset
}

TEST_CASE("a VAD model's window probabilities give the speech regions", "[vad]") {
  const VoiceActivityDetector vad(kVad);
  const std::vector<float> audio = tone(6.0, {{1.0, 3.0}});
  const std::vector<float> p = vad.probabilities(audio);
  CHECK(p.size() == 96000 / 512 + 1);  // padded to a whole number of windows, plus one
  CHECK(p[10] < 0.01f);
  CHECK(p[40] > 0.99f);
  // The first window holding tone is 31 (384 of its samples), the last 93; window 94 is the
  // first silent one.
  const auto regions = vad.speech_regions(audio, {});
  REQUIRE(regions.size() == 1);
  CHECK(regions[0].start == 31 * 512 - 6400);
  CHECK(regions[0].end == 94 * 512 + 6400);
  // A model of another interface is refused, naming the file.
  const std::string cnn = std::string(KILN_SOURCE_DIR) + "/models/tiny-cnn/model.onnx";
  CHECK_THROWS_WITH(VoiceActivityDetector(cnn),
                    Catch::Contains("tiny-cnn/model.onnx") && Catch::Contains("not a Silero VAD"));
}

TEST_CASE("transcription with a VAD reads only the speech and keeps the original times",
          "[vad][transcribe]") {
  WhisperTranscriber whisper(std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random");
  TranscribeOptions o;
  o.vad = std::make_shared<VoiceActivityDetector>(kVad);
  o.timestamps = true;
  o.max_new_tokens = 8;
  // Silence alone: nothing is transcribed.
  const Transcript none = whisper.transcribe(std::vector<float>(16000 * 40, 0.0f), o);
  CHECK(none.segments.empty());
  CHECK(none.text.empty());
  CHECK(none.encoder_runs == 0);
  // Two tones 26 s apart: two regions laid end to end (5.6 s of audio); the segments
  // are those of the laid-out speech with their times mapped back.
  o.language = "en";
  const std::vector<float> audio = tone(40.0, {{2.0, 4.0}, {30.0, 32.0}});
  const Transcript t = whisper.transcribe(audio, o);
  REQUIRE(t.speech_regions.size() == 2);
  CHECK(t.speech_regions[0].start == 62 * 512 - 6400);
  CHECK(t.speech_regions[1].start > 29 * 16000);
  std::vector<float> speech;
  for (const SpeechRegion& r : t.speech_regions)
    speech.insert(speech.end(), audio.begin() + r.start, audio.begin() + r.end);
  TranscribeOptions plain = o;
  plain.vad = nullptr;
  const Transcript laid_out = whisper.transcribe(speech, plain);
  REQUIRE(t.segments.size() == laid_out.segments.size());
  CHECK(t.tokens == laid_out.tokens);
  CHECK(t.encoder_runs == laid_out.encoder_runs);
  const SpeechTimeMap map(t.speech_regions);
  for (size_t k = 0; k < t.segments.size(); ++k) {
    CHECK(t.segments[k].start == map.original_time(laid_out.segments[k].start));
    CHECK(t.segments[k].end == map.original_time(laid_out.segments[k].end, true));
  }
  REQUIRE_FALSE(t.segments.empty());
  CHECK(t.segments.front().start >= 2.0 - 0.4);
}

// faster-whisper's own VAD (`make vad-real`) on the real-speech clips of `make whisper-real`,
// against faster-whisper's regions (tools/export/make_vad_refs.py).
TEST_CASE("Silero VAD regions are faster-whisper's", "[vad][whisper-real]") {
  namespace js = kiln::json;
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/models/cache/whisper-tiny.en";
  const std::string model =
      std::string(KILN_SOURCE_DIR) + "/models/cache/corpus/silero-vad-v6-fw/model.onnx";
  if (!std::filesystem::exists(dir + "/vad_references.json") || !std::filesystem::exists(model)) {
    WARN("KILN-SKIP: no " << dir << "/vad_references.json or " << model
                          << "; make them with make whisper-real, make vad-real and "
                             "tools/export/make_vad_refs.py (models/README.md)");
    return;
  }
  const js::Json refs = js::read_file(dir + "/vad_references.json");
  const VoiceActivityDetector vad(model);
  const std::vector<float> long_audio = read_audio(dir + "/audio/long.wav");
  std::vector<float> gap(long_audio.begin(), long_audio.begin() + 20 * 16000);
  gap.resize(gap.size() + 15 * 16000, 0.0f);
  gap.insert(gap.end(), long_audio.begin() + 40 * 16000, long_audio.begin() + 60 * 16000);
  int compared = 0;
  for (const js::Json& c : refs["cases"]) {
    const std::string name = c["audio"].get<std::string>();
    INFO(name << ", minimum speech " << c["min_speech_duration_ms"].get<int64_t>() << " ms");
    const std::vector<float> audio = name == "long with a gap" ? gap
                                     : name == "long"          ? long_audio
                                                      : read_audio(dir + "/audio/" + name + ".wav");
    VadOptions o;
    o.min_speech_duration_ms = c["min_speech_duration_ms"].get<int64_t>();
    const std::vector<SpeechRegion> got = vad.speech_regions(audio, o);
    std::vector<std::pair<int64_t, int64_t>> got_pairs, want;
    for (const SpeechRegion& r : got) got_pairs.emplace_back(r.start, r.end);
    for (const js::Json& r : c["regions"])
      want.emplace_back(r[0].get<int64_t>(), r[1].get<int64_t>());
    CHECK(got_pairs == want);
    ++compared;
  }
  CHECK(compared >= 6);
}
