// Shape and data-movement ops against naive index-by-index references, over random shapes
// and random input layouts (windows of larger buffers with permuted storage order).
#include <algorithm>
#include <limits>
#include <numeric>

#include "ops/core/kernel.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

Shape coords_of(const Shape& shape, int64_t flat) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

int64_t flat_of(const Shape& shape, const Shape& c) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + c[d];
  return f;
}

Tensor ints(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from_vector<int64_t>({n}, v);
}

int64_t rand_int(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// The values of `x` in a non-contiguous layout: a window of a larger buffer whose dims are
// stored in a random order.
Tensor strided_like(const Tensor& x, std::mt19937& rng) {
  const size_t r = x.rank();
  if (r == 0) return x;
  std::vector<size_t> order(r);
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  Shape padded(r), strides(r);
  for (size_t d = 0; d < r; ++d) padded[d] = x.dim(d) + rand_int(rng, 0, 2);
  int64_t s = 1;
  for (size_t k = r; k-- > 0;) {
    strides[order[k]] = s;
    s *= std::max<int64_t>(padded[order[k]], 1);
  }
  int64_t offset = 0;
  for (size_t d = 0; d < r; ++d) offset += (padded[d] - x.dim(d)) / 2 * strides[d];
  Tensor base = Tensor::zeros(x.dtype(), {s});
  const auto es = static_cast<size_t>(bits_per_element(x.dtype()) / 8);
  Tensor v = base.view(x.shape(), strides, static_cast<size_t>(offset) * es);
  copy_elements(x, v);
  return v;
}

// Either `x` or the same values in a strided layout.
Tensor maybe_strided(const Tensor& x, std::mt19937& rng) {
  return rng() % 2 ? strided_like(x, rng) : x;
}

// out[i] = x[source(coords of i)] (or `fill` where source returns a negative index).
template <typename F>
Tensor naive_gather(const Tensor& x, const Shape& out_shape, F source, float fill = 0) {
  const std::vector<float> xv = x.to_vector<float>();
  Tensor y = Tensor::zeros(DataType::Float, out_shape);
  for (int64_t i = 0; i < y.numel(); ++i) {
    const int64_t s = source(coords_of(out_shape, i));
    y.data<float>()[i] = s < 0 ? fill : xv[static_cast<size_t>(s)];
  }
  return y;
}

void require_same(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.shape() == expected.shape());
  require_close(actual, expected, 0, 0);
}

}  // namespace

TEST_CASE("Transpose is a view matching a naive permutation for any layout", "[shape]") {
  std::mt19937 rng(1);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 0, 5));
    const Tensor base = random_tensor(DataType::Float, random_shape(rank, 4, rng), rng);
    const Tensor x = maybe_strided(base, rng);
    std::vector<int64_t> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    OpTest t("Transpose", 13);
    t.input(x);
    if (rank > 0) t.attr("perm", perm);
    const Tensor y = t.run1();
    Shape out_shape(rank);
    for (size_t d = 0; d < rank; ++d) out_shape[d] = x.dim(static_cast<size_t>(perm[d]));
    INFO(x.describe() << " perm " << shape_to_string(perm));
    require_same(y, naive_gather(x, out_shape, [&](const Shape& c) {
                   Shape in(rank);
                   for (size_t d = 0; d < rank; ++d) in[static_cast<size_t>(perm[d])] = c[d];
                   return flat_of(x.shape(), in);
                 }));
    CHECK(y.storage() == x.storage());
    CHECK(t.stats().bytes_copied == 0);
  }
  // Default perm reverses the dims.
  const Tensor x = random_tensor(DataType::Float, {2, 3, 4}, rng);
  CHECK(OpTest("Transpose", 1).input(x).run1().shape() == Shape{4, 3, 2});
}

TEST_CASE("Transpose rejects a bad perm", "[shape]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 3});
  REQUIRE_THROWS_AS(OpTest("Transpose", 13).input(x).attr("perm", std::vector<int64_t>{0, 0}).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Transpose", 13).input(x).attr("perm", std::vector<int64_t>{0, 2}).run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("Transpose", 13).input(x).attr("perm", std::vector<int64_t>{0, 1, 2}).run(), Error);
}

namespace {

// The indices ONNX's Slice picks along one axis, enumerated one by one.
std::vector<int64_t> onnx_slice(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  std::vector<int64_t> idx;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    for (int64_t i = start; i < end; i += std::min(step, dim)) idx.push_back(i);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    for (int64_t i = start; i > end; i -= std::min(-(step + 1), dim - 1) + 1) idx.push_back(i);
  }
  return idx;
}

}  // namespace

