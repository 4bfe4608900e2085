// The weights cache of an Environment: equal weights loaded by several sessions (or twice
// in one model) are kept once, prepared forms are made once, entries are refcounted by the
// sessions holding them, and originals nobody reads are given back.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kiln/memory.h"
#include "ops/math/gemm.h"
#include "ops/math/winograd.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::proto::testing;
namespace fs = std::filesystem;

namespace {

std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 97) * scale;
  return v;
}

TensorSpec float_weight(const std::string& name, std::vector<float> v) {
  TensorSpec t;
  t.name = name;
  t.dims = {static_cast<int64_t>(v.size())};
  t.values = std::move(v);
  return t;
}

// y = (x + a) * b, with `prefix` naming nodes and weights so that two files holding the
// same weights differ in their bytes (as decoder_model and decoder_with_past_model do).
ModelSpec add_mul_model(const std::string& prefix, const std::vector<float>& a,
                        const std::vector<float>& b) {
  ModelSpec m;
  const auto n = static_cast<int64_t>(a.size());
  m.inputs = {{"x", {n}}};
  m.initializers = {float_weight(prefix + "a", a), float_weight(prefix + "b", b)};
  m.nodes = {{"Add", {"x", prefix + "a"}, {"t"}, prefix + "add", {}},
             {"Mul", {"t", prefix + "b"}, {"y"}, prefix + "mul", {}}};
  m.outputs = {"y"};
  return m;
}

std::vector<float> run_add_mul(Session& s, size_t n) {
  auto out = s.run(
      {{"x", Tensor::from_vector<float>({static_cast<int64_t>(n)}, std::vector<float>(n, 1.0f))}});
  return out.at(0).value.tensor().to_vector<float>();
}

std::vector<float> expected_add_mul(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = (1.0f + a[i]) * b[i];
  return y;
}

SessionOptions in(const std::shared_ptr<Environment>& env) {
  SessionOptions o;
  o.environment = env;
  return o;
}

// float16 raw bytes of `v` (values exact in half precision).
std::vector<uint8_t> half_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> raw(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const float16 h(v[i]);
    std::memcpy(raw.data() + 2 * i, &h, 2);
  }
  return raw;
}

// y = Cast<float>(MatMul(Cast<float16>(x), w)) with w a float16 [k, n] initializer.
ModelSpec half_matmul_model(const std::string& prefix, int64_t m, int64_t k, int64_t n,
                            const std::vector<float>& w) {
  ModelSpec spec;
  spec.inputs = {{"x", {m, k}}};
  TensorSpec t;
  t.name = prefix + "w";
  t.dtype = DataType::Float16;
  t.dims = {k, n};
  t.raw = half_bytes(w);
  spec.initializers = {t};
  spec.nodes = {{"Cast", {"x"}, {"xh"}, prefix + "cast_in", {{"to", 10}}},
                {"MatMul", {"xh", prefix + "w"}, {"yh"}, prefix + "matmul", {}},
                {"Cast", {"yh"}, {"y"}, prefix + "cast_out", {{"to", 1}}}};
  spec.outputs = {"y"};
  return spec;
}

// The product in double over the half-rounded operands, rounded to half as MatMul's output.
std::vector<float> naive_half_matmul(const std::vector<float>& x, const std::vector<float>& w,
                                     int64_t m, int64_t k, int64_t n) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += static_cast<double>(static_cast<float>(float16(x[i * k + p]))) *
               static_cast<float>(float16(w[p * n + j]));
      }
      y[i * n + j] = static_cast<float>(float16(static_cast<float>(acc)));
    }
  }
  return y;
}

std::vector<float> run_matmul(Session& s, const std::vector<float>& x, int64_t m, int64_t k) {
  auto out = s.run({{"x", Tensor::from_vector<float>({m, k}, x)}});
  return out.at(0).value.tensor().to_vector<float>();
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // One half ulp of the result: the float sum may round differently from the double one.
    REQUIRE(std::abs(got[i] - want[i]) <= std::abs(want[i]) * 1e-3f + 1e-3f);
  }
}

}  // namespace

