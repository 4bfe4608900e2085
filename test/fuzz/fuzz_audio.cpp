// libFuzzer harness for read_audio: the bytes are an audio file (seeds: the committed WAV,
// FLAC, Ogg Vorbis, Ogg Opus and MP3 files of test/data/audio). libsndfile and its codecs
// decode it; kiln checks the stream's description, mixes the channels, resamples and reports a
// file cut short. Read strictly and with a report: every failure must be a kiln::Error, and a
// report must name the file.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kiln/audio.h"
#include "test/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::scratch_file("audio", data, size);
  try {
    kiln::read_audio(path, 16000);
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  try {
    std::string report;
    kiln::read_audio(path, 16000, &report);
    if (!report.empty() && report.find(path) != 0) {
      kiln::fuzz::finding(std::runtime_error("a report that does not name the file: " + report));
    }
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  return 0;
}
