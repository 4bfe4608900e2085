// The GEMM layer (ops/math/gemm.h) against a naive triple loop in double precision, at every
// instruction-set level: random shapes (odd sizes, M/N/K of 1, K across the k blocks),
// strided and transposed A, row- and column-major B, prepacked B, alpha, accumulation, bias
// and activation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/data_type.h"
#include "kiln/error.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"
#include "test/unit/isa_test.h"

using namespace kiln;
using math::MatrixView;

namespace {

struct Case {
  int64_t m, n, k;
  bool a_col_major, b_col_major, packed, accumulate, bias, row_bias, relu;
  float alpha;
};

// Naive C = alpha * A * B (+ C) (+ bias) (relu), in double.
std::vector<double> reference(const Case& t, const MatrixView& a, const MatrixView& b,
                              const std::vector<float>& c0, const std::vector<float>& bias,
                              const std::vector<float>& row_bias) {
  std::vector<double> c(static_cast<size_t>(t.m * t.n));
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < t.k; ++p) {
        s += static_cast<double>(a.data[i * a.rs + p * a.cs]) * b.data[p * b.rs + j * b.cs];
      }
      double v = t.alpha * s;
      if (t.accumulate) v += c0[static_cast<size_t>(i * t.n + j)];
      if (t.bias) v += bias[static_cast<size_t>(j)];
      if (t.row_bias) v += row_bias[static_cast<size_t>(i)];
      if (t.relu) v = v > 0 ? v : 0;
      c[static_cast<size_t>(i * t.n + j)] = v;
    }
  }
  return c;
}

// The largest |c - want| / (1 + |want|).
double worst_relative(const std::vector<float>& c, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < c.size(); ++i)
    worst = std::max(worst, std::abs(c[i] - want[i]) / (1 + std::abs(want[i])));
  return worst;
}

void check_case(const Case& t, const math::MathKernels& kernels, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (auto& x : v) x = dist(rng);
    return v;
  };
  // Leading dimensions with padding, so strides differ from the sizes.
  const int64_t lda = (t.a_col_major ? t.m : t.k) + 3;
  const int64_t ldb = (t.b_col_major ? t.k : t.n) + 5;
  const std::vector<float> abuf = random(lda * (t.a_col_major ? t.k : t.m) + 1);
  const std::vector<float> bbuf = random(ldb * (t.b_col_major ? t.n : t.k) + 1);
  const MatrixView a = t.a_col_major ? MatrixView::col_major(abuf.data(), t.m, t.k, lda)
                                     : MatrixView::row_major(abuf.data(), t.m, t.k, lda);
  const MatrixView b = t.b_col_major ? MatrixView::col_major(bbuf.data(), t.k, t.n, ldb)
                                     : MatrixView::row_major(bbuf.data(), t.k, t.n, ldb);
  const std::vector<float> bias = random(t.n), row_bias = random(t.m);
  const int64_t ldc = t.n + 2;
  std::vector<float> c = random(t.m * ldc);
  std::vector<float> c0(static_cast<size_t>(t.m * t.n));
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) c0[static_cast<size_t>(i * t.n + j)] = c[i * ldc + j];
  }
  const std::vector<float> guard(c.begin(), c.end());

  math::GemmOptions o;
  o.alpha = t.alpha;
  o.accumulate = t.accumulate;
  o.bias = t.bias ? bias.data() : nullptr;
  o.row_bias = t.row_bias ? row_bias.data() : nullptr;
  o.activation = t.relu ? math::Activation::Relu : math::Activation::None;
  o.kernels = &kernels;
  if (t.packed) {
    const math::PackedB packed(b, &kernels);
    math::sgemm(a, packed, c.data(), ldc, o);
  } else {
    math::sgemm(a, b, c.data(), ldc, o);
  }
  const std::vector<double> want = reference(t, a, b, c0, bias, row_bias);
  INFO("m " << t.m << " n " << t.n << " k " << t.k << " a_col " << t.a_col_major << " b_col "
            << t.b_col_major << " packed " << t.packed << " acc " << t.accumulate << " alpha "
            << t.alpha);
  double worst = 0;
  bool padding_kept = true;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= t.n) {
        padding_kept = padding_kept && got == guard[i * ldc + j];
        continue;
      }
      const double w = want[static_cast<size_t>(i * t.n + j)];
      worst = std::max(worst, std::abs(got - w) / (1.0 + std::abs(w)));
    }
  }
  CHECK(padding_kept);
  // Float accumulation over k terms of magnitude <= 1.
  CHECK(worst <= 2e-6 * std::sqrt(static_cast<double>(t.k) + 1) + 1e-6);
}

}  // namespace

