// kiln::Shape against std::vector<int64_t>: random operation sequences that cross the inline
// capacity must leave both with the same elements.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kiln/shape.h"
#include "kiln/tensor.h"

using kiln::copy_elements;
using kiln::DataType;
using kiln::Shape;
using kiln::Tensor;

namespace {

void require_same(const Shape& s, const std::vector<int64_t>& v) {
  REQUIRE(s.size() == v.size());
  REQUIRE(s.empty() == v.empty());
  REQUIRE(std::vector<int64_t>(s) == v);
  REQUIRE(s.capacity() >= s.size());
}

// One random operation applied to both containers.
void apply_random_op(std::mt19937& rng, Shape& s, std::vector<int64_t>& v) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n)(rng); };
  const auto value = static_cast<int64_t>(pick(1000));
  switch (pick(12)) {
    case 0:
    case 1:
      s.push_back(value);
      v.push_back(value);
      break;
    case 2:
      if (!v.empty()) {
        s.pop_back();
        v.pop_back();
      }
      break;
    case 3: {
      const size_t n = pick(14);
      s.resize(n, value);
      v.resize(n, value);
      break;
    }
    case 4: {
      const size_t at = pick(v.size()), n = pick(4);
      s.insert(s.begin() + at, n, value);
      v.insert(v.begin() + static_cast<long>(at), n, value);
      break;
    }
    case 5: {
      // A range from the container itself: insert must copy it before growing.
      const size_t at = pick(v.size()), from = pick(v.size()), to = from + pick(v.size() - from);
      s.insert(s.begin() + at, s.begin() + from, s.begin() + to);
      const std::vector<int64_t> range(v.begin() + static_cast<long>(from),
                                       v.begin() + static_cast<long>(to));
      v.insert(v.begin() + static_cast<long>(at), range.begin(), range.end());
      break;
    }
    case 6:
      if (!v.empty()) {
        const size_t at = pick(v.size() - 1);
        s.erase(s.begin() + at);
        v.erase(v.begin() + static_cast<long>(at));
      }
      break;
    case 7: {
      const size_t from = pick(v.size()), to = from + pick(v.size() - from);
      s.erase(s.begin() + from, s.begin() + to);
      v.erase(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to));
      break;
    }
    case 8: {
      Shape copy = s;  // copy, then move back through a second object
      Shape moved = std::move(copy);
      REQUIRE(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
      s = std::move(moved);
      break;
    }
    case 9: {
      const Shape copy = s;
      s = copy;
      REQUIRE(copy == s);
      break;
    }
    case 10:
      if (pick(3) == 0) {
        s.clear();
        v.clear();
      } else {
        s.emplace_back(value);
        v.emplace_back(value);
      }
      break;
    default: {
      const size_t n = pick(10);
      s.assign(n, value);
      v.assign(n, value);
      break;
    }
  }
}

}  // namespace

TEST_CASE("Shape behaves like std::vector<int64_t> under random operations", "[shape_class]") {
  std::mt19937 rng(1234);
  size_t max_size = 0;
  for (int round = 0; round < 200; ++round) {
    Shape s;
    std::vector<int64_t> v;
    for (int op = 0; op < 60; ++op) {
      apply_random_op(rng, s, v);
      require_same(s, v);
      max_size = std::max(max_size, v.size());
    }
  }
  CHECK(max_size > 2 * Shape::kInline);  // the sequences did leave the inline storage
}

TEST_CASE("Shape construction, comparison and access", "[shape_class]") {
  const Shape a = {2, 3, 4};
  CHECK(a.size() == 3);
  CHECK(a.front() == 2);
  CHECK(a.back() == 4);
  CHECK(a[1] == 3);
  CHECK(a.at(2) == 4);
  CHECK_THROWS_AS(a.at(3), std::out_of_range);
  CHECK(Shape(3, 7) == Shape{7, 7, 7});
  CHECK(Shape(2) == Shape{0, 0});
  const std::vector<int64_t> v = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const Shape big(v);
  CHECK(std::vector<int64_t>(big) == v);
  CHECK(Shape(v.begin() + 2, v.end() - 1) == Shape{3, 4, 5, 6, 7, 8});
  CHECK(Shape{1, 2} < Shape{1, 3});
  CHECK(Shape{1, 2} < Shape{1, 2, 0});
  CHECK(Shape{1, 2} != Shape{1});
  CHECK(Shape(big.rbegin(), big.rend()).front() == 9);
  Shape moved = big;
  const Shape target = std::move(moved);  // a heap buffer changes hands
  CHECK(target == big);
  CHECK(moved.empty());  // NOLINT(bugprone-use-after-move)
}

TEST_CASE("copy_elements between random strided views matches element-by-element indexing",
          "[tensor]") {
  // Permuted, sliced and reversed views of 1 to 6 dimensions on either side: the copy merges
  // the dimensions both sides are dense across and must land every element where indexing
  // puts it. Element sizes 1, 4 and 8.
  std::mt19937 rng(71);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 300; ++iter) {
    const size_t rank = static_cast<size_t>(pick(1, 6));
    Shape shape(rank);
    for (auto& d : shape) d = pick(1, 5);
    const DataType dtype = iter % 3 == 0   ? DataType::UInt8
                           : iter % 3 == 1 ? DataType::Float
                                           : DataType::Int64;
    const int64_t esize = dtype == DataType::UInt8 ? 1 : dtype == DataType::Float ? 4 : 8;
    // A view of `shape` into a larger buffer: dimensions in a random order, each with room for
    // a step of 1 or 2, some walked backwards.
    auto random_view = [&](Tensor& base) {
      std::vector<size_t> order(rank);
      for (size_t i = 0; i < rank; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      Shape strides(rank), steps(rank);
      int64_t stride = 1;
      for (size_t i = rank; i-- > 0;) {
        const size_t d = order[i];
        steps[d] = pick(1, 2);
        strides[d] = stride * steps[d];
        stride *= shape[d] * steps[d];
      }
      base = Tensor::zeros(dtype, Shape{stride});
      int64_t offset = 0;
      for (size_t d = 0; d < rank; ++d) {
        if (pick(0, 3) == 0) {  // backwards
          offset += (shape[d] - 1) * strides[d];
          strides[d] = -strides[d];
        }
      }
      return base.view(shape, strides, static_cast<size_t>(offset * esize));
    };
    Tensor src_base, dst_base;
    const Tensor src = random_view(src_base), dst = random_view(dst_base);
    for (int64_t i = 0; i < src_base.numel(); ++i) {
      std::memset(static_cast<std::byte*>(src_base.raw_data()) + i * esize,
                  static_cast<int>((i * 37 + 11) % 251), static_cast<size_t>(esize));
    }
    copy_elements(src, dst);
    // Every index: the bytes at its offset in dst equal those at its offset in src.
    Shape idx(rank, 0);
    for (int64_t n = 0; n < src.numel(); ++n) {
      int64_t so = 0, doff = 0;
      for (size_t d = 0; d < rank; ++d) {
        so += idx[d] * src.strides()[d];
        doff += idx[d] * dst.strides()[d];
      }
      REQUIRE(std::memcmp(static_cast<const std::byte*>(src.raw_data()) + so * esize,
                          static_cast<const std::byte*>(dst.raw_data()) + doff * esize,
                          static_cast<size_t>(esize)) == 0);
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  }
}
