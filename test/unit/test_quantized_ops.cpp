// MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv (on the int8 GEMM layer) against
// naive int64 references: every signedness combination, zero points per tensor, per row or
// column, per channel and per batch matrix, values at the extremes, constant (prepacked) and
// run-time weights, broadcast batches, 1-D to 3-D convolutions; and a constant weight is
// packed once, when the session is created.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/math/qgemm.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

int64_t lo_of(bool is_signed) {
  return is_signed ? -128 : 0;
}
int64_t hi_of(bool is_signed) {
  return is_signed ? 127 : 255;
}

// An int8 (is_signed) or uint8 tensor of `values`.
Tensor q8(bool is_signed, const Shape& shape, const std::vector<int64_t>& values) {
  if (is_signed) {
    std::vector<int8_t> v(values.begin(), values.end());
    return Tensor::from_vector<int8_t>(shape, v);
  }
  std::vector<uint8_t> v(values.begin(), values.end());
  return Tensor::from_vector<uint8_t>(shape, v);
}

// `count` values of the type: uniform, or (extremes) only its two ends.
std::vector<int64_t> draw(bool is_signed, int64_t count, bool extremes, std::mt19937& rng) {
  std::vector<int64_t> v(static_cast<size_t>(count));
  std::uniform_int_distribution<int64_t> d(lo_of(is_signed), hi_of(is_signed));
  for (auto& x : v) x = extremes ? (rng() % 2 ? lo_of(is_signed) : hi_of(is_signed)) : d(rng);
  return v;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// numpy matmul of (already centred) int64 matrices with broadcast batch dimensions; both
// shapes have rank >= 2.
std::vector<int64_t> naive_matmul(const std::vector<int64_t>& a, const Shape& as,
                                  const std::vector<int64_t>& b, const Shape& bs, Shape& out) {
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const size_t rank = std::max(ab.size(), bb.size());
  Shape batch(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t x = d + ab.size() >= rank ? ab[d + ab.size() - rank] : 1;
    const int64_t y = d + bb.size() >= rank ? bb[d + bb.size() - rank] : 1;
    batch[d] = std::max(x, y);
  }
  out = batch;
  out.push_back(M);
  out.push_back(N);
  const int64_t nb = numel(batch);
  std::vector<int64_t> y(static_cast<size_t>(nb * M * N));
  for (int64_t i = 0; i < nb; ++i) {
    // The operands' own batch indices of output batch i.
    int64_t rem = i, ia = 0, ib = 0, sa = 1, sb = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t c = rem % batch[d];
      rem /= batch[d];
      if (d + ab.size() >= rank) {
        const int64_t dim = ab[d + ab.size() - rank];
        ia += (dim == 1 ? 0 : c) * sa;
        sa *= dim;
      }
      if (d + bb.size() >= rank) {
        const int64_t dim = bb[d + bb.size() - rank];
        ib += (dim == 1 ? 0 : c) * sb;
        sb *= dim;
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        int64_t s = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += a[static_cast<size_t>((ia * M + m) * K + k)] *
               b[static_cast<size_t>((ib * K + k) * N + n)];
        }
        y[static_cast<size_t>((i * M + m) * N + n)] = s;
      }
    }
  }
  return y;
}

std::vector<int64_t> int_values(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[static_cast<size_t>(i)] = static_cast<int64_t>(element(t, i));
  }
  return v;
}

// Zero points of a matrix operand and how they apply.
enum class Zp { None, Scalar, Lines, Batched };

// A zero-point tensor for `t` (rows: one per row of A; else one per column of B), and `t`'s
// values with it subtracted.
struct Centred {
  Tensor zp;  // undefined for Zp::None
  std::vector<int64_t> values;
};

