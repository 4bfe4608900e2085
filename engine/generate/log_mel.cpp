// Whisper's log-mel features, computed as transformers' WhisperFeatureExtractor does (periodic
// Hann window, centred frames with reflect padding, |STFT|^2 over n_fft 400 / hop 160, Slaney
// mel filters up to 8 kHz, log10 clamped at 1e-10, floor at max - 8, then (x + 4) / 4), on
// audio padded or cut to 30 s or on a whole long signal. The STFT runs on math::Fft, the FFT
// the DFT and STFT ops use.
#include <Eigen/Dense>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <limits>
#include <numbers>

#include "engine/util/fft.h"
#include "kiln/audio.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr int kFft = 400, kHop = 160, kBins = kFft / 2 + 1;
constexpr int64_t kWindowFrames = 3000;                   // 30 s at 16 kHz
constexpr int64_t kWindowSamples = kWindowFrames * kHop;  // 480000
constexpr int64_t kBlockFrames = 512;  // frames transformed per matrix product (even)

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

void check_mels(int64_t n_mels) {
  if (n_mels <= 0 || n_mels > 256)
    throw Error(ErrorKind::InvalidArgument,
                "bad number of mel bins: " + std::to_string(n_mels) + " (expected 1 to 256)");
}

// Sample i of x[0, n) as torch.stft(center=True) sees it: indices before the start or past
// the end mirror back inside (reflect padding by n_fft / 2, so n must exceed n_fft / 2).
double reflected(const float* x, int64_t n, int64_t i) {
  if (i < 0) i = -i;
  if (i >= n) i = 2 * (n - 1) - i;
  return x[i];
}

// The log10 mel energies of the first `frames` centred frames of x[0, n), written to
// out[m * frames + f]. Returns their maximum, which sets the floor. Frames go through the
// FFT and the filter product kBlockFrames at a time, so hours of audio need no more than
// the output.
double log_mel_energies(const float* x, int64_t n, int64_t frames, int64_t n_mels, float* out) {
  std::array<double, kFft> window;  // periodic Hann
  for (int t = 0; t < kFft; ++t)
    window[t] = 0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * t / kFft);
  const Eigen::MatrixXd filters = mel_filters(static_cast<int>(n_mels));
  const math::Fft fft(kFft);
  std::vector<std::complex<double>> z(kFft), scratch(static_cast<size_t>(fft.scratch_size()));
  Eigen::MatrixXd power(kBlockFrames, kBins);
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t first = 0; first < frames; first += kBlockFrames) {
    const int64_t count = std::min(kBlockFrames, frames - first);
    // |STFT|^2, two real frames per complex transform: with z = a + ib for real frames a
    // and b, A[k] = (Z[k] + conj(Z[n-k])) / 2 and B[k] = (Z[k] - conj(Z[n-k])) / 2i.
    for (int64_t f = 0; f < count; f += 2) {
      const int64_t a0 = (first + f) * kHop - kFft / 2;
      const bool pair = f + 1 < count;
      for (int t = 0; t < kFft; ++t) {
        const double a = reflected(x, n, a0 + t);
        const double b = pair ? reflected(x, n, a0 + kHop + t) : 0.0;
        z[t] = {a * window[t], b * window[t]};
      }
      fft.run(z.data(), scratch.data(), false);
      for (int k = 0; k < kBins; ++k) {
        const std::complex<double> zk = z[k], zr = std::conj(z[(kFft - k) % kFft]);
        power(f, k) = 0.25 * std::norm(zk + zr);
        if (pair) power(f + 1, k) = 0.25 * std::norm(zk - zr);
      }
    }
    const Eigen::MatrixXd mel =
        (power.topRows(count) * filters).array().max(1e-10).log10();  // [count x n_mels]
    max = std::max(max, mel.maxCoeff());
    for (int64_t m = 0; m < n_mels; ++m) {
      for (int64_t f = 0; f < count; ++f)
        out[m * frames + first + f] = static_cast<float>(mel(f, m));
    }
  }
  return max;
}

// Whisper's scaling of log10 energies: floor at max - 8, then (x + 4) / 4.
void scale(float* v, int64_t count, double max) {
  const double floor = max - 8.0;
  for (int64_t i = 0; i < count; ++i)
    v[i] = static_cast<float>((std::max(static_cast<double>(v[i]), floor) + 4.0) / 4.0);
}

}  // namespace

Tensor whisper_log_mel(const std::vector<float>& samples, int64_t n_mels) {
  check_mels(n_mels);
  // Pad (or cut) to 30 s first, as the feature extractor does: the reflected border at the
  // end then mirrors the padding.
  std::vector<float> chunk(static_cast<size_t>(kWindowSamples), 0.0f);
  std::copy_n(samples.begin(), std::min(samples.size(), chunk.size()), chunk.begin());
  Tensor out = Tensor::zeros(DataType::Float, {1, n_mels, kWindowFrames});
  float* o = out.data<float>();
  scale(o, out.numel(), log_mel_energies(chunk.data(), kWindowSamples, kWindowFrames, n_mels, o));
  return out;
}

Tensor whisper_log_mel_long(const std::vector<float>& samples, int64_t n_mels) {
  check_mels(n_mels);
  const auto n = static_cast<int64_t>(samples.size());
  if (n <= kFft / 2) {
    throw Error(ErrorKind::InvalidArgument,
                std::to_string(n) + " samples: long-form log-mel features need more than " +
                    std::to_string(kFft / 2) + " (the reflected border of a frame)");
  }
  // The STFT has n / hop + 1 centred frames; the feature extractor drops the last.
  const int64_t frames = n / kHop;
  Tensor out = Tensor::zeros(DataType::Float, {1, n_mels, frames});
  float* o = out.data<float>();
  scale(o, out.numel(), log_mel_energies(samples.data(), n, frames, n_mels, o));
  return out;
}

Tensor whisper_log_mel_window(const Tensor& features, int64_t start, int64_t frames) {
  if (features.dtype() != DataType::Float || features.rank() != 3) {
    throw Error(
        ErrorKind::InvalidArgument,
        "log-mel features must be float32[batch, mels, frames], not " + features.describe());
  }
  const int64_t total = features.dim(2);
  if (start < 0 || start >= total) {
    throw Error(ErrorKind::InvalidArgument, "window start " + std::to_string(start) +
                                                " outside the features' " + std::to_string(total) +
                                                " frames");
  }
  if (frames <= 0)
    throw Error(ErrorKind::InvalidArgument, "window of " + std::to_string(frames) + " frames");
  const Tensor in = features.contiguous();
  Tensor out = Tensor::zeros(DataType::Float, {in.dim(0), in.dim(1), frames});
  const int64_t copied = std::min(frames, total - start);
  const float* src = in.data<const float>();
  float* dst = out.data<float>();
  for (int64_t row = 0; row < in.dim(0) * in.dim(1); ++row)
    std::copy_n(src + row * total + start, copied, dst + row * frames);
  return out;
}

}  // namespace kiln