TEST_CASE("Slice matches a naive reference for any steps, clamping and layout", "[shape]") {
  std::mt19937 rng(2);
  const int64_t big = std::numeric_limits<int64_t>::max(),
                small = std::numeric_limits<int64_t>::min();
  for (int iter = 0; iter < 150; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 4));
    const Tensor base = random_tensor(DataType::Float, random_shape(rank, 6, rng), rng);
    const Tensor x = maybe_strided(base, rng);
    std::vector<int64_t> axes, starts, ends, steps;
    std::vector<std::vector<int64_t>> picked(rank);
    for (size_t d = 0; d < rank; ++d) {
      std::vector<int64_t> all(static_cast<size_t>(x.dim(d)));
      std::iota(all.begin(), all.end(), 0);
      picked[d] = all;
      if (rng() % 3 == 0) continue;
      const int64_t dim = x.dim(d);
      int64_t step = rand_int(rng, 1, 3) * (rng() % 2 ? 1 : -1);
      int64_t start = rand_int(rng, -dim - 2, dim + 2), end = rand_int(rng, -dim - 2, dim + 2);
      if (rng() % 5 == 0) end = step > 0 ? big : small;
      if (rng() % 7 == 0) step = step > 0 ? big : small;
      axes.push_back(rng() % 2 ? static_cast<int64_t>(d)
                               : static_cast<int64_t>(d) - static_cast<int64_t>(rank));
      starts.push_back(start);
      ends.push_back(end);
      steps.push_back(step);
      picked[d] = onnx_slice(dim, start, end, step);
    }
    Shape out_shape(rank);
    for (size_t d = 0; d < rank; ++d) out_shape[d] = static_cast<int64_t>(picked[d].size());
    const Tensor expected = naive_gather(x, out_shape, [&](const Shape& c) {
      Shape in(rank);
      for (size_t d = 0; d < rank; ++d) in[d] = picked[d][static_cast<size_t>(c[d])];
      return flat_of(x.shape(), in);
    });
    INFO(x.describe() << " axes " << shape_to_string(axes) << " starts " << shape_to_string(starts)
                      << " ends " << shape_to_string(ends) << " steps " << shape_to_string(steps));
    OpTest t("Slice", 13);
    t.input(x).input(ints(starts)).input(ints(ends)).input(ints(axes)).input(ints(steps));
    const Tensor y = t.run1();
    require_same(y, expected);
    const bool backwards = std::any_of(steps.begin(), steps.end(), [](int64_t s) { return s < 0; });
    if (!backwards) {
      CHECK(y.storage() == x.storage());
      CHECK(t.stats().bytes_copied == 0);
    }
  }
}

TEST_CASE("Slice reads attributes before opset 10 and defaults axes and steps", "[shape]") {
  const Tensor x = Tensor::from_vector<float>({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor y = OpTest("Slice", 9)
                       .input(x)
                       .attr("starts", std::vector<int64_t>{1})
                       .attr("ends", std::vector<int64_t>{3})
                       .attr("axes", std::vector<int64_t>{1})
                       .run1();
  CHECK(y.to_vector<float>() == std::vector<float>{1, 2, 5, 6});
  const Tensor z = OpTest("Slice", 13).input(x).input(ints({1, -3})).input(ints({2, 100})).run1();
  CHECK(z.shape() == Shape{1, 3});
  CHECK(z.to_vector<float>() == std::vector<float>{5, 6, 7});
}

TEST_CASE("Slice rejects zero steps, repeated and out-of-range axes", "[shape]") {
  const Tensor x = Tensor::zeros(DataType::Float, {3, 4});
  auto run = [&](std::vector<int64_t> axes, std::vector<int64_t> steps) {
    return OpTest("Slice", 13)
        .input(x)
        .input(ints(std::vector<int64_t>(axes.size(), 0)))
        .input(ints(std::vector<int64_t>(axes.size(), 2)))
        .input(ints(axes))
        .input(ints(steps))
        .run();
  };
  REQUIRE_THROWS_AS(run({0}, {0}), Error);
  REQUIRE_THROWS_AS(run({2}, {1}), Error);
  REQUIRE_THROWS_AS(run({0, -2}, {1, 1}), Error);
  REQUIRE_THROWS_AS(run({0, 1}, {1}), Error);
}

namespace {

int64_t pad_source(const std::string& mode, int64_t i, int64_t dim) {
  if (mode == "constant") return i >= 0 && i < dim ? i : -1;
  if (mode == "edge") return std::clamp<int64_t>(i, 0, dim - 1);
  if (mode == "wrap") return ((i % dim) + dim) % dim;
  if (dim == 1) return 0;
  while (i < 0 || i >= dim) i = i < 0 ? -i : 2 * (dim - 1) - i;  // reflect, bouncing
  return i;
}

}  // namespace

TEST_CASE("Pad matches a naive reference in every mode and layout", "[shape]") {
  std::mt19937 rng(3);
  const char* modes[] = {"constant", "reflect", "edge", "wrap"};
  for (int iter = 0; iter < 120; ++iter) {
    const std::string mode = modes[iter % 4];
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 3));
    const Tensor base = random_tensor(DataType::Float, random_shape(rank, 4, rng), rng);
    const Tensor x = maybe_strided(base, rng);
    // Opset 18+ may name a subset of axes; others pad all.
    const int opset = iter % 3 == 0 ? 11 : (iter % 3 == 1 ? 19 : 2);
    if (mode == "wrap" && opset < 19) continue;
    std::vector<int64_t> axes;
    for (size_t d = 0; d < rank; ++d) {
      if (opset < 18 || rng() % 3 != 0) axes.push_back(static_cast<int64_t>(d));
    }
    Shape begin(rank, 0), end(rank, 0);
    std::vector<int64_t> pads(2 * axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t dim = x.dim(static_cast<size_t>(axes[i]));
      const int64_t lo = mode == "constant" ? -dim / 2 : 0;
      pads[i] = begin[static_cast<size_t>(axes[i])] = rand_int(rng, lo, 5);
      pads[i + axes.size()] = end[static_cast<size_t>(axes[i])] = rand_int(rng, lo, 5);
    }
    Shape out_shape(rank);
    for (size_t d = 0; d < rank; ++d) out_shape[d] = x.dim(d) + begin[d] + end[d];
    const float value = 2.5f;
    const Tensor expected = naive_gather(
        x, out_shape,
        [&](const Shape& c) {
          Shape in(rank);
          for (size_t d = 0; d < rank; ++d) {
            in[d] = pad_source(mode, c[d] - begin[d], x.dim(d));
            if (in[d] < 0) return int64_t{-1};
          }
          return flat_of(x.shape(), in);
        },
        value);
    INFO(mode << " opset " << opset << " " << x.describe() << " pads " << shape_to_string(pads)
              << " axes " << shape_to_string(axes));
    OpTest t("Pad", opset);
    t.input(x).attr("mode", mode);
    if (opset < 11) {
      t.attr("pads", pads).attr("value", value);
    } else {
      t.input(ints(pads)).input(Tensor::scalar<float>(value));
      if (opset >= 18) t.input(ints(axes));
    }
    require_same(t.run1(), expected);
  }
}