Centred centre(const std::vector<int64_t>& v, const Shape& shape, bool is_signed, bool rows, Zp how,
               std::mt19937& rng) {
  Centred c;
  c.values = v;
  const int64_t R = shape[shape.size() - 2], C = shape.back();
  const int64_t lines = rows ? R : C, mats = numel(shape) / (R * C);
  std::vector<int64_t> z;
  Shape zs;
  switch (how) {
    case Zp::None:
      return c;
    case Zp::Scalar:
      z = draw(is_signed, 1, false, rng);
      break;
    case Zp::Lines:
      z = draw(is_signed, lines, rng() % 2, rng);
      zs = {lines};
      break;
    case Zp::Batched:
      z = draw(is_signed, mats * lines, false, rng);
      zs = shape;
      zs[rows ? zs.size() - 1 : zs.size() - 2] = 1;
      break;
  }
  c.zp = q8(is_signed, zs, z);
  for (int64_t i = 0; i < numel(shape); ++i) {
    const int64_t mat = i / (R * C), line = rows ? (i / C) % R : i % C;
    const int64_t zi = how == Zp::Scalar ? 0 : (how == Zp::Lines ? line : mat * lines + line);
    c.values[static_cast<size_t>(i)] -= z[static_cast<size_t>(zi)];
  }
  return c;
}

// saturate(round_half_even(float(acc) * scale) + zero_point), the documented requantization.
int64_t requantized(int64_t acc, float scale, int64_t zero_point, bool is_signed) {
  const float v = static_cast<float>(acc) * scale;
  const double q = std::nearbyint(static_cast<double>(v)) + static_cast<double>(zero_point);
  return static_cast<int64_t>(
      std::clamp(q, static_cast<double>(lo_of(is_signed)), static_cast<double>(hi_of(is_signed))));
}

struct MatMulCase {
  Shape as, bs;
};

}  // namespace

TEST_CASE("MatMulInteger is exact for every signedness, zero point and batch layout",
          "[quantized]") {
  std::mt19937 rng(2024);
  const MatMulCase shapes[] = {
      {{1, 7}, {7, 5}},
      {{5, 1}, {1, 3}},
      {{13, 67}, {67, 33}},
      {{3, 2, 9, 31}, {31, 17}},
      {{3, 9, 31}, {2, 1, 31, 17}},
      {{2, 40, 129}, {2, 129, 70}},
      {{65, 300}, {300, 47}},
      {{1, 513}, {513, 96}},
      {{4, 6, 8}, {4, 8, 1}},
  };
  int iter = 0;
  for (const MatMulCase& sh : shapes) {
    for (int combo = 0; combo < 4; ++combo, ++iter) {
      const bool a_signed = combo & 1, b_signed = combo & 2;
      const bool extremes = iter % 3 == 0;
      const std::vector<int64_t> av = draw(a_signed, numel(sh.as), extremes, rng);
      const std::vector<int64_t> bv = draw(b_signed, numel(sh.bs), extremes, rng);
      const Zp za_how = static_cast<Zp>(rng() % 4), zb_how = static_cast<Zp>(rng() % 4);
      const Centred ca = centre(av, sh.as, a_signed, true, za_how, rng);
      const Centred cb = centre(bv, sh.bs, b_signed, false, zb_how, rng);
      Shape out;
      const std::vector<int64_t> want = naive_matmul(ca.values, sh.as, cb.values, sh.bs, out);
      for (bool constant_b : {false, true}) {
        INFO("a " << shape_to_string(sh.as) << " b " << shape_to_string(sh.bs) << " a_signed "
                  << a_signed << " b_signed " << b_signed << " za " << static_cast<int>(za_how)
                  << " zb " << static_cast<int>(zb_how) << " constant b " << constant_b);
        OpTest t("MatMulInteger", 10);
        t.input(q8(a_signed, sh.as, av));
        if (constant_b) {
          t.constant_input(q8(b_signed, sh.bs, bv));
        } else {
          t.input(q8(b_signed, sh.bs, bv));
        }
        if (za_how == Zp::None && zb_how == Zp::None) {
          // no zero-point inputs at all
        } else {
          if (za_how == Zp::None) {
            t.no_input();
          } else {
            t.input(ca.zp);
          }
          if (zb_how != Zp::None) t.input(cb.zp);
        }
        const Tensor y = t.run1();
        REQUIRE(y.dtype() == DataType::Int32);
        REQUIRE(y.shape() == out);
        CHECK(int_values(y) == want);
      }
    }
  }
}

