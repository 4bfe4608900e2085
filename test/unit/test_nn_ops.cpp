// Dense linear algebra, convolution, pooling and normalisation kernels against naive
// references (plain loops over every output element) on random shapes and attributes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops/conv/conv.h"
#include "ops/math/winograd.h"
#include "test/unit/op_test.h"
#include "test/unit/sweep.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Ints = std::vector<int64_t>;

std::vector<double> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<double> v(static_cast<size_t>(c.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = element(c, static_cast<int64_t>(i));
  return v;
}

Tensor float_tensor(const Shape& shape, const std::vector<double>& v) {
  Tensor t = Tensor::zeros(DataType::Float, shape);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = static_cast<float>(v[i]);
  return t;
}

int64_t rand_int(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Row-major coordinates of flat index `i` in `shape`.
std::vector<int64_t> coords(int64_t i, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

int64_t flat(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + c[d];
  return i;
}

// ---- MatMul ----

// numpy matmul: 1-D operands are promoted and the promoted dims dropped from the result.
Tensor naive_matmul(const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t br = std::max(ba.size(), bb.size());
  while (ba.size() < br) ba.insert(ba.begin(), 1);
  while (bb.size() < br) bb.insert(bb.begin(), 1);
  Shape batch(br);
  for (size_t d = 0; d < br; ++d) batch[d] = std::max(ba[d], bb[d]);
  const auto va = values(a), vb = values(b);
  const int64_t nb = shape_numel(batch);
  std::vector<double> out(static_cast<size_t>(nb * m * n));
  for (int64_t bi = 0; bi < nb; ++bi) {
    const auto c = coords(bi, batch);
    std::vector<int64_t> ca(br), cb(br);
    for (size_t d = 0; d < br; ++d) {
      ca[d] = ba[d] == 1 ? 0 : c[d];
      cb[d] = bb[d] == 1 ? 0 : c[d];
    }
    const int64_t oa = flat(ca, ba) * m * k, ob = flat(cb, bb) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          s += va[static_cast<size_t>(oa + i * k + kk)] * vb[static_cast<size_t>(ob + kk * n + j)];
        out[static_cast<size_t>((bi * m + i) * n + j)] = s;
      }
  }
  Shape shape = batch;
  if (a.rank() != 1) shape.push_back(m);
  if (b.rank() != 1) shape.push_back(n);
  return float_tensor(shape, out);
}

}  // namespace

TEST_CASE("MatMul matches a naive product over random broadcast batch shapes", "[nn]") {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t m = rand_int(rng, 1, 9), k = rand_int(rng, 1, 9), n = rand_int(rng, 1, 9);
    const size_t rank = static_cast<size_t>(rand_int(rng, 0, 3));
    Shape batch = random_shape(rank, 3, rng);
    Shape ba = batch, bb = batch;
    for (auto& d : ba)
      if (rng() % 3 == 0) d = 1;
    for (auto& d : bb)
      if (rng() % 3 == 0) d = 1;
    if (rng() % 2 && !ba.empty()) ba.erase(ba.begin());
    Shape sa = ba, sb = bb;
    sa.insert(sa.end(), {m, k});
    sb.insert(sb.end(), {k, n});
    if (iter % 7 == 0) sa = {k};
    if (iter % 5 == 0) sb = {k};
    Tensor a = random_tensor(DataType::Float, sa, rng);
    Tensor b = random_tensor(DataType::Float, sb, rng);
    INFO(shape_to_string(sa) << " x " << shape_to_string(sb));
    require_close(OpTest("MatMul", 13).input(a).input(b).run1(), naive_matmul(a, b));
  }
}

TEST_CASE("MatMul splits large products across threads correctly", "[nn]") {
  std::mt19937 rng(12);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 64, 48}, {48, 80}},      // batches folded into one tall product
      {{1, 300}, {300, 500}},          // a row vector: split along columns
      {{4, 100, 64}, {4, 64, 100}},    // batched
      {{300, 200}, {200, 300}},        // one big product: split along rows
      {{2, 1, 70, 90}, {3, 90, 110}},  // broadcast batch
  };
  for (const auto& [sa, sb] : cases) {
    Tensor a = random_tensor(DataType::Float, sa, rng);
    Tensor b = random_tensor(DataType::Float, sb, rng);
    INFO(shape_to_string(sa) << " x " << shape_to_string(sb));
    require_close(OpTest("MatMul", 13).input(a).input(b).run1(), naive_matmul(a, b), 1e-4, 1e-4);
  }
}

TEST_CASE("MatMul reads transposed and over-allocated views without copying", "[nn]") {
  std::mt19937 rng(13);
  const int64_t b = 2, h = 3, s = 5, d = 4;
  Tensor q = random_tensor(DataType::Float, {b, h, s, d}, rng);
  Tensor k = random_tensor(DataType::Float, {b, h, s, d}, rng);
  // K^T as a view: shape [b, h, d, s], strides of K's [b, h, s, d] layout swapped.
  Tensor kt = k.view({b, h, d, s}, {h * s * d, s * d, 1, d}, k.byte_offset());
  REQUIRE_FALSE(kt.is_contiguous());
  OpTest t1("MatMul", 13);
  require_close(t1.input(q).input(kt).run1(), naive_matmul(q, kt.contiguous()));
  CHECK(t1.stats().bytes_copied == 0);

  // A KV cache with room for 16 positions holding 5: strides keep the capacity.
  Tensor v = Tensor::with_capacity(DataType::Float, {b, h, s, d}, 2, 16);
  Tensor vfill = random_tensor(DataType::Float, {b, h, s, d}, rng);
  for (int64_t i = 0; i < v.numel(); ++i) {
    const auto c = coords(i, v.shape());
    int64_t off = 0;
    for (size_t x = 0; x < c.size(); ++x) off += c[x] * v.strides()[x];
    v.data<float>()[off] = vfill.data<float>()[i];
  }
  REQUIRE_FALSE(v.is_contiguous());
  Tensor p = random_tensor(DataType::Float, {b, h, 1, s}, rng);
  OpTest t2("MatMul", 13);
  require_close(t2.input(p).input(v).run1(), naive_matmul(p, vfill));
  CHECK(t2.stats().bytes_copied == 0);

  // Batched left operands over a shared right operand, laid out so that the batches cannot
  // (transposed [S, B, K] storage) or can (row vectors with a gap) be merged into one product.
  Tensor rhs_shared = random_tensor(DataType::Float, {4, 6}, rng);
  Tensor sbk = random_tensor(DataType::Float, {5, 3, 4}, rng);
  Tensor bsk = sbk.view({3, 5, 4}, {4, 12, 1}, sbk.byte_offset());
  OpTest t4("MatMul", 13);
  require_close(t4.input(bsk).input(rhs_shared).run1(), naive_matmul(bsk.contiguous(), rhs_shared));
  CHECK(t4.stats().bytes_copied == 0);
  Tensor rows2 = random_tensor(DataType::Float, {3, 2, 4}, rng);
  Tensor first_rows = rows2.view({3, 1, 4}, {8, 4, 1}, rows2.byte_offset());
  OpTest t5("MatMul", 13);
  require_close(t5.input(first_rows).input(rhs_shared).run1(),
                naive_matmul(first_rows.contiguous(), rhs_shared));
  CHECK(t5.stats().bytes_copied == 0);

  // A vector taking every other element maps as a strided row.
  Tensor v8 = random_tensor(DataType::Float, {8}, rng);
  Tensor every2 = v8.view({4}, {2}, v8.byte_offset());
  OpTest t6("MatMul", 13);
  require_close(t6.input(every2).input(rhs_shared).run1(),
                naive_matmul(every2.contiguous(), rhs_shared));
  CHECK(t6.stats().bytes_copied == 0);

  // Neither axis has unit stride: the GEMM layer packs it as it reads, no copy.
  Tensor base = random_tensor(DataType::Float, {6, 8}, rng);
  Tensor every_other = base.view({3, 4}, {16, 2}, base.byte_offset());
  Tensor rhs = random_tensor(DataType::Float, {4, 3}, rng);
  OpTest t3("MatMul", 13);
  require_close(t3.input(every_other).input(rhs).run1(),
                naive_matmul(every_other.contiguous(), rhs));
  CHECK(t3.stats().bytes_copied == 0);
}

TEST_CASE("MatMul on integer and half types", "[nn]") {
  std::mt19937 rng(14);
  Tensor a = random_tensor(DataType::Int32, {2, 3, 4}, rng, -9, 9);
  Tensor b = random_tensor(DataType::Int32, {4, 5}, rng, -9, 9);
  Tensor y = OpTest("MatMul", 13).input(a).input(b).run1();
  REQUIRE(y.dtype() == DataType::Int32);
  CHECK(values(y) == values(naive_matmul(a, b)));
  Tensor ha = random_tensor(DataType::Float16, {3, 6}, rng);
  Tensor hb = random_tensor(DataType::Float16, {6, 2}, rng);
  Tensor hy = OpTest("MatMul", 13).input(ha).input(hb).run1();
  REQUIRE(hy.dtype() == DataType::Float16);
  require_close(float_tensor(hy.shape(), values(hy)), naive_matmul(ha, hb), 1e-2, 1e-2);
}

TEST_CASE("MatMul rejects mismatched inner dimensions and types", "[nn]") {
  std::mt19937 rng(15);
  Tensor a = random_tensor(DataType::Float, {2, 3}, rng);
  Tensor b = random_tensor(DataType::Float, {4, 2}, rng);
  REQUIRE_THROWS_AS(OpTest("MatMul", 13).input(a).input(b).run(), Error);
  Tensor bd = random_tensor(DataType::Double, {3, 2}, rng);
  REQUIRE_THROWS_AS(OpTest("MatMul", 13).input(a).input(bd).run(), Error);
  REQUIRE_THROWS_AS(OpTest("MatMul", 13).input(Tensor::scalar(1.0f)).input(b).run(), Error);
}

// ---- Gemm ----

TEST_CASE("Gemm matches a naive product for every transpose, alpha, beta and C shape", "[nn]") {
  std::mt19937 rng(21);
  for (int iter = 0; iter < 48; ++iter) {
    const bool ta = iter & 1, tb = iter & 2;
    const int64_t m = rand_int(rng, 1, 7), k = rand_int(rng, 1, 7), n = rand_int(rng, 1, 7);
    const float alpha = iter % 3 == 0 ? 1.0f : 0.75f, beta = iter % 4 == 0 ? 0.0f : -0.5f;
    Tensor a = random_tensor(DataType::Float, ta ? Shape{k, m} : Shape{m, k}, rng);
    Tensor b = random_tensor(DataType::Float, tb ? Shape{n, k} : Shape{k, n}, rng);
    const std::vector<Shape> c_shapes = {{}, {1}, {n}, {m, 1}, {1, n}, {m, n}};
    const int which = static_cast<int>(rng() % 7);  // 6: no C
    OpTest t("Gemm", 13);
    t.input(a).input(b).attr("transA", int64_t{ta}).attr("transB", int64_t{tb});
    t.attr("alpha", alpha).attr("beta", beta);
    Tensor c;
    if (which < 6) {
      c = random_tensor(DataType::Float, c_shapes[static_cast<size_t>(which)], rng);
      t.input(c);
    }
    const auto va = values(a), vb = values(b);
    const auto vc = c.defined() ? values(c) : std::vector<double>{};
    std::vector<double> out(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          s += va[static_cast<size_t>(ta ? kk * m + i : i * k + kk)] *
               vb[static_cast<size_t>(tb ? j * k + kk : kk * n + j)];
        }
        double cv = 0;
        if (c.defined()) {
          const Shape& cs = c.shape();
          const int64_t ci = cs.size() == 2 ? (cs[0] == 1 ? 0 : i) : 0;
          const int64_t cj = cs.empty() ? 0 : (cs.back() == 1 ? 0 : j);
          cv = vc[static_cast<size_t>(ci * (cs.empty() ? 1 : cs.back()) + cj)];
        }
        out[static_cast<size_t>(i * n + j)] = alpha * s + beta * cv;
      }
    INFO("transA " << ta << " transB " << tb << " C " << which);
    require_close(t.run1(), float_tensor({m, n}, out));
  }
}

