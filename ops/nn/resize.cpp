// Resize (opset 10+) and Upsample (7+): nearest, linear and cubic interpolation along any
// axes, with every coordinate transformation mode, antialiasing, tf_crop_and_resize, and the
// axes / keep_aspect_ratio_policy attributes of opset 18.
//
// Each resized axis gets a filter table: for every output index, `taps` input indices
// (clamped to the axis: the spec's edge padding) with their weights. Nearest mode is then a
// gather of whole elements, for any element type. Linear and cubic apply the tables one axis
// at a time (the filters are separable) in float, or double for double and integer types;
// the last two axes (the image plane) are done together per output row, so no intermediate
// image is stored for the common NCHW case.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

enum class Mode { Nearest, Linear, Cubic };
enum class Coord {
  HalfPixel,
  HalfPixelSymmetric,
  PytorchHalfPixel,
  AlignCorners,
  Asymmetric,
  TfHalfPixelForNN,
  TfCropAndResize
};
// Simple is Resize-10 and Upsample: truncate when upsampling, ceil when downsampling.
enum class Rounding { RoundPreferFloor, RoundPreferCeil, Floor, Ceil, Simple };
enum class Policy { Stretch, NotLarger, NotSmaller };

struct Params {
  Mode mode = Mode::Nearest;
  Coord coord = Coord::HalfPixel;
  Rounding rounding = Rounding::RoundPreferFloor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation = 0.0;
};

struct AxisFilter {
  int64_t in = 0, out = 0;
  int64_t taps = 1;
  std::vector<int64_t> index;    // out * taps, inside [0, in)
  std::vector<double> weight;    // out * taps (unused for nearest)
  std::vector<uint8_t> outside;  // per output index: tf_crop_and_resize extrapolates
  bool any_outside = false;
};

// Position in the input that output index `y` maps to.
double source_coord(const Params& p, double y, int64_t in, int64_t out, double scale, double r0,
                    double r1) {
  const double out_w = scale * static_cast<double>(in);
  const double len = static_cast<double>(in);
  switch (p.coord) {
    case Coord::HalfPixel:
      return (y + 0.5) / scale - 0.5;
    case Coord::HalfPixelSymmetric: {
      const double offset = len / 2 * (1 - static_cast<double>(out) / out_w);
      return offset + (y + 0.5) / scale - 0.5;
    }
    case Coord::PytorchHalfPixel:
      return out_w == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
    case Coord::AlignCorners:
      return out_w == 1 ? 0.0 : y * (len - 1) / (out_w - 1);
    case Coord::Asymmetric:
      return y / scale;
    case Coord::TfHalfPixelForNN:
      return (y + 0.5) / scale;
    case Coord::TfCropAndResize: {
      const double x =
          out_w == 1 ? (r1 - r0) * (len - 1) / 2 : y * (r1 - r0) * (len - 1) / (out_w - 1);
      return x + r0 * (len - 1);
    }
  }
  return 0;
}

