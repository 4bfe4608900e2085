// The dispatched direct convolution plane kernel (ops/math/impl/conv_direct.h) against a
// naive loop at every instruction-set level: random 1-D, 2-D and 3-D geometries with
// strides, dilations and padding, 3/5/7-wide stride-2 rows through the deinterleaved input,
// and long 1-D filters; the lowering into GEMM panels, pooling, the indirect product
// that reads patch rows in place, the wide-form plane kernels (pad_rows, pad_rows_pair,
// wide_plane), rows-first pooling (pool_planes) and a signal read as strided windows by
// the product.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/conv/wide_layout.h"
#include "ops/math/gemm.h"
#include "test/unit/isa_test.h"

using namespace kiln;

namespace {

// y += w (*) x, naively, in double.
std::vector<double> naive_plane(const std::vector<float>& x, const std::vector<float>& w,
                                const math::ConvGeometry& g, const std::vector<float>& y0) {
  std::vector<double> y(y0.begin(), y0.end());
  for (int64_t od = 0; od < g.out[0]; ++od)
    for (int64_t oh = 0; oh < g.out[1]; ++oh)
      for (int64_t ow = 0; ow < g.out[2]; ++ow) {
        double s = 0;
        for (int64_t kd = 0; kd < g.k[0]; ++kd)
          for (int64_t kh = 0; kh < g.k[1]; ++kh)
            for (int64_t kw = 0; kw < g.k[2]; ++kw) {
              const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
              const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
              const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
              if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1] || iw < 0 || iw >= g.in[2])
                continue;
              s += static_cast<double>(x[static_cast<size_t>((id * g.in[1] + ih) * g.in[2] + iw)]) *
                   w[static_cast<size_t>((kd * g.k[1] + kh) * g.k[2] + kw)];
            }
        y[static_cast<size_t>((od * g.out[1] + oh) * g.out[2] + ow)] += s;
      }
  return y;
}

}  // namespace

KILN_ISA_TEST_CASE("the direct convolution plane matches a naive loop", "[math][conv]") {
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 400; ++iter) {
    math::ConvGeometry g;
    const int dims = static_cast<int>(pick(1, 3));
    for (int d = 3 - dims; d < 3; ++d) {
      const bool long_taps = dims == 1 && iter % 10 == 0;
      g.k[d] = long_taps ? pick(17, 300) : pick(1, 7);
      g.stride[d] = pick(1, 3);
      g.dil[d] = long_taps ? 1 : pick(1, 2);
      g.pad[d] = pick(0, 3);
      const int64_t ek = (g.k[d] - 1) * g.dil[d] + 1;
      g.in[d] = std::max<int64_t>(ek - 2 * g.pad[d], 1) + pick(0, 40);
      g.out[d] = (g.in[d] + 2 * g.pad[d] - ek) / g.stride[d] + 1;
    }
    const int64_t ip = g.in[0] * g.in[1] * g.in[2], op = g.out[0] * g.out[1] * g.out[2];
    const int64_t kp = g.k[0] * g.k[1] * g.k[2];
    std::vector<float> x(static_cast<size_t>(ip)), w(static_cast<size_t>(kp)),
        y(static_cast<size_t>(op));
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    for (auto& v : y) v = dist(rng);
    const std::vector<double> want = naive_plane(x, w, g, y);
    std::vector<float> padded(static_cast<size_t>(math::conv_padded_floats(g)) + 1, 7.0f);
    k.pad_plane(x.data(), g, 0.0f, padded.data());
    CHECK(padded.back() == 7.0f);  // nothing written past the copy's size
    std::vector<int64_t> offsets(static_cast<size_t>(kp));
    math::conv_tap_offsets(g, offsets.data());
    k.padded_plane(padded.data(), w.data(), offsets.data(), g, y.data());
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      worst = std::max(worst, std::abs(y[i] - want[i]) / (1 + std::abs(want[i])));
    }
    INFO("in " << g.in[0] << "x" << g.in[1] << "x" << g.in[2] << " k " << g.k[0] << "x" << g.k[1]
               << "x" << g.k[2] << " stride " << g.stride[2] << " dil " << g.dil[2] << " pad "
               << g.pad[2]);
    REQUIRE(worst <= 2e-6 * std::sqrt(static_cast<double>(kp)) + 1e-6);
  }
}

