// onnxruntime's QOperator-format contrib ops (domain com.microsoft), which its static
// quantization writes for the element-wise, pooling and concatenation nodes of CNNs:
//
//   QLinearAdd / QLinearMul (A, A_scale, A_zp?, B, B_scale, B_zp?, C_scale, C_zp?)
//   QLinearSigmoid / QLinearLeakyRelu (X, X_scale, X_zp?, Y_scale, Y_zp?)
//   QLinearGlobalAveragePool (X, x_scale, x_zp, y_scale, y_zp), channels_last
//   QLinearAveragePool (X, x_scale, x_zp?, y_scale, y_zp?), the window attributes of
//     AveragePool (no dilations) and channels_last
//   QLinearConcat (Y_scale, Y_zp, (X, X_scale, X_zp)...), axis
//   QLinearSoftmax (X, X_scale, X_zp?, Y_scale, Y_zp?), axis and the opset of the Softmax
//     it replaces (below 13: over all axes from `axis` on)
//
// 8-bit tensors (uint8 or int8) with per-tensor scales (float) and zero points (the data's
// type, 0 when omitted). The arithmetic follows onnxruntime's x86 kernels so that outputs
// agree exactly (or, where onnxruntime's vector code sums in another order, within one
// unit):
//   Add: fixed = zc - (sa/sc * za + sb/sc * zb), c = fixed + a * sa/sc + b * sb/sc in float;
//   Mul: c = (a - za)(b - zb) as int32, times sa * sb / sc in float, plus zc;
//   Sigmoid, LeakyRelu, Concat: a table of the 256 inputs, each dequantized in float,
//     mapped, and quantized as QuantizeLinear does (x / scale, rounded, plus zero point);
//   GlobalAveragePool: the int32 sum minus zx * size, times sx / (sy * size) in float;
//   AveragePool: the float sum of the dequantized window over its count, / sy + zy (a
//     window covering the whole unpadded image is GlobalAveragePool's sum).
//   Softmax: a float table of exp((x - max + shift) * sx), the row's float sum, and
//     x's entry times floor(1 / sy) over the sum, plus zy.
// Every result is rounded half to even and saturated to the output type (Softmax keeps
// onnxruntime's narrowing, see softmax_row).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/geometry.h"