double cubic_kernel(double t, double a) {
  t = std::abs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

// Taps follow the reference's neighbourhood rule: the input position x is split into a base
// b and a ratio r in (0, 1] (an integer x gives b = x - 1, r = 1), and tap k reads input
// b + s0 + k at signed distance s0 + k - r from x.
AxisFilter build_filter(const Params& p, int64_t in, int64_t out, double scale, double r0,
                        double r1) {
  AxisFilter f;
  f.in = in;
  f.out = out;
  int64_t s0 = p.mode == Mode::Cubic ? -1 : 0;
  double fscale = 1;
  if (p.antialias && p.mode != Mode::Nearest && scale < 1) {
    fscale = scale;
    s0 = static_cast<int64_t>(std::floor((p.mode == Mode::Linear ? -1.0 : -2.0) / scale)) + 1;
  }
  const int64_t taps = 2 - 2 * s0;
  f.taps = p.mode == Mode::Nearest ? 1 : taps;
  f.index.resize(static_cast<size_t>(out * f.taps));
  if (p.mode != Mode::Nearest) f.weight.resize(f.index.size());
  if (p.coord == Coord::TfCropAndResize) f.outside.assign(static_cast<size_t>(out), 0);
  // Far outside the input every tap is clamped to the edge, so x can be clamped first.
  const double lo = -static_cast<double>(taps + 2), hi = static_cast<double>(in + taps + 2);
  std::vector<double> w(static_cast<size_t>(taps));
  for (int64_t y = 0; y < out; ++y) {
    double x = source_coord(p, static_cast<double>(y), in, out, scale, r0, r1);
    if (p.coord == Coord::TfCropAndResize && !(x >= 0 && x <= static_cast<double>(in - 1))) {
      f.outside[static_cast<size_t>(y)] = 1;
      f.any_outside = true;
    }
    if (!(x >= lo)) x = lo;
    if (x > hi) x = hi;
    const double fl = std::floor(x);
    const bool integral = x == fl;
    const int64_t base = static_cast<int64_t>(fl) - (integral ? 1 : 0);
    const double r = integral ? 1.0 : x - fl;
    int64_t* idx = f.index.data() + y * f.taps;
    if (p.mode == Mode::Nearest) {
      bool upper = integral;
      if (!integral) {
        switch (p.rounding) {
          case Rounding::RoundPreferFloor:
            upper = r > 0.5;
            break;
          case Rounding::RoundPreferCeil:
            upper = r >= 0.5;
            break;
          case Rounding::Floor:
            upper = false;
            break;
          case Rounding::Ceil:
            upper = true;
            break;
          case Rounding::Simple:
            upper = scale < 1;
            break;
        }
      }
      idx[0] = std::clamp<int64_t>(base + (upper ? 1 : 0), 0, in - 1);
      continue;
    }
    double sum = 0;
    for (int64_t k = 0; k < taps; ++k) {
      const double d = (static_cast<double>(s0 + k) - r) * fscale;
      w[k] = p.mode == Mode::Linear ? std::max(0.0, 1 - std::abs(d)) : cubic_kernel(d, p.cubic_a);
      sum += w[k];
    }
    if (fscale != 1 && sum != 0) {
      for (double& v : w) v /= sum;
    }
    if (p.exclude_outside) {
      sum = 0;
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t i = base + s0 + k;
        if (i < 0 || i >= in) w[k] = 0;
        sum += w[k];
      }
      if (sum == 0) sum = 1;
      for (double& v : w) v /= sum;
    }
    double* wt = f.weight.data() + y * taps;
    for (int64_t k = 0; k < taps; ++k) {
      idx[k] = std::clamp<int64_t>(base + s0 + k, 0, in - 1);
      wt[k] = w[k];
    }
  }
  return f;
}

// ---- nearest: a gather of elements of `U` (the element's width) ----

template <typename U>
void gather_nearest(const Tensor& x, Tensor& y, const std::vector<AxisFilter>& filters,
                    const std::vector<uint8_t>& extrapolation) {
  const Shape& in_shape = x.shape();
  const Shape& out_shape = y.shape();
  const size_t rank = out_shape.size();
  const Shape in_strides = contiguous_strides(in_shape);
  const int64_t wo = out_shape[rank - 1];
  const int64_t rows = y.numel() / wo;
  const U* src = reinterpret_cast<const U*>(x.raw_data());
  U* dst = reinterpret_cast<U*>(y.raw_data());
  U fill{};
  std::memcpy(&fill, extrapolation.data(), sizeof(U));
  const AxisFilter& fw = filters[rank - 1];
  parallel_for(rows, grain_for(wo), [&](int64_t begin, int64_t end) {
    int64_t prev_off = -1;
    bool prev_outside = false;
    for (int64_t r = begin; r < end; ++r) {
      int64_t off = 0, rest = r;
      bool outside = false;
      for (size_t d = rank - 1; d-- > 0;) {
        const int64_t c = rest % out_shape[d];
        rest /= out_shape[d];
        const AxisFilter& f = filters[d];
        off += f.index[static_cast<size_t>(c)] * in_strides[d];
        outside = outside || (f.any_outside && f.outside[static_cast<size_t>(c)]);
      }
      U* o = dst + r * wo;
      // Upsampling repeats source rows: copy the row just written.
      if (r > begin && off == prev_off && outside == prev_outside) {
        std::memcpy(o, o - wo, static_cast<size_t>(wo) * sizeof(U));
        continue;
      }
      prev_off = off;
      prev_outside = outside;
      if (outside) {
        std::fill(o, o + wo, fill);
        continue;
      }
      const U* s = src + off;
      const int64_t* ix = fw.index.data();
      if (fw.any_outside) {
        for (int64_t i = 0; i < wo; ++i)
          o[i] = fw.outside[static_cast<size_t>(i)] ? fill : s[ix[i]];
      } else {
        for (int64_t i = 0; i < wo; ++i) o[i] = s[ix[i]];
      }
    }
  });
}

