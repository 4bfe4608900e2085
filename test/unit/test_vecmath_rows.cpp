// The dispatched row kernels (softmax, log-softmax, layer and RMS normalisation, sum, max;
// ops/math/impl/vecmath_rows.h) against naive double loops on random rows of odd lengths, at every
// instruction-set level, and the float ops that use the vector kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test/unit/isa_test.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();
const int64_t kLengths[] = {1, 2, 3, 5, 7, 15, 17, 31, 33, 47, 100, 257, 1001, 1539};

double ulp_of(double r) {
  const double a = std::fabs(r);
  if (a < 0x1p-126) return 0x1p-149;
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 24);
}

std::vector<float> random_row(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

KILN_ISA_TEST_CASE("vector softmax and log-softmax match a double reference", "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  std::mt19937 rng(5);
  // Errors in ulp of each output: a few roundings plus |x - max| ulp from rounding x - max
  // to float (a property of the input, not of the kernel).
  double worst_sm = 0, worst_lsm = 0;
  for (int64_t n : kLengths) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x = random_row(n, rng, variant == 1 ? -60.0f : -8.0f, 8.0f);
      if (variant == 2) {  // masked entries, as attention writes them
        for (size_t i = 1; i < x.size(); i += 3) x[i] = -kInfF;
      }
      if (variant == 3) {  // a large offset: the max is subtracted first
        for (float& e : x) e += 1000.0f;
      }
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (float e : x) m = std::max(m, double(e));
      for (float e : x) s += std::exp(double(e) - m);
      std::vector<float> y(x.size() + 1, 99.0f), z(x.size() + 1, 99.0f);
      v.softmax(x.data(), y.data(), n);
      v.log_softmax(x.data(), z.data(), n);
      REQUIRE(y.back() == 99.0f);
      REQUIRE(z.back() == 99.0f);
      for (size_t i = 0; i < x.size(); ++i) {
        const double d = double(x[i]) - m;
        const double want = std::exp(d) / s, want_log = d - std::log(s);
        if (x[i] == -kInfF) {
          REQUIRE(y[i] == 0.0f);
          REQUIRE(z[i] == -kInfF);
          continue;
        }
        const double e_sm = std::fabs(y[i] - want) / ulp_of(want) / (1 + std::fabs(d));
        const double e_lsm =
            std::fabs(z[i] - want_log) / ulp_of(std::fabs(d) + std::fabs(std::log(s)) + 1);
        worst_sm = std::max(worst_sm, e_sm);
        worst_lsm = std::max(worst_lsm, e_lsm);
      }
      // In place gives the same bits.
      std::vector<float> xi = x;
      v.softmax(xi.data(), xi.data(), n);
      REQUIRE(std::equal(xi.begin(), xi.end(), y.begin()));
    }
  }
  INFO("softmax: " << worst_sm << " ulp per (1 + |x - max|), log-softmax: " << worst_lsm);
  CHECK(worst_sm <= 4.0);
  CHECK(worst_lsm <= 2.0);

  // Rows the ops always turned into NaN: all -inf, +inf present, NaN present.
  for (float bad : {-kInfF, kInfF, NAN}) {
    std::vector<float> x = {1.0f, 2.0f, bad, 0.5f, -3.0f};
    if (bad == -kInfF) std::fill(x.begin(), x.end(), -kInfF);
    std::vector<float> y(x.size()), z(x.size());
    v.softmax(x.data(), y.data(), 5);
    v.log_softmax(x.data(), z.data(), 5);
    for (size_t i = 0; i < x.size(); ++i) {
      CHECK(std::isnan(y[i]));
      CHECK(std::isnan(z[i]));
    }
  }
}

KILN_ISA_TEST_CASE("vector softmax numerators match a double reference", "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  std::mt19937 rng(6);
  for (int64_t n : kLengths) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x = random_row(n, rng, -8.0f, 8.0f);
      std::vector<float> bias = random_row(n, rng, -2.0f, 0.0f);
      if (variant == 1) {  // masked keys, as BERT exports write them, and -inf
        for (size_t i = 1; i < x.size(); i += 3) bias[i] = std::numeric_limits<float>::lowest();
        for (size_t i = 2; i < x.size(); i += 5) bias[i] = -kInfF;
      }
      const bool with_bias = variant != 2;
      double m = -std::numeric_limits<double>::infinity();
      std::vector<float> b(x.size());  // x + bias, rounded as the kernel adds
      for (size_t i = 0; i < x.size(); ++i) {
        b[i] = with_bias ? x[i] + bias[i] : x[i];
        m = std::max(m, double(b[i]));
      }
      if (variant == 3) {  // every key masked: zeros, sum 0
        std::fill(bias.begin(), bias.end(), -kInfF);
        m = -std::numeric_limits<double>::infinity();
      }
      std::vector<float> y = x;
      y.push_back(99.0f);
      const float sum = v.softmax_numerators(y.data(), with_bias ? bias.data() : nullptr, n);
      REQUIRE(y.back() == 99.0f);
      if (variant == 3) {
        CHECK(sum == 0.0f);
        for (int64_t i = 0; i < n; ++i) REQUIRE(y[static_cast<size_t>(i)] == 0.0f);
        continue;
      }
      double want_sum = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp(double(b[i]) - m);
        want_sum += want;
        REQUIRE(std::fabs(y[i] - want) <= 4 * ulp_of(want) * (1 + std::fabs(double(b[i]) - m)));
      }
      REQUIRE(std::fabs(sum - want_sum) <= 1e-5 * want_sum);
    }
  }
  // NaN and a max of +inf give NaN sums.
  for (float bad : {kInfF, NAN}) {
    std::vector<float> x = {1.0f, 2.0f, bad, 0.5f, -3.0f};
    CHECK(std::isnan(v.softmax_numerators(x.data(), nullptr, 5)));
  }
}

