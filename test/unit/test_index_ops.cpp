// Indexing, scatter/gather and selection ops against naive references over random shapes,
// and their error paths.
#include <algorithm>
#include <numeric>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Coords = std::vector<int64_t>;

Coords coords_of(const Shape& shape, int64_t flat) {
  Coords c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

int64_t flat_of(const Shape& shape, const Coords& c) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + c[d];
  return f;
}

int64_t rand_int(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Random indices in [-dim, dim) (negative ones count from the end).
Tensor random_indices(const Shape& shape, int64_t dim, std::mt19937& rng) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = rand_int(rng, -dim, dim - 1);
  return Tensor::from_vector<int64_t>(shape, v);
}

int64_t wrap(int64_t i, int64_t dim) {
  return i < 0 ? i + dim : i;
}

Tensor naive_gather(const Tensor& data, const Tensor& indices, size_t axis) {
  Shape out(data.shape().begin(), data.shape().begin() + static_cast<long>(axis));
  out.insert(out.end(), indices.shape().begin(), indices.shape().end());
  out.insert(out.end(), data.shape().begin() + static_cast<long>(axis) + 1, data.shape().end());
  Tensor y = Tensor::zeros(DataType::Float, out);
  const auto idx = indices.to_vector<int64_t>();
  for (int64_t i = 0; i < y.numel(); ++i) {
    const Coords oc = coords_of(out, i);
    Coords ic(oc.begin() + static_cast<long>(axis),
              oc.begin() + static_cast<long>(axis + indices.rank()));
    Coords dc(oc.begin(), oc.begin() + static_cast<long>(axis));
    dc.push_back(wrap(idx[static_cast<size_t>(flat_of(indices.shape(), ic))], data.dim(axis)));
    dc.insert(dc.end(), oc.begin() + static_cast<long>(axis + indices.rank()), oc.end());
    y.data<float>()[i] = static_cast<float>(element(data, flat_of(data.shape(), dc)));
  }
  return y;
}

}  // namespace

TEST_CASE("Gather matches a naive reference over random shapes", "[ops][index]") {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 4));
    Shape ds = random_shape(rank, 5, rng);
    const size_t axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    Shape is = random_shape(static_cast<size_t>(rand_int(rng, 0, 2)), 4, rng);
    Tensor data = random_tensor(DataType::Float, ds, rng);
    Tensor indices = random_indices(is, ds[axis], rng);
    INFO(shape_to_string(ds) << " axis " << axis << " indices " << shape_to_string(is));
    const int64_t attr_axis = rng() % 2 ? static_cast<int64_t>(axis)
                                        : static_cast<int64_t>(axis) - static_cast<int64_t>(rank);
    require_close(OpTest("Gather", 13).input(data).input(indices).attr("axis", attr_axis).run1(),
                  naive_gather(data, indices, axis));
  }
}

TEST_CASE("Gather of embedding rows runs in parallel and matches the reference", "[ops][index]") {
  std::mt19937 rng(5);
  Tensor table = random_tensor(DataType::Float, {300, 96}, rng);
  Tensor ids = random_indices({8, 700}, 300, rng);
  OpTest t("Gather", 13);
  Tensor y = t.input(table).input(ids).run1();
  require_close(y, naive_gather(table, ids, 0));
  CHECK(t.stats().bytes_copied >= static_cast<uint64_t>(y.nbytes()));
  // int32 indices and float16 data go through the same width-based copy.
  std::vector<int32_t> ids32{2, -1, 0};
  Tensor h = random_tensor(DataType::Float16, {4, 3}, rng);
  Tensor yh = OpTest("Gather", 13).input(h).input(Tensor::from_vector<int32_t>({3}, ids32)).run1();
  REQUIRE(yh.dtype() == DataType::Float16);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 3; ++c) {
      CHECK(element(yh, r * 3 + c) == element(h, wrap(ids32[static_cast<size_t>(r)], 4) * 3 + c));
    }
  }
}

