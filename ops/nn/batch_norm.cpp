// BatchNormalization: y = scale * (x - mean) / sqrt(var + epsilon) + bias per channel.
//
// Inference folds the four parameter vectors into one multiply-add per channel and may
// write over X. Training mode (training_mode = 1 from opset 14; extra outputs requested
// before that) normalises with the batch statistics and also returns the updated running
// mean and variance.
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

std::vector<double> read_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  dispatch(FloatTypes{}, t.dtype(), [&]<typename T>() {
    const T* p = t.data<const T>();
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
  });
  return v;
}

void write_values(Tensor& t, const std::vector<double>& v) {
  dispatch(FloatTypes{}, t.dtype(), [&]<typename T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = from_compute<T>(static_cast<compute_t<T>>(v[i]));
  });
}

class BatchNormalization final : public Kernel {
 public:
  explicit BatchNormalization(const NodeInfo& info)
      : epsilon_(info.attr_float("epsilon", 1e-5f)),
        momentum_(info.attr_float("momentum", 0.9f)),
        spatial_(info.opset() >= 9 || info.attr_int("spatial", 1) != 0) {
    training_ = info.opset() >= 14 ? info.attr_int("training_mode", 0) != 0
                                   : info.num_outputs() > 1 && info.has_output(1);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    const int64_t n = x.dim(0);
    // Parameters are per channel, or per (channel, position) when spatial = 0.
    int64_t channels = x.dim(1), inner = 1;
    for (size_t d = 2; d < x.rank(); ++d) inner *= x.dim(d);
    if (!spatial_) {
      channels *= inner;
      inner = 1;
    }
    std::vector<std::vector<double>> params;
    for (size_t i = 1; i <= 4; ++i) {
      const Tensor& t = ctx.input(i);
      if (t.numel() != channels) {
        ctx.fail("parameter " + std::to_string(i) + " " + t.describe() + " must have " +
                 std::to_string(channels) + " values for input " + x.describe());
      }
      params.push_back(read_values(t));
    }
    const auto& scale = params[0];
    const auto& bias = params[1];
    std::vector<double> mean = params[2], var = params[3];
    if (training_) batch_statistics(x, n, channels, inner, mean, var);

    std::vector<double> a(static_cast<size_t>(channels)), b(a.size());
    for (size_t c = 0; c < a.size(); ++c) {
      a[c] = scale[c] / std::sqrt(var[c] + static_cast<double>(epsilon_));
      b[c] = bias[c] - mean[c] * a[c];
    }
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* in = x.data<const T>();
      T* out = y.data<T>();
      parallel_for(n * channels, grain_for(inner), [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) {
          const size_t c = static_cast<size_t>(p % channels);
          const C ac = static_cast<C>(a[c]), bc = static_cast<C>(b[c]);
          const T* src = in + p * inner;
          T* dst = out + p * inner;
          for (int64_t i = 0; i < inner; ++i)
            dst[i] = from_compute<T>(ac * static_cast<C>(src[i]) + bc);
        }
      });
    });

    if (training_) {
      // Running statistics: momentum * input + (1 - momentum) * batch statistic.
      const double m = momentum_;
      const auto& in_mean = params[2];
      const auto& in_var = params[3];
      std::vector<double> run_mean(mean.size()), run_var(var.size());
      for (size_t c = 0; c < mean.size(); ++c) {
        run_mean[c] = in_mean[c] * m + mean[c] * (1 - m);
        run_var[c] = in_var[c] * m + var[c] * (1 - m);
      }
      const std::vector<double>* values[] = {&run_mean, &run_var, &mean, &var};
      for (size_t o = 1; o < ctx.num_outputs() && o <= 4; ++o) {
        if (!ctx.has_output(o)) continue;
        const Tensor& like = ctx.input(o <= 2 ? 2 + (o - 1) : 2 + (o - 3));
        write_values(ctx.output(o, like.dtype(), like.shape()), *values[o - 1]);
      }
    }
  }

 private:
  // Mean and (population) variance of every channel over the batch and spatial positions.
  static void batch_statistics(const Tensor& x, int64_t n, int64_t channels, int64_t inner,
                               std::vector<double>& mean, std::vector<double>& var) {
    const double count = static_cast<double>(n * inner);
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      const T* in = x.data<const T>();
      parallel_for(channels, grain_for(n * inner), [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) {
          double sum = 0, sq = 0;
          for (int64_t b = 0; b < n; ++b) {
            const T* src = in + (b * channels + c) * inner;
            for (int64_t i = 0; i < inner; ++i)
              sum += static_cast<double>(static_cast<compute_t<T>>(src[i]));
          }
          const double mu = count > 0 ? sum / count : 0;
          for (int64_t b = 0; b < n; ++b) {
            const T* src = in + (b * channels + c) * inner;
            for (int64_t i = 0; i < inner; ++i) {
              const double d = static_cast<double>(static_cast<compute_t<T>>(src[i])) - mu;
              sq += d * d;
            }
          }
          mean[static_cast<size_t>(c)] = mu;
          var[static_cast<size_t>(c)] = count > 0 ? sq / count : 0;
        }
      });
    });
  }

  float epsilon_, momentum_;
  bool spatial_, training_ = false;
};

// Inference mode only: the training-mode statistics are not inferred.
void batch_norm_shape(ShapeContext& c) {
  for (size_t i = 1; i < c.num_outputs(); ++i)
    if (c.has_output(i)) unknown("training-mode outputs");
  same_shape(c);
}

}  // namespace

KILN_REGISTER_OP({.op = "BatchNormalization",
                  .since = 1,
                  .min_inputs = 5,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 5,
                  .in_place = inputs(0),
                  .types = "float, double, float16, bfloat16 (parameters any float type)",
                  .shape = batch_norm_shape,
                  .create = make<BatchNormalization>});

}  // namespace kiln::ops
