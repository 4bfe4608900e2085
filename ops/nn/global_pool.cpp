// GlobalAveragePool, GlobalMaxPool and GlobalLpPool: one value per (image, channel) plane,
// reduced over all spatial dimensions (float averages with the vector sum). Planes run in
// parallel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "ops/core/common.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

enum class GlobalKind { Average, Max, Lp };

template <GlobalKind kKind>
class GlobalPool final : public Kernel {
 public:
  explicit GlobalPool(const NodeInfo& info) {
    if constexpr (kKind == GlobalKind::Lp) {
      // GlobalLpPool-1 had a float p; later versions an int.
      const ir::Attribute* a = info.attr("p");
      p_ = !a ? 2.0f : a->kind == ir::AttrKind::Float ? a->f : static_cast<float>(a->i);
      if (!(p_ > 0)) info.fail("p must be positive");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    Shape shape{x.dim(0), x.dim(1)};
    shape.resize(x.rank(), 1);
    const int64_t planes = x.dim(0) * x.dim(1);
    const int64_t size = planes == 0 ? 0 : x.numel() / planes;
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* in = x.data<const T>();
      T* out = ctx.output(0, x.dtype(), shape).template data<T>();
      const C p = static_cast<C>(p_);
      if constexpr (std::is_same_v<T, float> && kKind == GlobalKind::Average) {
        if (size > 0) {
          plane_means(in, planes, size, out);
          return;
        }
      }
      parallel_for(planes, grain_for(size), [&](int64_t lo, int64_t hi) {
        for (int64_t pl = lo; pl < hi; ++pl) {
          const T* v = in + pl * size;
          C r = 0;
          if constexpr (kKind == GlobalKind::Max) {
            r = -std::numeric_limits<C>::infinity();
            for (int64_t i = 0; i < size; ++i) r = std::max(r, static_cast<C>(v[i]));
          } else if constexpr (kKind == GlobalKind::Average) {
            for (int64_t i = 0; i < size; ++i) r += static_cast<C>(v[i]);
            r = size > 0 ? r / static_cast<C>(size) : C(0);
          } else {
            for (int64_t i = 0; i < size; ++i) r += std::pow(std::abs(static_cast<C>(v[i])), p);
            r = std::pow(r, C(1) / p);
          }
          out[pl] = from_compute<T>(r);
        }
      });
    });
  }

 private:
  float p_ = 2;
};

void global_pool_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  if (x.ranked && x.shape.size() < 2) unknown("rank below 2");
  ValueFacts out = typed_facts(x.dtype);
  if (x.ranked) {
    out = sub_shape(x, 0, 2);
    out.dtype = x.dtype;
    for (size_t k = 2; k < x.shape.size(); ++k) append_dim(out, 1);
  }
  c.set(0, std::move(out));
}

}  // namespace

void plane_means(const float* x, int64_t planes, int64_t size, float* y) {
  const math::VecMathKernels& vec = math::kernels().vec;
  const float scale = 1.0f / static_cast<float>(size);
  parallel_for(planes, grain_for(size), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) y[p] = vec.sum(x + p * size, size) * scale;
  });
}

#define KILN_GLOBAL_POOL(name, kind)                             \
  KILN_REGISTER_OP({.op = name,                                  \
                    .since = 1,                                  \
                    .min_inputs = 1,                             \
                    .max_inputs = 1,                             \
                    .min_outputs = 1,                            \
                    .max_outputs = 1,                            \
                    .types = "float, double, float16, bfloat16", \
                    .shape = global_pool_shape,                  \
                    .create = make<GlobalPool<kind>>})
KILN_GLOBAL_POOL("GlobalAveragePool", GlobalKind::Average);
KILN_GLOBAL_POOL("GlobalMaxPool", GlobalKind::Max);
KILN_GLOBAL_POOL("GlobalLpPool", GlobalKind::Lp);
#undef KILN_GLOBAL_POOL

}  // namespace kiln::ops
