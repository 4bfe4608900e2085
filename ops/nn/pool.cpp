// MaxPool (with the optional Indices output), AveragePool and LpPool over 1 to 3 spatial
// dimensions, with strides, dilations, explicit or automatic padding and ceil_mode.
//
// Float max pooling (without Indices) and average pooling run the dispatched plane kernels
// (pool_planes_float): 1-D and 2-D windows at column strides 1 and 2 rows first, straight
// from the input (ConvKernels::pool_planes), the rest in place with masked loads, in their
// wide form or from a padded copy. The other types and LpPool: the valid kernel taps of
// every output coordinate are computed once per dimension, so the inner loops never test
// bounds. Planes (image, channel) run in parallel.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/conv/wide_layout.h"
#include "ops/core/common.h"
#include "ops/core/geometry.h"
#include "ops/math/kernels.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

enum class PoolKind { Max, Average, Lp };

// Per output coordinate of one dimension: first input index of the window, the range of
// kernel taps that fall inside the input, and the taps that fall inside input + padding.
struct Taps {
  std::vector<int64_t> start, lo, hi, padded;
};

struct Geometry {
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, stride{1, 1, 1}, dil{1, 1, 1};
  std::array<Taps, 3> taps;
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

// Smallest k >= 0 with start + k * dil >= limit.
int64_t first_tap(int64_t start, int64_t dil, int64_t limit) {
  const int64_t need = limit - start;
  return need <= 0 ? 0 : (need + dil - 1) / dil;
}

// The pooling window's attributes: kernel_shape is required and fixes the rank.
WindowAttrs pool_window(const NodeInfo& info) {
  WindowAttrs a = window_attrs(info.node());
  if (a.kernel_shape.empty()) info.fail("kernel_shape is required");
  if (a.kernel_shape.size() > 3)
    info.fail("pooling over more than 3 dimensions", ErrorKind::Unsupported);
  check_window_ranks(a, a.kernel_shape.size());
  return a;
}

// The spatial axes right-aligned in three dimensions, with every output's kernel taps.
Geometry pool_geometry(const std::vector<WindowAxis>& axes) {
  Geometry g;
  const size_t off = 3 - axes.size();
  for (size_t d = 0; d < axes.size(); ++d) {
    const WindowAxis& a = axes[d];
    const size_t i = off + d;
    g.in[i] = a.in, g.k[i] = a.kernel, g.out[i] = a.out;
    g.stride[i] = a.stride, g.dil[i] = a.dilation;
    Taps& t = g.taps[i];
    for (int64_t o = 0; o < a.out; ++o) {
      const int64_t start = o * a.stride - a.pad_begin;
      t.start.push_back(start);
      const int64_t lo = std::min(first_tap(start, a.dilation, 0), a.kernel);
      t.lo.push_back(lo);
      t.hi.push_back(std::clamp(first_tap(start, a.dilation, a.in), lo, a.kernel));
      t.padded.push_back(std::min(first_tap(start, a.dilation, a.in + a.pad_end), a.kernel));
    }
  }
  for (size_t i = 0; i < off; ++i) g.taps[i] = Taps{{0}, {0}, {1}, {1}};
  return g;
}

// 1 / n, or 0 for an empty window.
template <typename C>
C reciprocal(int64_t n) {
  return n > 0 ? C(1) / static_cast<C>(n) : C(0);
}

// For one dimension: the output range [lo, hi) in which kernel tap k reads inside the
// input, for every tap k.
struct TapRanges {
  std::vector<int64_t> lo, hi;
};

TapRanges tap_ranges(const Geometry& g, size_t dim) {
  TapRanges r;
  const Taps& t = g.taps[dim];
  for (int64_t k = 0; k < g.k[dim]; ++k) {
    int64_t lo = g.out[dim], hi = 0;
    for (int64_t o = 0; o < g.out[dim]; ++o) {
      if (k >= t.lo[static_cast<size_t>(o)] && k < t.hi[static_cast<size_t>(o)]) {
        lo = std::min(lo, o);
        hi = o + 1;
      }
    }
    r.lo.push_back(lo);
    r.hi.push_back(std::max(lo, hi));
  }
  return r;
}

// Copies every row of a plane as its even columns followed by its odd columns, so that a
// stride-2 window reads each tap contiguously.
template <typename T>
void deinterleave_rows(const T* x, int64_t rows, int64_t width, T* out) {
  const int64_t even = (width + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = x + r * width;
    T* e = out + r * width;
    for (int64_t i = 0; i < even; ++i) e[i] = src[2 * i];
    for (int64_t i = 0; i < width / 2; ++i) e[even + i] = src[2 * i + 1];
  }
}

// a[j] = add(a[j], src[off[k] + j]) for all K taps k, in one pass over j.
template <int K, typename T, typename C, typename Op>
inline void fused_row(C* __restrict a, const T* __restrict src, const int64_t* off, int64_t j0,
                      int64_t j1, const Op& op) {
  int64_t o[K];
  for (int k = 0; k < K; ++k) o[k] = off[k];
  for (int64_t j = j0; j < j1; ++j) {
    C acc = a[j];
    for (int k = 0; k < K; ++k) acc = op.add(acc, static_cast<C>(src[o[k] + j]));
    a[j] = acc;
  }
}

template <typename C>
struct MaxOp {
  C init() const {
    if constexpr (std::is_floating_point_v<C>) return -std::numeric_limits<C>::infinity();
    return std::numeric_limits<C>::lowest();
  }
  C add(C acc, C v) const { return v > acc ? v : acc; }
  template <typename T>
  void finish_row(const C* a, T* out, int64_t n, C, const C*, C, const C*) const {
    for (int64_t j = 0; j < n; ++j) out[j] = from_compute<T>(a[j]);
  }
};

template <typename C>
struct AverageOp {
  bool count_pad;
  C init() const { return C(0); }
  C add(C acc, C v) const { return acc + v; }
  template <typename T>
  void finish_row(const C* a, T* out, int64_t n, C outer_valid, const C* inv_valid, C outer_padded,
                  const C* inv_padded) const {
    const C outer = count_pad ? outer_padded : outer_valid;
    const C* inv = count_pad ? inv_padded : inv_valid;
    for (int64_t j = 0; j < n; ++j) out[j] = from_compute<T>(a[j] * outer * inv[j]);
  }
};

template <typename C>
struct LpOp {
  C p;
  C init() const { return C(0); }
  C add(C acc, C v) const {
    if (p == C(1)) return acc + std::abs(v);
    if (p == C(2)) return acc + v * v;
    return acc + std::pow(std::abs(v), p);
  }
  template <typename T>
  void finish_row(const C* a, T* out, int64_t n, C, const C*, C, const C*) const {
    for (int64_t j = 0; j < n; ++j) {
      out[j] = from_compute<T>(p == C(1)   ? a[j]
                               : p == C(2) ? std::sqrt(a[j])
                                           : std::pow(a[j], C(1) / p));
    }
  }
};

// Pooling one output row at a time. Outputs whose whole window row lies inside the input
// (the interior) take all taps of a kernel row in one vectorised pass (stride 2 reads a
// deinterleaved copy of the plane); border outputs add their valid taps one by one. `Op`
// supplies init(), add(acc, v) and finish_row(), which gets the reciprocal tap counts
// (inside the input, inside input + padding) of the outer dimensions and of every column.
template <typename T, typename Op>
void pool_rows(const T* x, T* y, int64_t planes, const Geometry& g, const Op& op) {
  using C = compute_t<T>;
  const int64_t ip = g.in_size(), ow_n = g.out[2], kw_n = g.k[2], s = g.stride[2];
  const int64_t dil = g.dil[2], pad = -g.taps[2].start[0];
  // References, not a structured binding: lambdas below use them (C++20 allows capturing
  // bindings, clang before 16 does not).
  const Taps &td = g.taps[0], &th = g.taps[1], &tw = g.taps[2];
  const TapRanges wr = tap_ranges(g, 2);
  int64_t j0 = 0, j1 = ow_n;
  for (int64_t k = 0; k < kw_n; ++k) {
    j0 = std::max(j0, wr.lo[static_cast<size_t>(k)]);
    j1 = std::min(j1, wr.hi[static_cast<size_t>(k)]);
  }
  if (j1 < j0) j1 = j0;
  const bool fused = (kw_n == 2 || kw_n == 3 || kw_n == 5 || kw_n == 7) && (s == 1 || s == 2);
  const bool split = fused && s == 2;
  const int64_t even = (g.in[2] + 1) / 2;
  std::vector<int64_t> off(static_cast<size_t>(kw_n));
  for (int64_t k = 0; k < kw_n; ++k) {
    const int64_t t = k * dil - pad;  // input column of output 0 for tap k
    const int64_t half = t >= 0 ? t / 2 : -((1 - t) / 2);
    off[static_cast<size_t>(k)] = split ? half + (t - 2 * half == 0 ? 0 : even) : t;
  }
  std::vector<C> inv_valid(static_cast<size_t>(ow_n)), inv_padded(inv_valid.size());
  for (size_t j = 0; j < inv_valid.size(); ++j) {
    inv_valid[j] = reciprocal<C>(tw.hi[j] - tw.lo[j]);
    inv_padded[j] = reciprocal<C>(tw.padded[j]);
  }
  const int64_t rows = planes * g.out[0] * g.out[1];
  parallel_for(rows, grain_for(ow_n * g.k[0] * g.k[1] * g.k[2] + 1), [&](int64_t lo, int64_t hi) {
    std::vector<C> acc(static_cast<size_t>(ow_n));
    std::vector<T> buf(split ? static_cast<size_t>(ip) : 0);
    int64_t buffered = -1;
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t oh = row % g.out[1], od = (row / g.out[1]) % g.out[0];
      const int64_t p = row / (g.out[1] * g.out[0]);
      const T* plane = x + p * ip;
      if (split && buffered != p) {
        deinterleave_rows(plane, g.in[0] * g.in[1], g.in[2], buf.data());
        buffered = p;
      }
      C* a = acc.data();
      std::fill(a, a + ow_n, op.init());
      for (int64_t kd = td.lo[od]; kd < td.hi[od]; ++kd) {
        const int64_t id = td.start[od] + kd * g.dil[0];
        for (int64_t kh = th.lo[oh]; kh < th.hi[oh]; ++kh) {
          const int64_t ih = th.start[oh] + kh * g.dil[1];
          const int64_t row_off = (id * g.in[1] + ih) * g.in[2];
          const T* xrow = plane + row_off;
          if (fused) {
            const T* src = split ? buf.data() + row_off : xrow;
            switch (kw_n) {
              case 2:
                fused_row<2>(a, src, off.data(), j0, j1, op);
                break;
              case 3:
                fused_row<3>(a, src, off.data(), j0, j1, op);
                break;
              case 5:
                fused_row<5>(a, src, off.data(), j0, j1, op);
                break;
              default:
                fused_row<7>(a, src, off.data(), j0, j1, op);
            }
          }
          for (int64_t k = 0; k < kw_n; ++k) {
            const int64_t b = k * dil - pad;
            const int64_t lo_k = wr.lo[static_cast<size_t>(k)],
                          hi_k = wr.hi[static_cast<size_t>(k)];
            if (fused) {  // the interior is done: the border outputs remain
              for (int64_t j = lo_k; j < std::min(hi_k, j0); ++j) {
                a[j] = op.add(a[j], static_cast<C>(xrow[b + j * s]));
              }
              for (int64_t j = std::max(lo_k, j1); j < hi_k; ++j) {
                a[j] = op.add(a[j], static_cast<C>(xrow[b + j * s]));
              }
            } else if (s == 1) {
              for (int64_t j = lo_k; j < hi_k; ++j)
                a[j] = op.add(a[j], static_cast<C>(xrow[b + j]));
            } else {
              for (int64_t j = lo_k; j < hi_k; ++j) {
                a[j] = op.add(a[j], static_cast<C>(xrow[b + j * s]));
              }
            }
          }
        }
      }
      const C outer_valid = reciprocal<C>((td.hi[od] - td.lo[od]) * (th.hi[oh] - th.lo[oh]));
      const C outer_padded = reciprocal<C>(td.padded[od] * th.padded[oh]);
      op.finish_row(a, y + row * ow_n, ow_n, outer_valid, inv_valid.data(), outer_padded,
                    inv_padded.data());
    }
  });
}

