// Reductions, softmax-like ops, normalisation layers and losses against naive references
// (double precision, one element at a time) over random shapes, axes and attributes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// A tensor of `dtype` holding `values` (row-major).
Tensor make_tensor(DataType dtype, const Shape& shape, const std::vector<double>& values) {
  Tensor t = Tensor::zeros(dtype, shape);
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DataType::Float:
        t.data<float>()[i] = static_cast<float>(v);
        break;
      case DataType::Double:
        t.data<double>()[i] = v;
        break;
      case DataType::Float16:
        t.data<float16>()[i] = float16(static_cast<float>(v));
        break;
      case DataType::Int32:
        t.data<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DataType::Int64:
        t.data<int64_t>()[i] = static_cast<int64_t>(v);
        break;
      default:
        FAIL("make_tensor: unsupported type");
    }
  }
  return t;
}

std::vector<double> values_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<double> v(static_cast<size_t>(c.numel()));
  if (c.dtype() == DataType::Float) {
    std::copy(c.data<const float>(), c.data<const float>() + c.numel(), v.begin());
  } else {
    for (size_t i = 0; i < v.size(); ++i) v[i] = element(c, static_cast<int64_t>(i));
  }
  return v;
}

// Row-major coordinates of flat index i.
std::vector<int64_t> coords(const Shape& shape, int64_t i) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

// ---- reductions ----

enum class R { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

struct ReduceOp {
  const char* name;
  R kind;
  int input_since;  // first opset taking axes as an input
};

const ReduceOp kReduceOps[] = {{"ReduceSum", R::Sum, 13},
                               {"ReduceMean", R::Mean, 18},
                               {"ReduceMax", R::Max, 18},
                               {"ReduceMin", R::Min, 18},
                               {"ReduceProd", R::Prod, 18},
                               {"ReduceL1", R::L1, 18},
                               {"ReduceL2", R::L2, 18},
                               {"ReduceLogSum", R::LogSum, 18},
                               {"ReduceLogSumExp", R::LogSumExp, 18},
                               {"ReduceSumSquare", R::SumSquare, 18}};

// Every fold of one output's values, accumulated in double.
struct Folds {
  double sum = 0, abs = 0, sq = 0, prod = 1, exp = 0, count = 0;
  double max = -std::numeric_limits<double>::infinity();
  double min = std::numeric_limits<double>::infinity();
  void add(double v) {
    sum += v;
    abs += std::abs(v);
    sq += v * v;
    prod *= v;
    exp += std::exp(v);
    count += 1;
    max = std::max(max, v);
    min = std::min(min, v);
  }
  double result(R kind, bool integer) const {
    switch (kind) {
      case R::Sum:
        return sum;
      case R::Mean:
        return count == 0 ? 0 : (integer ? std::trunc(sum / count) : sum / count);
      case R::Max:
        return max;
      case R::Min:
        return min;
      case R::Prod:
        return prod;
      case R::L1:
        return abs;
      case R::L2:
        return std::sqrt(sq);
      case R::LogSum:
        return std::log(sum);
      case R::LogSumExp:
        return std::log(exp);
      case R::SumSquare:
        return sq;
    }
    return 0;
  }
};

Tensor naive_reduce(const Tensor& x, const std::vector<bool>& reduced, bool keepdims, R kind) {
  Shape out_shape;
  int64_t outputs = 1;
  for (size_t d = 0; d < x.rank(); ++d) {
    if (!reduced[d]) {
      out_shape.push_back(x.dim(d));
      outputs *= x.dim(d);
    } else if (keepdims) {
      out_shape.push_back(1);
    }
  }
  std::vector<Folds> folds(static_cast<size_t>(outputs));
  const std::vector<double> xv = values_of(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    // Output index: the kept coordinates of i, row-major.
    int64_t o = 0, stride = 1, rest = i;
    for (size_t d = x.rank(); d-- > 0;) {
      const int64_t c = rest % x.dim(d);
      rest /= x.dim(d);
      if (!reduced[d]) {
        o += c * stride;
        stride *= x.dim(d);
      }
    }
    folds[static_cast<size_t>(o)].add(xv[static_cast<size_t>(i)]);
  }
  const bool integer = x.dtype() == DataType::Int32 || x.dtype() == DataType::Int64;
  std::vector<double> out;
  for (const Folds& f : folds) out.push_back(f.result(kind, integer));
  return make_tensor(x.dtype(), out_shape, out);
}

// Runs a reduce op with axes given the way `opset` expects (attribute or input).
Tensor run_reduce(const ReduceOp& op, int64_t opset, const Tensor& x,
                  const std::vector<int64_t>& axes, bool keepdims, bool axes_as_constant,
                  int64_t noop = -1) {
  OpTest t(op.name, opset);
  t.input(x);
  if (opset >= op.input_since) {
    Tensor a = Tensor::from_vector<int64_t>({static_cast<int64_t>(axes.size())}, axes);
    if (axes_as_constant) {
      t.constant_input(a);
    } else {
      t.input(a);
    }
    if (noop >= 0) t.attr("noop_with_empty_axes", noop);
  } else if (!axes.empty()) {
    t.attr("axes", axes);
  }
  t.attr("keepdims", static_cast<int64_t>(keepdims));
  return t.run1();
}

double reduce_range_lo(R kind) {
  return kind == R::LogSum ? 0.1 : (kind == R::Prod ? 0.8 : -1.0);
}
double reduce_range_hi(R kind) {
  return kind == R::Prod ? 1.25 : 1.0;
}

}  // namespace

