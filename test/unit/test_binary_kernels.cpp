// The dispatched float arithmetic rows (ops/math/impl/binary.h) at every instruction-set
// level: exactly the scalar IEEE results (each is one correctly rounded operation), for
// contiguous operands, a broadcast scalar on either side, other strides, in place, and
// lengths that leave vector tails; infinities and NaNs included.
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "test/unit/isa_test.h"

using namespace kiln;

KILN_ISA_TEST_CASE("float Add, Sub, Mul and Div rows equal the scalar operations",
                   "[math][binary]") {
  KILN_REQUIRE_ISA();
  const math::BinaryKernels& k = isa_kernels.binary;
  const math::BinaryKernels::Row rows[] = {k.add, k.sub, k.mul, k.div};
  auto scalar = [](int op, float a, float b) {
    switch (op) {
      case 0:
        return a + b;
      case 1:
        return a - b;
      case 2:
        return a * b;
      default:
        return a / b;
    }
  };
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            3e38f};
  for (int64_t n : {0, 1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 100, 1000}) {
    std::vector<float> a(static_cast<size_t>(2 * n + 1)), b(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = i % 11 == 0 ? specials[i % 7] : dist(rng);
      b[i] = i % 13 == 0 ? specials[(i / 13) % 7] : dist(rng);
    }
    for (int op = 0; op < 4; ++op) {
      // (stride a, stride b): contiguous, scalar b, scalar a, both strided.
      for (const auto& [sa, sb] : {std::pair{1, 1}, {1, 0}, {0, 1}, {2, 2}, {2, 0}}) {
        std::vector<float> y(static_cast<size_t>(n), 7.0f);
        rows[op](a.data(), sa, b.data(), sb, y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float want =
              scalar(op, a[static_cast<size_t>(i * sa)], b[static_cast<size_t>(i * sb)]);
          const float got = y[static_cast<size_t>(i)];
          INFO("op " << op << " n " << n << " i " << i << " strides " << sa << "," << sb);
          REQUIRE(((std::isnan(want) && std::isnan(got)) ||
                   std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got)));
        }
      }
      // In place over a.
      std::vector<float> y(a.begin(), a.begin() + n);
      rows[op](y.data(), 1, b.data(), 1, y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = scalar(op, a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]);
        REQUIRE(((std::isnan(want) && std::isnan(y[static_cast<size_t>(i)])) ||
                 want == y[static_cast<size_t>(i)]));
      }
    }
  }
}

KILN_ISA_TEST_CASE("the affine row equals x * scale + shift, then Relu, per plane or per channel",
                   "[math][binary]") {
  // One rounding (fma) at the levels with FMA, two at generic; Relu gives 0 for a NaN as the
  // Relu op does. A plane (one scale and shift, stride 0) and a row of channels (stride 1),
  // lengths that leave vector tails, and in place.
  KILN_REQUIRE_ISA();
  const math::BinaryKernels& k = isa_kernels.binary;
  const bool fma = TestType::isa != math::Isa::Generic;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-40f};
  for (int64_t n : {0, 1, 3, 4, 7, 15, 16, 17, 63, 64, 65, 100, 1000}) {
    std::vector<float> x(static_cast<size_t>(n)), scale(x.size()), shift(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = i % 17 == 5 ? specials[i % 5] : dist(rng);
      scale[i] = dist(rng);
      shift[i] = dist(rng);
    }
    for (const int64_t ss : {0, 1}) {
      for (const bool relu : {false, true}) {
        for (const bool in_place : {false, true}) {
          std::vector<float> y = in_place ? x : std::vector<float>(x.size(), 7.0f);
          k.affine(in_place ? y.data() : x.data(), scale.data(), shift.data(), ss, y.data(), n,
                   relu);
          for (int64_t i = 0; i < n; ++i) {
            const auto u = static_cast<size_t>(i), c = static_cast<size_t>(i * ss);
            float want = fma ? std::fma(x[u], scale[c], shift[c]) : x[u] * scale[c] + shift[c];
            if (relu) want = want > 0 ? want : 0.0f;
            INFO("n " << n << " i " << i << " ss " << ss << " relu " << relu << " in place "
                      << in_place);
            REQUIRE(((std::isnan(want) && std::isnan(y[u])) ||
                     std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(y[u])));
          }
        }
      }
    }
  }
}
