// Window functions (Hann, Hamming, Blackman) and MelWeightMatrix. Values are computed in
// double and converted to `output_datatype` (float unless set).
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// Numeric output types, converted from double the way numpy's astype does (truncation
// toward zero for integers; the values here are never out of an integer's range).
void write_doubles(Tensor& out, const std::vector<double>& v) {
  dispatch(
      NumericTypes{}, out.dtype(),
      [&]<typename T>() {
        T* p = out.data<T>();
        for (size_t i = 0; i < v.size(); ++i) {
          if constexpr (std::is_integral_v<T>) {
            const double t = std::trunc(v[i]);
            const double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
            p[i] = t >= static_cast<double>(std::numeric_limits<T>::min()) && t < hi
                       ? static_cast<T>(t)
                       : T(0);
          } else {
            p[i] = from_compute<T>(static_cast<compute_t<T>>(v[i]));
          }
        }
      },
      "output_datatype");
}

DataType output_type(const NodeInfo& info) {
  const int64_t code = info.attr_int("output_datatype", 1);
  if (code > INT32_MAX || code < 0 || !is_known_data_type(static_cast<int32_t>(code)) ||
      !type_in(NumericTypes{}, static_cast<DataType>(code))) {
    info.fail("output_datatype " + std::to_string(code) + " is not a numeric type",
              ErrorKind::Unsupported);
  }
  return static_cast<DataType>(code);
}

int64_t scalar_int(const OpContext& ctx, const Tensor& t, const char* what) {
  if (t.numel() != 1) ctx.fail(std::string(what) + " must hold one value, got " + t.describe());
  return to_int64s(t)[0];
}

enum class WindowKind { Hann, Hamming, Blackman };

// w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N = size (periodic) or size - 1.
template <WindowKind kKind>
class Window final : public Kernel {
 public:
  explicit Window(const NodeInfo& info)
      : dtype_(output_type(info)), periodic_(info.attr_int("periodic", 1) != 0) {}

  void run(OpContext& ctx) override {
    const int64_t size = scalar_int(ctx, ctx.input(0), "size");
    if (size < 0) ctx.fail("size must not be negative, got " + std::to_string(size));
    Tensor& out = ctx.output(0, dtype_, {size});
    double a0 = 0.5, a1 = 0.5, a2 = 0;
    if constexpr (kKind == WindowKind::Hamming) {
      a0 = 25.0 / 46.0;
      a1 = 1 - a0;
    } else if constexpr (kKind == WindowKind::Blackman) {
      a0 = 0.42;
      a2 = 0.08;
    }
    const double n = static_cast<double>(periodic_ ? size : size - 1);
    std::vector<double> v(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) {
      // A symmetric window of one point has N = 0; it is [1] as in torch and scipy.
      const double x = n == 0 ? 0 : 2 * std::numbers::pi * static_cast<double>(i) / n;
      v[static_cast<size_t>(i)] = a0 - a1 * std::cos(x) + a2 * std::cos(2 * x);
    }
    if (size == 1 && !periodic_) v[0] = 1;
    write_doubles(out, v);
  }

 private:
  DataType dtype_;
  bool periodic_;
};

// Python's float floor division (numpy's npy_divmod), which the reference uses to place
// the mel band edges on FFT bins.
double floor_div(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  double fl = std::floor(div);
  if (div - fl > 0.5) fl += 1;
  return fl;
}

// Triangular filters evenly spaced on the mel scale (2595 log10(1 + f / 700)), as a
// [dft_length / 2 + 1, num_mel_bins] matrix that maps a one-sided spectrum to mel bands.
class MelWeightMatrix final : public Kernel {
 public:
  explicit MelWeightMatrix(const NodeInfo& info) : dtype_(output_type(info)) {}

