// Unique: the distinct elements (or slices along an axis) of X, sorted or in order of
// first occurrence, with their first indices, the inverse mapping and the counts.
//
// Items are ordered by a per-type three-way comparison behind a function pointer, so the
// sort itself is instantiated once rather than once per element type.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// Compares items a and b: `len` elements each, element k at base + k-th position where
// item i starts at (o * n + i) * inner for o in [0, outer) and runs `inner` elements.
struct Items {
  const void* data;
  int64_t outer, n, inner;
};
using CompareFn = int (*)(const Items&, int64_t a, int64_t b);

template <typename T>
int compare_items(const Items& it, int64_t a, int64_t b) {
  const T* p = static_cast<const T*>(it.data);
  for (int64_t o = 0; o < it.outer; ++o) {
    const T* x = p + (o * it.n + a) * it.inner;
    const T* y = p + (o * it.n + b) * it.inner;
    for (int64_t k = 0; k < it.inner; ++k) {
      if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, bool>) {
        if (x[k] < y[k]) return -1;
        if (y[k] < x[k]) return 1;
      } else {
        // NaN sorts after every number and equals itself, so the order stays total.
        const auto u = static_cast<compute_t<T>>(x[k]), v = static_cast<compute_t<T>>(y[k]);
        if constexpr (std::is_floating_point_v<decltype(u)>) {
          const bool un = std::isnan(u), vn = std::isnan(v);
          if (un || vn) {
            if (un != vn) return un ? 1 : -1;
            continue;
          }
        }
        if (u < v) return -1;
        if (v < u) return 1;
      }
    }
  }
  return 0;
}

CompareFn comparator(DataType dt) {
  CompareFn fn = nullptr;
  dispatch(AllTypes{}, dt, [&]<typename T>() { fn = &compare_items<T>; });
  return fn;
}

class Unique final : public Kernel {
 public:
  explicit Unique(const NodeInfo& info)
      : has_axis_(info.has_attr("axis")),
        axis_(info.attr_int("axis", 0)),
        sorted_(info.attr_int("sorted", 1) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Items items{x.raw_data(), 1, x.numel(), 1};
    size_t axis = 0;
    if (has_axis_) {
      axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank())));
      items.outer = shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
      items.n = x.dim(axis);
      items.inner = shape_numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
    }
    const CompareFn cmp = comparator(x.dtype());
    const int64_t n = items.n;

    // Stable sort keeps equal items in order, so each group starts at its first occurrence.
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return cmp(items, a, b) < 0; });
    std::vector<int64_t> group_of(static_cast<size_t>(n));
    std::vector<int64_t> first, counts;  // per group, in sorted order
    for (size_t s = 0; s < order.size(); ++s) {
      if (s == 0 || cmp(items, order[s - 1], order[s]) != 0) {
        first.push_back(order[s]);
        counts.push_back(0);
      }
      group_of[static_cast<size_t>(order[s])] = static_cast<int64_t>(first.size()) - 1;
      ++counts.back();
    }
    const int64_t groups = static_cast<int64_t>(first.size());
    // Output position of each group: sorted order, or order of first occurrence.
    std::vector<int64_t> group_order(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) group_order[static_cast<size_t>(g)] = g;
    if (!sorted_) {
      std::sort(group_order.begin(), group_order.end(), [&](int64_t a, int64_t b) {
        return first[static_cast<size_t>(a)] < first[static_cast<size_t>(b)];
      });
    }
    std::vector<int64_t> position(static_cast<size_t>(groups));
    for (int64_t p = 0; p < groups; ++p) {
      position[static_cast<size_t>(group_order[static_cast<size_t>(p)])] = p;
    }

    Shape y_shape{groups};
    if (has_axis_) {
      y_shape = x.shape();
      y_shape[axis] = groups;
    }
    Tensor& y = ctx.output(0, x.dtype(), y_shape);
    if (y.numel() > 0) {
      const size_t esize =
          x.dtype() == DataType::String ? 0 : static_cast<size_t>(bits_per_element(x.dtype()) / 8);
      for (int64_t o = 0; o < items.outer; ++o) {
        for (int64_t p = 0; p < groups; ++p) {
          const int64_t src = (o * n + first[static_cast<size_t>(group_order[p])]) * items.inner;
          const int64_t dst = (o * groups + p) * items.inner;
          if (esize == 0) {
            const std::string* s = x.data<const std::string>() + src;
            std::copy_n(s, items.inner, y.data<std::string>() + dst);
          } else {
            std::copy_n(x.raw_data() + src * static_cast<int64_t>(esize),
                        items.inner * static_cast<int64_t>(esize),
                        y.raw_data() + dst * static_cast<int64_t>(esize));
          }
        }
      }
    }
    if (ctx.has_output(1)) {
      int64_t* o = ctx.output(1, DataType::Int64, {groups}).data<int64_t>();
      for (int64_t p = 0; p < groups; ++p) o[p] = first[static_cast<size_t>(group_order[p])];
    }
    if (ctx.has_output(2)) {
      int64_t* o = ctx.output(2, DataType::Int64, {n}).data<int64_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = position[static_cast<size_t>(group_of[i])];
    }
    if (ctx.has_output(3)) {
      int64_t* o = ctx.output(3, DataType::Int64, {groups}).data<int64_t>();
      for (int64_t p = 0; p < groups; ++p) o[p] = counts[static_cast<size_t>(group_order[p])];
    }
  }

 private:
  bool has_axis_;
  int64_t axis_;
  bool sorted_;
};

// Known when the input's values are (a small integer or bool tensor): the number of
// distinct elements (or slices along `axis`) sizes Y, indices and counts; inverse_indices
// has one entry per element (slice).
void unique_shape(ShapeContext& c) {
  const ValueFacts& x = c.in(0);
  if (!x.has_data) unknown("the number of distinct elements is only known when run");
  int64_t outer = 1, n = static_cast<int64_t>(x.data.size()), inner = 1;
  size_t axis = 0;
  if (c.has_attr("axis")) {
    axis = static_cast<size_t>(
        normalize_axis(c.attr_int("axis", 0), static_cast<int64_t>(x.shape.size())));
    outer = numel_or_unknown(Shape(x.shape.begin(), x.shape.begin() + axis));
    n = x.shape[axis];
    inner = numel_or_unknown(Shape(x.shape.begin() + axis + 1, x.shape.end()));
  }
  std::set<std::vector<int64_t>> items;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> item;
    for (int64_t o = 0; o < outer; ++o) {
      const auto* at = x.data.data() + (o * n + i) * inner;
      item.insert(item.end(), at, at + inner);
    }
    items.insert(std::move(item));
  }
  const auto groups = static_cast<int64_t>(items.size());
  Shape y{groups};
  if (c.has_attr("axis")) {
    y = x.shape;
    y[axis] = groups;
  }
  c.set(0, x.dtype, y);
  c.set(1, DataType::Int64, {groups});
  c.set(2, DataType::Int64, {n});
  c.set(3, DataType::Int64, {groups});
}

}  // namespace

KILN_REGISTER_OP({.op = "Unique",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .types = "all numeric, bool, string",
                  .shape = unique_shape,
                  .create = make<Unique>});

}  // namespace kiln::ops