namespace kiln::ops {
namespace {

bool is_8bit(DataType t) {
  return t == DataType::UInt8 || t == DataType::Int8;
}

// Element 0 of a uint8 or int8 tensor.
int32_t first_int(const Tensor& t) {
  return t.dtype() == DataType::UInt8 ? t.data<const uint8_t>()[0] : t.data<const int8_t>()[0];
}

// A per-tensor scale and zero point.
struct QParam {
  float scale = 1;
  int32_t zero_point = 0;
};

// Reads the scale at input `s` and the zero point at input `z` (optional when `zp_optional`)
// of 8-bit data of type `t`.
QParam read_qparam(const OpContext& ctx, size_t s, size_t z, DataType t, const char* what,
                   bool zp_optional = true) {
  QParam q;
  const Tensor& scale = ctx.input(s);
  if (scale.dtype() != DataType::Float || scale.numel() != 1 || scale.rank() > 1) {
    ctx.fail(std::string(what) + " scale must be a float scalar or 1-element vector, got " +
             scale.describe());
  }
  q.scale = scale.data<const float>()[0];
  if (!ctx.has_input(z)) {
    if (!zp_optional) ctx.fail(std::string(what) + " zero point is required");
    return q;
  }
  const Tensor& zp = ctx.input(z);
  if (zp.dtype() != t || zp.numel() != 1 || zp.rank() > 1) {
    ctx.fail(std::string(what) + " zero point must be a scalar or 1-element vector of the " +
             "data's type " + std::string(data_type_name(t)) + ", got " + zp.describe());
  }
  q.zero_point = first_int(zp);
  return q;
}

void require_8bit(const OpContext& ctx, const Tensor& x, const char* what) {
  if (!is_8bit(x.dtype())) {
    ctx.fail(std::string(what) + " must be uint8 or int8, got " + x.describe(),
             ErrorKind::Unsupported);
  }
}

// Rounds half to even (the default rounding mode) and saturates to T; NaN (from degenerate
// scales such as 0) gives T's lowest value rather than an undefined conversion.
template <typename T>
T saturate_round(float v) {
  const float r = std::nearbyint(v);
  constexpr auto lo = static_cast<float>(std::numeric_limits<T>::min());
  constexpr auto hi = static_cast<float>(std::numeric_limits<T>::max());
  if (!(r > lo)) return std::numeric_limits<T>::min();
  if (!(r < hi)) return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

// QuantizeLinear of one float as onnxruntime's MlasQuantizeLinear: x / scale, rounded, plus
// the zero point, saturated (clamping before or after rounding agrees: the bounds are
// integers).
template <typename T>
T quantize(float x, QParam q) {
  return saturate_round<T>(std::nearbyint(x / q.scale) + static_cast<float>(q.zero_point));
}

// The table of f over the 256 values of T (indexed by their bytes): dequantized with `x`,
// mapped, quantized with `y`.
using Table = std::array<uint8_t, 256>;
template <typename T, typename F>
Table build_table(QParam x, QParam y, F&& f) {
  Table t{};
  for (int i = 0; i < 256; ++i) {
    const auto v = static_cast<T>(static_cast<uint8_t>(i));
    const float deq = x.scale * static_cast<float>(static_cast<int32_t>(v) - x.zero_point);
    const T q = quantize<T>(f(deq), y);
    std::memcpy(&t[static_cast<size_t>(i)], &q, 1);
  }
  return t;
}

void apply_table(const Table& t, const uint8_t* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = t[x[i]];
}

// ---- QLinearAdd, QLinearMul ------------------------------------------------------------

enum class BinaryKind { Add, Mul };

// One row of the broadcast output: `n` elements, a and b read with strides `sa`, `sb`
// (0 where broadcast).
template <typename T>
struct BinaryRow {
  const T* a;
  int64_t sa;
  const T* b;
  int64_t sb;
  T* c;
  int64_t n;
};

template <typename T>
void add_row(const BinaryRow<T>& r, QParam qa, QParam qb, QParam qc) {
  const float rac = qa.scale / qc.scale, rbc = qb.scale / qc.scale;
  float fixed = static_cast<float>(qc.zero_point) -
                (rac * static_cast<float>(qa.zero_point) + rbc * static_cast<float>(qb.zero_point));
  if (r.sb == 0 || r.sa == 0) {
    // onnxruntime folds the broadcast operand into the constant part, with its own ratio.
    const bool b_scalar = r.sb == 0;
    const T* span = b_scalar ? r.a : r.b;
    const int64_t step = b_scalar ? r.sa : r.sb;
    const float span_ratio = b_scalar ? rac : rbc;
    fixed += static_cast<float>(b_scalar ? r.b[0] : r.a[0]) * (b_scalar ? rbc : rac);
    for (int64_t i = 0; i < r.n; ++i) {
      r.c[i] = saturate_round<T>(fixed + static_cast<float>(span[i * step]) * span_ratio);
    }
    return;
  }
  for (int64_t i = 0; i < r.n; ++i) {
    const float v = fixed + static_cast<float>(r.a[i * r.sa]) * rac;
    r.c[i] = saturate_round<T>(v + static_cast<float>(r.b[i * r.sb]) * rbc);
  }
}

template <typename T>
void mul_row(const BinaryRow<T>& r, QParam qa, QParam qb, QParam qc) {
  const float ratio = qa.scale * qb.scale / qc.scale;
  const auto zc = static_cast<float>(qc.zero_point);
  for (int64_t i = 0; i < r.n; ++i) {
    const int32_t prod = (static_cast<int32_t>(r.a[i * r.sa]) - qa.zero_point) *
                         (static_cast<int32_t>(r.b[i * r.sb]) - qb.zero_point);
    r.c[i] = saturate_round<T>(static_cast<float>(prod) * ratio + zc);
  }
}

template <BinaryKind kKind>
class QLinearBinary final : public Kernel {
 public:
  explicit QLinearBinary(const NodeInfo&) {}

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(3);
    require_8bit(ctx, a, "A");
    if (b.dtype() != a.dtype()) ctx.fail("B " + b.describe() + " differs in type from A");
    const QParam qa = read_qparam(ctx, 1, 2, a.dtype(), "A");
    const QParam qb = read_qparam(ctx, 4, 5, a.dtype(), "B");
    const QParam qc = read_qparam(ctx, 6, 7, a.dtype(), "C");
    const Shape out_shape = broadcast_shapes(a.shape(), b.shape());
    Tensor& c = ctx.output(0, a.dtype(), out_shape);
    if (c.numel() == 0) return;
    dispatch(TypeList<uint8_t, int8_t>{}, a.dtype(),
             [&]<typename T>() { run_typed<T>(a, b, c, qa, qb, qc); });
  }

 private:
  template <typename T>
  static void run_typed(const Tensor& a, const Tensor& b, Tensor& c, QParam qa, QParam qb,
                        QParam qc) {
    const Shape& shape = c.shape();
    const Shape sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
    const int64_t n = shape.empty() ? 1 : shape.back();
    const int64_t rows = c.numel() / n;
    const size_t last = shape.empty() ? 0 : shape.size() - 1;
    const T* pa = a.data<const T>();
    const T* pb = b.data<const T>();
    T* pc = c.data<T>();
    parallel_for(rows, grain_for(n, 16384), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        // The offsets of row r's first elements in a and b.
        int64_t oa = 0, ob = 0, rest = r;
        for (size_t d = last; d-- > 0;) {
          const int64_t i = rest % shape[d];
          rest /= shape[d];
          oa += i * sa[d];
          ob += i * sb[d];
        }
        const BinaryRow<T> row{pa + oa,    shape.empty() ? 0 : sa[last],
                               pb + ob,    shape.empty() ? 0 : sb[last],
                               pc + r * n, n};
        if constexpr (kKind == BinaryKind::Add) {
          add_row(row, qa, qb, qc);
        } else {
          mul_row(row, qa, qb, qc);
        }
      }
    });
  }
};

