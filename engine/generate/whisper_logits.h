// Whisper's scores (engine/generate/whisper.cpp): log-softmax, the compression ratio of the
// temperature fallback, and the logits processors of one window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/generate/whisper_config.h"

namespace kiln::detail::whisper {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double log_sum_exp(const float* x, size_t n);

void log_softmax(std::vector<float>& x);

// openai-whisper's measure of repetition: raw token bytes over their zlib-compressed size.
double compression_ratio(const std::vector<int64_t>& tokens, int64_t vocab);

// The logits processors of one window, in transformers' order: begin-suppress, suppress,
// timestamps (the no-speech probability is read from the first step's logits directly).
class Processors {
 public:
  Processors(const WhisperConfig& c, bool timestamps, size_t begin_index)
      : c_(c), timestamps_(timestamps), begin_(begin_index) {}

  void apply(const std::vector<int64_t>& seq, std::vector<float>& scores) const;

 private:
  void kill_range(std::vector<float>& s, int64_t from, int64_t to) const;

  // Timestamps come in pairs and never decrease; the first is within the initial limit; a
  // timestamp is forced when their total probability beats every text token's.
  void apply_timestamps(const std::vector<int64_t>& seq, std::vector<float>& s) const;

  const WhisperConfig& c_;
  bool timestamps_;
  size_t begin_;
};

}  // namespace kiln::detail::whisper