TEST_CASE("Gather and Where handle strings", "[ops][index]") {
  Tensor s = Tensor::from_vector<std::string>({3}, {"a", "bb", "ccc"});
  Tensor g = OpTest("Gather", 13)
                 .input(s)
                 .input(Tensor::from_vector<int64_t>({2, 2}, {2, 0, -2, 2}))
                 .run1();
  CHECK(g.to_vector<std::string>() == std::vector<std::string>{"ccc", "a", "bb", "ccc"});
  Tensor cond = Tensor::from_vector<bool>({2, 1}, {true, false});
  Tensor other = Tensor::scalar<std::string>("z");
  Tensor w = OpTest("Where", 16).input(cond).input(s).input(other).run1();
  REQUIRE(w.shape() == Shape{2, 3});
  CHECK(w.to_vector<std::string>() == std::vector<std::string>{"a", "bb", "ccc", "z", "z", "z"});
}

TEST_CASE("Where broadcasts all three inputs", "[ops][index]") {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 20; ++iter) {
    Shape full = random_shape(3, 4, rng);
    Shape cs = full, xs = full, ys{full[2]};
    cs[static_cast<size_t>(rand_int(rng, 1, 2))] = 1;  // dim 0 comes from the condition
    xs[0] = 1;
    Tensor c = Tensor::zeros(DataType::Bool, cs);
    for (int64_t i = 0; i < c.numel(); ++i) c.data<bool>()[i] = rng() % 2;
    Tensor x = random_tensor(DataType::Int64, xs, rng, -100, 100);
    Tensor y = random_tensor(DataType::Int64, ys, rng, -100, 100);
    Tensor out = OpTest("Where", 16).input(c).input(x).input(y).run1();
    REQUIRE(out.shape() == full);
    for (int64_t i = 0; i < out.numel(); ++i) {
      const Coords oc = coords_of(full, i);
      Coords cc = oc, xc = oc, yc{oc[2]};
      for (size_t d = 0; d < 3; ++d) {
        if (cs[d] == 1) cc[d] = 0;
        if (xs[d] == 1) xc[d] = 0;
      }
      const double expected = c.data<bool>()[flat_of(cs, cc)] ? element(x, flat_of(xs, xc))
                                                              : element(y, flat_of(ys, yc));
      REQUIRE(element(out, i) == expected);
    }
  }
}

TEST_CASE("GatherElements matches a naive reference over random shapes", "[ops][index]") {
  std::mt19937 rng(12);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 4));
    Shape ds = random_shape(rank, 5, rng);
    const size_t axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    Shape is = ds;
    for (size_t d = 0; d < rank; ++d) {
      is[d] = d == axis ? rand_int(rng, 1, 6) : rand_int(rng, 1, ds[d]);
    }
    Tensor data = random_tensor(DataType::Float, ds, rng);
    Tensor indices = random_indices(is, ds[axis], rng);
    Tensor expected = Tensor::zeros(DataType::Float, is);
    const auto idx = indices.to_vector<int64_t>();
    for (int64_t i = 0; i < expected.numel(); ++i) {
      Coords c = coords_of(is, i);
      c[axis] = wrap(idx[static_cast<size_t>(i)], ds[axis]);
      expected.data<float>()[i] = static_cast<float>(element(data, flat_of(ds, c)));
    }
    INFO(shape_to_string(ds) << " axis " << axis << " indices " << shape_to_string(is));
    require_close(OpTest("GatherElements", 13)
                      .input(data)
                      .input(indices)
                      .attr("axis", static_cast<int64_t>(axis))
                      .run1(),
                  expected);
  }
}