TEST_CASE("Pad handles ints, strings and bad arguments", "[shape]") {
  const Tensor x = Tensor::from_vector<int64_t>({3}, {1, 2, 3});
  CHECK(OpTest("Pad", 13).input(x).input(ints({1, 2})).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 2, 3, 0, 0});
  CHECK(OpTest("Pad", 13)
            .input(x)
            .input(ints({2, 2}))
            .attr("mode", "reflect")
            .run1()
            .to_vector<int64_t>() == std::vector<int64_t>{3, 2, 1, 2, 3, 2, 1});
  const Tensor s = Tensor::from_vector<std::string>({2}, {"a", "b"});
  CHECK(OpTest("Pad", 13)
            .input(s)
            .input(ints({1, 1}))
            .input(Tensor::scalar<std::string>("z"))
            .run1()
            .to_vector<std::string>() == std::vector<std::string>{"z", "a", "b", "z"});
  REQUIRE_THROWS_AS(OpTest("Pad", 13).input(x).input(ints({1, 2})).attr("mode", "mirror").run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Pad", 13).input(x).input(ints({1, 2, 3})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Pad", 13).input(x).input(ints({-4, 0})).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("Pad", 18).input(x).input(ints({1, 1})).no_input().input(ints({1})).run(), Error);
  const Tensor empty = Tensor::zeros(DataType::Float, {0});
  REQUIRE_THROWS_AS(OpTest("Pad", 13).input(empty).input(ints({1, 1})).attr("mode", "edge").run(),
                    Error);
}

TEST_CASE("Concat matches a naive reference for any axis and input layout", "[shape]") {
  std::mt19937 rng(4);
  for (int iter = 0; iter < 80; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 4));
    const Shape shape = random_shape(rank, 4, rng);
    const auto axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    const int n = static_cast<int>(rand_int(rng, 1, 4));
    std::vector<Tensor> xs;
    Shape out_shape = shape;
    out_shape[axis] = 0;
    OpTest t("Concat", 13);
    for (int i = 0; i < n; ++i) {
      Shape s = shape;
      s[axis] = rand_int(rng, 0, 3);
      out_shape[axis] += s[axis];
      xs.push_back(maybe_strided(random_tensor(DataType::Float, s, rng), rng));
      t.input(xs.back());
    }
    t.attr("axis", rng() % 2 ? static_cast<int64_t>(axis)
                             : static_cast<int64_t>(axis) - static_cast<int64_t>(rank));
    Tensor expected = Tensor::zeros(DataType::Float, out_shape);
    for (int64_t i = 0; i < expected.numel(); ++i) {
      Shape c = coords_of(out_shape, i);
      size_t k = 0;
      while (c[axis] >= xs[k].dim(axis)) c[axis] -= xs[k++].dim(axis);
      expected.data<float>()[i] = static_cast<float>(element(xs[k], flat_of(xs[k].shape(), c)));
    }
    INFO("axis " << axis << " out " << shape_to_string(out_shape));
    require_same(t.run1(), expected);
    CHECK(t.stats().bytes_copied_concat == static_cast<uint64_t>(expected.nbytes()));
  }
}

