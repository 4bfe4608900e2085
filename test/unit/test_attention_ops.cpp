// Attention-style ops (Attention, RotaryEmbedding, Swish/SwiGLU, LinearAttention,
// CausalConvWithState, FlexAttention) against plain-loop references on random shapes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/runtime/session_internal.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Element (i0, i1, i2, i3) of a contiguous 4-D tensor.
double at4(const Tensor& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return element(t, ((a * t.dim(1) + b) * t.dim(2) + c) * t.dim(3) + d);
}

// [B, H, L, d] -> [B, L, H*d]
Tensor pack3(const Tensor& t) {
  const int64_t B = t.dim(0), H = t.dim(1), L = t.dim(2), d = t.dim(3);
  Tensor out = Tensor::zeros(t.dtype(), {B, L, H * d});
  std::vector<float> v(static_cast<size_t>(out.numel()));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t e = 0; e < d; ++e)
          v[static_cast<size_t>((b * L + l) * H * d + h * d + e)] =
              static_cast<float>(at4(t, b, h, l, e));
  return Tensor::from_vector<float>(out.shape(), v);
}

Tensor concat_seq(const Tensor& past, const Tensor& cur) {
  const int64_t B = cur.dim(0), H = cur.dim(1), P = past.dim(2), S = cur.dim(2), d = cur.dim(3);
  std::vector<float> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < P + S; ++l)
        for (int64_t e = 0; e < d; ++e)
          v.push_back(static_cast<float>(l < P ? at4(past, b, h, l, e) : at4(cur, b, h, l - P, e)));
  return Tensor::from_vector<float>({B, H, P + S, d}, v);
}

struct AttnSpec {
  bool causal = false;
  double scale = 0;  // 0 = default
  double softcap = 0;
  int64_t past = 0;
  std::vector<int64_t> nonpad;  // empty = none
  int64_t left = -1, right = -1;
  int mode = 0;
};

// Spec formula, one query row at a time. k and v hold every key (past included).
std::pair<Tensor, Tensor> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor* mask, const AttnSpec& s) {
  const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), D = q.dim(3);
  const int64_t Hkv = k.dim(1), T = k.dim(2), Dv = v.dim(3);
  const double scale = s.scale != 0 ? s.scale : 1 / std::sqrt(double(D));
  Tensor y = Tensor::zeros(DataType::Float, {B, Hq, Sq, Dv});
  Tensor qk = Tensor::zeros(DataType::Float, {B, Hq, Sq, T});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / (Hq / Hkv);
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t offset = s.nonpad.empty() ? s.past : s.nonpad[static_cast<size_t>(b)] - Sq;
        std::vector<double> x(static_cast<size_t>(T)), out(static_cast<size_t>(T));
        bool any = false;
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += at4(q, b, h, i, e) * at4(k, b, kh, j, e);
          double sc = dot * scale;
          const double raw = sc;
          if (s.softcap > 0) sc = s.softcap * std::tanh(sc / s.softcap);
          double bias = 0;
          if (mask) {
            const int64_t r = int64_t(mask->rank()), len = mask->dim(static_cast<size_t>(r - 1));
            if (j >= len) {
              bias = -kInf;
            } else {
              const int64_t c[4] = {b, h, i, j};
              int64_t idx = 0;
              for (int64_t d = 0; d < r; ++d) {
                const int64_t dim = mask->dim(static_cast<size_t>(d));
                idx = idx * dim + (dim == 1 ? 0 : c[4 - r + d]);
              }
              const double m = mask->dtype() == DataType::Bool
                                   ? (mask->data<bool>()[idx] ? 0 : -kInf)
                                   : element(*mask, idx);
              bias += m;
            }
          }
          const int64_t pos = i + offset;
          if (s.causal && j > pos) bias = -kInf;
          if (s.left >= 0 && j < pos - s.left) bias = -kInf;
          if (s.right >= 0 && j > pos + s.right) bias = -kInf;
          if (!s.nonpad.empty() && j >= s.nonpad[static_cast<size_t>(b)]) bias = -kInf;
          if (bias != -kInf) any = true;
          x[static_cast<size_t>(j)] = sc + bias;
          out[static_cast<size_t>(j)] = s.mode == 0 ? raw : s.mode == 1 ? sc : sc + bias;
        }
        double mx = -kInf, sum = 0;
        for (double e : x) mx = std::max(mx, e);
        std::vector<double> p(static_cast<size_t>(T), 0.0);
        if (any && mx != -kInf) {
          for (int64_t j = 0; j < T; ++j)
            sum += p[static_cast<size_t>(j)] = std::exp(x[static_cast<size_t>(j)] - mx);
          for (double& e : p) e /= sum;
        }
        for (int64_t j = 0; j < T; ++j) {
          qk.data<float>()[((b * Hq + h) * Sq + i) * T + j] = static_cast<float>(
              s.mode == 3 ? p[static_cast<size_t>(j)] : out[static_cast<size_t>(j)]);
        }
        for (int64_t e = 0; e < Dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < T; ++j) acc += p[static_cast<size_t>(j)] * at4(v, b, kh, j, e);
          y.data<float>()[((b * Hq + h) * Sq + i) * Dv + e] = static_cast<float>(acc);
        }
      }
    }
  }
  return {y, qk};
}

}  // namespace

