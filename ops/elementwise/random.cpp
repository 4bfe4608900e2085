// Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli and Multinomial.
// Each node owns a 64-bit Mersenne Twister, seeded from the `seed` attribute when given
// (so a seeded node repeats its sequence across sessions) or from std::random_device. The
// state advances from run to run. Draws are made in double with explicit formulas (not
// std:: distributions) so that a seed gives the same values with any standard library.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <mutex>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class Generator {
 public:
  explicit Generator(const NodeInfo& info) {
    if (info.has_attr("seed")) {
      const float seed = info.attr_float("seed");
      gen_.seed(static_cast<uint64_t>(std::bit_cast<uint32_t>(seed)));
    } else {
      std::random_device rd;
      gen_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
    }
  }
  // Fills `n` values: uniform in [0, 1), or standard normal.
  std::vector<double> uniform(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> v(static_cast<size_t>(n));
    for (double& d : v) d = next();
    return v;
  }
  std::vector<double> normal(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i += 2) {  // Box-Muller: two normals per pair of uniforms
      const double u1 = 1.0 - next(), u2 = next();
      const double rad = std::sqrt(-2.0 * std::log(u1)), a = 2 * std::numbers::pi * u2;
      v[static_cast<size_t>(i)] = rad * std::cos(a);
      if (i + 1 < n) v[static_cast<size_t>(i + 1)] = rad * std::sin(a);
    }
    return v;
  }

 private:
  double next() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  std::mutex mutex_;
  std::mt19937_64 gen_;
};

void write_doubles(Tensor& out, const std::vector<double>& v) {
  dispatch(
      TypeList<float, double, float16, bfloat16, int8_t, int16_t, int32_t, int64_t, uint8_t,
               uint16_t, uint32_t, uint64_t, bool>{},
      out.dtype(),
      [&]<typename T>() {
        T* p = out.data<T>();
        for (size_t i = 0; i < v.size(); ++i) {
          if constexpr (std::is_same_v<T, bool>) {
            p[i] = v[i] != 0;
          } else {
            p[i] = from_compute<T>(static_cast<compute_t<T>>(v[i]));
          }
        }
      },
      "output");
}

// The `dtype` attribute, else `fallback`; must be one of `allowed`.
template <typename... Ts>
DataType dtype_attr(const NodeInfo& info, DataType fallback, TypeList<Ts...> allowed) {
  if (!info.has_attr("dtype")) return fallback;
  const int64_t code = info.attr_int("dtype");
  if (code < 0 || code > INT32_MAX || !is_known_data_type(static_cast<int32_t>(code)) ||
      !type_in(allowed, static_cast<DataType>(code))) {
    info.fail("dtype " + std::to_string(code) + " is not supported", ErrorKind::Unsupported);
  }
  return static_cast<DataType>(code);
}

enum class Dist { Uniform, Normal };

// RandomUniform / RandomNormal (shape from the attribute) and their *Like variants (shape,
// and by default type, from the input).
template <Dist kDist, bool kLike>
class RandomFill final : public Kernel {
 public:
  explicit RandomFill(const NodeInfo& info)
      : gen_(info),
        dtype_(dtype_attr(info, kLike ? DataType::Undefined : DataType::Float, FloatTypes{})),
        a_(kDist == Dist::Uniform ? info.attr_float("low", 0.0f) : info.attr_float("mean", 0.0f)),
        b_(kDist == Dist::Uniform ? info.attr_float("high", 1.0f)
                                  : info.attr_float("scale", 1.0f)) {
    if constexpr (!kLike) {
      shape_ = info.attr_ints("shape");
      for (int64_t d : shape_) {
        if (d < 0) info.fail("shape must not have negative dimensions");
      }
    }
  }

  void run(OpContext& ctx) override {
    Shape shape = shape_;
    DataType dt = dtype_;
    if constexpr (kLike) {
      shape = ctx.input(0).shape();
      if (dt == DataType::Undefined) dt = ctx.input(0).dtype();
      if (!type_in(FloatTypes{}, dt)) throw_unsupported_type(dt, "output");
    }
    Tensor& y = ctx.output(0, dt, shape);
    std::vector<double> v =
        kDist == Dist::Uniform ? gen_.uniform(y.numel()) : gen_.normal(y.numel());
    for (double& d : v) d = kDist == Dist::Uniform ? a_ + (b_ - a_) * d : a_ + b_ * d;
    write_doubles(y, v);
  }

 private:
  Generator gen_;
  DataType dtype_;
  double a_, b_;
  Shape shape_;
};

// Bernoulli: 1 with probability p (the input), else 0.
class Bernoulli final : public Kernel {
 public:
  explicit Bernoulli(const NodeInfo& info)
      : gen_(info), dtype_(dtype_attr(info, DataType::Undefined, PodTypes{})) {}

  void run(OpContext& ctx) override {
    const Tensor& p = ctx.input(0);
    if (!type_in(FloatTypes{}, p.dtype())) throw_unsupported_type(p.dtype(), "input");
    const DataType dt = dtype_ == DataType::Undefined ? p.dtype() : dtype_;
    Tensor& y = ctx.output(0, dt, p.shape());
    std::vector<double> v = gen_.uniform(p.numel());
    dispatch(FloatTypes{}, p.dtype(), [&]<typename T>() {
      const T* prob = p.data<const T>();
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = v[i] < static_cast<double>(static_cast<compute_t<T>>(prob[i])) ? 1.0 : 0.0;
      }
    });
    write_doubles(y, v);
  }

 private:
  Generator gen_;
  DataType dtype_;
};

