// The dispatched float math (ops/math/impl/vecmath.h) against double-precision references,
// at every instruction-set level: each elementwise function over a sweep of the whole float
// range (every 1021st bit pattern: all exponents, subnormals, infinities, NaNs) plus dense
// samples where it bends, with its measured error bound in ulp; exact special values; tails
// and in-place calls; and the row kernels against naive double loops.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "test/unit/isa_test.h"

using namespace kiln;
using Fn = math::VecMathKernels::Elementwise;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

// GELU is -0 below this (3.95 sqrt2 in float, as the kernel computes it).
constexpr float kGeluZeroBelow = -3.95f * 1.41421354f;

double sigmoid_ref(double x) {
  return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
}

// An error bound in ulp of the exact result for inputs in [lo, hi).
struct Bound {
  double lo, hi, ulps;
};

struct Spec {
  const char* name;
  Fn math::VecMathKernels::*fn;
  double (*ref)(double);
  std::vector<Bound> bounds;
  // Dense samples of the region where the function bends.
  float dense_lo, dense_hi;
};

// Bounds: the largest errors over all 2^32 floats at the three levels (measured offline by an
// exhaustive run), rounded up in the second digit; kWorstCases below puts the inputs where
// they occur into the sweep. GELU below kGeluZeroBelow is -0 by design (|exact| < 6.5e-8; checked
// in absolute terms below). The tanh form of GELU loses about |z| ulp in its negative tail, z the
// argument of the sigmoid, from rounding z to float; each band holds its measured maximum.
const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"exp",
       &math::VecMathKernels::exp,
       [](double x) { return std::exp(x); },
       {{-kInf, kInf, 1.02}},
       -104.0f,
       89.0f},
      {"log",
       &math::VecMathKernels::log,
       [](double x) { return std::log(x); },
       {{-kInf, kInf, 0.87}},
       0.0f,
       4.0f},
      {"erf",
       &math::VecMathKernels::erf,
       [](double x) { return std::erf(x); },
       {{-kInf, kInf, 1.33}},
       -4.5f,
       4.5f},
      {"tanh",
       &math::VecMathKernels::tanh,
       [](double x) { return std::tanh(x); },
       {{-kInf, kInf, 1.52}},
       -10.0f,
       10.0f},
      {"sigmoid",
       &math::VecMathKernels::sigmoid,
       sigmoid_ref,
       {{-kInf, kInf, 2.41}},
       -110.0f,
       30.0f},
      {"gelu",
       &math::VecMathKernels::gelu,
       [](double x) {
         return std::isinf(x) && x < 0 ? -0.0 : 0.5 * x * std::erfc(-x / std::sqrt(2.0));
       },
       {{-kInf, 0, 3.53}, {0, kInf, 1.72}},
       -7.0f,
       7.0f},
      {"gelu_tanh",
       &math::VecMathKernels::gelu_tanh,
       [](double x) {
         if (std::isinf(x) && x < 0) return -0.0;
         return x * sigmoid_ref(2 * std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
       },
       {{-kInf, -10, 215},
        {-10, -5.5862, 211},
        {-5.5862, -3, 38},
        {-3, -2, 14.8},
        {-2, 0, 7.6},
        {0, kInf, 1.9}},
       -12.0f,
       8.0f},
      {"silu",
       &math::VecMathKernels::silu,
       [](double x) { return std::isinf(x) && x < 0 ? -0.0 : x * sigmoid_ref(x); },
       {{-kInf, kInf, 3.40}},
       -120.0f,
       30.0f},
  };
  return s;
}

// Inputs where the exhaustive run found each function's largest error (at some level).
constexpr uint32_t kWorstCases[] = {0x42171d54, 0xc1db0829, 0x3fb2fa31, 0x3f32ed6d, 0x3f756856,
                                    0x3f6c427e, 0x3f9b3d6a, 0x3fa11945, 0xc085088d, 0xc0ab291a,
                                    0xbfa6ccd8, 0xc0af6153, 0xc0318bfd, 0xc120a860, 0xc04d8524};

// The unit in the last place of a float near |r| (subnormal spacing below FLT_MIN).
double ulp_of(double r) {
  const double a = std::fabs(r);
  if (a < 0x1p-126) return 0x1p-149;
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 24);
}

