// com.microsoft MultiHeadAttention, GroupQueryAttention and RotaryEmbedding against naive double
// references written here from onnxruntime's ContribOperators.md and CPU kernels: random
// shapes, optional inputs, GroupQueryAttention's present written over a past buffer with room
// (no bytes copied, the same storage), and bad inputs failing with an Error naming the node.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kiln/tensor_file.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr const char* kMs = "com.microsoft";

// softmax(scores + bias) . values for one query row; bias of -inf excludes a key.
std::vector<double> attend(const std::vector<double>& scores, const std::vector<double>& bias,
                           const std::vector<std::vector<double>>& values) {
  double mx = -INFINITY;
  for (size_t j = 0; j < scores.size(); ++j) mx = std::max(mx, scores[j] + bias[j]);
  std::vector<double> w(scores.size());
  double sum = 0;
  for (size_t j = 0; j < scores.size(); ++j) sum += w[j] = std::exp(scores[j] + bias[j] - mx);
  std::vector<double> out(values.empty() ? 0 : values[0].size(), 0.0);
  for (size_t j = 0; j < values.size(); ++j) {
    for (size_t d = 0; d < out.size(); ++d) out[d] += w[j] / sum * values[j][d];
  }
  return out;
}

}  // namespace

TEST_CASE("com.microsoft.MultiHeadAttention", "[ops][contrib][attention]") {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t B = 1 + trial % 2, S = 1 + trial % 3, L = 2 + trial % 4, N = 1 + trial % 3;
    const int64_t H = 4 + 4 * (trial % 2), P = trial % 3 == 2 ? 0 : 1 + trial % 4;
    const bool uni = trial % 2 == 1, with_bias = trial % 3 != 1, with_mask = trial % 4 != 0;
    const int64_t D = N * H, T = P + L;
    INFO("trial " << trial);
    const Tensor q = random_tensor(DataType::Float, {B, S, D}, rng);
    const Tensor k = random_tensor(DataType::Float, {B, L, D}, rng);
    const Tensor v = random_tensor(DataType::Float, {B, L, D}, rng);
    const Tensor bias = random_tensor(DataType::Float, {3 * D}, rng);
    const Tensor pk = random_tensor(DataType::Float, {B, N, P, H}, rng);
    const Tensor pv = random_tensor(DataType::Float, {B, N, P, H}, rng);
    const Tensor ab = random_tensor(DataType::Float, {1, N, S, T}, rng);
    std::vector<int32_t> mask_values(static_cast<size_t>(B * T), 1);
    // The last key of the last batch: no row is masked throughout (whose float sums of -10000
    // lose the scores' precision; onnxruntime's models cover that row).
    mask_values.back() = 0;
    const Tensor mask = int32_tensor({B, T}, mask_values);
    OpTest t("MultiHeadAttention", 1, kMs);
    t.input(q).input(k).input(v);
    with_bias ? t.input(bias) : t.no_input();
    with_mask ? t.input(mask) : t.no_input();
    t.input(ab);
    if (P > 0) t.input(pk).input(pv);
    t.attr("num_heads", N).attr("unidirectional", uni ? 1 : 0).outputs(3);
    const auto out = t.run();

    const double scale = 1 / std::sqrt(static_cast<double>(H));
    auto bias_of = [&](int64_t at) { return with_bias ? element(bias, at) : 0.0; };
    std::vector<double> want(static_cast<size_t>(B * S * D)), present_k;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t n = 0; n < N; ++n) {
        std::vector<std::vector<double>> keys, vals;
        for (int64_t j = 0; j < T; ++j) {
          std::vector<double> kr(H), vr(H);
          for (int64_t d = 0; d < H; ++d) {
            if (j < P) {
              kr[d] = element(pk, ((b * N + n) * P + j) * H + d);
              vr[d] = element(pv, ((b * N + n) * P + j) * H + d);
            } else {
              const int64_t at = (b * L + j - P) * D + n * H + d;
              kr[d] = element(k, at) + bias_of(D + n * H + d);
              vr[d] = element(v, at) + bias_of(2 * D + n * H + d);
            }
            present_k.push_back(kr[d]);
          }
          keys.push_back(kr), vals.push_back(vr);
        }
        for (int64_t i = 0; i < S; ++i) {
          std::vector<double> sc(T), add(T);
          for (int64_t j = 0; j < T; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < H; ++d) {
              dot += (element(q, (b * S + i) * D + n * H + d) + bias_of(n * H + d)) * keys[j][d];
            }
            sc[j] = scale * dot;
            const bool masked = (with_mask && mask_values[b * T + j] == 0) || (uni && j > P + i);
            add[j] = (masked ? -10000.0 : 0.0) + element(ab, (n * S + i) * T + j);
          }
          const auto row = attend(sc, add, vals);
          for (int64_t d = 0; d < H; ++d) want[(b * S + i) * D + n * H + d] = row[d];
        }
      }
    }
    require_near(out[0].tensor(), want, 2e-5);
    CHECK(out[1].tensor().shape() == Shape{B, N, T, H});
    require_near(out[1].tensor(), present_k, 1e-6);
  }
  const Tensor x = Tensor::zeros(DataType::Float, {1, 2, 8});
  REQUIRE_THROWS_WITH(OpTest("MultiHeadAttention", 1, kMs)
                          .input(Tensor::zeros(DataType::Float, {1, 2, 2, 3, 4}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("MultiHeadAttention") && Catch::Contains("packed"));
  REQUIRE_THROWS_WITH(OpTest("MultiHeadAttention", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float, {1, 3, 6}))
                          .input(x)
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("MultiHeadAttention") && Catch::Contains("does not match"));
  REQUIRE_THROWS_WITH(OpTest("MultiHeadAttention", 1, kMs)
                          .input(x)
                          .input(x)
                          .input(x)
                          .no_input()
                          .input(int32_tensor({4}, {1, 1, 1, 1}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("MultiHeadAttention") && Catch::Contains("key_padding_mask"));
}

namespace {

struct Gqa {
  int64_t B, S, N, Nk, H, P, total;
  std::vector<int32_t> lengths;  // per batch: keys after this step
  int64_t window = -1;
};

// The naive GroupQueryAttention (no rotary): present rows and outputs.
std::vector<double> gqa_reference(const Gqa& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& pk, const Tensor& pv) {
  const bool first = g.S == g.total;
  std::vector<double> want(static_cast<size_t>(g.B * g.S * g.N * g.H));
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t len = g.lengths[b], past = first ? 0 : len - g.S;
    for (int64_t n = 0; n < g.N; ++n) {
      const int64_t kh = n / (g.N / g.Nk);
      std::vector<std::vector<double>> keys, vals;
      for (int64_t j = 0; j < len; ++j) {
        std::vector<double> kr(g.H), vr(g.H);
        for (int64_t d = 0; d < g.H; ++d) {
          if (j < past) {
            kr[d] = element(pk, ((b * g.Nk + kh) * g.P + j) * g.H + d);
            vr[d] = element(pv, ((b * g.Nk + kh) * g.P + j) * g.H + d);
          } else {
            kr[d] = element(k, (b * g.S + j - past) * g.Nk * g.H + kh * g.H + d);
            vr[d] = element(v, (b * g.S + j - past) * g.Nk * g.H + kh * g.H + d);
          }
        }
        keys.push_back(kr), vals.push_back(vr);
      }
      for (int64_t i = 0; i < g.S; ++i) {
        const int64_t pos = past + i;
        std::vector<double> sc(static_cast<size_t>(len)), add(static_cast<size_t>(len));
        for (int64_t j = 0; j < len; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < g.H; ++d) {
            dot += element(q, (b * g.S + i) * g.N * g.H + n * g.H + d) * keys[j][d];
          }
          sc[j] = dot / std::sqrt(static_cast<double>(g.H));
          const bool out = j > pos || (g.window > 0 && j < pos - g.window + 1);
          add[j] = out ? -INFINITY : 0.0;
        }
        const auto row = attend(sc, add, vals);
        for (int64_t d = 0; d < g.H; ++d) want[((b * g.S + i) * g.N + n) * g.H + d] = row[d];
      }
    }
  }
  return want;
}

}  // namespace