// ---- linear and cubic, in compute type C ----

template <typename C>
struct Taps {
  const AxisFilter* f = nullptr;
  std::vector<C> w;
  explicit Taps(const AxisFilter* filter) : f(filter) {
    if (f) w.assign(f->weight.begin(), f->weight.end());
  }
};

// out[o, y, :] = sum_k w[y, k] * in[o, idx[y, k], :] for an axis with `inner` trailing elements.
template <typename C>
void resize_axis(const C* in, C* out, int64_t outer, int64_t inner, const Taps<C>& t, C fill) {
  const AxisFilter& f = *t.f;
  const int64_t taps = f.taps;
  parallel_for(outer * f.out, grain_for(inner * taps), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t o = r / f.out, y = r % f.out;
      C* dst = out + r * inner;
      if (f.any_outside && f.outside[static_cast<size_t>(y)]) {
        std::fill(dst, dst + inner, fill);
        continue;
      }
      const C* src = in + o * f.in * inner;
      const int64_t* idx = f.index.data() + y * taps;
      const C* w = t.w.data() + y * taps;
      const C* s = src + idx[0] * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = w[0] * s[i];
      for (int64_t k = 1; k < taps; ++k) {
        if (w[k] == C(0)) continue;
        s = src + idx[k] * inner;
        const C wk = w[k];
        for (int64_t i = 0; i < inner; ++i) dst[i] += wk * s[i];
      }
    }
  });
}

// Resizes the last two axes of [planes, h, w] together, one output row at a time. Either
// filter may be null (that axis is unchanged).
template <typename C>
void resize_plane(const C* in, C* out, int64_t planes, int64_t h, int64_t w, const Taps<C>& th,
                  const Taps<C>& tw, C fill) {
  const int64_t ho = th.f ? th.f->out : h;
  const int64_t wo = tw.f ? tw.f->out : w;
  const int64_t cost = (th.f ? th.f->taps * w : 0) + (tw.f ? tw.f->taps * wo : wo);
  parallel_for(planes * ho, grain_for(cost), [&](int64_t begin, int64_t end) {
    std::vector<C> tmp(th.f ? static_cast<size_t>(w) : 0);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r / ho, y = r % ho;
      C* dst = out + r * wo;
      const C* plane = in + p * h * w;
      const C* row = plane + y * w;
      if (th.f) {
        const AxisFilter& f = *th.f;
        if (f.any_outside && f.outside[static_cast<size_t>(y)]) {
          std::fill(dst, dst + wo, fill);
          continue;
        }
        const int64_t* idx = f.index.data() + y * f.taps;
        const C* wt = th.w.data() + y * f.taps;
        const C* s = plane + idx[0] * w;
        for (int64_t i = 0; i < w; ++i) tmp[i] = wt[0] * s[i];
        for (int64_t k = 1; k < f.taps; ++k) {
          if (wt[k] == C(0)) continue;
          s = plane + idx[k] * w;
          const C wk = wt[k];
          for (int64_t i = 0; i < w; ++i) tmp[i] += wk * s[i];
        }
        row = tmp.data();
      }
      if (!tw.f) {
        std::copy(row, row + w, dst);
        continue;
      }
      const AxisFilter& f = *tw.f;
      const int64_t* idx = f.index.data();
      const C* wt = tw.w.data();
      if (f.taps == 2) {
        for (int64_t i = 0; i < wo; ++i) {
          dst[i] = wt[2 * i] * row[idx[2 * i]] + wt[2 * i + 1] * row[idx[2 * i + 1]];
        }
      } else {
        for (int64_t i = 0; i < wo; ++i) {
          C acc = 0;
          for (int64_t k = 0; k < f.taps; ++k) acc += wt[i * f.taps + k] * row[idx[i * f.taps + k]];
          dst[i] = acc;
        }
      }
      if (f.any_outside) {
        for (int64_t i = 0; i < wo; ++i) {
          if (f.outside[static_cast<size_t>(i)]) dst[i] = fill;
        }
      }
    }
  });
}

