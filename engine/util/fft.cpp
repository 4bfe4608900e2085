#include "engine/util/fft.h"

#include <cmath>
#include <numbers>
#include <utility>

#include "kiln/error.h"

namespace kiln::math {
namespace {

using cd = std::complex<double>;

// a * b without std::complex's operator*, which checks every product for NaN and then calls
// a library routine to recover infinities (C Annex G). That check halves the FFT's speed; as
// in other FFT libraries, a NaN or infinite input simply gives NaN outputs.
inline cd mul(cd a, cd b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

// Twiddles e^{-2 pi i k / p} for k < p / 2.
std::vector<cd> twiddles(int64_t p) {
  std::vector<cd> tw(static_cast<size_t>(p / 2));
  for (int64_t k = 0; k < p / 2; ++k) {
    const double a = -2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(p);
    tw[static_cast<size_t>(k)] = cd(std::cos(a), std::sin(a));
  }
  return tw;
}

// In-place forward FFT of a power-of-two length p with twiddles of the same length.
void radix2(cd* a, int64_t p, const cd* tw) {
  for (int64_t i = 1, j = 0; i < p; ++i) {
    int64_t bit = p >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (int64_t len = 2; len <= p; len <<= 1) {
    const int64_t half = len / 2, step = p / len;
    for (int64_t i = 0; i < p; i += len) {
      for (int64_t k = 0; k < half; ++k) {
        const cd v = mul(a[i + k + half], tw[k * step]);
        const cd u = a[i + k];
        a[i + k] = u + v;
        a[i + k + half] = u - v;
      }
    }
  }
}

bool is_pow2(int64_t n) {
  return n > 0 && (n & (n - 1)) == 0;
}

}  // namespace

Fft::Fft(int64_t n) : n_(n) {
  if (n < 1) throw Error(ErrorKind::InvalidArgument, "FFT length must be positive");
  if (is_pow2(n)) {
    tw_ = twiddles(n);
    return;
  }
  m_ = 1;
  while (m_ < 2 * n - 1) m_ <<= 1;
  tw_ = twiddles(m_);
  chirp_.resize(static_cast<size_t>(n));
  const uint64_t two_n = 2 * static_cast<uint64_t>(n);
  for (int64_t j = 0; j < n; ++j) {
    // j^2 mod 2n keeps the angle small, so the chirp stays accurate for long signals.
    const uint64_t q = static_cast<uint64_t>(j) * static_cast<uint64_t>(j) % two_n;
    const double a = -std::numbers::pi * static_cast<double>(q) / static_cast<double>(n);
    chirp_[static_cast<size_t>(j)] = cd(std::cos(a), std::sin(a));
  }
  kernel_.assign(static_cast<size_t>(m_), cd(0, 0));
  kernel_[0] = std::conj(chirp_[0]);
  for (int64_t j = 1; j < n; ++j) {
    kernel_[static_cast<size_t>(j)] = kernel_[static_cast<size_t>(m_ - j)] =
        std::conj(chirp_[static_cast<size_t>(j)]);
  }
  radix2(kernel_.data(), m_, tw_.data());
}

void Fft::run(Complex* data, Complex* scratch, bool inverse) const {
  if (inverse) {
    for (int64_t i = 0; i < n_; ++i) data[i] = std::conj(data[i]);
  }
  if (m_ == 0) {
    radix2(data, n_, tw_.data());
  } else {
    for (int64_t j = 0; j < n_; ++j) scratch[j] = mul(data[j], chirp_[static_cast<size_t>(j)]);
    for (int64_t j = n_; j < m_; ++j) scratch[j] = cd(0, 0);
    radix2(scratch, m_, tw_.data());
    for (int64_t k = 0; k < m_; ++k) {
      scratch[k] = std::conj(mul(scratch[k], kernel_[static_cast<size_t>(k)]));
    }
    radix2(scratch, m_, tw_.data());  // conj(fft(conj(.))) is the inverse, times m
    const double scale = 1.0 / static_cast<double>(m_);
    for (int64_t k = 0; k < n_; ++k) {
      data[k] = mul(std::conj(scratch[k]), chirp_[static_cast<size_t>(k)]) * scale;
    }
  }
  if (inverse) {
    for (int64_t i = 0; i < n_; ++i) data[i] = std::conj(data[i]);
  }
}

}  // namespace kiln::math