KILN_ISA_TEST_CASE("sgemm matches a naive product over random shapes and layouts", "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(1234);
  const int64_t sizes[] = {1, 2, 3, 5, 7, 12, 13, 16, 17, 31, 32, 33, 47, 64, 100};
  std::uniform_int_distribution<int> pick(0, std::size(sizes) - 1);
  std::bernoulli_distribution coin(0.5);
  for (int iter = 0; iter < 300; ++iter) {
    Case t{};
    t.m = sizes[pick(rng)];
    t.n = sizes[pick(rng)];
    t.k = sizes[pick(rng)];
    t.a_col_major = coin(rng);
    t.b_col_major = coin(rng);
    t.packed = coin(rng);
    t.accumulate = coin(rng);
    t.bias = coin(rng);
    t.row_bias = coin(rng) && coin(rng);
    t.relu = coin(rng) && coin(rng);
    t.alpha = coin(rng) ? 1.0f : 0.37f;
    check_case(t, isa_kernels, rng);
  }
}

KILN_ISA_TEST_CASE("sgemm of one row by an unpacked row-major B matches the naive product",
                   "[math][gemm]") {
  // The GEMV path (B's rows streamed once), with every epilogue option; n = 300 crosses its
  // 256-column blocks for alpha and accumulation.
  KILN_REQUIRE_ISA();
  std::mt19937 rng(77);
  for (int64_t n : {1, 5, 16, 64, 300}) {
    for (int64_t k : {1, 7, 64, 401}) {
      for (int flags = 0; flags < 32; ++flags) {
        Case t{};
        t.m = 1;
        t.n = n;
        t.k = k;
        t.a_col_major = flags & 1;
        t.accumulate = flags & 2;
        t.bias = flags & 4;
        t.relu = flags & 8;
        t.alpha = flags & 16 ? 0.37f : 1.0f;
        check_case(t, isa_kernels, rng);
      }
    }
  }
}

KILN_ISA_TEST_CASE("sgemm crosses k blocks, row blocks and threads", "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(99);
  // K beyond the 256-wide k block, M beyond a row block, N over many panels; large enough
  // to be split across threads.
  const Case cases[] = {
      {301, 203, 517, false, false, false, false, false, false, false, 1.0f},
      {301, 203, 517, false, false, true, true, true, false, true, 0.5f},
      {130, 1000, 300, true, true, false, false, true, true, false, 1.0f},
      {1, 3000, 700, false, false, false, false, true, false, false, 1.0f},   // GEMV, row-major B
      {1, 3000, 700, false, true, false, true, false, false, false, 1.0f},    // GEMV, columns
      {1, 3000, 700, true, false, true, false, false, false, true, 2.0f},     // GEMV, packed
      {40, 2000, 64, false, false, false, false, false, false, false, 1.0f},  // small M, in place
      {1000, 8, 300, false, true, true, false, true, false, false, 1.0f},     // tall and thin
      // Packed B of one or two panels with a row-major A read in place (kernel_rows_a),
      // across k blocks and row blocks, with and without the epilogue.
      {150, 64, 1500, false, false, true, true, true, true, false, 1.0f},
      {301, 40, 600, false, false, true, false, false, false, true, 1.0f},
      {61, 17, 257, false, false, true, false, true, false, false, 1.0f},
  };
  for (const Case& t : cases) check_case(t, isa_kernels, rng);
}

TEST_CASE("a one-row product is split across threads from a smaller size than a compute-bound one",
          "[math][gemm]") {
  tbb::task_arena arena(4);
  arena.execute([] {
    // A [768 x 768] weight: 0.6 M multiply-adds, too few to split were they compute-bound,
    // but each weight streams from memory for one row: split four ways.
    CHECK(math::task_count(math::product_work(1, 768, 768, 12)) == 4);
    CHECK(math::task_count(math::product_work(12, 768, 768, 12)) == 4);  // one row tile
    CHECK(math::task_count(math::product_work(1, 64, 64, 12)) == 1);     // 16 KiB of weights
    // More than one row tile: counted in multiply-adds (1.2 M: one task).
    CHECK(math::task_count(math::product_work(200, 768, 8, 12)) == 1);
    CHECK(math::task_count(math::product_work(13, 768, 768, 12)) == 4);
  });
}

