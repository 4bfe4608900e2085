// onnxruntime's dynamically quantized contrib ops (com.microsoft DynamicQuantizeMatMul,
// MatMulIntegerToFloat, QGemm, DynamicQuantizeLSTM) against naive double references written
// here from onnxruntime's ContribOperators.md and its CPU kernels: random odd shapes,
// unsigned and signed weights, per-tensor and per-column scales and zero points, constant and
// run-time weights, and bad inputs failing with an Error naming the node. ctest runs this
// suite again at every instruction-set level (KILN_ISA), so each int8 tile is covered.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/math/qgemm.h"
#include "test/unit/isa_test.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr const char* kMs = "com.microsoft";

Tensor scalar_f(float v) {
  Tensor t = Tensor::zeros(DataType::Float, {});
  t.data<float>()[0] = v;
  return t;
}

Tensor int_tensor(DataType dt, Shape shape, const std::vector<int>& v) {
  Tensor t = Tensor::zeros(dt, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DataType::Int8) {
      t.data<int8_t>()[i] = static_cast<int8_t>(v[i]);
    } else if (dt == DataType::UInt8) {
      t.data<uint8_t>()[i] = static_cast<uint8_t>(v[i]);
    } else {
      t.data<int32_t>()[i] = v[i];
    }
  }
  return t;
}

// onnxruntime's dynamic quantization of an activation, written out in float as its kernel
// does: the values as quantized integers, with the scale and zero point.
struct Quantized {
  std::vector<int> q;
  float scale;
  int zero;
};

Quantized quantize(const Tensor& x) {
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, static_cast<float>(element(x, i)));
    hi = std::max(hi, static_cast<float>(element(x, i)));
  }
  Quantized r;
  r.scale = hi == lo ? 1.0f / 255.0f : (hi - lo) / 255.0f;
  r.zero = static_cast<int>(std::nearbyint(std::clamp(-lo / r.scale, 0.0f, 255.0f)));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float q = std::nearbyint(static_cast<float>(element(x, i)) / r.scale) + r.zero;
    r.q.push_back(static_cast<int>(std::clamp(q, 0.0f, 255.0f)));
  }
  return r;
}

// sum_k (a[i,k] - za) (b[k,j] - zb_j) for row-major a [m, k], b [k, n].
std::vector<double> int_product(const std::vector<int>& a, int za, const Tensor& b,
                                const std::vector<int>& zb, int64_t m, int64_t k, int64_t n) {
  std::vector<double> r(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) {
        s += static_cast<double>(a[static_cast<size_t>(i * k + q)] - za) *
             (element(b, q * n + j) - zb[zb.size() == 1 ? 0 : static_cast<size_t>(j)]);
      }
      r[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return r;
}

struct Weights {
  Tensor b, scale, zero;
  std::vector<float> scales;
  std::vector<int> zeros;
};

// A random [k, n] weight, per column or per tensor, with its scales and zero points.
Weights random_weights(std::mt19937& rng, int64_t k, int64_t n, bool is_signed, bool per_col) {
  Weights w;
  const DataType dt = is_signed ? DataType::Int8 : DataType::UInt8;
  w.b = random_tensor(dt, {k, n}, rng, is_signed ? -128 : 0, is_signed ? 127 : 255);
  const int64_t count = per_col ? n : 1;
  std::uniform_real_distribution<float> s(0.001f, 0.02f);
  std::uniform_int_distribution<int> z(is_signed ? -20 : 100, is_signed ? 20 : 150);
  for (int64_t j = 0; j < count; ++j) {
    w.scales.push_back(s(rng));
    w.zeros.push_back(z(rng));
  }
  w.scale = per_col ? Tensor::zeros(DataType::Float, {n}) : Tensor::zeros(DataType::Float, {});
  std::copy(w.scales.begin(), w.scales.end(), w.scale.data<float>());
  w.zero = int_tensor(dt, per_col ? Shape{n} : Shape{}, w.zeros);
  return w;
}

}  // namespace