TEST_CASE("com.microsoft.GroupQueryAttention", "[ops][contrib][attention]") {
  std::mt19937 rng(23);
  const std::vector<Gqa> cases = {
      {2, 4, 4, 2, 8, 0, 4, {4, 2}},          // first prompt, the second sequence padded
      {1, 1, 2, 1, 4, 5, 6, {6}},             // decode after a past of exactly 5
      {2, 1, 6, 2, 4, 9, 5, {5, 3}, 2},       // decode into a buffer with room, local window
      {1, 3, 4, 4, 8, 4, 7, {7}},             // a second chunk of a prompt
      {3, 2, 2, 2, 16, 12, 10, {10, 4, 7}}};  // two tokens per sequence into a shared buffer
  for (const Gqa& g : cases) {
    INFO("B " << g.B << " S " << g.S << " P " << g.P);
    const Tensor q = random_tensor(DataType::Float, {g.B, g.S, g.N * g.H}, rng);
    const Tensor k = random_tensor(DataType::Float, {g.B, g.S, g.Nk * g.H}, rng);
    const Tensor v = random_tensor(DataType::Float, {g.B, g.S, g.Nk * g.H}, rng);
    const Tensor pk = random_tensor(DataType::Float, {g.B, g.Nk, g.P, g.H}, rng);
    const Tensor pv = random_tensor(DataType::Float, {g.B, g.Nk, g.P, g.H}, rng);
    std::vector<int32_t> seqlens;
    for (int32_t n : g.lengths) seqlens.push_back(n - 1);
    const auto want = gqa_reference(g, q, k, v, pk, pv);
    const bool shared = g.P >= g.total;
    const int64_t present = std::max(g.P, g.total);
    // Past rows each batch keeps when present is a new buffer.
    uint64_t kept = 0;
    for (int32_t n : g.lengths) kept += static_cast<uint64_t>(g.S == g.total ? 0 : n - g.S);
    for (const bool owned : {false, true}) {
      INFO("owned inputs " << owned);
      Tensor pk_in = pk.clone(), pv_in = pv.clone();
      const std::byte* past_storage = pk_in.raw_data();
      OpTest t("GroupQueryAttention", 1, kMs);
      t.input(q).input(k).input(v).input(std::move(pk_in)).input(std::move(pv_in));
      t.input(int32_tensor({g.B}, seqlens))
          .input(int32_tensor({}, {static_cast<int32_t>(g.total)}));
      t.attr("num_heads", g.N).attr("kv_num_heads", g.Nk).attr("local_window_size", g.window);
      if (owned) t.owned_inputs();
      const auto out = t.outputs(3).run();
      require_near(out[0].tensor(), want, 2e-5);
      REQUIRE(out[1].tensor().shape() == Shape{g.B, g.Nk, present, g.H});
      const bool aliased = owned && shared;
      // In place: present is the past's storage and nothing is copied; else exactly the kept
      // past rows of K and V are.
      CHECK((out[1].tensor().raw_data() == past_storage) == aliased);
      CHECK(t.stats().in_place_ops == (aliased ? 1u : 0u));
      CHECK(t.stats().bytes_copied == (aliased ? 0 : 2 * kept * g.Nk * g.H * sizeof(float)));
      // This step's rows of K sit after each batch's past.
      for (int64_t b = 0; b < g.B; ++b) {
        const int64_t at = g.S == g.total ? 0 : g.lengths[b] - g.S;
        for (int64_t s = 0; s < g.S; ++s) {
          CHECK(element(out[1].tensor(), ((b * g.Nk + 0) * present + at + s) * g.H) ==
                element(k, (b * g.S + s) * g.Nk * g.H));
        }
      }
    }
  }
  // Bad inputs: head counts, lengths beyond the total, a quantized cache.
  const Tensor q = Tensor::zeros(DataType::Float, {1, 1, 8});
  const Tensor past = Tensor::zeros(DataType::Float, {1, 1, 4, 4});
  auto gqa = [&](int32_t seqlen, int64_t heads) {
    return OpTest("GroupQueryAttention", 1, kMs)
        .input(q)
        .input(Tensor::zeros(DataType::Float, {1, 1, 4}))
        .input(Tensor::zeros(DataType::Float, {1, 1, 4}))
        .input(past)
        .input(past)
        .input(int32_tensor({1}, {seqlen}))
        .input(int32_tensor({}, {5}))
        .attr("num_heads", heads)
        .attr("kv_num_heads", 1);
  };
  CHECK_NOTHROW(gqa(4, 2).run());
  REQUIRE_THROWS_WITH(gqa(4, 3).run(),
                      Catch::Contains("GroupQueryAttention") && Catch::Contains("query"));
  REQUIRE_THROWS_WITH(gqa(7, 2).run(),
                      Catch::Contains("GroupQueryAttention") && Catch::Contains("seqlens_k"));
  REQUIRE_THROWS_WITH(gqa(4, 2).attr("kv_cache_bit_width", 8).run(),
                      Catch::Contains("GroupQueryAttention") && Catch::Contains("not supported"));
}