TEST_CASE("GatherND with batch_dims matches a naive reference", "[ops][index]") {
  std::mt19937 rng(13);
  for (int iter = 0; iter < 40; ++iter) {
    const size_t b = static_cast<size_t>(rand_int(rng, 0, 1));
    const size_t r = static_cast<size_t>(rand_int(rng, static_cast<int64_t>(b) + 1, 4));
    Shape ds = random_shape(r, 4, rng);
    const int64_t k = rand_int(rng, 1, static_cast<int64_t>(r - b));
    Shape is(ds.begin(), ds.begin() + static_cast<long>(b));
    is.push_back(rand_int(rng, 1, 3));
    is.push_back(k);
    Tensor data = random_tensor(DataType::Float, ds, rng);
    std::vector<int64_t> iv(static_cast<size_t>(shape_numel(is)));
    for (size_t i = 0; i < iv.size(); ++i) {
      const int64_t dim = ds[b + i % static_cast<size_t>(k)];
      iv[i] = rand_int(rng, -dim, dim - 1);
    }
    Tensor indices = Tensor::from_vector<int64_t>(is, iv);
    Shape os(is.begin(), is.end() - 1);
    os.insert(os.end(), ds.begin() + static_cast<long>(b) + k, ds.end());
    Tensor expected = Tensor::zeros(DataType::Float, os);
    for (int64_t i = 0; i < expected.numel(); ++i) {
      const Coords oc = coords_of(os, i);
      Coords dc(oc.begin(), oc.begin() + static_cast<long>(b));
      const int64_t tuple = flat_of(Shape(is.begin(), is.end() - 1),
                                    Coords(oc.begin(), oc.begin() + static_cast<long>(b) + 1));
      for (int64_t j = 0; j < k; ++j) {
        dc.push_back(wrap(iv[static_cast<size_t>(tuple * k + j)], ds[b + static_cast<size_t>(j)]));
      }
      dc.insert(dc.end(), oc.begin() + static_cast<long>(b) + 1, oc.end());
      expected.data<float>()[i] = static_cast<float>(element(data, flat_of(ds, dc)));
    }
    INFO(shape_to_string(ds) << " indices " << shape_to_string(is) << " b " << b);
    require_close(OpTest("GatherND", 13)
                      .input(data)
                      .input(indices)
                      .attr("batch_dims", static_cast<int64_t>(b))
                      .run1(),
                  expected);
  }
}

TEST_CASE("ScatterND matches a naive reference, with and without reduction", "[ops][index]") {
  std::mt19937 rng(14);
  for (int iter = 0; iter < 40; ++iter) {
    const size_t r = static_cast<size_t>(rand_int(rng, 1, 4));
    Shape ds = random_shape(r, 4, rng);
    const int64_t k = rand_int(rng, 1, static_cast<int64_t>(r));
    const Shape prefix(ds.begin(), ds.begin() + k);
    const bool add = iter % 2 == 1;
    // Without a reduction the targets are distinct (duplicates are unspecified).
    std::vector<int64_t> targets(static_cast<size_t>(shape_numel(prefix)));
    std::iota(targets.begin(), targets.end(), 0);
    std::shuffle(targets.begin(), targets.end(), rng);
    const int64_t m = add ? rand_int(rng, 1, 6) : rand_int(rng, 1, shape_numel(prefix));
    std::vector<int64_t> iv;
    std::vector<int64_t> target_of;
    for (int64_t s = 0; s < m; ++s) {
      const int64_t t = add ? rand_int(rng, 0, shape_numel(prefix) - 1) : targets[size_t(s)];
      target_of.push_back(t);
      const Coords c = coords_of(prefix, t);
      for (int64_t j = 0; j < k; ++j) {
        iv.push_back(rng() % 2 ? c[size_t(j)] : c[size_t(j)] - ds[size_t(j)]);
      }
    }
    Shape us{m};
    us.insert(us.end(), ds.begin() + k, ds.end());
    Tensor data = random_tensor(DataType::Float, ds, rng);
    Tensor updates = random_tensor(DataType::Float, us, rng);
    Tensor expected = data.clone();
    const int64_t slice = shape_numel(Shape(ds.begin() + k, ds.end()));
    for (int64_t s = 0; s < m; ++s) {
      for (int64_t e = 0; e < slice; ++e) {
        float& dst = expected.data<float>()[target_of[size_t(s)] * slice + e];
        const float u = updates.data<float>()[s * slice + e];
        dst = add ? dst + u : u;
      }
    }
    OpTest t("ScatterND", 18);
    t.input(data).input(Tensor::from_vector<int64_t>({m, k}, iv)).input(updates);
    if (add) t.attr("reduction", "add");
    INFO(shape_to_string(ds) << " k " << k << " m " << m << " add " << add);
    require_close(t.run1(), expected);
  }
}

