// SessionOptions::gemm_weights = Int8: MatMul's and Gemm's constant float B quantized once
// at load (symmetric int8, one scale per output column) and shared through the weights cache,
// A quantized per row at run time. The products are compared with a double loop over the
// same quantization (transA, transB, alpha, beta and every form of C), the packing is counted,
// and the committed random Whisper runs with int8 weights within a stated distance of float.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/runtime/session_internal.h"
#include "kiln/generate.h"
#include "ops/math/gemm.h"
#include "ops/math/qgemm.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"
#include "tools/common/npy.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

const std::string kWhisper = std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random";

// A k x n matrix (row-major) as the int8 weights hold it: each column quantized to
// round_half_even(b / s) in [-127, 127], s = max |column| / 127, and dequantized.
std::vector<double> dequantized_columns(const std::vector<float>& b, int64_t k, int64_t n) {
  std::vector<double> out(b.size());
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0.0f;
    for (int64_t p = 0; p < k; ++p)
      amax = std::max(amax, std::abs(b[static_cast<size_t>(p * n + j)]));
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (int64_t p = 0; p < k; ++p) {
      const float q =
          std::clamp(std::nearbyint(b[static_cast<size_t>(p * n + j)] / s), -127.0f, 127.0f);
      out[static_cast<size_t>(p * n + j)] = static_cast<double>(q) * s;
    }
  }
  return out;
}

// An m x k matrix (row-major) as the product sees it: each row quantized to uint8 with its own
// scale and zero point (math::row_quant_params), and dequantized.
std::vector<double> dequantized_rows(const std::vector<float>& a, int64_t m, int64_t k) {
  std::vector<double> out(a.size());
  for (int64_t i = 0; i < m; ++i) {
    const float* row = a.data() + i * k;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t p = 0; p < k; ++p) lo = std::min(lo, row[p]), hi = std::max(hi, row[p]);
    float s = 0.0f, z = 0.0f;
    math::row_quant_params(lo, hi, &s, &z);
    for (int64_t p = 0; p < k; ++p) {
      const float q = std::clamp(std::nearbyint(row[p] / s) + z, 0.0f, 255.0f);
      out[static_cast<size_t>(i * k + p)] = (static_cast<double>(q) - z) * s;
    }
  }
  return out;
}

std::vector<float> random_values(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Row-major `rows` x `cols` of `v` transposed.
std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      t[static_cast<size_t>(j * rows + i)] = v[static_cast<size_t>(i * cols + j)];
  }
  return t;
}

SessionOptions int8_options(const std::shared_ptr<Environment>& env) {
  SessionOptions o;
  o.environment = env;
  o.gemm_weights = WeightPrecision::Int8;
  return o;
}

}  // namespace

TEST_CASE("int8 weights: MatMul's B is quantized per column once and shared", "[gemm][int8]") {
  std::mt19937 rng(8);
  for (const int64_t m : {int64_t{1}, int64_t{5}, int64_t{40}}) {
    const int64_t k = 71, n = 45;  // odd: tails in k groups, panels and vectors
    INFO("m " << m);
    const std::vector<float> w = random_values(static_cast<size_t>(k * n), rng, -0.5f, 0.5f);
    const std::vector<float> x = random_values(static_cast<size_t>(m * k), rng, -2.0f, 3.0f);
    // A model file: the weights cache shares prepared weights between the sessions that
    // load the same bytes.
    TempDir dir;
    proto::testing::ModelSpec spec;
    spec.inputs = {{"x", {m, k}}};
    proto::testing::TensorSpec ws;
    ws.name = "w";
    ws.dims = {k, n};
    ws.values = w;
    spec.initializers = {ws};
    spec.nodes = {{"MatMul", {"x", "w"}, {"y"}, "matmul", {}}};
    spec.outputs = {"y"};
    const std::string path = dir.file("w.onnx", proto::testing::model_bytes(spec));
    auto env = std::make_shared<Environment>(2);
    Session s1(path, int8_options(env));
    const math::Int8GemmKernels& t = math::kernels().int8_gemm;
    CHECK(s1.load_stats().weights_prepared_count == 1);
    CHECK(s1.load_stats().weights_prepared_bytes ==
          static_cast<uint64_t>(math::QPackedB::packed_bytes(k, n, t) + 4 * n));
    Session s2(path, int8_options(env));
    CHECK(s2.load_stats().weights_prepared_count == 0);
    CHECK(s2.load_stats().weights_prepared_shared == 1);

    const std::vector<double> qa = dequantized_rows(x, m, k), qb = dequantized_columns(w, k, n);
    const uint64_t qpacks = math::qgemm_b_packs(), fpacks = math::gemm_b_packs();
    for (Session* s : {&s1, &s2}) {
      const std::vector<float> y = s->run({{"x", Tensor::from_vector<float>({m, k}, x)}})[0]
                                       .value.tensor()
                                       .to_vector<float>();
      REQUIRE(y.size() == static_cast<size_t>(m * n));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, mag = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double term =
                qa[static_cast<size_t>(i * k + p)] * qb[static_cast<size_t>(p * n + j)];
            want += term;
            mag += std::abs(term);
          }
          REQUIRE(std::abs(y[static_cast<size_t>(i * n + j)] - want) <= 1e-5 * mag + 1e-6);
        }
      }
    }
    CHECK(math::qgemm_b_packs() == qpacks);  // B was never packed at run time
    CHECK(math::gemm_b_packs() == fpacks);
  }
}