KILN_ISA_TEST_CASE("one-row products split across threads match the naive product",
                   "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(123);
  tbb::task_arena arena(3);
  arena.execute([&] {
    for (const int64_t n : {int64_t{97}, int64_t{768}, int64_t{2304}}) {
      for (int flags = 0; flags < 8; ++flags) {
        Case t{};
        t.m = 1;
        t.n = n;
        t.k = 768;
        t.b_col_major = flags & 1;
        t.packed = flags & 2;
        t.bias = flags & 4;
        t.alpha = 1.0f;
        INFO("n " << n << " flags " << flags);
        check_case(t, isa_kernels, rng);
      }
    }
  });
}

KILN_ISA_TEST_CASE("products with an unpacked B split by columns, each task packing its own",
                   "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(321);
  tbb::task_arena arena(3);
  arena.execute([&] {
    // Enough columns for three parts (uneven ones too), every epilogue, both B layouts.
    for (const int64_t n : {int64_t{130}, int64_t{384}}) {
      for (int flags = 0; flags < 16; ++flags) {
        Case t{};
        t.m = 128;
        t.n = n;
        t.k = 300;
        t.b_col_major = flags & 1;
        t.bias = flags & 2;
        t.row_bias = flags & 4;
        t.accumulate = flags & 8;
        t.relu = flags & 4;
        t.alpha = flags & 1 ? 0.5f : 1.0f;
        INFO("n " << n << " flags " << flags);
        check_case(t, isa_kernels, rng);
      }
    }
  });
}

KILN_ISA_TEST_CASE(
    "a one-task product packs B into the thread's kept buffer, a B shared by row "
    "tasks into the thread's kept shared-B buffer",
    "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(77);
  Case t{};
  t.m = 96;
  t.n = 70;
  t.k = 300;
  t.b_col_major = true;  // packed even for few rows
  t.alpha = 1.0f;
  tbb::task_arena one(1);
  one.execute([&] {
    const uint64_t packs = math::gemm_b_packs(), allocations = math::gemm_b_allocations();
    check_case(t, isa_kernels, rng);
    CHECK(math::gemm_b_packs() == packs + 1);
    CHECK(math::gemm_b_allocations() == allocations);
  });
  // Two threads, too few columns to go round: the rows are split, B packed once for both,
  // into the calling thread's shared-B buffer (kept: the second product allocates nothing).
  t.m = 512;
  t.n = 8;
  t.k = 600;
  tbb::task_arena two(2);
  two.execute([&] {
    const uint64_t packs = math::gemm_b_packs(), allocations = math::gemm_b_allocations();
    check_case(t, isa_kernels, rng);
    t.k = 700;
    check_case(t, isa_kernels, rng);
    CHECK(math::gemm_b_packs() == packs + 2);
    CHECK(math::gemm_b_allocations() == allocations);
  });
}

KILN_ISA_TEST_CASE("sgemm with k = 0 writes zeros (or keeps C) and the epilogue", "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(5);
  check_case({4, 9, 0, false, false, false, false, true, false, false, 1.0f}, isa_kernels, rng);
  check_case({4, 9, 0, false, false, true, true, false, false, true, 1.0f}, isa_kernels, rng);
}

TEST_CASE("a B packed for another tile width is refused", "[math][gemm]") {
  std::vector<float> a(4 * 8, 1.0f), b(8 * 8, 1.0f), c(4 * 8);
  const math::PackedB wrong(b.data(), 8, 8, math::kernels().gemm.nr * 2);
  CHECK_THROWS_AS(math::sgemm(MatrixView::row_major(a.data(), 4, 8, 8), wrong, c.data(), 8),
                  kiln::Error);
}

