// LSTM/GRU/RNN, Einsum, Det, Clip and PRelu against naive references on random shapes.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

int64_t rand_int(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

Tensor float_tensor(const Shape& shape, const std::vector<double>& values) {
  Tensor t = Tensor::zeros(DataType::Float, shape);
  for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = static_cast<float>(values[i]);
  return t;
}

// Any numeric tensor as float32, to compare other element types with float references.
Tensor to_float(const Tensor& t) {
  Tensor o = Tensor::zeros(DataType::Float, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) o.data<float>()[i] = static_cast<float>(element(t, i));
  return o;
}

// ---- recurrent cells, one time step at a time ----

struct RnnConfig {
  std::string op;  // RNN, GRU, LSTM
  int64_t seq = 1, batch = 1, input = 1, hidden = 1;
  std::string direction = "forward";
  bool bias = false, lens = false, h0 = false, c0 = false, peep = false;
  bool batch_major = false, lbr = false, input_forget = false;
  float clip = 0;
  std::vector<std::string> activations;  // empty: defaults
};

int64_t gate_count(const std::string& op) {
  return op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
}

double apply_act(const std::string& name, double x) {
  if (name == "Sigmoid") return 1 / (1 + std::exp(-x));
  if (name == "Tanh") return std::tanh(x);
  if (name == "Relu") return x > 0 ? x : 0;
  if (name == "HardSigmoid") return std::min(1.0, std::max(0.0, 0.2 * x + 0.5));
  if (name == "Softsign") return x / (1 + std::abs(x));
  throw std::runtime_error("no naive activation " + name);
}

struct RnnData {
  Tensor x, w, r, b, lens, h0, c0, p;
};

// Returns Y, Y_h, Y_c (Y_c empty unless LSTM) in the layout of the config.
std::vector<Tensor> naive_rnn(const RnnConfig& c, const RnnData& in) {
  const int64_t dirs = c.direction == "bidirectional" ? 2 : 1, g = gate_count(c.op), H = c.hidden;
  const int64_t S = c.seq, B = c.batch, I = c.input;
  const bool bm = c.batch_major;
  Tensor y = Tensor::zeros(DataType::Float, bm ? Shape{B, S, dirs, H} : Shape{S, dirs, B, H});
  const Shape state = bm ? Shape{B, dirs, H} : Shape{dirs, B, H};
  Tensor yh = Tensor::zeros(DataType::Float, state), yc = Tensor::zeros(DataType::Float, state);
  const int per = c.op == "LSTM" ? 3 : c.op == "GRU" ? 2 : 1;
  std::vector<std::string> acts = c.activations;
  if (acts.empty()) {
    acts = c.op == "LSTM"  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
           : c.op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                           : std::vector<std::string>{"Tanh"};
  }
  while (acts.size() < static_cast<size_t>(per * dirs)) acts.push_back(acts[acts.size() - per]);
  auto X = [&](int64_t t, int64_t b, int64_t i) {
    return element(in.x, (bm ? b * S + t : t * B + b) * I + i);
  };
  auto st = [&](int64_t d, int64_t b) { return bm ? b * dirs + d : d * B + b; };
  auto clipv = [&](double v) {
    return c.clip > 0 ? std::min<double>(c.clip, std::max<double>(-c.clip, v)) : v;
  };
  for (int64_t d = 0; d < dirs; ++d) {
    const bool rev = c.direction == "reverse" || d == 1;
    auto f = [&](int k, double v) { return apply_act(acts[d * per + k], v); };
    auto W = [&](int64_t row, int64_t i) { return element(in.w, (d * g * H + row) * I + i); };
    auto R = [&](int64_t row, int64_t i) { return element(in.r, (d * g * H + row) * H + i); };
    auto Wb = [&](int64_t row) { return c.bias ? element(in.b, d * 2 * g * H + row) : 0.0; };
    auto Rb = [&](int64_t row) {
      return c.bias ? element(in.b, d * 2 * g * H + g * H + row) : 0.0;
    };
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = c.lens ? static_cast<int64_t>(element(in.lens, b)) : S;
      std::vector<double> h(H, 0), cs(H, 0);
      for (int64_t j = 0; j < H; ++j) {
        if (c.h0) h[j] = element(in.h0, st(d, b) * H + j);
        if (c.c0) cs[j] = element(in.c0, st(d, b) * H + j);
      }
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = rev ? len - 1 - s : s;
        // pre[k][j] = x W^T + h R^T + biases, for gate k
        auto pre = [&](int64_t k, int64_t j, bool with_h) {
          double v = Wb(k * H + j) + Rb(k * H + j);
          for (int64_t i = 0; i < I; ++i) v += X(t, b, i) * W(k * H + j, i);
          if (with_h)
            for (int64_t i = 0; i < H; ++i) v += h[i] * R(k * H + j, i);
          return v;
        };
        std::vector<double> nh(H), nc(H);
        if (c.op == "RNN") {
          for (int64_t j = 0; j < H; ++j) nh[j] = f(0, clipv(pre(0, j, true)));
        } else if (c.op == "GRU") {
          std::vector<double> z(H), r(H);
          for (int64_t j = 0; j < H; ++j) {
            z[j] = f(0, clipv(pre(0, j, true)));
            r[j] = f(0, clipv(pre(1, j, true)));
          }
          for (int64_t j = 0; j < H; ++j) {
            double v = Wb(2 * H + j);
            for (int64_t i = 0; i < I; ++i) v += X(t, b, i) * W(2 * H + j, i);
            if (c.lbr) {
              double hr = Rb(2 * H + j);
              for (int64_t i = 0; i < H; ++i) hr += h[i] * R(2 * H + j, i);
              v += r[j] * hr;
            } else {
              v += Rb(2 * H + j);
              for (int64_t i = 0; i < H; ++i) v += r[i] * h[i] * R(2 * H + j, i);
            }
            const double ht = f(1, clipv(v));
            nh[j] = (1 - z[j]) * ht + z[j] * h[j];
          }
        } else {
          for (int64_t j = 0; j < H; ++j) {
            auto P = [&](int k) { return c.peep ? element(in.p, d * 3 * H + k * H + j) : 0.0; };
            const double it = f(0, clipv(pre(0, j, true) + P(0) * cs[j]));
            const double ft = c.input_forget ? 1 - it : f(0, clipv(pre(2, j, true) + P(2) * cs[j]));
            const double ct = f(1, clipv(pre(3, j, true)));
            nc[j] = ft * cs[j] + it * ct;
            const double ot = f(0, clipv(pre(1, j, true) + P(1) * nc[j]));
            nh[j] = ot * f(2, nc[j]);
          }
          cs = nc;
        }
        h = nh;
        for (int64_t j = 0; j < H; ++j) {
          const int64_t row = bm ? (b * S + t) * dirs + d : (t * dirs + d) * B + b;
          y.data<float>()[row * H + j] = static_cast<float>(h[j]);
        }
      }
      for (int64_t j = 0; j < H && len > 0; ++j) {
        yh.data<float>()[st(d, b) * H + j] = static_cast<float>(h[j]);
        yc.data<float>()[st(d, b) * H + j] = static_cast<float>(cs[j]);
      }
    }
  }
  return {y, yh, c.op == "LSTM" ? yc : Tensor()};
}

