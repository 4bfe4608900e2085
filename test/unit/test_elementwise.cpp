// Elementwise kernels against naive references over random broadcast shapes.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Naive numpy broadcasting: output index -> input index, one element at a time.
int64_t broadcast_index(const Shape& out, const Shape& in, int64_t flat) {
  int64_t index = 0, stride = 1;
  for (size_t d = out.size(); d-- > 0;) {
    const int64_t coord = flat % out[d];
    flat /= out[d];
    const size_t off = out.size() - in.size();
    if (d >= off) {
      const int64_t dim = in[d - off];
      index += (dim == 1 ? 0 : coord) * stride;
      stride *= dim;
    }
  }
  return index;
}

Tensor naive_binary(const Tensor& a, const Tensor& b, double (*f)(double, double)) {
  Shape out = a.rank() >= b.rank() ? a.shape() : b.shape();
  const size_t r = out.size();
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.rank() >= r ? a.dim(i + a.rank() - r) : 1;
    const int64_t db = i + b.rank() >= r ? b.dim(i + b.rank() - r) : 1;
    out[i] = std::max(da, db);
  }
  Tensor y = Tensor::zeros(DataType::Float, out);
  for (int64_t i = 0; i < y.numel(); ++i) {
    y.data<float>()[i] = static_cast<float>(f(element(a, broadcast_index(out, a.shape(), i)),
                                              element(b, broadcast_index(out, b.shape(), i))));
  }
  return y;
}

// A random shape pair that broadcasts: b takes a's trailing dims, some set to 1.
std::pair<Shape, Shape> broadcast_pair(std::mt19937& rng) {
  const size_t rank = std::uniform_int_distribution<size_t>(0, 4)(rng);
  Shape a = random_shape(rank, 5, rng);
  const size_t brank = std::uniform_int_distribution<size_t>(0, rank)(rng);
  Shape b(a.end() - static_cast<long>(brank), a.end());
  for (auto& d : b) {
    if (rng() % 3 == 0) d = 1;
  }
  if (rng() % 2) std::swap(a, b);
  return {a, b};
}

}  // namespace

TEST_CASE("binary arithmetic matches a naive broadcast over random shapes", "[ops][elementwise]") {
  std::mt19937 rng(42);
  struct Case {
    const char* op;
    double (*f)(double, double);
  };
  const Case cases[] = {{"Add", [](double x, double y) { return x + y; }},
                        {"Sub", [](double x, double y) { return x - y; }},
                        {"Mul", [](double x, double y) { return x * y; }},
                        {"Div", [](double x, double y) { return x / y; }}};
  for (int iter = 0; iter < 40; ++iter) {
    auto [sa, sb] = broadcast_pair(rng);
    Tensor a = random_tensor(DataType::Float, sa, rng);
    Tensor b = random_tensor(DataType::Float, sb, rng, 0.5, 2.0);
    for (const Case& c : cases) {
      INFO(c.op << " " << shape_to_string(sa) << " " << shape_to_string(sb));
      require_close(OpTest(c.op, 14).input(a).input(b).run1(), naive_binary(a, b, c.f));
    }
  }
}

TEST_CASE("binary ops read strided (transposed) inputs without a copy", "[ops][elementwise]") {
  std::mt19937 rng(7);
  Tensor a = random_tensor(DataType::Float, {3, 4}, rng);
  // A transposed view of a 4x3 tensor: shape [3,4], strides [1,3].
  Tensor base = random_tensor(DataType::Float, {4, 3}, rng);
  Tensor bt = base.view({3, 4}, {1, 3}, 0);
  REQUIRE_FALSE(bt.is_contiguous());
  OpTest t("Add", 14);
  Tensor y = t.input(a).input(bt).run1();
  require_close(y, naive_binary(a, bt.contiguous(), [](double x, double z) { return x + z; }));
  CHECK(t.stats().bytes_copied == 0);
}

