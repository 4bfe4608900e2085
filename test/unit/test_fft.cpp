// math::Fft, the one FFT of the DFT/STFT ops and the log-mel front end, against a naive DFT
// in long double, at the double precision both need: powers of two (radix-2), odd, prime
// and composite lengths (Bluestein), forward and inverse.
#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <numbers>
#include <random>
#include <vector>

#include "engine/util/fft.h"
#include "kiln/error.h"

using kiln::math::Fft;
using cd = std::complex<double>;

namespace {

// sum_j x[j] e^{-+2 pi i jk / n}, unnormalised like Fft::run.
std::vector<cd> naive_dft(const std::vector<cd>& x, bool inverse) {
  using cl = std::complex<long double>;
  const size_t n = x.size();
  std::vector<cd> y(n);
  for (size_t k = 0; k < n; ++k) {
    cl acc(0, 0);
    for (size_t j = 0; j < n; ++j) {
      const long double a = (inverse ? 2 : -2) * std::numbers::pi_v<long double> *
                            static_cast<long double>(j * k % n) / static_cast<long double>(n);
      acc += cl(x[j]) * cl(std::cos(a), std::sin(a));
    }
    y[k] = cd(acc);
  }
  return y;
}

}  // namespace

TEST_CASE("Fft equals a naive DFT for power-of-two, odd, prime and composite lengths", "[fft]") {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 97, 100, 128, 400, 401, 509, 1000, 1024}) {
    const Fft fft(n);
    REQUIRE(fft.size() == n);
    std::vector<cd> x(static_cast<size_t>(n));
    for (cd& v : x) v = cd(u(rng), u(rng));
    std::vector<cd> scratch(static_cast<size_t>(fft.scratch_size()));
    for (bool inverse : {false, true}) {
      INFO("n=" << n << " inverse=" << inverse);
      std::vector<cd> y = x;
      fft.run(y.data(), scratch.data(), inverse);
      const std::vector<cd> want = naive_dft(x, inverse);
      // Each output sums n terms of magnitude <= sqrt(2): relative to that, double precision.
      double err = 0;
      for (size_t k = 0; k < y.size(); ++k) err = std::max(err, std::abs(y[k] - want[k]));
      CHECK(err <= 1e-13 * std::sqrt(2.0) * static_cast<double>(n));
    }
  }
}

TEST_CASE("Fft forward then inverse gives n times the signal", "[fft]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int64_t n : {6, 400, 4096, 4099}) {
    const Fft fft(n);
    std::vector<cd> x(static_cast<size_t>(n)), scratch(static_cast<size_t>(fft.scratch_size()));
    for (cd& v : x) v = cd(u(rng), u(rng));
    std::vector<cd> y = x;
    fft.run(y.data(), scratch.data(), false);
    fft.run(y.data(), scratch.data(), true);
    double err = 0;
    for (size_t k = 0; k < y.size(); ++k) {
      err = std::max(err, std::abs(y[k] / static_cast<double>(n) - x[k]));
    }
    INFO("n=" << n);
    CHECK(err <= 1e-13);
  }
}

TEST_CASE("Fft refuses a length below one", "[fft]") {
  CHECK_THROWS_AS(Fft(0), kiln::Error);
  CHECK_THROWS_AS(Fft(-4), kiln::Error);
}