TEST_CASE("reduce ops match a naive reference over random shapes and axes", "[reduce]") {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = std::uniform_int_distribution<size_t>(0, 4)(rng);
    const Shape shape = random_shape(rank, 5, rng);
    std::vector<bool> reduced(rank, false);
    std::vector<int64_t> axes;
    for (size_t d = 0; d < rank; ++d) {
      if (rng() % 2) {
        reduced[d] = true;
        axes.push_back(rng() % 2 ? static_cast<int64_t>(d)
                                 : static_cast<int64_t>(d) - static_cast<int64_t>(rank));
      }
    }
    std::shuffle(axes.begin(), axes.end(), rng);
    if (axes.empty()) reduced.assign(rank, true);  // no axes: reduce everything
    const bool keepdims = rng() % 2;
    for (const ReduceOp& op : kReduceOps) {
      const Tensor x = random_tensor(DataType::Float, shape, rng, reduce_range_lo(op.kind),
                                     reduce_range_hi(op.kind));
      const Tensor expected = naive_reduce(x, reduced, keepdims, op.kind);
      for (int64_t opset : {int64_t{11}, int64_t{op.input_since}}) {
        INFO(op.name << " opset " << opset << " " << shape_to_string(shape) << " axes "
                     << axes.size() << " keepdims " << keepdims);
        require_close(run_reduce(op, opset, x, axes, keepdims, iter % 2 == 0), expected, 1e-4,
                      1e-5);
      }
    }
  }
}

TEST_CASE("reduce ops on large tensors use every path (rows, columns, split)", "[reduce]") {
  std::mt19937 rng(5);
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const Case cases[] = {{{3, 50000}, {1}},         {{50000, 3}, {0}},       {{64, 4096}, {1}},
                        {{4096, 64}, {0}},         {{40, 300, 50}, {0, 2}}, {{40, 300, 50}, {1}},
                        {{7, 9, 1000, 3}, {1, 3}}, {{300000}, {0}}};
  for (const Case& c : cases) {
    std::vector<bool> reduced(c.shape.size(), false);
    for (int64_t a : c.axes) reduced[static_cast<size_t>(a)] = true;
    for (const ReduceOp& op : kReduceOps) {
      if (op.kind == R::Prod || op.kind == R::LogSum || op.kind == R::L1 ||
          op.kind == R::SumSquare) {
        continue;
      }
      const Tensor x = random_tensor(DataType::Float, c.shape, rng, -1, 1);
      INFO(op.name << " " << shape_to_string(c.shape));
      require_close(run_reduce(op, 18, x, c.axes, true, true),
                    naive_reduce(x, reduced, true, op.kind), 1e-4, 1e-4);
    }
  }
}