TEST_CASE("Attention matches a naive reference on random shapes", "[attention]") {
  std::mt19937 rng(2024);
  for (int iter = 0; iter < 150; ++iter) {
    const int64_t B = pick(rng, 1, 2), Hkv = pick(rng, 1, 3), Hq = Hkv * pick(rng, 1, 3);
    const bool big = iter % 25 == 0;  // several row blocks per head
    const int64_t Sq = big ? pick(rng, 65, 140) : pick(rng, 1, 5);
    const int64_t S = big ? pick(rng, 60, 140) : pick(rng, 1, 6);
    const int64_t D = pick(rng, 1, 8), Dv = pick(rng, 1, 8);
    const int opset = int(pick(rng, 23, 25));
    AttnSpec s;
    s.causal = rng() % 2;
    s.softcap = rng() % 4 == 0 ? 1.5 : 0;
    s.scale = rng() % 4 == 0 ? 0.3 : 0;
    s.mode = int(pick(rng, 0, 3));
    const bool with_qk = rng() % 3 == 0;
    const bool rank3 = rng() % 2;
    if (rng() % 3 == 0) s.past = pick(rng, 1, 5);
    if (opset >= 24 && s.past == 0 && rng() % 3 == 0) {
      for (int64_t b = 0; b < B; ++b) s.nonpad.push_back(pick(rng, 0, S));
    }
    if (opset >= 25 && rng() % 3 == 0) {
      s.left = pick(rng, -1, 3);
      s.right = pick(rng, -1, 2);
    }
    const int64_t T = s.past + S;
    Tensor q = random_tensor(DataType::Float, {B, Hq, Sq, D}, rng);
    Tensor k = random_tensor(DataType::Float, {B, Hkv, S, D}, rng);
    Tensor v = random_tensor(DataType::Float, {B, Hkv, S, Dv}, rng);
    Tensor pk = random_tensor(DataType::Float, {B, Hkv, s.past, D}, rng);
    Tensor pv = random_tensor(DataType::Float, {B, Hkv, s.past, Dv}, rng);
    const int mask_kind = int(pick(rng, 0, 2));  // none, bool, additive
    Tensor mask;
    if (mask_kind) {
      const Shape full{B, Hq, Sq, T};
      const size_t r = static_cast<size_t>(pick(rng, 1, 4));
      Shape ms(full.end() - long(r), full.end());
      for (size_t d = 0; d + 1 < r; ++d)
        if (rng() % 2) ms[d] = 1;
      if (rng() % 3 == 0) ms.back() = pick(rng, 1, T);  // shorter: padded as masked
      if (mask_kind == 1) {
        mask = Tensor::zeros(DataType::Bool, ms);
        for (int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = rng() % 4 != 0;
      } else {
        mask = random_tensor(DataType::Float, ms, rng, -2, 1);
        if (mask.numel() > 1) mask.data<float>()[0] = -std::numeric_limits<float>::infinity();
      }
    }
    INFO("iter " << iter << " B" << B << " Hq" << Hq << " Hkv" << Hkv << " Sq" << Sq << " S" << S
                 << " past" << s.past << " D" << D << " Dv" << Dv << " causal" << s.causal
                 << " mask" << mask_kind << " rank3 " << rank3 << " opset " << opset);

    OpTest t("Attention", opset);
    t.input(rank3 ? pack3(q) : q).input(rank3 ? pack3(k) : k).input(rank3 ? pack3(v) : v);
    if (mask_kind) {
      t.input(mask);
    } else {
      t.no_input();
    }
    if (s.past) {
      t.input(pk).input(pv);
    } else {
      t.no_input().no_input();
    }
    if (!s.nonpad.empty()) t.input(Tensor::from_vector<int64_t>({B}, s.nonpad));
    if (rank3) t.attr("q_num_heads", Hq).attr("kv_num_heads", Hkv);
    if (s.causal) t.attr("is_causal", 1);
    if (s.softcap > 0) t.attr("softcap", s.softcap);
    if (s.scale != 0) t.attr("scale", s.scale);
    if (opset >= 25) t.attr("left_window_size", s.left).attr("right_window_size", s.right);
    t.attr("qk_matmul_output_mode", int64_t{s.mode});
    t.outputs(with_qk ? 4 : 3);
    const auto outs = t.run();

    const Tensor kall = concat_seq(pk, k), vall = concat_seq(pv, v);
    auto [y, qk] = naive_attention(q, kall, vall, mask_kind ? &mask : nullptr, s);
    require_close(outs[0].tensor(), rank3 ? pack3(y) : y);
    require_close(outs[1].tensor(), kall);
    require_close(outs[2].tensor(), vall);
    if (with_qk) require_close(outs[3].tensor(), qk);
  }
}

TEST_CASE("Attention on encoder-sized heads matches the unfused ops and the reference",
          "[attention]") {
  // Short sequences (a whole head per task, softmax divided after the product with V) and
  // longer ones (blocks of query rows), head sizes 32 and 64, additive masks as BERT exports
  // make them ((1 - mask) * lowest float, broadcast over heads and queries or full), -inf
  // biases, fully masked rows, boolean masks and masks shorter than the keys.
  std::mt19937 rng(77);
  for (int iter = 0; iter < 24; ++iter) {
    const int64_t B = pick(rng, 1, 2), H = pick(rng, 1, 4);
    const int64_t D = rng() % 2 ? 32 : 64;
    const int64_t L = iter % 6 == 5 ? pick(rng, 260, 300) : pick(rng, 1, 200);
    const int mask_kind = iter % 4;  // none, BERT-style, random additive with -inf, bool
    Tensor q = random_tensor(DataType::Float, {B, H, L, D}, rng);
    Tensor k = random_tensor(DataType::Float, {B, H, L, D}, rng);
    Tensor v = random_tensor(DataType::Float, {B, H, L, D}, rng);
    Tensor mask;
    if (mask_kind == 1) {
      mask = Tensor::zeros(DataType::Float, {B, 1, 1, L});
      for (int64_t b = 0; b < B; ++b) {
        const int64_t valid = pick(rng, 1, L);
        for (int64_t j = valid; j < L; ++j) {
          mask.data<float>()[b * L + j] = std::numeric_limits<float>::lowest();
        }
      }
    } else if (mask_kind == 2) {
      const int64_t len = rng() % 3 == 0 ? pick(rng, 1, L) : L;  // shorter: padded as masked
      mask = random_tensor(DataType::Float, {B, H, L, len}, rng, -2, 1);
      for (int64_t i = 0; i < mask.numel(); i += 5) {
        mask.data<float>()[i] = -std::numeric_limits<float>::infinity();
      }
      // One fully masked query row: it attends nothing (zeros).
      std::fill(mask.data<float>(), mask.data<float>() + len,
                -std::numeric_limits<float>::infinity());
    } else if (mask_kind == 3) {
      mask = Tensor::zeros(DataType::Bool, {1, 1, L, L});
      for (int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = rng() % 5 != 0;
    }
    const double scale = 1 / std::sqrt(double(D));
    INFO("iter " << iter << " B" << B << " H" << H << " L" << L << " D" << D << " mask "
                 << mask_kind);
    OpTest t("Attention", 23);
    t.input(q).input(k).input(v);
    if (mask_kind) t.input(mask);
    t.attr("scale", scale);
    const Tensor fused = t.run1();
    AttnSpec spec;
    spec.scale = scale;
    auto [want, qk] = naive_attention(q, k, v, mask_kind ? &mask : nullptr, spec);
    require_close(fused, want);
    if (mask_kind == 2) continue;  // the unfused ops give NaN for a fully masked row
    // The unfused ops: MatMul(Q, K^T) * scale (+ mask) -> Softmax -> MatMul(., V).
    GraphBuilder g;
    g.input("q", DataType::Float, {B, H, L, D}, true);
    g.input("k", DataType::Float, {B, H, L, D}, true);
    g.input("v", DataType::Float, {B, H, L, D}, true);
    g.initializer("scale", Tensor::scalar<float>(static_cast<float>(scale)));
    g.node("Transpose", {"k"}, {"kt"}, {ints_attr("perm", {0, 1, 3, 2})});
    g.node("MatMul", {"q", "kt"}, {"s"});
    g.node("Mul", {"s", "scale"}, {"scores"});
    std::string scores = "scores";
    if (mask_kind == 1) {
      g.initializer("mask", mask);
      g.node("Add", {"scores", "mask"}, {"biased"});
      scores = "biased";
    } else if (mask_kind == 3) {
      g.initializer("mask", mask);
      g.initializer("zero", Tensor::scalar<float>(0.0f));
      g.initializer("minf", Tensor::scalar<float>(-std::numeric_limits<float>::infinity()));
      g.node("Where", {"mask", "zero", "minf"}, {"bias"});
      g.node("Add", {"scores", "bias"}, {"biased"});
      scores = "biased";
    }
    g.node("Softmax", {scores}, {"p"}, {int_attr("axis", -1)});
    g.node("MatMul", {"p", "v"}, {"y"});
    g.output("y");
    SessionOptions so;
    so.optimization = GraphOptimization::None;
    Session unfused = session_from_model(make_model(g.build(), 18), so);
    const auto out = unfused.run({{"q", q}, {"k", k}, {"v", v}});
    const Tensor y = out.at(0).value.tensor();
    // A row whose keys are all masked by booleans is NaN unfused and zeros fused.
    bool any_nan = false;
    for (float e : y.contiguous().to_vector<float>()) any_nan = any_nan || std::isnan(e);
    if (!any_nan) require_close(fused, y);
  }
}

TEST_CASE("Attention writes the KV cache once and reads 3-D and strided inputs in place",
          "[attention]") {
  std::mt19937 rng(5);
  const int64_t B = 2, H = 4, Hkv = 2, S = 3, P = 7, D = 8;
  Tensor q = random_tensor(DataType::Float, {B, H, 1, D}, rng);
  Tensor k = random_tensor(DataType::Float, {B, Hkv, S, D}, rng);
  Tensor v = random_tensor(DataType::Float, {B, Hkv, S, D}, rng);
  Tensor pk = random_tensor(DataType::Float, {B, Hkv, P, D}, rng);
  Tensor pv = random_tensor(DataType::Float, {B, Hkv, P, D}, rng);
  OpTest t("Attention", 23);
  const auto outs = t.input(pack3(q))
                        .input(pack3(k))
                        .input(pack3(v))
                        .no_input()
                        .input(pk)
                        .input(pv)
                        .attr("q_num_heads", H)
                        .attr("kv_num_heads", Hkv)
                        .attr("is_causal", 1)
                        .outputs(3)
                        .run();
  const uint64_t present_bytes = 2 * B * Hkv * (P + S) * D * sizeof(float);
  CHECK(t.stats().bytes_copied_concat == present_bytes);
  CHECK(t.stats().bytes_copied == present_bytes);  // the 3-D inputs were not made contiguous
  AttnSpec s;
  s.causal = true;
  s.past = P;
  require_close(outs[0].tensor(),
                pack3(naive_attention(q, concat_seq(pk, k), concat_seq(pv, v), nullptr, s).first));

  // A transposed view ([B, L, H, D] storage read as [B, H, L, D]) is used without a copy.
  Tensor base = random_tensor(DataType::Float, {B, 5, H, D}, rng);
  Tensor qt = base.view({B, H, 5, D}, {5 * H * D, D, H * D, 1}, 0);
  Tensor k4 = random_tensor(DataType::Float, {B, H, 6, D}, rng);
  OpTest t2("Attention", 23);
  Tensor y = t2.input(qt).input(k4).input(k4).run1();
  CHECK(t2.stats().bytes_copied == 0);
  require_close(y, naive_attention(qt.contiguous(), k4, k4, nullptr, AttnSpec{}).first);
}

TEST_CASE("Attention on float16 inputs matches the float reference", "[attention]") {
  std::mt19937 rng(9);
  Tensor q = random_tensor(DataType::Float16, {1, 4, 3, 8}, rng);
  Tensor k = random_tensor(DataType::Float16, {1, 2, 5, 8}, rng);
  Tensor v = random_tensor(DataType::Float16, {1, 2, 5, 8}, rng);
  Tensor y = OpTest("Attention", 23).input(q).input(k).input(v).attr("is_causal", 1).run1();
  REQUIRE(y.dtype() == DataType::Float16);
  AttnSpec s;
  s.causal = true;
  auto f = [](const Tensor& t) {
    std::vector<float> v;
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(float(element(t, i)));
    return Tensor::from_vector<float>(t.shape(), v);
  };
  Tensor expected = naive_attention(f(q), f(k), f(v), nullptr, s).first;
  require_close(f(y), expected, 2e-3, 1e-3);
}

TEST_CASE("Attention rejects inconsistent heads, shapes and masks", "[attention]") {
  std::mt19937 rng(1);
  auto r = [&](Shape s) { return random_tensor(DataType::Float, std::move(s), rng); };
  // 3 query heads cannot share 2 KV heads.
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 3, 2, 4}))
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 2, 4}))
                        .run(),
                    Error);
  // A hidden size of 10 does not split into 3 heads.
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 10}))
                        .input(r({1, 2, 10}))
                        .input(r({1, 2, 10}))
                        .attr("q_num_heads", 3)
                        .attr("kv_num_heads", 3)
                        .run(),
                    Error);
  // 3-D inputs without head counts.
  REQUIRE_THROWS_AS(
      OpTest("Attention", 23).input(r({1, 2, 8})).input(r({1, 2, 8})).input(r({1, 2, 8})).run(),
      Error);
  // K and V disagree on the sequence length.
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 3, 4}))
                        .input(r({1, 2, 4, 4}))
                        .run(),
                    Error);
  // Q and K disagree on the head size.
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 3, 5}))
                        .input(r({1, 2, 3, 4}))
                        .run(),
                    Error);
  // A mask that does not broadcast, and one longer than the keys.
  for (const Shape& ms : {Shape{3, 3}, Shape{2, 4}, Shape{2, 2, 2, 3}}) {
    INFO(shape_to_string(ms));
    REQUIRE_THROWS_AS(OpTest("Attention", 23)
                          .input(r({1, 2, 2, 4}))
                          .input(r({1, 2, 3, 4}))
                          .input(r({1, 2, 3, 4}))
                          .input(r(ms))
                          .run(),
                      Error);
  }
  // past_key without past_value, and a past of the wrong head size.
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 3, 4}))
                        .input(r({1, 2, 3, 4}))
                        .no_input()
                        .input(r({1, 2, 5, 4}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 3, 4}))
                        .input(r({1, 2, 3, 4}))
                        .no_input()
                        .input(r({1, 2, 5, 3}))
                        .input(r({1, 2, 5, 4}))
                        .run(),
                    Error);
  // Bad attributes.
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 3, 4}))
                        .input(r({1, 2, 3, 4}))
                        .attr("qk_matmul_output_mode", 4)
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Attention", 23)
                        .input(r({1, 2, 2, 4}))
                        .input(r({1, 2, 3, 4}))
                        .input(r({1, 2, 3, 4}))
                        .attr("softmax_precision", 7)
                        .run(),
                    Error);
  // nonpad_kv_seqlen of the wrong length.
  REQUIRE_THROWS_AS(OpTest("Attention", 24)
                        .input(r({2, 2, 2, 4}))
                        .input(r({2, 2, 3, 4}))
                        .input(r({2, 2, 3, 4}))
                        .no_input()
                        .no_input()
                        .no_input()
                        .input(Tensor::from_vector<int64_t>({1}, {2}))
                        .run(),
                    Error);
}