// Applies the filters (null = axis unchanged) to `src` of `shape`, writing `dst`.
template <typename C>
void interpolate(const C* src, C* dst, const Shape& shape,
                 const std::vector<const AxisFilter*>& filters, C fill) {
  const size_t rank = shape.size();
  const size_t plane_axis = rank >= 2 ? rank - 2 : 0;
  Shape cur = shape;
  std::vector<C> buf_a, buf_b;
  const C* cur_data = src;
  // Axes before the plane, one pass each.
  for (size_t d = 0; d < plane_axis; ++d) {
    if (!filters[d]) continue;
    const int64_t outer = shape_numel(Shape(cur.begin(), cur.begin() + static_cast<long>(d)));
    const int64_t inner = shape_numel(Shape(cur.begin() + static_cast<long>(d) + 1, cur.end()));
    std::vector<C>& next = cur_data == buf_a.data() && !buf_a.empty() ? buf_b : buf_a;
    next.resize(static_cast<size_t>(outer * filters[d]->out * inner));
    resize_axis<C>(cur_data, next.data(), outer, inner, Taps<C>(filters[d]), fill);
    cur[d] = filters[d]->out;
    cur_data = next.data();
  }
  const int64_t w = cur[rank - 1];
  const int64_t h = rank >= 2 ? cur[rank - 2] : 1;
  const int64_t planes = shape_numel(cur) / std::max<int64_t>(1, h * w);
  const AxisFilter* fh = rank >= 2 ? filters[rank - 2] : nullptr;
  resize_plane<C>(cur_data, dst, planes, h, w, Taps<C>(fh), Taps<C>(filters[rank - 1]), fill);
}

// Half types compute in float; double and integers in double, so that integer results round
// like the reference (which computes in double).
template <typename T>
using work_t = std::conditional_t<std::is_same_v<compute_t<T>, float>, float, double>;

template <typename T, typename C>
T to_element(C v) {
  if constexpr (std::is_integral_v<T>) {
    if (std::isnan(v)) return T(0);
    v = std::nearbyint(v);
    if (v <= static_cast<C>(std::numeric_limits<T>::lowest()))
      return std::numeric_limits<T>::lowest();
    if (v >= static_cast<C>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  } else {
    return from_compute<T>(static_cast<compute_t<T>>(v));
  }
}

template <typename T>
void interpolate_typed(const Tensor& x, Tensor& y, const std::vector<const AxisFilter*>& filters,
                       double extrapolation) {
  using C = work_t<T>;
  const C fill = static_cast<C>(extrapolation);
  if constexpr (std::is_same_v<T, C>) {
    interpolate<C>(x.data<const T>(), y.data<T>(), x.shape(), filters, fill);
  } else {
    const T* xs = x.data<const T>();
    std::vector<C> in(static_cast<size_t>(x.numel())), out(static_cast<size_t>(y.numel()));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<C>(static_cast<compute_t<T>>(xs[i]));
    interpolate<C>(in.data(), out.data(), x.shape(), filters, fill);
    T* ys = y.data<T>();
    for (size_t i = 0; i < out.size(); ++i) ys[i] = to_element<T, C>(out[i]);
  }
}

// The extrapolation value as one element of `dt`, for the nearest gather.
std::vector<uint8_t> element_bytes(DataType dt, double v) {
  std::vector<uint8_t> out(8, 0);
  dispatch(PodTypes{}, dt, [&]<typename T>() {
    T t{};
    if constexpr (std::is_same_v<T, bool>) {
      t = v != 0;
    } else {
      t = to_element<T, double>(v);
    }
    std::memcpy(out.data(), &t, sizeof(T));
  });
  return out;
}

std::vector<double> read_doubles(const Tensor& t, const char* what) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  const Tensor c = t.contiguous();
  if (type_in(FloatTypes{}, t.dtype())) {
    dispatch(FloatTypes{}, t.dtype(), [&]<typename T>() {
      const T* p = c.data<const T>();
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
    });
  } else {
    throw Error(ErrorKind::Runtime,
                std::string(what) + " must be a float tensor, got " + t.describe());
  }
  return out;
}