TEST_CASE("reduce ops on double and integer types", "[reduce]") {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 20; ++iter) {
    const Shape shape = random_shape(3, 6, rng);
    const std::vector<int64_t> axes{static_cast<int64_t>(rng() % 3)};
    std::vector<bool> reduced(3, false);
    reduced[static_cast<size_t>(axes[0])] = true;
    for (const ReduceOp& op : kReduceOps) {
      const Tensor xd = random_tensor(DataType::Double, shape, rng, reduce_range_lo(op.kind),
                                      reduce_range_hi(op.kind));
      INFO(op.name << " " << shape_to_string(shape));
      require_close(run_reduce(op, 18, xd, axes, false, false),
                    naive_reduce(xd, reduced, false, op.kind), 1e-9, 1e-12);
      if (op.kind == R::LogSum || op.kind == R::LogSumExp || op.kind == R::L2) continue;
      const Tensor xi = random_tensor(DataType::Int32, shape, rng, -20, 20);
      require_close(run_reduce(op, 18, xi, axes, false, false),
                    naive_reduce(xi, reduced, false, op.kind));
    }
  }
}

TEST_CASE("reducing an empty axis gives each op's identity", "[reduce]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 0, 3});
  const double inf = std::numeric_limits<double>::infinity();
  const std::pair<R, double> expected[] = {
      {R::Sum, 0}, {R::Mean, 0}, {R::Max, -inf},    {R::Min, inf},        {R::Prod, 1},
      {R::L1, 0},  {R::L2, 0},   {R::LogSum, -inf}, {R::LogSumExp, -inf}, {R::SumSquare, 0}};
  for (const ReduceOp& op : kReduceOps) {
    for (auto [kind, value] : expected) {
      if (kind != op.kind) continue;
      INFO(op.name);
      const Tensor y = run_reduce(op, 18, x, {1}, true, false);
      REQUIRE(y.shape() == Shape{2, 1, 3});
      for (double v : values_of(y)) CHECK(v == value);
      // A zero-sized kept axis gives an empty output.
      CHECK(run_reduce(op, 18, x, {2}, false, false).shape() == Shape{2, 0});
    }
  }
  const Tensor xi = Tensor::zeros(DataType::Int32, {2, 0});
  CHECK(run_reduce(kReduceOps[2], 18, xi, {1}, false, false).to_vector<int32_t>() ==
        std::vector<int32_t>(2, std::numeric_limits<int32_t>::lowest()));
}

TEST_CASE("noop_with_empty_axes applies the element function without reducing", "[reduce]") {
  const Tensor x = Tensor::from_vector<float>({2, 2}, {1, -2, 3, 4});
  const Tensor sq = run_reduce(kReduceOps[9], 18, x, {}, true, false, 1);
  CHECK(sq.to_vector<float>() == std::vector<float>{1, 4, 9, 16});
  const Tensor l1 = run_reduce(kReduceOps[5], 18, x, {}, true, false, 1);
  CHECK(l1.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  const Tensor sum = run_reduce(kReduceOps[0], 13, x, {}, true, false, 1);
  CHECK(sum.to_vector<float>() == std::vector<float>{1, -2, 3, 4});
  // Without noop, empty axes reduce everything.
  CHECK(run_reduce(kReduceOps[0], 13, x, {}, false, false, 0).to_vector<float>() ==
        std::vector<float>{6});
}

TEST_CASE("reduce ops reject bad axes and types", "[reduce]") {
  const Tensor x = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  REQUIRE_THROWS_AS(run_reduce(kReduceOps[0], 13, x, {1, -1}, true, false), Error);
  REQUIRE_THROWS_AS(run_reduce(kReduceOps[1], 18, x, {2}, true, true), Error);
  REQUIRE_THROWS_AS(run_reduce(kReduceOps[1], 11, x, {-3}, true, false), Error);
  REQUIRE_THROWS_AS(OpTest("ReduceMean", 18).input(x).attr("axes", std::vector<int64_t>{0}).run(),
                    Error);
  const Tensor b = Tensor::from_vector<bool>({2}, {true, false});
  REQUIRE_THROWS_AS(OpTest("ReduceSum", 13).input(b).run(), Error);
  CHECK(OpTest("ReduceMax", 20).input(b).attr("keepdims", int64_t{0}).run1().to_vector<bool>() ==
        std::vector<bool>{true});
}

// ---- softmax ----

namespace {

enum class Sm { Softmax, LogSoftmax, Hardmax };

// Naive reference: `axis` alone (opset >= 13) or the 2-D coercion (before 13).
Tensor naive_softmax(const Tensor& x, int64_t axis, bool coerce, Sm kind) {
  const int64_t rank = static_cast<int64_t>(x.rank());
  if (axis < 0) axis += rank;
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t dim = x.dim(static_cast<size_t>(d));
    if (d < axis) {
      outer *= dim;
    } else if (d == axis || coerce) {
      n *= dim;
    } else {
      inner *= dim;
    }
  }
  const std::vector<double> xv = values_of(x);
  std::vector<double> y(xv.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t i) { return static_cast<size_t>((o * n + i) * inner + j); };
      double m = -std::numeric_limits<double>::infinity();
      int64_t best = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (xv[at(i)] > m) {
          m = xv[at(i)];
          best = i;
        }
      }
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += std::exp(xv[at(i)] - m);
      for (int64_t i = 0; i < n; ++i) {
        const double v = xv[at(i)];
        y[at(i)] = kind == Sm::Softmax      ? std::exp(v - m) / s
                   : kind == Sm::LogSoftmax ? v - m - std::log(s)
                                            : (i == best ? 1.0 : 0.0);
      }
    }
  }
  return make_tensor(x.dtype(), x.shape(), y);
}