// ---- RotaryEmbedding ----

TEST_CASE("RotaryEmbedding matches the reference rotation", "[attention]") {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 40; ++iter) {
    const int64_t B = pick(rng, 1, 2), H = pick(rng, 1, 3), S = pick(rng, 1, 4);
    const int64_t Dh = 2 * pick(rng, 1, 4), rd = rng() % 2 ? 0 : 2 * pick(rng, 1, Dh / 2);
    const int64_t half = (rd ? rd : Dh) / 2, max_pos = 9;
    const bool interleaved = rng() % 2, rank3 = rng() % 2, with_pos = rng() % 2;
    Tensor x = random_tensor(DataType::Float, {B, H, S, Dh}, rng);
    Tensor cos =
        random_tensor(DataType::Float, with_pos ? Shape{max_pos, half} : Shape{B, S, half}, rng);
    Tensor sin = random_tensor(DataType::Float, cos.shape(), rng);
    std::vector<int64_t> pos;
    for (int64_t i = 0; i < B * S; ++i) pos.push_back(pick(rng, 0, max_pos - 1));
    Tensor expected = Tensor::zeros(DataType::Float, x.shape());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t row = with_pos ? pos[static_cast<size_t>(b * S + s)] : b * S + s;
          float* out = expected.data<float>() + ((b * H + h) * S + s) * Dh;
          for (int64_t i = 0; i < Dh; ++i) out[i] = float(at4(x, b, h, s, i));
          for (int64_t i = 0; i < half; ++i) {
            const int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
            const double c = element(cos, row * half + i), n = element(sin, row * half + i);
            const double x1 = at4(x, b, h, s, i1), x2 = at4(x, b, h, s, i2);
            out[i1] = float(c * x1 - n * x2);
            out[i2] = float(n * x1 + c * x2);
          }
        }
    OpTest t("RotaryEmbedding", 23);
    t.input(rank3 ? pack3(x) : x).input(cos).input(sin);
    if (with_pos) t.input(Tensor::from_vector<int64_t>({B, S}, pos));
    if (rd) t.attr("rotary_embedding_dim", rd);
    if (interleaved) t.attr("interleaved", 1);
    if (rank3) t.attr("num_heads", H);
    INFO("iter " << iter);
    require_close(t.run1(), rank3 ? pack3(expected) : expected);
  }
}