math::ConvGeometry pool_conv_geometry(const Geometry& g) {
  math::ConvGeometry cg;
  for (size_t i = 0; i < 3; ++i) {
    cg.in[i] = g.in[i], cg.out[i] = g.out[i], cg.k[i] = g.k[i];
    cg.stride[i] = g.stride[i], cg.dil[i] = g.dil[i], cg.pad[i] = -g.taps[i].start[0];
  }
  return cg;
}

// A window over the whole unpadded plane (AveragePool of a 7x7 map with a 7x7 kernel, as
// classifiers end): averaged as each plane's vector sum (plane_means).
bool whole_plane(const Geometry& g) {
  bool whole = g.out_size() == 1;
  for (size_t i = 0; i < 3; ++i) {
    whole = whole && g.taps[i].start[0] == 0 && g.k[i] == g.in[i] && g.dil[i] == 1;
  }
  return whole;
}

// Floats of the small-plane path's workspace (pool_planes_float) for max (`max`) or average
// pooling, 0 where it does not apply.
int64_t pool_wide_floats(const Geometry& g, int64_t planes, bool max) {
  if (g.out_size() == 0) return 0;  // no window starts (pool_conv_geometry reads the first)
  if (!max && whole_plane(g)) return 0;
  const math::ConvGeometry cg = pool_conv_geometry(g);
  if (math::pool_planes_fit(cg)) return 0;
  return use_wide_planes(cg, planes) ? wide_planes_floats(WideExtent(cg), planes) : 0;
}

