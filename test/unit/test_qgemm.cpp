// The int8 GEMM layer (ops/math/qgemm.h) against a naive int64 triple loop, at every
// instruction-set level (and AVX-512 both with and without VNNI): random shapes (odd M/N/K,
// K off the k groups, M = 1), every signedness combination, zero points per tensor, per row
// and per column, values at the extremes, strided and column-major operands, prepacked A and
// B, B delivered block by block, biases, and requantized outputs. Results must be exact.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "ops/math/qgemm.h"
#include "test/unit/isa_test.h"
#include "test/unit/qgemm_levels.h"

using namespace kiln;
using math::QMatrixView;

namespace {

#define QGEMM_REQUIRE_ISA()                                             \
  const ::kiln::math::MathKernels* isa_kernels_or_null =                \
      ::kiln::testing::kernels_of(TestType::isa, TestType::extensions); \
  if (!isa_kernels_or_null) return;                                     \
  const ::kiln::math::MathKernels& isa_kernels = *isa_kernels_or_null

// A row-major matrix of 8-bit values (stored as bytes) with its leading dimension.
struct Mat {
  int64_t rows = 0, cols = 0, ld = 0;
  bool col_major = false;
  bool is_signed = false;
  std::vector<uint8_t> bytes;

  int64_t value(int64_t i, int64_t j) const {
    const uint8_t b = bytes[static_cast<size_t>(col_major ? j * ld + i : i * ld + j)];
    return is_signed ? static_cast<int64_t>(static_cast<int8_t>(b)) : static_cast<int64_t>(b);
  }
  QMatrixView view() const {
    return col_major ? QMatrixView{bytes.data(), rows, cols, 1, ld, is_signed}
                     : QMatrixView{bytes.data(), rows, cols, ld, 1, is_signed};
  }
};

enum class Values { Random, Extremes, Max };

// A random value of the type: anywhere in its range, only its two ends, or its largest
// magnitude of one sign (the products that saturate a 16-bit pairwise sum).
uint8_t draw(bool is_signed, Values how, std::mt19937& rng) {
  const int lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
  int v = 0;
  switch (how) {
    case Values::Random:
      v = std::uniform_int_distribution<int>(lo, hi)(rng);
      break;
    case Values::Extremes:
      v = rng() % 2 ? lo : hi;
      break;
    case Values::Max:
      v = is_signed ? lo : hi;
      break;
  }
  return static_cast<uint8_t>(v);
}

Mat random_mat(int64_t rows, int64_t cols, bool is_signed, bool col_major, Values how,
               std::mt19937& rng) {
  Mat m;
  m.rows = rows;
  m.cols = cols;
  m.col_major = col_major;
  m.is_signed = is_signed;
  m.ld = (col_major ? rows : cols) + static_cast<int64_t>(rng() % 4);
  m.bytes.resize(static_cast<size_t>(m.ld * (col_major ? cols : rows) + 1));
  for (auto& b : m.bytes) b = draw(is_signed, how, rng);
  return m;
}

struct Zeros {
  int32_t scalar = 0;
  std::vector<int32_t> lines;  // per row / column when not empty
  int64_t at(int64_t i) const { return lines.empty() ? scalar : lines[static_cast<size_t>(i)]; }
};

Zeros random_zeros(int64_t lines, bool is_signed, std::mt19937& rng) {
  Zeros z;
  switch (rng() % 3) {
    case 0:
      break;  // none
    case 1:
      z.scalar = is_signed ? static_cast<int8_t>(draw(true, Values::Random, rng))
                           : draw(false, Values::Random, rng);
      break;
    default:
      for (int64_t i = 0; i < lines; ++i) {
        const uint8_t b = draw(is_signed, rng() % 3 ? Values::Random : Values::Extremes, rng);
        z.lines.push_back(is_signed ? static_cast<int8_t>(b) : b);
      }
  }
  return z;
}

// The exact sums: (a - za)(b - zb) + biases, in int64.
std::vector<int64_t> naive(const Mat& a, const Mat& b, const Zeros& za, const Zeros& zb,
                           const std::vector<int32_t>& row_bias,
                           const std::vector<int32_t>& col_bias) {
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  std::vector<int64_t> r(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int64_t s = 0;
      for (int64_t p = 0; p < k; ++p) s += (a.value(i, p) - za.at(i)) * (b.value(p, j) - zb.at(j));
      if (!row_bias.empty()) s += row_bias[static_cast<size_t>(i)];
      if (!col_bias.empty()) s += col_bias[static_cast<size_t>(j)];
      r[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return r;
}

// saturate(round_half_even(float(acc) * scale) + zero_point), as documented.
int64_t requantized(int64_t acc, float scale, int32_t zero_point, bool is_signed) {
  const float v = static_cast<float>(acc) * scale;
  const double q = std::nearbyint(static_cast<double>(v)) + zero_point;
  return static_cast<int64_t>(std::clamp(q, is_signed ? -128.0 : 0.0, is_signed ? 127.0 : 255.0));
}

struct Case {
  int64_t m, n, k;
  bool a_signed, b_signed;
  Values values = Values::Random;
  bool packed = false, a_col_major = false, b_col_major = false, biases = false;
  bool requantize = false;
};

void check_case(const Case& t, const math::MathKernels& kernels, std::mt19937& rng) {
  const Mat a = random_mat(t.m, t.k, t.a_signed, t.a_col_major, t.values, rng);
  const Mat b = random_mat(t.k, t.n, t.b_signed, t.b_col_major, t.values, rng);
  const Zeros za = random_zeros(t.m, t.a_signed, rng);
  const Zeros zb = random_zeros(t.n, t.b_signed, rng);
  std::vector<int32_t> row_bias, col_bias;
  if (t.biases) {
    std::uniform_int_distribution<int32_t> bias(-100000, 100000);
    for (int64_t i = 0; i < t.m; ++i) row_bias.push_back(bias(rng));
    for (int64_t j = 0; j < t.n; ++j) col_bias.push_back(bias(rng));
  }
  math::QGemmOptions o;
  o.kernels = &kernels;
  o.a_zero = za.scalar;
  o.a_zeros = za.lines.empty() ? nullptr : za.lines.data();
  o.b_zero = zb.scalar;
  o.b_zeros = zb.lines.empty() ? nullptr : zb.lines.data();
  o.row_bias = row_bias.empty() ? nullptr : row_bias.data();
  o.col_bias = col_bias.empty() ? nullptr : col_bias.data();
  const std::vector<int64_t> want = naive(a, b, za, zb, row_bias, col_bias);
  INFO("m " << t.m << " n " << t.n << " k " << t.k << " a_signed " << t.a_signed << " b_signed "
            << t.b_signed << " values " << static_cast<int>(t.values) << " packed " << t.packed
            << " a_col " << t.a_col_major << " b_col " << t.b_col_major << " za "
            << (za.lines.empty() ? "scalar" : "rows") << " zb "
            << (zb.lines.empty() ? "scalar" : "cols") << " requantize " << t.requantize);

  auto run = [&](const math::QGemmOutput& out) {
    if (t.packed) {
      math::qgemm(a.view(), math::QPackedB(b.view(), &kernels), out, o);
    } else {
      math::qgemm(a.view(), b.view(), out, o);
    }
  };
  const int64_t ld = t.n + 3;  // padding between rows must be left alone
  if (!t.requantize) {
    std::vector<int32_t> c(static_cast<size_t>(t.m * ld), 0x5a5a5a5a);
    run(math::QGemmOutput::int32(c.data(), ld));
    int64_t wrong = 0, padding = 0;
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < ld; ++j) {
        const int32_t got = c[static_cast<size_t>(i * ld + j)];
        if (j >= t.n) {
          padding += got != 0x5a5a5a5a;
        } else {
          wrong += got != want[static_cast<size_t>(i * t.n + j)];
        }
      }
    }
    CHECK(wrong == 0);
    CHECK(padding == 0);
    return;
  }
  // Requantized: scales per tensor, row, column or element; 0.5 and 0.25 make exact halves
  // (ties) common.
  const bool y_signed = rng() % 2;
  const int64_t scale_rs = rng() % 2 ? (rng() % 2 ? t.n : 1) : 0;
  const int64_t scale_cs = scale_rs == 1 ? 0 : (rng() % 2 ? 1 : 0);
  std::vector<float> scales(static_cast<size_t>(t.m * t.n));
  const float base = rng() % 3 == 0 ? 0.5f : (rng() % 2 ? 0.25f : 0.0f);
  for (auto& s : scales) {
    s = base != 0.0f ? base : std::uniform_real_distribution<float>(1e-5f, 0.02f)(rng);
  }
  std::vector<int32_t> zy(static_cast<size_t>(t.m));
  for (auto& z : zy) z = y_signed ? static_cast<int8_t>(rng()) : static_cast<uint8_t>(rng());
  const int64_t zy_rs = rng() % 2;
  math::QGemmOutput out;
  std::vector<uint8_t> y(static_cast<size_t>(t.m * ld), 0xa5);
  out.y = y.data();
  out.ldy = ld;
  out.y_signed = y_signed;
  out.scales = scales.data();
  out.scale_rs = scale_rs;
  out.scale_cs = scale_cs;
  out.y_zero_points = zy.data();
  out.y_zero_rs = zy_rs;
  run(out);
  int64_t wrong = 0, padding = 0;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < ld; ++j) {
      const uint8_t got = y[static_cast<size_t>(i * ld + j)];
      if (j >= t.n) {
        padding += got != 0xa5;
        continue;
      }
      const float s = scales[static_cast<size_t>(i * scale_rs + j * scale_cs)];
      const int64_t w = requantized(want[static_cast<size_t>(i * t.n + j)], s,
                                    zy[static_cast<size_t>(i * zy_rs)], y_signed);
      const int64_t g = y_signed ? static_cast<int8_t>(got) : got;
      wrong += g != w;
    }
  }
  CHECK(wrong == 0);
  CHECK(padding == 0);
}

}  // namespace

