// Resize / Upsample, GridSample, AffineGrid, RoiAlign and NonMaxSuppression against naive
// per-output-element references written straight from the spec formulas.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

int64_t rand_int(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

template <typename T>
T pick(std::mt19937& rng, const std::vector<T>& v) {
  return v[static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(v.size()) - 1))];
}

Shape coords_of(const Shape& shape, int64_t flat) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

Tensor floats(Shape shape, std::vector<float> v) {
  return Tensor::from_vector<float>(shape, v);
}
Tensor ints(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from_vector<int64_t>({n}, v);
}

// ---- Resize reference ----

struct ResizeRef {
  std::string mode = "nearest", coord = "half_pixel", nearest = "round_prefer_floor";
  double a = -0.75;
  bool exclude = false, antialias = false;
  double extrapolation = 0;
  std::vector<double> roi;  // [starts..., ends...] over all axes, for tf_crop_and_resize
};

double cubic(double t, double a) {
  t = std::abs(t);
  if (t <= 1) return (a + 2) * t * t * t - (a + 3) * t * t + 1;
  if (t < 2) return a * t * t * t - 5 * a * t * t + 8 * a * t - 4 * a;
  return 0;
}

// The (input index, weight) pairs output index y of one axis reads; false if extrapolated.
bool ref_taps(const ResizeRef& o, int64_t y, int64_t in, int64_t out, double scale, double r0,
              double r1, std::vector<std::pair<int64_t, double>>* taps) {
  const double len = static_cast<double>(in), ow = scale * len, yd = static_cast<double>(y);
  double x = 0;
  if (o.coord == "half_pixel") x = (yd + 0.5) / scale - 0.5;
  if (o.coord == "pytorch_half_pixel") x = ow == 1 ? -0.5 : (yd + 0.5) / scale - 0.5;
  if (o.coord == "asymmetric") x = yd / scale;
  if (o.coord == "align_corners") x = ow == 1 ? 0 : yd * (len - 1) / (ow - 1);
  if (o.coord == "tf_crop_and_resize") {
    x = (ow == 1 ? (r1 - r0) * (len - 1) / 2 : yd * (r1 - r0) * (len - 1) / (ow - 1)) +
        r0 * (len - 1);
    if (x < 0 || x > len - 1) return false;
  }
  auto clampi = [&](double i) { return std::clamp<int64_t>(static_cast<int64_t>(i), 0, in - 1); };
  taps->clear();
  const double fl = std::floor(x), t = x - fl;
  if (o.mode == "nearest") {
    double i = fl;
    if (o.nearest == "ceil") i = std::ceil(x);
    if (o.nearest == "round_prefer_floor") i = t <= 0.5 ? fl : fl + 1;
    if (o.nearest == "round_prefer_ceil") i = t < 0.5 ? fl : fl + 1;
    taps->push_back({clampi(i), 1.0});
    return true;
  }
  const bool linear = o.mode == "linear";
  if (o.antialias && scale < 1) {
    // Every integer position within the filter support, scaled by the downsampling factor.
    double sum = 0;
    for (double j = std::floor(fl - 2 / scale) - 2; j <= fl + 2 / scale + 2; ++j) {
      const double d = (j - x) * scale;
      const double w = linear ? std::max(0.0, 1 - std::abs(d)) : cubic(d, o.a);
      if (w != 0) taps->push_back({static_cast<int64_t>(j), w});
      sum += w;
    }
    for (auto& p : *taps) p.second /= sum;
  } else if (linear) {
    taps->push_back({static_cast<int64_t>(fl), 1 - t});
    taps->push_back({static_cast<int64_t>(fl) + 1, t});
  } else {
    for (int k = -1; k <= 2; ++k)
      taps->push_back({static_cast<int64_t>(fl) + k, cubic(t - k, o.a)});
  }
  if (o.exclude) {
    double sum = 0;
    for (auto& p : *taps) {
      if (p.first < 0 || p.first >= in) p.second = 0;
      sum += p.second;
    }
    for (auto& p : *taps) p.second /= sum;
  }
  for (auto& p : *taps) p.first = std::clamp<int64_t>(p.first, 0, in - 1);
  return true;
}

