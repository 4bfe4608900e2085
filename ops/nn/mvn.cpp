// MeanVarianceNormalization (opsets 9 and 13): (X - mean) / (sqrt(var) + 1e-9) with the
// mean and variance taken over `axes` (default [0, 2, 3]) as its function body does:
// var = E[X^2] - E[X]^2. The statistics are accumulated in double over contiguous runs (the
// shape is collapsed into groups of kept and reduced dims), then a second pass normalises.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// Dims collapsed into groups; `kstride` is a group's stride in the statistics (0 when reduced).
struct Groups {
  std::vector<int64_t> dims, kstride;
  bool inner_kept = true;
};

Groups make_groups(const Shape& shape, const std::vector<bool>& reduced) {
  std::vector<int64_t> dims;
  std::vector<bool> kinds;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty() && kinds.back() == reduced[d]) {
      dims.back() *= shape[d];
    } else {
      dims.push_back(shape[d]);
      kinds.push_back(reduced[d]);
    }
  }
  Groups g;
  if (dims.empty()) {
    dims.push_back(1);
    kinds.push_back(false);
  }
  g.dims = dims;
  g.kstride.assign(dims.size(), 0);
  int64_t ks = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    if (!kinds[i]) {
      g.kstride[i] = ks;
      ks *= dims[i];
    }
  }
  g.inner_kept = !kinds.back();
  return g;
}

// Calls f(run_start, stats_index) for every innermost run, in memory order.
template <typename F>
void for_each_run(const Groups& g, F&& f) {
  const size_t outer = g.dims.size() - 1;
  const int64_t run = g.dims.back();
  int64_t runs = 1;
  for (size_t d = 0; d < outer; ++d) runs *= g.dims[d];
  std::vector<int64_t> idx(outer, 0);
  int64_t k = 0;
  for (int64_t r = 0; r < runs; ++r) {
    f(r * run, k);
    for (size_t d = outer; d-- > 0;) {
      k += g.kstride[d];
      if (++idx[d] < g.dims[d]) break;
      k -= idx[d] * g.kstride[d];
      idx[d] = 0;
    }
  }
}

class Mvn final : public Kernel {
 public:
  explicit Mvn(const NodeInfo& info) : axes_(info.attr_ints("axes", {0, 2, 3})) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    std::vector<bool> reduced(x.rank(), false);
    for (int64_t a : axes_) {
      const auto d = static_cast<size_t>(normalize_axis(a, rank));
      if (reduced[d]) ctx.fail("axis " + std::to_string(a) + " is listed twice");
      reduced[d] = true;
    }
    int64_t count = 1, kept = 1;
    for (size_t d = 0; d < x.rank(); ++d) (reduced[d] ? count : kept) *= x.dim(d);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    if (x.numel() == 0) return;
    const Groups g = make_groups(x.shape(), reduced);
    const int64_t run = g.dims.back();
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      std::vector<double> sum(static_cast<size_t>(kept), 0.0), sq(static_cast<size_t>(kept), 0.0);
      for_each_run(g, [&](int64_t start, int64_t k) {
        const T* p = src + start;
        if (g.inner_kept) {
          for (int64_t i = 0; i < run; ++i) {
            const double v = static_cast<compute_t<T>>(p[i]);
            sum[static_cast<size_t>(k + i)] += v;
            sq[static_cast<size_t>(k + i)] += v * v;
          }
        } else {
          double s = 0, s2 = 0;
          for (int64_t i = 0; i < run; ++i) {
            const double v = static_cast<compute_t<T>>(p[i]);
            s += v;
            s2 += v * v;
          }
          sum[static_cast<size_t>(k)] += s;
          sq[static_cast<size_t>(k)] += s2;
        }
      });
      // sum becomes the mean and sq the reciprocal of (std + epsilon).
      for (size_t k = 0; k < sum.size(); ++k) {
        const double mean = sum[k] / static_cast<double>(count);
        const double var = std::max(0.0, sq[k] / static_cast<double>(count) - mean * mean);
        sum[k] = mean;
        sq[k] = 1.0 / (std::sqrt(var) + 1e-9);
      }
      for_each_run(g, [&](int64_t start, int64_t k) {
        for (int64_t i = 0; i < run; ++i) {
          const auto s = static_cast<size_t>(g.inner_kept ? k + i : k);
          const double v = static_cast<compute_t<T>>(src[start + i]);
          dst[start + i] = from_compute<T>(static_cast<compute_t<T>>((v - sum[s]) * sq[s]));
        }
      });
    });
  }

 private:
  std::vector<int64_t> axes_;
};

}  // namespace

KILN_REGISTER_OP({.op = "MeanVarianceNormalization",
                  .since = 9,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<Mvn>});

}  // namespace kiln::ops