TEST_CASE("integer division by zero is an error, not a crash", "[ops][elementwise]") {
  Tensor a = Tensor::from_vector<int32_t>({2}, {4, 5});
  Tensor b = Tensor::from_vector<int32_t>({2}, {2, 0});
  REQUIRE_THROWS_AS(OpTest("Div", 14).input(a).input(b).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Mod", 13).input(a).input(b).run(), Error);
}

TEST_CASE("Mod follows the divisor's sign unless fmod is set", "[ops][elementwise]") {
  Tensor a = Tensor::from_vector<int64_t>({4}, {-4, 7, 5, -7});
  Tensor b = Tensor::from_vector<int64_t>({4}, {3, -3, 3, -3});
  CHECK(OpTest("Mod", 13).input(a).input(b).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{2, -2, 2, -1});
  CHECK(OpTest("Mod", 13).input(a).input(b).attr("fmod", 1).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{-1, 1, 2, -1});
}

TEST_CASE("unary ops match std:: functions on random data", "[ops][elementwise]") {
  std::mt19937 rng(3);
  Tensor x = random_tensor(DataType::Float, {5, 7}, rng, -2, 2);
  struct Case {
    const char* op;
    double (*f)(double);
  };
  const Case cases[] = {{"Exp", [](double v) { return std::exp(v); }},
                        {"Tanh", [](double v) { return std::tanh(v); }},
                        {"Abs", [](double v) { return std::abs(v); }},
                        {"Neg", [](double v) { return -v; }},
                        {"Sigmoid", [](double v) { return 1 / (1 + std::exp(-v)); }},
                        {"Erf", [](double v) { return std::erf(v); }},
                        {"Relu", [](double v) { return v > 0 ? v : 0; }}};
  for (const Case& c : cases) {
    INFO(c.op);
    Tensor expected = Tensor::zeros(DataType::Float, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i)
      expected.data<float>()[i] = static_cast<float>(c.f(element(x, i)));
    require_close(OpTest(c.op, 14).input(x).run1(), expected);
  }
}

// The activations' loop is vectorised (ops/elementwise/unary.cpp): every length (vector bodies and
// tails) must give the scalar definition's bits, specials included.
TEST_CASE("conditional activations give their scalar definition's bits at every length",
          "[ops][elementwise]") {
  std::mt19937 rng(11);
  struct Case {
    const char* op;
    std::vector<std::pair<const char*, float>> attrs;
    float (*f)(float, float, float);
    float a, b;
  };
  const Case cases[] = {
      {"LeakyRelu",
       {{"alpha", 0.1f}},
       [](float x, float a, float) { return x >= 0 ? x : a * x; },
       0.1f,
       0},
      {"LeakyRelu",
       {{"alpha", -0.5f}},
       [](float x, float a, float) { return x >= 0 ? x : a * x; },
       -0.5f,
       0},
      {"Relu", {}, [](float x, float, float) { return x > 0 ? x : 0.0f; }, 0, 0},
      {"ThresholdedRelu",
       {{"alpha", 0.25f}},
       [](float x, float a, float) { return x > a ? x : 0.0f; },
       0.25f,
       0},
      {"HardSigmoid",
       {{"alpha", 0.3f}, {"beta", 0.4f}},
       [](float x, float a, float b) { return std::max(0.0f, std::min(1.0f, a * x + b)); },
       0.3f,
       0.4f}};
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e-30f,  // small, but its products stay normal (no flush)
                            -1e-30f,
                            0.25f};
  for (const Case& c : cases) {
    for (int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 31, 64, 67, 1000}) {
      INFO(c.op << " alpha " << c.a << ", " << n << " elements");
      Tensor x = random_tensor(DataType::Float, {n}, rng, -3, 3);
      for (int64_t i = 0; i < n; ++i)
        if (rng() % 4 == 0) x.data<float>()[i] = specials[rng() % std::size(specials)];
      std::vector<float> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) expected[i] = c.f(x.data<const float>()[i], c.a, c.b);
      OpTest test(c.op, 14);
      for (const auto& [name, value] : c.attrs) test.attr(name, value);
      const std::vector<float> got = test.input(x).run1().to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        INFO("element " << i << " of " << x.data<const float>()[i]);
        if (std::isnan(expected[i])) {
          CHECK(std::isnan(got[i]));
        } else {
          CHECK(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(expected[i]));
        }
      }
    }
  }
}

