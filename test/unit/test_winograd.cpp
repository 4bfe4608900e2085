// The Winograd F(4x4, 3x3) and F(2x2, 3x3) convolutions (ops/math/winograd.h,
// impl/winograd.h) against a double-precision loop at every instruction-set level: random
// channels, filters, map sizes (tiles cut by the map's edges), pads on either side, several
// images, bias, Z and Relu; the plans that split passes among tasks and those that split each
// pass; nothing written outside the workspace.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ops/math/winograd.h"
#include "test/unit/isa_test.h"

using namespace kiln;

namespace {

struct Case {
  math::WinogradShape s;
  int64_t images = 1;
  bool bias = false, accumulate = false, relu = false;
  int threads = 1;
};

// The largest error of the Winograd convolution relative to the magnitude of each output's
// terms (sum of |w x| plus |bias| and |z|), and whether the workspace's guard survived.
struct Result {
  double worst = 0;
  bool guard = true;
};

// F(4x4, 3x3) multiplies by up to 8 and 1/24 in its transforms, so its rounding error is
// about a hundred times the direct product's: within this fraction of the terms' magnitude.
constexpr double kTolerance = 3e-5;

Result run_case(const Case& c, const math::MathKernels& k, std::mt19937& rng) {
  const math::WinogradShape& s = c.s;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t ip = s.in_h * s.in_w, op = s.out_h * s.out_w;
  std::vector<float> x(static_cast<size_t>(c.images * s.channels * ip));
  std::vector<float> w(static_cast<size_t>(s.filters * s.channels * 9));
  std::vector<float> bias(static_cast<size_t>(s.filters));
  std::vector<float> y(static_cast<size_t>(c.images * s.filters * op));
  for (auto& v : x) v = dist(rng);
  for (auto& v : w) v = dist(rng);
  for (auto& v : bias) v = dist(rng);
  for (auto& v : y) v = dist(rng);
  const std::vector<float> y0 = y;

  std::vector<float> filter(
      static_cast<size_t>(math::winograd_filter_floats(s.filters, s.channels, k.gemm.mr, s.tile)));
  math::winograd_pack_filter(w.data(), s.filters, s.channels, s.tile, filter.data(), k);
  const math::WinogradPlan plan = math::winograd_plan(s, c.images, c.threads, k);
  const auto floats = static_cast<size_t>(plan.workspace_floats());
  std::vector<float> space(floats + 64, 12345.0f);
  math::winograd_convolve(plan, x.data(), s.channels * ip, filter.data(),
                          c.bias ? bias.data() : nullptr, c.accumulate, c.relu, y.data(),
                          s.filters * op, space.data(), k);
  Result r;
  for (size_t i = floats; i < space.size(); ++i) r.guard = r.guard && space[i] == 12345.0f;

  for (int64_t n = 0; n < c.images; ++n) {
    for (int64_t f = 0; f < s.filters; ++f) {
      for (int64_t oh = 0; oh < s.out_h; ++oh) {
        for (int64_t ow = 0; ow < s.out_w; ++ow) {
          double sum = c.bias ? bias[static_cast<size_t>(f)] : 0.0;
          double mag = std::abs(sum);
          const size_t at = static_cast<size_t>((n * s.filters + f) * op + oh * s.out_w + ow);
          if (c.accumulate) {
            sum += y0[at];
            mag += std::abs(y0[at]);
          }
          for (int64_t ch = 0; ch < s.channels; ++ch) {
            for (int64_t kh = 0; kh < 3; ++kh) {
              for (int64_t kw = 0; kw < 3; ++kw) {
                const int64_t ih = oh - s.pad_h + kh, iw = ow - s.pad_w + kw;
                if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
                const double t =
                    static_cast<double>(
                        x[static_cast<size_t>((n * s.channels + ch) * ip + ih * s.in_w + iw)]) *
                    w[static_cast<size_t>((f * s.channels + ch) * 9 + kh * 3 + kw)];
                sum += t;
                mag += std::abs(t);
              }
            }
          }
          if (c.relu) sum = std::max(sum, 0.0);
          r.worst = std::max(r.worst, std::abs(y[at] - sum) / std::max(mag, 1e-3));
        }
      }
    }
  }
  return r;
}

// A random case; `scale` makes the maps and channel counts larger (plans with tasks).
Case random_case(std::mt19937& rng, int64_t max_map, int64_t max_channels) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  math::WinogradShape& s = c.s;
  s.channels = pick(1, max_channels);
  s.filters = pick(1, max_channels);
  s.pad_h = pick(0, 2);
  s.pad_w = pick(0, 2);
  const int64_t pad_h_end = pick(0, 2), pad_w_end = pick(0, 2);
  s.in_h = std::max<int64_t>(pick(1, max_map), 3 - s.pad_h - pad_h_end);
  s.in_w = std::max<int64_t>(pick(1, max_map), 3 - s.pad_w - pad_w_end);
  s.out_h = s.in_h + s.pad_h + pad_h_end - 2;
  s.out_w = s.in_w + s.pad_w + pad_w_end - 2;
  c.images = pick(1, 2);
  c.bias = pick(0, 1) == 1;
  c.accumulate = pick(0, 1) == 1;
  c.relu = pick(0, 1) == 1;
  c.threads = static_cast<int>(pick(1, 2));
  s.tile = pick(0, 1) == 1 ? 4 : 2;
  return c;
}

}  // namespace

KILN_ISA_TEST_CASE("the Winograd convolution matches a double-precision loop", "[math][winograd]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(41);
  double worst = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const Case c = random_case(rng, 40, 24);
    const Result r = run_case(c, isa_kernels, rng);
    INFO("case " << iter << ": tile " << c.s.tile << ", " << c.s.channels << " -> " << c.s.filters
                 << ", " << c.s.in_h << "x" << c.s.in_w << " pads " << c.s.pad_h << "," << c.s.pad_w
                 << " out " << c.s.out_h << "x" << c.s.out_w);
    CHECK(r.guard);
    CHECK(r.worst < kTolerance);
    worst = std::max(worst, r.worst);
  }
  WARN("largest error relative to the terms' magnitude: " << worst);
}

KILN_ISA_TEST_CASE("the Winograd convolution splits passes and passes among tasks",
                   "[math][winograd]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(43);
  // One pass of enough work for two tasks (each split by channels, positions and filters),
  // and many passes dealt to two tasks.
  Case one;
  one.s = {64, 48, 16, 18, 1, 1, 16, 18};
  one.threads = 2;
  one.bias = one.relu = true;
  const math::WinogradPlan p1 = math::winograd_plan(one.s, 1, 2, isa_kernels);
  CHECK(p1.tasks == 2);
  CHECK(!p1.by_pass);
  CHECK(p1.blocks == 1);
  Case many;
  many.s = {32, 40, 62, 61, 1, 0, 62, 59};
  many.images = 2;
  many.threads = 2;
  many.accumulate = true;
  const math::WinogradPlan p2 = math::winograd_plan(many.s, 2, 2, isa_kernels);
  CHECK(p2.tasks == 2);
  CHECK(p2.by_pass);
  CHECK(p2.blocks > 1);
  for (int tile : {4, 2}) {
    for (Case c : {one, many}) {
      c.s.tile = tile;
      const Result r = run_case(c, isa_kernels, rng);
      CHECK(r.guard);
      CHECK(r.worst < kTolerance);
    }
  }
}
