// ArgMax and ArgMin: the index of the largest (smallest) element along an axis; the first
// one among equals, or the last with select_last_index. A NaN counts as the extreme (the
// first NaN wins), as in numpy.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

template <bool kMax>
class ArgExtreme final : public Kernel {
 public:
  explicit ArgExtreme(const NodeInfo& info)
      : axis_(info.attr_int("axis", 0)),
        keepdims_(info.attr_int("keepdims", 1) != 0),
        last_(info.attr_int("select_last_index", 0) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() == 0) ctx.fail("input must have rank >= 1");
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank())));
    const int64_t n = x.dim(axis);
    Shape shape = x.shape();
    if (keepdims_) {
      shape[axis] = 1;
    } else {
      shape.erase(shape.begin() + static_cast<int64_t>(axis));
    }
    Tensor& out = ctx.output(0, DataType::Int64, shape);
    if (out.numel() == 0) return;
    if (n == 0) ctx.fail("cannot take the index of an extreme along an empty axis");
    const int64_t outer = shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
    const int64_t inner = shape_numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
    int64_t* result = out.data<int64_t>();
    const bool last = last_;

    dispatch(NumericTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* src = x.data<const T>();
      auto better = [last](C v, C best) {
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(best)) return false;
          if (std::isnan(v)) return true;
        }
        if (last) return kMax ? v >= best : v <= best;
        return kMax ? v > best : v < best;
      };
      // Work items are (outer, block of up to kBlock columns); each scans the axis once,
      // reading rows of the block contiguously.
      constexpr int64_t kBlock = 256;
      const int64_t blocks = (inner + kBlock - 1) / kBlock;
      parallel_for(outer * blocks, grain_for(n * std::min(inner, kBlock)),
                   [&](int64_t begin, int64_t end) {
                     C best[kBlock];
                     for (int64_t w = begin; w < end; ++w) {
                       const int64_t o = w / blocks, i0 = (w % blocks) * kBlock;
                       const int64_t cols = std::min(kBlock, inner - i0);
                       const T* base = src + o * n * inner + i0;
                       int64_t* res = result + o * inner + i0;
                       for (int64_t c = 0; c < cols; ++c) {
                         best[c] = static_cast<C>(base[c]);
                         res[c] = 0;
                       }
                       for (int64_t j = 1; j < n; ++j) {
                         const T* row = base + j * inner;
                         for (int64_t c = 0; c < cols; ++c) {
                           const C v = static_cast<C>(row[c]);
                           if (better(v, best[c])) {
                             best[c] = v;
                             res[c] = j;
                           }
                         }
                       }
                     }
                   });
    });
  }

 private:
  int64_t axis_;
  bool keepdims_, last_;
};

void arg_reduce_shape(ShapeContext& c) {
  Shape out = c.shape(0);
  const auto axis =
      static_cast<size_t>(normalize_axis(c.attr_int("axis", 0), static_cast<int64_t>(out.size())));
  if (c.attr_int("keepdims", 1) != 0)
    out[axis] = 1;
  else
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(axis));
  c.set(0, DataType::Int64, out);
}

}  // namespace

KILN_REGISTER_OP({.op = "ArgMax",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all numeric",
                  .shape = arg_reduce_shape,
                  .create = make<ArgExtreme<true>>});
KILN_REGISTER_OP({.op = "ArgMin",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all numeric",
                  .shape = arg_reduce_shape,
                  .create = make<ArgExtreme<false>>});

}  // namespace kiln::ops