// Resize of any rank: each output element is the weighted sum over the product of the
// per-axis taps, computed one element at a time in double.
std::vector<double> ref_resize(const Tensor& x, const Shape& out, const std::vector<double>& scales,
                               const ResizeRef& o) {
  const size_t r = x.rank();
  const Shape strides = contiguous_strides(x.shape());
  std::vector<double> y(static_cast<size_t>(shape_numel(out)));
  std::vector<std::vector<std::pair<int64_t, double>>> taps(r);
  for (int64_t e = 0; e < shape_numel(out); ++e) {
    const Shape c = coords_of(out, e);
    bool inside = true;
    for (size_t d = 0; d < r; ++d) {
      const double r0 = o.roi.empty() ? 0 : o.roi[d], r1 = o.roi.empty() ? 1 : o.roi[r + d];
      if (out[d] == x.dim(d) && scales[d] == 1 && r0 == 0 && r1 == 1) {
        taps[d] = {{c[d], 1.0}};
      } else {
        inside = ref_taps(o, c[d], x.dim(d), out[d], scales[d], r0, r1, &taps[d]) && inside;
      }
    }
    if (!inside) {
      y[static_cast<size_t>(e)] = o.extrapolation;
      continue;
    }
    double acc = 0;
    std::vector<size_t> k(r, 0);
    while (true) {
      double w = 1;
      int64_t off = 0;
      for (size_t d = 0; d < r; ++d) {
        w *= taps[d][k[d]].second;
        off += taps[d][k[d]].first * strides[d];
      }
      acc += w * element(x, off);
      size_t d = r;
      while (d > 0 && ++k[d - 1] == taps[d - 1].size()) k[--d] = 0;
      if (d == 0) break;
    }
    y[static_cast<size_t>(e)] = acc;
  }
  return y;
}

void require_values(const Tensor& actual, const std::vector<double>& expected, double tol = 1e-4) {
  REQUIRE(actual.numel() == static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < actual.numel(); ++i) {
    INFO("element " << i);
    REQUIRE(element(actual, i) ==
            Approx(expected[static_cast<size_t>(i)]).margin(tol).epsilon(tol));
  }
}

Tensor scales_tensor(const std::vector<double>& s) {
  std::vector<float> f(s.begin(), s.end());
  return floats({static_cast<int64_t>(f.size())}, f);
}

OpTest resize_op(const ResizeRef& o, int64_t opset = 19) {
  OpTest t("Resize", opset);
  t.attr("mode", o.mode).attr("coordinate_transformation_mode", o.coord);
  t.attr("nearest_mode", o.nearest).attr("cubic_coeff_a", o.a);
  t.attr("exclude_outside", o.exclude ? 1 : 0).attr("antialias", o.antialias ? 1 : 0);
  t.attr("extrapolation_value", o.extrapolation);
  return t;
}

}  // namespace

TEST_CASE("Resize matches a per-pixel reference over random images and scales", "[ops][vision]") {
  std::mt19937 rng(11);
  const std::vector<std::string> coords = {"half_pixel", "pytorch_half_pixel", "asymmetric",
                                           "align_corners"};
  const std::vector<std::string> nearest = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                            "ceil"};
  // Scales are float tensors: the reference sees the float values.
  const std::vector<float> factors = {0.25f, 0.5f, 0.6f, 0.75f, 1.0f, 1.25f, 1.5f, 2.0f, 3.0f};
  for (int iter = 0; iter < 120; ++iter) {
    ResizeRef o;
    o.mode = pick<std::string>(rng, {"nearest", "linear", "cubic"});
    o.coord = pick(rng, coords);
    o.nearest = pick(rng, nearest);
    o.exclude = o.mode == "cubic" && rng() % 2;
    o.a = o.mode == "cubic" && rng() % 2 ? -0.5 : -0.75;
    o.antialias = o.mode != "nearest" && rng() % 3 == 0;
    const Shape shape = {rand_int(rng, 1, 2), rand_int(rng, 1, 3), rand_int(rng, 1, 12),
                         rand_int(rng, 1, 12)};
    Tensor x = random_tensor(DataType::Float, shape, rng, -4, 4);
    std::vector<double> scales = {1, 1, pick(rng, factors), pick(rng, factors)};
    Shape out = shape;
    const bool use_sizes = rng() % 3 == 0;
    if (use_sizes) {
      out[2] = rand_int(rng, 1, 20);
      out[3] = rand_int(rng, 1, 20);
      for (size_t d = 2; d < 4; ++d)
        scales[d] = static_cast<double>(out[d]) / static_cast<double>(shape[d]);
    } else {
      for (size_t d = 2; d < 4; ++d) {
        out[d] = static_cast<int64_t>(std::floor(scales[d] * static_cast<double>(shape[d])));
      }
    }
    INFO(o.mode << " " << o.coord << " " << o.nearest << " aa=" << o.antialias << " excl="
                << o.exclude << " " << shape_to_string(shape) << " -> " << shape_to_string(out));
    OpTest t = resize_op(o).input(x).no_input();
    if (use_sizes) {
      t.no_input().input(ints(out));
    } else {
      t.input(scales_tensor(scales));
    }
    Tensor y = t.run1();
    REQUIRE(y.shape() == out);
    require_values(y, ref_resize(x, out, scales, o));
  }
}