const std::pair<const char*, Sm> kSoftmaxOps[] = {
    {"Softmax", Sm::Softmax}, {"LogSoftmax", Sm::LogSoftmax}, {"Hardmax", Sm::Hardmax}};

}  // namespace

TEST_CASE("Softmax, LogSoftmax and Hardmax match a naive reference", "[reduce][softmax]") {
  std::mt19937 rng(21);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = std::uniform_int_distribution<size_t>(1, 4)(rng);
    const Shape shape = random_shape(rank, iter < 50 ? 6 : (rank <= 2 ? 300 : 20), rng);
    const auto r = static_cast<int64_t>(rank);
    const int64_t axis = std::uniform_int_distribution<int64_t>(-r, r - 1)(rng);
    const Tensor x = random_tensor(DataType::Float, shape, rng, -5, 5);
    for (auto [op, kind] : kSoftmaxOps) {
      for (int64_t opset : {11, 13}) {
        INFO(op << " opset " << opset << " " << shape_to_string(shape) << " axis " << axis);
        require_close(OpTest(op, opset).input(x).attr("axis", axis).run1(),
                      naive_softmax(x, axis, opset < 13, kind), 1e-4, 1e-6);
      }
    }
  }
}

TEST_CASE("softmax is numerically stable for large inputs and computes half in float",
          "[reduce][softmax]") {
  const Tensor x = Tensor::from_vector<float>({2, 3}, {1000, 1001, 1002, -1000, -3000, -1001});
  require_close(OpTest("Softmax", 13).input(x).run1(), naive_softmax(x, -1, false, Sm::Softmax));
  require_close(OpTest("LogSoftmax", 13).input(x).run1(),
                naive_softmax(x, -1, false, Sm::LogSoftmax));
  require_close(OpTest("Softmax", 13).input(x).attr("axis", int64_t{0}).run1(),
                naive_softmax(x, 0, false, Sm::Softmax));
  std::mt19937 rng(2);
  const Tensor h = random_tensor(DataType::Float16, {3, 40, 5}, rng, -4, 4);
  for (int64_t axis : {1, 2}) {
    require_close(OpTest("Softmax", 13).input(h).attr("axis", axis).run1(),
                  naive_softmax(h, axis, false, Sm::Softmax), 2e-3, 1e-3);
    require_close(OpTest("LogSoftmax", 13).input(h).attr("axis", axis).run1(),
                  naive_softmax(h, axis, false, Sm::LogSoftmax), 2e-3, 1e-2);
  }
}

TEST_CASE("softmax over the last axis reads a view with spare capacity without a copy",
          "[reduce][softmax]") {
  std::mt19937 rng(4);
  Tensor base = random_tensor(DataType::Float, {2, 6, 8}, rng, -3, 3);
  // A [2, 4, 8] window of the [2, 6, 8] buffer: each row contiguous, batches 48 apart.
  Tensor view = base.view({2, 4, 8}, {48, 8, 1}, 0);
  REQUIRE_FALSE(view.is_contiguous());
  OpTest t("Softmax", 13);
  const Tensor y = t.input(view).run1();
  require_close(y, naive_softmax(view.contiguous(), -1, false, Sm::Softmax));
  CHECK(t.stats().bytes_copied == 0);
  // Another axis needs a contiguous copy, made by the kernel and counted.
  OpTest t2("LogSoftmax", 13);
  require_close(t2.input(view).attr("axis", int64_t{1}).run1(),
                naive_softmax(view.contiguous(), 1, false, Sm::LogSoftmax));
  CHECK(t2.stats().bytes_copied == view.nbytes());
}