TEST_CASE("MatMulInteger with vector operands", "[quantized]") {
  std::mt19937 rng(7);
  const int64_t K = 37, N = 19;
  const std::vector<int64_t> a = draw(false, K, false, rng), b = draw(true, K * N, false, rng);
  const std::vector<int64_t> bcol = draw(true, K, true, rng);
  // [K] x [K, N] -> [N]
  Shape out;
  std::vector<int64_t> want = naive_matmul(a, {1, K}, b, {K, N}, out);
  Tensor y = OpTest("MatMulInteger", 10)
                 .input(q8(false, {K}, a))
                 .constant_input(q8(true, {K, N}, b))
                 .run1();
  CHECK(y.shape() == Shape{N});
  CHECK(int_values(y) == want);
  // [N, K] x [K] -> [N]: the rows of b as A.
  std::vector<int64_t> bt(static_cast<size_t>(N * K));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n)
      bt[static_cast<size_t>(n * K + k)] = b[static_cast<size_t>(k * N + n)];
  }
  want = naive_matmul(bt, {N, K}, bcol, {K, 1}, out);
  y = OpTest("MatMulInteger", 10).input(q8(true, {N, K}, bt)).input(q8(true, {K}, bcol)).run1();
  CHECK(y.shape() == Shape{N});
  CHECK(int_values(y) == want);
}

TEST_CASE("QLinearMatMul requantizes the exact sums in float, ties to even, saturating",
          "[quantized]") {
  std::mt19937 rng(99);
  const MatMulCase shapes[] = {{{1, 64}, {64, 40}},
                               {{17, 33}, {33, 9}},
                               {{2, 3, 5, 70}, {70, 65}},
                               {{3, 12, 16}, {3, 16, 20}}};
  int iter = 0;
  for (const MatMulCase& sh : shapes) {
    for (int combo = 0; combo < 8; ++combo, ++iter) {
      const bool a_signed = combo & 1, b_signed = combo & 2, y_signed = combo & 4;
      const int64_t M = sh.as[sh.as.size() - 2], N = sh.bs.back();
      const std::vector<int64_t> av = draw(a_signed, numel(sh.as), iter % 4 == 0, rng);
      const std::vector<int64_t> bv = draw(b_signed, numel(sh.bs), iter % 4 == 0, rng);
      const Zp zb_how = rng() % 2 ? Zp::Lines : Zp::Scalar;
      const Centred ca = centre(av, sh.as, a_signed, true, Zp::Scalar, rng);
      const Centred cb = centre(bv, sh.bs, b_signed, false, zb_how, rng);
      Shape out;
      const std::vector<int64_t> acc = naive_matmul(ca.values, sh.as, cb.values, sh.bs, out);
      // Scales: a per row or per tensor, b per column or per tensor; 0.5, 0.25 and 1 make
      // exact halves, so ties are common.
      const bool a_rows = rng() % 2, b_cols = rng() % 2;
      std::vector<float> sa(static_cast<size_t>(a_rows ? M : 1)),
          sb(static_cast<size_t>(b_cols ? N : 1));
      for (auto& s : sa) s = rng() % 2 ? 0.5f : 0.25f;
      for (auto& s : sb)
        s = rng() % 3 ? 1.0f : std::uniform_real_distribution<float>(0.001f, 0.05f)(rng);
      const float sy = iter % 2 ? 1.0f : 2.0f;
      const int64_t zy = y_signed ? static_cast<int64_t>(rng() % 256) - 128 : rng() % 256;
      const Tensor a_scale =
          a_rows ? Tensor::from_vector<float>({M}, sa) : Tensor::scalar<float>(sa[0]);
      const Tensor b_scale =
          b_cols ? Tensor::from_vector<float>({N}, sb) : Tensor::scalar<float>(sb[0]);
      for (bool constant_b : {false, true}) {
        OpTest t("QLinearMatMul", 21);
        t.input(q8(a_signed, sh.as, av)).input(a_scale).input(ca.zp);
        if (constant_b) {
          t.constant_input(q8(b_signed, sh.bs, bv));
        } else {
          t.input(q8(b_signed, sh.bs, bv));
        }
        t.input(b_scale)
            .input(cb.zp)
            .input(Tensor::scalar<float>(sy))
            .input(q8(y_signed, {}, {zy}));
        const Tensor y = t.run1();
        INFO("a " << shape_to_string(sh.as) << " b " << shape_to_string(sh.bs) << " combo " << combo
                  << " constant b " << constant_b);
        REQUIRE(y.dtype() == (y_signed ? DataType::Int8 : DataType::UInt8));
        REQUIRE(y.shape() == out);
        const std::vector<int64_t> got = int_values(y);
        int64_t wrong = 0;
        for (size_t i = 0; i < acc.size(); ++i) {
          const int64_t m = static_cast<int64_t>(i) / N % M, n = static_cast<int64_t>(i) % N;
          const float mult =
              (sa[a_rows ? static_cast<size_t>(m) : 0] * sb[b_cols ? static_cast<size_t>(n) : 0]) /
              sy;
          wrong += got[i] != requantized(acc[i], mult, zy, y_signed);
        }
        CHECK(wrong == 0);
      }
    }
  }
}

