// Whisper's audio front end: 16 kHz mono WAV -> log-mel features, computed as transformers'
// WhisperFeatureExtractor does (periodic Hann window, centred frames with reflect padding,
// |STFT|^2 over n_fft 400 / hop 160, Slaney mel filters up to 8 kHz, log10 clamped at 1e-10,
// floor at max - 8, then (x + 4) / 4), on audio padded or cut to 30 s. The STFT runs on
// math::Fft, the FFT the DFT and STFT ops use.
#include <Eigen/Dense>

#include <array>
#include <cmath>
#include <complex>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numbers>

#include "kiln/error.h"
#include "kiln/generate.h"
#include "ops/math/fft.h"

namespace kiln {
namespace {

constexpr int kSampleRate = 16000;
constexpr int kFft = 400, kHop = 160, kBins = kFft / 2 + 1;
constexpr int kChunkSamples = 30 * kSampleRate;  // 480000
constexpr int kFrames = kChunkSamples / kHop;    // 3000 (the last STFT frame is dropped)

double hz_to_mel(double hz) {  // Slaney scale: linear below 1 kHz, logarithmic above
  const double logstep = 27.0 / std::log(6.4);
  return hz < 1000.0 ? 3.0 * hz / 200.0 : 15.0 + std::log(hz / 1000.0) * logstep;
}

double mel_to_hz(double mel) {
  const double logstep = std::log(6.4) / 27.0;
  return mel < 15.0 ? 200.0 * mel / 3.0 : 1000.0 * std::exp(logstep * (mel - 15.0));
}

// [kBins x n_mels] triangular filters with Slaney area normalisation.
Eigen::MatrixXd mel_filters(int n_mels) {
  std::vector<double> edges(static_cast<size_t>(n_mels + 2));
  const double top = hz_to_mel(8000.0);
  for (int i = 0; i < n_mels + 2; ++i)
    edges[static_cast<size_t>(i)] = mel_to_hz(top * i / (n_mels + 1));
  Eigen::MatrixXd f(kBins, n_mels);
  for (int b = 0; b < kBins; ++b) {
    const double freq = 8000.0 * b / (kBins - 1);
    for (int m = 0; m < n_mels; ++m) {
      const auto lo = edges[static_cast<size_t>(m)], mid = edges[static_cast<size_t>(m + 1)],
                 hi = edges[static_cast<size_t>(m + 2)];
      const double down = (freq - lo) / (mid - lo);
      const double up = (hi - freq) / (hi - mid);
      f(b, m) = std::max(0.0, std::min(down, up)) * 2.0 / (hi - lo);
    }
  }
  return f;
}

uint32_t u32(const std::vector<char>& b, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(b[at + static_cast<size_t>(i)]))
         << (8 * i);
  return v;
}

uint16_t u16(const std::vector<char>& b, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(b[at]) |
                               static_cast<unsigned char>(b[at + 1]) << 8);
}

}  // namespace

std::vector<float> read_wav_16k_mono(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Io, "cannot open").with_file(path);
  const std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) -> Error {
    return std::move(Error(ErrorKind::InvalidArgument, why).with_file(path));
  };
  if (b.size() < 12 || std::memcmp(b.data(), "RIFF", 4) != 0 ||
      std::memcmp(b.data() + 8, "WAVE", 4) != 0) {
    throw bad("not a WAV file (no RIFF/WAVE header)");
  }
  bool have_fmt = false;
  uint16_t channels = 0, bits = 0, format = 0;
  uint32_t rate = 0;
  size_t at = 12;
  while (at + 8 <= b.size()) {
    const uint32_t size = u32(b, at + 4);
    const size_t body = at + 8;
    if (size > b.size() - body)
      throw bad("truncated '" + std::string(b.data() + at, 4) + "' chunk");
    if (std::memcmp(b.data() + at, "fmt ", 4) == 0) {
      if (size < 16) throw bad("fmt chunk too short");
      format = u16(b, body);
      channels = u16(b, body + 2);
      rate = u32(b, body + 4);
      bits = u16(b, body + 14);
      if (format == 0xFFFE && size >= 26) format = u16(b, body + 24);  // WAVE_FORMAT_EXTENSIBLE
      have_fmt = true;
    } else if (std::memcmp(b.data() + at, "data", 4) == 0) {
      if (!have_fmt) throw bad("data chunk before the fmt chunk");
      if (format != 1) throw bad("audio format " + std::to_string(format) + ": expected PCM (1)");
      if (channels != 1) throw bad(std::to_string(channels) + " channels: expected mono");
      if (rate != kSampleRate)
        throw bad("sample rate " + std::to_string(rate) + " Hz: expected 16000 Hz");
      if (bits != 16) throw bad(std::to_string(bits) + " bits per sample: expected 16");
      std::vector<float> samples(size / 2);
      for (size_t i = 0; i < samples.size(); ++i) {
        samples[i] = static_cast<float>(static_cast<int16_t>(u16(b, body + 2 * i))) / 32768.0f;
      }
      return samples;
    }
    at = body + size + (size & 1);  // chunks are padded to even sizes
  }
  throw bad("no data chunk");
}