TEST_CASE("Concat rejects mismatched inputs and bad axes", "[shape]") {
  const Tensor a = Tensor::zeros(DataType::Float, {2, 3});
  const Tensor b = Tensor::zeros(DataType::Float, {3, 3});
  CHECK(OpTest("Concat", 13).input(a).input(b).attr("axis", 0).run1().shape() == Shape{5, 3});
  REQUIRE_THROWS_AS(OpTest("Concat", 13).input(a).input(b).attr("axis", 1).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Concat", 13).input(a).input(b).attr("axis", 2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Concat", 13)
                        .input(a)
                        .input(Tensor::zeros(DataType::Int64, {2, 3}))
                        .attr("axis", 0)
                        .run(),
                    Error);
  const Tensor s1 = Tensor::from_vector<std::string>({1}, {"x"});
  const Tensor s2 = Tensor::from_vector<std::string>({2}, {"y", "z"});
  CHECK(OpTest("Concat", 13).input(s1).input(s2).attr("axis", 0).run1().to_vector<std::string>() ==
        std::vector<std::string>{"x", "y", "z"});
}

TEST_CASE("Split matches a naive reference in every form", "[shape]") {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 80; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 3));
    const Tensor base = random_tensor(DataType::Float, random_shape(rank, 7, rng), rng);
    const Tensor x = maybe_strided(base, rng);
    const auto axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    const int64_t dim = x.dim(axis);
    const int form = iter % 4;  // split input, split attribute, num_outputs, equal parts
    std::vector<int64_t> sizes;
    if (form < 2) {
      int64_t left = dim;
      while (left > 0 || sizes.empty()) {
        const int64_t s = rand_int(rng, 0, left);
        sizes.push_back(s);
        left -= s;
        if (sizes.size() == 4) {
          sizes.back() += left;
          left = 0;
        }
      }
    } else {
      const int64_t n = rand_int(rng, 1, dim);
      const int64_t part = (dim + n - 1) / n;
      sizes.assign(static_cast<size_t>(n), part);
      sizes.back() = dim - part * (n - 1);
      if (sizes.back() < 0) continue;
    }
    OpTest t("Split", form == 1 ? 11 : (form == 3 ? 13 : 18));
    t.input(x).attr("axis", static_cast<int64_t>(axis)).outputs(sizes.size());
    if (form == 0) {
      if (rng() % 2) {
        t.input(ints(sizes));
      } else {
        t.constant_input(ints(sizes));
      }
    }
    if (form == 1) t.attr("split", sizes);
    if (form == 2) t.attr("num_outputs", static_cast<int64_t>(sizes.size()));
    INFO("form " << form << " " << x.describe() << " axis " << axis << " sizes "
                 << shape_to_string(sizes));
    const std::vector<Value> outs = t.run();
    REQUIRE(outs.size() == sizes.size());
    int64_t offset = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      Shape s = x.shape();
      s[axis] = sizes[k];
      require_same(outs[k].tensor(), naive_gather(x, s, [&](Shape c) {
                     c[axis] += offset;
                     return flat_of(x.shape(), c);
                   }));
      offset += sizes[k];
    }
  }
}

TEST_CASE("Split rejects sizes that do not add up", "[shape]") {
  const Tensor x = Tensor::zeros(DataType::Float, {6});
  REQUIRE_THROWS_AS(OpTest("Split", 13).input(x).input(ints({2, 3})).outputs(2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Split", 13).input(x).input(ints({7, -1})).outputs(2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Split", 13).input(x).input(ints({6})).outputs(2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Split", 18).input(x).attr("num_outputs", 3).outputs(2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Split", 13).input(x).attr("axis", 1).outputs(2).run(), Error);
  // 6 in 4 parts: ceil gives 2, 2, 2, 0.
  const auto outs = OpTest("Split", 18).input(x).attr("num_outputs", 4).outputs(4).run();
  CHECK(outs[3].tensor().shape() == Shape{0});
}