// Float max or average pooling of every plane with the dispatched plane kernels; the average
// divides by the window's size per output (taps inside the input, or inside input and
// padding with count_include_pad), a product over the dimensions, as the results are
// stored. 1-D and 2-D windows at column stride 1 or 2 are pooled rows first, straight from
// the input (ConvKernels::pool_planes: each input row reduced across every window row once,
// then each output row from its window's rows: no copy of the plane, and on 14x14 planes
// under half the wide form's time). Other windows: with `space` (pool_wide_floats floats)
// small planes are pooled in their wide form (ops/conv/wide_layout.h: padded with -inf or zeros,
// so every vector of outputs takes all taps without border masks); otherwise each plane is
// read in place (column stride 1 or 2) or from a padded copy.
void pool_planes_float(const float* x, float* y, int64_t planes, const Geometry& g, bool max,
                       bool count_pad, float* space) {
  const math::ConvKernels& k = math::kernels().conv;
  const math::ConvGeometry cg = pool_conv_geometry(g);
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k[0] * g.k[1] * g.k[2];
  if (ip == 0) {
    // An empty input under padding: every window lies in the padding, so no tap is read. The
    // plane kernels size their loads by the input's rows and assume one.
    if (max) {
      pool_rows<float>(x, y, planes, g, MaxOp<float>{});
    } else {
      pool_rows<float>(x, y, planes, g, AverageOp<float>{count_pad});
    }
    return;
  }
  std::array<std::vector<float>, 3> inv;
  for (size_t i = 0; i < 3 && !max; ++i) {
    const Taps& t = g.taps[i];
    for (size_t o = 0; o < t.start.size(); ++o) {
      inv[i].push_back(reciprocal<float>(count_pad ? t.padded[o] : t.hi[o] - t.lo[o]));
    }
  }
  // The divisor of output (od, oh, ow) is outer[od * out[1] + oh] * inv[2][ow].
  std::vector<float> outer;
  for (int64_t od = 0; od < g.out[0] && !max; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      outer.push_back(inv[0][static_cast<size_t>(od)] * inv[1][static_cast<size_t>(oh)]);
    }
  }
  if (!max && whole_plane(g)) {
    plane_means(x, planes, ip, y);
    return;
  }
  if (math::pool_planes_fit(cg)) {
    const float* rs = max ? nullptr : outer.data();
    const float* cs = max ? nullptr : inv[2].data();
    // One run of planes per task: the kernel sets its loads up once per call.
    const int tasks = static_cast<int>(std::min<int64_t>(
        math::task_count(static_cast<double>(planes) * static_cast<double>(op * kp)), planes));
    math::run_tasks(tasks, [&](int t) {
      const int64_t lo = planes * t / tasks, hi = planes * (t + 1) / tasks;
      k.pool_planes(x + lo * ip, ip, hi - lo, cg, max, rs, cs, y + lo * op, op);
    });
    return;
  }
  if (space && use_wide_planes(cg, planes)) {
    const WideExtent ext(cg);
    const float fill = max ? -std::numeric_limits<float>::infinity() : 0.0f;
    const math::WideOp wop = max ? math::WideOp::Max : math::WideOp::Sum;
    math::WideEpilogue we;
    if (!max) we.row_scale = outer.data(), we.col_scale = inv[2].data();
    for_wide_slots(ext, planes, op * kp, space, [&](float* xp, float* wide, int64_t p) {
      pad_phases(x + p * ip, cg, ext, xp, fill);
      k.wide_plane(xp, nullptr, ext.taps.data(), kp, wop, 0.0f, cg, ext.len[1], ext.len[2], we,
                   wide, y + p * op);
    });
    return;
  }
  // Column stride 1 or 2 reads each plane in place and divides in the same pass; others
  // pool a padded copy, then divide.
  const bool in_place = cg.stride[2] <= 2 && cg.k[2] <= math::ConvKernels::direct_max_width;
  const auto padded = static_cast<size_t>(math::conv_padded_floats(cg));
  std::vector<int64_t> offsets(static_cast<size_t>(kp));
  math::conv_tap_offsets(cg, offsets.data());
  parallel_for(planes, grain_for(op * kp), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(in_place ? 0 : padded);
    for (int64_t p = lo; p < hi; ++p) {
      float* yp = y + p * op;
      if (in_place) {
        k.direct_pool_plane(x + p * ip, cg, max, max ? nullptr : outer.data(),
                            max ? nullptr : inv[2].data(), yp);
        continue;
      }
      k.pad_plane(x + p * ip, cg, max ? -std::numeric_limits<float>::infinity() : 0.0f, buf.data());
      k.pool_plane(buf.data(), offsets.data(), cg, max, yp);
      if (max) continue;
      for (int64_t r = 0; r < g.out[0] * g.out[1]; ++r) {
        float* row = yp + r * g.out[2];
        for (int64_t ow = 0; ow < g.out[2]; ++ow)
          row[ow] *= outer[static_cast<size_t>(r)] * inv[2][static_cast<size_t>(ow)];
      }
    }
  });
}