RnnData random_rnn_data(const RnnConfig& c, std::mt19937& rng) {
  const int64_t dirs = c.direction == "bidirectional" ? 2 : 1, gh = gate_count(c.op) * c.hidden;
  RnnData d;
  d.x = random_tensor(
      DataType::Float,
      c.batch_major ? Shape{c.batch, c.seq, c.input} : Shape{c.seq, c.batch, c.input}, rng);
  d.w = random_tensor(DataType::Float, {dirs, gh, c.input}, rng, -0.7, 0.7);
  d.r = random_tensor(DataType::Float, {dirs, gh, c.hidden}, rng, -0.7, 0.7);
  d.b = random_tensor(DataType::Float, {dirs, 2 * gh}, rng, -0.5, 0.5);
  std::vector<int32_t> lens(c.batch);
  for (auto& l : lens) l = static_cast<int32_t>(rand_int(rng, 0, c.seq));
  d.lens = Tensor::from_vector<int32_t>({c.batch}, lens);
  const Shape state =
      c.batch_major ? Shape{c.batch, dirs, c.hidden} : Shape{dirs, c.batch, c.hidden};
  d.h0 = random_tensor(DataType::Float, state, rng);
  d.c0 = random_tensor(DataType::Float, state, rng);
  d.p = random_tensor(DataType::Float, {dirs, 3 * c.hidden}, rng, -0.5, 0.5);
  return d;
}

std::vector<Value> run_rnn(const RnnConfig& c, const RnnData& d, int64_t opset = 14) {
  OpTest t(c.op, opset);
  t.input(d.x).input(d.w).input(d.r);
  const bool lstm = c.op == "LSTM";
  // Optional inputs, trailing ones left out.
  std::vector<std::pair<bool, Tensor>> opt = {{c.bias, d.b}, {c.lens, d.lens}, {c.h0, d.h0}};
  if (lstm) {
    opt.push_back({c.c0, d.c0});
    opt.push_back({c.peep, d.p});
  }
  size_t last = 0;
  for (size_t i = 0; i < opt.size(); ++i) {
    if (opt[i].first) last = i + 1;
  }
  for (size_t i = 0; i < last; ++i) {
    if (opt[i].first) {
      t.input(opt[i].second);
    } else {
      t.no_input();
    }
  }
  t.attr("hidden_size", c.hidden).attr("direction", c.direction);
  if (c.batch_major) t.attr("layout", 1);
  if (c.lbr) t.attr("linear_before_reset", 1);
  if (c.input_forget) t.attr("input_forget", 1);
  if (c.clip > 0) t.attr("clip", c.clip);
  if (!c.activations.empty()) t.attr("activations", c.activations);
  return t.outputs(lstm ? 3 : 2).run();
}

}  // namespace

