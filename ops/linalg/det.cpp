// Det: determinants of the square matrices in the last two dimensions of a [..., M, M]
// tensor, by Eigen's partial-pivoting LU (closed forms up to 4x4). Half types are widened
// to float one matrix at a time.
#include <Eigen/Core>
#include <Eigen/LU>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

template <typename C>
using RowMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

class Det final : public Kernel {
 public:
  explicit Det(const NodeInfo&) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const size_t r = x.rank();
    if (r < 2 || x.dim(r - 1) != x.dim(r - 2)) {
      ctx.fail("input must be [..., M, M], got " + x.describe());
    }
    const int64_t m = x.dim(r - 1);
    const Shape batch_shape(x.shape().begin(), x.shape().end() - 2);
    Tensor& y = ctx.output(0, x.dtype(), batch_shape);
    const int64_t batch = shape_numel(batch_shape);
    if (batch == 0) return;
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* in = x.data<const T>();
      T* out = y.data<T>();
      parallel_for(batch, grain_for(m > (1 << 20) ? INT64_MAX : m * m * m + 1),
                   [&](int64_t b0, int64_t b1) {
                     std::vector<C> widened;
                     for (int64_t b = b0; b < b1; ++b) {
                       const T* mat = in + b * m * m;
                       if constexpr (std::is_same_v<T, C>) {
                         out[b] = Eigen::Map<const RowMat<C>>(mat, m, m).determinant();
                       } else {
                         widened.assign(mat, mat + m * m);
                         out[b] = from_compute<T>(
                             Eigen::Map<const RowMat<C>>(widened.data(), m, m).determinant());
                       }
                     }
                   });
    });
  }
};

void det_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const size_t r = x.size();
  if (r < 2 || x[r - 1] != x[r - 2]) unknown("input must be [..., M, M]");
  c.set(0, c.dtype(0), Shape(x.begin(), x.end() - 2));
}

}  // namespace

KILN_REGISTER_OP({.op = "Det",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = det_shape,
                  .create = make<Det>});

}  // namespace kiln::ops