QGEMM_TEST_CASE("qgemm is exact over random shapes, signednesses and zero points",
                "[math][qgemm]") {
  QGEMM_REQUIRE_ISA();
  std::mt19937 rng(4321);
  const int64_t mn[] = {1, 2, 3, 5, 6, 7, 11, 12, 13, 17, 31, 32, 33, 47, 64, 65};
  const int64_t ks[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 127, 257, 300};
  std::uniform_int_distribution<size_t> pick_mn(0, std::size(mn) - 1), pick_k(0, std::size(ks) - 1);
  for (int iter = 0; iter < 400; ++iter) {
    Case t{};
    t.m = mn[pick_mn(rng)];
    t.n = mn[pick_mn(rng)];
    t.k = ks[pick_k(rng)];
    // Every signedness combination, in turn.
    t.a_signed = iter % 2;
    t.b_signed = (iter / 2) % 2;
    t.values = iter % 5 == 0 ? Values::Extremes : (iter % 7 == 0 ? Values::Max : Values::Random);
    t.packed = rng() % 2;
    t.a_col_major = rng() % 5 == 0;
    t.b_col_major = rng() % 5 == 0;
    t.biases = rng() % 3 == 0;
    t.requantize = rng() % 3 == 0;
    check_case(t, isa_kernels, rng);
  }
}