TEST_CASE("sessions of one Environment keep one copy of equal weights from different files",
          "[weights-cache]") {
  TempDir dir;
  const size_t n = 5000;  // several pages
  const auto a = values(n, 0.5f), b = values(n, 0.25f);
  const std::string p1 = dir.file("first.onnx", model_bytes(add_mul_model("first_", a, b)));
  const std::string p2 = dir.file("second.onnx", model_bytes(add_mul_model("other_", a, b)));
  auto env = std::make_shared<Environment>(1);
  {
    Session s1(p1, in(env));
    CHECK(s1.load_stats().weights_shared_count == 0);
    WeightsCacheStats st = env->weights_cache_stats();
    CHECK(st.entries == 2);
    CHECK(st.loaded_entries == 2);
    CHECK(st.bytes == 2 * n * sizeof(float));
    CHECK(st.references == 2);
    {
      Session s2(p2, in(env));
      const LoadStats& l2 = s2.load_stats();
      CHECK(l2.weights_shared_count == 2);
      CHECK(l2.weights_shared_bytes == 2 * n * sizeof(float));
      CHECK(l2.weights_mapped_bytes + l2.weights_copied_bytes == 0);
      st = env->weights_cache_stats();
      CHECK(st.entries == 2);
      CHECK(st.references == 4);
      CHECK(run_add_mul(s2, n) == expected_add_mul(a, b));
      CHECK(run_add_mul(s1, n) == expected_add_mul(a, b));
    }
    CHECK(env->weights_cache_stats().references == 2);
    // The first session still runs on them.
    CHECK(run_add_mul(s1, n) == expected_add_mul(a, b));
  }
  const WeightsCacheStats st = env->weights_cache_stats();
  CHECK(st.entries == 0);
  CHECK(st.references == 0);
  CHECK(st.bytes == 0);
}

TEST_CASE("weights that differ only outside the fingerprinted blocks are not shared",
          "[weights-cache]") {
  TempDir dir;
  const size_t n = 16384;  // 64 KiB: sampled at the start, middle and end only
  const auto a = values(n, 0.5f), b = values(n, 0.25f);
  auto b2 = b;
  b2[2048] += 1.0f;  // byte 8192: after the first 4 KiB block, before the middle one
  const std::string p1 = dir.file("first.onnx", model_bytes(add_mul_model("", a, b)));
  const std::string p2 = dir.file("second.onnx", model_bytes(add_mul_model("", a, b2)));
  auto env = std::make_shared<Environment>(1);
  Session s1(p1, in(env));
  Session s2(p2, in(env));
  CHECK(s2.load_stats().weights_shared_count == 1);  // `a` only
  CHECK(env->weights_cache_stats().entries == 3);
  CHECK(run_add_mul(s1, n) == expected_add_mul(a, b));
  CHECK(run_add_mul(s2, n) == expected_add_mul(a, b2));
}

TEST_CASE("equal weights within one model are loaded once, share_weights off keeps them apart",
          "[weights-cache]") {
  TempDir dir;
  const size_t n = 1000;
  const auto a = values(n, 0.5f);
  const std::string path = dir.file("tied.onnx", model_bytes(add_mul_model("", a, a)));
  auto env = std::make_shared<Environment>(1);
  {
    Session s(path, in(env));
    CHECK(s.load_stats().weights_shared_count == 1);
    CHECK(s.load_stats().weights_shared_bytes == n * sizeof(float));
    CHECK(env->weights_cache_stats().entries == 1);
    CHECK(env->weights_cache_stats().references == 2);
    CHECK(run_add_mul(s, n) == expected_add_mul(a, a));

    SessionOptions apart = in(env);
    apart.share_weights = false;
    Session other(path, apart);
    CHECK(other.load_stats().weights_shared_count == 1);  // its own cache, within the model
    CHECK(env->weights_cache_stats().entries == 1);       // nothing added to the shared one
    CHECK(env->weights_cache_stats().references == 2);
    CHECK(run_add_mul(other, n) == expected_add_mul(a, a));
  }
  CHECK(env->weights_cache_stats().entries == 0);
}

