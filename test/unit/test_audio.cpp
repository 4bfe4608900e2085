// Audio input: kiln::read_audio against python-soundfile + python-soxr on committed files of
// every format (tools/export/make_audio_refs.py), a pitch check that needs no Python, clear
// errors for files that are not audio, and long-form log-mel features against transformers.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "kiln/audio.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

const std::string kAudio = std::string(KILN_SOURCE_DIR) + "/test/data/audio/";

std::vector<float> npy_floats(const std::string& path) {
  return tooling::read_npy(path).to_vector<float>();
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A 16-bit PCM WAV file's bytes: `channels` interleaved channels at `rate`.
std::string pcm16_wav(uint32_t rate, uint16_t channels, const std::vector<float>& interleaved) {
  std::string b;
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  auto u16 = [&](uint16_t v) {
    b += static_cast<char>(v & 0xff);
    b += static_cast<char>(v >> 8);
  };
  const auto data_bytes = static_cast<uint32_t>(2 * interleaved.size());
  b += "RIFF";
  u32(36 + data_bytes);
  b += "WAVEfmt ";
  u32(16);
  u16(1);  // PCM
  u16(channels);
  u32(rate);
  u32(rate * channels * 2);
  u16(static_cast<uint16_t>(channels * 2));
  u16(16);
  b += "data";
  u32(data_bytes);
  for (float x : interleaved)
    u16(static_cast<uint16_t>(static_cast<int16_t>(std::lround(x * 32767))));
  return b;
}

// Open file descriptors of this process: a decoder handle left open would add one.
size_t open_files() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

std::string error_of(const std::string& path) {
  try {
    read_audio(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The 70-s signal of make_audio_refs.py's long_signal(), from the same formula.
std::vector<float> long_signal() {
  const double pi2 = 2 * std::numbers::pi;
  std::vector<float> x(70 * 16000);
  for (size_t n = 0; n < x.size(); ++n) {
    const double t = static_cast<double>(n) / 16000;
    double v = 0;
    if (t < 20) {
      v = 0.01 * std::sin(pi2 * 300 * t);
    } else if (t >= 25 && t < 45) {
      v = 0.05 * std::sin(pi2 * (200 + 20 * (t - 25)) * (t - 25));
    } else if (t >= 45 && t < 50) {
      v = 0.9 * std::sin(pi2 * 1000 * t);
    } else if (t >= 50) {
      v = 0.02 * std::sin(pi2 * 150 * t) + 0.01 * std::sin(pi2 * 2500 * t);
    }
    x[n] = static_cast<float>(v);
  }
  return x;
}

// Every `every`-th frame of float32[1, mels, frames], as the committed references hold them.
std::vector<float> every_nth_frame(const Tensor& features, int64_t every) {
  const int64_t mels = features.dim(1), frames = features.dim(2);
  const float* f = features.data<const float>();
  std::vector<float> out;
  for (int64_t m = 0; m < mels; ++m)
    for (int64_t t = 0; t < frames; t += every) out.push_back(f[m * frames + t]);
  return out;
}

}  // namespace

TEST_CASE("read_audio matches python-soundfile + python-soxr on every format", "[audio]") {
  // A 16-bit file at 16 kHz is only decoded (n / 32768): exact. Everything else agrees
  // exactly on this machine too, but Vorbis (1e-7), yet the two sides run different builds
  // (Debian's libsndfile, libsoxr, libvorbis, libopus, mpg123; python-soundfile's and
  // python-soxr's bundled ones) whose float kernels may take other SIMD paths on another
  // processor: 1e-6 (about 16 float ulps at the tones' amplitude) allows for that rounding
  // and nothing more.
  struct Case {
    const char* file;
    double tolerance;
  };
  const Case cases[] = {
      {"pcm16_16k_mono.wav", 0},    {"pcm16_44k_stereo.wav", 1e-6},  {"float_48k_mono.wav", 1e-6},
      {"flac_22k_mono.flac", 1e-6}, {"vorbis_48k_stereo.ogg", 1e-6}, {"opus_48k_mono.opus", 1e-6},
      {"mp3_44k_stereo.mp3", 1e-6},
  };
  for (const Case& c : cases) {
    const std::vector<float> got = read_audio(kAudio + c.file);
    const std::vector<float> want = npy_floats(kAudio + c.file + ".npy");
    INFO(c.file << ": " << got.size() << " samples, reference " << want.size());
    REQUIRE(got.size() == want.size());
    const double err = max_abs_diff(got, want);
    INFO("max abs error " << err);
    CHECK(err <= c.tolerance);
  }
}

TEST_CASE("the committed Whisper sample reads the same through read_audio and read_wav_16k_mono",
          "[audio]") {
  const std::string sample =
      std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random/sample.wav";
  const std::vector<float> wav = read_wav_16k_mono(sample);
  CHECK(wav.size() == 32000);
  CHECK(read_audio(sample) == wav);
}

TEST_CASE("a 1 kHz tone at 44.1 kHz is still 1 kHz after resampling to 16 kHz", "[audio]") {
  // Zero crossings count the pitch without any reference library: 2000 a second.
  TempDir dir;
  std::vector<float> tone(44100);
  for (size_t n = 0; n < tone.size(); ++n)
    tone[n] = static_cast<float>(0.5 * std::sin(2 * std::numbers::pi * 1000 * n / 44100.0));
  const std::vector<float> x = read_audio(dir.file("tone.wav", pcm16_wav(44100, 1, tone)));
  REQUIRE(x.size() == 16000);
  // Skip 0.1 s at each end, where the resampler's filter meets the tone's edges.
  int crossings = 0;
  double energy = 0;
  for (size_t n = 1600; n < 14400; ++n) {
    crossings += (x[n - 1] < 0) != (x[n] < 0);
    energy += static_cast<double>(x[n]) * x[n];
  }
  CHECK(std::abs(crossings - 1600) <= 2);  // 0.8 s at 2000 a second
  CHECK(std::sqrt(energy / 12800) == Approx(0.5 / std::sqrt(2.0)).epsilon(1e-3));
  // Stereo is averaged: the tone on the left, its negation on the right cancel out.
  std::vector<float> stereo;
  for (float v : tone) stereo.insert(stereo.end(), {v, -v});
  for (float v : read_audio(dir.file("cancel.wav", pcm16_wav(44100, 2, stereo)))) CHECK(v == 0);
}

TEST_CASE("read_audio refuses what is not audio with one error naming the file", "[audio]") {
  TempDir dir;
  const size_t files_before = open_files();
  const std::string flac = file_bytes(kAudio + "flac_22k_mono.flac");
  const std::string mp3 = file_bytes(kAudio + "mp3_44k_stereo.mp3");
  const std::string ogg = file_bytes(kAudio + "vorbis_48k_stereo.ogg");
  std::string garbage(4096, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 7919) % 251);
  struct Case {
    std::string path, message;
  };
  const Case cases[] = {
      {(dir.path / "missing.wav").string(), "missing.wav: cannot open: no such file"},
      {dir.path.string(), "is a folder, not an audio file"},
      {dir.file("garbage.mp3", garbage), "garbage.mp3: not a readable audio file"},
      {dir.file("text.wav", "hello, this is not audio"), "text.wav: not a readable audio file"},
      {dir.file("cut.flac", flac.substr(0, flac.size() / 2)), "cut.flac: decoding failed"},
      {dir.file("cut.mp3", mp3.substr(0, mp3.size() / 2)), "cut.mp3: truncated"},
      {dir.file("cut.ogg", ogg.substr(0, ogg.size() / 2)), "cut.ogg: not a readable audio file"},
      {dir.file("empty.wav", pcm16_wav(16000, 1, {})), "empty.wav: no audio samples"},
      {dir.file("header.wav", pcm16_wav(16000, 1, {}).substr(0, 30)),
       "header.wav: not a readable audio file"},
  };
  for (const Case& c : cases) CHECK_THAT(error_of(c.path), Catch::Contains(c.message));
  // Every file read or refused was closed again, also when a check after sf_open failed.
  CHECK(open_files() == files_before);
  CHECK_THROWS_WITH(read_audio(kAudio + "pcm16_16k_mono.wav", 0),
                    Catch::Contains("output sample rate 0 Hz"));
}

TEST_CASE("cut and corrupted audio files either read or give kiln::Error", "[audio]") {
  // Every committed format cut at 16 points and with 16 runs of flipped bytes (a fixed
  // pattern): read_audio returns samples or throws kiln::Error, never anything else.
  TempDir dir;
  const char* files[] = {"pcm16_44k_stereo.wav",  "float_48k_mono.wav", "flac_22k_mono.flac",
                         "vorbis_48k_stereo.ogg", "opus_48k_mono.opus", "mp3_44k_stereo.mp3"};
  int refused = 0;
  for (const char* name : files) {
    const std::string bytes = file_bytes(kAudio + name);
    for (size_t k = 1; k <= 16; ++k) {
      std::string corrupt = bytes;
      const size_t at = bytes.size() * k / 17;
      for (size_t i = at; i < std::min(corrupt.size(), at + 8); ++i) corrupt[i] ^= '\x5a';
      for (const std::string& variant : {bytes.substr(0, at), corrupt}) {
        INFO(name << " at byte " << at);
        const std::string path = dir.file(name, variant);
        try {
          read_audio(path);
        } catch (const Error& e) {
          CHECK_THAT(e.what(), Catch::Contains(name));
          ++refused;
        }
      }
    }
  }
  CHECK(refused > 0);
}

TEST_CASE("a WAV header claiming 4 GB of data is a truncated file; a streaming size is not",
          "[audio]") {
  // libsndfile bounds the data chunk by the file's size, and kiln allocates from what it
  // decodes, never from the header. A size a recorder leaves while streaming (0xFFFFFFFF)
  // gives no length; any other size beyond the file is a cut file.
  TempDir dir;
  std::string wav = pcm16_wav(16000, 1, {0.5f, -0.5f, 0.25f});
  for (int i = 0; i < 4; ++i) wav[40 + i] = '\xf0';  // the data chunk's size: 4 GB
  const std::string huge = dir.file("huge.wav", wav);
  CHECK_THAT(error_of(huge), Catch::Contains("huge.wav: truncated: the header gives") &&
                                 Catch::Contains("the file holds 0.00 s"));
  std::string report;
  const std::vector<float> x = read_audio(huge, 16000, &report);
  REQUIRE(x.size() == 3);
  CHECK(x[0] == Approx(0.5).margin(1e-4));
  CHECK_THAT(report, Catch::Contains("huge.wav: truncated"));
  for (int i = 0; i < 4; ++i) wav[40 + i] = '\xff';
  const std::string streamed = dir.file("streamed.wav", wav);
  CHECK(read_audio(streamed).size() == 3);
  CHECK(read_audio(streamed, 16000, &report).size() == 3);
  CHECK(report.empty());
}

TEST_CASE("a cut file read with a report gives what decodes and says how much", "[audio]") {
  // WAV, MP3 and FLAC cut at three quarters: without a report each is an error naming the
  // file; with one the samples that decode come back (a WAV's are the whole file's first ones;
  // the FLAC's first frame of two) and the report names the file and the seconds read. A
  // whole file reads with an empty report.
  TempDir dir;
  for (const char* name : {"pcm16_44k_stereo.wav", "mp3_44k_stereo.mp3", "flac_22k_mono.flac"}) {
    INFO(name);
    const std::string bytes = file_bytes(kAudio + name);
    const std::string cut =
        dir.file(std::string("cut-") + name, bytes.substr(0, bytes.size() * 3 / 4));
    CHECK_THAT(error_of(cut), Catch::Contains(std::string("cut-") + name));
    std::string report = "stale";
    const std::vector<float> whole = read_audio(kAudio + name, 16000, &report);
    CHECK(report.empty());
    const std::vector<float> part = read_audio(cut, 16000, &report);
    CHECK_THAT(report, Catch::Contains(std::string("cut-") + name + ": "));
    CHECK(!part.empty());
    CHECK(part.size() < whole.size());
    if (std::string(name).ends_with(".wav")) {
      // Resampled from 44.1 kHz: the cut's samples equal the whole file's away from its end.
      const size_t n = part.size() / 2;
      CHECK(max_abs_diff(std::vector<float>(part.begin(), part.begin() + static_cast<long>(n)),
                         std::vector<float>(whole.begin(), whole.begin() + static_cast<long>(n))) <
            1e-6);
      CHECK_THAT(report, Catch::Contains("truncated: the header gives"));
    }
  }
}

TEST_CASE("long-form log-mel features match transformers over a 70-s signal", "[audio]") {
  const std::vector<float> signal = long_signal();
  const Tensor features = whisper_log_mel_long(signal);
  REQUIRE(features.shape() == Shape{1, 80, 7000});
  // transformers runs its STFT in float32, kiln in double: the worst error measured is 2.5e-6.
  CHECK(max_abs_diff(every_nth_frame(features, 37), npy_floats(kAudio + "long_features.npy")) <
        1e-5);
  for (int64_t seek : {2345, 6000}) {
    const Tensor window = whisper_log_mel_window(features, seek);
    REQUIRE(window.shape() == Shape{1, 80, 3000});
    const auto want = npy_floats(kAudio + "long_window_" + std::to_string(seek) + ".npy");
    CHECK(max_abs_diff(every_nth_frame(window, 37), want) < 1e-5);
  }
  // The floor is the whole signal's max - 8: the loud tone at 45 s sets it for the quiet
  // first 30 s too, so they differ from the 30-s features of those samples alone.
  const Tensor first = whisper_log_mel_window(features, 0);
  const Tensor alone = whisper_log_mel(std::vector<float>(signal.begin(), signal.begin() + 480000));
  CHECK(max_abs_diff(first.to_vector<float>(), alone.to_vector<float>()) > 0.1);
}

TEST_CASE("log-mel windows and long features refuse bad arguments", "[audio]") {
  const Tensor features = whisper_log_mel_long(std::vector<float>(16000, 0.1f));
  CHECK(features.shape() == Shape{1, 80, 100});
  CHECK_THROWS_WITH(whisper_log_mel_window(features, 100), Catch::Contains("outside"));
  CHECK_THROWS_WITH(whisper_log_mel_window(features, -1), Catch::Contains("outside"));
  CHECK_THROWS_WITH(whisper_log_mel_window(features, 0, 0), Catch::Contains("0 frames"));
  CHECK_THROWS_WITH(whisper_log_mel_long(std::vector<float>(200)),
                    Catch::Contains("more than 200"));
  CHECK_THROWS_WITH(whisper_log_mel_long(std::vector<float>(1000), 0), Catch::Contains("mel bins"));
  // A window reaching past the end keeps the features' values and pads with zeros.
  const Tensor w = whisper_log_mel_window(features, 90, 20);
  REQUIRE(w.shape() == Shape{1, 80, 20});
  const float* f = features.data<const float>();
  const float* x = w.data<const float>();
  CHECK(x[0] == f[90]);
  CHECK(x[9] == f[99]);
  CHECK(x[10] == 0.0f);
}