TEST_CASE("Gemm splits a large product and reads transposed operands in place", "[nn]") {
  std::mt19937 rng(22);
  Tensor a = random_tensor(DataType::Float, {130, 70}, rng);
  Tensor base = random_tensor(DataType::Float, {90, 70}, rng);
  Tensor bt = base.view({70, 90}, {1, 70}, base.byte_offset());  // B given as a transposed view
  Tensor c = random_tensor(DataType::Float, {90}, rng);
  OpTest t("Gemm", 13);
  Tensor y = t.input(a).input(bt).input(c).run1();
  CHECK(t.stats().bytes_copied == 0);
  const auto vy = values(y), vc = values(c);
  const auto ref = values(naive_matmul(a, bt.contiguous()));
  std::vector<double> expected(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) expected[i] = ref[i] + vc[i % 90];
  require_close(y, float_tensor({130, 90}, expected), 1e-4, 1e-4);
}

TEST_CASE("Gemm rejects bad shapes", "[nn]") {
  std::mt19937 rng(23);
  Tensor a = random_tensor(DataType::Float, {2, 3}, rng);
  Tensor b = random_tensor(DataType::Float, {2, 4}, rng);
  REQUIRE_THROWS_AS(OpTest("Gemm", 13).input(a).input(b).run(), Error);
  Tensor b2 = random_tensor(DataType::Float, {3, 4}, rng);
  Tensor c = random_tensor(DataType::Float, {3}, rng);
  REQUIRE_THROWS_AS(OpTest("Gemm", 13).input(a).input(b2).input(c).run(), Error);
}

// ---- Conv and ConvTranspose ----

namespace {

struct ConvSpec {
  std::vector<int64_t> strides, dilations, pads;  // pads: begins then ends
  int64_t group = 1;
};

Shape conv_out_shape(const Tensor& x, const Tensor& w, const ConvSpec& s) {
  const size_t r = x.rank() - 2;
  Shape out{x.dim(0), w.dim(0)};
  for (size_t d = 0; d < r; ++d) {
    const int64_t ek = (w.dim(d + 2) - 1) * s.dilations[d] + 1;
    out.push_back((x.dim(d + 2) + s.pads[d] + s.pads[d + r] - ek) / s.strides[d] + 1);
  }
  return out;
}

Tensor naive_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& s) {
  const size_t r = x.rank() - 2;
  const Shape out = conv_out_shape(x, w, s);
  const auto vx = values(x), vw = values(w);
  const auto vb = bias ? values(*bias) : std::vector<double>{};
  const int64_t cg = w.dim(1), mg = w.dim(0) / s.group;
  const Shape kshape(w.shape().begin() + 2, w.shape().end());
  const int64_t taps = shape_numel(kshape);
  // Each tap's coordinates, once (the sum below allocates nothing per product).
  std::vector<std::vector<int64_t>> tap(static_cast<size_t>(taps));
  for (int64_t kf = 0; kf < taps; ++kf) tap[static_cast<size_t>(kf)] = coords(kf, kshape);
  std::vector<double> y(static_cast<size_t>(shape_numel(out)));
  for (int64_t o = 0; o < shape_numel(out); ++o) {
    const auto oc = coords(o, out);
    const int64_t n = oc[0], m = oc[1], g = m / mg;
    double sum = bias ? vb[static_cast<size_t>(m)] : 0;
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t kf = 0; kf < taps; ++kf) {
        const std::vector<int64_t>& kc = tap[static_cast<size_t>(kf)];
        int64_t xi = n * x.dim(1) + g * cg + c;  // x's flat index, one axis at a time
        bool inside = true;
        for (size_t d = 0; d < r && inside; ++d) {
          const int64_t i = oc[d + 2] * s.strides[d] - s.pads[d] + kc[d] * s.dilations[d];
          inside = i >= 0 && i < x.dim(d + 2);
          xi = xi * x.dim(d + 2) + i;
        }
        if (!inside) continue;
        sum += vx[static_cast<size_t>(xi)] * vw[static_cast<size_t>((m * cg + c) * taps + kf)];
      }
    }
    y[static_cast<size_t>(o)] = sum;
  }
  return float_tensor(out, y);
}

// A random convolution of rank 1 to 3: `group` groups of cg input and mg output channels,
// per axis a kernel of 1 to kmax(last axis) taps, stride 1 to smax, dilation 1 or 2, pads of
// 0 to pmax, and out(last axis) output positions (the input sized to give them, plus up to
// stride - 1 columns when `slack`); random input, filter and bias of those shapes.
struct RandomConv {
  Shape xs, ws;
  ConvSpec s;
  Tensor x, w, b;
};

template <typename Kmax, typename Out>
RandomConv random_conv(std::mt19937& rng, int64_t group, int64_t cg, int64_t mg, Kmax kmax,
                       int64_t smax, int64_t pmax, bool slack, Out out) {
  RandomConv c;
  const size_t r = static_cast<size_t>(rand_int(rng, 1, 3));
  c.s.group = group;
  c.xs = {rand_int(rng, 1, 2), cg * group};
  c.ws = {mg * group, cg};
  c.s.pads.assign(2 * r, 0);
  for (size_t d = 0; d < r; ++d) {
    const bool last = d + 1 == r;
    const int64_t k = rand_int(rng, 1, kmax(last));
    c.s.strides.push_back(rand_int(rng, 1, smax));
    c.s.dilations.push_back(rand_int(rng, 1, 2));
    c.s.pads[d] = rand_int(rng, 0, pmax);
    c.s.pads[d + r] = rand_int(rng, 0, pmax);
    const int64_t ek = (k - 1) * c.s.dilations[d] + 1, st = c.s.strides[d];
    c.ws.push_back(k);
    c.xs.push_back(std::max<int64_t>((out(r, last) - 1) * st + ek - c.s.pads[d] - c.s.pads[d + r] +
                                         (slack ? rand_int(rng, 0, st - 1) : 0),
                                     1));
  }
  c.x = random_tensor(DataType::Float, c.xs, rng);
  c.w = random_tensor(DataType::Float, c.ws, rng);
  c.b = random_tensor(DataType::Float, {c.ws[0]}, rng);
  return c;
}

// Conv on x with the filter (and bias) as run-time inputs, or as constants (`constant`): then
// the filter is packed at load without knowing x's shape.
Tensor run_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& s,
                bool constant = false) {
  OpTest t("Conv", 11);
  t.input(x);
  if (constant) {
    t.constant_input(w);
    if (bias) t.constant_input(*bias);
  } else {
    t.input(w);
    if (bias) t.input(*bias);
  }
  t.attr("strides", s.strides).attr("dilations", s.dilations).attr("pads", s.pads);
  t.attr("group", s.group);
  return t.run1();
}

// Conv through a session on `threads` threads whose graph declares x's shape, the filter and
// bias initializers: the filter's packed form is chosen at load from that shape.
Tensor run_conv_session(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvSpec& s,
                        int threads) {
  GraphBuilder gb;
  const Shape& xs = x.shape();
  gb.input("x", DataType::Float, std::vector<int64_t>(xs.begin(), xs.end())).initializer("w", w);
  std::vector<std::string> in{"x", "w"};
  if (bias) {
    gb.initializer("b", *bias);
    in.push_back("b");
  }
  gb.node("Conv", in, {"y"},
          {ints_attr("strides", s.strides), ints_attr("dilations", s.dilations),
           ints_attr("pads", s.pads), int_attr("group", s.group)});
  gb.output("y");
  Session session = make_session(gb.build(), 11, threads);
  return session.run({{"x", x}}).at(0).value.tensor();
}

}  // namespace

TEST_CASE("Conv matches a naive direct convolution on random shapes", "[nn]") {
  std::mt19937 rng(31);
  for (int iter = 0; iter < 80; ++iter) {
    const size_t r = static_cast<size_t>(rand_int(rng, 1, 3));
    ConvSpec s;
    s.group = rand_int(rng, 1, 3);
    const int64_t cg = iter % 4 == 0 ? 1 : rand_int(rng, 1, 3), mg = rand_int(rng, 1, 3);
    Shape xs{rand_int(rng, 1, 2), cg * s.group}, ws{mg * s.group, cg};
    s.pads.assign(2 * r, 0);
    for (size_t d = 0; d < r; ++d) {
      const int64_t k = rand_int(rng, 1, 3);
      s.strides.push_back(rand_int(rng, 1, 2));
      s.dilations.push_back(rand_int(rng, 1, 2));
      s.pads[d] = rand_int(rng, 0, 2);
      s.pads[d + r] = rand_int(rng, 0, 2);
      const int64_t ek = (k - 1) * s.dilations[d] + 1;
      ws.push_back(k);
      xs.push_back(std::max<int64_t>(ek - s.pads[d] - s.pads[d + r], 1) + rand_int(rng, 0, 6));
    }
    Tensor x = random_tensor(DataType::Float, xs, rng);
    Tensor w = random_tensor(DataType::Float, ws, rng);
    Tensor b = random_tensor(DataType::Float, {ws[0]}, rng);
    INFO("x " << shape_to_string(xs) << " w " << shape_to_string(ws) << " group " << s.group);
    const Tensor* bias = iter % 2 ? &b : nullptr;
    require_close(run_conv(x, w, bias, s), naive_conv(x, w, bias, s));
  }
}