Tensor whisper_log_mel(const std::vector<float>& samples, int64_t n_mels) {
  if (n_mels <= 0 || n_mels > 256)
    throw Error(ErrorKind::InvalidArgument, "bad number of mel bins");
  // Pad (or cut) to 30 s, then reflect-pad by n_fft / 2 on both sides (centred frames).
  std::vector<double> x(static_cast<size_t>(kChunkSamples) + kFft, 0.0);
  const size_t n = std::min(samples.size(), static_cast<size_t>(kChunkSamples));
  for (size_t i = 0; i < n; ++i) x[i + kFft / 2] = samples[i];
  const int half = kFft / 2;
  for (int i = 0; i < half; ++i) {
    x[static_cast<size_t>(half - 1 - i)] = x[static_cast<size_t>(half + 1 + i)];
    x[static_cast<size_t>(half + kChunkSamples + i)] =
        x[static_cast<size_t>(half + kChunkSamples - 2 - i)];
  }
  // |STFT|^2 with math::Fft, two real frames per complex transform: with z = a + ib for
  // real frames a and b, A[k] = (Z[k] + conj(Z[n-k])) / 2 and B[k] = (Z[k] - conj(Z[n-k])) / 2i.
  std::array<double, kFft> window;  // periodic Hann
  for (int t = 0; t < kFft; ++t)
    window[t] = 0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * t / kFft);
  const math::Fft fft(kFft);
  std::vector<std::complex<double>> z(kFft), scratch(static_cast<size_t>(fft.scratch_size()));
  Eigen::MatrixXd power(kFrames, kBins);
  static_assert(kFrames % 2 == 0);
  for (int f = 0; f < kFrames; f += 2) {
    const double* a = x.data() + static_cast<ptrdiff_t>(f) * kHop;
    const double* b = a + kHop;
    for (int t = 0; t < kFft; ++t) z[t] = {a[t] * window[t], b[t] * window[t]};
    fft.run(z.data(), scratch.data(), false);
    for (int k = 0; k < kBins; ++k) {
      const std::complex<double> zk = z[k], zr = std::conj(z[(kFft - k) % kFft]);
      power(f, k) = 0.25 * std::norm(zk + zr);
      power(f + 1, k) = 0.25 * std::norm(zk - zr);
    }
  }
  Eigen::MatrixXd mel = power * mel_filters(static_cast<int>(n_mels));  // [kFrames x n_mels]
  mel = mel.array().max(1e-10).log10();
  const double floor = mel.maxCoeff() - 8.0;
  Tensor out = Tensor::zeros(DataType::Float, {1, n_mels, kFrames});
  float* o = out.data<float>();
  for (int64_t m = 0; m < n_mels; ++m) {
    for (int f = 0; f < kFrames; ++f) {
      o[m * kFrames + f] = static_cast<float>((std::max(mel(f, m), floor) + 4.0) / 4.0);
    }
  }
  return out;
}

}  // namespace kiln
