// onnxruntime's contrib ops (com.microsoft Gelu family, BiasAdd, the simplified layer norms,
// EmbedLayerNormalization, Attention) against naive double references written here from
// onnxruntime's ContribOperators.md: random shapes, optional inputs and outputs, broadcasting
// biases, float16 operands (computed in float, rounded on store), and bad inputs failing with
// an Error naming the node. ctest runs this suite again at every instruction-set level
// (KILN_ISA), so each level's vector kernels are covered.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr const char* kMs = "com.microsoft";
// float16 keeps 11 significant bits: rounding a result moves it by at most 2^-11 of itself
// (4.9e-4); the float arithmetic before it adds about 1e-5 at most.
constexpr double kHalfTol = 6e-4;

double gelu(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST_CASE("com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd and BiasSplitGelu",
          "[ops][contrib]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t n = std::vector<int64_t>{1, 4, 16, 17, 64, 130}[static_cast<size_t>(trial % 6)];
    const Shape shape{1 + trial % 3, 1 + (trial * 5) % 7, n};
    const Tensor x = random_tensor(DataType::Float, shape, rng, -4, 4);
    const Tensor bias = random_tensor(DataType::Float, {n}, rng, -1, 1);
    const Tensor skip = random_tensor(DataType::Float, shape, rng, -1, 1);
    INFO("trial " << trial << ": " << x.describe());
    std::vector<double> g, fg, fgb, bg, qg, ba;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = element(x, i), b = element(bias, i % n);
      g.push_back(gelu(v));
      fg.push_back(gelu_tanh(v));
      fgb.push_back(gelu_tanh(v + b));
      bg.push_back(gelu(v + b));
      qg.push_back(v / (1 + std::exp(-1.5 * v)));
      ba.push_back(v + b + element(skip, i));
    }
    require_near(OpTest("Gelu", 1, kMs).input(x).run1(), g, 1e-5);
    require_near(OpTest("FastGelu", 1, kMs).input(x).run1(), fg, 1e-5);
    require_near(OpTest("FastGelu", 1, kMs).input(x).constant_input(bias).run1(), fgb, 1e-5);
    require_near(OpTest("BiasGelu", 1, kMs).input(x).input(bias).run1(), bg, 1e-5);
    require_near(OpTest("QuickGelu", 1, kMs).input(x).attr("alpha", 1.5f).run1(), qg, 1e-5);
    require_near(OpTest("BiasAdd", 1, kMs).input(x).constant_input(bias).input(skip).run1(), ba,
                 1e-6);
    if (n % 2 == 0) {
      std::vector<double> split;
      const int64_t h = n / 2;
      for (int64_t r = 0; r < x.numel() / n; ++r) {
        for (int64_t i = 0; i < h; ++i) {
          const double left = element(x, r * n + i) + element(bias, i);
          const double right = element(x, r * n + h + i) + element(bias, h + i);
          split.push_back(left * gelu(right));
        }
      }
      const Tensor y = OpTest("BiasSplitGelu", 1, kMs).input(x).constant_input(bias).run1();
      CHECK(y.shape() == Shape{shape[0], shape[1], h});
      require_near(y, split, 1e-5);
    }
  }
  // A bias that is not one value per element of the last axis, an integer input, a 2-D
  // BiasAdd: each an Error naming the node.
  REQUIRE_THROWS_WITH(OpTest("BiasGelu", 1, kMs)
                          .input(Tensor::zeros(DataType::Float, {2, 4}))
                          .input(Tensor::zeros(DataType::Float, {3}))
                          .run(),
                      Catch::Contains("BiasGelu") && Catch::Contains("bias"));
  REQUIRE_THROWS_WITH(OpTest("Gelu", 1, kMs).input(Tensor::zeros(DataType::Int32, {2})).run(),
                      Catch::Contains("Gelu") && Catch::Contains("float"));
  REQUIRE_THROWS_WITH(OpTest("BiasAdd", 1, kMs)
                          .input(Tensor::zeros(DataType::Float, {2, 4}))
                          .input(Tensor::zeros(DataType::Float, {4}))
                          .input(Tensor::zeros(DataType::Float, {2, 4}))
                          .run(),
                      Catch::Contains("BiasAdd") && Catch::Contains("3-D"));
}