KILN_ISA_TEST_CASE("the in-place direct plane matches a naive loop and the padded plane",
                   "[math][conv]") {
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 400; ++iter) {
    math::ConvGeometry g;
    const int dims = static_cast<int>(pick(1, 3));
    for (int d = 3 - dims; d < 3; ++d) {
      // Now and then a filter taller than the kernel's chunk of 64 rows.
      const bool tall = d == 1 && iter % 16 == 0;
      g.k[d] = tall ? pick(65, 80) : pick(1, d == 2 ? math::ConvKernels::direct_max_width : 7);
      g.stride[d] = d == 2 ? pick(1, 2) : pick(1, 3);
      g.dil[d] = tall ? 1 : pick(1, 2);
      g.pad[d] = pick(0, 3);
      const int64_t ek = (g.k[d] - 1) * g.dil[d] + 1;
      g.in[d] = std::max<int64_t>(ek - 2 * g.pad[d], 1) + pick(0, 40);
      g.out[d] = (g.in[d] + 2 * g.pad[d] - ek) / g.stride[d] + 1;
    }
    const int64_t ip = g.in[0] * g.in[1] * g.in[2], op = g.out[0] * g.out[1] * g.out[2];
    const int64_t kp = g.k[0] * g.k[1] * g.k[2];
    std::vector<float> x(static_cast<size_t>(ip)), w(static_cast<size_t>(kp)),
        y0(static_cast<size_t>(op));
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    for (auto& v : y0) v = dist(rng);
    const float bias = dist(rng);
    const bool accumulate = iter % 2 == 1, relu = iter % 3 == 0;
    // The padded plane from the same start: y0 + bias or bias.
    std::vector<float> start(y0);
    for (auto& v : start) v = accumulate ? v + bias : bias;
    std::vector<float> padded_y(start);
    std::vector<float> padded(static_cast<size_t>(math::conv_padded_floats(g)));
    k.pad_plane(x.data(), g, 0.0f, padded.data());
    std::vector<int64_t> offsets(static_cast<size_t>(kp));
    math::conv_tap_offsets(g, offsets.data());
    k.padded_plane(padded.data(), w.data(), offsets.data(), g, padded_y.data());
    std::vector<double> want = naive_plane(x, w, g, start);
    std::vector<float> y(y0);
    y.push_back(7.0f);  // nothing written past the plane
    k.direct_plane(x.data(), w.data(), g, bias, accumulate, relu, y.data());
    CHECK(y.back() == 7.0f);
    INFO("in " << g.in[0] << "x" << g.in[1] << "x" << g.in[2] << " k " << g.k[0] << "x" << g.k[1]
               << "x" << g.k[2] << " stride " << g.stride[1] << " dil " << g.dil[2] << " pad "
               << g.pad[2] << " accumulate " << accumulate << " relu " << relu);
    double worst = 0;
    size_t differ = 0;
    for (size_t i = 0; i < static_cast<size_t>(op); ++i) {
      const double ref = relu ? std::max(want[i], 0.0) : want[i];
      worst = std::max(worst, std::abs(y[i] - ref) / (1 + std::abs(ref)));
      // The same taps summed in the same order as the padded plane's: the same floats.
      if (y[i] != (relu ? std::max(padded_y[i], 0.0f) : padded_y[i])) ++differ;
    }
    REQUIRE(worst <= 2e-6 * std::sqrt(static_cast<double>(kp)) + 1e-6);
    REQUIRE(differ == 0);
  }
}