TEST_CASE("ScatterElements reductions combine duplicates in order", "[ops][index]") {
  Tensor data = Tensor::from_vector<float>({1, 5}, {1, 2, 3, 4, 5});
  Tensor idx = Tensor::from_vector<int64_t>({1, 3}, {1, -4, 3});
  Tensor upd = Tensor::from_vector<float>({1, 3}, {1.5f, 2.0f, -1.0f});
  auto run = [&](const char* red) {
    return OpTest("ScatterElements", 18)
        .input(data)
        .input(idx)
        .input(upd)
        .attr("axis", int64_t{1})
        .attr("reduction", red)
        .run1()
        .to_vector<float>();
  };
  CHECK(run("none") == std::vector<float>{1, 2, 3, -1, 5});
  CHECK(run("add") == std::vector<float>{1, 5.5f, 3, 3, 5});
  CHECK(run("mul") == std::vector<float>{1, 6, 3, -4, 5});
  CHECK(run("max") == std::vector<float>{1, 2, 3, 4, 5});
  CHECK(run("min") == std::vector<float>{1, 1.5f, 3, -1, 5});
}

TEST_CASE("TensorScatter writes linear and circular cache updates", "[ops][index]") {
  // Cache [batch 2, seq 4, 1]; two new entries per batch entry.
  Tensor cache = Tensor::from_vector<float>({2, 4, 1}, {0, 1, 2, 3, 10, 11, 12, 13});
  Tensor update = Tensor::from_vector<float>({2, 2, 1}, {-1, -2, -3, -4});
  Tensor wi = Tensor::from_vector<int64_t>({2}, {1, 3});
  CHECK(OpTest("TensorScatter", 24)
            .input(cache)
            .input(update)
            .input(wi)
            .attr("mode", "circular")
            .run1()
            .to_vector<float>() == std::vector<float>{0, -1, -2, 3, -4, 11, 12, -3});
  Tensor wi2 = Tensor::from_vector<int64_t>({2}, {2, 0});
  CHECK(
      OpTest("TensorScatter", 24).input(cache).input(update).input(wi2).run1().to_vector<float>() ==
      std::vector<float>{0, 1, -1, -2, -3, -4, 12, 13});
  // Linear writes must fit in the cache.
  REQUIRE_THROWS_AS(OpTest("TensorScatter", 24).input(cache).input(update).input(wi).run(), Error);
}

TEST_CASE("TensorScatter updates a moved cache in place", "[ops][index]") {
  GraphBuilder b;
  b.input("cache", DataType::Float, {2, 8, 4}).input("update", DataType::Float, {2, 1, 4});
  b.input("pos", DataType::Int64, {2});
  b.node("TensorScatter", {"cache", "update", "pos"}, {"present"});
  b.output("present");
  Session session = make_session(b.build(), 24);
  std::mt19937 rng(3);
  Tensor cache = random_tensor(DataType::Float, {2, 8, 4}, rng);
  Tensor expected = cache.clone();
  Tensor update = random_tensor(DataType::Float, {2, 1, 4}, rng);
  for (int64_t j = 0; j < 4; ++j) {
    expected.data<float>()[5 * 4 + j] = update.data<float>()[j];
    expected.data<float>()[(8 + 2) * 4 + j] = update.data<float>()[4 + j];
  }
  const std::byte* storage = cache.raw_data();
  // Built by moves: an initializer list would copy the handles and keep the cache shared.
  std::vector<NamedValue> feeds;
  feeds.push_back({"cache", std::move(cache)});
  feeds.push_back({"update", update});
  feeds.push_back({"pos", Tensor::from_vector<int64_t>({2}, {5, 2})});
  auto out = session.run(std::move(feeds));
  require_close(out[0].value.tensor(), expected);
  CHECK(out[0].value.tensor().raw_data() == storage);
  CHECK(session.last_run_stats().in_place_ops == 1);
  CHECK(session.last_run_stats().bytes_copied == static_cast<uint64_t>(update.nbytes()));
}