TEST_CASE("Conv blocks and parallelises large problems correctly", "[nn]") {
  std::mt19937 rng(32);
  struct Case {
    Shape x, w;
    ConvSpec s;
  };
  const std::vector<Case> cases = {
      {{1, 32, 34, 30}, {48, 32, 3, 2}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}},  // column blocks
      {{2, 16, 20, 20}, {64, 16, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}},  // pointwise
      {{1, 8, 7, 7}, {256, 8, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}},     // row blocks
      {{1, 24, 33, 33}, {24, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 24}},  // depthwise
      {{2, 12, 17, 19}, {18, 4, 3, 2}, {{2, 1}, {2, 1}, {1, 0, 2, 1}, 3}},   // groups
      {{1, 16, 20, 21}, {32, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 16}},  // 3x3, multiplier 2
      {{1, 8, 15, 15}, {8, 1, 3, 3}, {{1, 1}, {2, 2}, {2, 2, 2, 2}, 8}},     // dilated 3x3
      {{1, 8, 16, 17}, {8, 1, 5, 5}, {{2, 2}, {1, 1}, {2, 2, 2, 2}, 8}},     // 5x5 stride 2
      {{1, 4, 9, 30}, {4, 1, 3, 7}, {{1, 2}, {1, 1}, {1, 3, 1, 2}, 4}},      // 7 wide stride 2
      {{2, 3, 5, 6, 7}, {3, 1, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 3}},  // 3-D
      {{1, 1, 3000}, {1, 1, 400}, {{1}, {1}, {199, 200}, 1}},  // a long 1-D filter
      {{1, 3, 2000}, {2, 3, 301}, {{3}, {1}, {0, 5}, 1}},      // two outputs, long taps
      {{1, 16, 23, 19}, {1, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}},  // one output channel
      {{1, 12, 20, 20}, {4, 6, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 2}},   // two per group
      // Stride 1 over wide output rows: dilated with uneven pads, images and groups; 3-D; 1-D.
      {{2, 8, 20, 26}, {12, 4, 3, 3}, {{1, 1}, {2, 1}, {0, 2, 1, 0}, 2}},
      {{1, 4, 4, 6, 14}, {6, 4, 2, 3, 3}, {{1, 1, 1}, {1, 1, 1}, {0, 1, 1, 1, 0, 1}, 1}},
      {{1, 16, 100}, {8, 16, 5}, {{1}, {1}, {2, 2}, 1}},
      // Strided over wide output rows: a 7x7 stride-2 stem, 1x1 and 3x3 stride 2.
      {{1, 3, 45, 45}, {16, 3, 7, 7}, {{2, 2}, {1, 1}, {3, 3, 3, 3}, 1}},
      {{1, 16, 30, 30}, {24, 16, 1, 1}, {{2, 2}, {1, 1}, {0, 0, 0, 0}, 1}},
      {{1, 16, 29, 28}, {32, 16, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 1}},
      // 1x1 with padding at the end only: more outputs than inputs (not the input itself).
      {{1, 8, 9, 40}, {12, 8, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 1, 2}, 1}},
      {{2, 6, 300}, {10, 6, 1}, {{1}, {1}, {0, 3}, 1}},
  };
  for (const Case& c : cases) {
    Tensor x = random_tensor(DataType::Float, c.x, rng);
    Tensor w = random_tensor(DataType::Float, c.w, rng);
    Tensor b = random_tensor(DataType::Float, {c.w[0]}, rng);
    INFO("x " << shape_to_string(c.x) << " w " << shape_to_string(c.w));
    require_close(run_conv(x, w, &b, c.s), naive_conv(x, w, &b, c.s), 1e-4, 1e-4);
  }
}

TEST_CASE("Conv over output rows wide enough for the wide path matches a naive loop", "[nn]") {
  // Output rows of 12 or more take the wide path (patches copied from the input laid out in
  // stride phases): random strides 1 to 3, dilations, uneven pads, 1-D to 3-D, groups.
  std::mt19937 rng(33);
  for (int iter = 0; iter < 40; ++iter) {
    const int64_t group = rand_int(rng, 1, 2), cg = rand_int(rng, 2, 5), mg = rand_int(rng, 3, 14);
    // The last axis: at least 12 outputs; the others small.
    const RandomConv rc = random_conv(
        rng, group, cg, mg, [](bool last) { return last ? 7 : 3; }, 3, 3, true,
        [&](size_t, bool last) { return last ? rand_int(rng, 12, 40) : rand_int(rng, 1, 5); });
    const Shape &xs = rc.xs, &ws = rc.ws;
    const ConvSpec& s = rc.s;
    const Tensor &x = rc.x, &w = rc.w, &b = rc.b;
    INFO("x " << shape_to_string(xs) << " w " << shape_to_string(ws) << " group " << s.group);
    require_close(run_conv(x, w, &b, s), naive_conv(x, w, &b, s), 1e-4, 1e-4);
  }
}

TEST_CASE("Conv over small maps (positions as the product's rows) matches a naive loop", "[nn]") {
  // At most 180 output positions (100 for 1x1 stride 1): the patches gathered into the
  // GEMM's A panels (1x1: the input read transposed), the filter's
  // transpose as B, Y^T written back transposed. The filter as a run-time input (packed into
  // the workspace), as a constant whose shape was not known at load (its other form packed
  // on the first run), and through a graph whose declared input shape chose the transposed
  // form at load. Random strides, dilations, uneven pads, groups, 1-D to 3-D, batches.
  std::mt19937 rng(34);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t group = rand_int(rng, 1, 2), cg = rand_int(rng, 2, 40), mg = rand_int(rng, 3, 70);
    const RandomConv rc = random_conv(
        rng, group, cg, mg, [](bool) { return 3; }, 2, 2, false,
        [&](size_t r, bool) {
          return rand_int(rng, 1, r == 1 ? 170 : r == 2 ? 13 : 5);
        });
    const Shape &xs = rc.xs, &ws = rc.ws;
    const ConvSpec& s = rc.s;
    const Tensor &x = rc.x, &w = rc.w, &b = rc.b;
    INFO("x " << shape_to_string(xs) << " w " << shape_to_string(ws) << " group " << s.group);
    const Tensor* bias = iter % 2 ? &b : nullptr;
    const Tensor expected = naive_conv(x, w, bias, s);
    require_close(run_conv(x, w, bias, s), expected, 1e-4, 1e-4);
    require_close(run_conv(x, w, bias, s, true), expected, 1e-4, 1e-4);
    if (iter % 4 != 0) continue;
    require_close(run_conv_session(x, w, bias, s, 2), expected, 1e-4, 1e-4);
  }
}

namespace {

// A random convolution of one-row windows over one input channel per group: `taps` taps at
// stride `stride`, dilation 1 to 3, pads of up to a kernel on either side, `out` positions,
// 1 or 2 images, `group` groups of `mg` filters; a 1-D map or (`two_d`) a 2-D map one row
// high with a kernel one row high at a random row stride, with row pads it does not reach
// past (one output row; a top pad makes it all padding).
RandomConv one_row_conv(std::mt19937& rng, int64_t group, int64_t mg, int64_t taps, int64_t stride,
                        int64_t out, bool two_d, bool padded) {
  RandomConv c;
  const int64_t dil = rand_int(rng, 1, 3), ek = (taps - 1) * dil + 1;
  const int64_t pad0 = padded ? rand_int(rng, 0, taps) : 0;
  const int64_t pad1 = padded ? rand_int(rng, 0, taps) : 0;
  const int64_t len =
      std::max<int64_t>((out - 1) * stride + ek - pad0 - pad1 + rand_int(rng, 0, stride - 1), 1);
  c.s.group = group;
  c.xs = {rand_int(rng, 1, 2), group};
  c.ws = {mg * group, 1};
  if (two_d) {
    c.xs.insert(c.xs.end(), {1, len});
    c.ws.insert(c.ws.end(), {1, taps});
    const int64_t row_stride = rand_int(rng, 1, 3), top = rand_int(rng, 0, row_stride - 1);
    c.s.strides = {row_stride, stride};
    c.s.dilations = {rand_int(rng, 1, 2), dil};
    c.s.pads = {top, pad0, rand_int(rng, 0, row_stride - 1 - top), pad1};
  } else {
    c.xs.push_back(len);
    c.ws.push_back(taps);
    c.s.strides = {stride};
    c.s.dilations = {dil};
    c.s.pads = {pad0, pad1};
  }
  c.x = random_tensor(DataType::Float, c.xs, rng);
  c.w = random_tensor(DataType::Float, c.ws, rng);
  c.b = random_tensor(DataType::Float, {c.ws[0]}, rng);
  return c;
}

// Conv + Add(z) + Relu through a session on `threads` threads (the optimizer fuses them into
// one kiln.FusedConv that accumulates onto z).
Tensor run_conv_add_relu(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& z,
                         const ConvSpec& s, int threads) {
  GraphBuilder gb;
  const Shape &xs = x.shape(), &zs = z.shape();
  gb.input("x", DataType::Float, std::vector<int64_t>(xs.begin(), xs.end()))
      .input("z", DataType::Float, std::vector<int64_t>(zs.begin(), zs.end()));
  gb.initializer("w", w).initializer("b", b);
  gb.node("Conv", {"x", "w", "b"}, {"c"},
          {ints_attr("strides", s.strides), ints_attr("dilations", s.dilations),
           ints_attr("pads", s.pads), int_attr("group", s.group)});
  gb.node("Add", {"c", "z"}, {"s"});
  gb.node("Relu", {"s"}, {"y"});
  gb.output("y");
  Session session = make_session(gb.build(), 13, threads);
  return session.run({{"x", x}, {"z", z}}).at(0).value.tensor();
}

}  // namespace

TEST_CASE("Conv over strided windows (long filters along one row) matches a naive loop", "[nn]") {
  // One-row windows over one input channel per group with at least 16 taps and 8 filters per
  // group (the STFT front ends of audio models) are GEMM products that read the signal as a
  // strided matrix: random taps, strides below and far above the kernel's length,
  // dilations, pads, groups, images, 1-D maps and 2-D ones one row high, up to 180 positions
  // (the signal is the product's A) and more (the wide layout); the filter as a run-time
  // input, as a constant, and through a graph whose declared input shape chose its form at
  // load, on one and two threads; the optimizer's Conv + Add + Relu. Every run counts as
  // strided windows.
  std::mt19937 rng(38);
  for (int iter = 0; iter < sweep_iterations(40); ++iter) {
    const int64_t group = rand_int(rng, 1, 2), mg = rand_int(rng, 8, 20);
    const bool many = iter % 5 == 0;  // past the transposed product's 180 positions
    const int64_t taps = iter % 4 == 0 ? 16 : rand_int(rng, 16, many ? 48 : 300);
    const int64_t stride = iter % 2 ? rand_int(rng, 1, 8) : rand_int(rng, 9, 200);
    const int64_t out = many ? rand_int(rng, 181, 240) : rand_int(rng, 1, 60);
    const RandomConv c = one_row_conv(rng, group, mg, taps, stride, out, iter % 3 == 1, iter % 3);
    INFO("x " << shape_to_string(c.xs) << " w " << shape_to_string(c.ws) << " group " << group
              << " strides " << shape_to_string(c.s.strides) << " pads "
              << shape_to_string(c.s.pads));
    const Tensor* bias = iter % 2 ? &c.b : nullptr;
    const Tensor expected = naive_conv(c.x, c.w, bias, c.s);
    const uint64_t before = ops::strided_window_convolutions();
    require_close(run_conv(c.x, c.w, bias, c.s), expected, 1e-4, 1e-4);
    require_close(run_conv(c.x, c.w, bias, c.s, true), expected, 1e-4, 1e-4);
    require_close(run_conv_session(c.x, c.w, bias, c.s, 1 + iter % 2), expected, 1e-4, 1e-4);
    CHECK(ops::strided_window_convolutions() == before + 3);
    if (iter % 4 != 1) continue;
    const Tensor z = random_tensor(DataType::Float, expected.shape(), rng);
    const Tensor with_bias = naive_conv(c.x, c.w, &c.b, c.s);
    std::vector<double> fused = values(with_bias);
    const std::vector<double> vz = values(z);
    for (size_t i = 0; i < fused.size(); ++i) fused[i] = std::max(0.0, fused[i] + vz[i]);
    require_close(run_conv_add_relu(c.x, c.w, c.b, z, c.s, 2),
                  float_tensor(expected.shape(), fused), 1e-4, 1e-4);
  }
}