KILN_ISA_TEST_CASE("im2col panels equal the naive patch matrix", "[math][conv]") {
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  const int nr = isa_kernels.gemm.nr;
  std::mt19937 rng(9);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 200; ++iter) {
    math::ConvGeometry g;
    const int dims = static_cast<int>(pick(1, 3));
    const int64_t channels = pick(1, 4);
    for (int d = 3 - dims; d < 3; ++d) {
      g.k[d] = pick(1, 4);
      g.stride[d] = pick(1, 3);
      g.dil[d] = pick(1, 2);
      g.pad[d] = pick(0, 2);
      const int64_t ek = (g.k[d] - 1) * g.dil[d] + 1;
      g.in[d] = std::max<int64_t>(ek - 2 * g.pad[d], 1) + pick(0, iter % 7 == 0 ? 40 : 9);
      g.out[d] = (g.in[d] + 2 * g.pad[d] - ek) / g.stride[d] + 1;
    }
    const int64_t ip = g.in[0] * g.in[1] * g.in[2], op = g.out[0] * g.out[1] * g.out[2];
    const int64_t kp = g.k[0] * g.k[1] * g.k[2], rows = channels * kp;
    std::vector<float> x(static_cast<size_t>(channels * ip));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) + 0.5f;
    const int64_t p0 = pick(0, rows - 1), kc = pick(1, rows - p0);
    const int64_t j0 = pick(0, op - 1) / nr * nr, nc = pick(1, op - j0);
    const int64_t panels = (nc + nr - 1) / nr;
    std::vector<float> out(static_cast<size_t>(panels * kc * nr), -1.0f);
    k.im2col_panels(x.data(), g, p0, kc, j0, nc, out.data());
    for (int64_t r = 0; r < kc; ++r) {
      const int64_t row = p0 + r, c = row / kp, t = row % kp;
      const int64_t kd = t / (g.k[1] * g.k[2]), kh = (t / g.k[2]) % g.k[1], kw = t % g.k[2];
      for (int64_t q = 0; q < panels; ++q) {
        for (int64_t jj = 0; jj < nr; ++jj) {
          const int64_t pos = j0 + q * nr + jj;
          float want = 0.0f;
          if (q * nr + jj < nc) {
            const int64_t od = pos / (g.out[1] * g.out[2]), oh = (pos / g.out[2]) % g.out[1];
            const int64_t ow = pos % g.out[2];
            const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
            const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
            const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
            if (id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1] && iw >= 0 && iw < g.in[2]) {
              want = x[static_cast<size_t>(c * ip + (id * g.in[1] + ih) * g.in[2] + iw)];
            }
          }
          const float got = out[static_cast<size_t>(q * kc * nr + r * nr + jj)];
          INFO("row " << row << " position " << pos << " iteration " << iter);
          REQUIRE(got == want);
        }
      }
    }
  }
}

KILN_ISA_TEST_CASE("the pooling planes match a naive max and sum", "[math][conv][pool]") {
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  std::mt19937 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (int iter = 0; iter < 300; ++iter) {
    math::ConvGeometry g;
    const int dims = static_cast<int>(pick(1, 3));
    for (int d = 3 - dims; d < 3; ++d) {
      g.k[d] = pick(1, 4);
      g.stride[d] = pick(1, 3);
      g.dil[d] = pick(1, 2);
      g.pad[d] = pick(0, g.k[d] - 1);
      const int64_t ek = (g.k[d] - 1) * g.dil[d] + 1;
      g.in[d] = std::max<int64_t>(ek - 2 * g.pad[d], 1) + pick(0, iter % 5 == 0 ? 40 : 9);
      g.out[d] = (g.in[d] + 2 * g.pad[d] - ek) / g.stride[d] + 1;
      // ceil_mode: a last window that runs past the right padding.
      if (iter % 3 == 0 && (g.in[d] + 2 * g.pad[d] - ek) % g.stride[d] != 0) ++g.out[d];
    }
    const int64_t ip = g.in[0] * g.in[1] * g.in[2], op = g.out[0] * g.out[1] * g.out[2];
    const int64_t kp = g.k[0] * g.k[1] * g.k[2];
    std::vector<float> x(static_cast<size_t>(ip));
    for (auto& v : x) v = dist(rng);
    if (iter % 7 == 0) x[static_cast<size_t>(pick(0, ip - 1))] = std::nanf("");  // skipped by max
    std::vector<int64_t> taps(static_cast<size_t>(kp));
    math::conv_tap_offsets(g, taps.data());
    std::vector<float> xp(static_cast<size_t>(math::conv_padded_floats(g)));
    for (const bool max : {true, false}) {
      const float fill = max ? -std::numeric_limits<float>::infinity() : 0.0f;
      k.pad_plane(x.data(), g, fill, xp.data());
      std::vector<float> y(static_cast<size_t>(op), 123.0f);
      k.pool_plane(xp.data(), taps.data(), g, max, y.data());
      // The in-place kernel (column stride 1 or 2) takes the same taps in the same order:
      // the same floats.
      if (g.stride[2] <= 2) {
        std::vector<float> direct(static_cast<size_t>(op + 1), 123.0f);
        k.direct_pool_plane(x.data(), g, max, nullptr, nullptr, direct.data());
        CHECK(direct.back() == 123.0f);  // nothing written past the plane
        for (size_t i = 0; i < y.size(); ++i) {
          INFO("iteration " << iter << " max " << max << " output " << i);
          REQUIRE((direct[i] == y[i] || (std::isnan(direct[i]) && std::isnan(y[i]))));
        }
        if (!max) {  // sums scaled per row and column as they are stored
          std::vector<float> rs(static_cast<size_t>(g.out[0] * g.out[1])),
              cs(static_cast<size_t>(g.out[2]));
          for (auto& v : rs) v = dist(rng);
          for (auto& v : cs) v = dist(rng);
          k.direct_pool_plane(x.data(), g, false, rs.data(), cs.data(), direct.data());
          for (size_t i = 0; i < y.size(); ++i) {
            const auto oh_all = static_cast<size_t>(i / static_cast<size_t>(g.out[2]));
            const auto ow = static_cast<size_t>(i % static_cast<size_t>(g.out[2]));
            INFO("iteration " << iter << " scaled output " << i);
            const float want = y[i] * (rs[oh_all] * cs[ow]);
            REQUIRE((direct[i] == want || (std::isnan(direct[i]) && std::isnan(want))));
          }
        }
      }
      for (int64_t od = 0; od < g.out[0]; ++od)
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow) {
            double want = max ? -std::numeric_limits<double>::infinity() : 0.0;
            for (int64_t kd = 0; kd < g.k[0]; ++kd)
              for (int64_t kh = 0; kh < g.k[1]; ++kh)
                for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                  const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
                  const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
                  const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
                  double v = fill;
                  if (id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1] && iw >= 0 &&
                      iw < g.in[2]) {
                    v = x[static_cast<size_t>((id * g.in[1] + ih) * g.in[2] + iw)];
                  }
                  if (max) {
                    want = v > want ? v : want;
                  } else {
                    want += v;
                  }
                }
            const float got = y[static_cast<size_t>((od * g.out[1] + oh) * g.out[2] + ow)];
            INFO("iteration " << iter << " max " << max << " output " << od << "," << oh << ","
                              << ow);
            if (std::isnan(want)) {
              REQUIRE(std::isnan(got));
            } else if (std::isinf(want)) {  // a window holding only a NaN
              REQUIRE(static_cast<double>(got) == want);
            } else {
              REQUIRE(std::abs(got - want) <= 1e-5 * (1 + std::abs(want)));
            }
          }
    }
  }
}