TEST_CASE("softmax and layer norm write over a moved input", "[reduce][softmax]") {
  std::mt19937 rng(8);
  for (const char* op : {"Softmax", "LogSoftmax", "LayerNormalization"}) {
    GraphBuilder b;
    b.input("x", DataType::Float, {4, 16}, true);
    std::vector<std::string> ins{"x"};
    if (std::string(op) == "LayerNormalization") {
      b.initializer("s", Tensor::from_vector<float>({16}, std::vector<float>(16, 1.0f)));
      ins.push_back("s");
    }
    b.node(op, ins, {"y"});
    b.output("y");
    Session s = make_session(b.build(), 18);
    Tensor x = random_tensor(DataType::Float, {4, 16}, rng);
    const auto* data = x.raw_data();
    std::vector<NamedValue> feeds;
    feeds.push_back({"x", Value(std::move(x))});
    auto out = s.run(std::move(feeds));
    INFO(op);
    CHECK(s.last_run_stats().in_place_ops == 1);
    CHECK(out[0].value.tensor().raw_data() == data);
  }
}

TEST_CASE("softmax rejects an out-of-range axis", "[reduce][softmax]") {
  const Tensor x = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  REQUIRE_THROWS_AS(OpTest("Softmax", 13).input(x).attr("axis", int64_t{2}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Hardmax", 13).input(x).attr("axis", int64_t{-3}).run(), Error);
  const Tensor i = Tensor::from_vector<int32_t>({2}, {1, 2});
  REQUIRE_THROWS_AS(OpTest("Softmax", 13).input(i).run(), Error);
}

// ---- normalisation ----

namespace {

// LayerNormalization / RMSNormalization reference; returns {Y, Mean, InvStdDev}.
std::vector<Tensor> naive_norm(const Tensor& x, const Tensor& scale, const Tensor* bias,
                               int64_t axis, double eps, bool rms) {
  const int64_t rank = static_cast<int64_t>(x.rank());
  if (axis < 0) axis += rank;
  int64_t rows = 1, n = 1;
  Shape stat_shape;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t dim = x.dim(static_cast<size_t>(d));
    (d < axis ? rows : n) *= dim;
    stat_shape.push_back(d < axis ? dim : 1);
  }
  const std::vector<double> xv = values_of(x);
  const std::vector<double> sv = values_of(scale);
  const std::vector<double> bv = bias ? values_of(*bias) : std::vector<double>{};
  // Scale and bias broadcast to X's full shape.
  auto param = [&](const std::vector<double>& p, const Tensor& t, int64_t flat) {
    const auto c = coords(x.shape(), flat);
    int64_t idx = 0;
    const size_t off = x.rank() - t.rank();
    for (size_t d = 0; d < t.rank(); ++d) idx = idx * t.dim(d) + (t.dim(d) == 1 ? 0 : c[off + d]);
    return p[static_cast<size_t>(idx)];
  };
  std::vector<double> y(xv.size()), mean(static_cast<size_t>(rows)), inv(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mu += xv[static_cast<size_t>(r * n + i)];
    mu /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = xv[static_cast<size_t>(r * n + i)];
      var += rms ? v * v : (v - mu) * (v - mu);
    }
    const double iv = 1 / std::sqrt(var / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t f = r * n + i;
      const double v = xv[static_cast<size_t>(f)];
      double out = (rms ? v : v - mu) * iv * param(sv, scale, f);
      if (bias) out += param(bv, *bias, f);
      y[static_cast<size_t>(f)] = out;
    }
    mean[static_cast<size_t>(r)] = mu;
    inv[static_cast<size_t>(r)] = iv;
  }
  return {make_tensor(x.dtype(), x.shape(), y), make_tensor(DataType::Float, stat_shape, mean),
          make_tensor(DataType::Float, stat_shape, inv)};
}

}  // namespace