TEST_CASE("DynamicQuantizeMatMul and MatMulIntegerToFloat match a double reference",
          "[ops][contrib][quant]") {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t batch = 1 + trial % 3, m = 1 + (trial * 7) % 13, k = 1 + (trial * 11) % 70,
                  n = 1 + (trial * 5) % 37;
    const bool is_signed = trial % 2 == 1, per_col = trial % 4 >= 2, constant = trial % 3 != 0;
    const bool with_bias = trial % 5 != 0;
    INFO("trial " << trial << " batch " << batch << " m " << m << " k " << k << " n " << n
                  << " signed " << is_signed << " per column " << per_col);
    const Weights w = random_weights(rng, k, n, is_signed, per_col);
    const Tensor bias = random_tensor(DataType::Float, {n}, rng, -1, 1);
    const Tensor x = random_tensor(DataType::Float, {batch, m, k}, rng, -3, 2);

    // DynamicQuantizeMatMul: x quantized as onnxruntime does, then the scaled product.
    const Quantized qx = quantize(x);
    std::vector<double> want = int_product(qx.q, qx.zero, w.b, w.zeros, batch * m, k, n);
    for (size_t i = 0; i < want.size(); ++i) {
      const size_t j = i % static_cast<size_t>(n);
      want[i] = want[i] * static_cast<double>(qx.scale * w.scales[per_col ? j : 0]) +
                (with_bias ? element(bias, static_cast<int64_t>(j)) : 0.0);
    }
    OpTest dq("DynamicQuantizeMatMul", 1, kMs);
    dq.input(x);
    if (constant) {
      dq.constant_input(w.b);
    } else {
      dq.input(w.b);
    }
    dq.input(w.scale).input(w.zero);
    if (with_bias) dq.input(bias);
    require_near(dq.run1(), want, 1e-5);

    // MatMulIntegerToFloat with an 8-bit A of its own scale and zero point.
    const bool a_signed = is_signed && trial % 3 == 1;
    const DataType at = a_signed ? DataType::Int8 : DataType::UInt8;
    const Tensor a =
        random_tensor(at, {batch, m, k}, rng, a_signed ? -128 : 0, a_signed ? 127 : 255);
    std::vector<int> av;
    for (int64_t i = 0; i < a.numel(); ++i) av.push_back(static_cast<int>(element(a, i)));
    const int za = a_signed ? -3 : 131;
    const float sa = 0.037f;
    std::vector<double> want2 = int_product(av, za, w.b, w.zeros, batch * m, k, n);
    for (size_t i = 0; i < want2.size(); ++i) {
      const size_t j = i % static_cast<size_t>(n);
      want2[i] = want2[i] * static_cast<double>(sa * w.scales[per_col ? j : 0]) +
                 (with_bias ? element(bias, static_cast<int64_t>(j)) : 0.0);
    }
    OpTest mi("MatMulIntegerToFloat", 1, kMs);
    mi.input(a);
    if (constant) {
      mi.constant_input(w.b);
    } else {
      mi.input(w.b);
    }
    mi.input(scalar_f(sa)).input(w.scale).input(int_tensor(at, {}, {za})).input(w.zero);
    if (with_bias) mi.input(bias);
    require_near(mi.run1(), want2, 1e-5);
  }
}

TEST_CASE("DynamicQuantizeMatMul takes batched weights with per-matrix column scales",
          "[ops][contrib][quant]") {
  std::mt19937 rng(5);
  const int64_t m = 3, k = 9, n = 5;
  const Tensor x = random_tensor(DataType::Float, {2, m, k}, rng, -1, 1);
  const Tensor b = random_tensor(DataType::Int8, {2, k, n}, rng, -128, 127);
  Tensor scale = random_tensor(DataType::Float, {2, 1, n}, rng, 0.001, 0.01);
  const Tensor zero = Tensor::zeros(DataType::Int8, {2, 1, n});
  const Quantized qx = quantize(x);
  std::vector<double> want;
  for (int64_t bi = 0; bi < 2; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) {
          s += (qx.q[static_cast<size_t>((bi * m + i) * k + q)] - qx.zero) *
               element(b, (bi * k + q) * n + j);
        }
        want.push_back(s * static_cast<double>(qx.scale * scale.data<float>()[bi * n + j]));
      }
    }
  }
  require_near(
      OpTest("DynamicQuantizeMatMul", 1, kMs).input(x).input(b).input(scale).input(zero).run1(),
      want, 1e-5);
}

