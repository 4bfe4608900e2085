// Softmax, LogSoftmax and Hardmax.
//
// Before opset 13 the input is seen as a 2-D matrix [prod(shape[:axis]), prod(shape[axis:])]
// and each row is normalised; from opset 13 only `axis` is. Either way the input is viewed
// as [outer, n, inner]. With inner == 1 (the transformer case: the last axis) every row is
// contiguous and is normalised by the dispatched row kernels (ops/math/impl/vecmath_rows.h) in
// float, Eigen in double; rows may also come from a strided view as long as each row is
// contiguous. Otherwise blocks of up to kCols columns are normalised together, each step a
// vectorised operation along the contiguous inner axis (exp and log by the dispatched
// kernels in float). Half types are computed in float through a per-task scratch buffer.
// Tasks hold at least kTaskElements elements.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/core/common.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

enum class Mode { Softmax, LogSoftmax, Hardmax };

template <typename C>
using Arr = Eigen::Array<C, Eigen::Dynamic, 1>;
template <typename C>
using ConstMap = Eigen::Map<const Arr<C>>;
template <typename C>
using MutMap = Eigen::Map<Arr<C>>;

// One contiguous row. `y` may be `x`: every element is read before it is written.
constexpr int64_t kTaskElements = 16384;

template <Mode M, typename C>
void row(const C* x, C* y, int64_t n) {
  if constexpr (M != Mode::Hardmax && std::is_same_v<C, float>) {
    const math::VecMathKernels& vm = math::kernels().vec;
    (M == Mode::Softmax ? vm.softmax : vm.log_softmax)(x, y, n);
    return;
  }
  ConstMap<C> xm(x, n);
  MutMap<C> ym(y, n);
  if constexpr (M == Mode::Hardmax) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (x[i] > x[best]) best = i;
    }
    ym.setZero();
    y[best] = C(1);
  } else {
    const C m = xm.maxCoeff();
    if constexpr (M == Mode::Softmax) {
      ym = (xm - m).exp();
      ym *= C(1) / ym.sum();
    } else {
      const C log_sum = std::log((xm - m).exp().sum());
      ym = (xm - m) - log_sum;
    }
  }
}

constexpr int64_t kCols = 256;