TEST_CASE("RotaryEmbedding rejects bad positions and dimensions", "[attention]") {
  std::mt19937 rng(3);
  Tensor x = random_tensor(DataType::Float, {1, 2, 3, 8}, rng);
  Tensor c = random_tensor(DataType::Float, {4, 4}, rng);
  REQUIRE_THROWS_AS(OpTest("RotaryEmbedding", 23)
                        .input(x)
                        .input(c)
                        .input(c)
                        .input(Tensor::from_vector<int64_t>({1, 3}, {0, 4, 1}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("RotaryEmbedding", 23)
                        .input(x)
                        .input(c)
                        .input(c)
                        .input(Tensor::from_vector<int64_t>({1, 3}, {0, -1, 1}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("RotaryEmbedding", 23)
                        .input(x)
                        .input(c)
                        .input(c)
                        .attr("rotary_embedding_dim", 3)
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("RotaryEmbedding", 23)
                        .input(random_tensor(DataType::Float, {1, 3, 10}, rng))
                        .input(c)
                        .input(c)
                        .attr("num_heads", 3)
                        .run(),
                    Error);
}

// ---- Swish / SwiGLU ----

TEST_CASE("Swish and SwiGLU match their formulas", "[attention]") {
  std::mt19937 rng(4);
  Tensor a = random_tensor(DataType::Float, {3, 5}, rng, -30, 30);
  Tensor b = random_tensor(DataType::Float, {3, 5}, rng, -2, 2);
  Tensor swish = Tensor::zeros(DataType::Float, a.shape());
  Tensor glu = Tensor::zeros(DataType::Float, a.shape());
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = element(a, i), s = x / (1 + std::exp(-0.7 * x));
    swish.data<float>()[i] = float(s);
    glu.data<float>()[i] = float(s * element(b, i));
  }
  require_close(OpTest("Swish", 24).input(a).attr("alpha", 0.7).run1(), swish);
  require_close(OpTest("SwiGLU", 28).input(a).input(b).attr("alpha", 0.7).run1(), glu);
  REQUIRE_THROWS_AS(
      OpTest("SwiGLU", 28).input(a).input(random_tensor(DataType::Float, {1, 5}, rng)).run(),
      Error);
}

// ---- LinearAttention ----

namespace {

// Direct transcription of the recurrence; returns {output, present_state}.
std::pair<Tensor, Tensor> naive_linear(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor* past, const Tensor* decay, const Tensor* beta,
                                       int64_t Hq, int64_t Hk, bool gated, bool delta) {
  const int64_t B = q.dim(0), T = q.dim(1), dk = q.dim(2) / Hq, dv = v.dim(2) / Hk;
  std::vector<double> S(static_cast<size_t>(B * Hk * dk * dv), 0.0);
  if (past)
    for (size_t i = 0; i < S.size(); ++i) S[i] = element(*past, int64_t(i));
  std::vector<float> out(static_cast<size_t>(B * T * Hq * dv));
  const double scale = 1 / std::sqrt(double(dk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hk; ++h) {
        double* s = &S[static_cast<size_t>((b * Hk + h) * dk * dv)];
        auto kv = [&](int64_t d) { return element(k, (b * T + t) * Hk * dk + h * dk + d); };
        if (gated) {
          const int64_t w = decay->dim(2);
          for (int64_t d = 0; d < dk; ++d) {
            const double g = element(*decay, (b * T + t) * w + (w == Hk ? h : h * dk + d));
            for (int64_t m = 0; m < dv; ++m) s[d * dv + m] *= std::exp(g);
          }
        }
        std::vector<double> vt(static_cast<size_t>(dv));
        for (int64_t m = 0; m < dv; ++m) {
          vt[static_cast<size_t>(m)] = element(v, (b * T + t) * Hk * dv + h * dv + m);
          if (delta) {
            double ret = 0;
            for (int64_t d = 0; d < dk; ++d) ret += s[d * dv + m] * kv(d);
            const int64_t w = beta->dim(2);
            vt[static_cast<size_t>(m)] = element(*beta, (b * T + t) * w + (w == 1 ? 0 : h)) *
                                         (vt[static_cast<size_t>(m)] - ret);
          }
        }
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t m = 0; m < dv; ++m) s[d * dv + m] += kv(d) * vt[static_cast<size_t>(m)];
        for (int64_t g = 0; g < Hq / Hk; ++g) {
          const int64_t hq = h * (Hq / Hk) + g;
          for (int64_t m = 0; m < dv; ++m) {
            double acc = 0;
            for (int64_t d = 0; d < dk; ++d)
              acc += element(q, (b * T + t) * Hq * dk + hq * dk + d) * s[d * dv + m];
            out[static_cast<size_t>((b * T + t) * Hq * dv + hq * dv + m)] = float(scale * acc);
          }
        }
      }
  std::vector<float> sf(S.begin(), S.end());
  return {Tensor::from_vector<float>({B, T, Hq * dv}, out),
          Tensor::from_vector<float>({B, Hk, dk, dv}, sf)};
}

}  // namespace

TEST_CASE("LinearAttention matches the recurrence for every update rule", "[attention]") {
  std::mt19937 rng(21);
  const char* rules[] = {"linear", "gated", "delta", "gated_delta"};
  for (int iter = 0; iter < 40; ++iter) {
    const std::string rule = rules[iter % 4];
    const bool gated = rule.find("gated") != std::string::npos;
    const bool delta = rule.find("delta") != std::string::npos;
    const int64_t B = pick(rng, 1, 2), T = pick(rng, 1, 5), Hk = pick(rng, 1, 3);
    const int64_t Hq = Hk * pick(rng, 1, 2), dk = pick(rng, 1, 4), dv = pick(rng, 1, 4);
    Tensor q = random_tensor(DataType::Float, {B, T, Hq * dk}, rng);
    Tensor k = random_tensor(DataType::Float, {B, T, Hk * dk}, rng);
    Tensor v = random_tensor(DataType::Float, {B, T, Hk * dv}, rng);
    Tensor past = random_tensor(DataType::Float, {B, Hk, dk, dv}, rng);
    Tensor decay = random_tensor(DataType::Float, {B, T, rng() % 2 ? Hk : Hk * dk}, rng, -1, 0);
    Tensor beta = random_tensor(DataType::Float, {B, T, rng() % 2 ? Hk : 1}, rng, 0, 1);
    const bool with_past = rng() % 2;
    OpTest t("LinearAttention", 27);
    t.input(q).input(k).input(v);
    if (with_past) {
      t.input(past);
    } else {
      t.no_input();
    }
    if (gated) {
      t.input(decay);
    } else {
      t.no_input();
    }
    if (delta) t.input(beta);
    t.attr("q_num_heads", Hq).attr("kv_num_heads", Hk).attr("update_rule", rule).outputs(2);
    const auto outs = t.run();
    auto [y, state] =
        naive_linear(q, k, v, with_past ? &past : nullptr, &decay, &beta, Hq, Hk, gated, delta);
    INFO(rule << " iter " << iter);
    require_close(outs[0].tensor(), y);
    require_close(outs[1].tensor(), state);
  }
  Tensor x = Tensor::zeros(DataType::Float, {1, 2, 4});
  // gated_delta (the default) needs decay and beta; q heads must be a multiple of kv heads.
  REQUIRE_THROWS_AS(OpTest("LinearAttention", 27)
                        .input(x)
                        .input(x)
                        .input(x)
                        .attr("q_num_heads", 2)
                        .attr("kv_num_heads", 2)
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("LinearAttention", 27)
                        .input(x)
                        .input(x)
                        .input(x)
                        .attr("q_num_heads", 3)
                        .attr("kv_num_heads", 2)
                        .attr("update_rule", "linear")
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("LinearAttention", 27)
                        .input(x)
                        .input(x)
                        .input(x)
                        .attr("q_num_heads", 2)
                        .attr("kv_num_heads", 2)
                        .attr("update_rule", "fast")
                        .run(),
                    Error);
}

TEST_CASE("LinearAttention matches the recurrence for larger heads and query groups",
          "[attention]") {
  std::mt19937 rng(22);
  const char* rules[] = {"linear", "gated", "delta", "gated_delta"};
  for (int iter = 0; iter < 24; ++iter) {
    const std::string rule = rules[iter % 4];
    const bool gated = rule.find("gated") != std::string::npos;
    const bool delta = rule.find("delta") != std::string::npos;
    const int64_t B = pick(rng, 1, 2), T = pick(rng, 1, 7), Hk = pick(rng, 1, 3);
    const int64_t Hq = Hk * pick(rng, 1, 3), dk = pick(rng, 1, 40), dv = pick(rng, 1, 40);
    Tensor q = random_tensor(DataType::Float, {B, T, Hq * dk}, rng, -0.5, 0.5);
    Tensor k = random_tensor(DataType::Float, {B, T, Hk * dk}, rng, -0.5, 0.5);
    Tensor v = random_tensor(DataType::Float, {B, T, Hk * dv}, rng);
    Tensor past = random_tensor(DataType::Float, {B, Hk, dk, dv}, rng);
    Tensor decay = random_tensor(DataType::Float, {B, T, rng() % 2 ? Hk : Hk * dk}, rng, -1, 0);
    Tensor beta = random_tensor(DataType::Float, {B, T, rng() % 2 ? Hk : 1}, rng, 0, 1);
    OpTest t("LinearAttention", 27);
    t.input(q).input(k).input(v).input(past);
    if (gated) {
      t.input(decay);
    } else {
      t.no_input();
    }
    if (delta) t.input(beta);
    t.attr("q_num_heads", Hq).attr("kv_num_heads", Hk).attr("update_rule", rule).outputs(2);
    const auto outs = t.run();
    auto [y, state] = naive_linear(q, k, v, &past, &decay, &beta, Hq, Hk, gated, delta);
    INFO(rule << " iter " << iter << " dk " << dk << " dv " << dv << " group " << Hq / Hk);
    require_close(outs[0].tensor(), y, 1e-4, 1e-4);
    require_close(outs[1].tensor(), state, 1e-4, 1e-4);
  }
}

TEST_CASE("LinearAttention on float16 and bfloat16 matches the float recurrence", "[attention]") {
  std::mt19937 rng(23);
  auto as_float = [](const Tensor& t) {
    std::vector<float> v;
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(float(element(t, i)));
    return Tensor::from_vector<float>(t.shape(), v);
  };
  for (DataType type : {DataType::Float16, DataType::BFloat16}) {
    for (const bool state_out : {true, false}) {
      const int64_t B = 2, T = 5, Hk = 2, Hq = 4, dk = 12, dv = 8;
      Tensor q = random_tensor(type, {B, T, Hq * dk}, rng, -0.5, 0.5);
      Tensor k = random_tensor(type, {B, T, Hk * dk}, rng, -0.5, 0.5);
      Tensor v = random_tensor(type, {B, T, Hk * dv}, rng);
      Tensor past = random_tensor(type, {B, Hk, dk, dv}, rng);
      Tensor decay = random_tensor(type, {B, T, Hk * dk}, rng, -1, 0);
      Tensor beta = random_tensor(type, {B, T, Hk}, rng, 0, 1);
      OpTest t("LinearAttention", 27);
      t.input(q).input(k).input(v).input(past).input(decay).input(beta);
      t.attr("q_num_heads", Hq).attr("kv_num_heads", Hk).outputs(state_out ? 2 : 1);
      const auto outs = t.run();
      const Tensor fd = as_float(decay), fb = as_float(beta), fp = as_float(past);
      auto [y, state] =
          naive_linear(as_float(q), as_float(k), as_float(v), &fp, &fd, &fb, Hq, Hk, true, true);
      INFO(data_type_name(type) << (state_out ? " with" : " without") << " the state output");
      REQUIRE(outs[0].tensor().dtype() == type);
      const double tol = type == DataType::Float16 ? 1e-2 : 5e-2;
      require_close(as_float(outs[0].tensor()), y, tol, tol);
      if (state_out) require_close(as_float(outs[1].tensor()), state, tol, tol);
    }
  }
}

// ---- CausalConvWithState ----

TEST_CASE("CausalConvWithState matches a direct convolution and carries state", "[attention]") {
  std::mt19937 rng(8);
  for (int iter = 0; iter < 20; ++iter) {
    const int64_t B = pick(rng, 1, 2), C = pick(rng, 1, 3), L = pick(rng, 1, 7),
                  K = pick(rng, 1, 4);
    const bool silu = rng() % 2;
    Tensor x = random_tensor(DataType::Float, {B, C, L}, rng);
    Tensor w = random_tensor(DataType::Float, {C, 1, K}, rng);
    Tensor bias = random_tensor(DataType::Float, {C}, rng);
    Tensor past = random_tensor(DataType::Float, {B, C, K - 1}, rng);
    Tensor expected = Tensor::zeros(DataType::Float, {B, C, L});
    Tensor state = Tensor::zeros(DataType::Float, {B, C, K - 1});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) {
        auto padded = [&](int64_t i) {  // past ++ x
          return i < K - 1 ? element(past, (b * C + c) * (K - 1) + i)
                           : element(x, (b * C + c) * L + i - (K - 1));
        };
        for (int64_t t = 0; t < L; ++t) {
          double acc = element(bias, c);
          for (int64_t j = 0; j < K; ++j) acc += element(w, c * K + j) * padded(t + j);
          if (silu) acc = acc / (1 + std::exp(-acc));
          expected.data<float>()[(b * C + c) * L + t] = float(acc);
        }
        for (int64_t i = 0; i < K - 1; ++i)
          state.data<float>()[(b * C + c) * (K - 1) + i] = float(padded(L + i));
      }
    auto outs = OpTest("CausalConvWithState", 27)
                    .input(x)
                    .input(w)
                    .input(bias)
                    .input(past)
                    .attr("activation", silu ? "silu" : "none")
                    .outputs(2)
                    .run();
    require_close(outs[0].tensor(), expected);
    require_close(outs[1].tensor(), state);
  }
  // Running a sequence in two chunks, passing the state along, equals one run.
  Tensor x = random_tensor(DataType::Float, {1, 2, 6}, rng);
  Tensor w = random_tensor(DataType::Float, {2, 1, 3}, rng);
  Tensor whole = OpTest("CausalConvWithState", 27).input(x).input(w).run1();
  Tensor x1 = Tensor::from_vector<float>(
      {1, 2, 2}, {x.data<float>()[0], x.data<float>()[1], x.data<float>()[6], x.data<float>()[7]});
  std::vector<float> rest;
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t t = 2; t < 6; ++t) rest.push_back(x.data<float>()[c * 6 + t]);
  auto first = OpTest("CausalConvWithState", 27).input(x1).input(w).outputs(2).run();
  Tensor second = OpTest("CausalConvWithState", 27)
                      .input(Tensor::from_vector<float>({1, 2, 4}, rest))
                      .input(w)
                      .no_input()
                      .input(first[1].tensor())
                      .run1();
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t t = 0; t < 6; ++t) {
      const double got =
          t < 2 ? element(first[0].tensor(), c * 2 + t) : element(second, c * 4 + t - 2);
      REQUIRE(got == Approx(element(whole, c * 6 + t)).margin(1e-6));
    }
  REQUIRE_THROWS_AS(OpTest("CausalConvWithState", 27)
                        .input(x)
                        .input(random_tensor(DataType::Float, {2, 2, 3}, rng))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("CausalConvWithState", 27)
                        .input(x)
                        .input(w)
                        .no_input()
                        .input(random_tensor(DataType::Float, {1, 2, 3}, rng))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("CausalConvWithState", 27).input(x).input(w).attr("activation", "gelu").run(), Error);
}