TEST_CASE("Convolutions next to the strided windows' class keep their paths", "[nn]") {
  // 15 taps; 7 filters per group; one filter per group (depthwise); a map two rows high; two
  // channels per group: each matches the naive loop, and none runs as strided windows.
  std::mt19937 rng(39);
  struct Case {
    const char* what;
    int64_t group, mg, taps, stride, out;
    bool two_d;
    int64_t rows, channels;  // the 2-D map's rows; input channels per group
  };
  const std::vector<Case> cases = {
      {"15 taps", 1, 64, 15, 4, 90, false, 1, 1},
      {"7 filters per group", 2, 7, 200, 50, 30, false, 1, 1},
      {"depthwise", 6, 1, 300, 100, 20, false, 1, 1},
      {"two rows", 1, 32, 64, 16, 40, true, 2, 1},
      {"two channels per group", 1, 32, 64, 16, 40, false, 1, 2},
  };
  for (const Case& k : cases) {
    RandomConv c = one_row_conv(rng, k.group, k.mg, k.taps, k.stride, k.out, k.two_d, true);
    if (k.rows > 1) {
      c.xs[2] = k.rows;
      c.x = random_tensor(DataType::Float, c.xs, rng);
    }
    if (k.channels > 1) {
      c.xs[1] = k.channels * k.group;
      c.ws[1] = k.channels;
      c.x = random_tensor(DataType::Float, c.xs, rng);
      c.w = random_tensor(DataType::Float, c.ws, rng);
    }
    INFO(k.what << ": x " << shape_to_string(c.xs) << " w " << shape_to_string(c.ws));
    const Tensor expected = naive_conv(c.x, c.w, &c.b, c.s);
    const uint64_t before = ops::strided_window_convolutions();
    require_close(run_conv(c.x, c.w, &c.b, c.s), expected, 1e-4, 1e-4);
    require_close(run_conv_session(c.x, c.w, &c.b, c.s, 2), expected, 1e-4, 1e-4);
    CHECK(ops::strided_window_convolutions() == before);
  }
}

TEST_CASE("Conv 3x3 stride 1 as Winograd products matches a naive loop", "[nn][winograd]") {
  // 3x3 stride-1 convolutions with at least 8 channels and filters per group over maps of at
  // least nine 4x4 tiles take the Winograd F(4x4, 3x3) products (ops/math/winograd.h); the
  // kernel tests bound their rounding (test_winograd.cpp). Here the op's side: groups,
  // images, pads on either side, maps cut anywhere by the tiles, the filter as a run-time
  // input (transformed into the workspace), as a constant whose form was not chosen at load
  // (transformed on the first run) and through a graph whose declared input shape chose the
  // Winograd form at load; on one and two threads.
  std::mt19937 rng(36);
  for (int iter = 0; iter < sweep_iterations(24); ++iter) {
    const int64_t group = rand_int(rng, 1, 2), cg = rand_int(rng, 8, 40), mg = rand_int(rng, 8, 40);
    const Shape xs{rand_int(rng, 1, 2), cg * group, rand_int(rng, 11, 40), rand_int(rng, 11, 40)};
    ConvSpec s;
    s.group = group;
    s.strides = {1, 1};
    s.dilations = {1, 1};
    s.pads = {rand_int(rng, 0, 2), rand_int(rng, 0, 2), rand_int(rng, 0, 2), rand_int(rng, 0, 2)};
    const Tensor x = random_tensor(DataType::Float, xs, rng);
    const Tensor w = random_tensor(DataType::Float, {mg * group, cg, 3, 3}, rng);
    const Tensor b = random_tensor(DataType::Float, {mg * group}, rng);
    const Tensor* bias = iter % 2 ? &b : nullptr;
    INFO("x " << shape_to_string(xs) << " filters " << mg * group << " group " << group);
    const Tensor expected = naive_conv(x, w, bias, s);
    const uint64_t before = math::winograd_convolutions();
    require_close(run_conv(x, w, bias, s), expected, 1e-3, 1e-3);
    require_close(run_conv(x, w, bias, s, true), expected, 1e-3, 1e-3);
    require_close(run_conv_session(x, w, bias, s, 1 + iter % 2), expected, 1e-3, 1e-3);
    // Each run took the Winograd path, once per group.
    CHECK(math::winograd_convolutions() == before + 3 * static_cast<uint64_t>(group));
  }
}

TEST_CASE("Conv over large maps runs in bands of output rows that match a direct loop", "[nn]") {
  // Channels laid out past 2 MiB (kWideBandFloats) take the wide path band by band: strides
  // 1 and 2, dilation, uneven pads, and the optimizer's fused Conv + Add (Z) + Relu, whose
  // activation each band applies to its own rows only.
  struct Case {
    int64_t c, m, h, w, k, stride, dil, pad_top, pad_left, pad_bottom, pad_right;
  };
  const std::vector<Case> cases = {{24, 7, 150, 150, 3, 1, 1, 1, 1, 1, 1},
                                   {20, 6, 170, 161, 3, 2, 1, 0, 1, 2, 1},
                                   {18, 5, 165, 170, 3, 1, 2, 2, 0, 1, 2}};
  std::mt19937 rng(35);
  for (const Case& c : cases) {
    INFO("c " << c.c << " m " << c.m << " map " << c.h << "x" << c.w << " stride " << c.stride);
    Tensor x = random_tensor(DataType::Float, {1, c.c, c.h, c.w}, rng);
    Tensor w = random_tensor(DataType::Float, {c.m, c.c, c.k, c.k}, rng);
    Tensor b = random_tensor(DataType::Float, {c.m}, rng);
    const int64_t ek = (c.k - 1) * c.dil + 1;
    const int64_t oh = (c.h + c.pad_top + c.pad_bottom - ek) / c.stride + 1;
    const int64_t ow = (c.w + c.pad_left + c.pad_right - ek) / c.stride + 1;
    Tensor z = random_tensor(DataType::Float, {1, c.m, oh, ow}, rng);
    const float* xv = x.data<const float>();
    const float* wv = w.data<const float>();
    std::vector<double> conv(static_cast<size_t>(c.m * oh * ow)), fused(conv.size());
    for (int64_t m = 0; m < c.m; ++m) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double sum = b.data<const float>()[m];
          for (int64_t ch = 0; ch < c.c; ++ch) {
            for (int64_t u = 0; u < c.k; ++u) {
              const int64_t ih = i * c.stride - c.pad_top + u * c.dil;
              if (ih < 0 || ih >= c.h) continue;
              for (int64_t v = 0; v < c.k; ++v) {
                const int64_t iw = j * c.stride - c.pad_left + v * c.dil;
                if (iw < 0 || iw >= c.w) continue;
                sum += double(xv[(ch * c.h + ih) * c.w + iw]) *
                       wv[((m * c.c + ch) * c.k + u) * c.k + v];
              }
            }
          }
          const size_t at = static_cast<size_t>((m * oh + i) * ow + j);
          conv[at] = sum;
          fused[at] = std::max(0.0, sum + z.data<const float>()[at]);
        }
      }
    }
    const Shape out{1, c.m, oh, ow};
    ConvSpec s{{c.stride, c.stride},
               {c.dil, c.dil},
               {c.pad_top, c.pad_left, c.pad_bottom, c.pad_right},
               1};
    OpTest t("Conv", 11);
    t.input(x).constant_input(w).constant_input(b);
    t.attr("strides", s.strides).attr("dilations", s.dilations).attr("pads", s.pads);
    require_close(t.run1(), float_tensor(out, conv), 1e-4, 1e-4);
    GraphBuilder gb;
    gb.input("x", DataType::Float, {1, c.c, c.h, c.w}).input("z", DataType::Float, out);
    gb.initializer("w", w).initializer("b", b);
    gb.node("Conv", {"x", "w", "b"}, {"c"},
            {ints_attr("strides", s.strides), ints_attr("dilations", s.dilations),
             ints_attr("pads", s.pads)});
    gb.node("Add", {"c", "z"}, {"s"});
    gb.node("Relu", {"s"}, {"y"});
    gb.output("y");
    Session session = make_session(gb.build(), 13, 2);
    require_close(session.run({{"x", x}, {"z", z}}).at(0).value.tensor(), float_tensor(out, fused),
                  1e-4, 1e-4);
  }
}

TEST_CASE("Conv auto_pad equals the explicit SAME and VALID padding", "[nn]") {
  std::mt19937 rng(33);
  Tensor x = random_tensor(DataType::Float, {1, 2, 7, 8}, rng);
  Tensor w = random_tensor(DataType::Float, {3, 2, 3, 2}, rng);
  // stride 2: output ceil(7/2)=4 x ceil(8/2)=4; padding totals 2 and 0.
  const std::vector<std::pair<const char*, std::vector<int64_t>>> modes = {
      {"SAME_UPPER", {1, 0, 1, 0}}, {"SAME_LOWER", {1, 0, 1, 0}}, {"VALID", {0, 0, 0, 0}}};
  for (const auto& [mode, pads] : modes) {
    ConvSpec s{{2, 2}, {1, 1}, pads, 1};
    Tensor y = OpTest("Conv", 11)
                   .input(x)
                   .input(w)
                   .attr("auto_pad", mode)
                   .attr("strides", s.strides)
                   .run1();
    INFO(mode);
    require_close(y, naive_conv(x, w, nullptr, s));
  }
  // An odd total: SAME_UPPER puts the extra row at the end, SAME_LOWER at the start.
  Tensor x2 = random_tensor(DataType::Float, {1, 1, 6, 6}, rng);
  Tensor w2 = random_tensor(DataType::Float, {1, 1, 2, 2}, rng);
  require_close(OpTest("Conv", 11).input(x2).input(w2).attr("auto_pad", "SAME_UPPER").run1(),
                naive_conv(x2, w2, nullptr, {{1, 1}, {1, 1}, {0, 0, 1, 1}, 1}));
  require_close(OpTest("Conv", 11).input(x2).input(w2).attr("auto_pad", "SAME_LOWER").run1(),
                naive_conv(x2, w2, nullptr, {{1, 1}, {1, 1}, {1, 1, 0, 0}, 1}));
}