TEST_CASE("the Gelu family and BiasAdd take float16 (computed in float)",
          "[ops][contrib][float16]") {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t n = std::vector<int64_t>{2, 16, 17, 64}[static_cast<size_t>(trial % 4)];
    const Shape shape{1 + trial % 2, 1 + (trial * 3) % 5, n};
    const Tensor x = random_tensor(DataType::Float16, shape, rng, -4, 4);
    const Tensor bias = random_tensor(DataType::Float16, {n}, rng, -1, 1);
    const Tensor skip = random_tensor(DataType::Float16, shape, rng, -1, 1);
    INFO("trial " << trial << ": " << x.describe());
    std::vector<double> g, fg, fgb, bg, qg, ba;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = element(x, i), b = element(bias, i % n);
      g.push_back(gelu(v));
      fg.push_back(gelu_tanh(v));
      fgb.push_back(gelu_tanh(v + b));
      bg.push_back(gelu(v + b));
      qg.push_back(v / (1 + std::exp(-1.702 * v)));
      ba.push_back(v + b + element(skip, i));
    }
    const Tensor y = OpTest("FastGelu", 1, kMs).input(x).input(bias).run1();
    CHECK(y.dtype() == DataType::Float16);
    CHECK(y.shape() == shape);
    require_near(y, fgb, kHalfTol);
    require_near(OpTest("FastGelu", 1, kMs).input(x).run1(), fg, kHalfTol);
    require_near(OpTest("FastGelu", 1, kMs).input(x).constant_input(bias).run1(), fgb, kHalfTol);
    require_near(OpTest("Gelu", 1, kMs).input(x).run1(), g, kHalfTol);
    require_near(OpTest("BiasGelu", 1, kMs).input(x).input(bias).run1(), bg, kHalfTol);
    require_near(OpTest("QuickGelu", 1, kMs).input(x).run1(), qg, kHalfTol);
    require_near(OpTest("BiasAdd", 1, kMs).input(x).input(bias).input(skip).run1(), ba, kHalfTol);
    if (n % 2 != 0) continue;
    std::vector<double> split;
    const int64_t h = n / 2;
    for (int64_t r = 0; r < x.numel() / n; ++r) {
      for (int64_t i = 0; i < h; ++i) {
        const double left = element(x, r * n + i) + element(bias, i);
        const double right = element(x, r * n + h + i) + element(bias, h + i);
        split.push_back(left * gelu(right));
      }
    }
    const Tensor sg = OpTest("BiasSplitGelu", 1, kMs).input(x).input(bias).run1();
    CHECK(sg.dtype() == DataType::Float16);
    require_near(sg, split, kHalfTol);
  }
  // A bias or skip of another type than the input, bfloat16: each an Error naming the node.
  const Tensor x = Tensor::zeros(DataType::Float16, {1, 2, 4});
  REQUIRE_THROWS_WITH(
      OpTest("FastGelu", 1, kMs).input(x).input(Tensor::zeros(DataType::Float, {4})).run(),
      Catch::Contains("FastGelu") && Catch::Contains("bias") && Catch::Contains("float16"));
  REQUIRE_THROWS_WITH(OpTest("BiasAdd", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float16, {4}))
                          .input(Tensor::zeros(DataType::Float, {1, 2, 4}))
                          .run(),
                      Catch::Contains("BiasAdd") && Catch::Contains("skip"));
  REQUIRE_THROWS_WITH(OpTest("Gelu", 1, kMs).input(Tensor::zeros(DataType::BFloat16, {2})).run(),
                      Catch::Contains("Gelu") && Catch::Contains("float or float16"));
}