// `cols` adjacent columns of n rows that are `stride` apart (the inner axis).
template <Mode M, typename C>
void columns(const C* x, C* y, int64_t n, int64_t stride, int64_t cols) {
  alignas(64) C mbuf[kCols];
  alignas(64) C sbuf[kCols];
  MutMap<C> m(mbuf, cols);
  MutMap<C> s(sbuf, cols);
  if constexpr (M == Mode::Hardmax) {
    int64_t best[kCols] = {};
    for (int64_t j = 0; j < cols; ++j) mbuf[j] = x[j];
    for (int64_t i = 1; i < n; ++i) {
      const C* xi = x + i * stride;
      for (int64_t j = 0; j < cols; ++j) {
        if (xi[j] > mbuf[j]) {
          mbuf[j] = xi[j];
          best[j] = i;
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      C* yi = y + i * stride;
      for (int64_t j = 0; j < cols; ++j) yi[j] = best[j] == i ? C(1) : C(0);
    }
  } else {
    m = ConstMap<C>(x, cols);
    for (int64_t i = 1; i < n; ++i) m = m.max(ConstMap<C>(x + i * stride, cols));
    s.setZero();
    if constexpr (std::is_same_v<C, float>) {
      // exp(x - m) of each row through the vector kernel, into y (Softmax) or a scratch row
      // (LogSoftmax still reads x afterwards, and y may be x).
      const math::VecMathKernels& vm = math::kernels().vec;
      alignas(64) float tbuf[kCols];
      for (int64_t i = 0; i < n; ++i) {
        float* e = M == Mode::Softmax ? y + i * stride : tbuf;
        MutMap<C>(e, cols) = ConstMap<C>(x + i * stride, cols) - m;
        vm.exp(e, e, cols);
        s += MutMap<C>(e, cols);
      }
      if constexpr (M == Mode::Softmax) {
        s = s.inverse();
        for (int64_t i = 0; i < n; ++i) MutMap<C>(y + i * stride, cols) *= s;
      } else {
        vm.log(sbuf, sbuf, cols);
        for (int64_t i = 0; i < n; ++i) {
          MutMap<C>(y + i * stride, cols) = (ConstMap<C>(x + i * stride, cols) - m) - s;
        }
      }
    } else if constexpr (M == Mode::Softmax) {
      for (int64_t i = 0; i < n; ++i) {
        MutMap<C> yi(y + i * stride, cols);
        yi = (ConstMap<C>(x + i * stride, cols) - m).exp();
        s += yi;
      }
      s = s.inverse();
      for (int64_t i = 0; i < n; ++i) MutMap<C>(y + i * stride, cols) *= s;
    } else {
      for (int64_t i = 0; i < n; ++i) s += (ConstMap<C>(x + i * stride, cols) - m).exp();
      s = s.log();
      for (int64_t i = 0; i < n; ++i) {
        MutMap<C>(y + i * stride, cols) = (ConstMap<C>(x + i * stride, cols) - m) - s;
      }
    }
  }
}

// Element offset of each row of a strided tensor whose rows (dims [axis, rank)) are each
// contiguous; offsets come from the outer dims.
struct RowOffsets {
  std::vector<int64_t> dims, strides;
  int64_t operator()(int64_t r) const {
    int64_t off = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      off += (r % dims[d]) * strides[d];
      r /= dims[d];
    }
    return off;
  }
};

bool rows_contiguous(const Tensor& x, size_t axis) {
  int64_t expected = 1;
  for (size_t d = x.rank(); d-- > axis;) {
    if (x.dim(d) == 1) continue;
    if (x.strides()[d] != expected) return false;
    expected *= x.dim(d);
  }
  return true;
}

template <Mode M>
class SoftmaxKernel final : public Kernel {
 public:
  explicit SoftmaxKernel(const NodeInfo& info)
      : opset_(info.opset()), axis_(info.attr_int("axis", info.opset() >= 13 ? -1 : 1)) {}

  void run(OpContext& ctx) override {
    const Tensor& in = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(in.rank());
    // Before opset 13 axis == rank is accepted: every row then holds one element.
    const auto axis =
        static_cast<size_t>(opset_ < 13 && axis_ == rank ? rank : normalize_axis(axis_, rank));
    int64_t outer = 1, n = 1, inner = 1;
    for (size_t d = 0; d < in.rank(); ++d) {
      if (d < axis) {
        outer *= in.dim(d);
      } else if (d == axis || opset_ < 13) {
        n *= in.dim(d);
      } else {
        inner *= in.dim(d);
      }
    }
    dispatch(FloatTypes{}, in.dtype(), [&]<typename T>() {
      if (in.numel() == 0) {
        ctx.output(0, in.dtype(), in.shape());
        return;
      }
      if (in.is_contiguous()) {
        Tensor& y = ctx.output_reusing(0, 0, in.dtype(), in.shape());
        compute<T>(in.data<const T>(), y.data<T>(), outer, n, inner, RowOffsets{});
      } else if (inner == 1 && rows_contiguous(in, axis)) {
        RowOffsets offsets;
        for (size_t d = 0; d < axis; ++d) {
          offsets.dims.push_back(in.dim(d));
          offsets.strides.push_back(in.strides()[d]);
        }
        Tensor& y = ctx.output(0, in.dtype(), in.shape());
        compute<T>(in.data<const T>(), y.data<T>(), outer, n, inner, offsets);
      } else {
        const Tensor c = in.contiguous();
        ctx.count_copy(c.nbytes(), CopyCause::Contiguous);
        Tensor& y = ctx.output(0, in.dtype(), in.shape());
        compute<T>(c.data<const T>(), y.data<T>(), outer, n, inner, RowOffsets{});
      }
    });
  }

 private:
  // `src_rows` maps a row to its element offset when the source is a strided view.
  template <typename T>
  static void compute(const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
                      const RowOffsets& src_rows) {
    using C = compute_t<T>;
    constexpr bool kConvert = !std::is_same_v<T, C>;
    if (inner == 1) {
      const bool strided = !src_rows.dims.empty();
      parallel_for(outer, grain_for(n, kTaskElements), [&](int64_t r0, int64_t r1) {
        std::vector<C> scratch(kConvert ? static_cast<size_t>(n) : 0);
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = x + (strided ? src_rows(r) : r * n);
          T* yr = y + r * n;
          if constexpr (kConvert) {
            for (int64_t i = 0; i < n; ++i) scratch[static_cast<size_t>(i)] = xr[i];
            row<M, C>(scratch.data(), scratch.data(), n);
            for (int64_t i = 0; i < n; ++i) yr[i] = T(scratch[static_cast<size_t>(i)]);
          } else {
            row<M, C>(xr, yr, n);
          }
        }
      });
      return;
    }
    const int64_t chunks = (inner + kCols - 1) / kCols;
    parallel_for(outer * chunks, grain_for(n * std::min(inner, kCols), kTaskElements),
                 [&](int64_t i0, int64_t i1) {
                   std::vector<C> scratch(kConvert ? static_cast<size_t>(n * kCols) : 0);
                   for (int64_t item = i0; item < i1; ++item) {
                     const int64_t o = item / chunks;
                     const int64_t j0 = (item % chunks) * kCols;
                     const int64_t cols = std::min(kCols, inner - j0);
                     const int64_t base = o * n * inner + j0;
                     if constexpr (kConvert) {
                       for (int64_t i = 0; i < n; ++i) {
                         for (int64_t j = 0; j < cols; ++j) {
                           scratch[static_cast<size_t>(i * cols + j)] = x[base + i * inner + j];
                         }
                       }
                       columns<M, C>(scratch.data(), scratch.data(), n, cols, cols);
                       for (int64_t i = 0; i < n; ++i) {
                         for (int64_t j = 0; j < cols; ++j) {
                           y[base + i * inner + j] = T(scratch[static_cast<size_t>(i * cols + j)]);
                         }
                       }
                     } else {
                       columns<M, C>(x + base, y + base, n, inner, cols);
                     }
                   }
                 });
  }

  int64_t opset_;
  int64_t axis_;
};

}  // namespace

KILN_REGISTER_OP({.op = "Softmax",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<SoftmaxKernel<Mode::Softmax>>});
KILN_REGISTER_OP({.op = "LogSoftmax",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<SoftmaxKernel<Mode::LogSoftmax>>});
KILN_REGISTER_OP({.op = "Hardmax",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<SoftmaxKernel<Mode::Hardmax>>});

}  // namespace kiln::ops
