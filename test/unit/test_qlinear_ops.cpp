// onnxruntime's QOperator contrib ops (com.microsoft QLinearAdd, QLinearMul, QLinearSigmoid,
// QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearConcat) against naive double
// references written here from onnxruntime's ContribOperators.md: dequantize, compute,
// quantize (round half to even, saturate). The kernels compute in float as onnxruntime does,
// so an element may differ from the exact value by one unit where the exact value lies
// within float rounding of a half; nearly all must match exactly. uint8 and int8, random
// shapes and broadcasting, omitted zero points, and bad inputs failing with an Error naming
// the op.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr const char* kMs = "com.microsoft";

struct Q {
  float scale;
  int zero_point;
};

double lo_of(DataType t) {
  return t == DataType::UInt8 ? 0 : -128;
}
double hi_of(DataType t) {
  return t == DataType::UInt8 ? 255 : 127;
}

// Quantizes an exact real value: round half to even, saturate.
double quantize(double v, Q q, DataType t) {
  return std::clamp(std::nearbyint(v / q.scale) + q.zero_point, lo_of(t), hi_of(t));
}

Tensor zero_point(int z, DataType t) {
  return t == DataType::UInt8 ? Tensor::scalar(static_cast<uint8_t>(z))
                              : Tensor::scalar(static_cast<int8_t>(z));
}

Q random_q(std::mt19937& rng, DataType t) {
  std::uniform_real_distribution<float> s(0.005f, 0.05f);
  std::uniform_int_distribution<int> z(static_cast<int>(lo_of(t)) + 20,
                                       static_cast<int>(hi_of(t)) - 20);
  return {s(rng), z(rng)};
}

Tensor random_q_tensor(DataType t, Shape shape, std::mt19937& rng) {
  return random_tensor(t, std::move(shape), rng, lo_of(t), hi_of(t));
}

// Every element within one unit of `want`, and at least 97% of them equal.
void require_within_one(const Tensor& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  size_t off = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(element(got, static_cast<int64_t>(i)) - want[i]);
    INFO("element " << i << ": got " << element(got, static_cast<int64_t>(i)) << ", want "
                    << want[i]);
    REQUIRE(d <= 1);
    off += d != 0;
  }
  REQUIRE(off * 100 <= want.size() * 3);
}

// A shape broadcastable with `out`: some axes 1, some leading axes dropped.
Shape broadcast_partner(const Shape& out, std::mt19937& rng) {
  const size_t drop = rng() % (out.size() + 1);
  Shape s(out.begin() + static_cast<std::ptrdiff_t>(drop), out.end());
  for (auto& d : s) {
    if (rng() % 3 == 0) d = 1;
  }
  return s;
}

// numpy broadcasting of two shapes (assumed compatible).
Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// The flat index into a tensor of shape `in` read for flat index `flat` of shape `out`.
int64_t index_in(const Shape& in, const Shape& out, int64_t flat) {
  int64_t idx = 0, mul = 1;
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t d_out = out.size() - 1 - i, d_in = in.size() - 1 - i;
    const int64_t coord = flat % out[d_out];
    flat /= out[d_out];
    if (in[d_in] != 1) idx += coord * mul;
    mul *= in[d_in];
  }
  return idx;
}

// [n, c, spatial...], or [n, spatial..., c] when channels last.
Shape image_shape(int64_t n, int64_t c, const std::vector<int64_t>& spatial, bool channels_last) {
  Shape s{n};
  if (!channels_last) s.push_back(c);
  s.insert(s.end(), spatial.begin(), spatial.end());
  if (channels_last) s.push_back(c);
  return s;
}

}  // namespace