// ---- FlexAttention ----

TEST_CASE("FlexAttention matches plain attention and runs its modifier subgraphs", "[attention]") {
  std::mt19937 rng(13);
  for (int iter = 0; iter < 10; ++iter) {
    const int64_t B = pick(rng, 1, 2), Hkv = pick(rng, 1, 2), Hq = Hkv * pick(rng, 1, 3);
    const int64_t L = pick(rng, 1, 5), S = pick(rng, 1, 5), E = pick(rng, 1, 6),
                  Ev = pick(rng, 1, 6);
    Tensor q = random_tensor(DataType::Float, {B, Hq, L, E}, rng);
    Tensor k = random_tensor(DataType::Float, {B, Hkv, S, E}, rng);
    Tensor v = random_tensor(DataType::Float, {B, Hkv, S, Ev}, rng);
    Tensor y = OpTest("FlexAttention", 1, "ai.onnx.preview").input(q).input(k).input(v).run1();
    require_close(y, naive_attention(q, k, v, nullptr, AttnSpec{}).first);
  }

  // score_mod adds a bias and is causal; prob_mod halves the probabilities.
  Tensor q = random_tensor(DataType::Float, {1, 2, 4, 8}, rng);
  Tensor k = random_tensor(DataType::Float, {1, 2, 4, 8}, rng);
  Tensor v = random_tensor(DataType::Float, {1, 2, 4, 8}, rng);
  GraphBuilder sm("score_mod");
  sm.input("scores", DataType::Float)
      .initializer("bias", Tensor::scalar<float>(0.5f))
      .node("Add", {"scores", "bias"}, {"scores_out"});
  sm.output("scores_out");
  GraphBuilder pm("prob_mod");
  pm.input("probs", DataType::Float)
      .initializer("half", Tensor::scalar<float>(0.5f))
      .node("Mul", {"probs", "half"}, {"probs_out"});
  pm.output("probs_out");
  GraphBuilder g("flex");
  g.input("Q", DataType::Float).input("K", DataType::Float).input("V", DataType::Float);
  g.node("FlexAttention", {"Q", "K", "V"}, {"Y"},
         {graph_attr("score_mod", sm.build()), graph_attr("prob_mod", pm.build())},
         "ai.onnx.preview");
  g.output("Y");
  Session s = session_from_model(make_model(g.build(), 26, {{"ai.onnx.preview", 1}}));
  auto outs = s.run({{"Q", q}, {"K", k}, {"V", v}});
  // A constant bias does not change the softmax; the probabilities are then halved.
  Tensor expected = naive_attention(q, k, v, nullptr, AttnSpec{}).first;
  for (int64_t i = 0; i < expected.numel(); ++i) expected.data<float>()[i] *= 0.5f;
  require_close(outs[0].value.tensor(), expected);

  REQUIRE_THROWS_AS(OpTest("FlexAttention", 1, "ai.onnx.preview")
                        .input(random_tensor(DataType::Float, {1, 3, 2, 4}, rng))
                        .input(random_tensor(DataType::Float, {1, 2, 2, 4}, rng))
                        .input(random_tensor(DataType::Float, {1, 2, 2, 4}, rng))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("FlexAttention", 1, "ai.onnx.preview")
                        .input(random_tensor(DataType::Float, {2, 4}, rng))
                        .input(random_tensor(DataType::Float, {2, 4}, rng))
                        .input(random_tensor(DataType::Float, {2, 4}, rng))
                        .run(),
                    Error);
}