TEST_CASE("LSTM, GRU and RNN match a per-timestep reference on random configurations",
          "[ops][recurrent]") {
  std::mt19937 rng(11);
  const char* ops[] = {"RNN", "GRU", "LSTM"};
  const char* directions[] = {"forward", "reverse", "bidirectional"};
  for (int iter = 0; iter < 90; ++iter) {
    RnnConfig c;
    c.op = ops[iter % 3];
    c.direction = directions[(iter / 3) % 3];
    c.seq = rand_int(rng, 1, 5);
    c.batch = rand_int(rng, 1, 4);
    c.input = rand_int(rng, 1, 5);
    c.hidden = rand_int(rng, 1, 6);
    c.bias = rng() % 2;
    c.lens = rng() % 3 == 0;
    c.h0 = rng() % 2;
    c.c0 = c.op == "LSTM" && rng() % 2;
    c.peep = c.op == "LSTM" && rng() % 2;
    c.batch_major = rng() % 3 == 0;
    c.lbr = c.op == "GRU" && rng() % 2;
    c.input_forget = c.op == "LSTM" && rng() % 4 == 0;
    if (rng() % 4 == 0) c.clip = 0.6f;
    RnnData d = random_rnn_data(c, rng);
    INFO(c.op << " " << c.direction << " seq " << c.seq << " batch " << c.batch << " in " << c.input
              << " hidden " << c.hidden << " bias " << c.bias << " lens " << c.lens << " h0 "
              << c.h0 << " c0 " << c.c0 << " peep " << c.peep << " batch_major " << c.batch_major
              << " lbr " << c.lbr << " input_forget " << c.input_forget << " clip " << c.clip);
    auto expected = naive_rnn(c, d);
    // layout needs opset 14; the others run at the first and the latest version
    const int64_t opset = c.batch_major ? 14 : (iter % 2 ? 7 : 22);
    auto actual = run_rnn(c, d, opset);
    require_close(actual[0].tensor(), expected[0]);
    require_close(actual[1].tensor(), expected[1]);
    if (c.op == "LSTM") require_close(actual[2].tensor(), expected[2]);
  }
}

TEST_CASE("recurrent ops take activations from the attribute, per direction", "[ops][recurrent]") {
  std::mt19937 rng(5);
  RnnConfig c;
  c.op = "GRU";
  c.direction = "bidirectional";
  c.seq = 3, c.batch = 2, c.input = 3, c.hidden = 4;
  c.bias = true;
  c.activations = {"HardSigmoid", "Relu", "Sigmoid", "Softsign"};
  RnnData d = random_rnn_data(c, rng);
  auto expected = naive_rnn(c, d);
  auto actual = run_rnn(c, d);
  require_close(actual[0].tensor(), expected[0]);
  require_close(actual[1].tensor(), expected[1]);

  c.op = "RNN";
  c.direction = "forward";
  c.activations = {"Relu"};
  d = random_rnn_data(c, rng);
  require_close(run_rnn(c, d)[1].tensor(), naive_rnn(c, d)[1]);
}

TEST_CASE("recurrent ops compute float16 and double like float", "[ops][recurrent]") {
  std::mt19937 rng(9);
  RnnConfig c;
  c.op = "LSTM";
  c.seq = 4, c.batch = 3, c.input = 2, c.hidden = 3;
  c.bias = c.h0 = true;
  RnnData d = random_rnn_data(c, rng);
  auto expected = naive_rnn(c, d);
  auto cast = [](const Tensor& t, DataType dt) {
    Tensor o = Tensor::zeros(dt, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = t.data<float>()[i];
      if (dt == DataType::Double) o.data<double>()[i] = v;
      if (dt == DataType::Float16) o.data<float16>()[i] = float16(v);
    }
    return o;
  };
  for (DataType dt : {DataType::Double, DataType::Float16}) {
    RnnData dd = d;
    for (Tensor* t : {&dd.x, &dd.w, &dd.r, &dd.b, &dd.h0}) *t = cast(*t, dt);
    auto actual = run_rnn(c, dd);
    CHECK(actual[1].tensor().dtype() == dt);
    require_close(to_float(actual[1].tensor()), expected[1], dt == DataType::Float16 ? 2e-2 : 1e-4,
                  1e-2);
  }
}