// MaxPool with the Indices output: one output at a time, remembering where the maximum was.
template <typename T>
void max_pool_with_indices(const T* x, T* y, int64_t* indices, bool col_major, int64_t planes,
                           const Geometry& g) {
  using C = compute_t<T>;
  const int64_t ip = g.in_size(), op = g.out_size();
  // References, not a structured binding: lambdas below use them (C++20 allows capturing
  // bindings, clang before 16 does not).
  const Taps &td = g.taps[0], &th = g.taps[1], &tw = g.taps[2];
  parallel_for(planes, grain_for(op * g.k[0] * g.k[1] * g.k[2]), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const T* plane = x + p * ip;
      int64_t out = p * op;
      for (int64_t od = 0; od < g.out[0]; ++od) {
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          for (int64_t ow = 0; ow < g.out[2]; ++ow, ++out) {
            C best = MaxOp<C>().init();
            int64_t arg = -1;
            for (int64_t kd = td.lo[od]; kd < td.hi[od]; ++kd) {
              const int64_t id = td.start[od] + kd * g.dil[0];
              for (int64_t kh = th.lo[oh]; kh < th.hi[oh]; ++kh) {
                const int64_t ih = th.start[oh] + kh * g.dil[1];
                for (int64_t kw = tw.lo[ow]; kw < tw.hi[ow]; ++kw) {
                  const int64_t at = (id * g.in[1] + ih) * g.in[2] + tw.start[ow] + kw * g.dil[2];
                  const C v = static_cast<C>(plane[at]);
                  if (v > best || arg < 0) {
                    best = v;
                    arg = at;
                  }
                }
              }
            }
            y[out] = arg < 0 ? from_compute<T>(best) : plane[arg];
            int64_t spatial = std::max<int64_t>(arg, 0);
            if (col_major && arg >= 0) {
              const int64_t iw = arg % g.in[2], ih = (arg / g.in[2]) % g.in[1];
              const int64_t id = arg / (g.in[1] * g.in[2]);
              spatial = id + ih * g.in[0] + iw * g.in[0] * g.in[1];
            }
            indices[out] = p * ip + spatial;
          }
        }
      }
    }
  });
}