TEST_CASE("Reshape, Flatten, Squeeze and Unsqueeze are views of the input", "[shape]") {
  std::mt19937 rng(6);
  const Tensor x = random_tensor(DataType::Float, {2, 1, 3, 4}, rng);
  auto same_values = [&](const Tensor& y, const Shape& shape) {
    CHECK(y.shape() == shape);
    CHECK(y.storage() == x.storage());
    CHECK(y.to_vector<float>() == x.to_vector<float>());
  };
  same_values(OpTest("Reshape", 14).input(x).input(ints({0, -1, 4})).run1(), {2, 3, 4});
  same_values(OpTest("Reshape", 5).input(x).input(ints({24})).run1(), {24});
  same_values(OpTest("Flatten", 13).input(x).attr("axis", 2).run1(), {2, 12});
  same_values(OpTest("Flatten", 13).input(x).attr("axis", -4).run1(), {1, 24});
  same_values(OpTest("Flatten", 9).input(x).attr("axis", 4).run1(), {24, 1});
  same_values(OpTest("Squeeze", 13).input(x).run1(), {2, 3, 4});
  same_values(OpTest("Squeeze", 13).input(x).input(ints({-3})).run1(), {2, 3, 4});
  same_values(OpTest("Squeeze", 11).input(x).attr("axes", std::vector<int64_t>{1}).run1(),
              {2, 3, 4});
  same_values(OpTest("Unsqueeze", 13).input(x).input(ints({0, -1})).run1(), {1, 2, 1, 3, 4, 1});
  same_values(OpTest("Unsqueeze", 11).input(x).attr("axes", std::vector<int64_t>{2}).run1(),
              {2, 1, 1, 3, 4});

  // allowzero keeps a literal 0.
  const Tensor empty = Tensor::zeros(DataType::Float, {0, 3});
  CHECK(
      OpTest("Reshape", 14).input(empty).input(ints({3, 0})).attr("allowzero", 1).run1().shape() ==
      Shape{3, 0});

  // Squeeze and Unsqueeze keep a strided input's layout.
  const Tensor xs = strided_like(x, rng);
  OpTest sq("Squeeze", 13);
  const Tensor y = sq.input(xs).input(ints({1})).run1();
  CHECK(y.storage() == xs.storage());
  CHECK(y.to_vector<float>() == x.to_vector<float>());
  CHECK(sq.stats().bytes_copied == 0);
}