KILN_ISA_TEST_CASE("sgemm with a packed A and B delivered in panels matches the naive product",
                   "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t shapes[][3] = {{1, 1, 1},      {5, 7, 3},      {13, 33, 17}, {64, 300, 27},
                               {96, 3136, 64}, {260, 70, 600}, {2, 1000, 9}, {700, 5, 40}};
  for (const auto& sh : shapes) {
    const int64_t m = sh[0], n = sh[1], k = sh[2];
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bias(m);
    for (auto& x : a) x = dist(rng);
    for (auto& x : b) x = dist(rng);
    for (auto& x : bias) x = dist(rng);
    const math::PackedA pa(MatrixView::row_major(a.data(), m, k, k), &isa_kernels);
    int blocks = 0;
    const math::BPacker packer = [&](int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
      ++blocks;
      isa_kernels.gemm.pack_b(b.data() + p0 * n + j0, n, 1, kc, nc, out);
    };
    std::vector<float> c(static_cast<size_t>(m * n));
    math::GemmOptions o;
    o.kernels = &isa_kernels;
    o.row_bias = bias.data();
    o.activation = math::Activation::Relu;
    math::sgemm(pa, n, packer, c.data(), n, o);
    CHECK(blocks > 0);
    const Case t{m, n, k, false, false, false, false, false, true, true, 1.0f};
    const auto want = reference(t, MatrixView::row_major(a.data(), m, k, k),
                                MatrixView::row_major(b.data(), k, n, n), c, {}, bias);
    INFO("m " << m << " n " << n << " k " << k);
    CHECK(worst_relative(c, want) <= 2e-6 * std::sqrt(static_cast<double>(k) + 1) + 1e-6);
    // A view of the rows from the second tile on gives exactly those rows of C.
    const int64_t r0 = isa_kernels.gemm.mr;
    if (m > r0) {
      std::vector<float> part(static_cast<size_t>((m - r0) * n));
      math::GemmOptions po = o;
      po.row_bias = bias.data() + r0;
      math::sgemm(pa.rows(r0, m - r0), n, packer, part.data(), n, po);
      CHECK(std::equal(part.begin(), part.end(), c.begin() + r0 * n));
    }
    CHECK_THROWS(pa.rows(1, m - 1));  // not at a tile
  }
}

KILN_ISA_TEST_CASE("sgemm with A delivered in panels and a packed B matches the naive product",
                   "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(78);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // M of 1, below and across a tile and a row block; K across the k blocks; N odd.
  const int64_t shapes[][3] = {{1, 1, 1},     {5, 7, 3},     {13, 33, 17}, {49, 512, 600},
                               {100, 70, 27}, {130, 9, 300}, {2, 1000, 9}, {64, 2048, 40}};
  for (const auto& sh : shapes) {
    const int64_t m = sh[0], n = sh[1], k = sh[2];
    // A is read through the packer with its rows in reverse (the packer's own layout).
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bias(n);
    for (auto& x : a) x = dist(rng);
    for (auto& x : b) x = dist(rng);
    for (auto& x : bias) x = dist(rng);
    const math::PackedB pb(MatrixView::row_major(b.data(), k, n, n), &isa_kernels);
    int panels = 0;
    const math::APacker packer = [&](int64_t i0, int rows, int mr, int64_t p0, int64_t kc,
                                     float* out) {
      ++panels;
      REQUIRE(mr == isa_kernels.gemm.mr);
      REQUIRE(rows <= mr);
      for (int64_t q = 0; q < kc; ++q) {
        for (int r = 0; r < mr; ++r) {
          out[q * mr + r] =
              r < rows ? a[static_cast<size_t>((m - 1 - (i0 + r)) * k + p0 + q)] : 0.0f;
        }
      }
    };
    std::vector<float> c(static_cast<size_t>(m * n));
    math::GemmOptions o;
    o.kernels = &isa_kernels;
    o.bias = bias.data();
    o.activation = math::Activation::Relu;
    math::sgemm(m, packer, pb, c.data(), n, o);
    CHECK(panels >= (m + isa_kernels.gemm.mr - 1) / isa_kernels.gemm.mr);
    // A's rows in reverse: a view starting at the last row, stepping back.
    const MatrixView reversed{a.data() + (m - 1) * k, m, k, -k, 1};
    const Case t{m, n, k, false, false, false, false, true, false, true, 1.0f};
    const auto want = reference(t, reversed, MatrixView::row_major(b.data(), k, n, n), c, bias, {});
    INFO("m " << m << " n " << n << " k " << k);
    CHECK(worst_relative(c, want) <= 2e-6 * std::sqrt(static_cast<double>(k) + 1) + 1e-6);
  }
  std::vector<float> a(4), b(4), c(4);
  const math::PackedB pb(MatrixView::row_major(b.data(), 2, 2, 2), &isa_kernels);
  math::GemmOptions o;
  o.kernels = &isa_kernels;
  o.alpha = 2.0f;
  const math::APacker none = [](int64_t, int, int, int64_t, int64_t, float*) {};
  CHECK_THROWS(math::sgemm(2, none, pb, c.data(), 2, o));  // a packer takes no alpha
}