TEST_CASE("recurrent ops reject bad weights, attributes and sequence lengths", "[ops][recurrent]") {
  std::mt19937 rng(3);
  Tensor x = random_tensor(DataType::Float, {2, 1, 3}, rng);
  Tensor w = random_tensor(DataType::Float, {1, 8, 3}, rng);
  Tensor r = random_tensor(DataType::Float, {1, 8, 2}, rng);
  // LSTM needs 4 * hidden rows; 8 rows with hidden_size 3 is wrong.
  REQUIRE_THROWS_AS(OpTest("LSTM", 14).input(x).input(w).input(r).attr("hidden_size", 3).run(),
                    Error);
  REQUIRE_NOTHROW(OpTest("LSTM", 14).input(x).input(w).input(r).attr("hidden_size", 2).run());
  REQUIRE_THROWS_AS(OpTest("LSTM", 14).input(x).input(w).input(r).attr("hidden_size", 0).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("LSTM", 14).input(x).input(w).input(r).attr("hidden_size", -2).run(),
                    Error);
  Tensor w_bad_input = random_tensor(DataType::Float, {1, 8, 4}, rng);
  REQUIRE_THROWS_AS(
      OpTest("LSTM", 14).input(x).input(w_bad_input).input(r).attr("hidden_size", 2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("LSTM", 14)
                        .input(x)
                        .input(w)
                        .input(r)
                        .attr("hidden_size", 2)
                        .attr("direction", "sideways")
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("LSTM", 14)
                        .input(x)
                        .input(w)
                        .input(r)
                        .attr("hidden_size", 2)
                        .attr("activations", std::vector<std::string>{"Sigmoid", "Nope", "Tanh"})
                        .run(),
                    Error);
  Tensor lens = Tensor::from_vector<int32_t>({1}, {3});  // longer than seq_length 2
  REQUIRE_THROWS_AS(OpTest("GRU", 14)
                        .input(x)
                        .input(random_tensor(DataType::Float, {1, 6, 3}, rng))
                        .input(random_tensor(DataType::Float, {1, 6, 2}, rng))
                        .no_input()
                        .input(lens)
                        .attr("hidden_size", 2)
                        .run(),
                    Error);
  Tensor x2 = random_tensor(DataType::Float, {2, 3}, rng);
  REQUIRE_THROWS_AS(OpTest("RNN", 14)
                        .input(x2)
                        .input(random_tensor(DataType::Float, {1, 2, 3}, rng))
                        .input(random_tensor(DataType::Float, {1, 2, 2}, rng))
                        .attr("hidden_size", 2)
                        .run(),
                    Error);
}

TEST_CASE("LSTM, GRU and RNN with constant weights pack them once and match the reference",
          "[ops][recurrent]") {
  std::mt19937 rng(12);
  const char* ops[] = {"RNN", "GRU", "LSTM"};
  const char* directions[] = {"forward", "reverse", "bidirectional"};
  for (int iter = 0; iter < 36; ++iter) {
    RnnConfig c;
    c.op = ops[iter % 3];
    c.direction = directions[(iter / 3) % 3];
    c.seq = rand_int(rng, 1, 12);
    c.batch = rand_int(rng, 1, 9);
    c.input = rand_int(rng, 1, 50);
    c.hidden = rand_int(rng, 1, 40);
    c.bias = rng() % 3 != 0;
    c.lens = rng() % 3 == 0;
    c.h0 = rng() % 2;
    c.c0 = c.op == "LSTM" && rng() % 2;
    c.peep = c.op == "LSTM" && rng() % 2;
    c.batch_major = rng() % 3 == 0;
    c.lbr = c.op == "GRU" && rng() % 2;
    RnnData d = random_rnn_data(c, rng);
    INFO(c.op << " " << c.direction << " seq " << c.seq << " batch " << c.batch << " in " << c.input
              << " hidden " << c.hidden << " bias " << c.bias << " lens " << c.lens << " lbr "
              << c.lbr);
    auto expected = naive_rnn(c, d);
    // W, R and the other inputs but X as initializers of a session.
    GraphBuilder g;
    g.input("x", DataType::Float).initializer("w", d.w).initializer("r", d.r);
    std::vector<std::string> ins{"x", "w", "r"};
    std::vector<std::pair<bool, std::pair<std::string, Tensor>>> opt = {
        {c.bias, {"b", d.b}}, {c.lens, {"lens", d.lens}}, {c.h0, {"h0", d.h0}}};
    if (c.op == "LSTM") {
      opt.push_back({c.c0, {"c0", d.c0}});
      opt.push_back({c.peep, {"p", d.p}});
    }
    for (auto& [used, named] : opt) {
      if (used) g.initializer(named.first, named.second);
      ins.push_back(used ? named.first : "");
    }
    std::vector<std::string> outs{"y", "yh"};
    if (c.op == "LSTM") outs.push_back("yc");
    std::vector<ir::Attribute> attrs = {int_attr("hidden_size", c.hidden),
                                        string_attr("direction", c.direction)};
    if (c.batch_major) attrs.push_back(int_attr("layout", 1));
    if (c.lbr) attrs.push_back(int_attr("linear_before_reset", 1));
    g.node(c.op, ins, outs, attrs);
    for (const auto& o : outs) g.output(o);
    Session s = make_session(g.build(), 14, static_cast<int>(iter % 2 + 1));
    CHECK(s.load_stats().weights_prepared_count == 2);  // W and R, once
    for (int run = 0; run < 2; ++run) {
      auto actual = s.run({{"x", d.x}});
      for (size_t i = 0; i < outs.size(); ++i) {
        require_close(actual.at(i).value.tensor(), expected[i]);
      }
    }
    // The same weights fed at run time are packed per run.
    auto fed = run_rnn(c, d);
    for (size_t i = 0; i < outs.size(); ++i) require_close(fed[i].tensor(), expected[i]);
  }
}

TEST_CASE("recurrent ops with constant float16 weights compute in float", "[ops][recurrent]") {
  std::mt19937 rng(13);
  for (const char* op : {"GRU", "LSTM"}) {
    RnnConfig c;
    c.op = op;
    c.direction = "bidirectional";
    c.seq = 5, c.batch = 3, c.input = 17, c.hidden = 19;
    c.bias = true;
    RnnData d = random_rnn_data(c, rng);
    auto half = [](const Tensor& t) {
      Tensor o = Tensor::zeros(DataType::Float16, t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) o.data<float16>()[i] = float16(t.data<float>()[i]);
      return o;
    };
    RnnData hd = d;
    for (Tensor* t : {&hd.x, &hd.w, &hd.r, &hd.b}) *t = half(*t);
    auto expected = naive_rnn(c, hd);
    GraphBuilder g;
    g.input("x", DataType::Float16)
        .initializer("w", hd.w)
        .initializer("r", hd.r)
        .initializer("b", hd.b);
    g.node(op, {"x", "w", "r", "b"}, {"y", "yh"},
           {int_attr("hidden_size", c.hidden), string_attr("direction", c.direction)});
    g.output("y").output("yh");
    Session s = make_session(g.build(), 14, 2);
    CHECK(s.load_stats().weights_prepared_count == 2);
    auto actual = s.run({{"x", hd.x}});
    INFO(op);
    REQUIRE(actual.at(1).value.tensor().dtype() == DataType::Float16);
    require_close(to_float(actual.at(0).value.tensor()), expected[0], 1e-2, 5e-3);
    require_close(to_float(actual.at(1).value.tensor()), expected[1], 1e-2, 5e-3);
  }
}

// ---- Einsum ----

namespace {

// Sums the product of the operands over every assignment of every label (letters only).
Tensor naive_einsum(const std::vector<std::string>& terms, const std::string& out,
                    const std::vector<Tensor>& xs) {
  std::map<char, int64_t> size;
  for (size_t k = 0; k < terms.size(); ++k) {
    for (size_t d = 0; d < terms[k].size(); ++d) size[terms[k][d]] = xs[k].dim(d);
  }
  std::vector<char> labels;
  for (auto& [l, n] : size) labels.push_back(l);
  Shape out_shape;
  for (char l : out) out_shape.push_back(size[l]);
  Tensor y = Tensor::zeros(DataType::Float, out_shape);
  std::vector<double> acc(y.numel(), 0.0);
  std::map<char, int64_t> idx;
  std::function<void(size_t)> rec = [&](size_t li) {
    if (li < labels.size()) {
      for (int64_t v = 0; v < size[labels[li]]; ++v) {
        idx[labels[li]] = v;
        rec(li + 1);
      }
      return;
    }
    double prod = 1;
    for (size_t k = 0; k < terms.size(); ++k) {
      int64_t flat = 0;
      for (size_t d = 0; d < terms[k].size(); ++d) flat = flat * xs[k].dim(d) + idx[terms[k][d]];
      prod *= element(xs[k], flat);
    }
    int64_t flat = 0;
    for (size_t d = 0; d < out.size(); ++d) flat = flat * out_shape[d] + idx[out[d]];
    acc[flat] += prod;
  };
  rec(0);
  for (size_t i = 0; i < acc.size(); ++i) y.data<float>()[i] = static_cast<float>(acc[i]);
  return y;
}

}  // namespace

TEST_CASE("Einsum matches a naive sum over all index assignments on random equations",
          "[ops][recurrent][einsum]") {
  std::mt19937 rng(21);
  for (int iter = 0; iter < 300; ++iter) {
    const int n = static_cast<int>(rand_int(rng, 1, 3));
    std::map<char, int64_t> size;
    for (char l = 'a'; l <= 'f'; ++l) size[l] = rand_int(rng, 1, 4);
    size['B'] = rand_int(rng, 1, 3);  // an uppercase label, which sorts first
    const std::string pool = "abcdefB";
    std::vector<std::string> terms(n);
    std::vector<Tensor> xs;
    std::map<char, int> count;
    for (auto& t : terms) {
      const int64_t rank = rand_int(rng, 0, 4);
      for (int64_t d = 0; d < rank; ++d) t += pool[rng() % pool.size()];
      Shape shape;
      for (char l : t) {
        shape.push_back(size[l]);
        ++count[l];
      }
      xs.push_back(random_tensor(DataType::Float, shape, rng));
    }
    std::string eq;
    for (int k = 0; k < n; ++k) eq += (k ? "," : "") + terms[k];
    std::string out;
    const bool implicit = rng() % 3 == 0;
    if (implicit) {
      for (auto& [l, c] : count) {
        if (c == 1) out += l;
      }
      std::sort(out.begin(), out.end());
    } else {
      for (auto& [l, c] : count) {
        if (rng() % 2) out += l;
      }
      std::shuffle(out.begin(), out.end(), rng);
      eq += "->" + out;
    }
    INFO(eq);
    OpTest t("Einsum", 12);
    for (const Tensor& x : xs) t.input(x);
    require_close(t.attr("equation", eq).run1(), naive_einsum(terms, out, xs), 1e-4, 1e-4);
  }
}

TEST_CASE("Einsum broadcasts ellipsis dimensions and reads strided inputs",
          "[ops][recurrent][einsum]") {
  std::mt19937 rng(4);
  Tensor a = random_tensor(DataType::Float, {2, 3, 4, 5}, rng);
  Tensor b = random_tensor(DataType::Float, {3, 5, 2}, rng);
  // "...ij,...jk->...ik": b's batch [3] broadcasts against a's [2,3].
  Tensor b4 = b.reshaped({1, 3, 5, 2});
  Tensor b_full = Tensor::zeros(DataType::Float, {2, 3, 5, 2});
  for (int64_t i = 0; i < b_full.numel(); ++i)
    b_full.data<float>()[i] = b.data<float>()[i % b.numel()];
  require_close(
      OpTest("Einsum", 12).input(a).input(b).attr("equation", "...ij,...jk->...ik").run1(),
      naive_einsum({"xyij", "xyjk"}, "xyik", {a, b_full}));
  // Implicit output puts the ellipsis first; spaces are ignored.
  Tensor d = random_tensor(DataType::Float, {3, 4, 4}, rng);
  require_close(OpTest("Einsum", 12).input(d).attr("equation", "...ii ->...i").run1(),
                naive_einsum({"xii"}, "xi", {d}));
  require_close(OpTest("Einsum", 12).input(d).attr("equation", "...ii").run1(),
                naive_einsum({"xii"}, "x", {d}));
  // A transposed view as input gives the same result as its contiguous copy.
  Tensor base = random_tensor(DataType::Float, {5, 4}, rng);
  Tensor bt = base.view({4, 5}, {1, 4}, 0);
  Tensor c = random_tensor(DataType::Float, {5, 6}, rng);
  require_close(OpTest("Einsum", 12).input(bt).input(c).attr("equation", "ij,jk->ik").run1(),
                naive_einsum({"ij", "jk"}, "ik", {bt.contiguous(), c}));
  (void)b4;
}

TEST_CASE("Einsum batched products match the naive sum with broadcast batches and any layout",
          "[ops][recurrent][einsum]") {
  std::mt19937 rng(22);
  // a's and b's terms over batch labels x, y, rows i, contraction j and columns k.
  const std::vector<std::array<const char*, 3>> equations = {
      {"xij", "xjk", "xik"},    {"xij", "xkj", "xik"},    {"xji", "xjk", "xik"},
      {"xyij", "yjk", "xyik"},  {"xij", "jk", "xik"},     {"xij", "xjk", "xki"},
      {"xyij", "xyjk", "yxik"}, {"ij", "xjk", "xik"},     {"xyi", "xyi", "xy"},
      {"xij", "xj", "xi"},      {"xyji", "xykj", "xyik"}, {"xi", "xk", "xik"},
  };
  const DataType types[] = {DataType::Float, DataType::Double, DataType::Float16, DataType::Int64,
                            DataType::Float};
  for (int iter = 0; iter < 60; ++iter) {
    const auto& e = equations[static_cast<size_t>(iter) % equations.size()];
    const DataType dt = types[iter % 5];
    std::map<char, int64_t> size;
    size['x'] = rand_int(rng, 1, 5);
    size['y'] = rand_int(rng, 1, 3);
    for (char l : {'i', 'j', 'k'}) size[l] = rand_int(rng, 1, 40);
    std::vector<std::string> terms = {e[0], e[1]};
    // A batch label of both operands may have size 1 in one of them, which then broadcasts.
    std::map<char, size_t> broadcast_in;
    for (char l : {'x', 'y'}) {
      const bool both =
          terms[0].find(l) != std::string::npos && terms[1].find(l) != std::string::npos;
      broadcast_in[l] = both && rng() % 3 == 0 ? rng() % 2 : 2;
    }
    std::vector<Tensor> xs;
    for (size_t t = 0; t < 2; ++t) {
      Shape shape;
      for (char l : terms[t]) {
        const bool broadcast = (l == 'x' || l == 'y') && broadcast_in[l] == t;
        shape.push_back(broadcast ? 1 : size[l]);
      }
      const bool integer = dt == DataType::Int64;
      xs.push_back(random_tensor(dt, shape, rng, integer ? -9 : -1, integer ? 9 : 1));
    }
    // The reference repeats the broadcast operands to full size.
    std::vector<Tensor> full;
    for (size_t t = 0; t < 2; ++t) {
      Shape shape;
      for (char l : terms[t]) shape.push_back(size[l]);
      Tensor f = Tensor::zeros(DataType::Float, shape);
      for (int64_t i = 0; i < f.numel(); ++i) {
        int64_t rest = i, src = 0, scale = 1;
        for (size_t d = shape.size(); d-- > 0;) {
          const int64_t c = rest % shape[d];
          rest /= shape[d];
          src += (xs[t].dim(d) == 1 ? 0 : c) * scale;
          scale *= xs[t].dim(d);
        }
        f.data<float>()[i] = static_cast<float>(element(xs[t], src));
      }
      full.push_back(f);
    }
    const std::string eq = terms[0] + "," + terms[1] + "->" + e[2];
    INFO(eq << " iter " << iter);
    Tensor y = OpTest("Einsum", 12).input(xs[0]).input(xs[1]).attr("equation", eq).run1();
    REQUIRE(y.dtype() == dt);
    const double tol = dt == DataType::Float16 ? 2e-2 : 1e-4;
    require_close(to_float(y), naive_einsum(terms, e[2], full), tol, tol);
  }
  // A batch large enough to run one product per thread, and one product split across threads.
  for (const Shape& as : {Shape{64, 33, 65}, Shape{2, 300, 129}}) {
    const int64_t nb = as[0], m = as[1], k = as[2], n = 70;
    Tensor a = random_tensor(DataType::Float, as, rng);
    Tensor b = random_tensor(DataType::Float, {nb, k, n}, rng);
    std::vector<double> want(static_cast<size_t>(nb * m * n), 0.0);
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    for (int64_t bi = 0; bi < nb; ++bi)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < n; ++j)
            want[static_cast<size_t>((bi * m + i) * n + j)] +=
                double(pa[(bi * m + i) * k + p]) * pb[(bi * k + p) * n + j];
    require_close(OpTest("Einsum", 12).input(a).input(b).attr("equation", "bij,bjk->bik").run1(),
                  float_tensor({nb, m, n}, want), 1e-4, 1e-4);
  }
}