TEST_CASE("SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization", "[ops][contrib]") {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t n = std::vector<int64_t>{1, 3, 16, 33, 64, 100}[static_cast<size_t>(trial % 6)];
    const int64_t batch = 1 + trial % 3, seq = 1 + (trial * 3) % 5;
    const Tensor x = random_tensor(DataType::Float, {batch, seq, n}, rng, -3, 3);
    const bool broadcast = trial % 4 == 1, has_bias = trial % 2 == 0;
    const Tensor skip =
        random_tensor(DataType::Float, broadcast ? Shape{seq, n} : Shape{batch, seq, n}, rng);
    const Tensor gamma = random_tensor(DataType::Float, {n}, rng, 0.5, 1.5);
    const Tensor bias = random_tensor(DataType::Float, {n}, rng);
    INFO("trial " << trial << ": " << x.describe() << " + " << skip.describe());
    // RMS norm over the last axis of x, and of x + skip (+ bias).
    std::vector<double> y, inv, sy, smean, sinv, ssum;
    for (int64_t r = 0; r < batch * seq; ++r) {
      double sq = 0, ssq = 0, total = 0;
      std::vector<double> s(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const double v = element(x, r * n + i);
        s[static_cast<size_t>(i)] =
            v + element(skip, (r % (skip.numel() / n)) * n + i) + (has_bias ? element(bias, i) : 0);
        sq += v * v;
        ssq += s[static_cast<size_t>(i)] * s[static_cast<size_t>(i)];
        total += s[static_cast<size_t>(i)];
      }
      const double a = 1 / std::sqrt(sq / double(n) + 1e-5);
      const double b = 1 / std::sqrt(ssq / double(n) + 1e-6);
      for (int64_t i = 0; i < n; ++i) {
        y.push_back(element(x, r * n + i) * a * element(gamma, i));
        sy.push_back(s[static_cast<size_t>(i)] * b * element(gamma, i));
        ssum.push_back(s[static_cast<size_t>(i)]);
      }
      inv.push_back(a);
      sinv.push_back(b);
      smean.push_back(total / double(n));
    }
    const auto out =
        OpTest("SimplifiedLayerNormalization", 1).input(x).constant_input(gamma).outputs(2).run();
    require_near(out[0].tensor(), y, 1e-5);
    CHECK(out[1].tensor().shape() == Shape{batch, seq, 1});
    require_near(out[1].tensor(), inv, 1e-5);

    OpTest t("SkipSimplifiedLayerNormalization", 1, kMs);
    t.input(x).input(skip).constant_input(gamma);
    if (has_bias) t.constant_input(bias);
    const auto sout = t.attr("epsilon", 1e-6f).outputs(4).run();
    require_near(sout[0].tensor(), sy, 1e-5);
    require_near(sout[1].tensor(), smean, 1e-5);
    require_near(sout[2].tensor(), sinv, 1e-5);
    require_near(sout[3].tensor(), ssum, 1e-6);
  }
  // axis 1 normalises the last two axes together.
  const Tensor x = random_tensor(DataType::Float, {2, 3, 5}, rng);
  const Tensor scale = random_tensor(DataType::Float, {3, 5}, rng);
  std::vector<double> want;
  for (int64_t r = 0; r < 2; ++r) {
    double sq = 0;
    for (int64_t i = 0; i < 15; ++i) sq += element(x, r * 15 + i) * element(x, r * 15 + i);
    for (int64_t i = 0; i < 15; ++i) {
      want.push_back(element(x, r * 15 + i) / std::sqrt(sq / 15 + 1e-5) * element(scale, i));
    }
  }
  require_near(
      OpTest("SimplifiedLayerNormalization", 1).input(x).input(scale).attr("axis", 1).run1(), want,
      1e-5);
  REQUIRE_THROWS_WITH(
      OpTest("SkipSimplifiedLayerNormalization", 1, kMs)
          .input(Tensor::zeros(DataType::Float, {2, 3, 4}))
          .input(Tensor::zeros(DataType::Float, {2, 2, 4}))
          .input(Tensor::zeros(DataType::Float, {4}))
          .run(),
      Catch::Contains("SkipSimplifiedLayerNormalization") && Catch::Contains("skip"));
  REQUIRE_THROWS_WITH(OpTest("SimplifiedLayerNormalization", 1)
                          .input(Tensor::zeros(DataType::Float, {2, 4}))
                          .input(Tensor::zeros(DataType::Float, {5}))
                          .run(),
                      Catch::Contains("SimplifiedLayerNormalization") && Catch::Contains("scale"));
}