TEST_CASE("QGemm matches a double reference", "[ops][contrib][quant]") {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t m = 1 + (trial * 5) % 11, k = 1 + (trial * 13) % 67, n = 1 + (trial * 7) % 29;
    const bool ta = trial % 2 == 1, tb = trial % 4 >= 2, per_col = trial % 3 == 0;
    const bool b_signed = trial % 5 < 3, a_signed = b_signed && trial % 2 == 0;
    const int out_kind = trial % 3;  // 0 float, 1 uint8 / int8 like A, 2 float with C
    INFO("trial " << trial << " m " << m << " k " << k << " n " << n << " transA " << ta
                  << " transB " << tb);
    const Weights w = random_weights(rng, k, n, b_signed, per_col);
    const DataType at = a_signed ? DataType::Int8 : DataType::UInt8;
    const Tensor a = random_tensor(at, {m, k}, rng, a_signed ? -128 : 0, a_signed ? 127 : 255);
    std::vector<int> av;
    for (int64_t i = 0; i < a.numel(); ++i) av.push_back(static_cast<int>(element(a, i)));
    // Operands as QGemm reads them: A^T stored when transA, B^T when transB.
    Tensor a_in = a, b_in = w.b;
    if (ta) {
      a_in = Tensor::zeros(at, {k, m});
      for (int64_t i = 0; i < m; ++i)
        for (int64_t q = 0; q < k; ++q)
          std::memcpy(a_in.raw_data() + q * m + i, a.raw_data() + i * k + q, 1);
    }
    if (tb) {
      b_in = Tensor::zeros(w.b.dtype(), {n, k});
      for (int64_t q = 0; q < k; ++q)
        for (int64_t j = 0; j < n; ++j)
          std::memcpy(b_in.raw_data() + j * k + q, w.b.raw_data() + q * n + j, 1);
    }
    const int za = a_signed ? 4 : 120;
    const float sa = 0.021f, alpha = trial % 4 == 1 ? 0.5f : 1.0f;
    std::vector<double> sums = int_product(av, za, w.b, w.zeros, m, k, n);
    std::vector<int> cv;
    Shape c_shape;
    if (out_kind != 0) {
      c_shape = trial % 2 ? Shape{n} : Shape{m, n};
      std::uniform_int_distribution<int> d(-5000, 5000);
      for (int64_t i = 0; i < shape_numel(c_shape); ++i) cv.push_back(d(rng));
      for (size_t i = 0; i < sums.size(); ++i) {
        sums[i] += cv[c_shape.size() == 1 ? i % static_cast<size_t>(n) : i];
      }
    }
    OpTest q("QGemm", 1, kMs);
    q.attr("transA", ta ? 1 : 0).attr("transB", tb ? 1 : 0).attr("alpha", alpha);
    q.input(a_in).input(scalar_f(sa)).input(int_tensor(at, {}, {za}));
    if (trial % 3 != 2) {
      q.constant_input(b_in);
    } else {
      q.input(b_in);
    }
    q.input(w.scale).input(w.zero);
    if (out_kind != 0) {
      q.input(int_tensor(DataType::Int32, c_shape, cv));
    } else {
      q.no_input();
    }
    std::vector<double> want(sums.size());
    const float ys = 0.8f;
    const int zy = a_signed ? -7 : 128;
    for (size_t i = 0; i < sums.size(); ++i) {
      const size_t j = i % static_cast<size_t>(n);
      const float s = alpha * sa * w.scales[per_col ? j : 0];
      if (out_kind == 1) {
        const double v = std::nearbyint(sums[i] * static_cast<double>(s / ys)) + zy;
        want[i] = std::clamp(v, a_signed ? -128.0 : 0.0, a_signed ? 127.0 : 255.0);
      } else {
        want[i] = sums[i] * static_cast<double>(s);
      }
    }
    if (out_kind == 1) q.input(scalar_f(ys)).input(int_tensor(at, {}, {zy}));
    const Tensor y = q.run1();
    if (out_kind == 1) {
      REQUIRE(y.dtype() == at);
      // Requantized: exact but for a product landing within float rounding of a half.
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("element " << i);
        REQUIRE(std::fabs(element(y, static_cast<int64_t>(i)) - want[i]) <= 1.0);
      }
    } else {
      require_near(y, want, 1e-5);
    }
  }
}