TEST_CASE("a prepared form is made by the first session and shared by the next",
          "[weights-cache]") {
  TempDir dir;
  const int64_t m = 3, k = 64, n = 48;
  const auto w = values(static_cast<size_t>(k * n), 0.125f);
  const auto x = values(static_cast<size_t>(m * k), 0.0625f);
  const std::string p1 = dir.file("a.onnx", model_bytes(half_matmul_model("a_", m, k, n, w)));
  const std::string p2 = dir.file("b.onnx", model_bytes(half_matmul_model("b_", m, k, n, w)));
  const auto want = naive_half_matmul(x, w, m, k, n);
  auto env = std::make_shared<Environment>(1);
  {
    Session s1(p1, in(env));
    CHECK(s1.load_stats().weights_prepared_count == 1);
    // The prepared form is the weight widened and packed into the GEMM tiles' panels.
    const auto packed_bytes =
        static_cast<uint64_t>(math::PackedB::packed_floats(k, n, math::kernels().gemm.nr) * 4);
    CHECK(s1.load_stats().weights_prepared_bytes == packed_bytes);
    CHECK(s1.load_stats().weights_prepared_shared == 0);
    Session s2(p2, in(env));
    CHECK(s2.load_stats().weights_shared_count == 1);
    CHECK(s2.load_stats().weights_prepared_count == 0);  // prepares nothing
    CHECK(s2.load_stats().weights_prepared_shared == 1);
    const WeightsCacheStats st = env->weights_cache_stats();
    CHECK(st.prepared_made == 1);
    CHECK(st.prepared_hits == 1);
    CHECK(st.prepared_entries == 1);
    CHECK(st.loaded_entries == 1);
    CHECK(st.bytes == static_cast<uint64_t>(k * n * 2) + packed_bytes);
    check_close(run_matmul(s1, x, m, k), want);
    check_close(run_matmul(s2, x, m, k), want);
    // A session with a cache of its own prepares its own copy.
    SessionOptions apart = in(env);
    apart.share_weights = false;
    Session s3(p1, apart);
    CHECK(s3.load_stats().weights_prepared_count == 1);
    check_close(run_matmul(s3, x, m, k), want);
  }
  const WeightsCacheStats st = env->weights_cache_stats();
  CHECK(st.entries == 0);
  CHECK(st.references == 0);
}

TEST_CASE("a half MatMul with a prepared weight matches the naive product on random shapes",
          "[weights-cache]") {
  TempDir dir;
  std::mt19937 rng(7);
  auto env = std::make_shared<Environment>(1);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t m = 1 + static_cast<int64_t>(rng() % 9), k = 1 + static_cast<int64_t>(rng() % 70),
                  n = 1 + static_cast<int64_t>(rng() % 40);
    std::uniform_int_distribution<int> q(-64, 64);
    std::vector<float> w(static_cast<size_t>(k * n)), x(static_cast<size_t>(m * k));
    for (float& v : w) v = static_cast<float>(q(rng)) / 64.0f;
    for (float& v : x) v = static_cast<float>(q(rng)) / 32.0f;
    const std::string path = dir.file("r" + std::to_string(trial) + ".onnx",
                                      model_bytes(half_matmul_model("", m, k, n, w)));
    Session s(path, in(env));
    CHECK(s.load_stats().weights_prepared_count == 1);
    check_close(run_matmul(s, x, m, k), naive_half_matmul(x, w, m, k, n));
  }
  CHECK(env->weights_cache_stats().entries == 0);
}

TEST_CASE("the mapped original of a weight read only in prepared form is given back",
          "[weights-cache]") {
  TempDir dir;
  const int64_t m = 2, k = 512, n = 64;  // 64 KiB of float16: whole pages inside
  const auto w = values(static_cast<size_t>(k * n), 0.125f);
  ModelSpec spec = half_matmul_model("", m, k, n, w);
  // External data, page aligned: the weight is a view of the mapped file.
  spec.initializers[0].store = TensorSpec::Store::External;
  spec.initializers[0].location = "w.bin";
  spec.initializers[0].offset = "0";
  spec.initializers[0].length = std::to_string(k * n * 2);
  const std::vector<uint8_t> raw = half_bytes(w);
  dir.file("w.bin", std::string(raw.begin(), raw.end()));
  const std::string path = dir.file("model.onnx", model_bytes(spec));
  Session s(path);
  CHECK(s.load_stats().weights_mapped_bytes == static_cast<uint64_t>(k * n * 2));
  CHECK(s.load_stats().weights_original_released_bytes ==
        static_cast<uint64_t>(k * n * 2) / page_size() * page_size());
  const auto x = values(static_cast<size_t>(m * k), 0.0625f);
  check_close(run_matmul(s, x, m, k), naive_half_matmul(x, w, m, k, n));
}