TEST_CASE("EmbedLayerNormalization gathers, sums, normalises and counts the mask",
          "[ops][contrib]") {
  std::mt19937 rng(13);
  const int64_t batch = 3, seq = 5, hidden = 24, vocab = 30, positions = 8, segments = 2;
  const Tensor word = random_tensor(DataType::Float, {vocab, hidden}, rng);
  const Tensor pos = random_tensor(DataType::Float, {positions, hidden}, rng);
  const Tensor seg = random_tensor(DataType::Float, {segments, hidden}, rng);
  const Tensor gamma = random_tensor(DataType::Float, {hidden}, rng, 0.5, 1.5);
  const Tensor beta = random_tensor(DataType::Float, {hidden}, rng);
  std::uniform_int_distribution<int32_t> pick_word(0, vocab - 1), pick_seg(0, 1);
  std::uniform_int_distribution<int32_t> pick_pos(0, positions - 1);
  std::vector<int32_t> ids, segs, mask, pids;
  for (int64_t i = 0; i < batch * seq; ++i) {
    ids.push_back(pick_word(rng));
    segs.push_back(pick_seg(rng));
    mask.push_back(i % seq < seq - i / seq ? 1 : 0);  // batch b keeps seq - b tokens
    pids.push_back(pick_pos(rng));
  }
  for (int variant = 0; variant < 3; ++variant) {
    const bool with_segments = variant != 1, with_positions = variant == 2;
    INFO("variant " << variant);
    std::vector<double> y, sum;
    for (int64_t r = 0; r < batch * seq; ++r) {
      const auto u = static_cast<size_t>(r);
      const int64_t p = with_positions ? pids[u] : r % seq;
      std::vector<double> s;
      double mu = 0, var = 0;
      for (int64_t i = 0; i < hidden; ++i) {
        s.push_back(element(word, ids[u] * hidden + i) + element(pos, p * hidden + i) +
                    (with_segments ? element(seg, segs[u] * hidden + i) : 0.0));
        mu += s.back();
      }
      mu /= double(hidden);
      for (double e : s) var += (e - mu) * (e - mu);
      const double inv = 1 / std::sqrt(var / double(hidden) + 1e-12);
      for (int64_t i = 0; i < hidden; ++i) {
        const double e = s[static_cast<size_t>(i)];
        y.push_back((e - mu) * inv * element(gamma, i) + element(beta, i));
        sum.push_back(e);
      }
    }
    OpTest t("EmbedLayerNormalization", 1, kMs);
    t.input(int32_tensor({batch, seq}, ids));
    if (with_segments) {
      t.input(int32_tensor({batch, seq}, segs));
    } else {
      t.no_input();
    }
    t.constant_input(word).constant_input(pos);
    if (with_segments) {
      t.constant_input(seg);
    } else {
      t.no_input();
    }
    t.constant_input(gamma).constant_input(beta).input(int32_tensor({batch, seq}, mask));
    if (with_positions) t.input(int32_tensor({batch, seq}, pids));
    const auto out = t.outputs(3).run();
    require_near(out[0].tensor(), y, 1e-5);
    require_near(out[1].tensor(), {5, 4, 3}, 0);
    require_near(out[2].tensor(), sum, 1e-6);
  }
  // An id beyond the table: an Error naming the node, never a read out of bounds.
  std::vector<int32_t> bad = ids;
  bad[3] = vocab;
  REQUIRE_THROWS_WITH(OpTest("EmbedLayerNormalization", 1, kMs)
                          .input(int32_tensor({batch, seq}, bad))
                          .input(int32_tensor({batch, seq}, segs))
                          .constant_input(word)
                          .constant_input(pos)
                          .constant_input(seg)
                          .constant_input(gamma)
                          .constant_input(beta)
                          .run(),
                      Catch::Contains("EmbedLayerNormalization") && Catch::Contains("outside"));
}