TEST_CASE("Conv rejects bad groups, shapes and attributes", "[nn]") {
  std::mt19937 rng(34);
  Tensor x = random_tensor(DataType::Float, {1, 4, 5, 5}, rng);
  Tensor w = random_tensor(DataType::Float, {6, 2, 3, 3}, rng);
  REQUIRE_THROWS_AS(OpTest("Conv", 11).input(x).input(w).attr("group", 3).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Conv", 11).input(x).input(w).run(), Error);  // 4 != 2 * 1
  REQUIRE_THROWS_AS(OpTest("Conv", 11).input(x).input(w).attr("group", 0).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("Conv", 11).input(x).input(w).attr("group", 2).attr("strides", Ints{0, 1}).run(),
      Error);
  Tensor big = random_tensor(DataType::Float, {6, 2, 7, 7}, rng);
  REQUIRE_THROWS_AS(OpTest("Conv", 11).input(x).input(big).attr("group", 2).run(), Error);
  Tensor bias = random_tensor(DataType::Float, {5}, rng);
  REQUIRE_THROWS_AS(OpTest("Conv", 11).input(x).input(w).input(bias).attr("group", 2).run(), Error);
}

namespace {

// y[n, g*mg + m, i*s - p + k*d] += x[n, g*cg + c, i] * w[g*cg + c, m, k]
Tensor naive_conv_transpose(const Tensor& x, const Tensor& w, const ConvSpec& s,
                            const std::vector<int64_t>& output_padding) {
  const size_t r = x.rank() - 2;
  const int64_t cg = x.dim(1) / s.group, mg = w.dim(1);
  Shape out{x.dim(0), mg * s.group};
  for (size_t d = 0; d < r; ++d) {
    out.push_back(s.strides[d] * (x.dim(d + 2) - 1) + output_padding[d] +
                  (w.dim(d + 2) - 1) * s.dilations[d] + 1 - s.pads[d] - s.pads[d + r]);
  }
  const auto vx = values(x), vw = values(w);
  std::vector<double> y(static_cast<size_t>(shape_numel(out)));
  // Each input element meets only the filters of its own channel (w's first axis).
  const int64_t per_channel = w.numel() / w.dim(0);
  for (int64_t xi = 0; xi < x.numel(); ++xi) {
    const auto xc = coords(xi, x.shape());
    const int64_t g = xc[1] / cg;
    for (int64_t wi = xc[1] * per_channel; wi < (xc[1] + 1) * per_channel; ++wi) {
      const auto wc = coords(wi, w.shape());
      std::vector<int64_t> oc{xc[0], g * mg + wc[1]};
      bool inside = true;
      for (size_t d = 0; d < r; ++d) {
        const int64_t o = xc[d + 2] * s.strides[d] - s.pads[d] + wc[d + 2] * s.dilations[d];
        inside = inside && o >= 0 && o < out[d + 2];
        oc.push_back(o);
      }
      if (inside)
        y[static_cast<size_t>(flat(oc, out))] +=
            vx[static_cast<size_t>(xi)] * vw[static_cast<size_t>(wi)];
    }
  }
  return float_tensor(out, y);
}

}  // namespace

TEST_CASE("ConvTranspose matches a naive scatter on random shapes", "[nn]") {
  std::mt19937 rng(41);
  for (int iter = 0; iter < 50; ++iter) {
    const size_t r = static_cast<size_t>(rand_int(rng, 1, 3));
    ConvSpec s;
    s.group = rand_int(rng, 1, 2);
    const int64_t cg = rand_int(rng, 1, 3), mg = rand_int(rng, 1, 3);
    Shape xs{rand_int(rng, 1, 2), cg * s.group}, ws{cg * s.group, mg};
    std::vector<int64_t> opad;
    s.pads.assign(2 * r, 0);
    for (size_t d = 0; d < r; ++d) {
      const int64_t k = rand_int(rng, 1, 3);
      s.strides.push_back(rand_int(rng, 1, 3));
      s.dilations.push_back(rand_int(rng, 1, 2));
      opad.push_back(rand_int(rng, 0, s.strides[d] - 1));
      s.pads[d] = rand_int(rng, 0, k - 1);
      s.pads[d + r] = rand_int(rng, 0, k - 1);
      ws.push_back(k);
      xs.push_back(rand_int(rng, 1, 5));
    }
    Tensor x = random_tensor(DataType::Float, xs, rng);
    Tensor w = random_tensor(DataType::Float, ws, rng);
    const Tensor expected = naive_conv_transpose(x, w, s, opad);
    if (shape_numel(expected.shape()) == 0) continue;
    INFO("x " << shape_to_string(xs) << " w " << shape_to_string(ws) << " group " << s.group);
    Tensor y = OpTest("ConvTranspose", 11)
                   .input(x)
                   .input(w)
                   .attr("strides", s.strides)
                   .attr("dilations", s.dilations)
                   .attr("pads", s.pads)
                   .attr("output_padding", opad)
                   .attr("group", s.group)
                   .run1();
    require_close(y, expected);
  }
  // Large enough to split output channels across tasks.
  Tensor x = random_tensor(DataType::Float, {1, 16, 20, 20}, rng);
  Tensor w = random_tensor(DataType::Float, {16, 40, 3, 3}, rng);
  ConvSpec s{{2, 2}, {1, 1}, {1, 1, 1, 1}, 1};
  Tensor y = OpTest("ConvTranspose", 11)
                 .input(x)
                 .input(w)
                 .attr("strides", s.strides)
                 .attr("pads", s.pads)
                 .run1();
  require_close(y, naive_conv_transpose(x, w, s, {0, 0}), 1e-4, 1e-4);
}

TEST_CASE("ConvTranspose output_shape pads the end when larger than needed", "[nn]") {
  std::mt19937 rng(42);
  Tensor x = random_tensor(DataType::Float, {1, 1, 3, 3}, rng);
  Tensor w = random_tensor(DataType::Float, {1, 2, 3, 3}, rng);
  Tensor y = OpTest("ConvTranspose", 11)
                 .input(x)
                 .input(w)
                 .attr("strides", Ints{3, 2})
                 .attr("output_shape", Ints{10, 8})
                 .run1();
  REQUIRE(y.shape() == Shape{1, 2, 10, 8});
  const Tensor full = naive_conv_transpose(x, w, {{3, 2}, {1, 1}, {0, 0, 0, 0}, 1}, {0, 0});
  const auto vy = values(y), vf = values(full);  // full is [1, 2, 9, 7]
  for (int64_t i = 0; i < y.numel(); ++i) {
    const auto c = coords(i, y.shape());
    const double e = c[2] < 9 && c[3] < 7 ? vf[static_cast<size_t>(flat(c, full.shape()))] : 0;
    REQUIRE(vy[static_cast<size_t>(i)] == Approx(e).margin(1e-5));
  }
  REQUIRE_THROWS_AS(OpTest("ConvTranspose", 11).input(x).input(w).attr("group", 2).run(), Error);
}

namespace {

// y[n, m, ...] += bias[m]
Tensor with_channel_bias(const Tensor& y, const Tensor& bias) {
  std::vector<double> v = values(y);
  const auto vb = values(bias);
  const int64_t channels = y.dim(1), plane = y.numel() / std::max<int64_t>(y.dim(0) * channels, 1);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] += vb[static_cast<size_t>((static_cast<int64_t>(i) / plane) % channels)];
  }
  return float_tensor(y.shape(), v);
}

// Runs one node of `op` on x with the other inputs as initializers (known when the session
// is planned); returns output 0 and the session's count of prepared weights.
std::pair<Tensor, uint64_t> run_with_constants(const std::string& op, int64_t opset,
                                               const Tensor& x, const std::vector<Tensor>& consts,
                                               std::vector<ir::Attribute> attrs, int threads) {
  GraphBuilder g;
  g.input("x", x.dtype());
  std::vector<std::string> ins{"x"};
  for (size_t i = 0; i < consts.size(); ++i) {
    const std::string name = "c" + std::to_string(i);
    if (consts[i].defined()) {
      g.initializer(name, consts[i]);
      ins.push_back(name);
    } else {
      ins.push_back("");
    }
  }
  g.node(op, ins, {"y"}, std::move(attrs));
  g.output("y");
  Session s = make_session(g.build(), opset, threads);
  auto out = s.run({{"x", x}});
  return {out.at(0).value.tensor(), s.load_stats().weights_prepared_count};
}

}  // namespace

TEST_CASE(
    "ConvTranspose with many channels matches the naive scatter and packs a constant "
    "filter once",
    "[nn]") {
  std::mt19937 rng(43);
  const DataType types[] = {DataType::Float, DataType::Float, DataType::Double, DataType::Float16};
  for (int iter = 0; iter < sweep_iterations(40); ++iter) {
    const DataType dt = types[iter % 4];
    const size_t r = static_cast<size_t>(rand_int(rng, 1, 3));
    ConvSpec s;
    s.group = rand_int(rng, 1, 3);
    const int64_t cg = rand_int(rng, 1, 20), mg = rand_int(rng, 1, 24);
    Shape xs{rand_int(rng, 1, 2), cg * s.group}, ws{cg * s.group, mg};
    Ints opad;
    s.pads.assign(2 * r, 0);
    for (size_t d = 0; d < r; ++d) {
      const int64_t k = rand_int(rng, 1, 3);
      s.strides.push_back(rand_int(rng, 1, 3));
      s.dilations.push_back(rand_int(rng, 1, 2));
      opad.push_back(rand_int(rng, 0, s.strides[d] - 1));
      s.pads[d] = rand_int(rng, 0, k - 1);
      s.pads[d + r] = rand_int(rng, 0, k - 1);
      ws.push_back(k);
      xs.push_back(rand_int(rng, 1, r == 3 ? 4 : 9));
    }
    bool empty = false;  // padding may remove the whole output
    for (size_t d = 0; d < r; ++d) {
      empty = empty || s.strides[d] * (xs[d + 2] - 1) + opad[d] + (ws[d + 2] - 1) * s.dilations[d] +
                               1 - s.pads[d] - s.pads[d + r] <
                           1;
    }
    if (empty) continue;
    Tensor x = random_tensor(dt, xs, rng);
    Tensor w = random_tensor(dt, ws, rng);
    Tensor b = random_tensor(dt, {mg * s.group}, rng);
    const Tensor expected = with_channel_bias(naive_conv_transpose(x, w, s, opad), b);
    INFO("iter " << iter << " x " << shape_to_string(xs) << " w " << shape_to_string(ws)
                 << " group " << s.group);
    const double tol = dt == DataType::Float16 ? 2e-2 : 1e-4;
    const std::vector<ir::Attribute> attrs = {
        ints_attr("strides", s.strides), ints_attr("dilations", s.dilations),
        ints_attr("pads", s.pads), ints_attr("output_padding", opad), int_attr("group", s.group)};
    // The filter as a constant (packed when the session is planned) ...
    auto [y, prepared] =
        run_with_constants("ConvTranspose", 11, x, {w, b}, attrs, static_cast<int>(iter % 2 + 1));
    REQUIRE(y.dtype() == dt);
    CHECK(prepared == (dt == DataType::Double ? 0u : 1u));
    require_close(float_tensor(y.shape(), values(y)), expected, tol, tol);
    // ... and as a value known at run time.
    Tensor yr = OpTest("ConvTranspose", 11)
                    .input(x)
                    .input(w)
                    .input(b)
                    .attr("strides", s.strides)
                    .attr("dilations", s.dilations)
                    .attr("pads", s.pads)
                    .attr("output_padding", opad)
                    .attr("group", s.group)
                    .run1();
    require_close(float_tensor(yr.shape(), values(yr)), expected, tol, tol);
  }
  // Products large enough to split into channel blocks across threads, including blocks that
  // end inside a tile of the packed filter (7 channels x 9 taps).
  struct Case {
    Shape x, w;
    ConvSpec s;
  };
  const std::vector<Case> cases = {
      {{1, 64, 12, 12}, {64, 48, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 1}},
      {{1, 256, 14, 14}, {256, 7, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}},
      {{2, 48, 9, 11}, {48, 10, 2, 3}, {{2, 1}, {1, 2}, {0, 1, 1, 0}, 3}},
      {{1, 96, 30, 30}, {96, 4, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}},
  };
  for (const Case& c : cases) {
    Tensor x = random_tensor(DataType::Float, c.x, rng);
    Tensor w = random_tensor(DataType::Float, c.w, rng);
    INFO("x " << shape_to_string(c.x) << " w " << shape_to_string(c.w));
    const Ints opad(c.x.size() - 2, 0);
    const Tensor expected = naive_conv_transpose(x, w, c.s, opad);
    for (int threads : {1, 2}) {
      auto [y, prepared] = run_with_constants(
          "ConvTranspose", 11, x, {w},
          {ints_attr("strides", c.s.strides), ints_attr("dilations", c.s.dilations),
           ints_attr("pads", c.s.pads), int_attr("group", c.s.group)},
          threads);
      CHECK(prepared == 1);
      require_close(y, expected, 1e-4, 1e-4);
    }
  }
}

// ---- DeformConv ----

