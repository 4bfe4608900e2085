// LRN: local response normalisation across channels,
//   y = x / (bias + alpha / size * sum of x^2 over the `size` neighbouring channels)^beta.
// Work is split over (image, block of spatial positions); each block walks the channels.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class LRN final : public Kernel {
 public:
  explicit LRN(const NodeInfo& info)
      : size_(info.attr_int("size")),
        alpha_(info.attr_float("alpha", 1e-4f)),
        beta_(info.attr_float("beta", 0.75f)),
        bias_(info.attr_float("bias", 1.0f)) {
    if (size_ < 1) info.fail("size must be positive");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    const int64_t n = x.dim(0), channels = x.dim(1);
    const int64_t inner = n * channels == 0 ? 0 : x.numel() / (n * channels);
    const int64_t before = (size_ - 1) / 2, after = size_ - 1 - before;
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* in = x.data<const T>();
      T* out = y.data<T>();
      const C scale = static_cast<C>(alpha_) / static_cast<C>(size_);
      const C bias = static_cast<C>(bias_), beta = static_cast<C>(beta_);
      parallel_for(n * blocks, grain_for(channels * kBlock * (size_ + 4)),
                   [&](int64_t lo, int64_t hi) {
                     C sums[kBlock];
                     for (int64_t t = lo; t < hi; ++t) {
                       const int64_t b = t / blocks, s0 = (t % blocks) * kBlock;
                       const int64_t len = std::min(kBlock, inner - s0);
                       const T* xb = in + b * channels * inner + s0;
                       T* yb = out + b * channels * inner + s0;
                       for (int64_t c = 0; c < channels; ++c) {
                         std::fill(sums, sums + len, C(0));
                         const int64_t c0 = std::max<int64_t>(0, c - before);
                         const int64_t c1 = std::min(channels - 1, c + after);
                         for (int64_t k = c0; k <= c1; ++k) {
                           const T* row = xb + k * inner;
                           for (int64_t i = 0; i < len; ++i) {
                             const C v = static_cast<C>(row[i]);
                             sums[i] += v * v;
                           }
                         }
                         const T* row = xb + c * inner;
                         T* dst = yb + c * inner;
                         for (int64_t i = 0; i < len; ++i) {
                           dst[i] = from_compute<T>(static_cast<C>(row[i]) /
                                                    std::pow(bias + scale * sums[i], beta));
                         }
                       }
                     }
                   });
    });
  }

 private:
  int64_t size_;
  float alpha_, beta_, bias_;
};

}  // namespace

KILN_REGISTER_OP({.op = "LRN",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<LRN>});

}  // namespace kiln::ops
