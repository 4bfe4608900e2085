// libFuzzer harness for read_audio: the bytes are an audio file (seeds: the committed WAV,
// FLAC, Ogg Vorbis, Ogg Opus and MP3 files of test/data/audio). libsndfile and its codecs
// decode it; kiln checks the stream's description, mixes the channels, resamples and reports a
// file cut short. Read strictly and with a report: every failure must be a kiln::Error, and a
// report must name the file.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>

#include "kiln/audio.h"
#include "test/fuzz/fuzz_common.h"

namespace {

const std::string& scratch_path() {
  static const std::string path =
      "/tmp/kiln-fuzz-audio-" + std::to_string(static_cast<long>(getpid()));
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    kiln::read_audio(scratch_path(), 16000);
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  try {
    std::string report;
    kiln::read_audio(scratch_path(), 16000, &report);
    if (!report.empty() && report.find(scratch_path()) != 0) {
      kiln::fuzz::finding(std::runtime_error("a report that does not name the file: " + report));
    }
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  return 0;
}