TEST_CASE("Reshape and friends reject bad shapes and axes", "[shape]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 1, 3});
  REQUIRE_THROWS_AS(OpTest("Reshape", 14).input(x).input(ints({4, 2})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Reshape", 14).input(x).input(ints({-1, -1})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Reshape", 14).input(x).input(ints({-2, 3})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Reshape", 14).input(x).input(ints({0, 0, 0, 0})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Reshape", 14).input(x).input(ints({0, -1})).attr("allowzero", 1).run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("Reshape", 14).input(x).input(ints({std::numeric_limits<int64_t>::max(), 4, 0})).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("Flatten", 13).input(x).attr("axis", 4).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Squeeze", 13).input(x).input(ints({0})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Squeeze", 13).input(x).input(ints({3})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Unsqueeze", 13).input(x).input(ints({5})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Unsqueeze", 13).input(x).input(ints({1, 1})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Unsqueeze", 13).input(x).run(), Error);
}

TEST_CASE("Shape, Size and Identity", "[shape]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 3, 4, 5});
  CHECK(OpTest("Shape", 13).input(x).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{2, 3, 4, 5});
  CHECK(
      OpTest("Shape", 15).input(x).attr("start", -3).attr("end", -1).run1().to_vector<int64_t>() ==
      std::vector<int64_t>{3, 4});
  CHECK(OpTest("Shape", 15).input(x).attr("start", 3).attr("end", 1).run1().numel() == 0);
  CHECK(OpTest("Shape", 15).input(x).attr("start", -10).attr("end", 10).run1().numel() == 4);
  const Tensor n = OpTest("Size", 13).input(x).run1();
  CHECK(n.rank() == 0);
  CHECK(n.to_vector<int64_t>() == std::vector<int64_t>{120});

  const Value seq = Value::sequence(DataType::Float, {x, x});
  const Value out = OpTest("Identity", 16).input(seq).run().at(0);
  REQUIRE(out.is_sequence());
  CHECK(out.items().size() == 2);
  CHECK(out.items()[0].storage() == x.storage());
}

TEST_CASE("Expand is a stride-0 view and Tile matches a naive reference", "[shape]") {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 40; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 0, 3));
    Shape in_shape = random_shape(rank, 3, rng);
    for (auto& d : in_shape) {
      if (rng() % 2) d = 1;
    }
    const Tensor x = maybe_strided(random_tensor(DataType::Float, in_shape, rng), rng);
    // Expand: the target may have more dims and may itself hold 1s.
    const size_t extra = static_cast<size_t>(rand_int(rng, 0, 2));
    Shape target(extra, 2);
    for (int64_t d : in_shape) target.push_back(d == 1 ? rand_int(rng, 1, 3) : (rng() % 2 ? d : 1));
    Shape out_shape(target.size());
    for (size_t d = 0; d < target.size(); ++d) {
      out_shape[d] = d < extra ? target[d] : std::max(target[d], in_shape[d - extra]);
    }
    OpTest e("Expand", 13);
    const Tensor y = e.input(x).input(ints(target)).run1();
    INFO(x.describe() << " to " << shape_to_string(target));
    require_same(y, naive_gather(x, out_shape, [&](const Shape& c) {
                   Shape in(rank);
                   for (size_t d = 0; d < rank; ++d) in[d] = in_shape[d] == 1 ? 0 : c[d + extra];
                   return flat_of(in_shape, in);
                 }));
    CHECK(y.storage() == x.storage());
    CHECK(e.stats().bytes_copied == 0);

    std::vector<int64_t> repeats(rank);
    for (auto& r : repeats) r = rand_int(rng, 0, 3);
    Shape tiled(rank);
    for (size_t d = 0; d < rank; ++d) tiled[d] = in_shape[d] * repeats[d];
    require_same(OpTest("Tile", 13).input(x).input(ints(repeats)).run1(),
                 naive_gather(x, tiled, [&](const Shape& c) {
                   Shape in(rank);
                   for (size_t d = 0; d < rank; ++d) in[d] = c[d] % in_shape[d];
                   return flat_of(in_shape, in);
                 }));
  }
  const Tensor x = Tensor::zeros(DataType::Float, {2, 3});
  REQUIRE_THROWS_AS(OpTest("Expand", 13).input(x).input(ints({4, 3})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Expand", 13).input(x).input(ints({-1, 3})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Tile", 13).input(x).input(ints({2})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Tile", 13).input(x).input(ints({1, -1})).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("Tile", 13).input(x).input(ints({int64_t{1} << 40, int64_t{1} << 40})).run(), Error);
}

TEST_CASE("DepthToSpace and SpaceToDepth follow the numpy formulas", "[shape]") {
  std::mt19937 rng(8);
  for (int iter = 0; iter < 24; ++iter) {
    const int64_t b = rand_int(rng, 1, 3), n = rand_int(rng, 1, 2), c = rand_int(rng, 1, 3),
                  h = rand_int(rng, 1, 3), w = rand_int(rng, 1, 3);
    const bool crd = iter % 2 == 1;
    // DepthToSpace: x [n, c*b*b, h, w] -> y [n, c, h*b, w*b].
    const Tensor x = maybe_strided(random_tensor(DataType::Float, {n, c * b * b, h, w}, rng), rng);
    const Tensor y = OpTest("DepthToSpace", 13)
                         .input(x)
                         .attr("blocksize", b)
                         .attr("mode", crd ? "CRD" : "DCR")
                         .run1();
    require_same(y, naive_gather(x, {n, c, h * b, w * b}, [&](const Shape& o) {
                   const int64_t bh = o[2] % b, bw = o[3] % b;
                   const int64_t ch = crd ? o[1] * b * b + bh * b + bw : (bh * b + bw) * c + o[1];
                   return flat_of(x.shape(), {o[0], ch, o[2] / b, o[3] / b});
                 }));
    // SpaceToDepth inverts DCR DepthToSpace (and CRD from opset 28).
    const Tensor back = OpTest("SpaceToDepth", crd ? 28 : 13)
                            .input(maybe_strided(y, rng))
                            .attr("blocksize", b)
                            .attr("mode", crd ? "CRD" : "DCR")
                            .run1();
    require_same(back, x.contiguous());
  }
  const Tensor x = Tensor::zeros(DataType::Float, {1, 3, 2, 2});
  REQUIRE_THROWS_AS(OpTest("DepthToSpace", 13).input(x).attr("blocksize", 2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("DepthToSpace", 13).input(x).attr("blocksize", 0).run(), Error);
  REQUIRE_THROWS_AS(OpTest("SpaceToDepth", 13).input(x).attr("blocksize", 3).run(), Error);
  REQUIRE_THROWS_AS(OpTest("SpaceToDepth", 13)
                        .input(Tensor::zeros(DataType::Float, {2, 2}))
                        .attr("blocksize", 1)
                        .run(),
                    Error);
}

TEST_CASE("Trilu keeps the requested triangle", "[shape]") {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 30; ++iter) {
    const Shape shape{rand_int(rng, 1, 2), rand_int(rng, 1, 5), rand_int(rng, 1, 5)};
    const Tensor x = random_tensor(DataType::Float, shape, rng, 1, 2);
    const int64_t k = rand_int(rng, -6, 6);
    const bool upper = rng() % 2;
    const Tensor y =
        OpTest("Trilu", 14).input(x).input(ints({k})).attr("upper", upper ? 1 : 0).run1();
    require_same(y, naive_gather(x, shape, [&](const Shape& c) {
                   const bool keep = upper ? c[2] - c[1] >= k : c[2] - c[1] <= k;
                   return keep ? flat_of(shape, c) : int64_t{-1};
                 }));
  }
  const Tensor m = Tensor::from_vector<int32_t>({2, 2}, {1, 2, 3, 4});
  CHECK(OpTest("Trilu", 14).input(m).run1().to_vector<int32_t>() ==
        std::vector<int32_t>{1, 2, 0, 4});
  CHECK(OpTest("Trilu", 14)
            .input(m)
            .input(ints({std::numeric_limits<int64_t>::min()}))
            .run1()
            .to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 4});
  REQUIRE_THROWS_AS(OpTest("Trilu", 14).input(Tensor::zeros(DataType::Float, {3})).run(), Error);
}

