// GroupNormalization (opsets 18 and 21).
//
// X is [N, C, D1, ...]; the C channels form num_groups groups of adjacent channels, and the
// statistics of each (instance, group) block are taken over its channels and spatial
// positions, which are contiguous. Opset 18 gives scale and bias per group, opset 21 per
// channel. Blocks are normalised in parallel; half types compute in float.
#include <Eigen/Core>
#include <cmath>
#include <string>
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

template <typename C>
std::vector<C> to_compute(const Tensor& t) {
  std::vector<C> out(static_cast<size_t>(t.numel()));
  dispatch(FloatTypes{}, t.dtype(), [&]<typename S>() {
    const Tensor c = t.contiguous();
    const S* p = c.data<const S>();
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = static_cast<C>(static_cast<compute_t<S>>(p[i]));
  });
  return out;
}

class GroupNorm final : public Kernel {
 public:
  explicit GroupNorm(const NodeInfo& info)
      : opset_(info.opset()),
        groups_(info.attr_int("num_groups")),
        epsilon_(info.attr_float("epsilon", 1e-5f)) {
    if (groups_ <= 0) info.fail("num_groups must be positive");
    if (!(epsilon_ >= 0)) info.fail("epsilon must be non-negative");
    const int64_t stash = info.attr_int("stash_type", 1);
    if (stash != 1 && stash != 11 && stash != 10 && stash != 16) {
      info.fail("stash_type must be a float type", ErrorKind::Unsupported);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor& bias = ctx.input(2);
    if (x.rank() < 2) ctx.fail("X must have at least 2 dims, got " + x.describe());
    const int64_t batch = x.dim(0), channels = x.dim(1);
    if (channels % groups_ != 0) {
      ctx.fail("num_groups " + std::to_string(groups_) + " does not divide the " +
               std::to_string(channels) + " channels");
    }
    int64_t spatial = 1;
    for (size_t d = 2; d < x.rank(); ++d) spatial *= x.dim(d);
    // Opset 21 has one scale per channel; opset 18 one per group (per channel is accepted too).
    const bool per_channel = opset_ >= 21 || scale.numel() != groups_;
    const int64_t expected = per_channel ? channels : groups_;
    if (scale.numel() != expected || bias.numel() != expected || scale.rank() != 1 ||
        bias.rank() != 1) {
      ctx.fail("scale and bias must have shape [" + std::to_string(expected) + "], got " +
               scale.describe() + " and " + bias.describe());
    }
    const int64_t cpg = channels / groups_;
    const int64_t block = cpg * spatial;
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const std::vector<C> s = to_compute<C>(scale);
      const std::vector<C> b = to_compute<C>(bias);
      Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      const C eps = static_cast<C>(epsilon_);
      parallel_for(batch * groups_, grain_for(block * 6), [&](int64_t i0, int64_t i1) {
        std::vector<C> scratch(std::is_same_v<T, C> ? 0 : static_cast<size_t>(block));
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t g = i % groups_;
          const C* xb;
          C* yb;
          if constexpr (std::is_same_v<T, C>) {
            xb = src + i * block;
            yb = dst + i * block;
          } else {
            for (int64_t k = 0; k < block; ++k)
              scratch[static_cast<size_t>(k)] = src[i * block + k];
            xb = yb = scratch.data();
          }
          ConstMap<C> xm(xb, block);
          const C mu = xm.sum() / static_cast<C>(block);
          const C inv = C(1) / std::sqrt((xm - mu).square().sum() / static_cast<C>(block) + eps);
          for (int64_t c = 0; c < cpg; ++c) {
            const auto p = static_cast<size_t>(per_channel ? g * cpg + c : g);
            const C a = inv * s[p];
            const C shift = b[p] - mu * a;
            MutMap<C>(yb + c * spatial, spatial) =
                ConstMap<C>(xb + c * spatial, spatial) * a + shift;
          }
          if constexpr (!std::is_same_v<T, C>) {
            for (int64_t k = 0; k < block; ++k)
              dst[i * block + k] = T(scratch[static_cast<size_t>(k)]);
          }
        }
      });
    });
  }

 private:
  int64_t opset_;
  int64_t groups_;
  float epsilon_;
};

void group_norm_shape(ShapeContext& c) {
  if (c.shape(0).size() < 2) unknown("X must have at least 2 dims");
  same_shape(c);
}

}  // namespace

KILN_REGISTER_OP({.op = "GroupNormalization",
                  .since = 18,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16",
                  .shape = group_norm_shape,
                  .create = make<GroupNorm>});

}  // namespace kiln::ops
