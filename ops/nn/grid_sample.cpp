// GridSample (opset 16+) and AffineGrid (20+): sampling an image at normalized grid
// coordinates in [-1, 1], and building such grids from affine matrices.
//
// GridSample works point by point: the grid point's position is turned into up to 4 taps per
// spatial axis (index and weight, with the padding mode applied to out-of-range indices),
// combined into flat offsets once, and then applied to every channel. The coordinate rules
// (rounding before padding for nearest, reflection about the borders) follow the ONNX
// reference implementation.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

enum class Sampling { Linear, Nearest, Cubic };
enum class Padding { Zeros, Border, Reflection };

constexpr size_t kMaxSpatial = 3;
constexpr size_t kMaxTaps = 64;  // 4 taps per axis (cubic), 3 axes

// Reflects x into [lo, hi] by folding at the borders.
double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (!(range > 0)) return lo;
  if (x >= lo && x <= hi) return x;
  const double dx = x < lo ? lo - x : x - hi;
  const double n = std::floor(dx / range);
  const double r = dx - n * range;
  const bool even = std::fmod(n, 2.0) == 0;
  if (x < lo) return even ? lo + r : hi - r;
  return even ? hi - r : lo + r;
}

double cubic_weight(double t) {
  constexpr double a = -0.75;
  t = std::abs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

struct AxisRule {
  Sampling mode;
  Padding padding;
  bool align_corners;
};

// The taps of normalized coordinate `g` on an axis of `len`: index (-1 reads zero) and weight.
int axis_taps(const AxisRule& rule, double g, int64_t len, int64_t* idx, double* w) {
  const double lo = rule.align_corners ? 0.0 : -0.5;
  const double hi =
      rule.align_corners ? static_cast<double>(len - 1) : static_cast<double>(len) - 0.5;
  double x = rule.align_corners ? (g + 1) / 2 * static_cast<double>(len - 1)
                                : ((g + 1) * static_cast<double>(len) - 1) / 2;
  if (rule.mode == Sampling::Nearest) x = std::nearbyint(x);
  if (std::isnan(x)) {
    if (rule.padding == Padding::Zeros) return 0;
    x = lo;
  }
  // Cubic applies the padding to each tap only, as PyTorch and onnxruntime do (the ONNX
  // reference moves the coordinate first); the modes agree wherever the grid is in range.
  const bool move_coordinate = rule.mode != Sampling::Cubic;
  if ((x < lo || x > hi) && move_coordinate) {
    if (rule.padding == Padding::Border) {
      x = std::clamp(x, 0.0, static_cast<double>(len - 1));
    } else if (rule.padding == Padding::Reflection) {
      x = std::isinf(x) ? lo : reflect(x, lo, hi);
    }
  }
  const double flen = static_cast<double>(len);
  if (x < -4 || x > flen + 4) {
    // Far outside (cubic, or zeros padding): every tap reads zero, or the same border pixel,
    // or, for reflection, what it reads one reflection period closer.
    if (rule.padding == Padding::Zeros) return 0;
    if (rule.padding == Padding::Border) {
      x = std::clamp(x, -4.0, flen + 4);
    } else {
      const double period = 2 * (hi - lo);
      x = std::isinf(x) || !(period > 0) ? lo : x - period * std::floor(x / period);
      if (!(x >= 0 && x <= period)) x = lo;  // |x| so large that the fold lost all precision
    }
  }
  // Index i of a tap, moved into the axis by the padding rule (or -1).
  auto pixel = [&](int64_t i) -> int64_t {
    if (i >= 0 && i < len) return i;
    switch (rule.padding) {
      case Padding::Zeros:
        return -1;
      case Padding::Border:
        return std::clamp<int64_t>(i, 0, len - 1);
      case Padding::Reflection:
        return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(i), lo, hi)), 0,
                                   len - 1);
    }
    return -1;
  };
  if (rule.mode == Sampling::Nearest) {
    idx[0] = pixel(static_cast<int64_t>(x));
    w[0] = 1;
    return 1;
  }
  const double x0 = std::floor(x);
  const double t = x - x0;
  const int64_t i0 = static_cast<int64_t>(x0);
  if (rule.mode == Sampling::Linear) {
    idx[0] = pixel(i0);
    idx[1] = pixel(i0 + 1);
    w[0] = 1 - t;
    w[1] = t;
    return 2;
  }
  for (int k = 0; k < 4; ++k) {
    idx[k] = pixel(i0 - 1 + k);
    w[k] = cubic_weight(t + 1 - k);
  }
  return 4;
}