TEST_CASE("com.microsoft QLinearAdd and QLinearMul with broadcasting", "[ops][qlinear]") {
  std::mt19937 rng(19);
  for (DataType t : {DataType::UInt8, DataType::Int8}) {
    for (int trial = 0; trial < 16; ++trial) {
      const Shape out = random_shape(1 + trial % 4, 9, rng);
      Shape sa = out, sb = broadcast_partner(out, rng);
      if (trial % 2) std::swap(sa, sb);
      const Tensor a = random_q_tensor(t, sa, rng), b = random_q_tensor(t, sb, rng);
      const Q qa = random_q(rng, t), qb = random_q(rng, t), qc = random_q(rng, t);
      const bool omit_zp = trial % 5 == 4;  // zero points omitted: 0
      const Q za{qa.scale, omit_zp ? 0 : qa.zero_point}, zb{qb.scale, omit_zp ? 0 : qb.zero_point},
          zc{qc.scale, omit_zp ? 0 : qc.zero_point};
      INFO(data_type_name(t) << " trial " << trial << ": " << a.describe() << " , "
                             << b.describe());
      const Shape shape = broadcast(sa, sb);
      std::vector<double> add, mul;
      const int64_t n = shape_numel(shape);
      for (int64_t k = 0; k < n; ++k) {
        const double va = za.scale * (element(a, index_in(sa, shape, k)) - za.zero_point);
        const double vb = zb.scale * (element(b, index_in(sb, shape, k)) - zb.zero_point);
        add.push_back(quantize(va + vb, zc, t));
        mul.push_back(quantize(va * vb, zc, t));
      }
      for (const char* op : {"QLinearAdd", "QLinearMul"}) {
        OpTest test(op, 1, kMs);
        test.input(a).constant_input(Tensor::scalar(qa.scale));
        omit_zp ? test.no_input() : test.constant_input(zero_point(qa.zero_point, t));
        test.input(b).constant_input(Tensor::scalar(qb.scale));
        omit_zp ? test.no_input() : test.constant_input(zero_point(qb.zero_point, t));
        test.input(Tensor::scalar(qc.scale));
        if (!omit_zp) test.input(zero_point(qc.zero_point, t));
        const Tensor y = test.run1();
        REQUIRE(y.shape() == shape);
        REQUIRE(y.dtype() == t);
        require_within_one(y, std::string(op) == "QLinearAdd" ? add : mul);
      }
    }
  }
}

TEST_CASE("com.microsoft QLinearSigmoid and QLinearLeakyRelu", "[ops][qlinear]") {
  std::mt19937 rng(23);
  for (DataType t : {DataType::UInt8, DataType::Int8}) {
    for (int trial = 0; trial < 6; ++trial) {
      const Tensor x = random_q_tensor(t, random_shape(1 + trial % 4, 12, rng), rng);
      const Q qx{std::uniform_real_distribution<float>(0.02f, 0.1f)(rng),
                 random_q(rng, t).zero_point};
      // Sigmoid's output lies in [0, 1]: a scale of about 1/256 as a quantizer would choose.
      const Q qs{1.0f / 255, t == DataType::UInt8 ? 0 : -128};
      const Q ql = random_q(rng, t);
      const float alpha = 0.05f + 0.1f * static_cast<float>(trial);
      INFO(data_type_name(t) << " trial " << trial << ": " << x.describe());
      std::vector<double> sig, leaky;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double v = qx.scale * (element(x, i) - qx.zero_point);
        sig.push_back(quantize(1 / (1 + std::exp(-v)), qs, t));
        leaky.push_back(quantize(v >= 0 ? v : alpha * v, ql, t));
      }
      require_within_one(OpTest("QLinearSigmoid", 1, kMs)
                             .input(x)
                             .constant_input(Tensor::scalar(qx.scale))
                             .constant_input(zero_point(qx.zero_point, t))
                             .input(Tensor::scalar(qs.scale))
                             .input(zero_point(qs.zero_point, t))
                             .run1(),
                         sig);
      require_within_one(OpTest("QLinearLeakyRelu", 1, kMs)
                             .input(x)
                             .input(Tensor::scalar(qx.scale))
                             .input(zero_point(qx.zero_point, t))
                             .input(Tensor::scalar(ql.scale))
                             .input(zero_point(ql.zero_point, t))
                             .attr("alpha", alpha)
                             .run1(),
                         leaky);
    }
  }
}