TEST_CASE("TopK matches a stable sort, ties to the lower index", "[ops][index]") {
  std::mt19937 rng(15);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 3));
    Shape xs = random_shape(rank, 7, rng);
    const size_t axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    const int64_t n = xs[axis];
    const int64_t k = rand_int(rng, 0, n);
    const bool largest = rng() % 2;
    // Few distinct values, so ties are common.
    Tensor x = random_tensor(DataType::Int32, xs, rng, -3, 3);
    Shape os = xs;
    os[axis] = k;
    Tensor ev = Tensor::zeros(DataType::Int32, os), ei = Tensor::zeros(DataType::Int64, os);
    const int64_t inner = shape_numel(Shape(xs.begin() + static_cast<long>(axis) + 1, xs.end()));
    const int64_t outer = x.numel() / (n * inner);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        std::vector<int64_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        auto val = [&](int64_t j) { return x.data<int32_t>()[(o * n + j) * inner + i]; };
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return largest ? val(a) > val(b) : val(a) < val(b);
        });
        for (int64_t j = 0; j < k; ++j) {
          ev.data<int32_t>()[(o * k + j) * inner + i] = val(order[size_t(j)]);
          ei.data<int64_t>()[(o * k + j) * inner + i] = order[size_t(j)];
        }
      }
    }
    INFO(shape_to_string(xs) << " axis " << axis << " k " << k << " largest " << largest);
    auto outs = OpTest("TopK", 11)
                    .input(x)
                    .input(Tensor::from_vector<int64_t>({1}, {k}))
                    .attr("axis", static_cast<int64_t>(axis))
                    .attr("largest", int64_t{largest})
                    .outputs(2)
                    .run();
    CHECK(outs[0].tensor().to_vector<int32_t>() == ev.to_vector<int32_t>());
    CHECK(outs[1].tensor().to_vector<int64_t>() == ei.to_vector<int64_t>());
  }
}

TEST_CASE("TopK before opset 10 reads k from its attribute", "[ops][index]") {
  Tensor x = Tensor::from_vector<float>({5}, {3, 1, 4, 1, 5});
  auto outs = OpTest("TopK", 1).input(x).attr("k", int64_t{2}).outputs(2).run();
  CHECK(outs[0].tensor().to_vector<float>() == std::vector<float>{5, 4});
  CHECK(outs[1].tensor().to_vector<int64_t>() == std::vector<int64_t>{4, 2});
}

TEST_CASE("ArgMax and ArgMin match a naive scan", "[ops][index]") {
  std::mt19937 rng(16);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 4));
    Shape xs = random_shape(rank, 6, rng);
    if (iter % 10 == 0) xs.back() = 600;  // more than one block of columns
    const size_t axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    const bool keep = rng() % 2, last = rng() % 2, is_max = rng() % 2;
    Tensor x = random_tensor(DataType::Float, xs, rng, -2, 2);
    for (int64_t i = 0; i < x.numel(); ++i) {  // round to get ties
      x.data<float>()[i] = std::round(x.data<float>()[i]);
    }
    const int64_t n = xs[axis];
    const int64_t inner = shape_numel(Shape(xs.begin() + static_cast<long>(axis) + 1, xs.end()));
    const int64_t outer = x.numel() / (n * inner);
    std::vector<int64_t> expected;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t best = 0;
        for (int64_t j = 1; j < n; ++j) {
          const float v = x.data<float>()[(o * n + j) * inner + i];
          const float b = x.data<float>()[(o * n + best) * inner + i];
          const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) best = j;
        }
        expected.push_back(best);
      }
    }
    Tensor y = OpTest(is_max ? "ArgMax" : "ArgMin", 13)
                   .input(x)
                   .attr("axis", static_cast<int64_t>(axis))
                   .attr("keepdims", int64_t{keep})
                   .attr("select_last_index", int64_t{last})
                   .run1();
    Shape ys = xs;
    if (keep) {
      ys[axis] = 1;
    } else {
      ys.erase(ys.begin() + static_cast<long>(axis));
    }
    INFO(shape_to_string(xs) << " axis " << axis << " max " << is_max << " last " << last);
    CHECK(y.shape() == ys);
    CHECK(y.to_vector<int64_t>() == expected);
  }
}