void qlinear_binary_shape(ShapeContext& c) {
  if (!is_8bit(c.dtype(0))) unknown("an input type the op does not take");
  c.set(0, c.dtype(0), broadcast_shapes(c.shape(0), c.shape(3)));
}

// ---- QLinearSigmoid, QLinearLeakyRelu ----------------------------------------------------

enum class LookupKind { Sigmoid, LeakyRelu };

template <LookupKind kKind>
class QLinearLookup final : public Kernel {
 public:
  explicit QLinearLookup(const NodeInfo& info) : alpha_(info.attr_float("alpha", 0.01f)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_8bit(ctx, x, "X");
    const QParam qx = read_qparam(ctx, 1, 2, x.dtype(), "X");
    const QParam qy = read_qparam(ctx, 3, 4, x.dtype(), "Y");
    Table table{};
    auto f = [&](float v) {
      if constexpr (kKind == LookupKind::Sigmoid) {
        return 1.0f / (1.0f + std::exp(-v));
      } else {
        return v >= 0.0f ? v : alpha_ * v;
      }
    };
    dispatch(TypeList<uint8_t, int8_t>{}, x.dtype(),
             [&]<typename T>() { table = build_table<T>(qx, qy, f); });
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    const auto* px = reinterpret_cast<const uint8_t*>(x.raw_data());
    auto* py = reinterpret_cast<uint8_t*>(y.raw_data());
    parallel_for(x.numel(), 65536,
                 [&](int64_t lo, int64_t hi) { apply_table(table, px + lo, py + lo, hi - lo); });
  }

 private:
  float alpha_;
};

// ---- QLinearGlobalAveragePool ------------------------------------------------------------

