// The int8 GEMM with float A quantized per row (math::QRowFloatA, the products of
// SessionOptions::gemm_weights = Int8) at every instruction-set level (and AVX-512 without
// VNNI): against a naive loop of exactly the same quantization (each row of A to uint8 with
// its own scale and zero point, B symmetric int8 with one scale per column), sums in int64,
// scaled by alpha * row scale * column scale in float, plus the column bias, accumulation
// and row bias. Random shapes (M = 1, odd K and N, K off the k groups and across the packer's
// chunks, M across row blocks and threads), rows of one sign, of zeros and with NaNs. Results
// must be equal bit for bit.
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

// One random product: float A (m x k, row stride lda), float B (k x n) quantized per column,
// alpha and the epilogue's operands.
struct Case {
  int64_t m = 0, k = 0, n = 0, lda = 0;
  std::vector<float> a;
  std::vector<int8_t> qb;             // B quantized, row-major k x n
  std::vector<float> col_scales;      // n
  std::vector<float> bias, row_bias;  // empty: none
  float alpha = 1.0f;
  bool accumulate = false;
};

// B's columns quantized as pack_constant_b quantizes int8 weights.
void quantize_columns(const std::vector<float>& b, Case& c) {
  c.qb.assign(static_cast<size_t>(c.k * c.n), 0);
  c.col_scales.assign(static_cast<size_t>(c.n), 1.0f);
  for (int64_t j = 0; j < c.n; ++j) {
    float amax = 0.0f;
    for (int64_t p = 0; p < c.k; ++p)
      amax = std::max(amax, std::abs(b[static_cast<size_t>(p * c.n + j)]));
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    c.col_scales[static_cast<size_t>(j)] = s;
    for (int64_t p = 0; p < c.k; ++p) {
      const float r = std::nearbyint(b[static_cast<size_t>(p * c.n + j)] / s);
      c.qb[static_cast<size_t>(p * c.n + j)] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

Case random_case(int64_t m, int64_t k, int64_t n, std::mt19937& rng) {
  Case c;
  c.m = m, c.k = k, c.n = n;
  c.lda = k + static_cast<int64_t>(rng() % 5);
  std::uniform_real_distribution<float> d(-3.0f, 5.0f);
  c.a.resize(static_cast<size_t>(m * c.lda));
  for (int64_t i = 0; i < m; ++i) {
    // Rows of both signs, of one sign (zero point at an end), of zeros, and with NaNs.
    const int kind = static_cast<int>(rng() % 6);
    const float offset = kind == 1 ? 4.0f : (kind == 2 ? -6.0f : 0.0f);
    for (int64_t p = 0; p < k; ++p) {
      float& x = c.a[static_cast<size_t>(i * c.lda + p)];
      x = kind == 3 ? 0.0f : d(rng) * (1.0f + static_cast<float>(i % 3)) + offset;
      if (kind == 4 && p % 7 == 2) x = std::numeric_limits<float>::quiet_NaN();
    }
  }
  std::vector<float> b(static_cast<size_t>(k * n));
  std::normal_distribution<float> w(0.0f, 0.2f);
  for (float& x : b) x = w(rng);
  if (n > 2) {
    for (int64_t p = 0; p < k; ++p) b[static_cast<size_t>(p * n + 1)] = 0.0f;  // a zero column
  }
  quantize_columns(b, c);
  if (rng() % 2) {
    c.bias.resize(static_cast<size_t>(n));
    for (float& x : c.bias) x = d(rng);
  }
  if (rng() % 3 == 0) {
    c.row_bias.resize(static_cast<size_t>(m));
    for (float& x : c.row_bias) x = d(rng);
  }
  c.alpha = rng() % 2 ? 1.0f : 0.75f;
  c.accumulate = rng() % 4 == 0;
  return c;
}

// The naive result over `start` (the output's prior values when accumulating).
std::vector<float> naive(const Case& c, const std::vector<float>& start) {
  std::vector<float> y = start;
  for (int64_t i = 0; i < c.m; ++i) {
    const float* row = c.a.data() + i * c.lda;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t p = 0; p < c.k; ++p) {
      if (std::isnan(row[p])) continue;
      lo = std::min(lo, row[p]);
      hi = std::max(hi, row[p]);
    }
    float scale = 0.0f, zero = 0.0f;
    math::row_quant_params(lo, hi, &scale, &zero);
    const float row_scale = c.alpha * scale;
    for (int64_t j = 0; j < c.n; ++j) {
      int64_t sum = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const float q = std::nearbyint(row[p] / scale) + zero;
        const int64_t qa = std::isnan(q) ? 0 : static_cast<int64_t>(std::clamp(q, 0.0f, 255.0f));
        sum += (qa - static_cast<int64_t>(zero)) * c.qb[static_cast<size_t>(p * c.n + j)];
      }
      const float s = row_scale * c.col_scales[static_cast<size_t>(j)];
      float v = static_cast<float>(sum) * s;
      if (!c.bias.empty()) v += c.bias[static_cast<size_t>(j)];
      float& out = y[static_cast<size_t>(i * c.n + j)];
      out = c.accumulate ? out + v : v;
      if (!c.row_bias.empty()) out += c.row_bias[static_cast<size_t>(i)];
    }
  }
  return y;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

void check(const Case& c, const math::MathKernels& kernels, int threads) {
  INFO("m " << c.m << " k " << c.k << " n " << c.n << " lda " << c.lda << " bias "
            << !c.bias.empty() << " row bias " << !c.row_bias.empty() << " alpha " << c.alpha
            << " accumulate " << c.accumulate << " threads " << threads);
  std::vector<float> start(static_cast<size_t>(c.m * c.n));
  for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(i % 13) * 0.25f - 1.0f;
  const std::vector<float> want = naive(c, start);
  const math::QPackedB packed(math::QMatrixView::row_major(c.qb.data(), c.k, c.n, c.n, true),
                              &kernels);
  math::QGemmOptions o;
  o.max_threads = threads;
  o.kernels = &kernels;
  std::vector<float> got = start;
  math::QGemmOutput out =
      math::QGemmOutput::to_float(got.data(), c.n, c.col_scales.data(), true,
                                  c.bias.empty() ? nullptr : c.bias.data(), c.accumulate);
  out.f_row_bias = c.row_bias.empty() ? nullptr : c.row_bias.data();
  math::qgemm(math::QRowFloatA{c.a.data(), c.m, c.k, c.lda, c.alpha}, packed, out, o);
  REQUIRE(same_bits(got, want));
}

}  // namespace

QGEMM_TEST_CASE("qgemm of float A quantized per row equals the naive per-row product",
                "[math][qgemm][quant][isa]") {
  const math::MathKernels* kernels = testing::kernels_of(TestType::isa, TestType::extensions);
  if (!kernels) return;
  std::mt19937 rng(4242);
  const int64_t ms[] = {1, 1, 2, 3, 5, 13, 31};
  const int64_t ks[] = {1, 3, 5, 7, 17, 64, 255, 257, 300, 515};
  const int64_t ns[] = {1, 3, 5, 16, 31, 33, 70};
  for (int trial = 0; trial < 48; ++trial) {
    const Case c = random_case(ms[rng() % std::size(ms)], ks[rng() % std::size(ks)],
                               ns[rng() % std::size(ns)], rng);
    check(c, *kernels, 1);
  }
}

QGEMM_TEST_CASE("qgemm of float A quantized per row crosses row blocks and threads",
                "[math][qgemm][quant][isa]") {
  const math::MathKernels* kernels = testing::kernels_of(TestType::isa, TestType::extensions);
  if (!kernels) return;
  std::mt19937 rng(91);
  const Case c = random_case(203, 1537, 71, rng);
  check(c, *kernels, 1);
  check(c, *kernels, 0);
  // Enough of A (over 2^21 values) for the rows' ranges to be found by several tasks.
  const Case tall = random_case(1500, 1537, 17, rng);
  check(tall, *kernels, 0);
}

TEST_CASE("row_quant_params widens the range to zero and keeps zero exact",
          "[math][qgemm][quant]") {
  float s = 0.0f, z = 0.0f;
  math::row_quant_params(0.0f, 0.0f, &s, &z);  // a row of zeros
  CHECK(s == 1.0f / 255.0f);
  CHECK(z == 0.0f);
  math::row_quant_params(0.0f, 2.55f, &s, &z);  // all positive: zero point 0, 255 steps above
  CHECK(z == 0.0f);
  CHECK(std::abs(s - 0.01f) < 1e-7f);
  math::row_quant_params(-2.55f, 0.0f, &s, &z);  // all negative
  CHECK(z == 255.0f);
  math::row_quant_params(-1.0f, 3.0f, &s, &z);
  CHECK(z == std::nearbyint(1.0f / (4.0f / 255.0f)));
}

TEST_CASE("qgemm of float A quantized per row needs a float output", "[math][qgemm][quant]") {
  const std::vector<float> a(6, 1.0f);
  const std::vector<int8_t> b(8, 1);
  std::vector<int32_t> c(8, 0);
  const math::QPackedB packed(math::QMatrixView::row_major(b.data(), 2, 4, 4, true));
  REQUIRE_THROWS_AS(math::qgemm(math::QRowFloatA{a.data(), 2, 2, 3, 1.0f}, packed,
                                math::QGemmOutput::int32(c.data(), 4)),
                    Error);
}