template <PoolKind kKind>
class Pool final : public Kernel {
 public:
  explicit Pool(const NodeInfo& info) : window_(pool_window(info)) {
    if constexpr (kKind == PoolKind::Max) {
      col_major_ = info.attr_int("storage_order", 0) != 0;
    } else if constexpr (kKind == PoolKind::Average) {
      count_pad_ = info.attr_int("count_include_pad", 0) != 0;
    } else {
      // LpPool-1 had a float p; later versions an int.
      const ir::Attribute* a = info.attr("p");
      p_ = !a ? 2.0f : a->kind == ir::AttrKind::Float ? a->f : static_cast<float>(a->i);
      if (!(p_ > 0)) info.fail("p must be positive");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const size_t r = window_.kernel_shape.size();
    if (x.rank() != r + 2) {
      ctx.fail("input " + x.describe() + " does not match kernel_shape of rank " +
               std::to_string(r));
    }
    const std::vector<WindowAxis> axes =
        forward_windows(spatial_dims(x.shape()), window_.kernel_shape, window_);
    const Geometry g = pool_geometry(axes);
    const Shape shape = windowed_shape(x.dim(0), x.dim(1), axes);
    const int64_t planes = shape_numel(shape) == 0 ? 0 : x.dim(0) * x.dim(1);
    if constexpr (kKind == PoolKind::Max) {
      using MaxTypes = TypeList<float, double, float16, bfloat16, int8_t, uint8_t>;
      dispatch(MaxTypes{}, x.dtype(), [&]<typename T>() {
        Tensor& y = ctx.output(0, x.dtype(), shape);
        Tensor* ind = ctx.has_output(1) ? &ctx.output(1, DataType::Int64, shape) : nullptr;
        if (planes == 0) return;
        if (ind) {
          max_pool_with_indices<T>(x.data<const T>(), y.data<T>(), ind->data<int64_t>(), col_major_,
                                   planes, g);
        } else if constexpr (std::is_same_v<T, float>) {
          const Tensor space = workspace(ctx, g, planes, true);
          pool_planes_float(x.data<const float>(), y.data<float>(), planes, g, true, false,
                            space.defined() ? space.data<float>() : nullptr);
        } else {
          pool_rows<T>(x.data<const T>(), y.data<T>(), planes, g, MaxOp<compute_t<T>>{});
        }
      });
    } else {
      dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
        using C = compute_t<T>;
        Tensor& y = ctx.output(0, x.dtype(), shape);
        if (planes == 0) return;
        if constexpr (kKind == PoolKind::Average && std::is_same_v<T, float>) {
          const Tensor space = workspace(ctx, g, planes, false);
          pool_planes_float(x.data<const float>(), y.data<float>(), planes, g, false, count_pad_,
                            space.defined() ? space.data<float>() : nullptr);
        } else if constexpr (kKind == PoolKind::Average) {
          pool_rows<T>(x.data<const T>(), y.data<T>(), planes, g, AverageOp<C>{count_pad_});
        } else {
          pool_rows<T>(x.data<const T>(), y.data<T>(), planes, g, LpOp<C>{static_cast<C>(p_)});
        }
      });
    }
  }

 private:
  // The float path's workspace (pool_workspace), or none.
  static Tensor workspace(OpContext& ctx, const Geometry& g, int64_t planes, bool max) {
    const int64_t floats = pool_wide_floats(g, planes, max);
    return floats > 0 ? ctx.workspace(DataType::Float, floats) : Tensor();
  }

  WindowAttrs window_;
  bool col_major_ = false, count_pad_ = false;
  float p_ = 0;
};