namespace {

struct DeformSpec {
  Ints strides, dilations, pads;  // pads: top, left, bottom, right
  int64_t group = 1, offset_group = 1;
};

// The ONNX definition: every kernel tap samples X bilinearly at its offset position (zero
// outside the image), scaled by the mask.
Tensor naive_deform_conv(const Tensor& x, const Tensor& w, const Tensor& off, const Tensor* bias,
                         const Tensor* mask, const DeformSpec& s) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), M = w.dim(0), cg = w.dim(1),
                kh = w.dim(2), kw = w.dim(3), OH = off.dim(2), OW = off.dim(3);
  const int64_t mg = M / s.group, cpo = C / s.offset_group, kp = kh * kw;
  const auto vx = values(x), vw = values(w), vo = values(off);
  const auto vb = bias ? values(*bias) : std::vector<double>{};
  const auto vm = mask ? values(*mask) : std::vector<double>{};
  auto at = [&](int64_t n, int64_t c, int64_t i, int64_t j) {
    return i < 0 || i >= H || j < 0 || j >= W
               ? 0.0
               : vx[static_cast<size_t>(((n * C + c) * H + i) * W + j)];
  };
  std::vector<double> y(static_cast<size_t>(N * M * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          double sum = bias ? vb[static_cast<size_t>(m)] : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = (m / mg) * cg + ci, og = c / cpo;
            for (int64_t k = 0; k < kp; ++k) {
              const int64_t ki = k / kw, kj = k % kw;
              auto offset = [&](int64_t ch) {
                return vo[static_cast<size_t>(((n * off.dim(1) + ch) * OH + oy) * OW + ox)];
              };
              const double h =
                  oy * s.strides[0] - s.pads[0] + ki * s.dilations[0] + offset(og * 2 * kp + 2 * k);
              const double ww = ox * s.strides[1] - s.pads[1] + kj * s.dilations[1] +
                                offset(og * 2 * kp + 2 * k + 1);
              double v = 0;
              if (h > -1 && h < H && ww > -1 && ww < W) {
                const double h0 = std::floor(h), w0 = std::floor(ww), lh = h - h0, lw = ww - w0;
                const auto i0 = static_cast<int64_t>(h0), j0 = static_cast<int64_t>(w0);
                v = (1 - lh) * ((1 - lw) * at(n, c, i0, j0) + lw * at(n, c, i0, j0 + 1)) +
                    lh * ((1 - lw) * at(n, c, i0 + 1, j0) + lw * at(n, c, i0 + 1, j0 + 1));
              }
              if (mask)
                v *=
                    vm[static_cast<size_t>(((n * mask->dim(1) + og * kp + k) * OH + oy) * OW + ox)];
              sum += v * vw[static_cast<size_t>(((m * cg + ci) * kh + ki) * kw + kj)];
            }
          }
          y[static_cast<size_t>(((n * M + m) * OH + oy) * OW + ox)] = sum;
        }
  return float_tensor({N, M, OH, OW}, y);
}

Tensor run_deform_conv(const Tensor& x, const Tensor& w, const Tensor& off, const Tensor* bias,
                       const Tensor* mask, const DeformSpec& s) {
  OpTest t("DeformConv", 19);
  t.input(x).input(w).input(off);
  if (bias) {
    t.input(*bias);
  } else if (mask) {
    t.no_input();
  }
  if (mask) t.input(*mask);
  t.attr("strides", s.strides).attr("dilations", s.dilations).attr("pads", s.pads);
  t.attr("group", s.group).attr("offset_group", s.offset_group);
  return t.run1();
}

}  // namespace

TEST_CASE("DeformConv matches the naive bilinear sampling on random shapes", "[nn]") {
  std::mt19937 rng(47);
  const DataType types[] = {DataType::Float, DataType::Float, DataType::Double, DataType::Float16};
  for (int iter = 0; iter < 40; ++iter) {
    const DataType dt = types[iter % 4];
    DeformSpec s;
    s.group = rand_int(rng, 1, 2);
    s.offset_group = rand_int(rng, 1, 2);
    const int64_t cg = s.offset_group * rand_int(rng, 1, 3), mg = rand_int(rng, 1, 20);
    const int64_t kh = rand_int(rng, 1, 3), kw = rand_int(rng, 1, 3);
    s.strides = {rand_int(rng, 1, 2), rand_int(rng, 1, 2)};
    s.dilations = {rand_int(rng, 1, 2), rand_int(rng, 1, 2)};
    s.pads = {rand_int(rng, 0, 2), rand_int(rng, 0, 2), rand_int(rng, 0, 2), rand_int(rng, 0, 2)};
    const int64_t h = (kh - 1) * s.dilations[0] + 1 + rand_int(rng, 0, 7);
    const int64_t w = (kw - 1) * s.dilations[1] + 1 + rand_int(rng, 0, 7);
    const int64_t n = rand_int(rng, 1, 2), c = cg * s.group;
    const int64_t oh =
        (h + s.pads[0] + s.pads[2] - ((kh - 1) * s.dilations[0] + 1)) / s.strides[0] + 1;
    const int64_t ow =
        (w + s.pads[1] + s.pads[3] - ((kw - 1) * s.dilations[1] + 1)) / s.strides[1] + 1;
    Tensor x = random_tensor(dt, {n, c, h, w}, rng);
    Tensor wt = random_tensor(dt, {mg * s.group, cg, kh, kw}, rng);
    Tensor off = random_tensor(dt, {n, s.offset_group * kh * kw * 2, oh, ow}, rng, -2, 2);
    Tensor mask = random_tensor(dt, {n, s.offset_group * kh * kw, oh, ow}, rng, 0, 1);
    Tensor b = random_tensor(dt, {mg * s.group}, rng);
    const Tensor* bias = iter % 3 ? &b : nullptr;
    const Tensor* m = iter % 2 ? &mask : nullptr;
    INFO("iter " << iter << " x " << shape_to_string(x.shape()) << " w "
                 << shape_to_string(wt.shape()) << " group " << s.group << " offset_group "
                 << s.offset_group);
    Tensor y = run_deform_conv(x, wt, off, bias, m, s);
    REQUIRE(y.dtype() == dt);
    const double tol = dt == DataType::Float16 ? 3e-2 : 1e-4;
    require_close(float_tensor(y.shape(), values(y)), naive_deform_conv(x, wt, off, bias, m, s),
                  tol, tol);
  }
  // Large enough to split output positions across threads.
  DeformSpec s{{1, 1}, {1, 1}, {1, 1, 1, 1}, 2, 2};
  Tensor x = random_tensor(DataType::Float, {1, 32, 20, 20}, rng);
  Tensor wt = random_tensor(DataType::Float, {48, 16, 3, 3}, rng);
  Tensor off = random_tensor(DataType::Float, {1, 36, 20, 20}, rng, -2, 2);
  Tensor b = random_tensor(DataType::Float, {48}, rng);
  require_close(run_deform_conv(x, wt, off, &b, nullptr, s),
                naive_deform_conv(x, wt, off, &b, nullptr, s), 1e-4, 1e-4);
}

// ---- Pooling ----

namespace {

struct PoolSpec {
  std::vector<int64_t> kernel, strides, dilations, pads;
  bool ceil = false, count_pad = false;
};

// Output sizes as in PyTorch / ONNX: a ceil-mode window must start inside the input or its
// leading padding.
Shape pool_out_shape(const Tensor& x, const PoolSpec& s) {
  const size_t r = s.kernel.size();
  Shape out{x.dim(0), x.dim(1)};
  for (size_t d = 0; d < r; ++d) {
    const int64_t ek = (s.kernel[d] - 1) * s.dilations[d] + 1;
    const int64_t span = x.dim(d + 2) + s.pads[d] + s.pads[d + r] - ek;
    int64_t o = (s.ceil ? (span + s.strides[d] - 1) / s.strides[d] : span / s.strides[d]) + 1;
    if (s.ceil && (o - 1) * s.strides[d] >= x.dim(d + 2) + s.pads[d]) --o;
    out.push_back(o);
  }
  return out;
}

// kind 0: max (with argmax), 1: average.
std::pair<Tensor, std::vector<int64_t>> naive_pool(const Tensor& x, const PoolSpec& s, int kind) {
  const size_t r = s.kernel.size();
  const Shape out = pool_out_shape(x, s);
  const auto vx = values(x);
  const Shape kshape(s.kernel.begin(), s.kernel.end());
  std::vector<double> y(static_cast<size_t>(shape_numel(out)));
  std::vector<int64_t> arg(y.size());
  for (int64_t o = 0; o < shape_numel(out); ++o) {
    const auto oc = coords(o, out);
    double best = -std::numeric_limits<double>::infinity(), sum = 0;
    int64_t count = 0, best_i = 0;
    for (int64_t kf = 0; kf < shape_numel(kshape); ++kf) {
      const auto kc = coords(kf, kshape);
      std::vector<int64_t> xc{oc[0], oc[1]};
      bool inside = true, in_padded = true;
      for (size_t d = 0; d < r; ++d) {
        const int64_t i = oc[d + 2] * s.strides[d] - s.pads[d] + kc[d] * s.dilations[d];
        inside = inside && i >= 0 && i < x.dim(d + 2);
        in_padded = in_padded && i < x.dim(d + 2) + s.pads[d + r];
        xc.push_back(i);
      }
      if (s.count_pad && in_padded) ++count;
      if (!inside) continue;
      if (!s.count_pad) ++count;
      const int64_t xi = flat(xc, x.shape());
      const double v = vx[static_cast<size_t>(xi)];
      sum += v;
      if (v > best) {
        best = v;
        best_i = xi;
      }
    }
    y[static_cast<size_t>(o)] = kind == 0 ? best : sum / static_cast<double>(count);
    arg[static_cast<size_t>(o)] = best_i;
  }
  return {float_tensor(out, y), arg};
}

}  // namespace

TEST_CASE("MaxPool and AveragePool match naive windows on random shapes", "[nn]") {
  std::mt19937 rng(51);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t r = static_cast<size_t>(rand_int(rng, 1, 3));
    PoolSpec s;
    s.ceil = rng() % 2;
    s.count_pad = rng() % 2;
    s.pads.assign(2 * r, 0);
    Shape xs{rand_int(rng, 1, 2), rand_int(rng, 1, 3)};
    for (size_t d = 0; d < r; ++d) {
      const int64_t k = rand_int(rng, 1, 3);
      s.kernel.push_back(k);
      s.strides.push_back(rand_int(rng, 1, 3));
      s.dilations.push_back(rand_int(rng, 1, 2));
      s.pads[d] = rand_int(rng, 0, k - 1);
      s.pads[d + r] = rand_int(rng, 0, k - 1);
      const int64_t ek = (k - 1) * s.dilations[d] + 1;
      xs.push_back(std::max<int64_t>(ek - s.pads[d] - s.pads[d + r], 1) + rand_int(rng, 0, 6));
    }
    Tensor x = random_tensor(DataType::Float, xs, rng);
    INFO("x " << shape_to_string(xs) << " ceil " << s.ceil << " count_pad " << s.count_pad);
    auto configure = [&](OpTest& t) {
      t.input(x).attr("kernel_shape", s.kernel).attr("strides", s.strides);
      t.attr("dilations", s.dilations).attr("pads", s.pads).attr("ceil_mode", int64_t{s.ceil});
    };
    OpTest mp("MaxPool", 12);
    configure(mp);
    auto outs = mp.outputs(2).run();
    const auto [ymax, arg] = naive_pool(x, s, 0);
    require_close(outs[0].tensor(), ymax);
    const auto got_arg = values(outs[1].tensor());
    for (size_t i = 0; i < arg.size(); ++i) REQUIRE(got_arg[i] == static_cast<double>(arg[i]));
    OpTest mp_values("MaxPool", 12);  // without Indices: the float plane kernels
    configure(mp_values);
    require_close(mp_values.run1(), ymax);

    OpTest ap("AveragePool", 19);
    configure(ap);
    ap.attr("count_include_pad", int64_t{s.count_pad});
    require_close(ap.run1(), naive_pool(x, s, 1).first);
  }
}

