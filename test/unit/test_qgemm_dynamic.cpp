// The int8 GEMM with float A quantized as it is packed (math::QFloatA, the fused path of
// DynamicQuantizeMatMul) at every instruction-set level (and AVX-512 without VNNI): against a
// naive loop that quantizes A as DynamicQuantizeLinear does (round half to even of x / scale,
// plus the zero point, saturated; NaN to 0), sums in int64 and scales in float, and against
// the unfused qgemm of the uint8 tensor. Random shapes (K across the packer's chunks and off
// the k groups, M across row blocks), ties, NaNs, B of either signedness with zero points per
// tensor or per column, per-column scales, biases and accumulation. Results must be equal
// bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kiln/error.h"
#include "ops/math/qgemm.h"
#include "test/unit/isa_test.h"
#include "test/unit/qgemm_levels.h"

using namespace kiln;

namespace {

// One random product: float A (rows x k, row stride lda), B (k x n, 8-bit), B's zero points,
// the output's scales and bias.
struct Case {
  int64_t m = 0, k = 0, n = 0, lda = 0;
  std::vector<float> a;
  std::vector<uint8_t> b;
  bool b_signed = false;
  std::vector<int32_t> zb;  // one (per tensor) or n values
  std::vector<float> scales;
  std::vector<float> bias;  // empty: none
  bool accumulate = false;
  float a_scale = 1.0f, a_zero = 0.0f;
};

// DynamicQuantizeLinear's parameters over A's rows.
void dynamic_params(Case& c) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t p = 0; p < c.k; ++p) {
      const float x = c.a[static_cast<size_t>(i * c.lda + p)];
      if (std::isnan(x)) continue;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  c.a_scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
  c.a_zero = std::nearbyint(std::clamp(-lo / c.a_scale, 0.0f, 255.0f));
}

Case random_case(int64_t m, int64_t k, int64_t n, std::mt19937& rng) {
  Case c;
  c.m = m, c.k = k, c.n = n;
  c.lda = k + static_cast<int64_t>(rng() % 5);
  std::uniform_real_distribution<float> d(-3.0f, 5.0f);
  c.a.resize(static_cast<size_t>(m * c.lda));
  for (float& x : c.a) x = d(rng);
  dynamic_params(c);
  // Ties half-way between quantization steps and NaNs (skipped by the range, quantized to 0).
  for (size_t i = 0; i < c.a.size(); ++i) {
    if (i % 11 == 3) c.a[i] = (static_cast<float>(rng() % 64) - 20.5f) * c.a_scale;
    if (i % 97 == 5) c.a[i] = std::numeric_limits<float>::quiet_NaN();
  }
  dynamic_params(c);
  c.b_signed = rng() % 2 == 0;
  c.b.resize(static_cast<size_t>(k * n));
  for (uint8_t& v : c.b) v = static_cast<uint8_t>(rng());
  const auto zero = [&] {
    const auto v = static_cast<uint8_t>(rng());
    return c.b_signed ? static_cast<int32_t>(static_cast<int8_t>(v)) : static_cast<int32_t>(v);
  };
  switch (rng() % 3) {
    case 0:
      c.zb = {0};
      break;
    case 1:
      c.zb = {zero()};
      break;
    default:
      for (int64_t j = 0; j < n; ++j) c.zb.push_back(zero());
  }
  std::uniform_real_distribution<float> s(0.001f, 0.05f);
  c.scales.resize(rng() % 2 ? static_cast<size_t>(n) : 1);
  for (float& x : c.scales) x = s(rng);
  if (rng() % 2) {
    c.bias.resize(static_cast<size_t>(n));
    for (float& x : c.bias) x = d(rng);
  }
  c.accumulate = rng() % 4 == 0;
  return c;
}

uint8_t quantize(float x, float scale, float zero) {
  const float q = std::nearbyint(x / scale) + zero;
  return std::isnan(q) ? 0 : static_cast<uint8_t>(std::clamp(q, 0.0f, 255.0f));
}

// The naive result over `start` (the output's prior values when accumulating).
std::vector<float> naive(const Case& c, const std::vector<float>& start) {
  std::vector<float> y = start;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      int64_t sum = 0;
      const int64_t zb = c.zb.size() > 1 ? c.zb[static_cast<size_t>(j)] : c.zb[0];
      for (int64_t p = 0; p < c.k; ++p) {
        const int64_t qa = quantize(c.a[static_cast<size_t>(i * c.lda + p)], c.a_scale, c.a_zero);
        const uint8_t raw = c.b[static_cast<size_t>(p * c.n + j)];
        const int64_t bv = c.b_signed ? static_cast<int8_t>(raw) : raw;
        sum += (qa - static_cast<int64_t>(c.a_zero)) * (bv - zb);
      }
      float v = static_cast<float>(static_cast<int32_t>(sum)) *
                c.scales[c.scales.size() > 1 ? static_cast<size_t>(j) : 0];
      if (!c.bias.empty()) v += c.bias[static_cast<size_t>(j)];
      float& out = y[static_cast<size_t>(i * c.n + j)];
      out = c.accumulate ? out + v : v;
    }
  }
  return y;
}