KILN_ISA_TEST_CASE("pool_planes matches a naive max and sum over several planes",
                   "[math][conv][pool]") {
  // Rows-first pooling straight from the input (ConvKernels::pool_planes): 1-D and 2-D
  // windows of 1 to 7 taps (now and then 16 columns), column strides 1 and 2, row strides 1
  // to 3, dilations, pads at either end or both, ceil_mode's extra window, rows of one
  // vector to hundreds of floats (one or two vectors swept, wider ones row by row, many
  // border vectors swept, bands of output rows), 3x3 windows at stride 2 (max reduces their
  // rows first), NaN inputs (max skips them), and several planes with gaps between them that
  // must be neither read as taps nor written.
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  constexpr float kSentinel = 7.0f;
  std::mt19937 rng(47);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  int tested = 0, stems = 0;
  for (int iter = 0; iter < 600; ++iter) {
    math::ConvGeometry g;
    const bool one_d = iter % 9 == 0;
    // 3x3 windows at stride 2 without dilation: max takes its column-first path.
    const bool stem = !one_d && iter % 6 == 5;
    for (int d = one_d ? 2 : 1; d < 3; ++d) {
      const bool wide_taps = d == 2 && iter % 17 == 0 && !stem;
      g.k[d] = stem ? 3 : wide_taps ? pick(9, math::ConvKernels::direct_max_width) : pick(1, 7);
      g.stride[d] = stem ? 2 : d == 2 ? pick(1, 2) : pick(1, 3);
      g.dil[d] = stem ? 1 : pick(1, 2);
      const int64_t ek = (g.k[d] - 1) * g.dil[d] + 1;
      g.pad[d] = iter % 4 == 1 ? 0 : pick(0, ek - 1);  // sometimes only at the end
      const int64_t pad_end = iter % 4 == 2 ? 0 : pick(0, ek - 1);
      const int64_t extent = d == 2 && iter % 3 == 0 ? pick(40, 700) : pick(0, 40);
      g.in[d] = std::max<int64_t>(ek - g.pad[d] - pad_end, 1) + extent;
      const int64_t span = g.in[d] + g.pad[d] + pad_end - ek;
      g.out[d] = span / g.stride[d] + 1;
      // ceil_mode: a last window that runs past the end padding (still starting inside).
      if (iter % 5 == 0 && span % g.stride[d] != 0 && g.out[d] * g.stride[d] < g.in[d] + g.pad[d])
        ++g.out[d];
    }
    if (!math::pool_planes_fit(g)) continue;
    ++tested;
    stems += stem;
    const int64_t planes = pick(1, 4), plane_in = g.in[1] * g.in[2],
                  plane_out = g.out[1] * g.out[2];
    const int64_t ip = plane_in + pick(0, 9), op = plane_out + pick(1, 5);
    std::vector<float> x(static_cast<size_t>(planes * ip));
    for (auto& v : x) v = dist(rng);
    // The gaps hold huge values: a tap read outside its plane would win every max.
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t i = plane_in; i < ip; ++i) x[static_cast<size_t>(p * ip + i)] = 1e30f;
    }
    if (iter % 7 == 0) {
      x[static_cast<size_t>(pick(0, planes - 1) * ip + pick(0, plane_in - 1))] = std::nanf("");
    }
    std::vector<float> rs(static_cast<size_t>(g.out[1])), cs(static_cast<size_t>(g.out[2]));
    for (auto& v : rs) v = dist(rng);
    for (auto& v : cs) v = dist(rng);
    INFO("iteration " << iter << " in " << g.in[1] << "x" << g.in[2] << " k " << g.k[1] << "x"
                      << g.k[2] << " stride " << g.stride[1] << "," << g.stride[2] << " dil "
                      << g.dil[1] << "," << g.dil[2] << " pad " << g.pad[1] << "," << g.pad[2]
                      << " out " << g.out[1] << "x" << g.out[2] << " planes " << planes);
    for (const int mode : {0, 1, 2}) {  // max, sum, scaled sum
      const bool max = mode == 0;
      std::vector<float> y(static_cast<size_t>(planes * op), kSentinel);
      k.pool_planes(x.data(), ip, planes, g, max, mode == 2 ? rs.data() : nullptr,
                    mode == 2 ? cs.data() : nullptr, y.data(), op);
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t i = plane_out; i < op; ++i) {  // nothing past the plane
          if (y[static_cast<size_t>(p * op + i)] != kSentinel)
            REQUIRE(y[static_cast<size_t>(p * op + i)] == kSentinel);
        }
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow) {
            double best = -INFINITY, sum = 0;
            int64_t count = 0;
            for (int64_t kh = 0; kh < g.k[1]; ++kh)
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
                const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
                if (ih < 0 || ih >= g.in[1] || iw < 0 || iw >= g.in[2]) continue;
                const double v = x[static_cast<size_t>(p * ip + ih * g.in[2] + iw)];
                sum += v;
                ++count;
                if (v > best) best = v;
              }
            if (mode == 2)
              sum *= static_cast<double>(rs[static_cast<size_t>(oh)]) * cs[static_cast<size_t>(ow)];
            const float got = y[static_cast<size_t>(p * op + oh * g.out[2] + ow)];
            // -inf for a window with no tap inside; asserted only where it fails (an
            // assertion per output costs more than the whole comparison).
            const bool ok = max ? got == static_cast<float>(best)
                            : std::isnan(sum)
                                ? std::isnan(got)
                                : std::abs(got - sum) <= 1e-6 * static_cast<double>(count + 1) *
                                                             (1 + std::abs(sum)) * 16;
            if (ok) continue;
            INFO("mode " << mode << " plane " << p << " output " << oh << "," << ow << ": got "
                         << got << ", want " << (max ? best : sum));
            REQUIRE(ok);
          }
      }
    }
  }
  CHECK(tested > 400);
  CHECK(stems > 80);
}

