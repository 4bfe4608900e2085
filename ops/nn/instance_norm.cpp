// InstanceNormalization: every (image, channel) plane is normalised by its own mean and
// variance, then scaled and shifted per channel. Planes run in parallel; Y may be written
// over X (each plane's statistics are read before it is overwritten).
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class InstanceNormalization final : public Kernel {
 public:
  explicit InstanceNormalization(const NodeInfo& info)
      : epsilon_(info.attr_float("epsilon", 1e-5f)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor& bias = ctx.input(2);
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    const int64_t channels = x.dim(1);
    if (scale.numel() != channels || bias.numel() != channels) {
      ctx.fail("scale " + scale.describe() + " and bias " + bias.describe() + " must have " +
               std::to_string(channels) + " values");
    }
    if (scale.dtype() != x.dtype() || bias.dtype() != x.dtype()) {
      ctx.fail("inputs have different element types");
    }
    const int64_t planes = x.dim(0) * channels;
    const int64_t size = planes == 0 ? 0 : x.numel() / planes;
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    const double eps = epsilon_;
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* in = x.data<const T>();
      const T* sc = scale.data<const T>();
      const T* bi = bias.data<const T>();
      T* out = y.data<T>();
      parallel_for(planes, grain_for(3 * size), [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) {
          const T* src = in + p * size;
          double sum = 0, sq = 0;
          for (int64_t i = 0; i < size; ++i) sum += static_cast<double>(static_cast<C>(src[i]));
          const double mean = size > 0 ? sum / static_cast<double>(size) : 0;
          for (int64_t i = 0; i < size; ++i) {
            const double d = static_cast<double>(static_cast<C>(src[i])) - mean;
            sq += d * d;
          }
          const double var = size > 0 ? sq / static_cast<double>(size) : 0;
          const int64_t c = p % channels;
          const double a = static_cast<double>(static_cast<C>(sc[c])) / std::sqrt(var + eps);
          const C ac = static_cast<C>(a);
          const C bc = static_cast<C>(static_cast<double>(static_cast<C>(bi[c])) - mean * a);
          T* dst = out + p * size;
          for (int64_t i = 0; i < size; ++i)
            dst[i] = from_compute<T>(ac * static_cast<C>(src[i]) + bc);
        }
      });
    });
  }

 private:
  float epsilon_;
};

}  // namespace

KILN_REGISTER_OP({.op = "InstanceNormalization",
                  .since = 1,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16",
                  .shape = same_shape,
                  .create = make<InstanceNormalization>});

}  // namespace kiln::ops