KILN_ISA_TEST_CASE("vector layer and RMS normalisation match a double reference",
                   "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  std::mt19937 rng(9);
  double worst = 0, worst_stat = 0;
  for (int64_t n : kLengths) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x = random_row(n, rng, -3.0f, 3.0f);
      if (variant == 3) {
        for (float& e : x) e += 500.0f;  // the variance about a large mean
      }
      const std::vector<float> scale = random_row(n, rng, -2.0f, 2.0f);
      const std::vector<float> bias = random_row(n, rng, -1.0f, 1.0f);
      const bool has_scale = variant != 1, has_bias = variant != 2;
      const float eps = 1e-5f;
      double mu = 0, var = 0, sq = 0, abs_sum = 0;
      for (float e : x) mu += e, sq += double(e) * e, abs_sum += std::fabs(e);
      mu /= double(n);
      for (float e : x) var += (e - mu) * (e - mu);
      var /= double(n);
      const double inv = 1 / std::sqrt(var + eps), inv_rms = 1 / std::sqrt(sq / double(n) + eps);
      std::vector<float> y(x.size() + 1, 99.0f), r(x.size() + 1, 99.0f);
      float mean_out = 0, inv_out = 0, inv_rms_out = 0;
      v.layer_norm(x.data(), y.data(), n, has_scale ? scale.data() : nullptr,
                   has_bias ? bias.data() : nullptr, eps, &mean_out, &inv_out);
      v.rms_norm(x.data(), r.data(), n, has_scale ? scale.data() : nullptr, eps, &inv_rms_out);
      REQUIRE(y.back() == 99.0f);
      REQUIRE(r.back() == 99.0f);
      worst_stat = std::max(worst_stat, std::fabs(mean_out - mu) / (abs_sum / double(n)) / 2);
      worst_stat = std::max(worst_stat, std::fabs(inv_out - inv) / inv);
      worst_stat = std::max(worst_stat, std::fabs(inv_rms_out - inv_rms) / inv_rms);
      for (size_t i = 0; i < x.size(); ++i) {
        const double s = has_scale ? scale[i] : 1.0, b = has_bias ? bias[i] : 0.0;
        const double want = (x[i] - mu) * inv * s + b, want_r = x[i] * inv_rms * s;
        // Relative to the terms' magnitudes, beyond what the mean's error (checked below:
        // its rounding to float and 3e-7 of the mean |x|) passes on to every element.
        const double mean_rounding =
            std::fabs(s) * (std::fabs(mu) * 0x1p-24 + 3e-7 * abs_sum / double(n)) * inv;
        const double mag = std::fabs(s) * std::fabs(x[i] - mu) * inv + std::fabs(b) + 1e-6;
        worst = std::max(worst, (std::fabs(y[i] - want) - mean_rounding) / mag);
        worst = std::max(worst, std::fabs(r[i] - want_r) / (std::fabs(want_r) + 1e-6));
      }
      // The statistics are optional and in place gives the same bits.
      std::vector<float> xi = x;
      v.layer_norm(xi.data(), xi.data(), n, has_scale ? scale.data() : nullptr,
                   has_bias ? bias.data() : nullptr, eps, nullptr, nullptr);
      REQUIRE(std::equal(xi.begin(), xi.end(), y.begin()));
    }
  }
  INFO("normalised values: " << worst << ", statistics: " << worst_stat);
  CHECK(worst <= 3e-7);
  CHECK(worst_stat <= 1.5e-7);
}