TEST_CASE("FlexAttention matches plain attention on larger, grouped, strided and double inputs",
          "[attention]") {
  std::mt19937 rng(14);
  const DataType types[] = {DataType::Float, DataType::Double, DataType::Float16};
  for (int iter = 0; iter < 18; ++iter) {
    const DataType dt = types[iter % 3];
    const int64_t B = pick(rng, 1, 2), Hkv = pick(rng, 1, 3), Hq = Hkv * pick(rng, 1, 3);
    const int64_t L = pick(rng, 1, 40), S = pick(rng, 1, 40), E = pick(rng, 1, 70),
                  Ev = pick(rng, 1, 70);
    Tensor q = random_tensor(dt, {B, Hq, L, E}, rng);
    // K and V stored as [B, S, H, E] (a packed projection's layout), read through strides.
    Tensor kb = random_tensor(dt, {B, S, Hkv, E}, rng);
    Tensor vb = random_tensor(dt, {B, S, Hkv, Ev}, rng);
    Tensor k = kb.view({B, Hkv, S, E}, {S * Hkv * E, E, Hkv * E, 1}, 0);
    Tensor v = vb.view({B, Hkv, S, Ev}, {S * Hkv * Ev, Ev, Hkv * Ev, 1}, 0);
    INFO("iter " << iter << " B " << B << " Hq " << Hq << " Hkv " << Hkv << " L " << L << " S " << S
                 << " E " << E << " Ev " << Ev);
    Tensor y = OpTest("FlexAttention", 1, "ai.onnx.preview").input(q).input(k).input(v).run1();
    REQUIRE(y.dtype() == dt);
    const double tol = dt == DataType::Float16 ? 2e-2 : 1e-4;
    Tensor yf = Tensor::zeros(DataType::Float, y.shape());
    for (int64_t i = 0; i < y.numel(); ++i) yf.data<float>()[i] = float(element(y, i));
    require_close(yf, naive_attention(q, k, v, nullptr, AttnSpec{}).first, tol, tol);
  }
  // Many heads (one product per thread) and one large head (a product split across threads).
  for (const auto& [heads, len] : {std::pair<int64_t, int64_t>{16, 64}, {1, 200}}) {
    Tensor q = random_tensor(DataType::Float, {2, heads, len, 64}, rng);
    Tensor k = random_tensor(DataType::Float, {2, heads, len, 64}, rng);
    Tensor v = random_tensor(DataType::Float, {2, heads, len, 48}, rng);
    require_close(OpTest("FlexAttention", 1, "ai.onnx.preview").input(q).input(k).input(v).run1(),
                  naive_attention(q, k, v, nullptr, AttnSpec{}).first, 1e-4, 1e-5);
  }
}