// The scale of GlobalAveragePool's int32 sums, failing outside onnxruntime's bounds (the sum
// cannot overflow and the scale stays in range).
float global_pool_scale(const OpContext& ctx, QParam qx, QParam qy, int64_t image) {
  const float scale = qx.scale / (qy.scale * static_cast<float>(image));
  if (image >= (int64_t{1} << 24) || !(scale >= 0x1.0p-32f && scale < 256.0f)) {
    ctx.fail("image size " + std::to_string(image) + " or scale ratio " + std::to_string(scale) +
                 " outside the computable range",
             ErrorKind::Unsupported);
  }
  return scale;
}

// GlobalAveragePool of `planes` (batch, channel) planes of `image` elements each; channels
// last when `channels` > 1 is the element stride of an image.
template <typename T>
void global_average(const T* px, T* py, int64_t batch, int64_t channels, int64_t image,
                    bool channels_last, QParam qx, QParam qy, float scale) {
  const int64_t cstride = channels_last ? 1 : image;
  const int64_t istride = channels_last ? channels : 1;
  const auto bias = static_cast<int32_t>(-qx.zero_point * image);
  parallel_for(batch * channels, grain_for(image), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const T* in = px + (p / channels) * channels * image + (p % channels) * cstride;
      int32_t acc = bias;
      for (int64_t i = 0; i < image; ++i) acc += in[i * istride];
      py[p] =
          saturate_round<T>(static_cast<float>(acc) * scale + static_cast<float>(qy.zero_point));
    }
  });
}

class QLinearGlobalAveragePool final : public Kernel {
 public:
  explicit QLinearGlobalAveragePool(const NodeInfo& info)
      : channels_last_(info.attr_int("channels_last", 0) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_8bit(ctx, x, "X");
    if (x.rank() < 3) ctx.fail("X " + x.describe() + " must have rank >= 3");
    const QParam qx = read_qparam(ctx, 1, 2, x.dtype(), "x", false);
    const QParam qy = read_qparam(ctx, 3, 4, x.dtype(), "y", false);
    const int64_t batch = x.dim(0);
    const int64_t channels = channels_last_ ? x.dim(x.rank() - 1) : x.dim(1);
    const int64_t image = channels == 0 || batch == 0 ? 0 : x.numel() / (batch * channels);
    Tensor& y = ctx.output(0, x.dtype(), pooled_shape(x.shape(), channels_last_));
    if (y.numel() == 0) return;
    const float scale = global_pool_scale(ctx, qx, qy, image);
    dispatch(TypeList<uint8_t, int8_t>{}, x.dtype(), [&]<typename T>() {
      global_average(x.data<const T>(), y.data<T>(), batch, channels, image, channels_last_, qx, qy,
                     scale);
    });
  }

  // The input's shape with every spatial axis 1.
  static Shape pooled_shape(Shape s, bool channels_last) {
    const size_t begin = channels_last ? 1 : 2, end = s.size() - (channels_last ? 1 : 0);
    for (size_t d = begin; d < end; ++d) s[d] = 1;
    return s;
  }

 private:
  bool channels_last_;
};

void qlinear_global_pool_shape(ShapeContext& c) {
  const Shape& s = c.shape(0);
  if (s.size() < 3 || !is_8bit(c.dtype(0))) unknown("an input the op does not take");
  c.set(0, c.dtype(0),
        QLinearGlobalAveragePool::pooled_shape(s, c.attr_int("channels_last", 0) != 0));
}

// ---- QLinearAveragePool ----------------------------------------------------------------

// The NCHW view of a channels-last shape (the channel axis moved from last to second).
Shape to_nchw(const Shape& s) {
  Shape r = s;
  r.erase(r.end() - 1);
  r.insert(r.begin() + 1, s.back());
  return r;
}
Shape to_nhwc(const Shape& s) {
  Shape r = s;
  r.erase(r.begin() + 1);
  r.push_back(s[1]);
  return r;
}

