// kiln.ChannelAffine(X, scale, shift): Y = activation(X * scale[c] + shift[c]), c the index
// along axis 1 of X (rank >= 2), scale and shift C float values each.
//
// The graph optimizer writes it for a chain of per-channel affine ops over a tensor that no
// convolution produced (DenseNet's BatchNormalization -> Mul -> Add -> Relu before each dense
// layer reads a Concat), with the chain's scales and shifts composed in double at load: one
// pass over the tensor instead of one per op. The `activation` attribute is that of
// kiln.FusedConv (Relu applied in the same vector loop; the others to each channel's plane
// while it is in cache). Y may be written over X.
#include <algorithm>
#include <string>

#include "ops/core/common.h"
#include "ops/elementwise/activation.h"
#include "ops/math/kernels.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

// The work of one element for the threading policy, in multiply-adds: the affine step, and
// about what the vector math of the transcendental activations costs.
constexpr double kAffineWork = 1;
constexpr double kActivationWork = 16;

class ChannelAffine final : public Kernel {
 public:
  explicit ChannelAffine(const NodeInfo& info) : activation_(parse_activation(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::Float) {
      ctx.fail("input must be float, got " + x.describe(), ErrorKind::Unsupported);
    }
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    const int64_t channels = x.dim(1);
    const float* scale = parameter(ctx, 1, channels, x);
    const float* shift = parameter(ctx, 2, channels, x);
    Tensor& y = ctx.output_reusing(0, 0, DataType::Float, x.shape());
    const int64_t n = x.numel();
    if (n == 0) return;
    int64_t inner = 1;
    for (size_t d = 2; d < x.rank(); ++d) inner *= x.dim(d);
    const float* px = x.data<const float>();
    float* py = y.data<float>();
    const math::MathKernels& k = math::kernels();
    const bool relu = activation_ == math::Activation::Relu;
    const bool other = activation_ != math::Activation::None && !relu;
    const double work =
        static_cast<double>(n) * (other ? kAffineWork + kActivationWork : kAffineWork);
    const int tasks = math::task_count(work);
    // Elements [e0, e1) in runs of one channel: a plane (one scale and shift) when the
    // channels have spatial positions, else a row of channels (one of each per element).
    auto span = [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1;) {
        int64_t len = 0;
        if (inner > 1) {
          const int64_t c = e / inner % channels;
          len = std::min(inner - e % inner, e1 - e);
          k.binary.affine(px + e, scale + c, shift + c, 0, py + e, len, relu);
        } else {
          const int64_t c = e % channels;
          len = std::min(channels - c, e1 - e);
          k.binary.affine(px + e, scale + c, shift + c, 1, py + e, len, relu);
        }
        if (other) apply_activation(activation_, py + e, len);
        e += len;
      }
    };
    // Task edges on whole cache lines, so no two tasks write one.
    constexpr int kLine = 16;
    math::run_tasks(tasks, [&](int t) {
      span(math::part_edge(t, tasks, n, kLine), math::part_edge(t + 1, tasks, n, kLine));
    });
  }

 private:
  // Input i as `channels` contiguous floats.
  static const float* parameter(OpContext& ctx, size_t i, int64_t channels, const Tensor& x) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != DataType::Float || t.numel() != channels) {
      ctx.fail(std::string(i == 1 ? "scale " : "shift ") + t.describe() + " must hold " +
               std::to_string(channels) + " floats, one per channel of " + x.describe());
    }
    return t.data<const float>();
  }

  math::Activation activation_;
};

}  // namespace

KILN_REGISTER_OP({.domain = "kiln",
                  .op = "ChannelAffine",
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float",
                  .shape = same_shape,
                  .create = make<ChannelAffine>});

}  // namespace kiln::ops