TEST_CASE("Attention with one row of K and V serves every row of Q", "[attention]") {
  // A beam search's shared cross-attention cache: K and V of batch 1 for Q of batch 3 equal
  // K and V repeated, with or without a mask, 3-D or 4-D; with present outputs asked for (which
  // need a row per batch) it is refused.
  std::mt19937 rng(12);
  const int64_t B = 3, H = 2, D = 8, S = 7;
  const Tensor q = random_tensor(DataType::Float, {B, H, 2, D}, rng);
  const Tensor k = random_tensor(DataType::Float, {1, H, S, D}, rng);
  const Tensor v = random_tensor(DataType::Float, {1, H, S, D}, rng);
  auto repeat = [&](const Tensor& t) {
    Tensor out = Tensor::zeros(DataType::Float, {B, H, S, D});
    for (int64_t b = 0; b < B; ++b)
      std::copy(t.data<const float>(), t.data<const float>() + t.numel(),
                out.data<float>() + b * t.numel());
    return out;
  };
  const Tensor y = OpTest("Attention", 23).input(q).input(k).input(v).run1();
  require_close(y, naive_attention(q, repeat(k), repeat(v), nullptr, AttnSpec{}).first);
  // One query row per batch row (a decode step): the rows are one block against K and V,
  // 4-D and 3-D.
  for (const int64_t heads : {int64_t{2}, int64_t{1}}) {
    INFO("heads " << heads);
    const Tensor q1 = random_tensor(DataType::Float, {B, heads, 1, D}, rng);
    const Tensor k1 = random_tensor(DataType::Float, {1, heads, S, D}, rng);
    const Tensor v1 = random_tensor(DataType::Float, {1, heads, S, D}, rng);
    Tensor kr = Tensor::zeros(DataType::Float, {B, heads, S, D}), vr = kr.clone();
    for (int64_t b = 0; b < B; ++b) {
      std::copy(k1.data<const float>(), k1.data<const float>() + k1.numel(),
                kr.data<float>() + b * k1.numel());
      std::copy(v1.data<const float>(), v1.data<const float>() + v1.numel(),
                vr.data<float>() + b * v1.numel());
    }
    const Tensor y1 = OpTest("Attention", 23).input(q1).input(k1).input(v1).run1();
    require_close(y1, naive_attention(q1, kr, vr, nullptr, AttnSpec{}).first);
    const Tensor q3 = q1.reshaped({B, 1, heads * D});
    const Tensor k3 = k1.reshaped({1, S, heads * D});  // heads == 1: the same layout
    if (heads == 1) {
      const Tensor y3 = OpTest("Attention", 23)
                            .input(q3)
                            .input(k3)
                            .input(v1.reshaped({1, S, D}))
                            .attr("q_num_heads", 1)
                            .attr("kv_num_heads", 1)
                            .run1();
      require_close(y3.reshaped({B, 1, 1, D}),
                    naive_attention(q1, kr, vr, nullptr, AttnSpec{}).first);
    }
  }
  const Tensor mask = random_tensor(DataType::Float, {B, 1, 2, S}, rng);
  const Tensor ym = OpTest("Attention", 23).input(q).input(k).input(v).input(mask).run1();
  const Tensor want_m =
      OpTest("Attention", 23).input(q).input(repeat(k)).input(repeat(v)).input(mask).run1();
  require_close(ym, want_m);
  REQUIRE_THROWS_AS(OpTest("Attention", 23).input(q).input(k).input(v).outputs(2).run(), Error);
  // K of one row with V of three is no broadcast.
  REQUIRE_THROWS_AS(OpTest("Attention", 23).input(q).input(k).input(repeat(v)).run(), Error);
}