TEST_CASE("LayerNormalization and RMSNormalization match a naive reference", "[reduce][norm]") {
  std::mt19937 rng(31);
  for (int iter = 0; iter < 40; ++iter) {
    const size_t rank = std::uniform_int_distribution<size_t>(1, 4)(rng);
    const Shape shape = random_shape(rank, iter < 30 ? 6 : (rank <= 2 ? 200 : 16), rng);
    const auto r = static_cast<int64_t>(rank);
    const int64_t axis = std::uniform_int_distribution<int64_t>(-r, r - 1)(rng);
    const int64_t a = axis < 0 ? axis + r : axis;
    // Scale/bias: the normalised shape, sometimes with leading 1s or broadcast dims.
    Shape pshape(shape.begin() + a, shape.end());
    if (iter % 3 == 1 && !pshape.empty()) pshape[0] = 1;
    if (iter % 5 == 2 && a > 0) pshape.insert(pshape.begin(), 1);
    const Tensor x = random_tensor(DataType::Float, shape, rng, -3, 3);
    const Tensor scale = random_tensor(DataType::Float, pshape, rng, 0.5, 1.5);
    const Tensor bias = random_tensor(DataType::Float, pshape, rng, -1, 1);
    const float eps = iter % 2 ? 1e-5f : 0.1f;
    INFO(shape_to_string(shape) << " axis " << axis << " scale " << shape_to_string(pshape));
    const bool with_bias = iter % 4 != 3;
    OpTest ln("LayerNormalization", 17);
    ln.input(x).input(scale);
    if (with_bias) ln.input(bias);
    const auto outs = ln.attr("axis", axis).attr("epsilon", eps).outputs(3).run();
    const auto expected = naive_norm(x, scale, with_bias ? &bias : nullptr, axis, eps, false);
    for (size_t k = 0; k < 3; ++k) require_close(outs[k].tensor(), expected[k], 1e-4, 1e-4);
    require_close(OpTest("RMSNormalization", 23)
                      .input(x)
                      .input(scale)
                      .attr("axis", axis)
                      .attr("epsilon", eps)
                      .run1(),
                  naive_norm(x, scale, nullptr, axis, eps, true)[0], 1e-4, 1e-4);
  }
}

TEST_CASE("LayerNormalization with half input and a per-row scale", "[reduce][norm]") {
  std::mt19937 rng(3);
  const Tensor xh = random_tensor(DataType::Float16, {3, 4, 32}, rng, -2, 2);
  const Tensor sh = random_tensor(DataType::Float16, {32}, rng, 0.5, 1.5);
  require_close(OpTest("LayerNormalization", 17).input(xh).input(sh).run1(),
                naive_norm(xh, sh, nullptr, -1, 1e-5, false)[0], 5e-3, 5e-3);
  // A scale that varies over a leading dim is applied per row.
  const Tensor x = random_tensor(DataType::Float, {3, 4, 8}, rng, -2, 2);
  const Tensor s = random_tensor(DataType::Float, {3, 1, 8}, rng, 0.5, 1.5);
  require_close(OpTest("LayerNormalization", 17).input(x).input(s).run1(),
                naive_norm(x, s, nullptr, -1, 1e-5, false)[0], 1e-4, 1e-4);
}