TEST_CASE("Resize handles any axes, other ranks and the axes attribute", "[ops][vision]") {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 40; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 5));
    const Shape shape = random_shape(rank, 6, rng);
    Tensor x = random_tensor(DataType::Float, shape, rng);
    ResizeRef o;
    o.mode = pick<std::string>(rng, {"nearest", "linear", "cubic"});
    // A random subset of axes, in a random order.
    std::vector<int64_t> axes(rank);
    std::iota(axes.begin(), axes.end(), 0);
    std::shuffle(axes.begin(), axes.end(), rng);
    axes.resize(static_cast<size_t>(rand_int(rng, 1, static_cast<int64_t>(rank))));
    std::vector<double> scales(rank, 1.0), given;
    Shape out = shape;
    for (int64_t a : axes) {
      const double s = pick<double>(rng, {0.5, 1.5, 2.0, 2.5});
      scales[static_cast<size_t>(a)] = s;
      out[static_cast<size_t>(a)] =
          static_cast<int64_t>(std::floor(s * static_cast<double>(shape[static_cast<size_t>(a)])));
      given.push_back(s);
    }
    INFO(o.mode << " " << shape_to_string(shape) << " -> " << shape_to_string(out));
    Tensor y =
        resize_op(o).attr("axes", axes).input(x).no_input().input(scales_tensor(given)).run1();
    REQUIRE(y.shape() == out);
    require_values(y, ref_resize(x, out, scales, o));
  }
}

TEST_CASE("Resize tf_crop_and_resize extrapolates outside the roi", "[ops][vision]") {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 30; ++iter) {
    ResizeRef o;
    o.mode = pick<std::string>(rng, {"nearest", "linear", "cubic"});
    o.coord = "tf_crop_and_resize";
    o.extrapolation = 7.5;
    const Shape shape = {1, 2, rand_int(rng, 2, 8), rand_int(rng, 2, 8)};
    std::uniform_real_distribution<double> lo(-0.4, 0.5), hi(0.5, 1.4);
    o.roi = {0, 0, static_cast<float>(lo(rng)), static_cast<float>(lo(rng)),
             1, 1, static_cast<float>(hi(rng)), static_cast<float>(hi(rng))};
    const Shape out = {1, 2, rand_int(rng, 1, 9), rand_int(rng, 1, 9)};
    std::vector<double> scales(4);
    for (size_t d = 0; d < 4; ++d)
      scales[d] = static_cast<double>(out[d]) / static_cast<double>(shape[d]);
    Tensor x = random_tensor(DataType::Float, shape, rng);
    Tensor roi = floats({8}, std::vector<float>(o.roi.begin(), o.roi.end()));
    Tensor y = resize_op(o).input(x).input(roi).no_input().input(ints(out)).run1();
    require_values(y, ref_resize(x, out, scales, o));
  }
}

TEST_CASE("Resize on uint8, int8, float16 and double", "[ops][vision]") {
  std::mt19937 rng(4);
  for (DataType dt : {DataType::UInt8, DataType::Int8, DataType::Float16, DataType::Double}) {
    for (const char* mode : {"nearest", "linear", "cubic"}) {
      ResizeRef o;
      o.mode = mode;
      const Shape shape = {1, 3, 5, 7};
      Tensor x = random_tensor(dt, shape, rng, dt == DataType::UInt8 ? 0 : -100, 100);
      const std::vector<double> scales = {1, 1, 1.6f, 0.7f};
      const Shape out = {1, 3, 8, 4};
      Tensor y = resize_op(o).input(x).no_input().input(scales_tensor(scales)).run1();
      REQUIRE(y.dtype() == dt);
      std::vector<double> expected = ref_resize(x, out, scales, o);
      if (dt == DataType::UInt8 || dt == DataType::Int8) {
        const double lo = dt == DataType::UInt8 ? 0 : -128, hi = dt == DataType::UInt8 ? 255 : 127;
        for (double& v : expected) v = std::clamp(std::nearbyint(v), lo, hi);
        require_values(y, expected, 0);
      } else {
        require_values(y, expected, dt == DataType::Float16 ? 0.1 : 1e-9);
      }
    }
  }
}

TEST_CASE("Resize keep_aspect_ratio_policy scales the given axes alike", "[ops][vision]") {
  Tensor x = Tensor::zeros(DataType::Float, {1, 1, 2, 4});
  auto shape_of = [&](const char* policy) {
    return OpTest("Resize", 18)
        .attr("axes", std::vector<int64_t>{2, 3})
        .attr("keep_aspect_ratio_policy", policy)
        .input(x)
        .no_input()
        .no_input()
        .input(ints({7, 8}))
        .run1()
        .shape();
  };
  CHECK(shape_of("stretch") == Shape{1, 1, 7, 8});
  CHECK(shape_of("not_larger") == Shape{1, 1, 4, 8});
  CHECK(shape_of("not_smaller") == Shape{1, 1, 7, 14});
}

TEST_CASE("Resize with unit scales shares the input", "[ops][vision]") {
  Tensor x = floats({1, 1, 2, 2}, {1, 2, 3, 4});
  OpTest t("Resize", 19);
  Tensor y = t.attr("mode", "linear").input(x).no_input().input(scales_tensor({1, 1, 1, 1})).run1();
  CHECK(y.to_vector<float>() == x.to_vector<float>());
  CHECK(t.stats().bytes_copied == 0);
}