TEST_CASE("MaxPool and AveragePool of wide 2-D planes match naive windows", "[nn]") {
  // Rows of up to 300 floats (several vectors, bands of output rows in the rows-first
  // kernel), windows of 1 to 5 taps at column strides 1 and 2 and row strides 1 to 3, pads at
  // one end or both, ceil_mode and count_include_pad.
  std::mt19937 rng(58);
  for (int iter = 0; iter < 40; ++iter) {
    PoolSpec s;
    s.ceil = rng() % 2;
    s.count_pad = rng() % 2;
    s.pads.assign(4, 0);
    Shape xs{1, rand_int(rng, 1, 3)};
    for (size_t d = 0; d < 2; ++d) {
      const int64_t k = rand_int(rng, 1, 5);
      s.kernel.push_back(k);
      s.strides.push_back(d == 1 ? rand_int(rng, 1, 2) : rand_int(rng, 1, 3));
      s.dilations.push_back(iter % 5 == 0 ? 2 : 1);
      const int64_t ek = (k - 1) * s.dilations[d] + 1;
      s.pads[d] = iter % 3 == 1 ? 0 : rand_int(rng, 0, k - 1);
      s.pads[d + 2] = iter % 3 == 2 ? 0 : rand_int(rng, 0, k - 1);
      const int64_t extent = d == 1 ? rand_int(rng, 20, 300) : rand_int(rng, 0, 40);
      xs.push_back(std::max<int64_t>(ek - s.pads[d] - s.pads[d + 2], 1) + extent);
    }
    Tensor x = random_tensor(DataType::Float, xs, rng);
    INFO("x " << shape_to_string(xs) << " ceil " << s.ceil << " count_pad " << s.count_pad);
    auto configure = [&](OpTest& t) {
      t.input(x).attr("kernel_shape", s.kernel).attr("strides", s.strides);
      t.attr("dilations", s.dilations).attr("pads", s.pads).attr("ceil_mode", int64_t{s.ceil});
    };
    OpTest mp("MaxPool", 12);
    configure(mp);
    require_close(mp.run1(), naive_pool(x, s, 0).first);
    OpTest ap("AveragePool", 19);
    configure(ap);
    ap.attr("count_include_pad", int64_t{s.count_pad});
    require_close(ap.run1(), naive_pool(x, s, 1).first, 1e-5, 1e-5);
  }
}

TEST_CASE("AveragePool over the whole plane and GlobalAveragePool match naive sums", "[nn]") {
  // A window as large as the unpadded input (one output per plane) takes each plane's vector
  // sum, as GlobalAveragePool does; planes of 1 to 3 dimensions, from 1 to 300 elements.
  std::mt19937 rng(52);
  for (int iter = 0; iter < 40; ++iter) {
    const size_t r = static_cast<size_t>(rand_int(rng, 1, 3));
    PoolSpec s;
    s.pads.assign(2 * r, 0);
    Shape xs{rand_int(rng, 1, 2), rand_int(rng, 1, 40)};
    for (size_t d = 0; d < r; ++d) {
      const int64_t k = rand_int(rng, 1, r == 1 ? 300 : r == 2 ? 17 : 6);
      s.kernel.push_back(k);
      s.strides.push_back(rand_int(rng, 1, 2));
      s.dilations.push_back(1);
      xs.push_back(k);
    }
    Tensor x = random_tensor(DataType::Float, xs, rng);
    INFO("x " << shape_to_string(xs));
    const Tensor expected = naive_pool(x, s, 1).first;
    OpTest ap("AveragePool", 19);
    ap.input(x).attr("kernel_shape", s.kernel).attr("strides", s.strides).attr("pads", s.pads);
    require_close(ap.run1(), expected);
    require_close(OpTest("GlobalAveragePool", 1).input(x).run1(), expected);
  }
}

TEST_CASE("Depthwise Conv and pooling of small planes match naive loops", "[nn]") {
  // The wide-form path (ops/conv/wide_layout.h): channel counts that fill no vector evenly,
  // 3x3 and 5x5 windows with padding and dilation, stride 1 (and stride 2, the direct
  // kernels), MaxPool without indices.
  std::mt19937 rng(53);
  for (int iter = 0; iter < 40; ++iter) {
    const int64_t c = rand_int(rng, 1, 37), k = iter % 2 ? 3 : 5;
    const int64_t stride = iter % 5 == 4 ? 2 : 1, dil = iter % 7 == 6 ? 2 : 1;
    const int64_t pad = rand_int(rng, 0, k / 2);
    const int64_t ek = (k - 1) * dil + 1;
    const Shape xs{rand_int(rng, 1, 2), c,
                   std::max<int64_t>(ek - 2 * pad, 1) + rand_int(rng, 0, 16),
                   std::max<int64_t>(ek - 2 * pad, 1) + rand_int(rng, 0, 16)};
    Tensor x = random_tensor(DataType::Float, xs, rng);
    Tensor w = random_tensor(DataType::Float, {c, 1, k, k}, rng);
    Tensor b = random_tensor(DataType::Float, {c}, rng);
    INFO("x " << shape_to_string(xs) << " k " << k << " stride " << stride << " dil " << dil
              << " pad " << pad);
    const ConvSpec s{{stride, stride}, {dil, dil}, {pad, pad, pad, pad}, c};
    require_close(run_conv(x, w, &b, s), naive_conv(x, w, &b, s), 1e-4, 1e-4);

    PoolSpec ps;
    ps.kernel = {k, k};
    ps.strides = {stride, stride};
    ps.dilations = {dil, dil};
    ps.pads = {pad, pad, pad, pad};
    ps.count_pad = iter % 3 == 0;
    auto configure = [&](OpTest& t) {
      t.input(x).attr("kernel_shape", ps.kernel).attr("strides", ps.strides);
      t.attr("dilations", ps.dilations).attr("pads", ps.pads);
    };
    OpTest mp("MaxPool", 12);
    configure(mp);
    require_close(mp.run1(), naive_pool(x, ps, 0).first);
    OpTest ap("AveragePool", 19);
    configure(ap);
    ap.attr("count_include_pad", int64_t{ps.count_pad});
    require_close(ap.run1(), naive_pool(x, ps, 1).first, 1e-5, 1e-5);
  }
}

TEST_CASE("Depthwise Conv of a block of channels at once matches a naive loop", "[nn]") {
  // Output planes of at most 8x8 (ConvKernels::depthwise_lanes: a channel per vector lane):
  // channel counts around the vector widths, rectangular kernels of 1 to 7 taps, strides 1 to
  // 3, dilation, uneven pads, with and without a bias, and the fused Conv + Add (Z) + Relu.
  std::mt19937 rng(57);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t c = iter < 6 ? int64_t{4} << (iter % 3) : rand_int(rng, 1, 40);
    const int64_t kh = rand_int(rng, 1, 7), kw = rand_int(rng, 1, 7);
    const int64_t sh = rand_int(rng, 1, 3), sw = rand_int(rng, 1, 3);
    const int64_t dh = rand_int(rng, 1, 2), dw = rand_int(rng, 1, 2);
    const std::vector<int64_t> pads{rand_int(rng, 0, 3), rand_int(rng, 0, 3), rand_int(rng, 0, 3),
                                    rand_int(rng, 0, 3)};
    const int64_t oh = rand_int(rng, 1, 8), ow = rand_int(rng, 1, 8);
    const int64_t eh = (kh - 1) * dh + 1, ew = (kw - 1) * dw + 1;
    const int64_t h = std::max<int64_t>((oh - 1) * sh + eh - pads[0] - pads[2], 1);
    const int64_t w = std::max<int64_t>((ow - 1) * sw + ew - pads[1] - pads[3], 1);
    const Shape xs{rand_int(rng, 1, 2), c, h, w};
    Tensor x = random_tensor(DataType::Float, xs, rng);
    Tensor wt = random_tensor(DataType::Float, {c, 1, kh, kw}, rng);
    Tensor b = random_tensor(DataType::Float, {c}, rng);
    INFO("x " << shape_to_string(xs) << " k " << kh << "x" << kw << " strides " << sh << "," << sw
              << " dilations " << dh << "," << dw);
    const ConvSpec s{{sh, sw}, {dh, dw}, pads, c};
    const Tensor* bias = iter % 3 ? &b : nullptr;
    const Tensor want = naive_conv(x, wt, bias, s);
    require_close(run_conv(x, wt, bias, s), want, 1e-4, 1e-4);
    if (iter % 4 != 0) continue;
    // Fused with Z and Relu (constant filter and bias, as the optimizer requires).
    Tensor z = random_tensor(DataType::Float, want.shape(), rng);
    GraphBuilder gb;
    gb.input("x", DataType::Float, xs).input("z", DataType::Float, want.shape());
    gb.initializer("w", wt).initializer("b", b);
    gb.node("Conv", {"x", "w", "b"}, {"c"},
            {ints_attr("strides", s.strides), ints_attr("dilations", s.dilations),
             ints_attr("pads", s.pads), int_attr("group", c)});
    gb.node("Add", {"c", "z"}, {"s"});
    gb.node("Relu", {"s"}, {"y"});
    gb.output("y");
    Session session = make_session(gb.build(), 13, 2);
    const Tensor with_bias = naive_conv(x, wt, &b, s);
    std::vector<double> fused(static_cast<size_t>(want.numel()));
    for (size_t i = 0; i < fused.size(); ++i)
      fused[i] = std::max(0.0, double(with_bias.data<const float>()[i]) + z.data<const float>()[i]);
    require_close(session.run({{"x", x}, {"z", z}}).at(0).value.tensor(),
                  float_tensor(want.shape(), fused), 1e-4, 1e-4);
  }
}

TEST_CASE("MaxPool reports column-major indices with storage_order 1", "[nn]") {
  Tensor x = Tensor::from_vector<float>({1, 1, 2, 3}, {1, 9, 2, 8, 3, 17});
  auto outs = OpTest("MaxPool", 12)
                  .input(x)
                  .attr("kernel_shape", Ints{2, 2})
                  .attr("storage_order", 1)
                  .outputs(2)
                  .run();
  // Maxima 9 at (0,1) and 17 at (1,2): column-major offsets 0 + 1*2 = 2 and 1 + 2*2 = 5.
  CHECK(values(outs[0].tensor()) == std::vector<double>{9, 17});
  CHECK(values(outs[1].tensor()) == std::vector<double>{2, 5});
}

TEST_CASE("Pooling an empty input under padding gives empty windows' values", "[nn]") {
  // Width 0 padded to windows that lie wholly in the padding (a graph the fuzzer made): the
  // float plane kernels size their loads by the input's rows and must not be reached.
  const float inf = std::numeric_limits<float>::infinity();
  for (const Shape& xs : {Shape{3, 3, 0}, Shape{1, 2, 1, 0}}) {
    const size_t r = xs.size() - 2;
    const Tensor x = Tensor::zeros(DataType::Float, xs);
    Ints kernel(r, 1);
    kernel.back() = 3;
    Ints pads(2 * r, 0);
    pads[r - 1] = 3;
    Shape ys = xs;
    ys.back() = 1;
    OpTest mp("MaxPool", 12);
    mp.input(x).attr("kernel_shape", kernel).attr("pads", pads);
    const Tensor ymax = mp.run1();
    REQUIRE(ymax.shape() == ys);
    CHECK(values(ymax) == std::vector<double>(static_cast<size_t>(shape_numel(ys)), -inf));
    OpTest mpi("MaxPool", 12);  // with Indices: the generic loop agrees
    mpi.input(x).attr("kernel_shape", kernel).attr("pads", pads).outputs(2);
    CHECK(values(mpi.run()[0].tensor()) == values(ymax));
    for (const int64_t count_pad : {0, 1}) {
      OpTest ap("AveragePool", 19);
      ap.input(x).attr("kernel_shape", kernel).attr("pads", pads);
      ap.attr("count_include_pad", count_pad);
      const Tensor y = ap.run1();
      REQUIRE(y.shape() == ys);
      CHECK(values(y) == std::vector<double>(static_cast<size_t>(shape_numel(ys)), 0.0));
    }
  }
}