TEST_CASE("CumSum and CumProd match a naive scan", "[ops][index]") {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 60; ++iter) {
    const size_t rank = static_cast<size_t>(rand_int(rng, 1, 3));
    Shape xs = random_shape(rank, 6, rng);
    if (iter % 10 == 0) xs.back() = 300;
    const size_t axis = static_cast<size_t>(rand_int(rng, 0, static_cast<int64_t>(rank) - 1));
    const bool excl = rng() % 2, rev = rng() % 2, prod = iter % 3 == 0;
    Tensor x = random_tensor(DataType::Float, xs, rng, 0.5, 1.5);
    const int64_t n = xs[axis];
    const int64_t inner = shape_numel(Shape(xs.begin() + static_cast<long>(axis) + 1, xs.end()));
    const int64_t outer = x.numel() / (n * inner);
    Tensor expected = Tensor::zeros(DataType::Float, xs);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        double acc = prod ? 1 : 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t j = rev ? n - 1 - s : s;
          const int64_t at = (o * n + j) * inner + i;
          const double v = x.data<float>()[at];
          if (!excl) acc = prod ? acc * v : acc + v;
          expected.data<float>()[at] = static_cast<float>(acc);
          if (excl) acc = prod ? acc * v : acc + v;
        }
      }
    }
    const int64_t attr_axis = rng() % 2 ? static_cast<int64_t>(axis)
                                        : static_cast<int64_t>(axis) - static_cast<int64_t>(rank);
    INFO(shape_to_string(xs) << " axis " << axis << " excl " << excl << " rev " << rev);
    require_close(OpTest(prod ? "CumProd" : "CumSum", prod ? 26 : 14)
                      .input(x)
                      .input(Tensor::scalar<int32_t>(static_cast<int32_t>(attr_axis)))
                      .attr("exclusive", int64_t{excl})
                      .attr("reverse", int64_t{rev})
                      .run1(),
                  expected, 1e-4, 1e-4);
  }
}