// Pow with a single exponent equal to 2 squares by a product (ops/elementwise/binary.cpp); it must
// give std::pow's bits whatever the exponent's type and shape.
TEST_CASE("Pow by a single exponent of 2 gives std::pow's bits", "[ops][elementwise]") {
  std::mt19937 rng(5);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e20f,
                            -3.5f};
  Tensor x = random_tensor(DataType::Float, {4, 33}, rng, -3, 3);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (rng() % 4 == 0) x.data<float>()[i] = specials[rng() % std::size(specials)];
  const Tensor exponents[] = {
      Tensor::from_vector<float>({}, {2.0f}), Tensor::from_vector<int64_t>({1, 1}, {2}),
      Tensor::from_vector<double>({1}, {2.0}), Tensor::from_vector<int32_t>({}, {2})};
  for (const Tensor& e : exponents) {
    INFO("exponent " << e.describe());
    const std::vector<float> got = OpTest("Pow", 15).input(x).input(e).run1().to_vector<float>();
    REQUIRE(got.size() == static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float want = std::pow(x.data<const float>()[i], 2.0f);
      INFO("element " << i << " of " << x.data<const float>()[i]);
      if (std::isnan(want)) {
        CHECK(std::isnan(got[i]));
      } else {
        CHECK(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want));
      }
    }
  }
  // Any other exponent keeps the general path.
  const Tensor three = Tensor::from_vector<float>({}, {3.0f});
  const std::vector<float> cubed =
      OpTest("Pow", 15).input(x).input(three).run1().to_vector<float>();
  CHECK(std::bit_cast<uint32_t>(cubed[1]) ==
        std::bit_cast<uint32_t>(std::pow(x.data<const float>()[1], 3.0f)));
}

TEST_CASE("float16 conversion rounds to nearest even and keeps specials", "[types]") {
  CHECK(float16::from_float(1.0f) == 0x3c00);
  CHECK(float16::from_float(65504.0f) == 0x7bff);
  CHECK(float16::from_float(65520.0f) == 0x7c00);                // rounds up to infinity
  CHECK(float16::from_float(5.960464477539063e-08f) == 0x0001);  // smallest subnormal
  CHECK(float16::to_float(0x0001) == 5.960464477539063e-08f);
  CHECK(std::isnan(float16::to_float(float16::from_float(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half survives a round trip
    REQUIRE(float16::from_float(float16::to_float(static_cast<uint16_t>(h))) == h);
  }
}

TEST_CASE("opset 6 Add broadcasts B along A's dimensions from `axis`", "[ops][elementwise]") {
  Tensor a = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor col = Tensor::from_vector<float>({2}, {10, 20});
  CHECK(OpTest("Add", 6)
            .input(a)
            .input(col)
            .attr("broadcast", 1)
            .attr("axis", 0)
            .run1()
            .to_vector<float>() == std::vector<float>{11, 12, 13, 24, 25, 26});
  Tensor row = Tensor::from_vector<float>({3}, {10, 20, 30});
  CHECK(OpTest("Mul", 6).input(a).input(row).attr("broadcast", 1).run1().to_vector<float>() ==
        std::vector<float>{10, 40, 90, 40, 100, 180});
  // Without `broadcast` the shapes must match.
  REQUIRE_THROWS_AS(OpTest("Add", 6).input(a).input(row).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Add", 6).input(a).input(col).attr("broadcast", 1).run(), Error);
}

TEST_CASE("integer Pow saturates results out of range instead of overflowing",
          "[ops][elementwise]") {
  const Tensor base = Tensor::from_vector<int64_t>({4}, {10, -10, 0, 3});
  const Tensor exponent = Tensor::from_vector<int64_t>({4}, {400, 401, -1, 4});
  const auto y = OpTest("Pow", 15).input(base).input(exponent).run1().to_vector<int64_t>();
  CHECK(y == std::vector<int64_t>{std::numeric_limits<int64_t>::max(),
                                  std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max(), 81});
}