// The window attributes of QLinearAveragePool: kernel_shape required, 1 to 3 axes, no
// dilations (onnxruntime's kernel has none).
WindowAttrs qlinear_pool_window(const ir::Node& node) {
  WindowAttrs a = window_attrs(node);
  if (a.kernel_shape.empty()) throw Error(ErrorKind::InvalidModel, "kernel_shape is required");
  if (a.kernel_shape.size() > 3) {
    throw Error(ErrorKind::Unsupported, "pooling over more than 3 dimensions");
  }
  for (int64_t d : a.dilations) {
    if (d != 1) throw Error(ErrorKind::Unsupported, "dilations other than 1");
  }
  check_window_ranks(a, a.kernel_shape.size());
  return a;
}

class QLinearAveragePool final : public Kernel {
 public:
  explicit QLinearAveragePool(const NodeInfo& info)
      : window_(qlinear_pool_window(info.node())),
        channels_last_(info.attr_int("channels_last", 0) != 0),
        count_pad_(info.attr_int("count_include_pad", 0) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_8bit(ctx, x, "X");
    if (x.rank() != window_.kernel_shape.size() + 2) {
      ctx.fail("X " + x.describe() + " does not match kernel_shape of rank " +
               std::to_string(window_.kernel_shape.size()));
    }
    const QParam qx = read_qparam(ctx, 1, 2, x.dtype(), "x");
    const QParam qy = read_qparam(ctx, 3, 4, x.dtype(), "y");
    const Shape nchw = channels_last_ ? to_nchw(x.shape()) : x.shape();
    const std::vector<WindowAxis> axes =
        forward_windows(spatial_dims(nchw), window_.kernel_shape, window_);
    const Shape out_nchw = windowed_shape(nchw[0], nchw[1], axes);
    Tensor& y = ctx.output(0, x.dtype(), channels_last_ ? to_nhwc(out_nchw) : out_nchw);
    if (y.numel() == 0) return;
    const Windows3 w = right_aligned(axes);
    dispatch(TypeList<uint8_t, int8_t>{}, x.dtype(), [&]<typename T>() {
      if (whole_image(axes)) {
        // onnxruntime computes a window over the whole unpadded image as GlobalAveragePool.
        const float scale = global_pool_scale(ctx, qx, qy, w.in_size());
        global_average(x.data<const T>(), y.data<T>(), nchw[0], nchw[1], w.in_size(),
                       channels_last_, qx, qy, scale);
      } else {
        pool<T>(x.data<const T>(), y.data<T>(), nchw[0], nchw[1], w, qx, qy);
      }
    });
  }

 private:
  static bool whole_image(const std::vector<WindowAxis>& axes) {
    return std::all_of(axes.begin(), axes.end(), [](const WindowAxis& a) {
      return a.kernel == a.in && a.pad_begin == 0 && a.pad_end == 0;
    });
  }

