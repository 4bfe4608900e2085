#include "engine/generate/whisper_logits.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "kiln/error.h"

namespace kiln::detail::whisper {

double log_sum_exp(const float* x, size_t n) {
  float m = kNegInf;
  for (size_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (std::isinf(m)) return m;
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(s);
}

void log_softmax(std::vector<float>& x) {
  const double lse = log_sum_exp(x.data(), x.size());
  for (float& v : x) v = static_cast<float>(v - lse);
}

double compression_ratio(const std::vector<int64_t>& tokens, int64_t vocab) {
  const int width = static_cast<int>(std::log2(static_cast<double>(vocab)) / 8) + 1;
  std::vector<unsigned char> bytes;
  for (int64_t t : tokens) {
    for (int i = 0; i < width; ++i)
      bytes.push_back(static_cast<unsigned char>((t >> (8 * i)) & 0xff));
  }
  uLongf size = compressBound(static_cast<uLong>(bytes.size()));
  std::vector<unsigned char> out(size);
  if (compress(out.data(), &size, bytes.data(), static_cast<uLong>(bytes.size())) != Z_OK)
    throw Error(ErrorKind::Runtime, "zlib compress failed");
  return static_cast<double>(bytes.size()) / static_cast<double>(size);
}

void Processors::apply(const std::vector<int64_t>& seq, std::vector<float>& scores) const {
  const auto vocab = static_cast<int64_t>(scores.size());
  auto kill = [&](int64_t t) {
    if (t >= 0 && t < vocab) scores[static_cast<size_t>(t)] = kNegInf;
  };
  if (seq.size() == begin_) {
    for (int64_t t : c_.begin_suppress) kill(t);
  }
  for (int64_t t : c_.suppress) kill(t);
  if (timestamps_) apply_timestamps(seq, scores);
}

void Processors::kill_range(std::vector<float>& s, int64_t from, int64_t to) const {
  from = std::clamp<int64_t>(from, 0, static_cast<int64_t>(s.size()));
  to = std::clamp<int64_t>(to, from, static_cast<int64_t>(s.size()));
  std::fill(s.begin() + from, s.begin() + to, kNegInf);
}

void Processors::apply_timestamps(const std::vector<int64_t>& seq, std::vector<float>& s) const {
  const auto vocab = static_cast<int64_t>(s.size());
  const int64_t tb = c_.timestamp_begin;
  kill_range(s, c_.no_timestamps, c_.no_timestamps + 1);
  const std::span<const int64_t> sampled(seq.begin() + static_cast<std::ptrdiff_t>(begin_),
                                         seq.end());
  const size_t n = sampled.size();
  const bool last_ts = n >= 1 && sampled[n - 1] >= tb;
  const bool penultimate_ts = n < 2 || sampled[n - 2] >= tb;
  if (last_ts) {
    if (penultimate_ts) {
      kill_range(s, tb, vocab);  // has to be text
    } else {
      kill_range(s, 0, c_.eos);  // cannot be text
    }
  }
  int64_t last_timestamp = -1;
  for (int64_t t : sampled) {
    if (t >= tb) last_timestamp = t;
  }
  if (last_timestamp >= 0) {
    const int64_t upto = last_ts && !penultimate_ts ? last_timestamp : last_timestamp + 1;
    kill_range(s, tb, upto);
  }
  if (n == 0) {
    kill_range(s, 0, tb);
    if (c_.max_initial_timestamp_index)
      kill_range(s, tb + *c_.max_initial_timestamp_index + 1, vocab);
  }
  std::vector<float> logprobs = s;
  log_softmax(logprobs);
  if (tb < vocab) {
    const double ts_logprob = log_sum_exp(logprobs.data() + tb, static_cast<size_t>(vocab - tb));
    const float max_text = *std::max_element(logprobs.begin(), logprobs.begin() + tb);
    if (ts_logprob > max_text) kill_range(s, 0, tb);
  }
}

}  // namespace kiln::detail::whisper