// Multinomial: `sample_size` class indices per row of unnormalised log-probabilities.
class Multinomial final : public Kernel {
 public:
  explicit Multinomial(const NodeInfo& info)
      : gen_(info),
        dtype_(dtype_attr(info, DataType::Int32, TypeList<int32_t, int64_t>{})),
        samples_(info.attr_int("sample_size", 1)) {
    if (samples_ < 0) info.fail("sample_size must not be negative");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 2) ctx.fail("input must be [batch, classes], got " + x.describe());
    if (!type_in(FloatTypes{}, x.dtype())) throw_unsupported_type(x.dtype(), "input");
    const int64_t batch = x.dim(0), classes = x.dim(1);
    Tensor& y = ctx.output(0, dtype_, {batch, samples_});
    if (y.numel() == 0) return;
    if (classes == 0) ctx.fail("cannot sample from zero classes");
    std::vector<double> logits(static_cast<size_t>(x.numel()));
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      const T* p = x.data<const T>();
      for (size_t i = 0; i < logits.size(); ++i) {
        logits[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
      }
    });
    std::vector<double> u = gen_.uniform(batch * samples_);
    std::vector<double> out(u.size());
    std::vector<double> cdf(static_cast<size_t>(classes));
    for (int64_t b = 0; b < batch; ++b) {
      const double* row = logits.data() + b * classes;
      const double mx = *std::max_element(row, row + classes);
      if (!std::isfinite(mx)) ctx.fail("each row needs a finite largest log-probability");
      double total = 0;
      for (int64_t c = 0; c < classes; ++c) {
        total += std::isnan(row[c]) ? 0.0 : std::exp(row[c] - mx);
        cdf[static_cast<size_t>(c)] = total;
      }
      for (int64_t s = 0; s < samples_; ++s) {
        const double target = u[static_cast<size_t>(b * samples_ + s)] * total;
        const auto it = std::upper_bound(cdf.begin(), cdf.end(), target);
        out[static_cast<size_t>(b * samples_ + s)] =
            static_cast<double>(std::min<int64_t>(it - cdf.begin(), classes - 1));
      }
    }
    write_doubles(y, out);
  }

 private:
  Generator gen_;
  DataType dtype_;
  int64_t samples_;
};

// dtype_attr as a shape rule reads it.
template <typename... Ts>
DataType dtype_attr(const ShapeContext& c, DataType fallback, TypeList<Ts...> allowed) {
  if (!c.has_attr("dtype")) return fallback;
  const int64_t code = c.attr_int("dtype", 0);
  if (code < 0 || code > INT32_MAX || !is_known_data_type(static_cast<int32_t>(code)) ||
      !type_in(allowed, static_cast<DataType>(code))) {
    unknown("dtype is not supported");
  }
  return static_cast<DataType>(code);
}

void random_fill_shape(ShapeContext& c) {
  const std::vector<int64_t> shape = c.attr_ints("shape");
  for (int64_t d : shape) {
    if (d < 0) unknown("negative dimension");
  }
  c.set(0, dtype_attr(c, DataType::Float, FloatTypes{}), shape);
}

void random_like_shape(ShapeContext& c) {
  DataType dt = dtype_attr(c, DataType::Undefined, FloatTypes{});
  if (dt == DataType::Undefined) dt = c.dtype(0);
  if (!type_in(FloatTypes{}, dt)) unknown("output type is not a float type");
  c.set(0, dt, c.shape(0));
}

void bernoulli_shape(ShapeContext& c) {
  if (!type_in(FloatTypes{}, c.dtype(0))) unknown("input is not a float type");
  const DataType dt = dtype_attr(c, DataType::Undefined, PodTypes{});
  c.set(0, dt == DataType::Undefined ? c.dtype(0) : dt, c.shape(0));
}

// sample_size draws per batch row.
void multinomial_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const int64_t samples = c.attr_int("sample_size", 1);
  if (x.size() != 2 || !type_in(FloatTypes{}, c.dtype(0)) || samples < 0) {
    unknown("input must be float [batch, classes]");
  }
  c.set(0, dtype_attr(c, DataType::Int32, TypeList<int32_t, int64_t>{}), {x[0], samples});
}

}  // namespace

KILN_REGISTER_OP({.op = "RandomUniform",
                  .since = 1,
                  .min_inputs = 0,
                  .max_inputs = 0,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .random = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = random_fill_shape,
                  .create = make<RandomFill<Dist::Uniform, false>>});
KILN_REGISTER_OP({.op = "RandomNormal",
                  .since = 1,
                  .min_inputs = 0,
                  .max_inputs = 0,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .random = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = random_fill_shape,
                  .create = make<RandomFill<Dist::Normal, false>>});
KILN_REGISTER_OP({.op = "RandomUniformLike",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .random = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = random_like_shape,
                  .create = make<RandomFill<Dist::Uniform, true>>});
KILN_REGISTER_OP({.op = "RandomNormalLike",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .random = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = random_like_shape,
                  .create = make<RandomFill<Dist::Normal, true>>});
KILN_REGISTER_OP({.op = "Bernoulli",
                  .since = 15,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .random = true,
                  .types = "float types in; numeric or bool out",
                  .shape = bernoulli_shape,
                  .create = make<Bernoulli>});
KILN_REGISTER_OP({.op = "Multinomial",
                  .since = 7,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .random = true,
                  .types = "float types in; int32, int64 out",
                  .shape = multinomial_shape,
                  .create = make<Multinomial>});

}  // namespace kiln::ops