TEST_CASE("com.microsoft QLinearGlobalAveragePool, NCHW and channels_last", "[ops][qlinear]") {
  std::mt19937 rng(29);
  for (DataType t : {DataType::UInt8, DataType::Int8}) {
    for (int trial = 0; trial < 8; ++trial) {
      const bool last = trial % 2 == 1;
      const Shape shape = random_shape(3 + trial % 3, 9, rng);
      const Tensor x = random_q_tensor(t, shape, rng);
      const Q qx = random_q(rng, t), qy = random_q(rng, t);
      const size_t rank = shape.size();
      const int64_t n = shape[0], c = last ? shape[rank - 1] : shape[1];
      const int64_t image = shape_numel(shape) / (n * c);
      INFO(data_type_name(t) << " trial " << trial << ": " << x.describe()
                             << (last ? " channels_last" : ""));
      std::vector<double> want(static_cast<size_t>(n * c));
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t ch = 0; ch < c; ++ch) {
          double sum = 0;
          for (int64_t i = 0; i < image; ++i) {
            sum += element(x, last ? (b * image + i) * c + ch : (b * c + ch) * image + i);
          }
          want[static_cast<size_t>(b * c + ch)] =
              quantize(qx.scale * (sum / static_cast<double>(image) - qx.zero_point), qy, t);
        }
      }
      const Tensor y = OpTest("QLinearGlobalAveragePool", 1, kMs)
                           .input(x)
                           .input(Tensor::scalar(qx.scale))
                           .input(zero_point(qx.zero_point, t))
                           .input(Tensor::scalar(qy.scale))
                           .input(zero_point(qy.zero_point, t))
                           .attr("channels_last", last ? 1 : 0)
                           .run1();
      Shape out = shape;
      for (size_t d = last ? 1 : 2; d < (last ? rank - 1 : rank); ++d) out[d] = 1;
      REQUIRE(y.shape() == out);
      require_within_one(y, want);
    }
  }
}

TEST_CASE("com.microsoft QLinearConcat requantizes each input", "[ops][qlinear]") {
  std::mt19937 rng(31);
  for (DataType t : {DataType::UInt8, DataType::Int8}) {
    for (int trial = 0; trial < 8; ++trial) {
      const Shape base = random_shape(1 + trial % 4, 6, rng);
      const auto axis = static_cast<int64_t>(rng() % base.size());
      const Q qy = random_q(rng, t);
      OpTest test("QLinearConcat", 1, kMs);
      test.attr("axis", trial % 2 ? axis - static_cast<int64_t>(base.size()) : axis);
      test.constant_input(Tensor::scalar(qy.scale)).constant_input(zero_point(qy.zero_point, t));
      std::vector<Tensor> xs;
      std::vector<Q> qs;
      const int count = 1 + trial % 3;
      for (int k = 0; k < count; ++k) {
        Shape s = base;
        s[static_cast<size_t>(axis)] = 1 + static_cast<int64_t>(rng() % 4);
        xs.push_back(random_q_tensor(t, s, rng));
        qs.push_back(k == 1 ? qy : random_q(rng, t));  // input 1 (when present) is copied
        test.input(xs.back())
            .constant_input(Tensor::scalar(qs.back().scale))
            .input(zero_point(qs.back().zero_point, t));
      }
      INFO(data_type_name(t) << " trial " << trial << ": axis " << axis);
      // Reference: walk the output in order, taking each input's slab in turn.
      const int64_t outer = shape_numel(Shape(base.begin(), base.begin() + axis));
      std::vector<double> want;
      for (int64_t o = 0; o < outer; ++o) {
        for (int k = 0; k < count; ++k) {
          const int64_t pitch = xs[k].numel() / outer;
          for (int64_t i = 0; i < pitch; ++i) {
            const double v = qs[k].scale * (element(xs[k], o * pitch + i) - qs[k].zero_point);
            want.push_back(quantize(v, qy, t));
          }
        }
      }
      require_within_one(test.run1(), want);
    }
  }
}

