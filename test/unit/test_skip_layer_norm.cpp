// com.microsoft.SkipLayerNormalization against a naive double reference: random shapes, the
// optional beta and bias, every output, a skip broadcasting over the batch; float and float16.
#include <cmath>
#include <random>
#include <vector>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Reference {
  std::vector<double> y, mean, inv_std, sum;
};

// x [rows, n] plus skip (rows or skip_rows of n, repeating), plus bias; normalised by rows.
Reference reference(const Tensor& x, const Tensor& skip, const Tensor& gamma, const Tensor* beta,
                    const Tensor* bias, double eps) {
  const int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n, skip_rows = skip.numel() / n;
  Reference r;
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<double> s(static_cast<size_t>(n));
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) {
      s[static_cast<size_t>(i)] = element(x, row * n + i) +
                                  element(skip, (row % skip_rows) * n + i) +
                                  (bias ? element(*bias, i) : 0.0);
      mu += s[static_cast<size_t>(i)];
    }
    mu /= double(n);
    for (double e : s) var += (e - mu) * (e - mu);
    const double inv = 1 / std::sqrt(var / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      const double e = s[static_cast<size_t>(i)];
      r.y.push_back((e - mu) * inv * element(gamma, i) + (beta ? element(*beta, i) : 0.0));
      r.sum.push_back(e);
    }
    r.mean.push_back(mu);
    r.inv_std.push_back(inv);
  }
  return r;
}

// Random trials at element type `dt`; y and the sum are within `tol` of the reference (the
// statistics, float for either type, as tightly as float allows).
void check_trials(DataType dt, double tol, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t batch = 1 + trial % 3, seq = 1 + (trial * 7) % 9;
    const int64_t n = std::vector<int64_t>{1, 3, 16, 17, 64, 100}[static_cast<size_t>(trial % 6)];
    const bool has_beta = trial % 2 == 0, has_bias = trial % 4 < 2, broadcast = trial % 5 == 0;
    const Tensor x = random_tensor(dt, {batch, seq, n}, rng, -2, 2);
    const Tensor skip =
        random_tensor(dt, broadcast ? Shape{seq, n} : Shape{batch, seq, n}, rng, -2, 2);
    const Tensor gamma = random_tensor(dt, {n}, rng, 0.5, 1.5);
    const Tensor beta = random_tensor(dt, {n}, rng);
    const Tensor bias = random_tensor(dt, {n}, rng);
    OpTest t("SkipLayerNormalization", 1, "com.microsoft");
    t.input(x).input(skip).constant_input(gamma);
    if (has_beta) {
      t.constant_input(beta);
    } else {
      t.no_input();
    }
    if (has_bias) t.constant_input(bias);
    t.attr("epsilon", 1e-5f).outputs(4);
    INFO("trial " << trial << ": " << x.describe() << " + " << skip.describe());
    const auto out = t.run();
    const Reference r =
        reference(x, skip, gamma, has_beta ? &beta : nullptr, has_bias ? &bias : nullptr, 1e-5);
    CHECK(out[0].tensor().shape() == x.shape());
    CHECK(out[0].tensor().dtype() == dt);
    CHECK(out[1].tensor().shape() == Shape{batch, seq, 1});
    CHECK(out[1].tensor().dtype() == DataType::Float);
    CHECK(out[3].tensor().dtype() == dt);
    require_near(out[0].tensor(), r.y, tol);
    require_near(out[1].tensor(), r.mean, 1e-6);
    require_near(out[2].tensor(), r.inv_std, 1e-5);
    require_near(out[3].tensor(), r.sum, tol);
  }
}

}  // namespace

TEST_CASE("SkipLayerNormalization matches a naive reference", "[ops][norm]") {
  check_trials(DataType::Float, 1e-5, 5);
  // gamma must hold one value per element of the last axis.
  REQUIRE_THROWS_AS(OpTest("SkipLayerNormalization", 1, "com.microsoft")
                        .input(Tensor::zeros(DataType::Float, {2, 4}))
                        .input(Tensor::zeros(DataType::Float, {2, 4}))
                        .input(Tensor::zeros(DataType::Float, {3}))
                        .run(),
                    Error);
}

TEST_CASE("SkipLayerNormalization takes float16 (computed in float, statistics float)",
          "[ops][norm][float16]") {
  // float16 keeps 11 significant bits: rounding the result moves it by at most 2^-11 of itself
  // (4.9e-4); the float arithmetic adds about 1e-6.
  check_trials(DataType::Float16, 6e-4, 6);
  // Operands of mixed types: an Error naming the node.
  REQUIRE_THROWS_WITH(OpTest("SkipLayerNormalization", 1, "com.microsoft")
                          .input(Tensor::zeros(DataType::Float16, {2, 4}))
                          .input(Tensor::zeros(DataType::Float, {2, 4}))
                          .input(Tensor::zeros(DataType::Float16, {4}))
                          .run(),
                      Catch::Contains("SkipLayerNormalization") && Catch::Contains("float16"));
  REQUIRE_THROWS_WITH(OpTest("SkipLayerNormalization", 1, "com.microsoft")
                          .input(Tensor::zeros(DataType::Float16, {2, 4}))
                          .input(Tensor::zeros(DataType::Float16, {2, 4}))
                          .input(Tensor::zeros(DataType::Float, {4}))
                          .run(),
                      Catch::Contains("SkipLayerNormalization") && Catch::Contains("gamma"));
}