TEST_CASE("a hollow constant given later is shared and prepared at set_constant",
          "[weights-cache]") {
  TempDir dir;
  const int64_t m = 2, k = 32, n = 16;
  const auto w = values(static_cast<size_t>(k * n), 0.125f);
  ModelSpec spec = half_matmul_model("", m, k, n, w);
  spec.initializers[0].store = TensorSpec::Store::External;
  spec.initializers[0].location = "missing.bin";
  spec.initializers[0].offset = "0";
  spec.initializers[0].length = std::to_string(k * n * 2);
  const std::string path = dir.file("model.onnx", model_bytes(spec));
  auto env = std::make_shared<Environment>(1);
  SessionOptions o = in(env);
  o.defer_missing_weights = true;
  const std::vector<uint8_t> raw = half_bytes(w);
  const auto x = values(static_cast<size_t>(m * k), 0.0625f);
  Session s1(path, o);
  CHECK(s1.load_stats().weights_prepared_count == 0);  // nothing to prepare yet
  s1.set_constant("w", raw.data(), raw.size());
  CHECK(s1.load_stats().weights_copied_bytes == raw.size());
  CHECK(s1.load_stats().weights_prepared_count == 1);
  check_close(run_matmul(s1, x, m, k), naive_half_matmul(x, w, m, k, n));
  Session s2(path, o);
  s2.set_constant("w", raw.data(), raw.size());
  CHECK(s2.load_stats().weights_copied_bytes == 0);
  CHECK(s2.load_stats().weights_shared_bytes == raw.size());
  CHECK(s2.load_stats().weights_prepared_count == 0);
  CHECK(s2.load_stats().weights_prepared_shared == 1);
  check_close(run_matmul(s2, x, m, k), naive_half_matmul(x, w, m, k, n));
}

TEST_CASE("sessions created concurrently share one copy and one prepared form", "[weights-cache]") {
  TempDir dir;
  const int64_t m = 2, k = 128, n = 96;
  const auto w = values(static_cast<size_t>(k * n), 0.125f);
  std::vector<std::string> paths;
  for (int i = 0; i < 4; ++i) {
    paths.push_back(
        dir.file("m" + std::to_string(i) + ".onnx",
                 model_bytes(half_matmul_model("s" + std::to_string(i) + "_", m, k, n, w))));
  }
  auto env = std::make_shared<Environment>(2);
  const auto x = values(static_cast<size_t>(m * k), 0.0625f);
  const auto want = naive_half_matmul(x, w, m, k, n);
  {
    std::vector<std::unique_ptr<Session>> sessions(paths.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < paths.size(); ++i) {
      threads.emplace_back([&, i] { sessions[i] = std::make_unique<Session>(paths[i], in(env)); });
    }
    for (auto& t : threads) t.join();
    const WeightsCacheStats st = env->weights_cache_stats();
    CHECK(st.loaded_entries == 1);
    CHECK(st.prepared_entries == 1);
    CHECK(st.references == 8);  // each session: the weight and its prepared form
    uint64_t made = 0, shared = 0;
    for (auto& s : sessions) {
      made += s->load_stats().weights_prepared_count;
      shared += s->load_stats().weights_prepared_shared;
      check_close(run_matmul(*s, x, m, k), want);
    }
    CHECK(made + shared == 4);
  }
  CHECK(env->weights_cache_stats().entries == 0);
}