TEST_CASE("com.microsoft QLinearAveragePool, NCHW and channels_last", "[ops][qlinear]") {
  std::mt19937 rng(37);
  for (DataType t : {DataType::UInt8, DataType::Int8}) {
    for (int trial = 0; trial < 24; ++trial) {
      const size_t r = 1 + trial % 3;
      const bool last = (trial / 3) % 2 == 1, count_pad = trial % 4 >= 2;
      const bool ceil = trial % 5 == 1, whole = trial % 7 == 6;
      std::vector<int64_t> in(r), k(r), st(r), pads(2 * r);
      for (size_t d = 0; d < r; ++d) {
        in[d] = 2 + static_cast<int64_t>(rng() % 6);
        k[d] = whole ? in[d] : 1 + static_cast<int64_t>(rng() % std::min<int64_t>(3, in[d]));
        st[d] = whole ? 1 : 1 + static_cast<int64_t>(rng() % 2);
        pads[d] = whole ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(k[d]));
        pads[d + r] = whole ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(k[d]));
      }
      const int64_t n = 1 + trial % 2, c = 1 + static_cast<int64_t>(rng() % 5);
      const Shape shape = image_shape(n, c, in, last);
      const Tensor x = random_q_tensor(t, shape, rng);
      const Q qx = random_q(rng, t), qy = random_q(rng, t);
      INFO(data_type_name(t) << " trial " << trial << ": " << x.describe() << (last ? " NHWC" : "")
                             << (count_pad ? " count_include_pad" : "") << (ceil ? " ceil" : ""));
      // Output sizes (ONNX's formula; ceil_mode drops a window starting in the end padding).
      std::vector<int64_t> out(r);
      for (size_t d = 0; d < r; ++d) {
        const int64_t span = in[d] + pads[d] + pads[d + r] - k[d];
        out[d] = (ceil ? (span + st[d] - 1) / st[d] : span / st[d]) + 1;
        if (ceil && (out[d] - 1) * st[d] >= in[d] + pads[d]) --out[d];
      }
      std::vector<int64_t> in3(3, 1), out3(3, 1), k3(3, 1), st3(3, 1), pad3(3, 0);
      for (size_t d = 0; d < r; ++d) {
        in3[3 - r + d] = in[d], out3[3 - r + d] = out[d], k3[3 - r + d] = k[d];
        st3[3 - r + d] = st[d], pad3[3 - r + d] = pads[d];
      }
      const int64_t in_size = in3[0] * in3[1] * in3[2], out_size = out3[0] * out3[1] * out3[2];
      std::vector<double> want(static_cast<size_t>(n * c * out_size));
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t ch = 0; ch < c; ++ch) {
          for (int64_t o = 0; o < out_size; ++o) {
            const int64_t o3[3] = {o / (out3[1] * out3[2]), o / out3[2] % out3[1], o % out3[2]};
            int64_t lo[3], hi[3];
            for (int d = 0; d < 3; ++d) {
              const int64_t start = o3[d] * st3[d] - pad3[d];
              lo[d] = std::max<int64_t>(start, 0);
              hi[d] = std::min(start + k3[d], in3[d]);
            }
            double sum = 0;
            for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0) {
              for (int64_t i1 = lo[1]; i1 < hi[1]; ++i1) {
                for (int64_t i2 = lo[2]; i2 < hi[2]; ++i2) {
                  const int64_t sp = (i0 * in3[1] + i1) * in3[2] + i2;
                  const int64_t idx =
                      last ? (b * in_size + sp) * c + ch : (b * c + ch) * in_size + sp;
                  sum += qx.scale * (element(x, idx) - qx.zero_point);
                }
              }
            }
            const int64_t count = count_pad ? k3[0] * k3[1] * k3[2]
                                            : (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);
            const int64_t at = last ? (b * out_size + o) * c + ch : (b * c + ch) * out_size + o;
            want[static_cast<size_t>(at)] = quantize(sum / static_cast<double>(count), qy, t);
          }
        }
      }
      const Tensor y = OpTest("QLinearAveragePool", 1, kMs)
                           .input(x)
                           .input(Tensor::scalar(qx.scale))
                           .input(zero_point(qx.zero_point, t))
                           .input(Tensor::scalar(qy.scale))
                           .input(zero_point(qy.zero_point, t))
                           .attr("kernel_shape", k)
                           .attr("strides", st)
                           .attr("pads", pads)
                           .attr("ceil_mode", ceil ? 1 : 0)
                           .attr("count_include_pad", count_pad ? 1 : 0)
                           .attr("channels_last", last ? 1 : 0)
                           .run1();
      const Shape want_shape = image_shape(n, c, out, last);
      REQUIRE(y.shape() == want_shape);
      require_within_one(y, want);
    }
  }
}

