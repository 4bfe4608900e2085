// Silero VAD as faster-whisper runs it (faster_whisper/vad.py, version 1.2): the window
// probabilities, the region rules and the time map, step for step.
#include "kiln/vad.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "engine/generate/decoding.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using detail::has_input;
using detail::named_output;

constexpr int64_t kWindow = 512;  // samples per probability at 16 kHz
constexpr int64_t kContext = 64;  // samples of the window before, seen with each window
constexpr int64_t kSampleRate = 16000;
constexpr int64_t kBatch = 10000;  // windows per run (faster-whisper's encoder_batch_size)

enum class Interface { Batched, PerWindow };

}  // namespace

struct VoiceActivityDetector::Impl {
  std::string path;
  mutable Session session;  // Session::run is safe from several threads at once
  Interface interface = Interface::Batched;
  std::string output;  // the probabilities' output name
};

VoiceActivityDetector::VoiceActivityDetector(const std::string& model_path,
                                             SessionOptions options) {
  Session s(model_path, std::move(options));
  Interface kind;
  if (has_input(s, "input") && has_input(s, "h") && has_input(s, "c")) {
    kind = Interface::Batched;
  } else if (has_input(s, "input") && has_input(s, "state")) {
    kind = Interface::PerWindow;
  } else {
    throw Error(
        ErrorKind::InvalidModel,
        model_path + ": not a Silero VAD (inputs `input`, `h`, `c` or `input`, `state`, `sr`)");
  }
  if (s.outputs().empty()) throw Error(ErrorKind::InvalidModel, model_path + ": no outputs");
  const std::string output = s.outputs()[0].name;
  impl_ = std::make_unique<Impl>(Impl{model_path, std::move(s), kind, output});
}

VoiceActivityDetector::~VoiceActivityDetector() = default;
VoiceActivityDetector::VoiceActivityDetector(VoiceActivityDetector&&) noexcept = default;

std::vector<float> VoiceActivityDetector::probabilities(const std::vector<float>& samples) const {
  // np.pad(audio, (0, 512 - len % 512)): a whole window of zeros when the length divides.
  const auto n = static_cast<int64_t>(samples.size());
  const int64_t windows = n / kWindow + 1;
  std::vector<float> padded(static_cast<size_t>(windows * kWindow), 0.0f);
  std::copy(samples.begin(), samples.end(), padded.begin());
  // faster-whisper zeroes the last 64 samples of the last window in place (its context slice
  // is a view of the audio) before it lays the contexts out.
  std::fill(padded.end() - kContext, padded.end(), 0.0f);
  // Each row: the 64 samples before the window (zeros for the first), then the window.
  const int64_t row = kWindow + kContext;
  auto fill_rows = [&](int64_t first, int64_t count, float* out) {
    for (int64_t w = first; w < first + count; ++w) {
      float* r = out + (w - first) * row;
      if (w == 0) {
        std::fill(r, r + kContext, 0.0f);
      } else {
        std::memcpy(r, padded.data() + w * kWindow - kContext, kContext * sizeof(float));
      }
      std::memcpy(r + kContext, padded.data() + w * kWindow, kWindow * sizeof(float));
    }
  };
  std::vector<float> probs;
  probs.reserve(static_cast<size_t>(windows));
  const Impl& m = *impl_;
  auto read = [&](const Tensor& t, int64_t count) {
    const Tensor c = t.contiguous();
    if (c.dtype() != DataType::Float || c.numel() != count)
      throw Error(ErrorKind::Runtime, m.path + ": output '" + m.output + "' is " + c.describe() +
                                          ", expected " + std::to_string(count) + " probabilities");
    probs.insert(probs.end(), c.data<const float>(), c.data<const float>() + count);
  };
  if (m.interface == Interface::Batched) {
    Tensor h = Tensor::zeros(DataType::Float, {1, 1, 128});
    Tensor c = Tensor::zeros(DataType::Float, {1, 1, 128});
    for (int64_t first = 0; first < windows; first += kBatch) {
      const int64_t count = std::min(kBatch, windows - first);
      Tensor input = Tensor::zeros(DataType::Float, {count, row});
      fill_rows(first, count, input.data<float>());
      std::vector<NamedValue> outs =
          m.session.run({{"input", std::move(input)}, {"h", h}, {"c", c}});
      read(named_output(outs, m.output, m.path).tensor(), count);
      h = named_output(outs, "hn", m.path).tensor();
      c = named_output(outs, "cn", m.path).tensor();
    }
    return probs;
  }
  Tensor state = Tensor::zeros(DataType::Float, {2, 1, 128});
  const bool sr = has_input(m.session, "sr");
  for (int64_t w = 0; w < windows; ++w) {
    Tensor input = Tensor::zeros(DataType::Float, {1, row});
    fill_rows(w, 1, input.data<float>());
    std::vector<NamedValue> in{{"input", std::move(input)}, {"state", state}};
    if (sr) in.push_back({"sr", Tensor::scalar<int64_t>(kSampleRate)});
    std::vector<NamedValue> outs = m.session.run(std::move(in));
    read(named_output(outs, m.output, m.path).tensor(), 1);
    state = named_output(outs, "stateN", m.path).tensor();
  }
  return probs;
}