TEST_CASE("CenterCropPad crops and pads around the centre", "[shape]") {
  const Tensor x = Tensor::from_vector<float>({5}, {1, 2, 3, 4, 5});
  CHECK(OpTest("CenterCropPad", 18).input(x).input(ints({2})).run1().to_vector<float>() ==
        std::vector<float>{2, 3});
  CHECK(OpTest("CenterCropPad", 18).input(x).input(ints({8})).run1().to_vector<float>() ==
        std::vector<float>{0, 1, 2, 3, 4, 5, 0, 0});
  const Tensor m = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(OpTest("CenterCropPad", 18)
            .input(m)
            .input(ints({1}))
            .attr("axes", std::vector<int64_t>{-1})
            .run1()
            .to_vector<float>() == std::vector<float>{2, 5});
  REQUIRE_THROWS_AS(OpTest("CenterCropPad", 18).input(x).input(ints({-1})).run(), Error);
  REQUIRE_THROWS_AS(OpTest("CenterCropPad", 18).input(x).input(ints({1, 1})).run(), Error);
}

TEST_CASE("ConstantOfShape, Range and EyeLike", "[shape]") {
  const Tensor v = Tensor::from_vector<int32_t>({1}, {7});
  const Tensor c = OpTest("ConstantOfShape", 20).input(ints({2, 2})).attr("value", v).run1();
  CHECK(c.to_vector<int32_t>() == std::vector<int32_t>{7, 7, 7, 7});
  CHECK(OpTest("ConstantOfShape", 9).input(ints({})).run1().to_vector<float>() ==
        std::vector<float>{0});
  REQUIRE_THROWS_AS(OpTest("ConstantOfShape", 9).input(ints({-1})).run(), Error);

  CHECK(OpTest("Range", 11)
            .input(Tensor::scalar<int32_t>(10))
            .input(Tensor::scalar<int32_t>(4))
            .input(Tensor::scalar<int32_t>(-2))
            .run1()
            .to_vector<int32_t>() == std::vector<int32_t>{10, 8, 6});
  CHECK(OpTest("Range", 11)
            .input(Tensor::scalar<float>(0))
            .input(Tensor::scalar<float>(1))
            .input(Tensor::scalar<float>(0.25f))
            .run1()
            .to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
  CHECK(OpTest("Range", 11)
            .input(Tensor::scalar<int64_t>(std::numeric_limits<int64_t>::min()))
            .input(Tensor::scalar<int64_t>(std::numeric_limits<int64_t>::max()))
            .input(Tensor::scalar<int64_t>(std::numeric_limits<int64_t>::max()))
            .run1()
            .numel() == 3);
  REQUIRE_THROWS_AS(OpTest("Range", 11)
                        .input(Tensor::scalar<int64_t>(0))
                        .input(Tensor::scalar<int64_t>(5))
                        .input(Tensor::scalar<int64_t>(0))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Range", 11)
                        .input(Tensor::scalar<int64_t>(0))
                        .input(Tensor::scalar<int64_t>(std::numeric_limits<int64_t>::max()))
                        .input(Tensor::scalar<int64_t>(1))
                        .run(),
                    Error);

  const Tensor x = Tensor::zeros(DataType::Int32, {2, 3});
  CHECK(OpTest("EyeLike", 9).input(x).attr("k", 1).run1().to_vector<int32_t>() ==
        std::vector<int32_t>{0, 1, 0, 0, 0, 1});
  const Tensor e = OpTest("EyeLike", 22).input(x).attr("dtype", 9).attr("k", -1).run1();
  CHECK(e.dtype() == DataType::Bool);
  CHECK(e.to_vector<bool>() == std::vector<bool>{false, false, false, true, false, false});
}

namespace {

class PlainHooks final : public ops::ExecutionHooks {
 public:
  Tensor allocate(DataType dtype, const Shape& shape) override {
    return Tensor::zeros(dtype, shape);
  }
  bool can_overwrite(size_t) override { return false; }
  Value take_input(size_t) override { return {}; }
  void count_copy(uint64_t, ops::CopyCause) override {}
  void count_in_place() override {}
  std::vector<Value> run_subgraph(int, std::vector<Value>, ops::CaptureMode) override { return {}; }
};

// Runs the Constant kernel itself: sessions fold Constant nodes before any kernel exists.
Tensor run_constant_kernel(const ir::Attribute& attr) {
  ir::Graph g;
  ir::Node node;
  node.op_type = "Constant";
  node.opset = 13;
  node.outputs.push_back(g.add_value("y", ir::ValueOrigin::NodeOutput));
  node.attributes.push_back(attr);
  const ops::OpRegistration* reg = ops::find_op("", "Constant", 13);
  REQUIRE(reg != nullptr);
  const ops::NodeInfo info(g, node, *reg);
  auto kernel = reg->create(info);
  std::vector<const Value*> inputs;
  std::vector<Value> outputs(1);
  PlainHooks hooks;
  ops::OpContext ctx(node, inputs, outputs, hooks);
  kernel->run(ctx);
  return outputs[0].tensor();
}

}  // namespace

TEST_CASE("The Constant kernel produces its attribute", "[shape]") {
  CHECK(run_constant_kernel(float_attr("value_float", 1.5f)).to_vector<float>() ==
        std::vector<float>{1.5f});
  CHECK(run_constant_kernel(ints_attr("value_ints", {1, 2})).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 2});
  const Tensor t =
      run_constant_kernel(tensor_attr("value", Tensor::from_vector<float>({2}, {3, 4})));
  CHECK(t.to_vector<float>() == std::vector<float>{3, 4});
  CHECK_FALSE(t.storage()->writable());
  REQUIRE_THROWS_AS(run_constant_kernel(int_attr("not_a_value", 1)), Error);
  // Through a session the node is folded and its value reaches the output all the same.
  CHECK(OpTest("Constant", 13).attr("value_int", int64_t{5}).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{5});
}

