// LpNormalization (opsets 1 and 22): x / ||x||_p along one axis, p = 1 or 2. A zero norm
// gives zeros, as onnxruntime does. X is viewed as [outer, n, inner]; the norms of a block of
// inner positions are accumulated row by row along the contiguous inner axis; with the last
// axis each row is one contiguous vector.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

template <typename C>
using Arr = Eigen::Array<C, Eigen::Dynamic, 1>;
template <typename C>
using ConstMap = Eigen::Map<const Arr<C>>;
template <typename C>
using MutMap = Eigen::Map<Arr<C>>;

constexpr int64_t kCols = 256;

class LpNorm final : public Kernel {
 public:
  explicit LpNorm(const NodeInfo& info)
      : axis_(info.attr_int("axis", -1)), p_(info.attr_int("p", 2)) {
    if (p_ != 1 && p_ != 2) info.fail("p must be 1 or 2");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const auto axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank())));
    int64_t outer = 1, n = x.dim(axis), inner = 1;
    for (size_t d = 0; d < axis; ++d) outer *= x.dim(d);
    for (size_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(d);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    if (x.numel() == 0) return;
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      if (inner == 1) {
        parallel_for(outer, grain_for(n * 3), [&](int64_t r0, int64_t r1) {
          std::vector<C> buf(static_cast<size_t>(n));
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = src[r * n + i];
            ConstMap<C> row(buf.data(), n);
            const C norm = p_ == 1 ? row.abs().sum() : std::sqrt(row.square().sum());
            const C scale = norm == C(0) ? C(0) : C(1) / norm;
            for (int64_t i = 0; i < n; ++i) dst[r * n + i] = from_compute<T>(row[i] * scale);
          }
        });
        return;
      }
      const int64_t cols = std::min(inner, kCols);
      const int64_t chunks = (inner + cols - 1) / cols;
      parallel_for(outer * chunks, grain_for(n * cols * 3), [&](int64_t i0, int64_t i1) {
        std::vector<C> buf(static_cast<size_t>(n * cols));
        alignas(64) C norm[kCols];
        MutMap<C> nm(norm, cols);
        for (int64_t item = i0; item < i1; ++item) {
          const int64_t o = item / chunks;
          const int64_t j0 = (item % chunks) * cols;
          const int64_t w = std::min(cols, inner - j0);
          const int64_t base = o * n * inner + j0;
          // Gather the block [n, w] in the compute type, then normalise each column.
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < w; ++j) {
              buf[static_cast<size_t>(i * w + j)] = static_cast<C>(src[base + i * inner + j]);
            }
          }
          auto norms = nm.head(w);
          norms.setZero();
          for (int64_t i = 0; i < n; ++i) {
            ConstMap<C> r(buf.data() + i * w, w);
            if (p_ == 1) {
              norms += r.abs();
            } else {
              norms += r.square();
            }
          }
          if (p_ == 2) norms = norms.sqrt();
          norms = (norms == C(0)).select(C(0), norms.inverse());
          for (int64_t i = 0; i < n; ++i) {
            ConstMap<C> r(buf.data() + i * w, w);
            for (int64_t j = 0; j < w; ++j) {
              dst[base + i * inner + j] = from_compute<T>(r[j] * norm[j]);
            }
          }
        }
      });
    });
  }

 private:
  int64_t axis_;
  int64_t p_;
};

}  // namespace

KILN_REGISTER_OP({.op = "LpNormalization",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<LpNorm>});

}  // namespace kiln::ops