TEST_CASE("Unique returns all four outputs, sorted or in first-seen order", "[ops][index]") {
  Tensor x = Tensor::from_vector<float>({6}, {2, 1, 1, 3, 4, 3});
  auto sorted = OpTest("Unique", 11).input(x).outputs(4).run();
  CHECK(sorted[0].tensor().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(sorted[1].tensor().to_vector<int64_t>() == std::vector<int64_t>{1, 0, 3, 4});
  CHECK(sorted[2].tensor().to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 2, 3, 2});
  CHECK(sorted[3].tensor().to_vector<int64_t>() == std::vector<int64_t>{2, 1, 2, 1});
  auto seen = OpTest("Unique", 11).input(x).attr("sorted", int64_t{0}).outputs(4).run();
  CHECK(seen[0].tensor().to_vector<float>() == std::vector<float>{2, 1, 3, 4});
  CHECK(seen[2].tensor().to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1, 2, 3, 2});
  Tensor s = Tensor::from_vector<std::string>({4}, {"b", "a", "b", "c"});
  CHECK(OpTest("Unique", 11).input(s).run1().to_vector<std::string>() ==
        std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("OneHot, NonZero, Compress and ReverseSequence on small examples", "[ops][index]") {
  Tensor oh = OpTest("OneHot", 11)
                  .input(Tensor::from_vector<int64_t>({3}, {0, -1, 7}))
                  .input(Tensor::scalar<float>(3))
                  .input(Tensor::from_vector<int32_t>({2}, {0, 5}))
                  .run1();
  CHECK(oh.shape() == Shape{3, 3});
  CHECK(oh.to_vector<int32_t>() == std::vector<int32_t>{5, 0, 0, 0, 0, 5, 0, 0, 0});

  Tensor nz =
      OpTest("NonZero", 13).input(Tensor::from_vector<float>({2, 2}, {0.f, -0.f, 3.f, 1.f})).run1();
  CHECK(nz.shape() == Shape{2, 2});
  CHECK(nz.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0, 1});

  Tensor x = Tensor::from_vector<int64_t>({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor cond = Tensor::from_vector<bool>({2}, {false, true});
  Tensor c = OpTest("Compress", 11).input(x).input(cond).attr("axis", int64_t{-1}).run1();
  CHECK(c.shape() == Shape{3, 1});
  CHECK(c.to_vector<int64_t>() == std::vector<int64_t>{2, 4, 6});

  Tensor seq = Tensor::from_vector<int64_t>({3, 2}, {1, 2, 3, 4, 5, 6});  // [time, batch]
  Tensor r = OpTest("ReverseSequence", 10)
                 .input(seq)
                 .input(Tensor::from_vector<int64_t>({2}, {3, 2}))
                 .run1();
  CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{5, 4, 3, 2, 1, 6});
}

TEST_CASE("indexing ops reject bad indices and attributes with kiln::Error", "[ops][index]") {
  Tensor data = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor bad = Tensor::from_vector<int64_t>({1}, {2});
  Tensor too_negative = Tensor::from_vector<int64_t>({1}, {-3});
  REQUIRE_THROWS_AS(OpTest("Gather", 13).input(data).input(bad).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Gather", 13).input(data).input(too_negative).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Gather", 13).input(data).input(bad).attr("axis", int64_t{2}).run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("Gather", 13).input(data).input(Tensor::from_vector<float>({1}, {0})).run(), Error);
  Tensor bad2d = Tensor::from_vector<int64_t>({1, 1}, {3});
  REQUIRE_THROWS_AS(
      OpTest("GatherElements", 13).input(data).input(bad2d).attr("axis", int64_t{1}).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("GatherND", 13).input(data).input(Tensor::from_vector<int64_t>({1, 2}, {1, 3})).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("GatherND", 13)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({1, 3}, {0, 0, 0}))
                        .run(),
                    Error);
  Tensor upd = Tensor::from_vector<float>({1, 1}, {9});
  REQUIRE_THROWS_AS(OpTest("ScatterElements", 13)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({1, 1}, {-4}))
                        .input(upd)
                        .attr("axis", int64_t{1})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("ScatterND", 13)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({1, 2}, {2, 0}))
                        .input(Tensor::from_vector<float>({1}, {9}))
                        .run(),
                    Error);
  // A reduction that does not exist, or not yet at this opset.
  REQUIRE_THROWS_AS(OpTest("ScatterND", 18)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({1, 2}, {1, 0}))
                        .input(Tensor::from_vector<float>({1}, {9}))
                        .attr("reduction", "avg")
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("ScatterElements", 16)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({1, 1}, {0}))
                        .input(upd)
                        .attr("reduction", "max")
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("TopK", 11).input(data).input(Tensor::from_vector<int64_t>({1}, {4})).outputs(2).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("OneHot", 11)
                        .input(Tensor::from_vector<int64_t>({1}, {0}))
                        .input(Tensor::scalar<float>(0))
                        .input(Tensor::from_vector<float>({2}, {0, 1}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("ReverseSequence", 10)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({3}, {1, 4, 1}))
                        .attr("time_axis", int64_t{1})
                        .attr("batch_axis", int64_t{0})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("ReverseSequence", 10)
                        .input(data)
                        .input(Tensor::from_vector<int64_t>({3}, {1, 1, 1}))
                        .attr("time_axis", int64_t{1})
                        .attr("batch_axis", int64_t{1})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("Compress", 11).input(data).input(Tensor::from_vector<int64_t>({2}, {1, 0})).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("Where", 16)
                        .input(Tensor::from_vector<bool>({2}, {true, false}))
                        .input(data)
                        .input(Tensor::from_vector<float>({3}, {0, 0, 0}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("CumSum", 14).input(data).input(Tensor::scalar<int64_t>(2)).run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("TensorScatter", 24).input(data).input(data).attr("axis", int64_t{0}).run(), Error);
}
