// The decode-loop API on the committed Optimum exports: Whisper's front end, tokens identical
// to transformers' greedy generate(), logits close to onnxruntime's, and clear errors.
#include <filesystem>
#include <fstream>

#include "engine/generate/json.h"
#include "kiln/generate.h"
#include "test/unit/op_test.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;
namespace fs = std::filesystem;

namespace {

const std::string kWhisper = std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random";
const std::string kGpt2 = std::string(KILN_SOURCE_DIR) + "/models/gpt2-tiny-random";

[[maybe_unused]] std::vector<int64_t> json_ints(const std::string& file, const std::string& key) {
  std::vector<int64_t> out;
  for (const auto& v : json::parse_file(file).find(key)->as_array()) out.push_back(v.as_int());
  return out;
}

}  // namespace

TEST_CASE("log-mel features match transformers' WhisperFeatureExtractor within 1e-4",
          "[generate][audio]") {
  const std::vector<float> samples = read_wav_16k_mono(kWhisper + "/sample.wav");
  CHECK(samples.size() == 32000);
  const Tensor mel = whisper_log_mel(samples);
  const Tensor want = tooling::read_npy(kWhisper + "/sample_features.npy");
  REQUIRE(mel.shape() == want.shape());
  require_close(mel, want, 0, 1e-4);
}

TEST_CASE("bad WAV files give one clear error", "[generate][audio]") {
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
             Catch::Contains("not a WAV file"));
  CHECK_THAT(error_of(write("cut.wav", wav(1, 16000, 16).substr(0, 30))),
             Catch::Contains("cut.wav: truncated"));
  fs::remove_all(dir);
}
