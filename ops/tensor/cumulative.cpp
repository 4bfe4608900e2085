// CumSum and CumProd along the axis given as an input, optionally exclusive (each output
// leaves out its own element) and/or reversed. Half types accumulate in float; integers
// wrap around like onnxruntime instead of overflowing.
#include <algorithm>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

using CumTypes = TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t, uint64_t>;

struct SumOp {
  template <typename C>
  static C identity() {
    return C(0);
  }
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename C>
  static C identity() {
    return C(1);
  }
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};

template <typename Op>
class Cumulative final : public Kernel {
 public:
  explicit Cumulative(const NodeInfo& info)
      : exclusive_(info.attr_int("exclusive", 0) != 0),
        reverse_(info.attr_int("reverse", 0) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& axis_t = ctx.input(1);
    if (axis_t.numel() != 1 || axis_t.rank() > 1) {
      ctx.fail("axis must be a scalar, got " + axis_t.describe());
    }
    if (x.rank() == 0) ctx.fail("input must have rank >= 1");
    const size_t axis =
        static_cast<size_t>(normalize_axis(to_int64s(axis_t)[0], static_cast<int64_t>(x.rank())));
    const int64_t n = x.dim(axis);
    const int64_t outer = shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
    const int64_t inner = shape_numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
    // Each output element is written after its input element is read: in place is safe.
    Tensor& out = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    if (out.numel() == 0) return;
    const bool exclusive = exclusive_;
    // Positions along the axis are visited first to last, or last to first when reversed.
    const int64_t first = reverse_ ? n - 1 : 0;
    const int64_t step = reverse_ ? -1 : 1;

    dispatch(CumTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* src = x.data<const T>();
      T* dst = out.data<T>();
      if (inner == 1) {
        parallel_for(outer, grain_for(n), [&](int64_t begin, int64_t end) {
          for (int64_t o = begin; o < end; ++o) {
            const T* s = src + o * n;
            T* d = dst + o * n;
            C acc = Op::template identity<C>();
            for (int64_t j = 0, p = first; j < n; ++j, p += step) {
              const C v = static_cast<C>(s[p]);
              if (exclusive) {
                d[p] = from_compute<T>(acc);
                acc = Op::apply(acc, v);
              } else {
                acc = Op::apply(acc, v);
                d[p] = from_compute<T>(acc);
              }
            }
          }
        });
        return;
      }
      // Rows of `inner` elements are combined elementwise; accumulators live per column.
      constexpr int64_t kBlock = 256;
      const int64_t blocks = (inner + kBlock - 1) / kBlock;
      parallel_for(outer * blocks, grain_for(n * std::min(inner, kBlock)),
                   [&](int64_t begin, int64_t end) {
                     C acc[kBlock];
                     for (int64_t w = begin; w < end; ++w) {
                       const int64_t o = w / blocks, i0 = (w % blocks) * kBlock;
                       const int64_t cols = std::min(kBlock, inner - i0);
                       std::fill_n(acc, cols, Op::template identity<C>());
                       for (int64_t j = 0, p = first; j < n; ++j, p += step) {
                         const T* s = src + (o * n + p) * inner + i0;
                         T* d = dst + (o * n + p) * inner + i0;
                         for (int64_t c = 0; c < cols; ++c) {
                           const C v = static_cast<C>(s[c]);
                           if (exclusive) {
                             d[c] = from_compute<T>(acc[c]);
                             acc[c] = Op::apply(acc[c], v);
                           } else {
                             acc[c] = Op::apply(acc[c], v);
                             d[c] = from_compute<T>(acc[c]);
                           }
                         }
                       }
                     }
                   });
    });
  }

 private:
  bool exclusive_, reverse_;
};

}  // namespace

KILN_REGISTER_OP({.op = "CumSum",
                  .since = 11,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16, int32, int64, uint32, uint64",
                  .shape = same_shape,
                  .create = make<Cumulative<SumOp>>});
KILN_REGISTER_OP({.op = "CumProd",
                  .since = 26,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16, int32, int64, uint32, uint64",
                  .shape = same_shape,
                  .create = make<Cumulative<ProdOp>>});

}  // namespace kiln::ops