TEST_CASE("Dropout passes through in inference and is seeded in training", "[shape]") {
  std::mt19937 rng(10);
  const Tensor x = random_tensor(DataType::Float, {4, 50}, rng, 1, 2);
  // Inference: the output is the input itself, the mask all true.
  auto outs = OpTest("Dropout", 13).input(x).outputs(2).run();
  CHECK(outs[0].tensor().storage() == x.storage());
  const auto all_true = outs[1].tensor().to_vector<bool>();
  CHECK(std::all_of(all_true.begin(), all_true.end(), [](bool b) { return b; }));
  // Before opset 10 the mask has the input's type.
  CHECK(OpTest("Dropout", 7).input(x).outputs(2).run()[1].tensor().dtype() == DataType::Float);

  auto train = [&](int64_t seed) {
    return OpTest("Dropout", 13)
        .input(x)
        .input(Tensor::scalar<float>(0.75f))
        .input(Tensor::scalar<bool>(true))
        .attr("seed", seed)
        .outputs(2)
        .run();
  };
  const auto a = train(3), b = train(3), c = train(4);
  const auto ya = a[0].tensor().to_vector<float>(), xv = x.to_vector<float>();
  const auto ma = a[1].tensor().to_vector<bool>();
  CHECK(ya == b[0].tensor().to_vector<float>());
  CHECK(ya != c[0].tensor().to_vector<float>());
  size_t kept = 0;
  for (size_t i = 0; i < ya.size(); ++i) {
    REQUIRE(ya[i] == (ma[i] ? xv[i] * 4.0f : 0.0f));
    kept += ma[i];
  }
  CHECK(kept > 20);  // about a quarter of 200
  CHECK(kept < 80);
  REQUIRE_THROWS_AS(OpTest("Dropout", 13)
                        .input(x)
                        .input(Tensor::scalar<float>(1.0f))
                        .input(Tensor::scalar<bool>(true))
                        .run(),
                    Error);
}

TEST_CASE("Transpose, Slice and Split move strings", "[shape]") {
  const Tensor s = Tensor::from_vector<std::string>({2, 2}, {"a", "b", "c", "d"});
  CHECK(OpTest("Transpose", 13).input(s).run1().to_vector<std::string>() ==
        std::vector<std::string>{"a", "c", "b", "d"});
  CHECK(OpTest("Slice", 13)
            .input(s)
            .input(ints({-1}))
            .input(ints({std::numeric_limits<int64_t>::min()}))
            .input(ints({1}))
            .input(ints({-1}))
            .run1()
            .to_vector<std::string>() == std::vector<std::string>{"b", "a", "d", "c"});
  const auto parts = OpTest("Split", 13).input(s).attr("axis", 1).outputs(2).run();
  CHECK(parts[1].tensor().to_vector<std::string>() == std::vector<std::string>{"b", "d"});
}