TEST_CASE("the dynamically quantized matmuls reject bad inputs naming the node",
          "[ops][contrib][quant]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 4});
  const Tensor b = Tensor::zeros(DataType::Int8, {4, 3});
  REQUIRE_THROWS_WITH(OpTest("DynamicQuantizeMatMul", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Int8, {5, 3}))
                          .input(scalar_f(1))
                          .run(),
                      Catch::Contains("DynamicQuantizeMatMul") && Catch::Contains("K"));
  REQUIRE_THROWS_WITH(OpTest("DynamicQuantizeMatMul", 1, kMs)
                          .input(x)
                          .input(b)
                          .input(Tensor::zeros(DataType::Float, {2}))
                          .run(),
                      Catch::Contains("DynamicQuantizeMatMul") && Catch::Contains("scale"));
  REQUIRE_THROWS_WITH(OpTest("DynamicQuantizeMatMul", 1, kMs)
                          .input(x)
                          .input(b)
                          .input(scalar_f(1))
                          .input(Tensor::zeros(DataType::UInt8, {}))
                          .run(),
                      Catch::Contains("DynamicQuantizeMatMul") && Catch::Contains("zero point"));
  REQUIRE_THROWS_WITH(OpTest("MatMulIntegerToFloat", 1, kMs)
                          .input(x)
                          .input(b)
                          .input(scalar_f(1))
                          .input(scalar_f(1))
                          .run(),
                      Catch::Contains("MatMulIntegerToFloat") && Catch::Contains("uint8"));
  REQUIRE_THROWS_WITH(OpTest("QGemm", 1, kMs)
                          .input(Tensor::zeros(DataType::UInt8, {2, 4}))
                          .input(scalar_f(1))
                          .input(Tensor::zeros(DataType::UInt8, {}))
                          .input(b)
                          .input(scalar_f(1))
                          .input(Tensor::zeros(DataType::Int8, {}))
                          .input(Tensor::zeros(DataType::Int32, {3, 3}))
                          .run(),
                      Catch::Contains("QGemm") && Catch::Contains("C"));
}

namespace {

double sigmoid(double v) {
  return 1 / (1 + std::exp(-v));
}

// DynamicQuantizeLSTM's reference for one direction (gate order i, o, f, c): the projection of
// X and each step's H quantized per tensor (in float, as onnxruntime does), the integer sums
// exact, the cell arithmetic in double. Returns Y [seq, batch, hidden] of the direction.
std::vector<double> lstm_reference(const Tensor& x, const Tensor& w, const Tensor& r,
                                   const std::vector<float>& ws, const std::vector<int>& wz,
                                   const std::vector<float>& rs, const std::vector<int>& rz,
                                   const Tensor& bias, const Tensor& h0, const Tensor& c0,
                                   int64_t d, bool reverse) {
  const int64_t seq = x.dim(0), batch = x.dim(1), in = x.dim(2), hs = r.dim(1), gh = 4 * hs;
  auto weight = [](const Tensor& t, int64_t d, int64_t k, int64_t j) {
    return element(t, (d * t.dim(1) + k) * t.dim(2) + j);
  };
  auto pick = [](const auto& v, int64_t d, int64_t j, int64_t n) {
    return v.size() == 2 || v.size() == 1 ? v[static_cast<size_t>(v.size() == 1 ? 0 : d)]
                                          : v[static_cast<size_t>(d * n + j)];
  };
  const Quantized qx = quantize(x);
  std::vector<double> h(static_cast<size_t>(batch * hs)), c(h.size()), y;
  for (int64_t i = 0; i < batch * hs; ++i) {
    h[static_cast<size_t>(i)] = element(h0, d * batch * hs + i);
    c[static_cast<size_t>(i)] = element(c0, d * batch * hs + i);
  }
  y.assign(static_cast<size_t>(seq * batch * hs), 0.0);
  for (int64_t s = 0; s < seq; ++s) {
    const int64_t t = reverse ? seq - 1 - s : s;
    Tensor hf = Tensor::zeros(DataType::Float, {batch, hs});
    for (size_t i = 0; i < h.size(); ++i) hf.data<float>()[i] = static_cast<float>(h[i]);
    const Quantized qh = quantize(hf);
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<double> g(static_cast<size_t>(gh));
      for (int64_t j = 0; j < gh; ++j) {
        double sx = 0, sh = 0;
        for (int64_t k = 0; k < in; ++k) {
          sx += (qx.q[static_cast<size_t>((t * batch + b) * in + k)] - qx.zero) *
                (weight(w, d, k, j) - pick(wz, d, j, gh));
        }
        for (int64_t k = 0; k < hs; ++k) {
          sh += (qh.q[static_cast<size_t>(b * hs + k)] - qh.zero) *
                (weight(r, d, k, j) - pick(rz, d, j, gh));
        }
        g[static_cast<size_t>(j)] = sx * static_cast<double>(qx.scale * pick(ws, d, j, gh)) +
                                    sh * static_cast<double>(qh.scale * pick(rs, d, j, gh)) +
                                    element(bias, d * 2 * gh + j) +
                                    element(bias, d * 2 * gh + gh + j);
      }
      for (int64_t j = 0; j < hs; ++j) {
        const size_t at = static_cast<size_t>(b * hs + j);
        const double gi = sigmoid(g[static_cast<size_t>(j)]);
        const double go = sigmoid(g[static_cast<size_t>(hs + j)]);
        const double gf = sigmoid(g[static_cast<size_t>(2 * hs + j)]);
        const double gc = std::tanh(g[static_cast<size_t>(3 * hs + j)]);
        c[at] = gf * c[at] + gi * gc;
        h[at] = go * std::tanh(c[at]);
        y[static_cast<size_t>((t * batch + b) * hs + j)] = h[at];
      }
    }
  }
  return y;
}

}  // namespace