QGEMM_TEST_CASE("qgemm sums of extreme values do not saturate", "[math][qgemm]") {
  QGEMM_REQUIRE_ISA();
  std::mt19937 rng(11);
  // uint8 255 times int8 -128 everywhere: every pair of products is -65280, far outside
  // int16, the range a pmaddubsw-style kernel saturates to.
  for (bool a_signed : {false, true}) {
    for (bool b_signed : {false, true}) {
      for (Values v : {Values::Max, Values::Extremes}) {
        check_case({13, 35, 67, a_signed, b_signed, v, true}, isa_kernels, rng);
        check_case({1, 70, 129, a_signed, b_signed, v, false}, isa_kernels, rng);
      }
    }
  }
}

QGEMM_TEST_CASE("qgemm crosses row blocks, panels and threads", "[math][qgemm]") {
  QGEMM_REQUIRE_ISA();
  std::mt19937 rng(99);
  const Case cases[] = {
      {301, 203, 517, false, true, Values::Random, true},
      {301, 203, 517, true, false, Values::Extremes, false, false, false, true, true},
      {130, 1000, 300, false, false, Values::Random, true, true, false, true},
      {1, 3000, 700, false, true, Values::Random, true},
      {1, 3000, 700, true, true, Values::Random, false, false, true, false, true},
      {1000, 8, 300, true, false, Values::Random, false, false, false, true},
      {64, 300, 5000, false, true, Values::Random, true},  // long k: short A row blocks
  };
  for (const Case& t : cases) check_case(t, isa_kernels, rng);
}

QGEMM_TEST_CASE("qgemm with k = 0 writes the biases", "[math][qgemm]") {
  QGEMM_REQUIRE_ISA();
  std::mt19937 rng(5);
  check_case({4, 9, 0, false, true, Values::Random, true, false, false, true}, isa_kernels, rng);
  check_case({4, 9, 0, true, false, Values::Random, false, false, false, true, true}, isa_kernels,
             rng);
}