TEST_CASE("normalisation ops reject bad shapes and attributes", "[reduce][norm]") {
  const Tensor x = Tensor::from_vector<float>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor s3 = Tensor::from_vector<float>({3}, {1, 1, 1});
  REQUIRE_THROWS_AS(OpTest("LayerNormalization", 17).input(x).input(s3).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("LayerNormalization", 17).input(x).input(s3).attr("axis", int64_t{2}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("RMSNormalization", 23).input(x).input(s3).run(), Error);
  const Tensor x4 = Tensor::zeros(DataType::Float, {1, 6, 2});
  const Tensor s6 = Tensor::from_vector<float>({6}, std::vector<float>(6, 1));
  REQUIRE_THROWS_AS(OpTest("GroupNormalization", 21)
                        .input(x4)
                        .input(s6)
                        .input(s6)
                        .attr("num_groups", int64_t{4})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("GroupNormalization", 21)
                        .input(x4)
                        .input(s3)
                        .input(s3)
                        .attr("num_groups", int64_t{3})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("LpNormalization", 22).input(x).attr("p", int64_t{3}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("MeanVarianceNormalization", 13)
                        .input(x)
                        .attr("axes", std::vector<int64_t>{0, 0})
                        .run(),
                    Error);
}

TEST_CASE("GroupNormalization, MeanVarianceNormalization and LpNormalization", "[reduce][norm]") {
  std::mt19937 rng(17);
  // GroupNormalization: opset 21 has a scale per channel, opset 18 one per group.
  const Tensor x = random_tensor(DataType::Float, {2, 6, 5}, rng, -2, 2);
  const Tensor scale = random_tensor(DataType::Float, {6}, rng, 0.5, 1.5);
  const Tensor bias = random_tensor(DataType::Float, {6}, rng, -1, 1);
  const Tensor y = OpTest("GroupNormalization", 21)
                       .input(x)
                       .input(scale)
                       .input(bias)
                       .attr("num_groups", int64_t{3})
                       .run1();
  const std::vector<double> xv = values_of(x), sv = values_of(scale), bv = values_of(bias);
  const Tensor gscale = Tensor::from_vector<float>({3}, {0.5f, 2.0f, -1.0f});
  const Tensor gbias = Tensor::from_vector<float>({3}, {0.25f, 0.0f, 1.0f});
  const Tensor y18 = OpTest("GroupNormalization", 18)
                         .input(x)
                         .input(gscale)
                         .input(gbias)
                         .attr("num_groups", int64_t{3})
                         .run1();
  std::vector<double> expected(xv.size()), expected18(xv.size());
  for (int64_t blk = 0; blk < 6; ++blk) {  // (n, g) blocks of 2 channels x 5
    double mu = 0, var = 0;
    for (int64_t i = 0; i < 10; ++i) mu += xv[static_cast<size_t>(blk * 10 + i)] / 10;
    for (int64_t i = 0; i < 10; ++i) {
      const double d = xv[static_cast<size_t>(blk * 10 + i)] - mu;
      var += d * d / 10;
    }
    for (int64_t i = 0; i < 10; ++i) {
      const auto c = static_cast<size_t>((blk % 3) * 2 + i / 5);
      const auto f = static_cast<size_t>(blk * 10 + i);
      const double normalized = (xv[f] - mu) / std::sqrt(var + 1e-5);
      expected[f] = normalized * sv[c] + bv[c];
      const double gs[] = {0.5, 2.0, -1.0}, gb[] = {0.25, 0.0, 1.0};
      expected18[f] = normalized * gs[blk % 3] + gb[blk % 3];
    }
  }
  require_close(y, make_tensor(DataType::Float, x.shape(), expected), 1e-4, 1e-4);
  require_close(y18, make_tensor(DataType::Float, x.shape(), expected18), 1e-4, 1e-4);

  // MVN over axes {0, 2}: per-channel statistics.
  const Tensor m = OpTest("MeanVarianceNormalization", 13)
                       .input(x)
                       .attr("axes", std::vector<int64_t>{0, 2})
                       .run1();
  std::vector<double> mv(xv.size());
  for (int64_t c = 0; c < 6; ++c) {
    double mu = 0, sq = 0;
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t s = 0; s < 5; ++s) {
        const double v = xv[static_cast<size_t>((n * 6 + c) * 5 + s)];
        mu += v / 10;
        sq += v * v / 10;
      }
    }
    const double sd = std::sqrt(sq - mu * mu) + 1e-9;
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t s = 0; s < 5; ++s) {
        const auto f = static_cast<size_t>((n * 6 + c) * 5 + s);
        mv[f] = (xv[f] - mu) / sd;
      }
    }
  }
  require_close(m, make_tensor(DataType::Float, x.shape(), mv), 1e-4, 1e-4);

  // LpNormalization along axis 1 (strided) and the last axis, p = 1 and 2.
  for (int64_t p : {1, 2}) {
    for (int64_t axis : {1, 2}) {
      const Tensor l =
          OpTest("LpNormalization", 22).input(x).attr("axis", axis).attr("p", p).run1();
      std::vector<double> lv(xv.size());
      const int64_t n = x.dim(static_cast<size_t>(axis));
      const int64_t inner = axis == 1 ? 5 : 1;
      for (int64_t f = 0; f < x.numel(); ++f) {
        const int64_t o = f / (n * inner), j = f % inner;
        double norm = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double v = xv[static_cast<size_t>((o * n + i) * inner + j)];
          norm += p == 1 ? std::abs(v) : v * v;
        }
        if (p == 2) norm = std::sqrt(norm);
        lv[static_cast<size_t>(f)] = xv[static_cast<size_t>(f)] / norm;
      }
      INFO("p " << p << " axis " << axis);
      require_close(l, make_tensor(DataType::Float, x.shape(), lv), 1e-4, 1e-5);
    }
  }
}

