// com.microsoft.FusedConv (onnxruntime's Conv + activation + optional Z) against a naive
// double convolution, over random shapes, every activation, and bad attributes and inputs.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/math/winograd.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Case {
  int64_t n, c, m, group, h, w, kh, kw, stride, pad, dilation;
};

// y[n, m, i, j] = bias[m] + sum over the group's channels and the window, in double.
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const Case& k,
                               int64_t oh, int64_t ow) {
  const int64_t cg = k.c / k.group, mg = k.m / k.group;
  std::vector<double> y(static_cast<size_t>(k.n * k.m * oh * ow));
  for (int64_t b = 0; b < k.n; ++b)
    for (int64_t m = 0; m < k.m; ++m)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = bias ? element(*bias, m) : 0.0;
          const int64_t g = m / mg;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t u = 0; u < k.kh; ++u)
              for (int64_t v = 0; v < k.kw; ++v) {
                const int64_t yi = i * k.stride - k.pad + u * k.dilation;
                const int64_t xj = j * k.stride - k.pad + v * k.dilation;
                if (yi < 0 || yi >= k.h || xj < 0 || xj >= k.w) continue;
                acc += element(x, ((b * k.c + g * cg + c) * k.h + yi) * k.w + xj) *
                       element(w, ((m * cg + c) * k.kh + u) * k.kw + v);
              }
          y[static_cast<size_t>(((b * k.m + m) * oh + i) * ow + j)] = acc;
        }
  return y;
}

double activate(const std::string& a, const std::vector<float>& p, double v) {
  if (a == "Relu") return std::max(v, 0.0);
  if (a == "Tanh") return std::tanh(v);
  if (a == "Sigmoid") return 1 / (1 + std::exp(-v));
  if (a == "LeakyRelu") return v >= 0 ? v : p[0] * v;
  if (a == "Clip")
    return std::min(std::max(v, static_cast<double>(p[0])), static_cast<double>(p[1]));
  if (a == "HardSigmoid") return std::clamp(p[0] * v + p[1], 0.0, 1.0);
  return v;
}

OpTest fused_conv(const Case& k) {
  OpTest t("FusedConv", 1, "com.microsoft");
  t.attr("group", k.group)
      .attr("strides", std::vector<int64_t>{k.stride, k.stride})
      .attr("pads", std::vector<int64_t>{k.pad, k.pad, k.pad, k.pad})
      .attr("dilations", std::vector<int64_t>{k.dilation, k.dilation});
  return t;
}

// One com.microsoft.FusedConv of k with `act` (and its params): random x, filter (a constant
// or a run-time input), bias and Z (each when given); y must have the output's shape and lie
// within `tol` of the naive convolution with the bias, Z and activation applied. False (and
// nothing run) when k has no output.
bool check_fused_conv(const Case& k, const std::string& act, const std::vector<float>& params,
                      bool has_bias, bool has_z, bool constant_w, double tol, std::mt19937& rng) {
  const int64_t oh = (k.h + 2 * k.pad - k.dilation * (k.kh - 1) - 1) / k.stride + 1;
  const int64_t ow = (k.w + 2 * k.pad - k.dilation * (k.kw - 1) - 1) / k.stride + 1;
  if (oh < 1 || ow < 1) return false;
  const Tensor x = random_tensor(DataType::Float, Shape{k.n, k.c, k.h, k.w}, rng);
  const Tensor w = random_tensor(DataType::Float, Shape{k.m, k.c / k.group, k.kh, k.kw}, rng);
  const Tensor bias = random_tensor(DataType::Float, Shape{k.m}, rng);
  const Tensor z = random_tensor(DataType::Float, Shape{k.n, k.m, oh, ow}, rng);
  OpTest t = fused_conv(k);
  if (!act.empty()) t.attr("activation", act);
  if (!params.empty()) t.attr("activation_params", params);
  t.input(x);
  if (constant_w) {
    t.constant_input(w);
  } else {
    t.input(w);
  }
  if (has_bias) {
    t.input(bias);
  } else if (has_z) {
    t.no_input();
  }
  if (has_z) t.input(z);
  std::vector<double> want = naive_conv(x, w, has_bias ? &bias : nullptr, k, oh, ow);
  for (size_t i = 0; i < want.size(); ++i) {
    want[i] = activate(act, params, want[i] + (has_z ? element(z, static_cast<int64_t>(i)) : 0));
  }
  const Tensor y = t.run1();
  CHECK(y.shape() == Shape{k.n, k.m, oh, ow});
  require_near(y, want, tol);
  return true;
}

}  // namespace

TEST_CASE("com.microsoft.FusedConv matches a naive convolution with each activation and Z",
          "[contrib][conv]") {
  std::mt19937 rng(19);
  const std::vector<std::pair<std::string, std::vector<float>>> activations = {
      {"", {}},
      {"Relu", {}},
      {"Tanh", {}},
      {"Sigmoid", {}},
      {"LeakyRelu", {0.2f}},
      {"Clip", {-0.3f, 0.4f}},
      {"HardSigmoid", {0.5f, 0.25f}}};
  for (int trial = 0; trial < 28; ++trial) {
    const auto& [act, params] = activations[static_cast<size_t>(trial) % activations.size()];
    const int64_t group = 1 + trial % 3;
    const Case k{1 + trial % 2, group * (1 + trial % 4), group * (1 + (trial / 3) % 5),
                 group,         4 + trial % 5,           3 + trial % 7,
                 1 + trial % 3, 1 + (trial / 2) % 3,     1 + trial % 2,
                 trial % 2,     1 + (trial / 5) % 2};
    const bool has_bias = trial % 2 == 0, has_z = trial % 4 < 2, constant_w = trial % 3 != 0;
    INFO("trial " << trial << " activation '" << act << "' bias " << has_bias << " Z " << has_z);
    check_fused_conv(k, act, params, has_bias, has_z, constant_w, 1e-5, rng);
  }
}