TEST_CASE("DynamicQuantizeLSTM matches a double reference", "[ops][contrib][quant]") {
  std::mt19937 rng(29);
  const char* directions[] = {"forward", "reverse", "bidirectional"};
  for (int trial = 0; trial < 9; ++trial) {
    const int64_t seq = 1 + trial % 4, batch = 1 + (trial * 3) % 4, in = 3 + (trial * 5) % 11,
                  hs = 2 + (trial * 7) % 13;
    const std::string dir = directions[trial % 3];
    const int64_t dirs = dir == "bidirectional" ? 2 : 1, gh = 4 * hs;
    const bool is_signed = trial % 2 == 0, per_col = trial % 4 < 2;
    INFO("trial " << trial << " " << dir << " seq " << seq << " batch " << batch << " input " << in
                  << " hidden " << hs << " signed " << is_signed << " per column " << per_col);
    const DataType wt = is_signed ? DataType::Int8 : DataType::UInt8;
    const double lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    const Tensor x = random_tensor(DataType::Float, {seq, batch, in}, rng, -2, 2);
    const Tensor w = random_tensor(wt, {dirs, in, gh}, rng, lo, hi);
    const Tensor r = random_tensor(wt, {dirs, hs, gh}, rng, lo, hi);
    const Tensor bias = random_tensor(DataType::Float, {dirs, 8 * hs}, rng, -0.5, 0.5);
    const Tensor h0 = random_tensor(DataType::Float, {dirs, batch, hs}, rng, -0.5, 0.5);
    const Tensor c0 = random_tensor(DataType::Float, {dirs, batch, hs}, rng, -0.5, 0.5);
    const Shape qshape = per_col ? Shape{dirs, gh} : Shape{dirs};
    const int64_t count = shape_numel(qshape);
    std::vector<float> ws, rs;
    std::vector<int> wz, rz;
    std::uniform_real_distribution<float> sd(0.002f, 0.02f);
    std::uniform_int_distribution<int> zd(is_signed ? -10 : 110, is_signed ? 10 : 140);
    for (int64_t i = 0; i < count; ++i) {
      ws.push_back(sd(rng));
      rs.push_back(sd(rng));
      wz.push_back(zd(rng));
      rz.push_back(zd(rng));
    }
    auto floats = [&](const std::vector<float>& v) {
      Tensor t = Tensor::zeros(DataType::Float, qshape);
      std::copy(v.begin(), v.end(), t.data<float>());
      return t;
    };
    OpTest op("DynamicQuantizeLSTM", 1, kMs);
    op.attr("hidden_size", hs).attr("direction", dir).outputs(3);
    op.input(x);
    if (trial % 3 == 1) {
      op.input(w).input(r);
    } else {
      op.constant_input(w).constant_input(r);
    }
    op.input(bias).no_input().input(h0).input(c0).no_input();
    op.input(floats(ws))
        .input(int_tensor(wt, qshape, wz))
        .input(floats(rs))
        .input(int_tensor(wt, qshape, rz));
    const std::vector<Value> out = op.run();
    const Tensor& y = out[0].tensor();
    REQUIRE(y.shape() == Shape{seq, dirs, batch, hs});
    for (int64_t d = 0; d < dirs; ++d) {
      const std::vector<double> want =
          lstm_reference(x, w, r, ws, wz, rs, rz, bias, h0, c0, d, dir == "reverse" || d == 1);
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t i = 0; i < batch * hs; ++i) {
          INFO("direction " << d << " step " << t << " element " << i);
          // H is quantized from float state: a value on a rounding edge may land one step
          // over, so the tolerance allows a little of one quantum.
          REQUIRE(std::fabs(element(y, (t * dirs + d) * batch * hs + i) -
                            want[static_cast<size_t>(t * batch * hs + i)]) <= 2e-3);
        }
      }
    }
  }
  // Bad inputs: float weights, a scale of the wrong shape.
  const Tensor x = Tensor::zeros(DataType::Float, {2, 1, 3});
  auto scale = [](Shape s) { return Tensor::zeros(DataType::Float, std::move(s)); };
  REQUIRE_THROWS_WITH(OpTest("DynamicQuantizeLSTM", 1, kMs)
                          .attr("hidden_size", 2)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float, {1, 3, 8}))
                          .input(Tensor::zeros(DataType::Int8, {1, 2, 8}))
                          .no_input()
                          .no_input()
                          .no_input()
                          .no_input()
                          .no_input()
                          .input(scale({1}))
                          .input(Tensor::zeros(DataType::Int8, {1}))
                          .input(scale({1}))
                          .input(Tensor::zeros(DataType::Int8, {1}))
                          .run(),
                      Catch::Contains("DynamicQuantizeLSTM") && Catch::Contains("int8"));
  REQUIRE_THROWS_WITH(OpTest("DynamicQuantizeLSTM", 1, kMs)
                          .attr("hidden_size", 2)
                          .input(x)
                          .input(Tensor::zeros(DataType::Int8, {1, 3, 8}))
                          .input(Tensor::zeros(DataType::Int8, {1, 2, 8}))
                          .no_input()
                          .no_input()
                          .no_input()
                          .no_input()
                          .no_input()
                          .input(scale({1, 5}))
                          .input(Tensor::zeros(DataType::Int8, {1}))
                          .input(scale({1}))
                          .input(Tensor::zeros(DataType::Int8, {1}))
                          .run(),
                      Catch::Contains("DynamicQuantizeLSTM") && Catch::Contains("W_scale"));
}