KILN_ISA_TEST_CASE("sgemm with B packed as bfloat16 or float16 equals the product with rounded B",
                   "[math][gemm]") {
  KILN_REQUIRE_ISA();
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t shapes[][3] = {{1, 1, 1}, {1, 300, 70}, {3, 33, 17}, {64, 100, 300}, {13, 7, 5}};
  for (const math::PackedType type : {math::PackedType::BFloat16, math::PackedType::Float16}) {
    for (const auto& sh : shapes) {
      const int64_t m = sh[0], n = sh[1], k = sh[2];
      std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)),
          c(static_cast<size_t>(m * n));
      for (auto& x : a) x = dist(rng);
      for (auto& x : b) x = dist(rng);
      const math::PackedB packed(MatrixView::row_major(b.data(), k, n, n), &isa_kernels, type);
      math::GemmOptions o;
      o.kernels = &isa_kernels;
      math::sgemm(MatrixView::row_major(a.data(), m, k, k), packed, c.data(), n, o);
      double worst = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            const float w = b[static_cast<size_t>(p * n + j)];
            const float rounded = type == math::PackedType::BFloat16
                                      ? static_cast<float>(bfloat16(w))
                                      : static_cast<float>(float16(w));
            s += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * rounded;
          }
          worst =
              std::max(worst, std::abs(c[static_cast<size_t>(i * n + j)] - s) / (1 + std::abs(s)));
        }
      }
      INFO("type " << static_cast<int>(type) << " m " << m << " n " << n << " k " << k);
      CHECK(worst <= 2e-6 * std::sqrt(static_cast<double>(k) + 1) + 1e-6);
    }
  }
}

KILN_ISA_TEST_CASE("row dot products and the row-streaming GEMV match naive sums", "[math][gemm]") {
  KILN_REQUIRE_ISA();
  const math::GemmKernels& g = isa_kernels.gemm;
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const int64_t k : {1, 5, 16, 17, 64, 100}) {
    for (const int64_t n : {1, 3, 4, 7, 33, 130, 300}) {
      const int64_t ld = std::max(k, n) + 3;
      std::vector<float> x(static_cast<size_t>(std::max(k, n))),
          b(static_cast<size_t>(ld * (k + n)));
      for (auto& v : x) v = dist(rng);
      for (auto& v : b) v = dist(rng);
      // dots: y[j] = x . b[j * ld : j * ld + k]
      std::vector<float> y(static_cast<size_t>(n));
      g.dots(x.data(), b.data(), ld, k, n, y.data());
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t p = 0; p < k; ++p)
          want += double(x[static_cast<size_t>(p)]) * b[static_cast<size_t>(j * ld + p)];
        INFO("dots k " << k << " n " << n << " j " << j);
        REQUIRE(std::abs(y[static_cast<size_t>(j)] - want) <=
                1e-5 * (1 + std::abs(want)) * std::sqrt(double(k)));
      }
      // gemv_rows: y[j] = sum_p x[p] * b[p * ld + j]
      std::vector<float> z(static_cast<size_t>(n) + 1, 42.0f);
      g.gemv_rows(x.data(), b.data(), ld, k, n, z.data());
      CHECK(z[static_cast<size_t>(n)] == 42.0f);  // nothing written past n
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t p = 0; p < k; ++p)
          want += double(x[static_cast<size_t>(p)]) * b[static_cast<size_t>(p * ld + j)];
        INFO("gemv_rows k " << k << " n " << n << " j " << j);
        REQUIRE(std::abs(z[static_cast<size_t>(j)] - want) <=
                1e-5 * (1 + std::abs(want)) * std::sqrt(double(k)));
      }
    }
  }
}