TEST_CASE(
    "com.microsoft.FusedConv with each output row its own product applies Z and each "
    "activation",
    "[contrib][conv]") {
  // Strided convolutions whose output rows are 64 or more wide and fill the tile kernels'
  // vectors about as well as their wide rows do are products written straight into y, row by
  // row (ops/conv/conv_wide.cpp, direct_rows): a 7x7 stride-2 stem (112 outputs a row, wide rows of
  // 115) and a 3x3 stride-2 layer without padding (111 of 112), with the bias, Z and the
  // activation in the tile epilogue.
  std::mt19937 rng(22);
  const std::vector<std::pair<std::string, std::vector<float>>> activations = {
      {"", {}}, {"Relu", {}}, {"Tanh", {}}, {"LeakyRelu", {0.2f}}};
  for (int trial = 0; trial < 8; ++trial) {
    const auto& [act, params] = activations[static_cast<size_t>(trial) % activations.size()];
    const bool stem = trial % 2 == 0;
    const Case k = stem ? Case{1, 3, 16 + trial, 1, 9, 224, 7, 7, 2, 3, 1}
                        : Case{1 + trial % 3 / 2, 5, 13 + trial, 1, 7, 224, 3, 3, 2, 0, 1};
    const bool has_z = trial % 3 != 0;
    INFO("trial " << trial << " activation '" << act << "' Z " << has_z << " stem " << stem);
    CHECK(check_fused_conv(k, act, params, true, has_z, true, 1e-4, rng));
  }
}

TEST_CASE("com.microsoft.FusedConv as Winograd products applies Z and each activation",
          "[contrib][conv][winograd]") {
  // 3x3 stride-1 convolutions of 16 channels over maps of nine tiles or more take the
  // Winograd products (ops/math/winograd.h): Relu as the outputs are stored, Z added onto,
  // the parameterized activations after.
  std::mt19937 rng(21);
  const std::vector<std::pair<std::string, std::vector<float>>> activations = {
      {"", {}}, {"Relu", {}}, {"Tanh", {}}, {"LeakyRelu", {0.2f}}, {"Clip", {-0.3f, 0.4f}}};
  for (int trial = 0; trial < 10; ++trial) {
    const auto& [act, params] = activations[static_cast<size_t>(trial) % activations.size()];
    const Case k{1 + trial % 2, 16, 16, 1, 12 + 3 * trial, 30 - trial, 3, 3, 1, 1, 1};
    const bool has_z = trial % 3 != 0, constant_w = trial % 2 == 0;
    INFO("trial " << trial << " activation '" << act << "' Z " << has_z);
    const uint64_t before = math::winograd_convolutions();
    CHECK(check_fused_conv(k, act, params, true, has_z, constant_w, 1e-3, rng));
    CHECK(math::winograd_convolutions() == before + 1);
  }
}

TEST_CASE("com.microsoft.FusedConv rejects what onnxruntime rejects, naming the node",
          "[contrib][conv]") {
  std::mt19937 rng(20);
  const Case k{1, 2, 3, 1, 5, 5, 3, 3, 1, 1, 1};
  const Tensor x = random_tensor(DataType::Float, Shape{1, 2, 5, 5}, rng);
  const Tensor w = random_tensor(DataType::Float, Shape{3, 2, 3, 3}, rng);
  auto error_of = [&](OpTest t) -> std::string {
    try {
      t.run();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  // kiln.FusedConv's Gelu is not one of onnxruntime's activations.
  CHECK_THAT(error_of(fused_conv(k).attr("activation", "Gelu").input(x).input(w)),
             Catch::Contains("FusedConv") && Catch::Contains("unknown activation 'Gelu'"));
  CHECK_THAT(error_of(fused_conv(k).attr("activation", "LeakyRelu").input(x).input(w)),
             Catch::Contains("LeakyRelu needs 1 activation_params, got 0"));
  CHECK_THAT(error_of(fused_conv(k)
                          .attr("activation", "Clip")
                          .attr("activation_params", std::vector<float>{0.0f})
                          .input(x)
                          .input(w)),
             Catch::Contains("Clip needs 2 activation_params, got 1"));
  // Z must have the output's shape [1, 3, 5, 5] (kiln.FusedConv would broadcast this one).
  const Tensor z = random_tensor(DataType::Float, Shape{1, 3, 1, 1}, rng);
  CHECK_THAT(error_of(fused_conv(k).input(x).input(w).no_input().input(z)),
             Catch::Contains("must have the output's shape"));
  const Tensor xd = random_tensor(DataType::Double, Shape{1, 2, 5, 5}, rng);
  const Tensor wd = random_tensor(DataType::Double, Shape{3, 2, 3, 3}, rng);
  CHECK_THAT(error_of(fused_conv(k).input(xd).input(wd)), Catch::Contains("FusedConv"));
}