TEST_CASE("QAttention matches a double reference", "[ops][contrib][quant]") {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t batch = 1 + trial % 2, seq = 1 + (trial * 3) % 6, heads = 1 + trial % 3;
    const int64_t head = 2 + (trial * 5) % 7, hidden = heads * head, in = 3 + (trial * 7) % 13;
    const int64_t cols = 3 * hidden;
    const bool is_signed = trial % 2 == 1, per_col = trial % 4 >= 2, masked = trial % 3 != 0;
    INFO("trial " << trial << " batch " << batch << " seq " << seq << " heads " << heads << " head "
                  << head << " input " << in);
    const Weights w = random_weights(rng, in, cols, is_signed, per_col);
    const Tensor x = random_tensor(DataType::UInt8, {batch, seq, in}, rng, 0, 255);
    const Tensor bias = random_tensor(DataType::Float, {cols}, rng, -0.5, 0.5);
    const float sx = 0.02f;
    const int zx = 120;
    std::vector<int> xv;
    for (int64_t i = 0; i < x.numel(); ++i) xv.push_back(static_cast<int>(element(x, i)));
    std::vector<double> proj = int_product(xv, zx, w.b, w.zeros, batch * seq, in, cols);
    for (size_t i = 0; i < proj.size(); ++i) {
      const size_t j = i % static_cast<size_t>(cols);
      proj[i] = proj[i] * static_cast<double>(sx * w.scales[per_col ? j : 0]) +
                element(bias, static_cast<int64_t>(j));
    }
    std::vector<int> ends;
    for (int64_t b = 0; b < batch; ++b)
      ends.push_back(static_cast<int>(masked ? 1 + b % seq : seq));
    std::vector<double> want(static_cast<size_t>(batch * seq * hidden), 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < seq; ++i) {
          std::vector<double> p(static_cast<size_t>(seq));
          double top = -1e300, sum = 0;
          for (int64_t t = 0; t < seq; ++t) {
            double s = 0;
            for (int64_t e = 0; e < head; ++e) {
              s += proj[static_cast<size_t>((b * seq + i) * cols + h * head + e)] *
                   proj[static_cast<size_t>((b * seq + t) * cols + hidden + h * head + e)];
            }
            s = s / std::sqrt(static_cast<double>(head)) + (t >= ends[b] ? -10000.0 : 0.0);
            p[static_cast<size_t>(t)] = s;
            top = std::max(top, s);
          }
          for (double& v : p) sum += (v = std::exp(v - top));
          for (int64_t e = 0; e < head; ++e) {
            double acc = 0;
            for (int64_t t = 0; t < seq; ++t) {
              acc += p[static_cast<size_t>(t)] / sum *
                     proj[static_cast<size_t>((b * seq + t) * cols + 2 * hidden + h * head + e)];
            }
            want[static_cast<size_t>((b * seq + i) * hidden + h * head + e)] = acc;
          }
        }
      }
    }
    OpTest op("QAttention", 1, kMs);
    op.attr("num_heads", heads).input(x);
    if (trial % 2 == 0) {
      op.constant_input(w.b);
    } else {
      op.input(w.b);
    }
    op.input(bias).input(scalar_f(sx)).input(w.scale);
    if (masked) {
      op.input(int_tensor(DataType::Int32, {batch}, ends));
    } else {
      op.no_input();
    }
    op.input(int_tensor(DataType::UInt8, {}, {zx})).input(w.zero);
    require_near(op.run1(), want, 1e-4);
  }
  // A float input, and a weight scale of the wrong length: errors naming the node.
  const Tensor w = Tensor::zeros(DataType::Int8, {4, 6});
  REQUIRE_THROWS_WITH(OpTest("QAttention", 1, kMs)
                          .attr("num_heads", 1)
                          .input(Tensor::zeros(DataType::Float, {1, 2, 4}))
                          .input(w)
                          .input(Tensor::zeros(DataType::Float, {6}))
                          .input(scalar_f(1))
                          .input(scalar_f(1))
                          .run(),
                      Catch::Contains("QAttention") && Catch::Contains("uint8"));
  REQUIRE_THROWS_WITH(OpTest("QAttention", 1, kMs)
                          .attr("num_heads", 1)
                          .input(Tensor::zeros(DataType::UInt8, {1, 2, 4}))
                          .input(w)
                          .input(Tensor::zeros(DataType::Float, {6}))
                          .input(scalar_f(1))
                          .input(Tensor::zeros(DataType::Float, {5}))
                          .run(),
                      Catch::Contains("QAttention") && Catch::Contains("weight_scale"));
}