  // Each output: the float sum of the dequantized inputs its window covers (clipped to the
  // image, in row-major order), over the window's count, quantized.
  template <typename T>
  void pool(const T* px, T* py, int64_t batch, int64_t channels, const Windows3& w, QParam qx,
            QParam qy) const {
    std::array<float, 256> deq{};
    for (int i = 0; i < 256; ++i) {
      const auto v = static_cast<T>(static_cast<uint8_t>(i));
      deq[static_cast<size_t>(i)] =
          qx.scale * static_cast<float>(static_cast<int32_t>(v) - qx.zero_point);
    }
    const int64_t in_size = w.in_size(), out_size = w.out_size();
    // Element strides of a spatial position and of a channel.
    const int64_t pos = channels_last_ ? channels : 1, ch_in = channels_last_ ? 1 : in_size,
                  ch_out = channels_last_ ? 1 : out_size;
    const auto zy = static_cast<float>(qy.zero_point);
    parallel_for(batch * channels, grain_for(out_size * w.k_size()), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t n = p / channels, c = p % channels;
        const T* in = px + n * channels * in_size + c * ch_in;
        T* out = py + n * channels * out_size + c * ch_out;
        int64_t o = 0;
        for (int64_t o0 = 0; o0 < w.out[0]; ++o0) {
          const auto [b0, e0] = span(w, 0, o0);
          for (int64_t o1 = 0; o1 < w.out[1]; ++o1) {
            const auto [b1, e1] = span(w, 1, o1);
            for (int64_t o2 = 0; o2 < w.out[2]; ++o2, ++o) {
              const auto [b2, e2] = span(w, 2, o2);
              float sum = 0;
              for (int64_t i0 = b0; i0 < e0; ++i0) {
                for (int64_t i1 = b1; i1 < e1; ++i1) {
                  const int64_t row = (i0 * w.in[1] + i1) * w.in[2];
                  for (int64_t i2 = b2; i2 < e2; ++i2) {
                    sum += deq[static_cast<uint8_t>(in[(row + i2) * pos])];
                  }
                }
              }
              const int64_t count = count_pad_ ? w.k_size() : (e0 - b0) * (e1 - b1) * (e2 - b2);
              const float avg = sum / static_cast<float>(count);
              out[o * pos] = saturate_round<T>(avg / qy.scale + zy);
            }
          }
        }
      }
    });
  }

  // The input positions [begin, end) that output o of axis d covers, clipped to the image.
  static std::pair<int64_t, int64_t> span(const Windows3& w, size_t d, int64_t o) {
    const int64_t start = o * w.stride[d] - w.pad[d];
    return {std::max<int64_t>(start, 0), std::min(start + w.k[d], w.in[d])};
  }

  WindowAttrs window_;
  bool channels_last_, count_pad_;
};

void qlinear_average_pool_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.size() < 3 || !is_8bit(c.dtype(0))) unknown("an input the op does not take");
  const WindowAttrs a = qlinear_pool_window(c.node());
  check_window_ranks(a, x.size() - 2);
  const bool last = c.attr_int("channels_last", 0) != 0;
  const Shape nchw = last ? to_nchw(x) : x;
  const Shape out =
      windowed_shape(nchw[0], nchw[1], forward_windows(spatial_dims(nchw), a.kernel_shape, a));
  c.set(0, c.dtype(0), last ? to_nhwc(out) : out);
}

// ---- QLinearSoftmax ----------------------------------------------------------------------