QGEMM_TEST_CASE("qgemm with a packed A and B delivered in blocks is exact", "[math][qgemm]") {
  QGEMM_REQUIRE_ISA();
  std::mt19937 rng(77);
  const int64_t shapes[][3] = {{1, 1, 1},      {5, 7, 3},      {13, 33, 17}, {64, 300, 27},
                               {96, 3136, 64}, {260, 70, 600}, {2, 1000, 9}, {13, 700, 3000}};
  for (const auto& sh : shapes) {
    const int64_t m = sh[0], n = sh[1], k = sh[2];
    for (int combo = 0; combo < 4; ++combo) {
      const bool a_signed = combo & 1, b_signed = combo & 2;
      const Mat a = random_mat(m, k, a_signed, false, Values::Random, rng);
      const Mat b =
          random_mat(k, n, b_signed, false, combo == 3 ? Values::Max : Values::Random, rng);
      const Zeros za = random_zeros(m, a_signed, rng);
      Zeros zb;
      zb.scalar = b_signed ? static_cast<int8_t>(rng()) : static_cast<uint8_t>(rng());
      std::vector<int32_t> bias(static_cast<size_t>(m));
      for (auto& x : bias) x = static_cast<int32_t>(rng() % 2001) - 1000;
      const math::QPackedA pa(a.view(), &isa_kernels);
      // The filler runs on several threads at once.
      std::atomic<int> blocks{0};
      std::atomic<int64_t> covered{0};
      const math::QBFiller fill = [&](int64_t j0, int64_t nc, uint8_t* out) {
        ++blocks;
        covered += nc;
        for (int64_t p = 0; p < k; ++p) {
          for (int64_t j = 0; j < nc; ++j) {
            out[p * nc + j] = b.bytes[static_cast<size_t>(p * b.ld + j0 + j)];
          }
        }
      };
      std::vector<int32_t> c(static_cast<size_t>(m * n));
      math::QGemmOptions o;
      o.kernels = &isa_kernels;
      o.a_zero = za.scalar;
      o.a_zeros = za.lines.empty() ? nullptr : za.lines.data();
      o.b_zero = zb.scalar;
      o.row_bias = bias.data();
      math::qgemm(pa, n, b_signed, fill, math::QGemmOutput::int32(c.data(), n), o);
      const std::vector<int64_t> want = naive(a, b, za, zb, bias, {});
      int64_t wrong = 0;
      for (size_t i = 0; i < want.size(); ++i) wrong += c[i] != want[i];
      INFO("m " << m << " n " << n << " k " << k << " combo " << combo);
      CHECK(blocks > 0);
      CHECK(covered == n);  // every column lowered exactly once
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("qgemm refuses operands packed for another layout", "[math][qgemm]") {
  std::vector<uint8_t> a(4 * 8, 1), b(8 * 8, 1);
  std::vector<int32_t> c(4 * 8);
  const math::MathKernels& generic = math::kernels_for(math::Isa::Generic);
  const math::QPackedB packed(QMatrixView::row_major(b.data(), 8, 8, 8, false), &generic);
  const math::QPackedA packed_a(QMatrixView::row_major(a.data(), 4, 8, 8, false), &generic);
  for (int i = 1; i < math::kIsaCount; ++i) {
    const auto isa = static_cast<math::Isa>(i);
    if (!math::cpu_supports(isa)) continue;
    math::QGemmOptions o;
    o.kernels = &math::kernels_for(isa);
    CHECK_THROWS_AS(math::qgemm(QMatrixView::row_major(a.data(), 4, 8, 8, false), packed,
                                math::QGemmOutput::int32(c.data(), 8), o),
                    kiln::Error);
    // An A panel depends only on the tile height and the k group, which avx2 shares with
    // generic.
    const math::Int8GemmKernels& t = o.kernels->int8_gemm;
    const math::QBFiller fill = [](int64_t, int64_t nc, uint8_t* out) {
      std::fill(out, out + 8 * nc, uint8_t{1});
    };
    if (std::string(t.layout) == generic.int8_gemm.layout && t.mr == generic.int8_gemm.mr) {
      math::qgemm(packed_a, 8, false, fill, math::QGemmOutput::int32(c.data(), 8), o);
      CHECK(c == std::vector<int32_t>(4 * 8, 8));
    } else {
      CHECK_THROWS_AS(
          math::qgemm(packed_a, 8, false, fill, math::QGemmOutput::int32(c.data(), 8), o),
          kiln::Error);
    }
  }
}

TEST_CASE("the avx512 int8 kernels use VNNI exactly where the processor has it", "[math][qgemm]") {
  if (!math::cpu_supports(math::Isa::Avx512)) {
    WARN("KILN-SKIP: this processor does not run the avx512 kernels");
    return;
  }
  const std::string with = math::kernels_for(math::Isa::Avx512).int8_gemm.layout;
  const std::string without = math::kernels_without_extensions(math::Isa::Avx512).int8_gemm.layout;
  CHECK(with == (math::cpu_has_avx512_vnni() ? "vnni-k4" : "s16-k2"));
  CHECK(without == "s16-k2");
}