KILN_ISA_TEST_CASE("the indirect product equals a naive product over its row table",
                   "[math][conv][gemm]") {
  // sgemm_indirect reads B's rows in place (a convolution's patch rows in its padded input):
  // random sizes across row tiles, k blocks and column blocks, rows that overlap and repeat,
  // accumulation onto C and a bias epilogue.
  KILN_REQUIRE_ISA();
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t m = pick(1, 40), k = iter % 6 == 0 ? pick(257, 600) : pick(1, 60);
    const int64_t n = iter % 5 == 0 ? pick(257, 700) : pick(1, 90);
    std::vector<float> a(static_cast<size_t>(m * k)), pool(static_cast<size_t>(n + 200));
    for (auto& v : a) v = dist(rng);
    for (auto& v : pool) v = dist(rng);
    std::vector<const float*> rows(static_cast<size_t>(k));
    for (auto& r : rows) r = pool.data() + pick(0, 200);  // each readable for n floats
    std::vector<float> bias(static_cast<size_t>(m));
    for (auto& v : bias) v = dist(rng);
    const bool accumulate = iter % 3 == 0;
    const int64_t ldc = n + pick(0, 5);
    std::vector<float> c(static_cast<size_t>(m * ldc));
    for (auto& v : c) v = dist(rng);
    std::vector<double> want(c.begin(), c.end());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = bias[static_cast<size_t>(i)];
        for (int64_t p = 0; p < k; ++p) {
          s += static_cast<double>(a[static_cast<size_t>(i * k + p)]) *
               rows[static_cast<size_t>(p)][j];
        }
        double& w = want[static_cast<size_t>(i * ldc + j)];
        w = accumulate ? w + s : s;
      }
    }
    const math::PackedA packed(math::MatrixView::row_major(a.data(), m, k, k), &isa_kernels);
    math::GemmOptions o;
    o.kernels = &isa_kernels;
    o.accumulate = accumulate;
    o.row_bias = bias.data();
    math::sgemm_indirect(packed, n, rows.data(), c.data(), ldc, o);
    double worst = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const size_t at = static_cast<size_t>(i * ldc + j);
        worst = std::max(worst, std::abs(c[at] - want[at]) / (1 + std::abs(want[at])));
      }
    }
    INFO("m " << m << " k " << k << " n " << n << " accumulate " << accumulate);
    CHECK(worst < 1e-5);
  }
}