class QLinearSoftmax final : public Kernel {
 public:
  explicit QLinearSoftmax(const NodeInfo& info) : opset_(info.attr_int("opset")) {
    axis_ = info.attr_int("axis", opset_ < 13 ? 1 : -1);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_8bit(ctx, x, "X");
    // X's zero point does not change a softmax (onnxruntime ignores it too).
    const QParam qx = read_qparam(ctx, 1, 2, x.dtype(), "X");
    const QParam qy = read_qparam(ctx, 3, 4, x.dtype(), "Y");
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    if (x.numel() == 0) return;
    const int64_t rank = static_cast<int64_t>(x.rank());
    if (rank == 0) ctx.fail("X must have rank >= 1");
    const auto axis = static_cast<size_t>(normalize_axis(axis_, rank));
    const Shape& s = x.shape();
    const int64_t outer =
        shape_numel(Shape(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(axis)));
    const int64_t d = opset_ < 13 ? x.numel() / outer : s[axis];
    const int64_t inner = x.numel() / (outer * d);
    const bool is_signed = x.dtype() == DataType::Int8;
    const std::array<float, 256> table = exp_table(qx.scale, d, is_signed);
    const float y_scale = std::floor(1.0f / qy.scale);
    const auto* px = reinterpret_cast<const uint8_t*>(x.raw_data());
    auto* py = reinterpret_cast<uint8_t*>(y.raw_data());
    parallel_for(outer * inner, grain_for(3 * d), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t start = (r / inner) * d * inner + r % inner;
        if (is_signed) {
          softmax_row<int8_t>(px + start, py + start, d, inner, table, y_scale, qy.zero_point);
        } else {
          softmax_row<uint8_t>(px + start, py + start, d, inner, table, y_scale, qy.zero_point);
        }
      }
    });
  }

 private:
  // exp((v - 255 + shift) * scale) for v in [0, 255], indexed by v (unsigned) or by the byte
  // of v - 128 (signed); `shift` keeps a row's float sum of d values finite.
  static std::array<float, 256> exp_table(float scale, int64_t d, bool is_signed) {
    double shift = std::log(std::numeric_limits<float>::max() / static_cast<float>(d));
    shift = std::max(0.0, shift - 5) / scale;
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      const double e =
          std::exp((static_cast<double>(i) - 255 + shift) * static_cast<double>(scale));
      t[static_cast<uint8_t>(is_signed ? i - 128 : i)] = static_cast<float>(e);
    }
    return t;
  }

  // One row of d elements `stride` apart. Each value's table entry is found by shifting the
  // row so that its maximum lands on the table's last entry. The result narrows as
  // onnxruntime's does: above 255 is 255, then the low byte (for int8 a value past 127 wraps,
  // which a zero point of -128 with a scale of 1/256 reaches only for a probability of 1).
  template <typename T>
  static void softmax_row(const uint8_t* xb, uint8_t* yb, int64_t d, int64_t stride,
                          const std::array<float, 256>& table, float y_scale, int32_t zy) {
    const T* x = reinterpret_cast<const T*>(xb);
    T* y = reinterpret_cast<T*>(yb);
    T xmax = x[0];
    for (int64_t i = 1; i < d; ++i) xmax = std::max(xmax, x[i * stride]);
    constexpr int32_t top = std::numeric_limits<T>::max();
    auto entry = [&](T v) {
      return table[static_cast<uint8_t>(static_cast<int32_t>(v) + top -
                                        static_cast<int32_t>(xmax))];
    };
    float sum = 0;
    for (int64_t i = 0; i < d; ++i) sum += entry(x[i * stride]);
    for (int64_t i = 0; i < d; ++i) {
      const int64_t q = int64_t{saturate_round<int32_t>(entry(x[i * stride]) * y_scale / sum)} + zy;
      // onnxruntime adds the zero point in uint32 for uint8: a negative value is past 255.
      const bool past = q > 255 || (std::is_unsigned_v<T> && q < 0);
      y[i * stride] = static_cast<T>(past ? 255 : q);
    }
  }

  int64_t opset_, axis_ = -1;
};

// ---- QLinearConcat ---------------------------------------------------------------------

class QLinearConcat final : public Kernel {
 public:
  explicit QLinearConcat(const NodeInfo& info) : axis_(info.attr_int("axis")) {}

  void run(OpContext& ctx) override {
    const size_t n_in = ctx.num_inputs();
    if (n_in < 5 || (n_in - 2) % 3 != 0) {
      ctx.fail("inputs must be Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got " +
               std::to_string(n_in) + " inputs");
    }
    const DataType t = ctx.input(1).dtype();
    if (!is_8bit(t)) {
      ctx.fail("Y_zero_point must be uint8 or int8, got " + ctx.input(1).describe(),
               ErrorKind::Unsupported);
    }
    const QParam qy = read_qparam(ctx, 0, 1, t, "Y", false);
    const size_t count = (n_in - 2) / 3;
    const Tensor& first = ctx.input(2);
    const auto rank = static_cast<int64_t>(first.rank());
    if (rank == 0) ctx.fail("inputs must have rank >= 1, got " + first.describe());
    const auto axis = static_cast<size_t>(normalize_axis(axis_, rank));
    Shape out_shape = first.shape();
    out_shape[axis] = 0;
    for (size_t k = 0; k < count; ++k) {
      const Tensor& x = ctx.input(2 + 3 * k);
      if (x.dtype() != t) ctx.fail("input " + x.describe() + " differs in type from Y");
      bool fits = x.rank() == first.rank();
      for (size_t d = 0; fits && d < x.rank(); ++d) fits = d == axis || x.dim(d) == first.dim(d);
      if (!fits) {
        ctx.fail("input " + x.describe() + " does not match " + first.describe() +
                 " outside axis " + std::to_string(axis));
      }
      out_shape[axis] += x.dim(axis);
    }
    Tensor& y = ctx.output(0, t, out_shape);
    if (y.numel() == 0) return;
    const int64_t outer = shape_numel(Shape(out_shape.begin(), out_shape.begin() + axis));
    const int64_t out_pitch = y.numel() / outer;
    auto* py = reinterpret_cast<uint8_t*>(y.raw_data());
    int64_t offset = 0;
    for (size_t k = 0; k < count; ++k) {
      const Tensor& x = ctx.input(2 + 3 * k);
      const int64_t pitch = x.numel() / outer;
      const QParam qx = read_qparam(ctx, 3 + 3 * k, 4 + 3 * k, t, "X", false);
      const bool copy = qx.scale == qy.scale && qx.zero_point == qy.zero_point;
      Table table{};
      if (!copy) {
        dispatch(TypeList<uint8_t, int8_t>{}, t,
                 [&]<typename T>() { table = build_table<T>(qx, qy, [](float v) { return v; }); });
      }
      const auto* px = reinterpret_cast<const uint8_t*>(x.raw_data());
      parallel_for(outer, grain_for(pitch), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          uint8_t* dst = py + o * out_pitch + offset;
          if (copy) {
            std::memcpy(dst, px + o * pitch, static_cast<size_t>(pitch));
          } else {
            apply_table(table, px + o * pitch, dst, pitch);
          }
        }
      });
      offset += pitch;
    }
  }

 private:
  int64_t axis_;
};