namespace {

struct ConvCase {
  Shape x, w;  // NC... and M Cg ...
  int64_t group;
  std::vector<int64_t> strides, dilations, pads;  // pads: begins then ends
};

// Direct N-d convolution of centred values (padding contributes zero).
std::vector<int64_t> naive_conv(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                const ConvCase& c, Shape& out) {
  const size_t sp = c.x.size() - 2;
  const int64_t N = c.x[0], C = c.x[1], M = c.w[0], cg = C / c.group, mg = M / c.group;
  Shape os;
  for (size_t d = 0; d < sp; ++d) {
    const int64_t span = (c.w[d + 2] - 1) * c.dilations[d] + 1;
    os.push_back((c.x[d + 2] + c.pads[d] + c.pads[d + sp] - span) / c.strides[d] + 1);
  }
  out = {N, M};
  out.insert(out.end(), os.begin(), os.end());
  const int64_t opos = numel(os), ipos = numel(Shape(c.x.begin() + 2, c.x.end()));
  const int64_t kpos = numel(Shape(c.w.begin() + 2, c.w.end()));
  std::vector<int64_t> y(static_cast<size_t>(N * M * opos));
  std::vector<int64_t> o(sp), k(sp);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      const int64_t g = m / mg;
      for (int64_t p = 0; p < opos; ++p) {
        int64_t rem = p;
        for (size_t d = sp; d-- > 0;) o[d] = rem % os[d], rem /= os[d];
        int64_t acc = 0;
        for (int64_t ci = 0; ci < cg; ++ci) {
          for (int64_t q = 0; q < kpos; ++q) {
            int64_t kr = q, off = 0;
            bool inside = true;
            for (size_t d = sp; d-- > 0;) k[d] = kr % c.w[d + 2], kr /= c.w[d + 2];
            for (size_t d = 0; d < sp; ++d) {
              const int64_t i = o[d] * c.strides[d] - c.pads[d] + k[d] * c.dilations[d];
              inside = inside && i >= 0 && i < c.x[d + 2];
              off = off * c.x[d + 2] + i;
            }
            if (!inside) continue;
            acc += x[static_cast<size_t>((n * C + g * cg + ci) * ipos + off)] *
                   w[static_cast<size_t>((m * cg + ci) * kpos + q)];
          }
        }
        y[static_cast<size_t>((n * M + m) * opos + p)] = acc;
      }
    }
  }
  return y;
}

}  // namespace