TEST_CASE("com.microsoft QLinearSoftmax, opset 13 along an axis and opset 12 flattened",
          "[ops][qlinear]") {
  std::mt19937 rng(41);
  for (DataType t : {DataType::UInt8, DataType::Int8}) {
    for (int trial = 0; trial < 12; ++trial) {
      const int64_t opset = trial % 3 == 2 ? 12 : 13;
      Shape shape = random_shape(1 + trial % 4, 7, rng);
      const bool default_axis = opset >= 13 && trial % 4 == 1;  // the last
      const auto axis = default_axis ? static_cast<int64_t>(shape.size()) - 1
                                     : static_cast<int64_t>(rng() % shape.size());
      shape[static_cast<size_t>(axis)] = std::max<int64_t>(2, shape[static_cast<size_t>(axis)]);
      const Tensor x = random_q_tensor(t, shape, rng);
      // Spread * scale below 5 keeps every probability under 255.5 / 256, where onnxruntime's
      // int8 narrowing would wrap.
      const Q qx{std::uniform_real_distribution<float>(0.004f, 0.019f)(rng),
                 random_q(rng, t).zero_point};
      const Q qy{1.0f / 256, t == DataType::UInt8 ? 0 : -128};
      INFO(data_type_name(t) << " trial " << trial << ": " << x.describe() << " axis " << axis
                             << " opset " << opset);
      const int64_t outer = shape_numel(Shape(shape.begin(), shape.begin() + axis));
      const int64_t d = opset < 13 ? x.numel() / outer : shape[static_cast<size_t>(axis)];
      const int64_t inner = x.numel() / (outer * d);
      std::vector<double> want(static_cast<size_t>(x.numel()));
      for (int64_t r = 0; r < outer * inner; ++r) {
        const int64_t start = (r / inner) * d * inner + r % inner;
        double mx = -1e30, sum = 0;
        for (int64_t i = 0; i < d; ++i) mx = std::max(mx, element(x, start + i * inner));
        for (int64_t i = 0; i < d; ++i)
          sum += std::exp(qx.scale * (element(x, start + i * inner) - mx));
        for (int64_t i = 0; i < d; ++i) {
          const double p = std::exp(qx.scale * (element(x, start + i * inner) - mx)) / sum;
          want[static_cast<size_t>(start + i * inner)] = quantize(p, qy, t);
        }
      }
      OpTest test("QLinearSoftmax", 1, kMs);
      test.input(x)
          .constant_input(Tensor::scalar(qx.scale))
          .constant_input(zero_point(qx.zero_point, t))
          .input(Tensor::scalar(qy.scale))
          .input(zero_point(qy.zero_point, t))
          .attr("opset", opset);
      if (!default_axis) test.attr("axis", axis);
      require_within_one(test.run1(), want);
    }
  }
}