// The sweep plus the dense samples and hand-picked edges; an odd count leaves a tail at
// every vector width.
std::vector<float> inputs_for(const Spec& s) {
  std::vector<float> v;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 1021) {
    v.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dense(s.dense_lo, s.dense_hi);
  for (int i = 0; i < 600000; ++i) v.push_back(dense(rng));
  const float edges[] = {0.0f,        -0.0f,        kInfF,          -kInfF,        NAN,
                         -NAN,        1.0f,         -1.0f,          88.7228394f,   88.7228317f,
                         88.72284f,   -87.3365479f, -103.972f,      -103.279f,     -104.0f,
                         -112.0f,     0.921875f,    -0.921875f,     0.625f,        -0.625f,
                         1.30372813f, -1.30372813f, 3.95f,          -5.5862f,      -5.58614f,
                         1e-45f,      -1e-45f,      1.1754942e-38f, 3.4028235e38f, -3.4028235e38f,
                         0.5f};
  for (float e : edges) {
    v.push_back(e);
    v.push_back(std::nextafter(e, kInfF));
    v.push_back(std::nextafter(e, -kInfF));
  }
  // The worst cases of the exhaustive run, so that the bounds above are reached here too.
  for (uint32_t u : kWorstCases) v.push_back(std::bit_cast<float>(u));
  if (v.size() % 2 == 0) v.push_back(0.25f);
  return v;
}

// Inputs and double references per function, computed once for the three levels.
struct Sample {
  std::vector<float> x;
  std::vector<double> ref;
};
const Sample& sample_for(const Spec& s) {
  static std::map<std::string, Sample> cache;
  Sample& c = cache[s.name];
  if (c.x.empty()) {
    c.x = inputs_for(s);
    c.ref.resize(c.x.size());
    for (size_t i = 0; i < c.x.size(); ++i) c.ref[i] = s.ref(c.x[i]);
  }
  return c;
}

void check_elementwise(const math::MathKernels& k, const Spec& s) {
  INFO(s.name << " at " << math::isa_name(k.isa));
  const Sample& smp = sample_for(s);
  const size_t n = smp.x.size();
  std::vector<float> y(n);
  (k.vec.*s.fn)(smp.x.data(), y.data(), static_cast<int64_t>(n));
  std::vector<double> worst(s.bounds.size(), 0.0);
  std::vector<float> worst_x(s.bounds.size(), 0.0f);
  int bad = 0;
  double gelu_tail = 0;
  for (size_t i = 0; i < n; ++i) {
    const float x = smp.x[i], got = y[i];
    const double want = smp.ref[i];
    const float want_f = static_cast<float>(want);
    bool ok;
    if (std::isnan(want) || std::isinf(want_f)) {
      // NaN for NaN; overflow to the same infinity; infinite inputs to their exact limits.
      ok = std::isnan(want) ? std::isnan(got) : got == want_f;
    } else if (std::isnan(got) || std::isinf(got)) {
      ok = false;
    } else if (std::string(s.name) == "gelu" && x < kGeluZeroBelow) {
      gelu_tail = std::max(gelu_tail, std::fabs(got - want));
      ok = got <= 0.0f && std::fabs(got - want) <= 6.5e-8;
    } else {
      const double ulps = std::fabs(got - want) / ulp_of(want);
      size_t b = 0;
      while (b + 1 < s.bounds.size() && !(x >= s.bounds[b].lo && x < s.bounds[b].hi)) ++b;
      if (ulps > worst[b]) worst[b] = ulps, worst_x[b] = x;
      ok = ulps <= s.bounds[b].ulps &&
           (got == 0 || want == 0 || std::signbit(got) == std::signbit(want));
    }
    if (!ok && bad++ < 5) {
      FAIL_CHECK(s.name << "(" << x << " = 0x" << std::hex << std::bit_cast<uint32_t>(x) << std::dec
                        << ") = " << got << ", expected " << want << " ("
                        << std::fabs(got - want) / ulp_of(want) << " ulp)");
    }
  }
  for (size_t b = 0; b < s.bounds.size(); ++b) {
    INFO("[" << s.bounds[b].lo << ", " << s.bounds[b].hi << "): max " << worst[b] << " ulp at "
             << worst_x[b] << ", bound " << s.bounds[b].ulps);
    CHECK(worst[b] <= s.bounds[b].ulps);
  }
  CHECK(gelu_tail <= 6.5e-8);
  CHECK(bad == 0);

  // Short lengths, in place and out of place: the tails compute the same bits as the long
  // run and write nothing past n.
  for (int64_t len = 0; len <= 3 * 16 + 1; ++len) {
    const size_t off = 1000003 + static_cast<size_t>(len) * 7;
    std::vector<float> in(smp.x.begin() + static_cast<long>(off),
                          smp.x.begin() + static_cast<long>(off + static_cast<size_t>(len)));
    in.push_back(-7.0f);  // sentinel
    std::vector<float> out(in.size(), 12345.0f);
    (k.vec.*s.fn)(in.data(), out.data(), len);
    (k.vec.*s.fn)(in.data(), in.data(), len);
    for (int64_t i = 0; i < len; ++i) {
      const float want = y[off + static_cast<size_t>(i)];
      REQUIRE(std::bit_cast<uint32_t>(out[static_cast<size_t>(i)]) ==
              std::bit_cast<uint32_t>(want));
      REQUIRE(std::bit_cast<uint32_t>(in[static_cast<size_t>(i)]) == std::bit_cast<uint32_t>(want));
    }
    REQUIRE(out.back() == 12345.0f);
    REQUIRE(in.back() == -7.0f);
  }
}