TEST_CASE("float weights of MatMul, Gemm and Conv are packed once per Environment, runs pack none",
          "[weights-cache][gemm]") {
  TempDir dir;
  const int64_t m = 64, k = 48, n = 40, n2 = 24;
  ModelSpec spec;
  spec.inputs = {{"x", {m, k}}, {"img", {1, 8, 10, 10}}};
  auto weight = [](const char* name, std::vector<int64_t> dims, float scale) {
    TensorSpec t;
    t.name = name;
    t.dims = dims;
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    t.values = values(static_cast<size_t>(count), scale);
    return t;
  };
  const TensorSpec w1 = weight("w1", {k, n}, 0.01f), w2 = weight("w2", {n2, n}, 0.02f),
                   w3 = weight("w3", {16, 8, 3, 3}, 0.03f);
  spec.initializers = {w1, w2, w3};
  spec.nodes = {{"MatMul", {"x", "w1"}, {"h"}, "matmul", {}},
                {"Gemm", {"h", "w2"}, {"y"}, "gemm", {{"transB", 1}}},
                {"Conv", {"img", "w3"}, {"z"}, "conv", {}}};
  spec.outputs = {"y", "z"};
  const std::string path = dir.file("packed.onnx", model_bytes(spec));
  const std::vector<float> x = values(static_cast<size_t>(m * k), 0.05f);
  const std::vector<float> img = values(800, 0.07f);
  auto feeds = [&] {
    return std::vector<NamedValue>{{"x", Tensor::from_vector<float>({m, k}, x)},
                                   {"img", Tensor::from_vector<float>({1, 8, 10, 10}, img)}};
  };
  // The reference: y = (x w1) w2^T and the convolution, naively in double.
  std::vector<double> h(static_cast<size_t>(m * n)), y(static_cast<size_t>(m * n2));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += double(x[i * k + p]) * w1.values[p * n + j];
      h[i * n + j] = static_cast<float>(s);
    }
    for (int64_t j = 0; j < n2; ++j) {
      double s = 0;
      for (int64_t p = 0; p < n; ++p) s += h[i * n + p] * w2.values[j * n + p];
      y[i * n2 + j] = s;
    }
  }
  std::vector<double> z(16 * 8 * 8, 0.0);
  for (int o = 0; o < 16; ++o)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c)
        for (int ch = 0; ch < 8; ++ch)
          for (int dr = 0; dr < 3; ++dr)
            for (int dc = 0; dc < 3; ++dc)
              z[(o * 8 + r) * 8 + c] += double(img[(ch * 10 + r + dr) * 10 + c + dc]) *
                                        w3.values[((o * 8 + ch) * 3 + dr) * 3 + dc];
  auto check = [&](Session& s) {
    const uint64_t packs = math::gemm_b_packs();
    auto out = s.run(feeds());
    CHECK(math::gemm_b_packs() == packs);  // no B was packed while running
    const auto got_y = out.at(0).value.tensor().to_vector<float>();
    const auto got_z = out.at(1).value.tensor().to_vector<float>();
    REQUIRE(got_y.size() == y.size());
    REQUIRE(got_z.size() == z.size());
    for (size_t i = 0; i < y.size(); ++i)
      REQUIRE(std::abs(got_y[i] - y[i]) <= 1e-4 * (1 + std::abs(y[i])));
    for (size_t i = 0; i < z.size(); ++i)
      REQUIRE(std::abs(got_z[i] - z[i]) <= 1e-4 * (1 + std::abs(z[i])));
  };
  auto env = std::make_shared<Environment>(1);
  Session s1(path, in(env));
  CHECK(s1.load_stats().weights_prepared_count == 3);  // MatMul's B, Gemm's B^T, the filter
  Session s2(path, in(env));
  CHECK(s2.load_stats().weights_prepared_count == 0);  // packs nothing
  CHECK(s2.load_stats().weights_prepared_shared == 3);
  CHECK(env->weights_cache_stats().prepared_entries == 3);
  check(s1);
  check(s2);

  // The counter does count: a B that is a graph input is packed at run time.
  ModelSpec dyn;
  dyn.inputs = {{"x", {m, k}}, {"w", {k, n}}};
  dyn.nodes = {{"MatMul", {"x", "w"}, {"h"}, "matmul", {}}};
  dyn.outputs = {"h"};
  Session s3(dir.file("dynamic.onnx", model_bytes(dyn)), in(env));
  const uint64_t before = math::gemm_b_packs();
  s3.run({{"x", Tensor::from_vector<float>({m, k}, x)},
          {"w", Tensor::from_vector<float>({k, n}, w1.values)}});
  CHECK(math::gemm_b_packs() == before + 1);
}