// The taps of every grid point of one batch item: up to `stride` (flat offset, weight)
// pairs per point, `count[p]` of them used (taps reading zero padding are dropped).
struct PointTaps {
  int64_t stride = 1;
  std::vector<int64_t> offset;
  std::vector<double> weight;
  std::vector<int32_t> count;
};

void point_taps(const AxisRule& rule, const double* grid, const Shape& in_spatial, int64_t points,
                PointTaps* out) {
  const size_t k = in_spatial.size();
  const Shape strides = contiguous_strides(in_spatial);
  const int64_t per_axis =
      rule.mode == Sampling::Cubic ? 4 : (rule.mode == Sampling::Linear ? 2 : 1);
  int64_t stride = 1;
  for (size_t d = 0; d < k; ++d) stride *= per_axis;
  out->stride = stride;
  out->offset.resize(static_cast<size_t>(points * stride));
  out->weight.resize(out->offset.size());
  out->count.resize(static_cast<size_t>(points));
  parallel_for(points, grain_for(stride * 16), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const double* g = grid + p * static_cast<int64_t>(k);
      int64_t* off = out->offset.data() + p * stride;
      double* wt = out->weight.data() + p * stride;
      // Combine the per-axis taps; grid values are in reverse axis order (x first).
      int64_t count = 1;
      off[0] = 0;
      wt[0] = 1;
      for (size_t d = 0; d < k; ++d) {
        int64_t idx[4];
        double w[4];
        const int m = axis_taps(rule, g[k - 1 - d], in_spatial[d], idx, w);
        std::array<int64_t, kMaxTaps> o2;
        std::array<double, kMaxTaps> w2;
        int64_t next = 0;
        for (int64_t a = 0; a < count; ++a) {
          for (int b = 0; b < m; ++b) {
            if (idx[b] < 0) continue;
            o2[static_cast<size_t>(next)] = off[a] + idx[b] * strides[d];
            w2[static_cast<size_t>(next)] = wt[a] * w[b];
            ++next;
          }
        }
        count = next;
        std::copy(o2.begin(), o2.begin() + count, off);
        std::copy(w2.begin(), w2.begin() + count, wt);
      }
      out->count[static_cast<size_t>(p)] = static_cast<int32_t>(count);
    }
  });
}

// Taps are computed once per batch item, then every channel plane is sampled with them, so
// the output is written in order and each input plane stays in cache.
template <typename T>
void sample_points(const Tensor& x, const std::vector<double>& grid, Tensor& y,
                   const AxisRule& rule) {
  using C = compute_t<T>;
  const size_t k = x.rank() - 2;
  const int64_t n_batch = x.dim(0), channels = x.dim(1);
  const Shape in_spatial(x.shape().begin() + 2, x.shape().end());
  const int64_t in_plane = shape_numel(in_spatial);
  const int64_t points = shape_numel(Shape(y.shape().begin() + 2, y.shape().end()));
  const T* src = x.data<const T>();
  T* dst = y.data<T>();
  PointTaps taps;
  for (int64_t n = 0; n < n_batch; ++n) {
    point_taps(rule, grid.data() + n * points * static_cast<int64_t>(k), in_spatial, points, &taps);
    const int64_t stride = taps.stride;
    std::vector<C> w(taps.weight.begin(), taps.weight.end());
    parallel_for(channels * points, grain_for(stride * 2), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end;) {
        const int64_t c = i / points, p0 = i % points;
        const int64_t p1 = std::min(points, p0 + (end - i));
        const T* plane = src + (n * channels + c) * in_plane;
        T* out = dst + (n * channels + c) * points;
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t* off = taps.offset.data() + p * stride;
          const C* wt = w.data() + p * stride;
          C acc = 0;
          for (int32_t t = 0; t < taps.count[static_cast<size_t>(p)]; ++t) {
            acc += wt[t] * static_cast<C>(plane[off[t]]);
          }
          out[p] = from_compute<T>(acc);
        }
        i += p1 - p0;
      }
    });
  }
}