  void run(OpContext& ctx) override {
    const int64_t mels = scalar_int(ctx, ctx.input(0), "num_mel_bins");
    const int64_t dft = scalar_int(ctx, ctx.input(1), "dft_length");
    const int64_t rate = scalar_int(ctx, ctx.input(2), "sample_rate");
    if (ctx.input(3).numel() != 1 || ctx.input(4).numel() != 1) {
      ctx.fail("lower_edge_hertz and upper_edge_hertz must be scalars");
    }
    const double lower = scalar_as_double(ctx.input(3));
    const double upper = scalar_as_double(ctx.input(4));
    if (mels < 1 || dft < 1 || rate < 1 || mels > (int64_t{1} << 24) || dft > (int64_t{1} << 30)) {
      ctx.fail("num_mel_bins, dft_length and sample_rate must be positive");
    }
    if (!(lower >= 0) || !(upper >= lower) || !std::isfinite(upper)) {
      ctx.fail("need 0 <= lower_edge_hertz <= upper_edge_hertz");
    }
    const int64_t spectrum = dft / 2 + 1;
    if (spectrum > (int64_t{1} << 40) / mels) ctx.fail("output would be too large");
    auto to_mel = [](double hz) { return 2595 * std::log1p(hz / 700) / std::log(10.0); };
    const double low_mel = to_mel(lower), high_mel = to_mel(upper);
    const double step = (high_mel - low_mel) / static_cast<double>(mels + 2);
    std::vector<int64_t> edge(static_cast<size_t>(mels + 2));
    for (int64_t i = 0; i < mels + 2; ++i) {
      const double mel = static_cast<double>(i) * step + low_mel;
      const double hz = 700 * std::expm1(mel / 2595 * std::log(10.0));
      const double bin = floor_div(static_cast<double>(dft + 1) * hz, static_cast<double>(rate));
      if (!(bin >= 0) || bin >= static_cast<double>(spectrum)) {
        ctx.fail("upper_edge_hertz lies above the Nyquist frequency of sample_rate");
      }
      edge[static_cast<size_t>(i)] = static_cast<int64_t>(bin);
    }
    std::vector<double> w(static_cast<size_t>(spectrum * mels), 0.0);
    auto at = [&](int64_t bin, int64_t band) -> double& {
      return w[static_cast<size_t>(bin * mels + band)];
    };
    for (int64_t i = 0; i < mels; ++i) {
      const int64_t lo = edge[static_cast<size_t>(i)], mid = edge[static_cast<size_t>(i + 1)],
                    hi = edge[static_cast<size_t>(i + 2)];
      if (mid == lo) {
        at(mid, i) = 1;
      } else {
        for (int64_t j = lo; j <= mid; ++j) {
          at(j, i) = static_cast<double>(j - lo) / static_cast<double>(mid - lo);
        }
      }
      for (int64_t j = mid; j < hi; ++j) {
        at(j, i) = static_cast<double>(hi - j) / static_cast<double>(hi - mid);
      }
    }
    Tensor& out = ctx.output(0, dtype_, {spectrum, mels});
    write_doubles(out, w);
  }

 private:
  DataType dtype_;
};

// output_type as a shape rule reads it.
DataType output_type(const ShapeContext& c) {
  const int64_t code = c.attr_int("output_datatype", 1);
  if (code > INT32_MAX || code < 0 || !is_known_data_type(static_cast<int32_t>(code)) ||
      !type_in(NumericTypes{}, static_cast<DataType>(code))) {
    unknown("output_datatype is not a numeric type");
  }
  return static_cast<DataType>(code);
}

int64_t scalar_of(const ShapeContext& c, size_t i) {
  const std::vector<int64_t>& v = c.data(i);
  if (v.size() != 1) unknown("input " + std::to_string(i) + " must hold one value");
  return v[0];
}

// [size].
void window_shape(ShapeContext& c) {
  const int64_t size = scalar_of(c, 0);
  if (size < 0) unknown("negative size");
  c.set(0, output_type(c), {size});
}

// [dft_length / 2 + 1, num_mel_bins]; whether the float band edges fit the sample rate is
// only known when run.
void mel_weight_matrix_shape(ShapeContext& c) {
  const int64_t mels = scalar_of(c, 0), dft = scalar_of(c, 1), rate = scalar_of(c, 2);
  if (mels < 1 || dft < 1 || rate < 1 || mels > (int64_t{1} << 24) || dft > (int64_t{1} << 30) ||
      dft / 2 + 1 > (int64_t{1} << 40) / mels) {
    unknown("num_mel_bins, dft_length or sample_rate out of range");
  }
  c.set(0, output_type(c), {dft / 2 + 1, mels});
}

}  // namespace

#define KILN_WINDOW(op_name, kind)                                \
  KILN_REGISTER_OP({.op = op_name,                                \
                    .since = 17,                                  \
                    .min_inputs = 1,                              \
                    .max_inputs = 1,                              \
                    .min_outputs = 1,                             \
                    .max_outputs = 1,                             \
                    .types = "int32, int64 size; numeric output", \
                    .shape = window_shape,                        \
                    .create = make<Window<kind>>})
KILN_WINDOW("HannWindow", WindowKind::Hann);
KILN_WINDOW("HammingWindow", WindowKind::Hamming);
KILN_WINDOW("BlackmanWindow", WindowKind::Blackman);
#undef KILN_WINDOW

KILN_REGISTER_OP({.op = "MelWeightMatrix",
                  .since = 17,
                  .min_inputs = 5,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "int32, int64 sizes; float edges; numeric output",
                  .shape = mel_weight_matrix_shape,
                  .create = make<MelWeightMatrix>});

}  // namespace kiln::ops