namespace {

// Attention's reference: x [B, S, D] x w + bias split into heads, past [2, B, N, P, H] in
// front of K and V, additive mask values (filter where masked) plus attention_bias.
struct AttentionCase {
  int64_t batch, seq, in, heads, head, past;
  bool unidirectional;
  int mask_kind;  // 0 none, 1 [B], 2 [2B], 3 [B, T], 4 [B, S, T]
  bool attn_bias;
};

std::vector<double> attention_reference(const AttentionCase& c, const Tensor& x, const Tensor& w,
                                        const Tensor& bias, const Tensor* past, const Tensor* mask,
                                        const Tensor* ab, float filter,
                                        std::vector<double>* present) {
  const int64_t hidden = c.heads * c.head, T = c.past + c.seq, cols = 3 * hidden;
  std::vector<double> qkv(static_cast<size_t>(c.batch * c.seq * cols));
  for (int64_t r = 0; r < c.batch * c.seq; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = element(bias, j);
      for (int64_t p = 0; p < c.in; ++p) s += element(x, r * c.in + p) * element(w, p * cols + j);
      qkv[static_cast<size_t>(r * cols + j)] = s;
    }
  }
  // kv(which, b, h, t, d)
  auto kv = [&](int64_t which, int64_t b, int64_t h, int64_t t, int64_t d) {
    if (t < c.past) {
      return element(*past, (((which * c.batch + b) * c.heads + h) * c.past + t) * c.head + d);
    }
    return qkv[static_cast<size_t>((b * c.seq + t - c.past) * cols + (1 + which) * hidden +
                                   h * c.head + d)];
  };
  if (present) {
    for (int64_t which = 0; which < 2; ++which)
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.heads; ++h)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t d = 0; d < c.head; ++d) present->push_back(kv(which, b, h, t, d));
  }
  std::vector<double> out(static_cast<size_t>(c.batch * c.seq * hidden));
  const double scale = 1 / std::sqrt(double(c.head));
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t i = 0; i < c.seq; ++i) {
        std::vector<double> s(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          double dot = 0;
          for (int64_t d = 0; d < c.head; ++d) {
            dot += qkv[static_cast<size_t>((b * c.seq + i) * cols + h * c.head + d)] *
                   kv(0, b, h, t, d);
          }
          bool masked = c.unidirectional && t > c.past + i;
          if (c.mask_kind == 1 || c.mask_kind == 2) {
            masked = masked || t >= element(*mask, b);
            if (c.mask_kind == 2) masked = masked || t < element(*mask, c.batch + b);
          } else if (c.mask_kind == 3) {
            masked = masked || element(*mask, b * T + t) == 0;
          } else if (c.mask_kind == 4) {
            masked = masked || element(*mask, (b * c.seq + i) * T + t) == 0;
          }
          s[static_cast<size_t>(t)] = dot * scale + (masked ? filter : 0.0);
          if (ab)
            s[static_cast<size_t>(t)] += element(*ab, ((b * c.heads + h) * c.seq + i) * T + t);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double total = 0;
        for (double& e : s) total += (e = std::exp(e - mx));
        for (int64_t d = 0; d < c.head; ++d) {
          double acc = 0;
          for (int64_t t = 0; t < T; ++t)
            acc += s[static_cast<size_t>(t)] / total * kv(1, b, h, t, d);
          out[static_cast<size_t>((b * c.seq + i) * hidden + h * c.head + d)] = acc;
        }
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("com.microsoft Attention: packed QKV, masks, causal, past and present",
          "[ops][contrib][attention]") {
  std::mt19937 rng(14);
  const std::vector<AttentionCase> cases = {
      {2, 5, 16, 2, 8, 0, false, 0, false}, {2, 7, 12, 3, 4, 0, false, 1, false},
      {3, 4, 8, 2, 4, 0, false, 2, false},  {2, 6, 16, 4, 4, 0, true, 3, false},
      {2, 3, 8, 1, 8, 4, true, 0, false},   {2, 1, 16, 2, 8, 6, true, 3, false},
      {1, 5, 8, 2, 4, 0, false, 4, true},   {2, 65, 32, 2, 16, 3, false, 1, true},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const AttentionCase& c = cases[k];
    INFO("case " << k);
    const int64_t hidden = c.heads * c.head, T = c.past + c.seq;
    const Tensor x = random_tensor(DataType::Float, {c.batch, c.seq, c.in}, rng);
    const Tensor w = random_tensor(DataType::Float, {c.in, 3 * hidden}, rng);
    const Tensor bias = random_tensor(DataType::Float, {3 * hidden}, rng);
    const Tensor past = random_tensor(DataType::Float, {2, c.batch, c.heads, c.past, c.head}, rng);
    const Tensor ab = random_tensor(DataType::Float, {c.batch, c.heads, c.seq, T}, rng);
    Tensor mask;
    std::vector<int32_t> m;
    if (c.mask_kind == 1 || c.mask_kind == 2) {
      for (int64_t b = 0; b < c.batch; ++b) m.push_back(static_cast<int32_t>(T - b));
      if (c.mask_kind == 2) {
        for (int64_t b = 0; b < c.batch; ++b) m.push_back(static_cast<int32_t>(b / 2));
      }
      mask = int32_tensor({static_cast<int64_t>(m.size())}, m);
    } else if (c.mask_kind == 3 || c.mask_kind == 4) {
      const Shape s = c.mask_kind == 3 ? Shape{c.batch, T} : Shape{c.batch, c.seq, T};
      int64_t count = 1;
      for (int64_t d : s) count *= d;
      for (int64_t i = 0; i < count; ++i) m.push_back(i % 3 == 2 ? 0 : 1);
      mask = int32_tensor(s, m);
    }
    OpTest t("Attention", 1, kMs);
    // Constant weights are packed once; weights fed at run time are packed on the fly.
    t.input(x);
    if (k % 2 == 0) {
      t.constant_input(w);
    } else {
      t.input(w);
    }
    t.constant_input(bias);
    if (c.mask_kind) {
      t.input(mask);
    } else {
      t.no_input();
    }
    if (c.past) {
      t.input(past);
    } else if (c.attn_bias) {
      t.no_input();
    }
    if (c.attn_bias) t.input(ab);
    t.attr("num_heads", c.heads).attr("unidirectional", c.unidirectional ? 1 : 0);
    t.attr("mask_filter_value", -10000.0f).outputs(2);
    const auto out = t.run();
    std::vector<double> present;
    const std::vector<double> want =
        attention_reference(c, x, w, bias, c.past ? &past : nullptr, c.mask_kind ? &mask : nullptr,
                            c.attn_bias ? &ab : nullptr, -10000.0f, &present);
    CHECK(out[0].tensor().shape() == Shape{c.batch, c.seq, hidden});
    require_near(out[0].tensor(), want, 2e-5);
    CHECK(out[1].tensor().shape() == Shape{2, c.batch, c.heads, T, c.head});
    require_near(out[1].tensor(), present, 1e-5);
  }
  // Weights that do not split into three, a mask of another shape, an integer input.
  const Tensor x = Tensor::zeros(DataType::Float, {1, 2, 4});
  REQUIRE_THROWS_WITH(OpTest("Attention", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float, {4, 8}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("Attention") && Catch::Contains("weights"));
  REQUIRE_THROWS_WITH(OpTest("Attention", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float, {4, 12}))
                          .input(Tensor::zeros(DataType::Float, {12}))
                          .input(int32_tensor({3}, {1, 1, 1}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("Attention") && Catch::Contains("mask_index"));
  REQUIRE_THROWS_WITH(OpTest("Attention", 1, kMs)
                          .input(Tensor::zeros(DataType::Int64, {1, 2, 4}))
                          .input(Tensor::zeros(DataType::Float, {4, 12}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("Attention") && Catch::Contains("float"));
}

TEST_CASE("com.microsoft Attention takes float16 (computed in float, output and present rounded)",
          "[ops][contrib][attention][float16]") {
  std::mt19937 rng(22);
  // Constant weights (packed once from float16) and weights fed at run time; no mask, a [B]
  // mask, a [B, T] mask with past, causal with attention_bias.
  const std::vector<AttentionCase> cases = {
      {2, 5, 16, 2, 8, 0, false, 0, false},
      {2, 7, 12, 3, 4, 0, false, 1, false},
      {2, 3, 8, 2, 4, 4, false, 3, false},
      {1, 6, 16, 4, 4, 0, true, 0, true},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const AttentionCase& c = cases[k];
    INFO("case " << k);
    const int64_t hidden = c.heads * c.head, T = c.past + c.seq;
    const Tensor x = random_tensor(DataType::Float16, {c.batch, c.seq, c.in}, rng);
    const Tensor w = random_tensor(DataType::Float16, {c.in, 3 * hidden}, rng);
    const Tensor bias = random_tensor(DataType::Float16, {3 * hidden}, rng);
    const Tensor past =
        random_tensor(DataType::Float16, {2, c.batch, c.heads, c.past, c.head}, rng);
    const Tensor ab = random_tensor(DataType::Float16, {c.batch, c.heads, c.seq, T}, rng);
    Tensor mask;
    if (c.mask_kind == 1) {
      std::vector<int32_t> ends;
      for (int64_t b = 0; b < c.batch; ++b) ends.push_back(static_cast<int32_t>(T - 2 * b));
      mask = int32_tensor({c.batch}, ends);
    } else if (c.mask_kind == 3) {
      std::vector<int32_t> m;
      for (int64_t i = 0; i < c.batch * T; ++i) m.push_back(i % 3 == 2 ? 0 : 1);
      mask = int32_tensor({c.batch, T}, m);
    }
    OpTest t("Attention", 1, kMs);
    t.input(x);
    if (k % 2 == 0) {
      t.constant_input(w);
    } else {
      t.input(w);
    }
    t.input(bias);
    if (c.mask_kind) {
      t.input(mask);
    } else {
      t.no_input();
    }
    if (c.past) {
      t.input(past);
    } else if (c.attn_bias) {
      t.no_input();
    }
    if (c.attn_bias) t.input(ab);
    t.attr("num_heads", c.heads).attr("unidirectional", c.unidirectional ? 1 : 0).outputs(2);
    const auto out = t.run();
    std::vector<double> present;
    const std::vector<double> want =
        attention_reference(c, x, w, bias, c.past ? &past : nullptr, c.mask_kind ? &mask : nullptr,
                            c.attn_bias ? &ab : nullptr, -10000.0f, &present);
    CHECK(out[0].tensor().dtype() == DataType::Float16);
    CHECK(out[0].tensor().shape() == Shape{c.batch, c.seq, hidden});
    require_near(out[0].tensor(), want, kHalfTol);
    CHECK(out[1].tensor().dtype() == DataType::Float16);
    CHECK(out[1].tensor().shape() == Shape{2, c.batch, c.heads, T, c.head});
    require_near(out[1].tensor(), present, kHalfTol);
  }
  // float16 input with float weights, a float bias or past: each an Error naming the node.
  const Tensor x = Tensor::zeros(DataType::Float16, {1, 2, 4});
  REQUIRE_THROWS_WITH(OpTest("Attention", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float, {4, 12}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("Attention") && Catch::Contains("one type"));
  REQUIRE_THROWS_WITH(OpTest("Attention", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float16, {4, 12}))
                          .input(Tensor::zeros(DataType::Float, {12}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("Attention") && Catch::Contains("bias"));
  REQUIRE_THROWS_WITH(OpTest("Attention", 1, kMs)
                          .input(x)
                          .input(Tensor::zeros(DataType::Float16, {4, 12}))
                          .input(Tensor::zeros(DataType::Float16, {12}))
                          .no_input()
                          .input(Tensor::zeros(DataType::Float, {2, 1, 2, 3, 2}))
                          .attr("num_heads", 2)
                          .run(),
                      Catch::Contains("Attention") && Catch::Contains("past"));
}