TEST_CASE("ConvInteger and QLinearConv are exact for every signedness and zero point",
          "[quantized]") {
  std::mt19937 rng(555);
  const ConvCase cases[] = {
      {{1, 3, 11}, {4, 3, 3}, 1, {1}, {1}, {1, 1}},
      {{2, 4, 9, 10}, {6, 2, 3, 3}, 2, {2, 1}, {1, 2}, {1, 0, 2, 1}},
      {{1, 8, 7, 7}, {16, 8, 1, 1}, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}},   // pointwise
      {{1, 6, 12, 13}, {6, 1, 3, 3}, 6, {1, 1}, {1, 1}, {1, 1, 1, 1}},  // depthwise
      {{1, 16, 15, 15}, {40, 16, 3, 3}, 1, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 2}, 1, {1, 2, 1}, {2, 1, 1}, {0, 1, 1, 1, 0, 1}},
      {{1, 64, 20, 20}, {70, 64, 3, 3}, 1, {2, 2}, {1, 1}, {1, 1, 1, 1}},  // k beyond blocks
  };
  int iter = 0;
  for (const ConvCase& c : cases) {
    for (int combo = 0; combo < 4; ++combo, ++iter) {
      const bool x_signed = combo & 1, w_signed = combo & 2;
      const bool extremes = iter % 3 == 1;
      const std::vector<int64_t> xv = draw(x_signed, numel(c.x), extremes, rng);
      const std::vector<int64_t> wv = draw(w_signed, numel(c.w), extremes, rng);
      const int64_t M = c.w[0];
      const std::vector<int64_t> xz = draw(x_signed, 1, false, rng);
      const bool per_channel = rng() % 2;
      const std::vector<int64_t> wz = draw(w_signed, per_channel ? M : 1, false, rng);
      std::vector<int64_t> xc = xv, wc = wv;
      for (auto& v : xc) v -= xz[0];
      const int64_t per = numel(c.w) / M;
      for (size_t i = 0; i < wc.size(); ++i) {
        wc[i] -= wz[per_channel ? i / static_cast<size_t>(per) : 0];
      }
      Shape out;
      const std::vector<int64_t> want = naive_conv(xc, wc, c, out);
      const Tensor x = q8(x_signed, c.x, xv), w = q8(w_signed, c.w, wv);
      const Tensor xzt = q8(x_signed, {}, xz);
      const Tensor wzt = per_channel ? q8(w_signed, {M}, wz) : q8(w_signed, {}, wz);
      for (bool constant_w : {false, true}) {
        INFO("x " << shape_to_string(c.x) << " w " << shape_to_string(c.w) << " combo " << combo
                  << " per channel " << per_channel << " constant w " << constant_w);
        OpTest t("ConvInteger", 10);
        t.input(x);
        if (constant_w) {
          t.constant_input(w);
        } else {
          t.input(w);
        }
        t.input(xzt)
            .input(wzt)
            .attr("group", c.group)
            .attr("strides", c.strides)
            .attr("dilations", c.dilations)
            .attr("pads", c.pads);
        const Tensor y = t.run1();
        REQUIRE(y.shape() == out);
        CHECK(int_values(y) == want);

        // QLinearConv: per-channel w scales, a bias, and exact halves among the products.
        const bool y_signed = (iter + constant_w) % 2;
        std::vector<float> ws(static_cast<size_t>(M));
        for (auto& s : ws)
          s = rng() % 2 ? 0.5f : std::uniform_real_distribution<float>(0.002f, 0.02f)(rng);
        std::vector<int32_t> bias(static_cast<size_t>(M));
        for (auto& b : bias) b = static_cast<int32_t>(rng() % 2001) - 1000;
        const int64_t yz = y_signed ? static_cast<int64_t>(rng() % 256) - 128 : rng() % 256;
        const float xs = 0.5f, ys = 2.0f;
        OpTest q("QLinearConv", 10);
        q.input(x).input(Tensor::scalar<float>(xs)).input(xzt);
        if (constant_w) {
          q.constant_input(w);
        } else {
          q.input(w);
        }
        q.input(Tensor::from_vector<float>({M}, ws))
            .input(wzt)
            .input(Tensor::scalar<float>(ys))
            .input(q8(y_signed, {}, {yz}))
            .input(Tensor::from_vector<int32_t>({M}, bias))
            .attr("group", c.group)
            .attr("strides", c.strides)
            .attr("dilations", c.dilations)
            .attr("pads", c.pads);
        const Tensor qy = q.run1();
        REQUIRE(qy.shape() == out);
        const std::vector<int64_t> got = int_values(qy);
        const int64_t plane = numel(out) / (out[0] * M);
        int64_t wrong = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const size_t m = static_cast<size_t>(static_cast<int64_t>(i) / plane % M);
          wrong += got[i] != requantized(want[i] + bias[m], (xs * ws[m]) / ys, yz, y_signed);
        }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("a constant int8 weight is packed once, when the session is created", "[quantized]") {
  std::mt19937 rng(3);
  const int64_t M = 9, K = 70, N = 33, C = 5, H = 6, W = 7, F = 8;
  const std::vector<int64_t> wv = draw(true, K * N, false, rng);
  const std::vector<int64_t> fv = draw(true, F * C * 3 * 3, false, rng);
  GraphBuilder b;
  b.input("a", DataType::UInt8, {M, K}, true);
  b.input("x", DataType::UInt8, {1, C, H, W}, true);
  b.initializer("w", q8(true, {K, N}, wv));
  b.initializer("f", q8(true, {F, C, 3, 3}, fv));
  b.initializer("az", q8(false, {}, {131}));
  b.node("MatMulInteger", {"a", "w", "az"}, {"y"});
  b.node("ConvInteger", {"x", "f", "az"}, {"z"}, {ints_attr("pads", {1, 1, 1, 1})});
  b.output("y");
  b.output("z");
  Session s = make_session(b.build(), 18, 2);
  CHECK(s.load_stats().weights_prepared_count == 2);

  const uint64_t packs = math::qgemm_b_packs();
  for (int run = 0; run < 3; ++run) {
    const std::vector<int64_t> av = draw(false, M * K, run == 1, rng);
    const std::vector<int64_t> xv = draw(false, C * H * W, run == 2, rng);
    auto outs = s.run({{"a", q8(false, {M, K}, av)}, {"x", q8(false, {1, C, H, W}, xv)}});
    std::vector<int64_t> ac = av, xc = xv;
    for (auto& v : ac) v -= 131;
    for (auto& v : xc) v -= 131;
    Shape out;
    CHECK(int_values(outs.at(0).value.tensor()) == naive_matmul(ac, {M, K}, wv, {K, N}, out));
    const ConvCase cc{{1, C, H, W}, {F, C, 3, 3}, 1, {1, 1}, {1, 1}, {1, 1, 1, 1}};
    CHECK(int_values(outs.at(1).value.tensor()) == naive_conv(xc, fv, cc, out));
  }
  // The runs read the packed weight: no B was packed while they ran.
  CHECK(math::qgemm_b_packs() == packs);
  CHECK(s.load_stats().weights_prepared_count == 2);

  // A weight given at run time is packed by each run.
  const Tensor a = q8(false, {M, K}, draw(false, M * K, false, rng));
  OpTest("MatMulInteger", 10).input(a).input(q8(true, {K, N}, wv)).run1();
  CHECK(math::qgemm_b_packs() == packs + 1);
}