float one(Fn f, float x) {
  float y;
  f(&x, &y, 1);
  return y;
}

}  // namespace

KILN_ISA_TEST_CASE("vector exp and log match double references over the float range",
                   "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  check_elementwise(isa_kernels, specs()[0]);
  check_elementwise(isa_kernels, specs()[1]);
}

KILN_ISA_TEST_CASE("vector erf and tanh match double references over the float range",
                   "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  check_elementwise(isa_kernels, specs()[2]);
  check_elementwise(isa_kernels, specs()[3]);
}

KILN_ISA_TEST_CASE("vector sigmoid, GELU and SiLU match double references over the float range",
                   "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  for (size_t i = 4; i < specs().size(); ++i) check_elementwise(isa_kernels, specs()[i]);
}

KILN_ISA_TEST_CASE("vector math special values", "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  CHECK(one(v.exp, kInfF) == kInfF);
  CHECK(one(v.exp, -kInfF) == 0.0f);
  CHECK(one(v.exp, 88.8f) == kInfF);
  CHECK(one(v.exp, 88.72f) < kInfF);
  CHECK(one(v.exp, -104.0f) == 0.0f);
  // Subnormal results are kept, not flushed: e^-100 = 3.72e-44.
  CHECK(one(v.exp, -100.0f) == Approx(3.720076e-44).epsilon(0.03));
  CHECK(one(v.exp, 0.0f) == 1.0f);
  CHECK(one(v.log, 0.0f) == -kInfF);
  CHECK(one(v.log, -0.0f) == -kInfF);
  CHECK(std::isnan(one(v.log, -1.0f)));
  CHECK(std::isnan(one(v.log, -kInfF)));
  CHECK(one(v.log, kInfF) == kInfF);
  CHECK(one(v.log, 1.0f) == 0.0f);
  CHECK(one(v.log, std::numeric_limits<float>::denorm_min()) == Approx(-103.27893).epsilon(1e-7));
  for (Fn f : {v.erf, v.tanh}) {
    CHECK(one(f, kInfF) == 1.0f);
    CHECK(one(f, -kInfF) == -1.0f);
    CHECK(one(f, 20.0f) == 1.0f);
    CHECK(std::signbit(one(f, -0.0f)));
  }
  CHECK(one(v.sigmoid, kInfF) == 1.0f);
  CHECK(one(v.sigmoid, -kInfF) == 0.0f);
  CHECK(one(v.sigmoid, 0.0f) == 0.5f);
  for (Fn f : {v.gelu, v.gelu_tanh, v.silu}) {
    CHECK(one(f, kInfF) == kInfF);
    CHECK(one(f, -kInfF) == 0.0f);
    CHECK(one(f, 0.0f) == 0.0f);
  }
  for (Fn f : {v.exp, v.log, v.erf, v.tanh, v.sigmoid, v.gelu, v.gelu_tanh, v.silu}) {
    CHECK(std::isnan(one(f, NAN)));
    CHECK(std::isnan(one(f, -NAN)));
  }
}

KILN_ISA_TEST_CASE("vector Swish matches a double reference for any alpha", "[math][vecmath]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> d(-40.0f, 40.0f);
  std::vector<float> x(1001);
  for (float& e : x) e = d(rng);
  x[0] = 0.0f;
  x[1] = -kInfF;
  x[2] = kInfF;
  for (const float alpha : {1.702f, 0.5f, 1.0f, -2.0f}) {
    std::vector<float> y(x.size());
    v.swish(x.data(), y.data(), static_cast<int64_t>(x.size()), alpha);
    for (size_t i = 3; i < x.size(); ++i) {
      const double z = double(alpha * x[i]);  // the kernel's float product
      const double want = x[i] * sigmoid_ref(z);
      INFO("alpha " << alpha << ", x " << x[i]);
      REQUIRE(std::fabs(y[i] - want) <= 4 * ulp_of(want) + 1e-44);
    }
    CHECK(y[0] == 0.0f);
    if (alpha > 0) {
      CHECK(y[1] == 0.0f);
      CHECK(y[2] == kInfF);
    }
    if (alpha == 1.0f) {
      std::vector<float> s(x.size());
      v.silu(x.data(), s.data(), static_cast<int64_t>(x.size()));
      CHECK(std::equal(s.begin(), s.end(), y.begin()));
    }
  }
}