TEST_CASE("com.microsoft.RotaryEmbedding", "[ops][contrib]") {
  std::mt19937 rng(29);
  for (const bool interleaved : {false, true}) {
    const int64_t B = 2, S = 3, N = 2, H = 8, R = 4, M = 10;
    const Tensor x = random_tensor(DataType::Float, {B, S, N * H}, rng);
    const Tensor cos = random_tensor(DataType::Float, {M, R / 2}, rng);
    const Tensor sin = random_tensor(DataType::Float, {M, R / 2}, rng);
    const Tensor pos = Tensor::from_vector<int64_t>({1}, {6});
    const Tensor y = OpTest("RotaryEmbedding", 1, kMs)
                         .input(x)
                         .input(pos)
                         .input(cos)
                         .input(sin)
                         .attr("interleaved", interleaved ? 1 : 0)
                         .attr("rotary_embedding_dim", R)
                         .attr("num_heads", N)
                         .run1();
    std::vector<double> want;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t n = 0; n < N; ++n) {
          const int64_t base = (b * S + s) * N * H + n * H;
          for (int64_t d = 0; d < H; ++d) {
            if (d >= R) {
              want.push_back(element(x, base + d));
              continue;
            }
            const int64_t i = interleaved ? d / 2 : d % (R / 2);
            const bool first = interleaved ? d % 2 == 0 : d < R / 2;
            const int64_t mate =
                interleaved ? (first ? d + 1 : d - 1) : (first ? d + R / 2 : d - R / 2);
            const double c = element(cos, (6 + s) * (R / 2) + i);
            const double sn = element(sin, (6 + s) * (R / 2) + i);
            const double a = element(x, base + d), m = element(x, base + mate);
            want.push_back(first ? c * a - sn * m : sn * m + c * a);
          }
        }
      }
    }
    require_near(y, want, 1e-6);
  }
  REQUIRE_THROWS_WITH(OpTest("RotaryEmbedding", 1, kMs)
                          .input(Tensor::zeros(DataType::Float, {1, 2, 8}))
                          .input(Tensor::from_vector<int64_t>({1}, {9}))
                          .input(Tensor::zeros(DataType::Float, {10, 4}))
                          .input(Tensor::zeros(DataType::Float, {10, 4}))
                          .run(),
                      Catch::Contains("RotaryEmbedding") && Catch::Contains("outside the cache"));
}