// Geometry errors (kiln::Error) leave the outputs unknown; the kernel reports them.
void pool_shape(ShapeContext& c) {
  if (!c.facts(0).known) {
    // Partial facts: batch and channels, the rank of the window, and each spatial size
    // where the input's is known.
    const ValueFacts& x = c.facts(0);
    const WindowAttrs a = window_attrs(c.node());
    const auto rank = static_cast<int64_t>(a.kernel_shape.size()) + 2;
    ValueFacts out = windowed_facts(x, rank, x.dim(1), 1, [&](const Shape& probe) {
      check_window_ranks(a, probe.size() - 2);
      return windowed_shape(probe[0], probe[1],
                            forward_windows(spatial_dims(probe), a.kernel_shape, a));
    });
    ValueFacts indices = out;
    indices.dtype = DataType::Int64;
    c.set(0, std::move(out));
    c.set(1, std::move(indices));
    return;
  }
  const Shape& x = c.shape(0);
  if (x.size() < 3) unknown("rank below 3");
  const WindowAttrs a = window_attrs(c.node());
  check_window_ranks(a, x.size() - 2);
  const Shape out = windowed_shape(x[0], x[1], forward_windows(spatial_dims(x), a.kernel_shape, a));
  c.set(0, c.dtype(0), out);
  c.set(1, DataType::Int64, out);  // MaxPool's indices
}