TEST_CASE("int8 weights: Gemm with transA, transB, alpha, beta and every form of C",
          "[gemm][int8]") {
  std::mt19937 rng(21);
  const int64_t k = 37, n = 19;
  for (const int64_t m : {int64_t{1}, int64_t{7}}) {
    for (const int trans_a : {0, 1}) {
      for (const int trans_b : {0, 1}) {
        for (const int c_form : {0, 1, 2, 3}) {  // none, [N], [M, 1], [M, N]
          INFO("m " << m << " transA " << trans_a << " transB " << trans_b << " C " << c_form);
          const float alpha = 0.5f, beta = 2.0f;
          const std::vector<float> a = random_values(static_cast<size_t>(m * k), rng, -1.0f, 2.0f);
          const std::vector<float> b = random_values(static_cast<size_t>(k * n), rng, -0.3f, 0.3f);
          const Shape c_shape = c_form == 1 ? Shape{n} : c_form == 2 ? Shape{m, 1} : Shape{m, n};
          const std::vector<float> c =
              random_values(static_cast<size_t>(shape_numel(c_shape)), rng, -1.0f, 1.0f);
          GraphBuilder g;
          g.input("a", DataType::Float,
                  trans_a ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, true)
              .initializer("b", trans_b ? Tensor::from_vector<float>({n, k}, transposed(b, k, n))
                                        : Tensor::from_vector<float>({k, n}, b));
          std::vector<std::string> inputs = {"a", "b"};
          if (c_form != 0) {
            g.input("c", DataType::Float, std::vector<int64_t>(c_shape.begin(), c_shape.end()),
                    true);
            inputs.push_back("c");
          }
          g.node("Gemm", inputs, {"y"},
                 {int_attr("transA", trans_a), int_attr("transB", trans_b),
                  float_attr("alpha", alpha), float_attr("beta", beta)});
          g.output("y");
          Session s = session_from_model(make_model(g.build()),
                                         int8_options(std::make_shared<Environment>(2)));
          CHECK(s.load_stats().weights_prepared_count == 1);
          const Tensor at = trans_a ? Tensor::from_vector<float>({k, m}, transposed(a, m, k))
                                    : Tensor::from_vector<float>({m, k}, a);
          const Tensor ct = Tensor::from_vector<float>(c_shape, c);
          const std::vector<NamedValue> feeds = c_form == 0
                                                    ? std::vector<NamedValue>{{"a", at}}
                                                    : std::vector<NamedValue>{{"a", at}, {"c", ct}};
          const std::vector<float> y = s.run(feeds)[0].value.tensor().to_vector<float>();
          REQUIRE(y.size() == static_cast<size_t>(m * n));
          const std::vector<double> qa = dequantized_rows(a, m, k),
                                    qb = dequantized_columns(b, k, n);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double sum = 0, mag = 0;
              for (int64_t p = 0; p < k; ++p) {
                const double term =
                    qa[static_cast<size_t>(i * k + p)] * qb[static_cast<size_t>(p * n + j)];
                sum += term;
                mag += std::abs(term);
              }
              double cv = 0;
              if (c_form == 1) cv = c[static_cast<size_t>(j)];
              if (c_form == 2) cv = c[static_cast<size_t>(i)];
              if (c_form == 3) cv = c[static_cast<size_t>(i * n + j)];
              const double want = alpha * sum + beta * cv;
              REQUIRE(std::abs(y[static_cast<size_t>(i * n + j)] - want) <=
                      1e-5 * (mag + std::abs(cv)) + 1e-6);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("int8 weights: the float default is untouched and other B stay float", "[gemm][int8]") {
  // A B that is an input (not a constant) is multiplied in float whatever gemm_weights says.
  std::mt19937 rng(3);
  const int64_t m = 3, k = 20, n = 9;
  const std::vector<float> a = random_values(static_cast<size_t>(m * k), rng, -1.0f, 1.0f);
  const std::vector<float> b = random_values(static_cast<size_t>(k * n), rng, -1.0f, 1.0f);
  const auto graph = [&] {
    GraphBuilder g;
    g.input("a", DataType::Float, {m, k}, true).input("b", DataType::Float, {k, n}, true);
    g.node("MatMul", {"a", "b"}, {"y"});
    g.output("y");
    return g.build();
  };
  Session fs = session_from_model(make_model(graph()), {});
  Session qs =
      session_from_model(make_model(graph()), int8_options(std::make_shared<Environment>(1)));
  CHECK(qs.load_stats().weights_prepared_count == 0);
  const std::vector<NamedValue> feeds = {{"a", Tensor::from_vector<float>({m, k}, a)},
                                         {"b", Tensor::from_vector<float>({k, n}, b)}};
  CHECK(fs.run(feeds)[0].value.tensor().to_vector<float>() ==
        qs.run(feeds)[0].value.tensor().to_vector<float>());
}

TEST_CASE("int8 weights: the random Whisper's encoder and decoder stay close to float",
          "[gemm][int8][whisper]") {
  // Stated tolerance: with int8 weights the encoder's output and the decoder's logits differ
  // from float's by at most 10% of the output's largest magnitude, and by at most 6% in RMS.
  const Tensor features = tooling::read_npy(kWhisper + "/sample_features.npy");
  auto env = std::make_shared<Environment>(2);
  auto options = [&](WeightPrecision p) {
    SessionOptions o;
    o.environment = env;
    o.gemm_weights = p;
    return o;
  };
  // The largest difference over the largest magnitude, and the RMS difference over the RMS.
  auto errors = [](const Tensor& got, const Tensor& want) {
    const std::vector<float> g = got.contiguous().to_vector<float>();
    const std::vector<float> w = want.contiguous().to_vector<float>();
    REQUIRE(g.size() == w.size());
    double diff = 0, mag = 0, d2 = 0, w2 = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double d = std::abs(static_cast<double>(g[i]) - w[i]);
      diff = std::max(diff, d);
      mag = std::max(mag, static_cast<double>(std::abs(w[i])));
      d2 += d * d;
      w2 += static_cast<double>(w[i]) * w[i];
    }
    return std::pair<double, double>(diff / mag, std::sqrt(d2 / w2));
  };
  const Tensor ids = Tensor::from_vector<int64_t>({1, 4}, {482, 483, 494, 498});
  Tensor hidden, logits;
  for (const WeightPrecision p :
       {WeightPrecision::Float32, WeightPrecision::BFloat16, WeightPrecision::Int8}) {
    Session enc(kWhisper + "/encoder_model.onnx", options(p));
    Session dec(kWhisper + "/decoder_model.onnx", options(p));
    const Tensor h = enc.run({{"input_features", features}})[0].value.tensor();
    // Both decoders read float's encoder output: the decoder's own error alone.
    const Tensor l =
        dec.run({{"input_ids", ids}, {"encoder_hidden_states", hidden.defined() ? hidden : h}})[0]
            .value.tensor();
    if (p == WeightPrecision::Float32) {
      hidden = h;
      logits = l;
      continue;
    }
    const auto [enc_max, enc_rms] = errors(h, hidden);
    const auto [dec_max, dec_rms] = errors(l, logits);
    INFO("weights " << static_cast<int>(p) << ": encoder max " << enc_max << " rms " << enc_rms
                    << ", decoder max " << dec_max << " rms " << dec_rms);
    // Measured: bfloat16 0.9% / 0.7% (encoder, max / RMS), int8 5.5% / 3.0% (encoder) and
    // 2.6% (decoder's largest). The bounds leave about twice that.
    const double max_bound = p == WeightPrecision::Int8 ? 0.10 : 0.02;
    const double rms_bound = p == WeightPrecision::Int8 ? 0.06 : 0.015;
    CHECK(enc_max < max_bound);
    CHECK(enc_rms < rms_bound);
    CHECK(dec_max < max_bound);
    CHECK(dec_rms < rms_bound);
  }
}