// onnxruntime-genai's tiny Llama (tools/export/make_ort_attention.py), one decoding step with
// the caches passed by move: each GroupQueryAttention writes this step's rows into the past
// buffer (16 positions) and returns it as present, so the caches cost no copy at all.
TEST_CASE("GroupQueryAttention updates onnxruntime-genai's shared KV buffers in place",
          "[ops][contrib][attention]") {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/models/llama-tiny-genai/";
  Session session(dir + "model.onnx");
  auto feeds = [&] {
    std::vector<NamedValue> v;
    for (size_t k = 0; k < session.inputs().size(); ++k) {
      const std::string file = dir + "test_data_set_1/input_" + std::to_string(k) + ".pb";
      // A copy the run may own (the file's tensor may be a read-only view of its bytes).
      v.push_back(
          {session.inputs()[k].name, read_value_file(file, session.inputs()[k]).tensor().clone()});
    }
    return v;
  };
  // Shared handles: the caches may not be written, so present is a new buffer.
  const std::vector<NamedValue> kept = feeds();
  const auto copied = session.run(kept);
  const uint64_t copied_bytes = session.last_run_stats().bytes_copied;
  std::vector<NamedValue> moved = feeds();
  std::vector<const std::byte*> past;
  for (const NamedValue& nv : moved) past.push_back(nv.value.tensor().raw_data());
  const auto shared = session.run(std::move(moved));
  const RunStats& stats = session.last_run_stats();
  CHECK(stats.in_place_ops >= 2);
  // Batch 0 keeps 5 past rows and batch 1 keeps 3, of 2 KV heads of 16 floats, in K and V of
  // both layers: exactly what the copying run copied more.
  CHECK(copied_bytes - stats.bytes_copied == 2 * 2 * (5 + 3) * 2 * 16 * sizeof(float));
  for (size_t o = 0; o < shared.size(); ++o) {
    const std::string file = dir + "test_data_set_1/output_" + std::to_string(o) + ".pb";
    const Value want = read_value_file(file, session.outputs()[o]);
    require_close(copied[o].value.tensor(), want.tensor(), 1e-3, 1e-5);
    // Rows past each sequence's keys (6 and 4) are left as the buffer held them (onnxruntime's
    // new buffer has zeros there): compared up to those.
    Tensor got = shared[o].value.tensor().clone();
    if (o > 0) {
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < 2; ++h) {
          float* plane = got.data<float>() + (b * 2 + h) * 16 * 16;
          std::fill(plane + (b == 0 ? 6 : 4) * 16, plane + 16 * 16, 0.0f);
        }
      }
    }
    require_close(got, want.tensor(), 1e-3, 1e-5);
    if (o == 0) continue;
    // present.N.key / present.N.value are the inputs past_key_values.N.key / .value.
    const auto in = std::find_if(
        session.inputs().begin(), session.inputs().end(),
        [&](const IoInfo& i) { return i.name == "past_key_values" + shared[o].name.substr(7); });
    REQUIRE(in != session.inputs().end());
    CHECK(shared[o].value.tensor().raw_data() == past[in - session.inputs().begin()]);
  }
}