TEST_CASE("Einsum on integers and float16", "[ops][recurrent][einsum]") {
  Tensor a = Tensor::from_vector<int64_t>({2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::from_vector<int64_t>({2, 2}, {5, 6, 7, 8});
  CHECK(OpTest("Einsum", 12)
            .input(a)
            .input(b)
            .attr("equation", "ij,jk")
            .run1()
            .to_vector<int64_t>() == std::vector<int64_t>{19, 22, 43, 50});
  Tensor i32 = Tensor::from_vector<int32_t>({3}, {-1, 2, -3});
  CHECK(OpTest("Einsum", 12)
            .input(i32)
            .input(i32)
            .attr("equation", "i,i->")
            .run1()
            .to_vector<int32_t>() == std::vector<int32_t>{14});
  // An empty contracted label gives zeros; an empty output label gives an empty output.
  Tensor e1 = Tensor::from_vector<float>({2, 0}, {});
  Tensor e2 = Tensor::from_vector<float>({0, 3}, {});
  CHECK(OpTest("Einsum", 12)
            .input(e1)
            .input(e2)
            .attr("equation", "ij,jk->ik")
            .run1()
            .to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(OpTest("Einsum", 12).input(e2).attr("equation", "ij->ji").run1().shape() == Shape{3, 0});
  Tensor h = Tensor::zeros(DataType::Float16, {2, 3});
  for (int i = 0; i < 6; ++i) h.data<float16>()[i] = float16(static_cast<float>(i));
  Tensor y = OpTest("Einsum", 12).input(h).attr("equation", "ij->j").run1();
  CHECK(y.dtype() == DataType::Float16);
  require_close(to_float(y), float_tensor({3}, {3, 5, 7}));
}

TEST_CASE("Einsum rejects bad equations and mismatched operands", "[ops][recurrent][einsum]") {
  std::mt19937 rng(1);
  Tensor a = random_tensor(DataType::Float, {2, 3}, rng);
  Tensor b = random_tensor(DataType::Float, {4, 5}, rng);
  for (const char* eq : {"ij,jk", "i#j", "....ij", "i.j", "ij->k", "ij->ii", "ij->i->j"}) {
    INFO(eq);
    REQUIRE_THROWS_AS(OpTest("Einsum", 12).input(a).attr("equation", eq).run(), Error);
  }
  REQUIRE_THROWS_AS(OpTest("Einsum", 12).input(a).attr("equation", "ijk->i").run(), Error);
  REQUIRE_THROWS_AS(OpTest("Einsum", 12).input(a).input(b).attr("equation", "ij,jk->ik").run(),
                    Error);
}

// ---- Det ----

namespace {

double cofactor_det(std::vector<double> m, int64_t n) {
  if (n == 0) return 1;
  if (n == 1) return m[0];
  double det = 0;
  for (int64_t c = 0; c < n; ++c) {
    std::vector<double> minor;
    for (int64_t i = 1; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (j != c) minor.push_back(m[i * n + j]);
      }
    }
    det += (c % 2 ? -1 : 1) * m[c] * cofactor_det(minor, n - 1);
  }
  return det;
}

}  // namespace

TEST_CASE("Det matches cofactor expansion on random batches", "[ops][recurrent][det]") {
  std::mt19937 rng(8);
  for (int64_t n = 1; n <= 6; ++n) {
    Shape shape = random_shape(rand_int(rng, 0, 2), 3, rng);
    shape.push_back(n);
    shape.push_back(n);
    Tensor x = random_tensor(DataType::Float, shape, rng);
    const int64_t batch = x.numel() / (n * n);
    Shape out_shape(shape.begin(), shape.end() - 2);
    std::vector<double> expected;
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<double> m(n * n);
      for (int64_t i = 0; i < n * n; ++i) m[i] = element(x, b * n * n + i);
      expected.push_back(cofactor_det(m, n));
    }
    INFO(shape_to_string(shape));
    require_close(OpTest("Det", 22).input(x).run1(), float_tensor(out_shape, expected), 1e-4, 1e-5);
  }
  Tensor sq = random_tensor(DataType::Float, {2, 3}, rng);
  REQUIRE_THROWS_AS(OpTest("Det", 22).input(sq).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Det", 22).input(random_tensor(DataType::Float, {3}, rng)).run(), Error);
}

// ---- Clip and PRelu ----

TEST_CASE("Clip matches a naive loop for attributes, inputs and integer types",
          "[ops][recurrent][clip]") {
  std::mt19937 rng(2);
  Tensor x = random_tensor(DataType::Float, {4, 5}, rng, -3, 3);
  auto naive = [&](double lo, double hi) {
    Tensor y = Tensor::zeros(DataType::Float, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i)
      y.data<float>()[i] = static_cast<float>(std::min(hi, std::max(lo, element(x, i))));
    return y;
  };
  require_close(OpTest("Clip", 6).input(x).attr("min", -1.0f).attr("max", 0.5f).run1(),
                naive(-1, 0.5));
  require_close(OpTest("Clip", 6).input(x).attr("max", 0.5f).run1(), naive(-1e30, 0.5));
  require_close(OpTest("Clip", 13)
                    .input(x)
                    .input(Tensor::scalar<float>(-0.5f))
                    .input(Tensor::scalar<float>(2.0f))
                    .run1(),
                naive(-0.5, 2));
  require_close(OpTest("Clip", 13).input(x).no_input().input(Tensor::scalar<float>(1.0f)).run1(),
                naive(-1e30, 1));
  require_close(OpTest("Clip", 11).input(x).input(Tensor::scalar<float>(0.0f)).run1(),
                naive(0, 1e30));
  // min > max: everything becomes max.
  require_close(OpTest("Clip", 13)
                    .input(x)
                    .input(Tensor::scalar<float>(2.0f))
                    .input(Tensor::scalar<float>(1.0f))
                    .run1(),
                naive(1, 1));
  Tensor xi = Tensor::from_vector<int8_t>({5}, {-128, -5, 0, 7, 127});
  CHECK(OpTest("Clip", 12)
            .input(xi)
            .input(Tensor::scalar<int8_t>(-4))
            .input(Tensor::scalar<int8_t>(6))
            .run1()
            .to_vector<int8_t>() == std::vector<int8_t>{-4, -4, 0, 6, 6});
  CHECK(OpTest("Clip", 13).input(xi).run1().to_vector<int8_t>() ==
        std::vector<int8_t>{-128, -5, 0, 7, 127});
  REQUIRE_THROWS_AS(
      OpTest("Clip", 13).input(x).input(Tensor::from_vector<float>({2}, {0, 1})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Clip", 13).input(x).input(Tensor::scalar<double>(0.0)).run(), Error);
}

TEST_CASE("PRelu matches a naive loop over random broadcast slopes", "[ops][recurrent][prelu]") {
  std::mt19937 rng(6);
  for (int iter = 0; iter < 30; ++iter) {
    const Shape xs = random_shape(rand_int(rng, 1, 4), 4, rng);
    Shape ss(xs.begin() + rand_int(rng, 0, static_cast<int64_t>(xs.size())), xs.end());
    for (auto& d : ss) {
      if (rng() % 3 == 0) d = 1;
    }
    Tensor x = random_tensor(DataType::Float, xs, rng);
    Tensor s = random_tensor(DataType::Float, ss, rng);
    Tensor expected = Tensor::zeros(DataType::Float, xs);
    for (int64_t i = 0; i < x.numel(); ++i) {
      // the slope index: x's trailing coordinates, 0 where the slope has size 1
      int64_t rem = i, si = 0, stride = 1;
      for (size_t d = xs.size(); d-- > 0;) {
        const int64_t coord = rem % xs[d];
        rem /= xs[d];
        const size_t off = xs.size() - ss.size();
        if (d >= off) {
          si += (ss[d - off] == 1 ? 0 : coord) * stride;
          stride *= ss[d - off];
        }
      }
      const double v = element(x, i);
      expected.data<float>()[i] = static_cast<float>(v < 0 ? v * element(s, si) : v);
    }
    INFO(shape_to_string(xs) << " " << shape_to_string(ss));
    require_close(OpTest("PRelu", 16).input(x).input(s).run1(), expected);
  }
  // Opset 6: a slope of x.shape[1] values is per channel.
  Tensor x = float_tensor({1, 2, 3}, {-1, 2, -3, -4, 5, -6});
  Tensor s = float_tensor({2}, {0.5, 2});
  require_close(OpTest("PRelu", 6).input(x).input(s).run1(),
                float_tensor({1, 2, 3}, {-0.5, 2, -1.5, -8, 5, -12}));
  Tensor xi = Tensor::from_vector<int32_t>({3}, {-2, 0, 3});
  CHECK(OpTest("PRelu", 16)
            .input(xi)
            .input(Tensor::from_vector<int32_t>({1}, {3}))
            .run1()
            .to_vector<int32_t>() == std::vector<int32_t>{-6, 0, 3});
  // The slope must broadcast to x without growing it.
  REQUIRE_THROWS_AS(OpTest("PRelu", 16).input(x).input(float_tensor({2}, {1, 2})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("PRelu", 16)
                        .input(float_tensor({3}, {1, 2, 3}))
                        .input(random_tensor(DataType::Float, {2, 3}, rng))
                        .run(),
                    Error);
}