std::vector<SpeechRegion> VoiceActivityDetector::speech_regions(const std::vector<float>& samples,
                                                                const VadOptions& options) const {
  return speech_regions_from_probabilities(probabilities(samples),
                                           static_cast<int64_t>(samples.size()), options);
}

std::vector<SpeechRegion> speech_regions_from_probabilities(const std::vector<float>& probabilities,
                                                            int64_t num_samples,
                                                            const VadOptions& o) {
  if (!(o.threshold >= 0 && o.threshold <= 1))
    throw Error(ErrorKind::InvalidArgument, "VAD threshold must be in [0, 1]");
  if (o.min_speech_duration_ms < 0 || o.min_silence_duration_ms < 0 || o.speech_pad_ms < 0 ||
      !(o.max_speech_duration_s > 0))
    throw Error(ErrorKind::InvalidArgument, "VAD durations must be positive");
  const double sr = kSampleRate;
  const double min_speech = sr * static_cast<double>(o.min_speech_duration_ms) / 1000;
  const double pad = sr * static_cast<double>(o.speech_pad_ms) / 1000;
  const double max_speech = sr * o.max_speech_duration_s - kWindow - 2 * pad;
  const double min_silence = sr * static_cast<double>(o.min_silence_duration_ms) / 1000;
  const double min_silence_at_max_speech = sr * 98 / 1000;
  const float neg = o.neg_threshold >= 0 ? o.neg_threshold : std::max(o.threshold - 0.15f, 0.01f);

  std::vector<SpeechRegion> speeches;
  bool triggered = false, open = false;  // open: current_speech holds a start
  SpeechRegion current;
  int64_t temp_end = 0, prev_end = 0, next_start = 0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    const float p = probabilities[i];
    const int64_t at = kWindow * static_cast<int64_t>(i);
    if (p >= o.threshold && temp_end) {
      temp_end = 0;
      if (next_start < prev_end) next_start = at;
    }
    if (p >= o.threshold && !triggered) {
      triggered = true;
      current.start = at;
      open = true;
      continue;
    }
    if (triggered && static_cast<double>(at - current.start) > max_speech) {
      if (prev_end) {
        current.end = prev_end;
        speeches.push_back(current);
        open = false;
        if (next_start < prev_end) {
          triggered = false;
        } else {
          current.start = next_start;
          open = true;
        }
        prev_end = next_start = temp_end = 0;
      } else {
        current.end = at;
        speeches.push_back(current);
        open = false;
        prev_end = next_start = temp_end = 0;
        triggered = false;
        continue;
      }
    }
    if (p < neg && triggered) {
      if (!temp_end) temp_end = at;
      if (static_cast<double>(at - temp_end) > min_silence_at_max_speech) prev_end = temp_end;
      if (static_cast<double>(at - temp_end) < min_silence) continue;
      current.end = temp_end;
      if (static_cast<double>(current.end - current.start) > min_speech)
        speeches.push_back(current);
      open = false;
      prev_end = next_start = temp_end = 0;
      triggered = false;
      continue;
    }
  }
  if (open && static_cast<double>(num_samples - current.start) > min_speech) {
    current.end = num_samples;
    speeches.push_back(current);
  }
  const auto pad_samples = static_cast<int64_t>(pad);
  for (size_t i = 0; i < speeches.size(); ++i) {
    SpeechRegion& s = speeches[i];
    if (i == 0) s.start = std::max<int64_t>(0, s.start - pad_samples);
    if (i + 1 != speeches.size()) {
      const int64_t silence = speeches[i + 1].start - s.end;
      if (static_cast<double>(silence) < 2 * pad) {
        s.end += silence / 2;
        speeches[i + 1].start = std::max<int64_t>(0, speeches[i + 1].start - silence / 2);
      } else {
        s.end = std::min(num_samples, s.end + pad_samples);
        speeches[i + 1].start = std::max<int64_t>(0, speeches[i + 1].start - pad_samples);
      }
    } else {
      s.end = std::min(num_samples, s.end + pad_samples);
    }
  }
  return speeches;
}

SpeechTimeMap::SpeechTimeMap(const std::vector<SpeechRegion>& regions) {
  int64_t previous_end = 0, silent = 0;
  for (const SpeechRegion& r : regions) {
    silent += r.start - previous_end;
    previous_end = r.end;
    region_end_.push_back(r.end - silent);
    silence_before_s_.push_back(static_cast<double>(silent) / kSampleRate);
  }
}

size_t SpeechTimeMap::region_of(double time, bool is_end) const {
  if (region_end_.empty()) return 0;
  const auto sample = static_cast<int64_t>(time * kSampleRate);
  if (is_end) {
    const auto it = std::find(region_end_.begin(), region_end_.end(), sample);
    if (it != region_end_.end()) return static_cast<size_t>(it - region_end_.begin());
  }
  // bisect.bisect: the first region ending after `sample`.
  const auto after = std::upper_bound(region_end_.begin(), region_end_.end(), sample);
  return std::min(static_cast<size_t>(after - region_end_.begin()), region_end_.size() - 1);
}

double SpeechTimeMap::original_time(double time, bool is_end) const {
  if (region_end_.empty()) return time;
  const double t = silence_before_s_[region_of(time, is_end)] + time;
  return std::round(t * 100) / 100;  // round(t, 2)
}

}  // namespace kiln