KILN_ISA_TEST_CASE("a signal read as strided windows is a product's A like a naive patch matrix",
                   "[math][conv][gemm]") {
  // A convolution's strided windows (ops/conv/conv_small_maps.cpp): row p of A is the window of the
  // signal from p * stride, its columns dilation apart, so rows overlap (stride below the window)
  // or skip samples (stride above it); times a packed filter transpose, with a column bias and
  // Relu. Random sizes across row tiles, k blocks and column panels.
  KILN_REQUIRE_ISA();
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 40; ++iter) {
    const int64_t positions = pick(1, 100), taps = iter % 4 == 0 ? pick(257, 600) : pick(16, 120);
    const int64_t filters = pick(8, 70), dil = pick(1, 3);
    const int64_t stride = iter % 2 ? pick(1, 8) : pick(9, 200);
    std::vector<float> signal(static_cast<size_t>((positions - 1) * stride + (taps - 1) * dil + 1));
    std::vector<float> w(static_cast<size_t>(filters * taps)), bias(static_cast<size_t>(filters));
    for (auto& v : signal) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    for (auto& v : bias) v = dist(rng);
    const bool relu = iter % 3 == 0;
    std::vector<double> want(static_cast<size_t>(positions * filters));
    for (int64_t p = 0; p < positions; ++p) {
      for (int64_t m = 0; m < filters; ++m) {
        double s = bias[static_cast<size_t>(m)];
        for (int64_t q = 0; q < taps; ++q) {
          s += static_cast<double>(signal[static_cast<size_t>(p * stride + q * dil)]) *
               w[static_cast<size_t>(m * taps + q)];
        }
        want[static_cast<size_t>(p * filters + m)] = relu ? std::max(s, 0.0) : s;
      }
    }
    // The filter [filters x taps] packed transposed, as the convolution packs it.
    const math::PackedB wt(math::MatrixView::row_major(w.data(), filters, taps, taps).transposed(),
                           &isa_kernels);
    math::GemmOptions o;
    o.kernels = &isa_kernels;
    o.bias = bias.data();
    if (relu) o.activation = math::Activation::Relu;
    std::vector<float> c(static_cast<size_t>(positions * filters));
    math::sgemm(math::MatrixView{signal.data(), positions, taps, stride, dil}, wt, c.data(),
                filters, o);
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      worst = std::max(worst, std::abs(c[i] - want[i]) / (1 + std::abs(want[i])));
    }
    INFO("positions " << positions << " taps " << taps << " filters " << filters << " stride "
                      << stride << " dilation " << dil);
    CHECK(worst < 1e-5);
  }
}

