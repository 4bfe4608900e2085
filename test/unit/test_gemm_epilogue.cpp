// The GEMM epilogue's vector activations (ops/math/gemm.h Activation: Gelu, GeluTanh, Silu,
// QuickGelu, Sigmoid, Tanh), at every instruction-set level: sgemm with bias and each activation
// against the naive double product followed by the double-precision activation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/math/gemm.h"
#include "test/unit/isa_test.h"

using namespace kiln;
using math::Activation;
using math::MatrixView;

namespace {

double activate(Activation act, double v) {
  const double sig = v >= 0 ? 1 / (1 + std::exp(-v)) : std::exp(v) / (1 + std::exp(v));
  switch (act) {
    case Activation::Gelu:
      return 0.5 * v * std::erfc(-v / std::sqrt(2.0));
    case Activation::GeluTanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case Activation::Silu:
      return v * sig;
    case Activation::QuickGelu: {
      const double z = static_cast<double>(math::kQuickGeluAlpha) * v;
      return v * (z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z)));
    }
    case Activation::Sigmoid:
      return sig;
    case Activation::Tanh:
      return std::tanh(v);
    case Activation::Relu:
      return v > 0 ? v : 0;
    case Activation::None:
      break;
  }
  return v;
}

const char* name_of(Activation act) {
  switch (act) {
    case Activation::Gelu:
      return "Gelu";
    case Activation::GeluTanh:
      return "GeluTanh";
    case Activation::Silu:
      return "Silu";
    case Activation::QuickGelu:
      return "QuickGelu";
    case Activation::Sigmoid:
      return "Sigmoid";
    case Activation::Tanh:
      return "Tanh";
    default:
      return "other";
  }
}

}  // namespace

KILN_ISA_TEST_CASE("sgemm epilogue applies the vector activations after the bias",
                   "[math][gemm][vecmath]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  struct Shape {
    int64_t m, n, k;
    bool packed;
  };
  // A GEMV, tiles with edges, more rows than 4 tiles (B packed on the fly), k across blocks.
  const Shape shapes[] = {
      {1, 37, 19, false}, {7, 45, 64, false}, {61, 83, 300, false}, {29, 70, 33, true}};
  for (Activation act : {Activation::Gelu, Activation::GeluTanh, Activation::Silu,
                         Activation::QuickGelu, Activation::Sigmoid, Activation::Tanh}) {
    for (const Shape& sh : shapes) {
      INFO(name_of(act) << " m=" << sh.m << " n=" << sh.n << " k=" << sh.k);
      std::vector<float> a(static_cast<size_t>(sh.m * sh.k)), b(static_cast<size_t>(sh.k * sh.n));
      std::vector<float> bias(static_cast<size_t>(sh.n));
      for (float& x : a) x = dist(rng);
      for (float& x : b) x = dist(rng);
      for (float& x : bias) x = 2 * dist(rng);
      const MatrixView av = MatrixView::row_major(a.data(), sh.m, sh.k, sh.k);
      const MatrixView bv = MatrixView::row_major(b.data(), sh.k, sh.n, sh.n);
      math::GemmOptions o;
      o.bias = bias.data();
      o.activation = act;
      o.kernels = &isa_kernels;
      // Scaled so that the pre-activations reach the tails and the bends of each function.
      o.alpha = 6.0f / std::sqrt(static_cast<float>(sh.k));
      std::vector<float> c(static_cast<size_t>(sh.m * sh.n), 7.0f);
      if (sh.packed) {
        const math::PackedB pb(bv, &isa_kernels);
        math::sgemm(av, pb, c.data(), sh.n, o);
      } else {
        math::sgemm(av, bv, c.data(), sh.n, o);
      }
      double worst = 0;
      for (int64_t i = 0; i < sh.m; ++i) {
        for (int64_t j = 0; j < sh.n; ++j) {
          double s = 0, mag = 0;
          for (int64_t p = 0; p < sh.k; ++p) {
            const double t =
                double(a[static_cast<size_t>(i * sh.k + p)]) * b[static_cast<size_t>(p * sh.n + j)];
            s += t;
            mag += std::fabs(t);
          }
          const double pre = o.alpha * s + bias[static_cast<size_t>(j)];
          const double want = activate(act, pre);
          // The float product's error (a few ulp of the summed magnitudes, times the
          // activation's slope, at most 1.13) plus a few ulp of the activation itself.
          const double tol = 1e-6 * (o.alpha * mag + std::fabs(bias[static_cast<size_t>(j)])) +
                             4e-7 * std::fabs(want);
          worst = std::max(worst, std::fabs(c[static_cast<size_t>(i * sh.n + j)] - want) / tol);
        }
      }
      CHECK(worst <= 1.0);
    }
  }
}
