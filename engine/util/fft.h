// One FFT for kiln: the DFT and STFT ops and Whisper's log-mel front end use it. Double
// precision throughout: an iterative radix-2 FFT for power-of-two lengths and Bluestein's
// chirp-z algorithm (a power-of-two convolution) for the others, so every length costs
// O(n log n) and odd or prime lengths are as accurate as powers of two.
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

namespace kiln::math {

// A plan for transforms of one length n >= 1; const after construction, so threads can share
// it (each brings its own scratch).
class Fft {
 public:
  using Complex = std::complex<double>;

  explicit Fft(int64_t n);

  int64_t size() const { return n_; }
  // Elements of scratch run() needs (0 for a power of two).
  int64_t scratch_size() const { return m_; }

  // In place: data[k] = sum_j data[j] e^{-+2 pi i jk / n}, unnormalised; `inverse` flips the
  // sign of the exponent.
  void run(Complex* data, Complex* scratch, bool inverse) const;

 private:
  int64_t n_, m_ = 0;  // m_: the power-of-two convolution length of Bluestein's algorithm
  std::vector<Complex> tw_, chirp_, kernel_;
};

}  // namespace kiln::math