TEST_CASE("the dynamically quantized ops pack constant weights once, at session creation",
          "[ops][contrib][quant]") {
  std::mt19937 rng(37);
  const Weights w = random_weights(rng, 24, 36, true, true);
  const Tensor x = random_tensor(DataType::Float, {5, 24}, rng, -1, 1);
  const Tensor xq = random_tensor(DataType::UInt8, {1, 5, 24}, rng, 0, 255);
  const Tensor bias = random_tensor(DataType::Float, {36}, rng, -1, 1);
  const Tensor lstm_w = random_tensor(DataType::Int8, {1, 24, 16}, rng, -128, 127);
  const Tensor lstm_r = random_tensor(DataType::Int8, {1, 4, 16}, rng, -128, 127);
  auto run_all = [&](bool constant) {
    auto weight = [&](OpTest& op, const Tensor& t) -> OpTest& {
      return constant ? op.constant_input(t) : op.input(t);
    };
    OpTest dq("DynamicQuantizeMatMul", 1, kMs);
    weight(dq.input(x), w.b).input(w.scale).input(w.zero).run();
    OpTest mi("MatMulIntegerToFloat", 1, kMs);
    weight(mi.input(Tensor::zeros(DataType::UInt8, {5, 24})), w.b)
        .input(scalar_f(0.1f))
        .input(w.scale)
        .run();
    OpTest qg("QGemm", 1, kMs);
    weight(qg.input(Tensor::zeros(DataType::UInt8, {5, 24}))
               .input(scalar_f(0.1f))
               .input(Tensor::zeros(DataType::UInt8, {})),
           w.b)
        .input(w.scale)
        .input(w.zero)
        .run();
    OpTest qa("QAttention", 1, kMs);
    weight(qa.attr("num_heads", 2).input(xq), w.b)
        .input(bias)
        .input(scalar_f(0.1f))
        .input(w.scale)
        .run();
    OpTest ls("DynamicQuantizeLSTM", 1, kMs);
    ls.attr("hidden_size", 4).input(Tensor::zeros(DataType::Float, {3, 2, 24}));
    weight(weight(ls, lstm_w), lstm_r).no_input().no_input().no_input().no_input().no_input();
    ls.input(scalar_f(0.1f).reshaped({1}))
        .input(Tensor::zeros(DataType::Int8, {1}))
        .input(scalar_f(0.1f).reshaped({1}))
        .input(Tensor::zeros(DataType::Int8, {1}))
        .run();
  };
  const uint64_t before = math::qgemm_b_packs();
  run_all(true);
  REQUIRE(math::qgemm_b_packs() == before);
  // Weights fed at run time are packed as the products run: the counter sees them.
  run_all(false);
  REQUIRE(math::qgemm_b_packs() >= before + 3);
}