// The small-plane path's scratch of float max pooling without indices and float average
// pooling (pool_planes_float).
uint64_t pool_workspace(const ShapeContext& c) {
  const Shape& x = c.shape(0);
  // MaxPool with indices takes its own path (max_pool_with_indices), without scratch.
  if (c.dtype(0) != DataType::Float || x.size() < 3 || x.size() > 5 || c.has_output(1)) return 0;
  const WindowAttrs a = window_attrs(c.node());
  if (a.kernel_shape.size() != x.size() - 2) return 0;
  const std::vector<WindowAxis> axes = forward_windows(spatial_dims(x), a.kernel_shape, a);
  const int64_t planes = x[0] * x[1];
  const bool max = c.node().op_type == "MaxPool";
  return static_cast<uint64_t>(pool_wide_floats(pool_geometry(axes), planes, max)) * sizeof(float);
}

}  // namespace

KILN_REGISTER_OP({.op = "MaxPool",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "float, double, float16, bfloat16, int8, uint8",
                  .shape = pool_shape,
                  .workspace = pool_workspace,
                  .create = make<Pool<PoolKind::Max>>});
KILN_REGISTER_OP({.op = "AveragePool",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = pool_shape,
                  .workspace = pool_workspace,
                  .create = make<Pool<PoolKind::Average>>});
KILN_REGISTER_OP({.op = "LpPool",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = pool_shape,
                  .create = make<Pool<PoolKind::Lp>>});

}  // namespace kiln::ops