KILN_ISA_TEST_CASE("vector skip layer normalisation matches a double reference",
                   "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  std::mt19937 rng(11);
  double worst = 0;
  for (int64_t n : kLengths) {
    for (int variant = 0; variant < 3; ++variant) {
      const std::vector<float> a = random_row(n, rng, -3.0f, 3.0f);
      const std::vector<float> b = random_row(n, rng, -3.0f, 3.0f);
      const std::vector<float> bias = random_row(n, rng, -1.0f, 1.0f);
      const std::vector<float> scale = random_row(n, rng, -2.0f, 2.0f);
      const std::vector<float> beta = random_row(n, rng, -1.0f, 1.0f);
      const bool has_bias = variant != 1, has_beta = variant != 2;
      const float eps = 1e-6f;
      std::vector<double> s(a.size());
      double mu = 0, var = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        s[i] = double(a[i]) + b[i] + (has_bias ? bias[i] : 0.0f);
        mu += s[i];
      }
      mu /= double(n);
      for (double e : s) var += (e - mu) * (e - mu);
      var /= double(n);
      const double inv = 1 / std::sqrt(var + eps);
      std::vector<float> sum(a.size() + 1, 99.0f), y(a.size() + 1, 99.0f);
      float mean_out = 0, inv_out = 0;
      v.skip_layer_norm(a.data(), b.data(), has_bias ? bias.data() : nullptr, sum.data(), y.data(),
                        n, scale.data(), has_beta ? beta.data() : nullptr, eps, &mean_out,
                        &inv_out);
      REQUIRE(sum.back() == 99.0f);
      REQUIRE(y.back() == 99.0f);
      CHECK(std::fabs(mean_out - mu) <= 1e-6 * (1 + std::fabs(mu)));
      CHECK(std::fabs(inv_out - inv) <= 1e-6 * inv);
      for (size_t i = 0; i < a.size(); ++i) {
        // The sum is float addition in the order a + b + bias.
        const float want_sum = has_bias ? (a[i] + b[i]) + bias[i] : a[i] + b[i];
        REQUIRE(sum[i] == want_sum);
        const double want = (s[i] - mu) * inv * scale[i] + (has_beta ? beta[i] : 0.0);
        worst = std::max(worst, std::fabs(y[i] - want) / (std::fabs(scale[i]) * 4 + 1));
      }
      // Sum and output in place over a, and over b: the same bits.
      std::vector<float> ai = a, bi = b;
      v.skip_layer_norm(ai.data(), bi.data(), has_bias ? bias.data() : nullptr, bi.data(),
                        ai.data(), n, scale.data(), has_beta ? beta.data() : nullptr, eps, nullptr,
                        nullptr);
      REQUIRE(std::equal(ai.begin(), ai.end(), y.begin()));
      REQUIRE(std::equal(bi.begin(), bi.end(), sum.begin()));
    }
  }
  INFO("worst error " << worst);
  CHECK(worst <= 1e-6);
}

KILN_ISA_TEST_CASE("vector sum and max", "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  std::mt19937 rng(13);
  for (int64_t n : kLengths) {
    // All negative: a tail padded with zeros would show up as a max of 0.
    std::vector<float> x = random_row(n, rng, -9.0f, -1.0f);
    double s = 0, a = 0;
    for (float e : x) s += e, a += std::fabs(e);
    CHECK(v.max(x.data(), n) == *std::max_element(x.begin(), x.end()));
    CHECK(std::fabs(v.sum(x.data(), n) - s) <= 1e-6 * a);
    x[static_cast<size_t>(n - 1)] = NAN;  // in the tail for most lengths
    CHECK(std::isnan(v.max(x.data(), n)));
    CHECK(std::isnan(v.sum(x.data(), n)));
  }
  CHECK(v.max(nullptr, 0) == -kInfF);
  CHECK(v.sum(nullptr, 0) == 0.0f);
}

TEST_CASE("float activations on the vector path match double references", "[ops][vecmath]") {
  std::mt19937 rng(17);
  // Three tasks' worth and a tail, so the blocks and their edges are exercised.
  const Tensor x = random_tensor(DataType::Float, {3, 16411}, rng, -6, 6);
  struct Case {
    const char* op;
    const char* approximate;
    double (*f)(double);
  };
  const Case cases[] = {
      {"Exp", nullptr, [](double v) { return std::exp(v); }},
      {"Tanh", nullptr, [](double v) { return std::tanh(v); }},
      {"Erf", nullptr, [](double v) { return std::erf(v); }},
      {"Sigmoid", nullptr, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"Gelu", "none", [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }},
      {"Gelu", "tanh",
       [](double v) {
         return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
       }},
      {"Swish", nullptr, [](double v) { return v / (1 + std::exp(-v)); }},
  };
  for (const Case& c : cases) {
    INFO(c.op << (c.approximate ? c.approximate : ""));
    Tensor want = Tensor::zeros(DataType::Float, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) want.data<float>()[i] = float(c.f(element(x, i)));
    const int64_t opset = std::string(c.op) == "Swish" ? 24 : 20;
    OpTest t(c.op, opset);
    t.input(x);
    if (c.approximate) t.attr("approximate", c.approximate);
    require_close(t.run1(), want, 1e-6, 1e-7);
    OpTest in_place(c.op, opset);
    in_place.input(x.clone()).owned_inputs();
    if (c.approximate) in_place.attr("approximate", c.approximate);
    require_close(in_place.run1(), want, 1e-6, 1e-7);
    CHECK(in_place.stats().in_place_ops == 1);
  }
  Tensor lx = random_tensor(DataType::Float, {4, 40000}, rng, 0.01, 50);
  Tensor lwant = Tensor::zeros(DataType::Float, lx.shape());
  for (int64_t i = 0; i < lx.numel(); ++i) lwant.data<float>()[i] = float(std::log(element(lx, i)));
  require_close(OpTest("Log", 13).input(lx).run1(), lwant, 1e-6, 1e-7);
}