// The output shape (`out`, from `x`'s) and per-axis scales (`scale`, 1 elsewhere) of resizing
// `x` along `axes` to `sizes` (with the aspect-ratio `policy`) or, when `sizes` is empty, by
// `scales` (Upsample's at least 1). The kernel and the shape rule both compute them here.
void resize_extent(const Shape& x, const std::vector<size_t>& axes,
                   const std::vector<int64_t>& sizes, const std::vector<double>& scales,
                   Policy policy, bool upsample, Shape* out, std::vector<double>* scale) {
  auto fail = [&](const std::string& m) { throw Error(ErrorKind::Runtime, m); };
  const size_t n = axes.size();
  *out = x;
  scale->assign(x.size(), 1.0);
  std::vector<double>& sc = *scale;
  if (!sizes.empty()) {
    if (sizes.size() != n) {
      fail("sizes has " + std::to_string(sizes.size()) + " values for " + std::to_string(n) +
           " axes of input " + shape_to_string(x));
    }
    for (size_t i = 0; i < n; ++i) {
      const size_t d = axes[i];
      if (sizes[i] < 0) fail("sizes has a negative value " + std::to_string(sizes[i]));
      if (x[d] == 0 && sizes[i] != 0) fail("cannot resize an empty axis to a non-empty one");
      (*out)[d] = sizes[i];
      sc[d] = x[d] == 0 ? 1.0 : static_cast<double>(sizes[i]) / static_cast<double>(x[d]);
    }
    if (policy != Policy::Stretch && n > 0) {
      double s = sc[axes[0]];
      for (size_t d : axes)
        s = policy == Policy::NotLarger ? std::min(s, sc[d]) : std::max(s, sc[d]);
      for (size_t d : axes) {
        const double o = s * static_cast<double>(x[d]) + 0.5;
        if (!(o < 9.0e15)) fail("output too large");
        sc[d] = s;
        (*out)[d] = static_cast<int64_t>(o);
      }
    }
    return;
  }
  if (scales.size() != n) {
    fail("scales has " + std::to_string(scales.size()) + " values for " + std::to_string(n) +
         " axes of input " + shape_to_string(x));
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t d = axes[i];
    const double s = scales[i];
    if (!(s > 0) || !std::isfinite(s) || (upsample && s < 1)) {
      fail("scale " + std::to_string(s) + " is out of range" +
           (upsample ? " (Upsample needs scales >= 1)" : ""));
    }
    const double o = std::floor(s * static_cast<double>(x[d]));
    if (!(o < 9.0e15)) fail("output too large");
    sc[d] = s;
    (*out)[d] = static_cast<int64_t>(o);
  }
}