KILN_ISA_TEST_CASE("the wide-form plane matches a naive convolution, max and average",
                   "[math][conv][pool]") {
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  constexpr int64_t kSlack = math::ConvKernels::wide_slack;
  constexpr float kSentinel = 7.0f;
  std::mt19937 rng(41);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int iter = 0; iter < 400; ++iter) {
    math::ConvGeometry g;
    const int dims = static_cast<int>(pick(1, 3));
    for (int d = 3 - dims; d < 3; ++d) {
      // Mostly the small 3x3 and 5x5 planes the path is for, often with stride 2 (whose
      // column phases pad_rows_pair writes together); sometimes stride 3.
      g.k[d] = iter % 4 == 0 ? pick(1, 7) : (iter % 2 ? 3 : 5);
      g.stride[d] = iter % 3 == 0 ? pick(1, 3) : (iter % 3 == 1 ? 2 : 1);
      g.dil[d] = pick(1, 2);
      g.pad[d] = pick(0, g.k[d] - 1);
      const int64_t ek = (g.k[d] - 1) * g.dil[d] + 1;
      g.in[d] = std::max<int64_t>(ek - 2 * g.pad[d], 1) + pick(0, iter % 5 == 0 ? 40 : 14);
      g.out[d] = (g.in[d] + 2 * g.pad[d] - ek) / g.stride[d] + 1;
      // ceil_mode: a last window that runs past the right padding.
      if (iter % 5 == 1 && (g.in[d] + 2 * g.pad[d] - ek) % g.stride[d] != 0) ++g.out[d];
    }
    const int64_t ip = g.in[0] * g.in[1] * g.in[2], op = g.out[0] * g.out[1] * g.out[2];
    const int64_t kp = g.k[0] * g.k[1] * g.k[2];
    std::vector<float> x(static_cast<size_t>(ip)), w(static_cast<size_t>(kp)),
        y0(static_cast<size_t>(op));
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    for (auto& v : y0) v = dist(rng);
    const ops::WideExtent ext(g);
    // The layout and the wide output with their slack, and a sentinel past each.
    std::vector<float> xp(static_cast<size_t>(ext.plane + kSlack + 1), kSentinel);
    std::vector<float> scratch(static_cast<size_t>(ext.wide_n + kSlack), 0.0f);
    INFO("in " << g.in[0] << "x" << g.in[1] << "x" << g.in[2] << " k " << g.k[0] << "x" << g.k[1]
               << "x" << g.k[2] << " stride " << g.stride[1] << "," << g.stride[2] << " dil "
               << g.dil[2] << " pad " << g.pad[1] << "," << g.pad[2]);

    // Convolution, with the bias, Z and the Relu of a fused convolution.
    const float bias = dist(rng);
    math::WideEpilogue e;
    e.accumulate = iter % 2 == 1;
    e.relu = iter % 3 == 1;
    ops::pad_phases(x.data(), g, ext, xp.data(), 0.0f, k);
    REQUIRE(xp[static_cast<size_t>(ext.plane)] == kSentinel);  // nothing past the layout
    std::fill(xp.begin() + ext.plane, xp.end() - 1, 0.0f);
    std::vector<float> start(y0);
    for (auto& v : start) v = e.accumulate ? v + bias : bias;
    const std::vector<double> want = naive_plane(x, w, g, start);
    std::vector<float> y(y0);
    y.push_back(kSentinel);
    k.wide_plane(xp.data(), w.data(), ext.taps.data(), kp, math::WideOp::Conv, bias, g, ext.len[1],
                 ext.len[2], e, scratch.data(), y.data());
    CHECK(y.back() == kSentinel);
    double worst = 0;
    for (size_t i = 0; i < static_cast<size_t>(op); ++i) {
      const double ref = e.relu ? std::max(want[i], 0.0) : want[i];
      worst = std::max(worst, std::abs(y[i] - ref) / (1 + std::abs(ref)));
    }
    REQUIRE(worst <= 2e-6 * std::sqrt(static_cast<double>(kp)) + 1e-6);

    // Max (padding -inf, NaN inputs skipped) and sums scaled per row and column.
    if (iter % 7 == 0) x[static_cast<size_t>(pick(0, ip - 1))] = std::nanf("");
    std::vector<float> rows(static_cast<size_t>(g.out[0] * g.out[1])),
        cols(static_cast<size_t>(g.out[2]));
    for (auto& v : rows) v = dist(rng);
    for (auto& v : cols) v = dist(rng);
    for (const bool max : {true, false}) {
      ops::pad_phases(x.data(), g, ext, xp.data(), max ? -INFINITY : 0.0f, k);
      math::WideEpilogue pe;
      if (!max) pe.row_scale = rows.data(), pe.col_scale = cols.data();
      std::vector<float> got(static_cast<size_t>(op) + 1, kSentinel);
      k.wide_plane(xp.data(), nullptr, ext.taps.data(), kp,
                   max ? math::WideOp::Max : math::WideOp::Sum, 0.0f, g, ext.len[1], ext.len[2], pe,
                   scratch.data(), got.data());
      CHECK(got.back() == kSentinel);
      for (int64_t od = 0; od < g.out[0]; ++od)
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow) {
            double best = -INFINITY, sum = 0;
            for (int64_t t = 0; t < kp; ++t) {
              const int64_t kd = t / (g.k[1] * g.k[2]), kh = t / g.k[2] % g.k[1], kw = t % g.k[2];
              const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
              const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
              const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
              if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1] || iw < 0 || iw >= g.in[2])
                continue;
              const double v = x[static_cast<size_t>((id * g.in[1] + ih) * g.in[2] + iw)];
              sum += v;
              if (v > best) best = v;
            }
            const int64_t r = od * g.out[1] + oh;
            const double ref =
                max ? best : sum * rows[static_cast<size_t>(r)] * cols[static_cast<size_t>(ow)];
            const float v = got[static_cast<size_t>(r * g.out[2] + ow)];
            if (std::isnan(ref)) {  // a sum over a NaN input
              REQUIRE(std::isnan(v));
            } else if (max) {
              REQUIRE(v == static_cast<float>(ref));
            } else {
              REQUIRE(std::abs(v - ref) <= 1e-5 * (1 + std::abs(ref)) * static_cast<double>(kp));
            }
          }
    }
  }
}