TEST_CASE("a 3x3 stride-1 Conv filter is transformed for Winograd once per Environment",
          "[weights-cache][winograd]") {
  // The declared input shape makes the convolution a Winograd one (ops/math/winograd.h): its
  // filter's prepared form is the 36 transformed, packed positions, made by the first session
  // and shared by the next; runs transform no filter.
  TempDir dir;
  const int64_t c = 16, m = 24, h = 20, w = 18;
  ModelSpec spec;
  spec.inputs = {{"img", {1, c, h, w}}};
  TensorSpec filter;
  filter.name = "w";
  filter.dims = {m, c, 3, 3};
  filter.values = values(static_cast<size_t>(m * c * 9), 0.01f);
  spec.initializers = {filter};
  spec.nodes = {{"Conv", {"img", "w"}, {"y"}, "conv", {}}};
  spec.outputs = {"y"};
  const std::string path = dir.file("winograd.onnx", model_bytes(spec));
  const std::vector<float> img = values(static_cast<size_t>(c * h * w), 0.03f);
  const int64_t oh = h - 2, ow = w - 2;  // 5 x 4 tiles
  std::vector<double> want(static_cast<size_t>(m * oh * ow), 0.0);
  for (int64_t o = 0; o < m; ++o)
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t q = 0; q < ow; ++q)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t dr = 0; dr < 3; ++dr)
            for (int64_t dq = 0; dq < 3; ++dq) {
              const int64_t ir = r + dr, iq = q + dq;
              want[static_cast<size_t>((o * oh + r) * ow + q)] +=
                  double(img[static_cast<size_t>((ch * h + ir) * w + iq)]) *
                  filter.values[static_cast<size_t>(((o * c + ch) * 3 + dr) * 3 + dq)];
            }
  auto check = [&](Session& s) {
    const uint64_t before = math::winograd_convolutions();
    auto out = s.run({{"img", Tensor::from_vector<float>({1, c, h, w}, img)}});
    CHECK(math::winograd_convolutions() == before + 1);
    const auto got = out.at(0).value.tensor().to_vector<float>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      REQUIRE(std::abs(got[i] - want[i]) <= 1e-4 * (1 + std::abs(want[i])));
  };
  auto env = std::make_shared<Environment>(1);
  Session s1(path, in(env));
  CHECK(s1.load_stats().weights_prepared_count == 1);
  CHECK(s1.load_stats().weights_prepared_bytes ==
        static_cast<uint64_t>(math::winograd_filter_floats(m, c, math::kernels().gemm.mr, 4) * 4));
  Session s2(path, in(env));
  CHECK(s2.load_stats().weights_prepared_count == 0);
  CHECK(s2.load_stats().weights_prepared_shared == 1);
  check(s1);
  check(s2);
}

TEST_CASE("SessionOptions::gemm_weights keeps MatMul and Gemm weights packed in half precision",
          "[weights-cache][gemm]") {
  TempDir dir;
  const int64_t m = 5, k = 70, n = 45;
  ModelSpec spec;
  spec.inputs = {{"x", {m, k}}};
  TensorSpec w;
  w.name = "w";
  w.dims = {k, n};
  w.values.resize(static_cast<size_t>(k * n));
  for (size_t i = 0; i < w.values.size(); ++i)
    w.values[i] = std::sin(0.37f * static_cast<float>(i));
  spec.initializers = {w};
  spec.nodes = {{"MatMul", {"x", "w"}, {"y"}, "matmul", {}}};
  spec.outputs = {"y"};
  const std::string path = dir.file("w.onnx", model_bytes(spec));
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.11f * static_cast<float>(i));
  for (const WeightPrecision precision :
       {WeightPrecision::Float32, WeightPrecision::BFloat16, WeightPrecision::Float16}) {
    SessionOptions o;
    o.gemm_weights = precision;
    Session s(path, o);
    const int64_t elements = math::PackedB::packed_floats(k, n, math::kernels().gemm.nr);
    CHECK(s.load_stats().weights_prepared_bytes ==
          static_cast<uint64_t>(elements * (precision == WeightPrecision::Float32 ? 4 : 2)));
    const auto y = run_matmul(s, x, m, k);
    // The product in double with the weights rounded as packed.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t p = 0; p < k; ++p) {
          const float v = w.values[static_cast<size_t>(p * n + j)];
          const float r = precision == WeightPrecision::BFloat16  ? static_cast<float>(bfloat16(v))
                          : precision == WeightPrecision::Float16 ? static_cast<float>(float16(v))
                                                                  : v;
          want += static_cast<double>(x[static_cast<size_t>(i * k + p)]) * r;
        }
        REQUIRE(std::abs(y[static_cast<size_t>(i * n + j)] - want) <= 1e-4 * (1 + std::abs(want)));
      }
    }
  }
}