TEST_CASE("Upsample and Resize-10 use asymmetric coordinates", "[ops][vision]") {
  Tensor x = floats({1, 1, 2, 2}, {1, 2, 3, 4});
  const std::vector<float> nearest = {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2,
                                      3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4};
  CHECK(OpTest("Upsample", 7)
            .attr("scales", std::vector<float>{1, 1, 2, 3})
            .input(x)
            .run1()
            .to_vector<float>() == nearest);
  CHECK(
      OpTest("Upsample", 9).input(x).input(scales_tensor({1, 1, 2, 3})).run1().to_vector<float>() ==
      nearest);
  CHECK(
      OpTest("Resize", 10).input(x).input(scales_tensor({1, 1, 2, 3})).run1().to_vector<float>() ==
      nearest);
  // Linear: x / scale, clamped at the far edge.
  Tensor y = OpTest("Upsample", 9)
                 .attr("mode", "linear")
                 .input(floats({1, 3}, {0, 4, 8}))
                 .input(scales_tensor({1, 2}))
                 .run1();
  CHECK(y.to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 8});
  // Resize-10 nearest rounds up when downsampling.
  Tensor d = OpTest("Resize", 10)
                 .input(floats({1, 5}, {0, 1, 2, 3, 4}))
                 .input(scales_tensor({1, 0.6}))
                 .run1();
  CHECK(d.to_vector<float>() == std::vector<float>{0, 2, 4});
}