KILN_ISA_TEST_CASE("dynamic quantization's range and rounding kernels match the scalar rule",
                   "[math][quant]") {
  KILN_REQUIRE_ISA();
  const math::Int8GemmKernels& k = isa_kernels.int8_gemm;
  std::mt19937 rng(41);
  for (int64_t n : {0, 1, 5, 16, 17, 63, 64, 100}) {
    Tensor t = random_tensor(DataType::Float, {n}, rng, -3, 5);
    float* x = t.data<float>();
    const float scale = 0.03125f, zero = 96.0f;
    // Ties (half-way between steps), values past both ends, infinities and NaNs.
    for (int64_t i = 0; i < n; ++i) {
      if (i % 7 == 1) x[i] = (static_cast<float>(i % 11) - 5.5f) * scale;
      if (i % 13 == 2) x[i] = std::numeric_limits<float>::quiet_NaN();
      if (i % 17 == 3) x[i] = -std::numeric_limits<float>::infinity();
      if (i % 19 == 4) x[i] = 1e9f;
    }
    float lo = 1, hi = -1, want_lo = 0, want_hi = 0;
    k.quant_range(x, n, &lo, &hi);
    std::vector<uint8_t> y(static_cast<size_t>(n) + 1, 7);
    k.quantize_u8(x, n, scale, zero, y.data());
    for (int64_t i = 0; i < n; ++i) {
      INFO("n " << n << " element " << i << " = " << x[i]);
      if (!std::isnan(x[i])) want_lo = std::min(want_lo, x[i]), want_hi = std::max(want_hi, x[i]);
      const float q = std::nearbyint(x[i] / scale) + zero;
      const int want = std::isnan(q) ? 0 : static_cast<int>(std::clamp(q, 0.0f, 255.0f));
      REQUIRE(static_cast<int>(y[static_cast<size_t>(i)]) == want);
    }
    REQUIRE(y[static_cast<size_t>(n)] == 7);  // nothing written past the end
    REQUIRE(lo == want_lo);
    REQUIRE(hi == want_hi);
  }
}