std::vector<double> read_float_tensor(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  const Tensor c = t.contiguous();
  dispatch(
      FloatTypes{}, t.dtype(),
      [&]<typename T>() {
        const T* p = c.data<const T>();
        for (size_t i = 0; i < out.size(); ++i)
          out[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
      },
      "grid");
  return out;
}

class GridSample final : public Kernel {
 public:
  explicit GridSample(const NodeInfo& info) : opset_(info.opset()) {
    const bool new_names = info.opset() >= 20;
    const std::string mode = info.attr_string("mode", new_names ? "linear" : "bilinear");
    if (mode == (new_names ? "linear" : "bilinear")) {
      rule_.mode = Sampling::Linear;
    } else if (mode == "nearest") {
      rule_.mode = Sampling::Nearest;
    } else if (mode == (new_names ? "cubic" : "bicubic")) {
      rule_.mode = Sampling::Cubic;
    } else {
      info.fail("unknown mode '" + mode + "'", ErrorKind::Unsupported);
    }
    const std::string padding = info.attr_string("padding_mode", "zeros");
    if (padding == "zeros") {
      rule_.padding = Padding::Zeros;
    } else if (padding == "border") {
      rule_.padding = Padding::Border;
    } else if (padding == "reflection") {
      rule_.padding = Padding::Reflection;
    } else {
      info.fail("unknown padding_mode '" + padding + "'", ErrorKind::Unsupported);
    }
    rule_.align_corners = info.attr_int("align_corners", 0) != 0;
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& grid = ctx.input(1);
    const size_t rank = x.rank();
    if (rank < 3 || rank > 2 + kMaxSpatial || (opset_ < 20 && rank != 4)) {
      ctx.fail("X must be 4-D" + std::string(opset_ >= 20 ? " or 3-D / 5-D" : "") + ", got " +
               x.describe());
    }
    const size_t k = rank - 2;
    if (grid.rank() != rank || grid.dim(0) != x.dim(0) ||
        grid.dim(rank - 1) != static_cast<int64_t>(k)) {
      ctx.fail("grid " + grid.describe() + " does not match X " + x.describe());
    }
    Shape out_shape{x.dim(0), x.dim(1)};
    for (size_t d = 1; d + 1 < rank; ++d) out_shape.push_back(grid.dim(d));
    for (size_t d = 2; d < rank; ++d) {
      if (x.dim(d) == 0 && shape_numel(out_shape) != 0) ctx.fail("cannot sample an empty image");
    }
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    const std::vector<double> g = read_float_tensor(grid);
    dispatch(
        FloatTypes{}, x.dtype(), [&]<typename T>() { sample_points<T>(x, g, y, rule_); }, "X");
  }

 private:
  int64_t opset_;
  AxisRule rule_{Sampling::Linear, Padding::Zeros, false};
};

class AffineGrid final : public Kernel {
 public:
  explicit AffineGrid(const NodeInfo& info)
      : align_corners_(info.attr_int("align_corners", 0) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& theta = ctx.input(0);
    const std::vector<int64_t> size = to_int64s(ctx.input(1));
    if (size.size() != 4 && size.size() != 5) {
      ctx.fail("size must hold 4 (2-D) or 5 (3-D) values, got " + std::to_string(size.size()));
    }
    const int64_t k = static_cast<int64_t>(size.size()) - 2;
    if (theta.rank() != 3 || theta.dim(0) != size[0] || theta.dim(1) != k ||
        theta.dim(2) != k + 1) {
      ctx.fail("theta " + theta.describe() + " does not match size");
    }
    for (int64_t s : size) {
      if (s < 0) ctx.fail("size has a negative value");
    }
    // Spatial sizes in output order: (H, W) or (D, H, W).
    const Shape spatial(size.begin() + 2, size.end());
    Shape out_shape{size[0]};
    out_shape.insert(out_shape.end(), spatial.begin(), spatial.end());
    out_shape.push_back(k);
    Tensor& y = ctx.output(0, theta.dtype(), out_shape);
    if (y.numel() == 0) return;
    const std::vector<double> th = read_float_tensor(theta);
    // Base coordinates along each spatial axis.
    std::vector<std::vector<double>> base(static_cast<size_t>(k));
    for (size_t d = 0; d < base.size(); ++d) {
      const int64_t len = spatial[d];
      for (int64_t i = 0; i < len; ++i) {
        const double v =
            align_corners_
                ? (len == 1 ? -1.0
                            : -1 + 2.0 * static_cast<double>(i) / static_cast<double>(len - 1))
                : -1 + (2.0 * static_cast<double>(i) + 1) / static_cast<double>(len);
        base[d].push_back(v);
      }
    }
    const int64_t points = shape_numel(spatial);
    dispatch(FloatTypes{}, theta.dtype(), [&]<typename T>() {
      T* out = y.data<T>();
      parallel_for(size[0] * points, grain_for(16 * k), [&](int64_t begin, int64_t end) {
        for (int64_t q = begin; q < end; ++q) {
          const int64_t n = q / points;
          int64_t rest = q % points;
          // Homogeneous source point (x, y[, z], 1): x follows the last axis.
          double h[4] = {0, 0, 0, 0};
          h[k] = 1;
          for (int64_t d = k - 1; d >= 0; --d) {
            const int64_t i = rest % spatial[static_cast<size_t>(d)];
            rest /= spatial[static_cast<size_t>(d)];
            h[k - 1 - d] = base[static_cast<size_t>(d)][static_cast<size_t>(i)];
          }
          const double* m = th.data() + n * k * (k + 1);
          for (int64_t r = 0; r < k; ++r) {
            double acc = 0;
            for (int64_t c = 0; c <= k; ++c) acc += m[r * (k + 1) + c] * h[c];
            out[q * k + r] = from_compute<T>(static_cast<compute_t<T>>(acc));
          }
        }
      });
    });
  }

 private:
  bool align_corners_;
};

// [N, C] then the grid's spatial dims.
void grid_sample_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& grid = c.shape(1);
  const size_t rank = x.size();
  if (rank < 3 || rank > 2 + kMaxSpatial || (c.opset() < 20 && rank != 4)) unknown("X's rank");
  if (grid.size() != rank || grid[0] != x[0] || grid[rank - 1] != static_cast<int64_t>(rank - 2)) {
    unknown("grid does not match X");
  }
  Shape out{x[0], x[1]};
  out.insert(out.end(), grid.begin() + 1, grid.end() - 1);
  for (size_t d = 2; d < rank; ++d) {
    if (x[d] == 0 && numel_or_unknown(out) != 0) unknown("cannot sample an empty image");
  }
  c.set(0, c.dtype(0), out);
}

// [N, spatial..., k] from size = [N, C, spatial...].
void affine_grid_shape(ShapeContext& c) {
  const std::vector<int64_t>& size = c.data(1);
  if (size.size() != 4 && size.size() != 5) unknown("size must hold 4 or 5 values");
  const auto k = static_cast<int64_t>(size.size()) - 2;
  if (c.shape(0) != Shape{size[0], k, k + 1}) unknown("theta does not match size");
  for (int64_t s : size) {
    if (s < 0) unknown("size has a negative value");
  }
  Shape out{size[0]};
  out.insert(out.end(), size.begin() + 2, size.end());
  out.push_back(k);
  c.set(0, c.dtype(0), out);
}

}  // namespace

KILN_REGISTER_OP({.op = "GridSample",
                  .since = 16,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .types = "float, double, float16, bfloat16",
                  .shape = grid_sample_shape,
                  .create = make<GridSample>});
KILN_REGISTER_OP({.op = "AffineGrid",
                  .since = 20,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .types = "float, double, float16, bfloat16",
                  .shape = affine_grid_shape,
                  .create = make<AffineGrid>});

}  // namespace kiln::ops