KILN_ISA_TEST_CASE("pad_rows_pair writes the even and odd columns of each row as naive copies",
                   "[math][conv][pool]") {
  // Rows given by pointer, some outside the input (null), written to destinations in any
  // order; column bases before, inside and past the row, short rows and long ones (several
  // chunks of vectors), fill values.
  KILN_REQUIRE_ISA();
  const math::ConvKernels& k = isa_kernels.conv;
  constexpr float kSentinel = 7.0f;
  std::mt19937 rng(43);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int iter = 0; iter < 500; ++iter) {
    const int64_t in_h = pick(1, 9), width = iter % 6 == 0 ? pick(100, 400) : pick(1, 40);
    const int64_t rows = pick(1, 12);
    const int64_t base = pick(-4, iter % 9 == 0 ? width + 3 : 3);
    const int64_t n = iter % 6 == 0 ? pick(1, 260) : pick(1, 30);
    const float fill = iter % 2 ? -INFINITY : dist(rng);
    std::vector<float> x(static_cast<size_t>(in_h * width));
    for (auto& v : x) v = dist(rng);
    std::vector<int64_t> ih(static_cast<size_t>(rows)), at(static_cast<size_t>(rows));
    std::vector<const float*> src(static_cast<size_t>(rows));
    std::vector<float*> d0(static_cast<size_t>(rows)), d1(d0);
    // Each output row with a sentinel after it; destinations in a shuffled order.
    std::vector<float> out0(static_cast<size_t>(rows * (n + 1)), kSentinel), out1(out0);
    for (int64_t i = 0; i < rows; ++i) at[static_cast<size_t>(i)] = i;
    std::shuffle(at.begin(), at.end(), rng);
    for (size_t i = 0; i < static_cast<size_t>(rows); ++i) {
      ih[i] = pick(-1, in_h);  // -1 and in_h: outside
      src[i] = ih[i] >= 0 && ih[i] < in_h ? x.data() + ih[i] * width : nullptr;
      d0[i] = out0.data() + at[i] * (n + 1);
      d1[i] = out1.data() + at[i] * (n + 1);
    }
    k.pad_rows_pair(src.data(), rows, width, base, n, fill, d0.data(), d1.data());
    INFO("width " << width << " rows " << rows << " base " << base << " n " << n);
    for (size_t i = 0; i < static_cast<size_t>(rows); ++i) {
      CHECK(d0[i][n] == kSentinel);  // nothing written past the row
      CHECK(d1[i][n] == kSentinel);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t phase = 0; phase < 2; ++phase) {
          const int64_t c = base + 2 * j + phase;
          const bool inside = src[i] && c >= 0 && c < width;
          const float want = inside ? x[static_cast<size_t>(ih[i] * width + c)] : fill;
          const float got = (phase ? d1 : d0)[i][j];
          INFO("row " << i << " column " << j << " phase " << phase);
          REQUIRE(got == want);
        }
      }
    }
  }
}