TEST_CASE("com.microsoft QLinear ops reject bad inputs", "[ops][qlinear]") {
  const Tensor u8 = Tensor::zeros(DataType::UInt8, {2, 3, 4, 4});
  const Tensor s = Tensor::scalar(0.1f);
  const Tensor z = Tensor::scalar(static_cast<uint8_t>(3));
  // float data
  REQUIRE_THROWS_WITH(OpTest("QLinearAdd", 1, kMs)
                          .input(Tensor::zeros(DataType::Float, {2}))
                          .input(s)
                          .input(z)
                          .input(Tensor::zeros(DataType::Float, {2}))
                          .input(s)
                          .input(z)
                          .input(s)
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearAdd") && Catch::Contains("uint8 or int8"));
  // shapes that do not broadcast
  REQUIRE_THROWS_WITH(OpTest("QLinearMul", 1, kMs)
                          .input(Tensor::zeros(DataType::UInt8, {2, 3}))
                          .input(s)
                          .input(z)
                          .input(Tensor::zeros(DataType::UInt8, {4}))
                          .input(s)
                          .input(z)
                          .input(s)
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearMul"));
  // a per-channel scale
  REQUIRE_THROWS_WITH(OpTest("QLinearSigmoid", 1, kMs)
                          .input(u8)
                          .input(Tensor::zeros(DataType::Float, {3}))
                          .input(z)
                          .input(s)
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearSigmoid") && Catch::Contains("scale"));
  // a zero point of another type than the data
  REQUIRE_THROWS_WITH(OpTest("QLinearLeakyRelu", 1, kMs)
                          .input(u8)
                          .input(s)
                          .input(Tensor::scalar(static_cast<int8_t>(1)))
                          .input(s)
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearLeakyRelu") && Catch::Contains("zero point"));
  // rank 2
  REQUIRE_THROWS_WITH(OpTest("QLinearGlobalAveragePool", 1, kMs)
                          .input(Tensor::zeros(DataType::UInt8, {2, 3}))
                          .input(s)
                          .input(z)
                          .input(s)
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearGlobalAveragePool") && Catch::Contains("rank"));
  // a scale ratio outside onnxruntime's range
  REQUIRE_THROWS_WITH(OpTest("QLinearGlobalAveragePool", 1, kMs)
                          .input(u8)
                          .input(Tensor::scalar(1000.0f))
                          .input(z)
                          .input(Tensor::scalar(0.001f))
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearGlobalAveragePool") && Catch::Contains("range"));
  // AveragePool: dilations, and an input of another rank than the kernel's
  REQUIRE_THROWS_WITH(OpTest("QLinearAveragePool", 1, kMs)
                          .input(u8)
                          .input(s)
                          .input(z)
                          .input(s)
                          .input(z)
                          .attr("kernel_shape", std::vector<int64_t>{2, 2})
                          .attr("dilations", std::vector<int64_t>{2, 2})
                          .run(),
                      Catch::Contains("QLinearAveragePool") && Catch::Contains("dilations"));
  REQUIRE_THROWS_WITH(OpTest("QLinearAveragePool", 1, kMs)
                          .input(u8)
                          .input(s)
                          .input(z)
                          .input(s)
                          .input(z)
                          .attr("kernel_shape", std::vector<int64_t>{2})
                          .run(),
                      Catch::Contains("QLinearAveragePool") && Catch::Contains("kernel_shape"));
  // Degenerate scales (0, NaN) saturate instead of converting NaN or infinity to an integer.
  for (float bad : {0.0f, std::nanf("")}) {
    const Tensor sum = OpTest("QLinearAdd", 1, kMs)
                           .input(u8)
                           .input(s)
                           .input(z)
                           .input(u8)
                           .input(s)
                           .input(z)
                           .input(Tensor::scalar(bad))
                           .input(z)
                           .run1();
    REQUIRE(sum.shape() == u8.shape());
    const Tensor soft = OpTest("QLinearSoftmax", 1, kMs)
                            .input(u8)
                            .input(Tensor::scalar(bad))
                            .input(z)
                            .input(s)
                            .input(z)
                            .attr("opset", 13)
                            .run1();
    REQUIRE(soft.shape() == u8.shape());
  }
  // Softmax without the opset attribute
  REQUIRE_THROWS_WITH(
      OpTest("QLinearSoftmax", 1, kMs).input(u8).input(s).input(z).input(s).input(z).run(),
      Catch::Contains("QLinearSoftmax") && Catch::Contains("opset"));
  // Concat: inputs not in triples, shapes differing outside the axis
  REQUIRE_THROWS_WITH(OpTest("QLinearConcat", 1, kMs)
                          .attr("axis", 1)
                          .input(s)
                          .input(z)
                          .input(u8)
                          .input(s)
                          .input(z)
                          .input(u8)
                          .run(),
                      Catch::Contains("QLinearConcat") && Catch::Contains("triples"));
  REQUIRE_THROWS_WITH(OpTest("QLinearConcat", 1, kMs)
                          .attr("axis", 1)
                          .input(s)
                          .input(z)
                          .input(u8)
                          .input(s)
                          .input(z)
                          .input(Tensor::zeros(DataType::UInt8, {2, 3, 4, 5}))
                          .input(s)
                          .input(z)
                          .run(),
                      Catch::Contains("QLinearConcat") && Catch::Contains("outside axis"));
}
