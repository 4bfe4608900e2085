// Voice-activity detection with a Silero-VAD ONNX model, as faster-whisper's vad_filter does it:
// a speech probability for every 512 samples (32 ms at 16 kHz), then speech regions with the
// same thresholds, minimum durations, padding and splitting (faster_whisper/vad.py,
// get_speech_timestamps), and the map from times in the speech alone back to the original
// audio (SpeechTimestampsMap).
//
//   auto vad = std::make_shared<kiln::VoiceActivityDetector>("silero_vad_v6.onnx");
//   for (const kiln::SpeechRegion& r : vad->speech_regions(samples, {})) ...
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/session.h"

namespace kiln {

// faster-whisper's VadOptions, with its defaults but for the minimum speech duration.
struct VadOptions {
  float threshold = 0.5f;  // a window is speech from this probability on
  // Below this a window is silence (between the two: what the previous one was); negative:
  // max(threshold - 0.15, 0.01).
  float neg_threshold = -1.0f;
  int64_t min_speech_duration_ms = 250;  // shorter regions are dropped
  // Longer regions are split at their last silence of more than 98 ms, else just before it.
  double max_speech_duration_s = std::numeric_limits<double>::infinity();
  int64_t min_silence_duration_ms = 2000;  // shorter silences do not end a region
  int64_t speech_pad_ms = 400;             // added on each side of a region
};

// Samples [start, end) of the audio.
struct SpeechRegion {
  int64_t start = 0, end = 0;
};

class VoiceActivityDetector {
 public:
  // An ONNX Silero VAD: faster-whisper's (inputs `input` [windows, 576], `h`, `c`; every
  // window in one run) or the silero-vad package's (`input` [1, 576], `state`, `sr`; one run
  // per window). Anything else is rejected with a kiln::Error naming the file.
  explicit VoiceActivityDetector(const std::string& model_path, SessionOptions options = {});
  ~VoiceActivityDetector();
  VoiceActivityDetector(VoiceActivityDetector&&) noexcept;

  // The speech probability of each 512-sample window of 16 kHz audio, the audio padded with
  // zeros to a whole number of windows plus one as faster-whisper pads it; each window is
  // seen with the 64 samples before it. Safe to call from several threads at once.
  std::vector<float> probabilities(const std::vector<float>& samples) const;
  // The speech regions of `samples` (16 kHz).
  std::vector<SpeechRegion> speech_regions(const std::vector<float>& samples,
                                           const VadOptions& options) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// faster-whisper's get_speech_timestamps on given window probabilities (512 samples each) of
// audio `num_samples` long.
std::vector<SpeechRegion> speech_regions_from_probabilities(const std::vector<float>& probabilities,
                                                            int64_t num_samples,
                                                            const VadOptions& options);

// Times in the speech regions laid end to end, back to times in the original audio (seconds,
// rounded to 10 ms as faster-whisper rounds them). `is_end`: the time ends a segment, so a time
// exactly at a region's end stays in that region.
class SpeechTimeMap {
 public:
  explicit SpeechTimeMap(const std::vector<SpeechRegion>& regions);
  double original_time(double time, bool is_end = false) const;
  // The region a time of the laid-out speech falls in.
  size_t region_of(double time, bool is_end = false) const;

 private:
  std::vector<int64_t> region_end_;       // in the laid-out speech, in samples
  std::vector<double> silence_before_s_;  // removed before each region
};

}  // namespace kiln