TEST_CASE("Resize rejects bad attributes and inputs", "[ops][vision]") {
  Tensor x = Tensor::zeros(DataType::Float, {1, 1, 2, 2});
  auto with_scales = [&](OpTest t, std::vector<double> s) {
    return t.input(x).no_input().input(scales_tensor(s)).run();
  };
  REQUIRE_THROWS_AS(with_scales(OpTest("Resize", 19).attr("mode", "bilinear"), {1, 1, 2, 2}),
                    Error);
  REQUIRE_THROWS_AS(
      with_scales(OpTest("Resize", 19).attr("coordinate_transformation_mode", "corners"),
                  {1, 1, 2, 2}),
      Error);
  REQUIRE_THROWS_AS(with_scales(OpTest("Resize", 19).attr("nearest_mode", "up"), {1, 1, 2, 2}),
                    Error);
  REQUIRE_THROWS_AS(
      with_scales(OpTest("Resize", 19).attr("keep_aspect_ratio_policy", "fit"), {1, 1, 2, 2}),
      Error);
  REQUIRE_THROWS_AS(with_scales(OpTest("Resize", 19), {1, 2, 2}), Error);           // wrong length
  REQUIRE_THROWS_AS(with_scales(OpTest("Resize", 19), {1, 1, 0, 2}), Error);        // zero scale
  REQUIRE_THROWS_AS(with_scales(OpTest("Resize", 19), {1, 1, -2, 2}), Error);       // negative
  REQUIRE_THROWS_AS(with_scales(OpTest("Resize", 19), {1, 1, 1e30, 1e30}), Error);  // too large
  REQUIRE_THROWS_AS(
      OpTest("Resize", 19).input(x).no_input().no_input().input(ints({1, 1, -2, 2})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Resize", 19).input(x).no_input().no_input().input(ints({1, 2})).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Resize", 19)
                        .input(x)
                        .no_input()
                        .input(scales_tensor({1, 1, 2, 2}))
                        .input(ints({1, 1, 4, 4}))
                        .run(),
                    Error);                                       // both scales and sizes
  REQUIRE_THROWS_AS(OpTest("Resize", 19).input(x).run(), Error);  // neither
  REQUIRE_THROWS_AS(OpTest("Resize", 19)
                        .attr("axes", std::vector<int64_t>{2, -2})
                        .input(x)
                        .no_input()
                        .input(scales_tensor({2, 2}))
                        .run(),
                    Error);  // repeated axis
  REQUIRE_THROWS_AS(OpTest("Resize", 19)
                        .attr("axes", std::vector<int64_t>{4})
                        .input(x)
                        .no_input()
                        .input(scales_tensor({2}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Upsample", 9).input(x).input(scales_tensor({1, 1, 0.5, 2})).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Upsample", 7).input(x).run(), Error);  // scales attribute missing
  REQUIRE_THROWS_AS(OpTest("Resize", 19)
                        .attr("axes", std::vector<int64_t>{2, 3})
                        .attr("keep_aspect_ratio_policy", "not_smaller")
                        .input(x)
                        .no_input()
                        .no_input()
                        .input(ints({int64_t{1} << 60, 1}))
                        .run(),
                    Error);  // the policy scales the other axis past any real size
  REQUIRE_THROWS_AS(
      OpTest("Resize", 10).attr("mode", "cubic").input(x).input(scales_tensor({1, 1, 2, 2})).run(),
      Error);
}

// ---- GridSample reference: each output point interpolated from scratch ----

namespace {

struct GridRef {
  std::string mode = "linear", padding = "zeros";
  bool align = false;
};

// Mirror at the nearer border until inside (lo < hi).
double reflect_ref(double x, double lo, double hi) {
  while (x < lo || x > hi) x = x < lo ? 2 * lo - x : 2 * hi - x;
  return x;
}

// The pixel value at integer position i of axis d (padding applied), or 0.
double grid_value(const std::vector<double>& img, const Shape& dims, Shape pos, const GridRef& o) {
  int64_t off = 0;
  for (size_t d = 0; d < dims.size(); ++d) {
    int64_t i = pos[d];
    const int64_t n = dims[d];
    if (i < 0 || i >= n) {
      if (o.padding == "zeros") return 0;
      if (o.padding == "border") i = std::clamp<int64_t>(i, 0, n - 1);
      if (o.padding == "reflection") {
        const double lo = o.align ? 0 : -0.5,
                     hi = o.align ? static_cast<double>(n - 1) : static_cast<double>(n) - 0.5;
        i = n == 1
                ? 0
                : std::clamp<int64_t>(
                      static_cast<int64_t>(reflect_ref(static_cast<double>(i), lo, hi)), 0, n - 1);
      }
    }
    off = off * n + i;
  }
  return img[static_cast<size_t>(off)];
}

double grid_sample_ref(const std::vector<double>& img, const Shape& dims, std::vector<double> g,
                       const GridRef& o) {
  const size_t k = dims.size();
  std::vector<double> x(k);
  for (size_t d = 0; d < k; ++d) {
    const double n = static_cast<double>(dims[d]), v = g[k - 1 - d];
    x[d] = o.align ? (v + 1) / 2 * (n - 1) : ((v + 1) * n - 1) / 2;
    if (o.mode == "nearest") x[d] = std::nearbyint(x[d]);
    const double lo = o.align ? 0 : -0.5, hi = o.align ? n - 1 : n - 0.5;
    if (o.mode != "cubic" && (x[d] < lo || x[d] > hi)) {
      if (o.padding == "border") x[d] = std::clamp(x[d], 0.0, n - 1);
      if (o.padding == "reflection" && dims[d] > 1) x[d] = reflect_ref(x[d], lo, hi);
    }
  }
  if (o.mode == "nearest") {
    Shape pos(k);
    for (size_t d = 0; d < k; ++d) pos[d] = static_cast<int64_t>(x[d]);
    return grid_value(img, dims, pos, o);
  }
  const int taps = o.mode == "linear" ? 2 : 4, first = o.mode == "linear" ? 0 : -1;
  double acc = 0;
  const int64_t combos = static_cast<int64_t>(std::pow(taps, k));
  for (int64_t c = 0; c < combos; ++c) {
    Shape pos(k);
    double w = 1;
    int64_t rest = c;
    for (size_t d = 0; d < k; ++d) {
      const int j = static_cast<int>(rest % taps) + first;
      rest /= taps;
      const double f = std::floor(x[d]), t = x[d] - f;
      pos[d] = static_cast<int64_t>(f) + j;
      w *= o.mode == "linear" ? (j == 0 ? 1 - t : t) : cubic(t - j, -0.75);
    }
    if (w != 0) acc += w * grid_value(img, dims, pos, o);
  }
  return acc;
}

}  // namespace

TEST_CASE("GridSample matches a per-point reference", "[ops][vision]") {
  std::mt19937 rng(21);
  for (int iter = 0; iter < 120; ++iter) {
    GridRef o;
    o.mode = pick<std::string>(rng, {"linear", "nearest", "cubic"});
    o.padding = pick<std::string>(rng, {"zeros", "border", "reflection"});
    o.align = rng() % 2;
    const size_t k = o.mode == "cubic" ? 2 : static_cast<size_t>(rand_int(rng, 1, 3));
    Shape xs = {rand_int(rng, 1, 2), rand_int(rng, 1, 3)};
    Shape gs = {xs[0]};
    for (size_t d = 0; d < k; ++d) {
      xs.push_back(rand_int(rng, 1, 6));
      gs.push_back(rand_int(rng, 1, 5));
    }
    gs.push_back(static_cast<int64_t>(k));
    Tensor x = random_tensor(DataType::Float, xs, rng, -3, 3);
    // Some grids reach far outside, where reflection folds more than once.
    const double reach = iter % 3 == 0 ? 4.0 : 1.7;
    Tensor grid = random_tensor(DataType::Float, gs, rng, -reach, reach);
    INFO(o.mode << " " << o.padding << " align=" << o.align << " " << shape_to_string(xs));
    Tensor y = OpTest("GridSample", 22)
                   .attr("mode", o.mode)
                   .attr("padding_mode", o.padding)
                   .attr("align_corners", o.align ? 1 : 0)
                   .input(x)
                   .input(grid)
                   .run1();
    const Shape dims(xs.begin() + 2, xs.end());
    const int64_t plane = shape_numel(dims);
    const int64_t points = y.numel() / (xs[0] * xs[1]);
    std::vector<double> expected;
    for (int64_t n = 0; n < xs[0]; ++n) {
      for (int64_t c = 0; c < xs[1]; ++c) {
        std::vector<double> img(static_cast<size_t>(plane));
        for (int64_t i = 0; i < plane; ++i)
          img[static_cast<size_t>(i)] = element(x, (n * xs[1] + c) * plane + i);
        for (int64_t p = 0; p < points; ++p) {
          std::vector<double> g(k);
          for (size_t d = 0; d < k; ++d)
            g[d] =
                element(grid, (n * points + p) * static_cast<int64_t>(k) + static_cast<int64_t>(d));
          expected.push_back(grid_sample_ref(img, dims, g, o));
        }
      }
    }
    require_values(y, expected, 1e-4);
  }
}

TEST_CASE("AffineGrid with the identity matrix makes GridSample return its input",
          "[ops][vision]") {
  std::mt19937 rng(8);
  for (int align = 0; align < 2; ++align) {
    for (const char* mode : {"linear", "nearest", "cubic"}) {
      Tensor x = random_tensor(DataType::Float, {2, 3, 5, 7}, rng);
      Tensor theta = floats({2, 2, 3}, {1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0});
      Tensor grid = OpTest("AffineGrid", 20)
                        .attr("align_corners", align)
                        .input(theta)
                        .input(ints({2, 3, 5, 7}))
                        .run1();
      REQUIRE(grid.shape() == Shape{2, 5, 7, 2});
      Tensor y = OpTest("GridSample", 20)
                     .attr("mode", mode)
                     .attr("align_corners", align)
                     .input(x)
                     .input(grid)
                     .run1();
      require_close(y, x, 1e-4, 1e-5);
    }
    Tensor x3 = random_tensor(DataType::Float, {1, 2, 3, 4, 5}, rng);
    Tensor theta3 = floats({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
    Tensor grid3 = OpTest("AffineGrid", 20)
                       .attr("align_corners", align)
                       .input(theta3)
                       .input(ints({1, 2, 3, 4, 5}))
                       .run1();
    REQUIRE(grid3.shape() == Shape{1, 3, 4, 5, 3});
    require_close(
        OpTest("GridSample", 20).attr("align_corners", align).input(x3).input(grid3).run1(), x3,
        1e-4, 1e-5);
  }
}

TEST_CASE("AffineGrid applies theta to the normalized pixel centers", "[ops][vision]") {
  Tensor theta = floats({1, 2, 3}, {2, 0.5f, 0.25f, -1, 3, 0.5f});
  Tensor g = OpTest("AffineGrid", 20).input(theta).input(ints({1, 1, 2, 4})).run1();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t w = 0; w < 4; ++w) {
      const double xw = -1 + (2.0 * static_cast<double>(w) + 1) / 4,
                   yh = -1 + (2.0 * static_cast<double>(h) + 1) / 2;
      CHECK(element(g, (h * 4 + w) * 2) == Approx(2 * xw + 0.5 * yh + 0.25));
      CHECK(element(g, (h * 4 + w) * 2 + 1) == Approx(-xw + 3 * yh + 0.5));
    }
  }
  REQUIRE_THROWS_AS(OpTest("AffineGrid", 20).input(theta).input(ints({1, 1, 2})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("AffineGrid", 20).input(theta).input(ints({2, 1, 2, 4})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("AffineGrid", 20).input(theta).input(ints({1, 1, -2, 4})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("AffineGrid", 20).input(theta).input(ints({1, 1, 2, 3, 4})).run(),
                    Error);
}

TEST_CASE("GridSample rejects bad modes and shapes", "[ops][vision]") {
  Tensor x = Tensor::zeros(DataType::Float, {1, 1, 3, 3});
  Tensor grid = Tensor::zeros(DataType::Float, {1, 2, 2, 2});
  CHECK(OpTest("GridSample", 16).attr("mode", "bicubic").input(x).input(grid).run1().shape() ==
        Shape{1, 1, 2, 2});
  REQUIRE_THROWS_AS(OpTest("GridSample", 16).attr("mode", "cubic").input(x).input(grid).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("GridSample", 20).attr("mode", "bilinear").input(x).input(grid).run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("GridSample", 20).attr("padding_mode", "wrap").input(x).input(grid).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("GridSample", 20).input(x).input(Tensor::zeros(DataType::Float, {1, 2, 2, 3})).run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("GridSample", 20).input(x).input(Tensor::zeros(DataType::Float, {2, 2, 2, 2})).run(),
      Error);
  Tensor x5 = Tensor::zeros(DataType::Float, {1, 1, 2, 2, 2});
  Tensor g5 = Tensor::zeros(DataType::Float, {1, 1, 1, 1, 3});
  REQUIRE_THROWS_AS(OpTest("GridSample", 16).input(x5).input(g5).run(), Error);
  CHECK(OpTest("GridSample", 20).input(x5).input(g5).run1().shape() == Shape{1, 1, 1, 1, 1});
  // Non-finite and huge grid values read padding instead of failing.
  Tensor bad = floats({1, 1, 4, 2}, {NAN, 0, INFINITY, -INFINITY, 1e30f, -1e30f, 3e9f, -7e8f});
  for (const char* pad : {"zeros", "border", "reflection"}) {
    for (const char* mode : {"linear", "nearest", "cubic"}) {
      Tensor y = OpTest("GridSample", 20)
                     .attr("mode", mode)
                     .attr("padding_mode", pad)
                     .input(x)
                     .input(bad)
                     .run1();
      CHECK(y.numel() == 4);
    }
  }
}

// ---- RoiAlign ----

TEST_CASE("RoiAlign averages a linear ramp to its value at each bin center", "[ops][vision]") {
  std::mt19937 rng(13);
  const int64_t h = 12, w = 14;
  std::vector<float> img(static_cast<size_t>(2 * h * w));
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        img[static_cast<size_t>((c * h + y) * w + x)] = static_cast<float>(
            0.5 * static_cast<double>(y) - 0.25 * static_cast<double>(x) + static_cast<double>(c));
      }
    }
  }
  Tensor x = floats({1, 2, h, w}, img);
  for (const char* coord : {"half_pixel", "output_half_pixel"}) {
    const double off = std::string(coord) == "half_pixel" ? 0.5 : 0.0;
    std::uniform_real_distribution<double> pos(1.5, 5.0), len(1.0, 5.0);
    std::vector<float> rois;
    for (int r = 0; r < 4; ++r) {
      const double x0 = pos(rng), y0 = pos(rng);
      rois.insert(rois.end(),
                  {static_cast<float>(x0), static_cast<float>(y0),
                   static_cast<float>(x0 + len(rng)), static_cast<float>(y0 + len(rng))});
    }
    for (int64_t ratio : {0, 2, 3}) {
      Tensor y = OpTest("RoiAlign", 16)
                     .attr("coordinate_transformation_mode", coord)
                     .attr("output_height", int64_t{3})
                     .attr("output_width", int64_t{2})
                     .attr("sampling_ratio", ratio)
                     .input(x)
                     .input(floats({4, 4}, rois))
                     .input(ints({0, 0, 0, 0}))
                     .run1();
      REQUIRE(y.shape() == Shape{4, 2, 3, 2});
      for (int64_t r = 0; r < 4; ++r) {
        const float* b = rois.data() + r * 4;
        const double bw = (b[2] - b[0]) / 2.0, bh = (b[3] - b[1]) / 3.0;
        for (int64_t c = 0; c < 2; ++c) {
          for (int64_t ph = 0; ph < 3; ++ph) {
            for (int64_t pw = 0; pw < 2; ++pw) {
              const double cy = b[1] - off + (static_cast<double>(ph) + 0.5) * bh;
              const double cx = b[0] - off + (static_cast<double>(pw) + 0.5) * bw;
              CHECK(element(y, ((r * 2 + c) * 3 + ph) * 2 + pw) ==
                    Approx(0.5 * cy - 0.25 * cx + static_cast<double>(c)).margin(1e-4));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("RoiAlign max mode and bad inputs", "[ops][vision]") {
  // One sample per bin at the bin center: max of the four weighted corners.
  Tensor x = floats({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor y = OpTest("RoiAlign", 16)
                 .attr("mode", "max")
                 .attr("sampling_ratio", int64_t{1})
                 .attr("coordinate_transformation_mode", "output_half_pixel")
                 .input(x)
                 .input(floats({1, 4}, {0, 0, 1, 1}))
                 .input(ints({0}))
                 .run1();
  // Center (0.5, 0.5): corners weigh 0.25 each.
  CHECK(element(y, 0) == Approx(1.0));
  Tensor rois = floats({1, 4}, {0, 0, 1, 1});
  REQUIRE_THROWS_AS(OpTest("RoiAlign", 16).input(x).input(rois).input(ints({1})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("RoiAlign", 16).input(x).input(rois).input(ints({0, 0})).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("RoiAlign", 16).input(x).input(floats({1, 3}, {0, 0, 1})).input(ints({0})).run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("RoiAlign", 16).attr("mode", "sum").input(x).input(rois).input(ints({0})).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("RoiAlign", 16)
                        .attr("output_height", int64_t{0})
                        .input(x)
                        .input(rois)
                        .input(ints({0}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("RoiAlign", 16)
                        .input(x)
                        .input(floats({1, 4}, {0, 0, 1e30f, 1e30f}))
                        .input(ints({0}))
                        .run(),
                    Error);
}

// ---- NonMaxSuppression ----

namespace {

double iou(const float* a, const float* b, bool center) {
  auto corners = [&](const float* p, double* c) {
    if (center) {
      c[0] = p[0] - p[2] / 2.0, c[1] = p[1] - p[3] / 2.0, c[2] = p[0] + p[2] / 2.0,
      c[3] = p[1] + p[3] / 2.0;
    } else {
      c[0] = std::min(p[1], p[3]), c[1] = std::min(p[0], p[2]), c[2] = std::max(p[1], p[3]),
      c[3] = std::max(p[0], p[2]);
    }
  };
  double p[4], q[4];
  corners(a, p);
  corners(b, q);
  const double iw = std::min(p[2], q[2]) - std::max(p[0], q[0]);
  const double ih = std::min(p[3], q[3]) - std::max(p[1], q[1]);
  if (iw <= 0 || ih <= 0) return 0;
  const double inter = iw * ih;
  return inter / ((p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter);
}

}  // namespace

TEST_CASE("NonMaxSuppression matches a naive greedy selection", "[ops][vision]") {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t batches = rand_int(rng, 1, 2), classes = rand_int(rng, 1, 3),
                  n = rand_int(rng, 0, 25);
    const bool center = rng() % 2;
    std::vector<float> boxes;
    std::uniform_real_distribution<float> p(0, 10), s(0.5f, 4);
    for (int64_t i = 0; i < batches * n; ++i) {
      if (center) {
        boxes.insert(boxes.end(), {p(rng), p(rng), s(rng), s(rng)});
      } else {
        boxes.insert(boxes.end(), {p(rng), p(rng), p(rng), p(rng)});
      }
    }
    Tensor scores = random_tensor(DataType::Float, {batches, classes, n}, rng, 0, 1);
    // Coarse scores make ties common.
    std::vector<float> sv = scores.to_vector<float>();
    for (float& v : sv) v = std::round(v * 8) / 8;
    scores = floats({batches, classes, n}, sv);
    const int64_t max_out = rand_int(rng, 0, 8);
    const float iou_t = std::uniform_real_distribution<float>(0, 0.8f)(rng);
    const bool filter = rng() % 2;
    const float score_t = 0.3f;
    OpTest t("NonMaxSuppression", 11);
    t.attr("center_point_box", center ? 1 : 0)
        .input(floats({batches, n, 4}, boxes))
        .input(scores)
        .input(ints({max_out}))
        .input(floats({1}, {iou_t}));
    if (filter) t.input(floats({1}, {score_t}));
    Tensor y = t.run1();
    std::vector<int64_t> expected;
    for (int64_t b = 0; b < batches; ++b) {
      for (int64_t c = 0; c < classes; ++c) {
        std::vector<int64_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        const float* sc = sv.data() + (b * classes + c) * n;
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t i, int64_t j) { return sc[i] > sc[j]; });
        std::vector<int64_t> kept;
        for (int64_t i : order) {
          if (static_cast<int64_t>(kept.size()) >= max_out) break;
          if (filter && !(sc[i] > score_t)) continue;
          bool ok = true;
          for (int64_t k : kept)
            ok = ok && !(iou(&boxes[static_cast<size_t>((b * n + i) * 4)],
                             &boxes[static_cast<size_t>((b * n + k) * 4)], center) > iou_t);
          if (ok) {
            kept.push_back(i);
            expected.insert(expected.end(), {b, c, i});
          }
        }
      }
    }
    REQUIRE(y.shape() == Shape{static_cast<int64_t>(expected.size()) / 3, 3});
    CHECK(y.to_vector<int64_t>() == expected);
  }
}

TEST_CASE("NonMaxSuppression optional inputs and errors", "[ops][vision]") {
  Tensor boxes = floats({1, 3, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 0, 5, 1, 6});
  Tensor scores = floats({1, 1, 3}, {0.9f, 0.8f, 0.7f});
  // No max_output_boxes_per_class: nothing selected.
  CHECK(OpTest("NonMaxSuppression", 11).input(boxes).input(scores).run1().shape() == Shape{0, 3});
  CHECK(OpTest("NonMaxSuppression", 11)
            .input(boxes)
            .input(scores)
            .input(ints({5}))
            .input(floats({1}, {0.5f}))
            .run1()
            .to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 0, 0, 2});
  REQUIRE_THROWS_AS(
      OpTest("NonMaxSuppression", 11).attr("center_point_box", 2).input(boxes).input(scores).run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("NonMaxSuppression", 11).input(boxes).input(floats({1, 1, 2}, {1, 2})).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("NonMaxSuppression", 11).input(floats({1, 3}, {0, 0, 1})).input(scores).run(), Error);
  REQUIRE_THROWS_AS(OpTest("NonMaxSuppression", 11)
                        .input(boxes)
                        .input(scores)
                        .input(ints({5}))
                        .input(floats({1}, {1.5f}))
                        .run(),
                    Error);
}