void qlinear_concat_shape(ShapeContext& c) {
  const size_t n_in = c.num_inputs();
  if (n_in < 5 || (n_in - 2) % 3 != 0) unknown("inputs that are not triples");
  const DataType t = c.dtype(1);
  if (!is_8bit(t)) unknown("a type the op does not take");
  const Shape& first = c.shape(2);
  if (first.empty()) unknown("a scalar input");
  const auto axis = static_cast<size_t>(
      normalize_axis(c.attr_int("axis", 0), static_cast<int64_t>(first.size())));
  Shape out = first;
  out[axis] = 0;
  for (size_t i = 2; i < n_in; i += 3) {
    const Shape& s = c.shape(i);
    if (s.size() != out.size()) unknown("ranks differ");
    for (size_t d = 0; d < out.size(); ++d) {
      if (d != axis && s[d] != out[d]) unknown("shapes differ outside the axis");
    }
    if (s[axis] < 0 || out[axis] < 0) {
      out[axis] = -1;
    } else {
      out[axis] = checked_add(out[axis], s[axis]);
    }
  }
  c.set(0, t, out);
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearAdd",
                  .min_inputs = 7,
                  .max_inputs = 8,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8",
                  .shape = qlinear_binary_shape,
                  .create = make<QLinearBinary<BinaryKind::Add>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearMul",
                  .min_inputs = 7,
                  .max_inputs = 8,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8",
                  .shape = qlinear_binary_shape,
                  .create = make<QLinearBinary<BinaryKind::Mul>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearSigmoid",
                  .min_inputs = 4,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "uint8, int8",
                  .shape = same_shape,
                  .create = make<QLinearLookup<LookupKind::Sigmoid>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearLeakyRelu",
                  .min_inputs = 4,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "uint8, int8",
                  .shape = same_shape,
                  .create = make<QLinearLookup<LookupKind::LeakyRelu>>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearGlobalAveragePool",
                  .min_inputs = 5,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8",
                  .shape = qlinear_global_pool_shape,
                  .create = make<QLinearGlobalAveragePool>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearAveragePool",
                  .min_inputs = 4,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8",
                  .shape = qlinear_average_pool_shape,
                  .create = make<QLinearAveragePool>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearSoftmax",
                  .min_inputs = 4,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8",
                  .shape = same_shape,
                  .create = make<QLinearSoftmax>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "QLinearConcat",
                  .min_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "uint8, int8",
                  .shape = qlinear_concat_shape,
                  .create = make<QLinearConcat>});

}  // namespace kiln::ops