math::QGemmOptions options_of(const Case& c, const math::MathKernels* kernels, int threads) {
  math::QGemmOptions o;
  if (c.zb.size() > 1) {
    o.b_zeros = c.zb.data();
  } else {
    o.b_zero = c.zb[0];
  }
  o.max_threads = threads;
  o.kernels = kernels;
  return o;
}

math::QGemmOutput output_of(const Case& c, std::vector<float>& y) {
  return math::QGemmOutput::to_float(y.data(), c.n, c.scales.data(), c.scales.size() > 1,
                                     c.bias.empty() ? nullptr : c.bias.data(), c.accumulate);
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Runs one case fused (B packed and not) and unfused; all must equal the naive result.
void check(const Case& c, const math::MathKernels& kernels, int threads) {
  INFO("m " << c.m << " k " << c.k << " n " << c.n << " lda " << c.lda << " b signed " << c.b_signed
            << " zb " << c.zb.size() << " scales " << c.scales.size() << " bias " << !c.bias.empty()
            << " accumulate " << c.accumulate << " threads " << threads);
  std::vector<float> start(static_cast<size_t>(c.m * c.n));
  for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(i % 13) * 0.25f - 1.0f;
  const std::vector<float> want = naive(c, start);
  const math::QGemmOptions o = options_of(c, &kernels, threads);
  const math::QMatrixView bv = math::QMatrixView::row_major(c.b.data(), c.k, c.n, c.n, c.b_signed);
  const math::QFloatA fa{c.a.data(), c.m, c.k, c.lda, c.a_scale, c.a_zero};

  std::vector<float> fused = start;
  math::qgemm(fa, math::QPackedB(bv, &kernels), output_of(c, fused), o);
  REQUIRE(same_bits(fused, want));

  std::vector<float> fused_b = start;
  math::qgemm(fa, bv, output_of(c, fused_b), o);
  REQUIRE(same_bits(fused_b, want));

  // The unfused path: the uint8 tensor DynamicQuantizeLinear writes, then its product.
  std::vector<uint8_t> q(static_cast<size_t>(c.m * c.lda), 0);
  for (int64_t i = 0; i < c.m; ++i) {
    kernels.int8_gemm.quantize_u8(c.a.data() + i * c.lda, c.k, c.a_scale, c.a_zero,
                                  q.data() + i * c.lda);
  }
  math::QGemmOptions ou = o;
  ou.a_zero = static_cast<int32_t>(c.a_zero);
  std::vector<float> unfused = start;
  math::qgemm(math::QMatrixView::row_major(q.data(), c.m, c.k, c.lda, false), bv,
              output_of(c, unfused), ou);
  REQUIRE(same_bits(unfused, want));
}

}  // namespace

QGEMM_TEST_CASE("qgemm quantizing float A as it packs equals quantize-then-multiply",
                "[math][qgemm][quant]") {
  const math::MathKernels* kernels = testing::kernels_of(TestType::isa, TestType::extensions);
  if (!kernels) return;
  std::mt19937 rng(1909);
  const int64_t ms[] = {1, 2, 5, 13, 31, 64};
  const int64_t ks[] = {1, 3, 4, 7, 17, 64, 255, 256, 257, 300, 515};
  const int64_t ns[] = {1, 5, 16, 31, 33, 70};
  for (int trial = 0; trial < 40; ++trial) {
    const Case c = random_case(ms[rng() % std::size(ms)], ks[rng() % std::size(ks)],
                               ns[rng() % std::size(ns)], rng);
    check(c, *kernels, 1);
  }
}

QGEMM_TEST_CASE("qgemm quantizing float A crosses row blocks and threads", "[math][qgemm][quant]") {
  const math::MathKernels* kernels = testing::kernels_of(TestType::isa, TestType::extensions);
  if (!kernels) return;
  std::mt19937 rng(77);
  // K = 1536 (MiniLM's second feed-forward product): row blocks of fewer than M rows.
  const Case c = random_case(203, 1536, 70, rng);
  check(c, *kernels, 1);
  check(c, *kernels, 0);
}

TEST_CASE("qgemm with float A checks K and empty products", "[math][qgemm][quant]") {
  const std::vector<float> a(6, 1.0f);
  const std::vector<uint8_t> b(8, 1);
  std::vector<float> y(8, 5.0f);
  const float scale = 1.0f;
  const math::QGemmOutput out = math::QGemmOutput::to_float(y.data(), 4, &scale, false);
  const math::QFloatA fa{a.data(), 2, 3, 3, 0.5f, 10.0f};
  REQUIRE_THROWS_AS(math::qgemm(fa, math::QMatrixView::row_major(b.data(), 2, 4, 4, true), out),
                    Error);
  const math::QFloatA none{a.data(), 0, 2, 2, 0.5f, 10.0f};
  math::qgemm(none, math::QMatrixView::row_major(b.data(), 2, 4, 4, true), out);
  CHECK(y[0] == 5.0f);  // nothing written
}