class Resize final : public Kernel {
 public:
  explicit Resize(const NodeInfo& info) : upsample_(info.op_type() == "Upsample") {
    const int64_t opset = info.opset();
    const std::string mode = info.attr_string("mode", "nearest");
    if (mode == "nearest") {
      p_.mode = Mode::Nearest;
    } else if (mode == "linear" || (upsample_ && mode == "bilinear")) {
      p_.mode = Mode::Linear;
    } else if (mode == "cubic" && !upsample_ && opset >= 11) {
      p_.mode = Mode::Cubic;
    } else {
      info.fail("unsupported mode '" + mode + "'", ErrorKind::Unsupported);
    }
    if (upsample_ || opset < 11) {
      p_.coord = Coord::Asymmetric;
      p_.rounding = Rounding::Simple;
      if (upsample_ && opset < 9) {
        if (!info.has_attr("scales")) info.fail("missing required attribute 'scales'");
        for (float s : info.attr_floats("scales")) attr_scales_.push_back(s);
      }
      return;
    }
    const std::string coord = info.attr_string("coordinate_transformation_mode", "half_pixel");
    const std::pair<const char*, Coord> coords[] = {
        {"half_pixel", Coord::HalfPixel},
        {"half_pixel_symmetric", Coord::HalfPixelSymmetric},
        {"pytorch_half_pixel", Coord::PytorchHalfPixel},
        {"align_corners", Coord::AlignCorners},
        {"asymmetric", Coord::Asymmetric},
        {"tf_half_pixel_for_nn", Coord::TfHalfPixelForNN},
        {"tf_crop_and_resize", Coord::TfCropAndResize}};
    if (!lookup(coords, coord, &p_.coord)) {
      info.fail("unknown coordinate_transformation_mode '" + coord + "'", ErrorKind::Unsupported);
    }
    const std::string nearest = info.attr_string("nearest_mode", "round_prefer_floor");
    const std::pair<const char*, Rounding> roundings[] = {
        {"round_prefer_floor", Rounding::RoundPreferFloor},
        {"round_prefer_ceil", Rounding::RoundPreferCeil},
        {"floor", Rounding::Floor},
        {"ceil", Rounding::Ceil}};
    if (!lookup(roundings, nearest, &p_.rounding)) {
      info.fail("unknown nearest_mode '" + nearest + "'", ErrorKind::Unsupported);
    }
    p_.cubic_a = info.attr_float("cubic_coeff_a", -0.75f);
    p_.exclude_outside = info.attr_int("exclude_outside", 0) != 0;
    p_.extrapolation = info.attr_float("extrapolation_value", 0.0f);
    if (opset >= 18) {
      p_.antialias = info.attr_int("antialias", 0) != 0;
      axes_ = info.attr_ints("axes");
      const std::string policy = info.attr_string("keep_aspect_ratio_policy", "stretch");
      const std::pair<const char*, Policy> policies[] = {{"stretch", Policy::Stretch},
                                                         {"not_larger", Policy::NotLarger},
                                                         {"not_smaller", Policy::NotSmaller}};
      if (!lookup(policies, policy, &policy_)) {
        info.fail("unknown keep_aspect_ratio_policy '" + policy + "'", ErrorKind::Unsupported);
      }
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const size_t rank = x.rank();
    const int64_t r = static_cast<int64_t>(rank);
    // The axes the scales / sizes / roi values refer to.
    std::vector<size_t> axes;
    if (axes_.empty()) {
      for (size_t d = 0; d < rank; ++d) axes.push_back(d);
    } else {
      std::vector<bool> seen(rank, false);
      for (int64_t a : axes_) {
        const size_t d = static_cast<size_t>(normalize_axis(a, r));
        if (seen[d]) ctx.fail("axes has a repeated axis " + std::to_string(a));
        seen[d] = true;
        axes.push_back(d);
      }
    }
    const size_t n = axes.size();

    std::vector<double> scales;
    std::vector<int64_t> sizes;
    std::vector<double> roi;
    if (upsample_ && ctx.opset() < 9) {
      scales = attr_scales_;
    } else if (upsample_ || ctx.opset() < 11) {
      scales = read_doubles(ctx.input(1), "scales");
    } else {
      if (ctx.has_input(2)) scales = read_doubles(ctx.input(2), "scales");
      if (ctx.has_input(3)) sizes = to_int64s(ctx.input(3));
      if (ctx.has_input(1) && p_.coord == Coord::TfCropAndResize) {
        roi = read_doubles(ctx.input(1), "roi");
      }
      if (!scales.empty() && !sizes.empty()) ctx.fail("only one of scales and sizes may be given");
      if (scales.empty() && sizes.empty()) ctx.fail("one of scales and sizes must be given");
    }
    if (!roi.empty() && roi.size() != 2 * n) {
      ctx.fail("roi has " + std::to_string(roi.size()) + " values, expected " +
               std::to_string(2 * n));
    }

    // Per-axis scale, output size and roi over the whole rank.
    std::vector<double> scale, r0(rank, 0.0), r1(rank, 1.0);
    Shape out_shape;
    for (size_t i = 0; i < n; ++i) {
      if (!roi.empty()) {
        r0[axes[i]] = roi[i];
        r1[axes[i]] = roi[n + i];
      }
    }
    resize_extent(x.shape(), axes, sizes, scales, policy_, upsample_, &out_shape, &scale);

    // Axes that change; the others keep the input unchanged.
    std::vector<AxisFilter> filters(rank);
    std::vector<const AxisFilter*> active(rank, nullptr);
    bool any = false;
    for (size_t d = 0; d < rank; ++d) {
      const bool crops = p_.coord == Coord::TfCropAndResize && (r0[d] != 0 || r1[d] != 1);
      any = any || out_shape[d] != x.dim(d) || scale[d] != 1 || crops;
    }
    if (!any) {
      ctx.set_output(0, ctx.input_value(0));  // nothing to resample: share the input
      return;
    }
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    for (size_t d = 0; d < rank; ++d) {
      const bool crops = p_.coord == Coord::TfCropAndResize && (r0[d] != 0 || r1[d] != 1);
      const bool identity = out_shape[d] == x.dim(d) && scale[d] == 1 && !crops;
      if (!identity || p_.mode == Mode::Nearest) {
        filters[d] = build_filter(p_, x.dim(d), out_shape[d], scale[d], r0[d], r1[d]);
      }
      if (!identity) active[d] = &filters[d];
    }

    if (p_.mode == Mode::Nearest) {
      if (bits_per_element(x.dtype()) % 8 != 0 || x.dtype() == DataType::String) {
        throw_unsupported_type(x.dtype(), "Resize input");
      }
      const std::vector<uint8_t> fill = element_bytes(x.dtype(), p_.extrapolation);
      switch (bits_per_element(x.dtype())) {
        case 8:
          return gather_nearest<uint8_t>(x, y, filters, fill);
        case 16:
          return gather_nearest<uint16_t>(x, y, filters, fill);
        case 32:
          return gather_nearest<uint32_t>(x, y, filters, fill);
        case 64:
          return gather_nearest<uint64_t>(x, y, filters, fill);
        default:
          throw_unsupported_type(x.dtype(), "Resize input");
      }
    }
    dispatch(NumericTypes{}, x.dtype(),
             [&]<typename T>() { interpolate_typed<T>(x, y, active, p_.extrapolation); });
  }

 private:
  template <typename E, size_t N>
  static bool lookup(const std::pair<const char*, E> (&table)[N], const std::string& s, E* out) {
    for (const auto& [name, value] : table) {
      if (s == name) {
        *out = value;
        return true;
      }
    }
    return false;
  }

  bool upsample_;
  Params p_;
  Policy policy_ = Policy::Stretch;
  std::vector<int64_t> axes_;
  std::vector<double> attr_scales_;
};

// Resize's scales or sizes as a shape rule knows them: Upsample's attribute scales, float
// scales from an initializer, integer sizes from the facts. An empty input counts as
// omitted, as in the kernel.
struct ResizeArgs {
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  bool scales_from_input = false;
};

// Whether input i is omitted or holds no values.
bool resize_input_empty(const ir::Node& node, size_t i, const ValueFacts* facts) {
  if (i >= node.inputs.size() || node.inputs[i] == ir::kNoValue) return true;
  return facts && facts->known && numel_or_unknown(facts->shape) == 0;
}

std::vector<double> constant_doubles(const ShapeContext& c, size_t i) {
  const Tensor* t = c.constant_input(i);
  if (!t) unknown("float scales are only known when run unless they are an initializer");
  return read_doubles(*t, "scales");
}

ResizeArgs resize_args(const ShapeContext& c) {
  const ir::Node& node = c.node();
  ResizeArgs a;
  if (node.op_type == "Upsample" && node.opset < 9) {
    const ir::Attribute* s = node.attr("scales");
    if (!s) unknown("missing scales");
    a.scales.assign(s->floats.begin(), s->floats.end());
    return a;
  }
  a.scales_from_input = true;
  if (node.op_type == "Upsample" || node.opset < 11) {
    a.scales = constant_doubles(c, 1);
    return a;
  }
  if (!resize_input_empty(node, 2, c.has_input(2) ? &c.in(2) : nullptr))
    a.scales = constant_doubles(c, 2);
  if (!resize_input_empty(node, 3, c.has_input(3) ? &c.in(3) : nullptr)) a.sizes = c.data(3);
  if (a.scales.empty() == a.sizes.empty()) unknown("exactly one of scales and sizes is needed");
  return a;
}

// The output shape the kernel computes, and whether it is the input unchanged (the kernel
// then shares it).
struct ResizeTarget {
  Shape shape;
  bool unchanged = true;
};

// The axes scales and sizes refer to (opset 18's `axes`, else all).
std::vector<size_t> resize_axes(const ir::Node& node, int64_t rank) {
  std::vector<size_t> axes;
  const ir::Attribute* a = node.opset >= 18 ? node.attr("axes") : nullptr;
  if (!a || a->ints.empty()) {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(static_cast<size_t>(d));
    return axes;
  }
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t v : a->ints) {
    const auto d = static_cast<size_t>(normalize_axis(v, rank));
    if (seen[d]) unknown("repeated axis");
    seen[d] = true;
    axes.push_back(d);
  }
  return axes;
}