TEST_CASE("Pooling rejects bad attributes", "[nn]") {
  std::mt19937 rng(52);
  Tensor x = random_tensor(DataType::Float, {1, 1, 4, 4}, rng);
  REQUIRE_THROWS_AS(OpTest("MaxPool", 12).input(x).run(), Error);  // no kernel_shape
  REQUIRE_THROWS_AS(OpTest("MaxPool", 12).input(x).attr("kernel_shape", Ints{2}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("AveragePool", 19)
                        .input(x)
                        .attr("kernel_shape", Ints{2, 2})
                        .attr("strides", Ints{0, 1})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("MaxPool", 12).input(x).attr("kernel_shape", Ints{6, 6}).run(), Error);
}

// ---- Normalisation, LRN, unpooling ----

TEST_CASE("BatchNormalization and InstanceNormalization match their formulas", "[nn]") {
  std::mt19937 rng(61);
  Tensor x = random_tensor(DataType::Float, {2, 3, 4, 5}, rng);
  Tensor scale = random_tensor(DataType::Float, {3}, rng);
  Tensor bias = random_tensor(DataType::Float, {3}, rng);
  Tensor mean = random_tensor(DataType::Float, {3}, rng);
  Tensor var = random_tensor(DataType::Float, {3}, rng, 0.1, 2);
  const auto vx = values(x), vs = values(scale), vb = values(bias), vm = values(mean),
             vv = values(var);
  std::vector<double> bn(vx.size()), in(vx.size());
  for (size_t i = 0; i < vx.size(); ++i) {
    const size_t c = (i / 20) % 3;
    bn[i] = vs[c] * (vx[i] - vm[c]) / std::sqrt(vv[c] + 1e-5) + vb[c];
  }
  require_close(OpTest("BatchNormalization", 15)
                    .input(x)
                    .input(scale)
                    .input(bias)
                    .input(mean)
                    .input(var)
                    .run1(),
                float_tensor(x.shape(), bn));
  for (size_t p = 0; p < 6; ++p) {
    double mu = 0, sq = 0;
    for (size_t i = 0; i < 20; ++i) mu += vx[p * 20 + i] / 20;
    for (size_t i = 0; i < 20; ++i) sq += (vx[p * 20 + i] - mu) * (vx[p * 20 + i] - mu) / 20;
    for (size_t i = 0; i < 20; ++i) {
      in[p * 20 + i] = vs[p % 3] * (vx[p * 20 + i] - mu) / std::sqrt(sq + 1e-5) + vb[p % 3];
    }
  }
  require_close(OpTest("InstanceNormalization", 6).input(x).input(scale).input(bias).run1(),
                float_tensor(x.shape(), in));
  Tensor short_mean = random_tensor(DataType::Float, {2}, rng);
  REQUIRE_THROWS_AS(OpTest("BatchNormalization", 15)
                        .input(x)
                        .input(scale)
                        .input(bias)
                        .input(short_mean)
                        .input(var)
                        .run(),
                    Error);
}

TEST_CASE("LRN matches the cross-channel formula", "[nn]") {
  std::mt19937 rng(62);
  Tensor x = random_tensor(DataType::Float, {2, 7, 3, 3}, rng);
  const auto vx = values(x);
  std::vector<double> y(vx.size());
  const int64_t size = 4;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto c = coords(i, x.shape());
    double sq = 0;
    for (int64_t k = std::max<int64_t>(0, c[1] - 1); k <= std::min<int64_t>(6, c[1] + 2); ++k) {
      auto cc = c;
      cc[1] = k;
      sq += vx[static_cast<size_t>(flat(cc, x.shape()))] *
            vx[static_cast<size_t>(flat(cc, x.shape()))];
    }
    y[static_cast<size_t>(i)] = vx[static_cast<size_t>(i)] / std::pow(2.0 + 0.5 / size * sq, 0.75);
  }
  require_close(
      OpTest("LRN", 13).input(x).attr("size", size).attr("alpha", 0.5).attr("bias", 2.0).run1(),
      float_tensor(x.shape(), y));
  REQUIRE_THROWS_AS(OpTest("LRN", 13).input(x).attr("size", 0).run(), Error);
}

TEST_CASE("MaxUnpool inverts MaxPool and rejects out-of-range indices", "[nn]") {
  std::mt19937 rng(63);
  Tensor x = random_tensor(DataType::Float, {1, 2, 4, 4}, rng);
  auto pooled = OpTest("MaxPool", 12)
                    .input(x)
                    .attr("kernel_shape", Ints{2, 2})
                    .attr("strides", Ints{2, 2})
                    .outputs(2)
                    .run();
  Tensor y = OpTest("MaxUnpool", 11)
                 .input(pooled[0])
                 .input(pooled[1])
                 .attr("kernel_shape", Ints{2, 2})
                 .attr("strides", Ints{2, 2})
                 .run1();
  const auto vx = values(x), vy = values(y), ind = values(pooled[1].tensor());
  for (size_t i = 0; i < vy.size(); ++i) {
    const bool kept = std::find(ind.begin(), ind.end(), static_cast<double>(i)) != ind.end();
    REQUIRE(vy[i] == (kept ? vx[i] : 0.0));
  }
  Tensor bad = Tensor::from_vector<int64_t>({1, 1, 1, 1}, {16});
  Tensor one = Tensor::from_vector<float>({1, 1, 1, 1}, {1});
  REQUIRE_THROWS_AS(OpTest("MaxUnpool", 11)
                        .input(one)
                        .input(bad)
                        .attr("kernel_shape", Ints{4, 4})
                        .attr("strides", Ints{4, 4})
                        .run(),
                    Error);
}

TEST_CASE("Empty tensors flow through the NN kernels", "[nn]") {
  std::mt19937 rng(71);
  Tensor a0 = random_tensor(DataType::Float, {0, 3}, rng);
  Tensor b = random_tensor(DataType::Float, {3, 4}, rng);
  CHECK(OpTest("MatMul", 13).input(a0).input(b).run1().shape() == Shape{0, 4});
  Tensor ak = random_tensor(DataType::Float, {2, 0}, rng);
  Tensor bk = random_tensor(DataType::Float, {0, 3}, rng);
  CHECK(values(OpTest("MatMul", 13).input(ak).input(bk).run1()) == std::vector<double>(6, 0.0));
  CHECK(values(OpTest("Gemm", 13).input(ak).input(bk).run1()) == std::vector<double>(6, 0.0));
  Tensor x0 = random_tensor(DataType::Float, {0, 2, 5, 5}, rng);
  Tensor w = random_tensor(DataType::Float, {3, 2, 3, 3}, rng);
  CHECK(OpTest("Conv", 11).input(x0).input(w).run1().shape() == Shape{0, 3, 3, 3});
  CHECK(OpTest("MaxPool", 12).input(x0).attr("kernel_shape", Ints{2, 2}).run1().shape() ==
        Shape{0, 2, 4, 4});
  CHECK(OpTest("GlobalAveragePool", 1).input(x0).run1().shape() == Shape{0, 2, 1, 1});
  Tensor no_rows = random_tensor(DataType::Float, {1, 1, 0, 3}, rng);
  CHECK(OpTest("MaxPool", 12)
            .input(no_rows)
            .attr("kernel_shape", Ints{2, 2})
            .attr("auto_pad", "SAME_UPPER")
            .run1()
            .shape() == Shape{1, 1, 0, 3});
}

TEST_CASE("Huge attributes and output shapes are errors, not overflows", "[nn]") {
  std::mt19937 rng(72);
  Tensor x = random_tensor(DataType::Float, {1, 1, 4, 4}, rng);
  Tensor w = random_tensor(DataType::Float, {1, 1, 2, 2}, rng);
  const int64_t huge = int64_t{1} << 40;
  REQUIRE_THROWS_AS(
      OpTest("Conv", 11).input(x).input(w).attr("pads", Ints{huge, huge, huge, huge}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("ConvTranspose", 11)
                        .input(x)
                        .input(w)
                        .attr("strides", Ints{int64_t{1} << 30, int64_t{1} << 30})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("MaxPool", 12)
                        .input(x)
                        .attr("kernel_shape", Ints{2, 2})
                        .attr("pads", Ints{huge, 0, huge, 0})
                        .run(),
                    Error);
  Tensor ind = Tensor::from_vector<int64_t>({1, 1, 1, 1}, {0});
  Tensor one = Tensor::from_vector<float>({1, 1, 1, 1}, {1});
  Tensor big_shape = Tensor::from_vector<int64_t>({4}, {1, 1, huge, huge});
  REQUIRE_THROWS_AS(OpTest("MaxUnpool", 11)
                        .input(one)
                        .input(ind)
                        .input(big_shape)
                        .attr("kernel_shape", Ints{2, 2})
                        .run(),
                    Error);
}

TEST_CASE("Conv, Gemm and pooling compute half types in float and keep double", "[nn]") {
  std::mt19937 rng(73);
  Tensor x = random_tensor(DataType::Float16, {1, 4, 6, 6}, rng);
  Tensor w = random_tensor(DataType::Float16, {6, 2, 3, 3}, rng);
  Tensor b = random_tensor(DataType::Float16, {6}, rng);
  ConvSpec s{{1, 1}, {1, 1}, {1, 1, 1, 1}, 2};
  Tensor y = run_conv(x, w, &b, s);
  REQUIRE(y.dtype() == DataType::Float16);
  require_close(float_tensor(y.shape(), values(y)), naive_conv(x, w, &b, s), 1e-2, 1e-2);

  Tensor xd = random_tensor(DataType::Double, {2, 3, 5, 4}, rng);
  Tensor wd = random_tensor(DataType::Double, {2, 3, 2, 2}, rng);
  ConvSpec sd{{1, 2}, {2, 1}, {0, 1, 1, 0}, 1};
  Tensor yd = run_conv(xd, wd, nullptr, sd);
  REQUIRE(yd.dtype() == DataType::Double);
  require_close(float_tensor(yd.shape(), values(yd)), naive_conv(xd, wd, nullptr, sd));

  Tensor a = random_tensor(DataType::Float16, {3, 5}, rng);
  Tensor bm = random_tensor(DataType::Float16, {4, 5}, rng);
  Tensor c = random_tensor(DataType::Float16, {4}, rng);
  Tensor g = OpTest("Gemm", 13).input(a).input(bm).input(c).attr("transB", 1).run1();
  REQUIRE(g.dtype() == DataType::Float16);
  const auto va = values(a), vb = values(bm), vc = values(c), vg = values(g);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      double e = vc[static_cast<size_t>(j)];
      for (int64_t k = 0; k < 5; ++k) {
        e += va[static_cast<size_t>(i * 5 + k)] * vb[static_cast<size_t>(j * 5 + k)];
      }
      REQUIRE(vg[static_cast<size_t>(i * 4 + j)] == Approx(e).margin(2e-2));
    }

  PoolSpec ps{{2, 2}, {1, 1}, {1, 1}, {0, 0, 0, 0}};
  Tensor hp = OpTest("AveragePool", 19).input(x).attr("kernel_shape", Ints{2, 2}).run1();
  REQUIRE(hp.dtype() == DataType::Float16);
  require_close(float_tensor(hp.shape(), values(hp)), naive_pool(x, ps, 1).first, 1e-2, 1e-2);
  Tensor u8 = random_tensor(DataType::UInt8, {1, 2, 4, 4}, rng, 0, 255);
  Tensor mp = OpTest("MaxPool", 12).input(u8).attr("kernel_shape", Ints{2, 2}).run1();
  REQUIRE(mp.dtype() == DataType::UInt8);
  CHECK(values(mp) == values(naive_pool(u8, ps, 0).first));
}