// ---- losses ----

TEST_CASE("NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss", "[reduce][loss]") {
  std::mt19937 rng(13);
  const Tensor x = random_tensor(DataType::Float, {3, 4, 2}, rng, -2, 2);
  const Tensor target = Tensor::from_vector<int64_t>({3, 2}, {0, 3, 1, -1, 2, 2});
  const Tensor weight = Tensor::from_vector<float>({4}, {0.5f, 1.0f, 2.0f, 1.5f});
  const std::vector<double> xv = values_of(x);
  const std::vector<int64_t> tv = target.to_vector<int64_t>();
  const double wv[] = {0.5, 1.0, 2.0, 1.5};
  // Log-softmax over the class axis for SoftmaxCrossEntropyLoss.
  std::vector<double> lp(xv.size());
  for (int64_t n = 0; n < 3; ++n) {
    for (int64_t d = 0; d < 2; ++d) {
      double m = -1e30, s = 0;
      for (int64_t c = 0; c < 4; ++c) m = std::max(m, xv[static_cast<size_t>((n * 4 + c) * 2 + d)]);
      for (int64_t c = 0; c < 4; ++c)
        s += std::exp(xv[static_cast<size_t>((n * 4 + c) * 2 + d)] - m);
      for (int64_t c = 0; c < 4; ++c) {
        const auto f = static_cast<size_t>((n * 4 + c) * 2 + d);
        lp[f] = xv[f] - m - std::log(s);
      }
    }
  }
  for (bool softmax : {false, true}) {
    const std::vector<double>& in = softmax ? lp : xv;
    std::vector<double> none(6);
    double sum = 0, wsum = 0;
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t t = tv[static_cast<size_t>(i)];
      if (t == -1) continue;
      const double l = -wv[t] * in[static_cast<size_t>(((i / 2) * 4 + t) * 2 + i % 2)];
      none[static_cast<size_t>(i)] = l;
      sum += l;
      wsum += wv[t];
    }
    const char* op = softmax ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss";
    INFO(op);
    auto run = [&](const char* reduction) {
      return OpTest(op, 13)
          .input(x)
          .input(target)
          .input(weight)
          .attr("reduction", reduction)
          .attr("ignore_index", int64_t{-1})
          .outputs(softmax ? 2 : 1)
          .run();
    };
    require_close(run("none")[0].tensor(), make_tensor(DataType::Float, {3, 2}, none));
    require_close(run("sum")[0].tensor(), make_tensor(DataType::Float, {}, {sum}));
    const auto mean = run("mean");
    require_close(mean[0].tensor(), make_tensor(DataType::Float, {}, {sum / wsum}));
    if (softmax) require_close(mean[1].tensor(), make_tensor(DataType::Float, x.shape(), lp));
  }
}

TEST_CASE("losses reject out-of-range targets and bad attributes", "[reduce][loss]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 3});
  const Tensor bad = Tensor::from_vector<int64_t>({2}, {0, 3});
  const Tensor neg = Tensor::from_vector<int64_t>({2}, {-1, 0});
  for (const char* op : {"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"}) {
    INFO(op);
    REQUIRE_THROWS_AS(OpTest(op, 13).input(x).input(bad).run(), Error);
    REQUIRE_THROWS_AS(OpTest(op, 13).input(x).input(neg).run(), Error);
    CHECK_NOTHROW(OpTest(op, 13).input(x).input(neg).attr("ignore_index", int64_t{-1}).run());
    REQUIRE_THROWS_AS(OpTest(op, 13).input(x).input(neg).attr("reduction", "avg").run(), Error);
    const Tensor short_target = Tensor::from_vector<int64_t>({3}, {0, 0, 0});
    REQUIRE_THROWS_AS(OpTest(op, 13).input(x).input(short_target).run(), Error);
    const Tensor w2 = Tensor::from_vector<float>({2}, {1, 1});
    REQUIRE_THROWS_AS(OpTest(op, 13).input(x).input(neg).input(w2).run(), Error);
  }
}