ResizeTarget resize_target(const ir::Node& node, const Shape& x, const ResizeArgs& args) {
  const std::vector<size_t> axes = resize_axes(node, static_cast<int64_t>(x.size()));
  const bool upsample = node.op_type == "Upsample";
  ResizeTarget t{x, true};
  Policy policy = Policy::Stretch;
  const ir::Attribute* p = node.opset >= 18 ? node.attr("keep_aspect_ratio_policy") : nullptr;
  if (p && p->s == "not_larger") {
    policy = Policy::NotLarger;
  } else if (p && p->s == "not_smaller") {
    policy = Policy::NotSmaller;
  } else if (p && p->s != "stretch") {
    unknown("unknown keep_aspect_ratio_policy");
  }
  std::vector<double> scale;
  resize_extent(x, axes, args.sizes, args.scales, policy, upsample, &t.shape, &scale);
  for (size_t d = 0; d < x.size(); ++d) {
    t.unchanged = t.unchanged && t.shape[d] == x[d] && scale[d] == 1;
  }
  // A crop by float roi values may change an unchanged-looking input.
  const ir::Attribute* coord = node.attr("coordinate_transformation_mode");
  if (t.unchanged && coord && coord->s == "tf_crop_and_resize" && node.opset >= 11 && !upsample &&
      node.inputs.size() > 1 && node.inputs[1] != ir::kNoValue) {
    unknown("roi is only known when run");
  }
  return t;
}

void resize_shape(ShapeContext& c) {
  const ResizeArgs args = resize_args(c);
  const ResizeTarget t = resize_target(c.node(), c.shape(0), args);
  // Buffer prediction cannot read float scales again: leave out the one case where they
  // decide between sharing the input and a fresh output of the same shape.
  if (args.scales_from_input && args.sizes.empty() && t.shape == c.shape(0) && !t.unchanged) {
    unknown("scales that resample without changing the shape");
  }
  c.set(0, c.dtype(0), t.shape);
}

// The kernel shares the input when nothing is resampled. With integer sizes (Resize opset
// 11+ with a non-empty sizes input) that is recomputed here; with scales, resize_shape
// leaves an output of the input's shape known only when every scale is 1.
void place_resize(Placement& p) {
  const ir::Node& n = p.node();
  const Shape& x = p.input(0).shape;
  bool unchanged = p.output(0).shape == x;
  if (unchanged && n.op_type == "Resize" && n.opset >= 11 &&
      !resize_input_empty(
          n, 3, n.inputs.size() > 3 && n.inputs[3] != ir::kNoValue ? &p.input(3) : nullptr)) {
    ResizeArgs args;
    args.sizes = p.input(3).data;
    unchanged = resize_target(n, x, args).unchanged;
  }
  if (unchanged) {
    p.view(0, 0, p.strides(0));
  } else {
    p.allocate(0);
  }
}

}  // namespace

KILN_REGISTER_OP({.op = "Resize",
                  .since = 10,
                  .min_inputs = 1,
                  .types = "float, double, float16, bfloat16, integers (nearest: any fixed-width)",
                  .shape = resize_shape,
                  .place = place_resize,
                  .create = make<Resize>});
KILN_REGISTER_OP({.op = "Upsample",
                  .since = 7,
                  .min_inputs = 1,
                  .types = "float, double, float16, bfloat16, integers (nearest: any fixed-width)",
                  .shape = resize_shape,
                  .place = place_resize,
                  .create = make<Resize>});

}  // namespace kiln::ops
