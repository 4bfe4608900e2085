// Conv: 1-D, 2-D and 3-D convolution with groups, strides, dilations, explicit or automatic
// padding, and an optional bias.
//
// General float convolutions are products in the GEMM layer (ops/math/gemm.h): the filter
// of each group is packed once when the session is planned (shared through the weights
// cache), and the input patches are lowered straight into the GEMM's B panels block by
// block (im2col without an intermediate matrix); 1x1 convolutions with unit stride and no
// padding pack the input itself. Bias is the GEMM's row epilogue. Convolutions with one
// input channel per group (depthwise) run as direct loops, except long 1-D windows over one
// channel with several filters (audio front ends: use_strided_windows), which are products
// that read the signal as a strided matrix; double uses plain loops.
//
// kiln.FusedConv (made by the graph optimizer, engine/passes/fusion/conv.cpp) is a float
// Conv with an `activation` attribute and an optional fourth input Z added before it:
// y = activation(conv(x, w) + bias + Z), as one pass over y (the GEMM accumulates onto Z and
// applies the activation to each tile while it is in cache). Z with the output's shape is
// overwritten in place when the executor allows; a Z that broadcasts is added afterwards.
//
// com.microsoft.FusedConv (onnxruntime's contrib op; contrib_ops/cpu/fused_conv.cc) is the same
// kernel with onnxruntime's activations: the `activation` string is Relu, Tanh, Sigmoid, or
// LeakyRelu (activation_params: alpha), Clip (min, max) or HardSigmoid (alpha, beta), which
// must come with exactly that many activation_params; absent: none. Z must have the output's
// shape. The first three are fused into the GEMM; the parameterized ones are a second pass
// over y.
#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/activation.h"
#include "ops/common.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/geometry.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"
#include "ops/math/winograd.h"
#include "ops/wide_layout.h"
#include "ops/workspace.h"

namespace kiln::ops {
namespace {

// Spatial sizes of one convolution, always three dimensions: 1-D and 2-D problems get
// leading dimensions of size 1.
using Geometry = Windows3;

// Lowers input patches of output positions [p0, p1) of one (image, group) into `col`
// ([channels * kernel] x (p1 - p0), row-major).
template <typename T>
void im2col(const T* x, int64_t channels, const Geometry& g, int64_t p0, int64_t p1, T* col) {
  const int64_t blk = p1 - p0, ip = g.in_size(), ohw = g.out[1] * g.out[2];
  T* dst = col;
  for (int64_t c = 0; c < channels; ++c) {
    const T* xc = x + c * ip;
    for (int64_t kd = 0; kd < g.k[0]; ++kd) {
      for (int64_t kh = 0; kh < g.k[1]; ++kh) {
        for (int64_t kw = 0; kw < g.k[2]; ++kw, dst += blk) {
          const int64_t wbase = kw * g.dil[2] - g.pad[2];
          T* d = dst;
          for (int64_t p = p0; p < p1;) {
            const int64_t od = p / ohw, oh = (p % ohw) / g.out[2], ow = p % g.out[2];
            const int64_t run = std::min(p1 - p, g.out[2] - ow);
            const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
            const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
            if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
              std::fill(d, d + run, T(0));
            } else {
              const int64_t base = ow * g.stride[2] + wbase;  // input column of j = 0
              const T* row = xc + (id * g.in[1] + ih) * g.in[2];
              const int64_t lo = first_at_least(base, g.stride[2], 0);
              const int64_t hi = first_at_least(base, g.stride[2], g.in[2]);
              gather_row(d, run, row, base, g.stride[2], lo, hi);
            }
            d += run;
            p += run;
          }
        }
      }
    }
  }
}

// The forms a float filter is packed in for the GEMM layer: of each group, a packed A
// ([mg x cg * kernel], the output channels as rows); for the transposed product of small
// maps (use_transposed), its transpose as a packed B ([cg * kernel x mg], the output channels
// as columns); for 3x3 stride-1 convolutions (winograd_tile), the Winograd transform's 36
// (4x4 output tiles) or 16 (2x2 tiles) packed A ([mg x cg] each). The groups one after
// another.
enum class FilterForm : uint8_t { Packed, Transposed, Winograd4, Winograd2 };
constexpr size_t kFilterForms = 4;

// Floats of a form for `groups` groups of mg output channels, cg input channels and kk =
// cg * kernel values per output channel.
int64_t form_floats(int64_t groups, int64_t mg, int64_t cg, int64_t kk, FilterForm form) {
  const math::GemmKernels& t = math::kernels().gemm;
  switch (form) {
    case FilterForm::Transposed:
      return groups * math::PackedB::packed_floats(kk, mg, t.nr);
    case FilterForm::Winograd4:
      return groups * math::winograd_filter_floats(mg, cg, t.mr, 4);
    case FilterForm::Winograd2:
      return groups * math::winograd_filter_floats(mg, cg, t.mr, 2);
    case FilterForm::Packed:
      break;
  }
  return groups * math::PackedA::packed_floats(mg, kk, t.mr);
}

int64_t packed_filter_floats(const Tensor& w, int64_t groups, FilterForm form) {
  if (w.numel() == 0) return 0;
  return form_floats(groups, w.dim(0) / groups, w.dim(1), w.numel() / w.dim(0), form);
}

// That form into `out` (packed_filter_floats floats).
void pack_filter_into(const Tensor& w, int64_t groups, FilterForm form, float* out) {
  Tensor f = w.contiguous();
  if (f.dtype() != DataType::Float) {
    Tensor wide(DataType::Float, f.shape(),
                Storage::heap_uninitialized(storage_bytes(DataType::Float, f.numel())));
    const math::ConvertKernels& cv = math::kernels().convert;
    (f.dtype() == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(
        reinterpret_cast<const uint16_t*>(f.raw_data()), wide.data<float>(), f.numel());
    f = wide;
  }
  const math::MathKernels& t = math::kernels();
  const int64_t mg = f.dim(0) / groups, kk = f.numel() / f.dim(0);
  const int64_t per = packed_filter_floats(f, groups, form) / groups;
  for (int64_t grp = 0; grp < groups; ++grp) {
    const float* fg = f.data<const float>() + grp * mg * kk;
    const math::MatrixView wg = math::MatrixView::row_major(fg, mg, kk, kk);
    if (form == FilterForm::Winograd4 || form == FilterForm::Winograd2) {
      math::winograd_pack_filter(fg, mg, f.dim(1), form == FilterForm::Winograd4 ? 4 : 2,
                                 out + grp * per, t);
    } else if (form == FilterForm::Transposed) {
      math::PackedB::pack_into(wg.transposed(), out + grp * per, t);
    } else {
      math::PackedA::pack_into(wg, out + grp * per, t);
    }
  }
}

// pack_filter_into a tensor of its own (the weights cache's prepared form).
Tensor pack_filter(const Tensor& w, int64_t groups, FilterForm form) {
  const int64_t floats = packed_filter_floats(w, groups, form);
  Tensor packed(DataType::Float, Shape{floats},
                Storage::heap_uninitialized(storage_bytes(DataType::Float, floats)));
  pack_filter_into(w, groups, form, packed.data<float>());
  packed.storage()->set_read_only();
  return packed;
}

struct Sizes {
  int64_t n, c, m, groups, cg, mg;
};

// Strided windows: convolutions whose windows all lie along one row (1-D convolutions, and
// 2-D or 3-D ones of maps and kernels one row high) over one input channel per group, with
// at least kMinWindowTaps taps and kMinWindowFilters filters per group: the STFT and
// filterbank front ends of audio models (hundreds of taps at strides of 64 to 160, hundreds
// of filters). The patch matrix of an (image, group) is then its signal itself read as a
// strided matrix, position p's window from p * stride with its taps dilation apart, and the
// convolution is a GEMM product (use_direct is false) instead of direct loops, which spend
// two loads on each multiply-add where the product's register tile reuses every load across
// its filters. One-node models, one thread, the least of 200 runs: 257 filters of 512 taps
// at stride 160 over 16000 samples took 1.78 ms as direct loops and 0.34 ms as a product
// (onnxruntime 0.37), 16 images of 258 filters of 256 taps at stride 128 2.21 ms and 0.17
// (0.32); 16 filters of 16 taps over 4000 samples 90 us and 49. With fewer filters per group
// the product's tiles run mostly empty: 16 groups of 4 filters of 16 taps over 100 samples
// took 24 us as direct loops and 40 as products (groups of 8 filters: 26 both ways).
constexpr int64_t kMinWindowTaps = 16;
constexpr int64_t kMinWindowFilters = 8;

// Whether every window lies along one row: a single row of input, kernel and output.
bool one_row(const Geometry& g) {
  return g.in[0] == 1 && g.in[1] == 1 && g.k[0] == 1 && g.k[1] == 1 && g.out[0] == 1 &&
         g.out[1] == 1;
}

bool use_strided_windows(const Sizes& s, const Geometry& g) {
  return s.cg == 1 && s.mg >= kMinWindowFilters && g.k[2] >= kMinWindowTaps && one_row(g);
}

// Whether a filter of these groups makes strided windows whenever its input is one row
// (use_strided_windows on the filter alone).
bool strided_window_filter(const Tensor& w, int64_t groups) {
  for (size_t d = 2; d + 1 < w.rank(); ++d) {
    if (w.dim(d) != 1) return false;
  }
  return w.dim(1) == 1 && w.dim(0) / groups >= kMinWindowFilters &&
         w.dim(w.rank() - 1) >= kMinWindowTaps;
}

// Depthwise convolutions (one input channel per group) and those with one or two output
// channels per group run as direct loops: a GEMM with so few rows would spend its time
// lowering patches. Strided windows are the exception (see above).
bool use_direct(const Sizes& s, const Geometry& g) {
  return (s.cg == 1 || s.mg <= 2) && !use_strided_windows(s, g);
}

// Float convolutions run as strided windows (strided_window_convolutions()).
std::atomic<uint64_t> strided_window_count{0};

// What a fused convolution does besides the product: start from y's values (Z) instead of
// zeros, and the activation applied to the finished output.
struct ConvEpilogue {
  bool accumulate = false;
  math::Activation activation = math::Activation::None;
};

math::ConvGeometry conv_geometry(const Geometry& g) {
  math::ConvGeometry d;
  for (int i = 0; i < 3; ++i) {
    d.in[i] = g.in[i], d.out[i] = g.out[i], d.k[i] = g.k[i];
    d.stride[i] = g.stride[i], d.dil[i] = g.dil[i], d.pad[i] = g.pad[i];
  }
  return d;
}

// The stack tile of depthwise_lanes, in floats (at the widest vector, 16 floats).
constexpr int64_t kLanesTileFloats = 10240;

// Depthwise convolutions (one input and one output channel per group) of 2-D planes of at
// most 64 outputs (8x8) take depthwise_lanes: a channel per vector lane fills every vector
// however small the plane, where the wide path's rows of 7 leave half of each vector empty
// and its per-plane setup weighs on so few outputs. Larger planes fill their vectors, and
// there the lanes path's element-by-element transposes cost more than they save (one-node
// models, 1 thread: 272 channels of 14x14 0.031 ms wide against 0.043 this way; 544 of 7x7
// 0.034 against 0.025).
bool use_depthwise_lanes(const Sizes& s, const Geometry& g) {
  const math::ConvGeometry cg = conv_geometry(g);
  return s.cg == 1 && s.mg == 1 && g.in[0] == 1 && g.k[0] == 1 && g.out[0] == 1 &&
         g.out[1] * g.out[2] <= 64 && math::depthwise_lanes_floats(cg, 16) <= kLanesTileFloats;
}

// The other depthwise convolutions of small planes take depthwise_wide.
bool use_depthwise_wide(const Sizes& s, const Geometry& g) {
  return s.cg == 1 && !use_depthwise_lanes(s, g) && use_wide_planes(conv_geometry(g), s.n * s.m);
}

// Depthwise convolution a block of channels at a time (ConvKernels::depthwise_lanes), the
// tile on the stack.
void depthwise_lanes(const float* x, const float* w, const float* bias, float* y, const Sizes& s,
                     const Geometry& g, const ConvEpilogue& e) {
  const math::ConvKernels& k = math::kernels().conv;
  const math::ConvGeometry cg = conv_geometry(g);
  const int64_t lanes = k.lanes, blocks = (s.m + lanes - 1) / lanes;
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size();
  const bool relu = e.activation == math::Activation::Relu;
  parallel_for(s.n * blocks, grain_for(op * kp * lanes), [&](int64_t lo, int64_t hi) {
    alignas(64) float tile[kLanesTileFloats];
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t n = item / blocks, m0 = (item % blocks) * lanes;
      const int count = static_cast<int>(std::min(lanes, s.m - m0));
      float* yb = y + (n * s.m + m0) * op;
      k.depthwise_lanes(x + (n * s.c + m0) * ip, ip, w + m0 * kp, bias ? bias + m0 : nullptr, count,
                        cg, e.accumulate, relu, tile, yb, op);
      if (!relu) apply_activation(e.activation, yb, count * op);
    }
  });
}

// Floats of the wide depthwise path's slots for these sizes, 0 where the path does not apply.
int64_t depthwise_floats(const Sizes& s, const Geometry& g) {
  if (!use_depthwise_wide(s, g)) return 0;
  return wide_planes_floats(WideExtent(conv_geometry(g)), s.n * s.m);
}

// Depthwise convolution of small planes: each input plane is laid out once in the wide form
// (padded, split into stride phases; ops/wide_layout.h), where every tap reads the inputs of
// consecutive output positions as one run, so each vector of outputs sums all its taps in a
// register without border masks, however narrow the rows (a 7x7 plane fills vectors that
// the direct kernels' rows of 7 would leave half empty). The valid columns are then copied
// into y with Z and the activation. `space` holds depthwise_floats floats.
void depthwise_wide(const float* x, const float* w, const float* bias, float* y, const Sizes& s,
                    const Geometry& g, const ConvEpilogue& e, float* space) {
  const math::ConvKernels& k = math::kernels().conv;
  const math::ConvGeometry cg = conv_geometry(g);
  const WideExtent ext(cg);
  const int64_t planes = s.n * s.m, ip = g.in_size(), op = g.out_size(), kp = g.k_size();
  math::WideEpilogue we;
  we.accumulate = e.accumulate;
  we.relu = e.activation == math::Activation::Relu;
  for_wide_slots(ext, planes, op * kp, space, [&](float* xp, float* wide, int64_t plane) {
    const int64_t n = plane / s.m, m = plane % s.m;
    pad_phases(x + (n * s.c + m / s.mg) * ip, cg, ext, xp);
    float* yp = y + plane * op;
    k.wide_plane(xp, w + m * kp, ext.taps.data(), kp, math::WideOp::Conv, bias ? bias[m] : 0.0f, cg,
                 ext.len[1], ext.len[2], we, wide, yp);
    if (!we.relu) apply_activation(e.activation, yp, op);
  });
}

// Whether the direct loops read the input planes in place (column stride 1 or 2, a kernel
// no wider than the in-place kernel reads); else each task pads its plane into a buffer.
bool direct_in_place(const Geometry& g) {
  return g.stride[2] <= 2 && g.k[2] <= math::ConvKernels::direct_max_width;
}

// The tasks of the direct loops over the output planes on `threads` threads.
int plane_tasks(const Sizes& s, const Geometry& g, int threads) {
  const int64_t planes = s.n * s.m, grain = grain_for(g.out_size() * g.k_size() * s.cg);
  return static_cast<int>(std::clamp<int64_t>((planes + grain - 1) / grain, 1, threads));
}

// Floats of the direct loops' padded planes, one per task, 0 where they read in place.
int64_t padded_plane_floats(const Sizes& s, const Geometry& g, int threads) {
  if (!use_direct(s, g) || use_depthwise_lanes(s, g) || use_depthwise_wide(s, g) ||
      direct_in_place(g))
    return 0;
  return plane_tasks(s, g, threads) * math::conv_padded_floats(conv_geometry(g));
}

// Float convolution with the dispatched direct plane kernel: each output plane is the sum
// over its group's input channels. `space` is the workspace's part for the direct loops: the
// wide path's slots for small depthwise planes (depthwise_floats) or each task's padded plane
// (padded_plane_floats).
void direct_convolve(const float* x, const float* w, const float* bias, float* y, const Sizes& s,
                     const Geometry& g, const ConvEpilogue& e, float* space) {
  if (use_depthwise_lanes(s, g)) {
    depthwise_lanes(x, w, bias, y, s, g, e);
    return;
  }
  if (space && use_depthwise_wide(s, g)) {
    depthwise_wide(x, w, bias, y, s, g, e, space);
    return;
  }
  const math::ConvKernels& k = math::kernels().conv;
  const math::ConvGeometry dg = conv_geometry(g);
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size();
  // Column stride 1 or 2: read the input planes in place (masked loads at the borders), with
  // the bias, the channel sum and a Relu in the same pass over each output plane.
  if (direct_in_place(g)) {
    const bool relu = e.activation == math::Activation::Relu;
    parallel_for(s.n * s.m, grain_for(op * kp * s.cg), [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const int64_t n = plane / s.m, m = plane % s.m, grp = m / s.mg;
        float* yp = y + plane * op;
        const float b = bias ? bias[m] : 0.0f;
        for (int64_t c = 0; c < s.cg; ++c) {
          const bool last = c + 1 == s.cg;
          k.direct_plane(x + (n * s.c + grp * s.cg + c) * ip, w + (m * s.cg + c) * kp, dg,
                         c == 0 ? b : 0.0f, c > 0 || e.accumulate, last && relu, yp);
        }
        if (!relu) apply_activation(e.activation, yp, op);
      }
    });
    return;
  }
  const int64_t padded = math::conv_padded_floats(dg);
  std::vector<int64_t> offsets(static_cast<size_t>(kp));
  math::conv_tap_offsets(dg, offsets.data());
  const int tasks = plane_tasks(s, g, std::max(tbb::this_task_arena::max_concurrency(), 1));
  if (!space) throw std::logic_error("direct convolution without its padded planes");
  const int64_t planes = s.n * s.m;
  math::run_tasks(tasks, [&](int t) {
    const int64_t lo = planes * t / tasks, hi = planes * (t + 1) / tasks;
    float* buf = space + t * padded;
    int64_t buffered = -1;  // the input plane held padded in buf
    for (int64_t plane = lo; plane < hi; ++plane) {
      const int64_t n = plane / s.m, m = plane % s.m, grp = m / s.mg;
      float* yp = y + plane * op;
      if (!e.accumulate) {
        std::fill(yp, yp + op, bias ? bias[m] : 0.0f);
      } else if (bias) {
        const float b = bias[m];
        for (int64_t i = 0; i < op; ++i) yp[i] += b;
      }
      for (int64_t c = 0; c < s.cg; ++c) {
        const int64_t in_plane = n * s.c + grp * s.cg + c;
        if (buffered != in_plane) {
          k.pad_plane(x + in_plane * ip, dg, 0.0f, buf);
          buffered = in_plane;
        }
        k.padded_plane(buf, w + (m * s.cg + c) * kp, offsets.data(), dg, yp);
      }
      apply_activation(e.activation, yp, op);
    }
  });
}

// Output rows at least this wide take the wide path below (narrower ones would compute
// too many discarded positions: (kernel width - 1) / stride per row).
constexpr int64_t kMinWideWidth = 12;

// The wide path's layout, the same for every (image, group): the extents and each
// patch-matrix row's offset in the laid-out channels.
struct WideLayout : WideExtent {
  std::vector<int64_t> row_offsets;

  WideLayout(const math::ConvGeometry& cg, int64_t channels) : WideExtent(cg) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t off : taps) row_offsets.push_back(c * plane + off);
    }
  }
};

// Output rows at least this wide may be products of their own (rows_direct).
constexpr int64_t kMinDirectRowWidth = 64;

// Whether each output row is better its own product, written straight into y, than a band of
// wide rows copied out: when the row's columns, rounded to the tile kernels' vectors (a last
// tile of at most half the tile width takes one vector), are at most the wide row's plus a
// thirty-second (the copy-out's pass over y). light resnet50's 7x7 stride-2 stem (112
// outputs a row, wide rows of 115) and squeezenet's 3x3 stride-2 first layer (111 of 112) are
// such rows; a 28-wide output row (wide rows of 29-30 columns, 32 computed) is not.
bool rows_direct(const math::ConvGeometry& cg, const WideExtent& w, int nr) {
  const int64_t out_w = cg.out[2], rest = out_w % nr;
  const int64_t computed = out_w - rest + (rest == 0 ? 0 : rest <= nr / 2 ? nr / 2 : nr);
  return out_w >= kMinDirectRowWidth && computed <= w.len[2] + w.len[2] / 32;
}

// The wide path's product one output row at a time, each row's patch rows read in place from
// the laid-out channels and its product stored into y with the bias, Z and activation (the
// tile epilogue): no wide product, no copy-out. Rows are dealt to the threads (a single row
// is split inside the product).
void direct_rows(const math::PackedA& a, const float* bias, float* y, int64_t op, const Sizes& s,
                 const math::ConvGeometry& cg, const WideLayout& w, const ConvEpilogue& e,
                 const float* xp) {
  const int64_t rows_out = cg.out[0] * cg.out[1], out_w = cg.out[2];
  const auto kk = static_cast<int64_t>(w.row_offsets.size());
  math::GemmOptions o;
  o.row_bias = bias;
  o.accumulate = e.accumulate;
  o.activation = e.activation;
  if (rows_out > 1) o.max_threads = 1;
  const int64_t row_work = s.mg * out_w * kk;
  parallel_for(rows_out, grain_for(row_work, int64_t{1} << 20), [&](int64_t lo, int64_t hi) {
    std::vector<const float*> rows(static_cast<size_t>(kk));
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t od = r / cg.out[1], oh = r % cg.out[1];
      const float* base = xp + (od * w.len[1] + oh) * w.len[2];
      for (int64_t p = 0; p < kk; ++p) rows[static_cast<size_t>(p)] = base + w.row_offsets[p];
      math::sgemm_indirect(a, out_w, rows.data(), y + r * out_w, op, o);
    }
  });
}

// A convolution of one (image, group) over "wide" output positions: with each input channel
// laid out once in stride phases (pad_phases), every row of the patch matrix over output
// rows as wide as a phase's rows is a contiguous run of that layout, which the product reads
// in place (math::sgemm_indirect): no lowering, no index arithmetic or strided gathers. The
// product lands in `wide` (mg x wide positions) and its valid columns are copied (or added,
// for Z) into y with the bias and activation. `cg` may be a band of the convolution's output
// rows (wide_band): xg's channels are `ip` floats apart and y's planes `op` floats apart.
void wide_convolve(const float* xg, int64_t ip, const math::PackedA& a, const float* bias, float* y,
                   int64_t op, const Sizes& s, const math::ConvGeometry& cg, const WideLayout& w,
                   const ConvEpilogue& e, float* xp, float* wide) {
  const int64_t wp = w.len[2];
  parallel_for(s.cg, grain_for(w.plane), [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) pad_phases(xg + c * ip, cg, w, xp + c * w.plane);
  });
  if (rows_direct(cg, w, math::kernels().gemm.nr)) {
    return direct_rows(a, bias, y, op, s, cg, w, e, xp);
  }
  // The bias and the activation are applied while the valid columns are copied out (one
  // pass over y instead of another over the wide product).
  // Every patch-matrix row is a run of xp: the product reads it there (no lowering).
  std::vector<const float*> rows(w.row_offsets.size());
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = xp + w.row_offsets[r];
  math::sgemm_indirect(a, w.wide_n, rows.data(), wide, w.wide_n);
  const bool relu = e.activation == math::Activation::Relu;
  parallel_for(s.mg, grain_for(op), [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      float* ym = y + m * op;
      const float b = bias ? bias[m] : 0.0f;
      for (int64_t od = 0; od < cg.out[0]; ++od) {
        for (int64_t oh = 0; oh < cg.out[1]; ++oh) {
          const float* src = wide + m * w.wide_n + (od * w.len[1] + oh) * wp;
          float* dst = ym + (od * cg.out[1] + oh) * cg.out[2];
          if (e.accumulate) {
            for (int64_t i = 0; i < cg.out[2]; ++i) dst[i] += src[i] + b;
          } else if (relu) {
            for (int64_t i = 0; i < cg.out[2]; ++i) {
              const float v = src[i] + b;
              dst[i] = v > 0.0f ? v : 0.0f;
            }
          } else {
            for (int64_t i = 0; i < cg.out[2]; ++i) dst[i] = src[i] + b;
          }
        }
      }
      if (e.accumulate || !relu)
        apply_activation(e.activation, ym, cg.out[0] * cg.out[1] * cg.out[2]);
    }
  });
}

// The wide path's buffers (one group's laid-out channels and the product over the wide
// positions) are kept within this many floats (2 MiB) by running the product over bands of
// output rows, one after another, so its patch rows are read, and its product copied out,
// from the caches: vgg19's 64-channel 3x3 layer on its 224x224 map laid out 13 MiB of
// channels and as much product, and took 25.7 ms where bands take 17.2 (one-node model, 1
// thread; its 3-channel first layer 1.41 -> 1.13 ms).
constexpr int64_t kWideBandFloats = int64_t{1} << 19;

// The convolution restricted to output rows [oh0, oh0 + rows) (2-D and 1-D: out[0] == 1):
// its input rows start at row `in_row0` of the input, the padding above is what remains of
// it for this band, and the rows below the input are padding as before.
math::ConvGeometry band_geometry(const Geometry& g, int64_t oh0, int64_t rows, int64_t& in_row0) {
  math::ConvGeometry b = conv_geometry(g);
  const int64_t start = oh0 * g.stride[1] - g.pad[1];
  const int64_t end = (oh0 + rows - 1) * g.stride[1] - g.pad[1] + (g.k[1] - 1) * g.dil[1] + 1;
  in_row0 = std::clamp<int64_t>(start, 0, g.in[1]);
  b.in[1] = std::max<int64_t>(std::min(end, g.in[1]) - in_row0, 0);
  b.pad[1] = in_row0 - start;
  b.out[1] = rows;
  return b;
}

// Output rows per band of the wide path: all of them unless its buffers pass
// kWideBandFloats, then halved until they fit (or one row).
int64_t wide_band(const Sizes& s, const Geometry& g) {
  if (g.out[0] != 1) return g.out[1];
  int64_t rows = g.out[1], in_row0 = 0;
  auto floats = [&](int64_t r) {
    const WideExtent w(band_geometry(g, 0, r, in_row0));
    return s.cg * w.plane + s.mg * w.wide_n;
  };
  while (rows > 1 && floats(rows) > kWideBandFloats) rows = (rows + 1) / 2;
  return rows;
}

// Maps of at most this many output positions are products with the positions as rows:
// Y^T [positions x mg] = patches [positions x cg * kernel] * W^T, the filter a packed B
// streamed once for all the positions. The other way round (the filter as A) the few
// positions make narrow B panels: `kiln-bench gemm 512 49 4608` runs at 0.51 of the FMA
// peak where `gemm 49 512 4608` reaches 0.84, and light resnet50's 512-channel 3x3 layer on
// its 7x7 map (a one-node model, 1 thread) took 1.33 ms that way and 1.07 ms this way.
constexpr int64_t kMaxTransposedPositions = 100;
// Convolutions with a window (not 1x1 stride 1) up to this many positions too: a 13x13 map's
// wide rows fill 169 of 224 columns (3x3 64 -> 256, 48 -> 192 and 96 -> 208 took 3-6% less
// time this way), a 14x14 map's 196 of 224 (as fast or faster the other way, as were 1x1
// layers on both: writing Y^T back costs what the narrower panels lose there).
constexpr int64_t kMaxTransposedWindowed = 180;

// 1x1, stride 1 and no padding at either end: the patch matrix is the input itself.
bool is_pointwise(const Geometry& g) {
  return g.k_size() == 1 && g.stride == std::array<int64_t, 3>{1, 1, 1} &&
         g.pad == std::array<int64_t, 3>{0, 0, 0} && g.out == g.in;
}

// 3x3 stride-1 convolutions of 2-D maps with enough channels and filters are Winograd
// products (ops/math/winograd.h): F(4x4, 3x3), a quarter of the multiply-adds, over maps of
// at least nine 4x4 tiles; F(2x2, 3x3), 4/9 of them, over smaller maps of at least nine 2x2
// tiles (7x7: 16, where 4x4 tiles are 4 and would fill the products' panels poorly). With
// fewer channels or filters the products are too small to pay for the transforms.
constexpr int64_t kWinogradMinChannels = 8;
constexpr int64_t kWinogradMinTiles = 9;

// The Winograd tile size for a convolution: 4, 2, or 0 where it is not a Winograd one.
int winograd_tile(const Sizes& s, const Geometry& g) {
  if (g.in[0] != 1 || g.out[0] != 1 || g.k[0] != 1 || g.k[1] != 3 || g.k[2] != 3 ||
      g.stride[1] != 1 || g.stride[2] != 1 || g.dil[1] != 1 || g.dil[2] != 1 ||
      s.cg < kWinogradMinChannels || s.mg < kWinogradMinChannels)
    return 0;
  for (const int tile : {4, 2}) {
    if ((g.out[1] + tile - 1) / tile * ((g.out[2] + tile - 1) / tile) >= kWinogradMinTiles)
      return tile;
  }
  return 0;
}

bool use_winograd(const Sizes& s, const Geometry& g) {
  return winograd_tile(s, g) != 0;
}

math::WinogradShape winograd_shape(const Sizes& s, const Geometry& g) {
  return {
      s.cg, s.mg, g.in[1], g.in[2], g.pad[1], g.pad[2], g.out[1], g.out[2], winograd_tile(s, g)};
}

bool use_transposed(const Sizes& s, const Geometry& g) {
  if (use_winograd(s, g)) return false;
  const int64_t positions = g.out_size();
  const int64_t limit = is_pointwise(g) ? kMaxTransposedPositions : kMaxTransposedWindowed;
  return !use_direct(s, g) && positions > 0 && positions <= limit;
}

// Where the transposed product gathers its patches from: the group's input channels
// themselves, or, when a window reaches into the padding, a zero-padded copy of them
// covering every window (`dims` the planes' sizes either way).
struct PatchSource {
  bool padded = false;
  std::array<int64_t, 3> dims{1, 1, 1};
  int64_t plane() const { return dims[0] * dims[1] * dims[2]; }
};

PatchSource patch_source(const Geometry& g) {
  PatchSource p;
  std::array<int64_t, 3> extent{};
  for (size_t i = 0; i < 3; ++i) {
    extent[i] = (g.out[i] - 1) * g.stride[i] + (g.k[i] - 1) * g.dil[i] + 1;
    if (g.pad[i] != 0 || extent[i] > g.in[i]) p.padded = true;
  }
  p.dims = p.padded ? extent : g.in;
  return p;
}

// The transposed product's workspace floats: the padded copy of one group's channels, Y^T of
// one (image, group); and its int64 offsets: each output position's and each patch row's.
struct TransposedSizes {
  int64_t source = 0, product = 0, offsets = 0;
};

TransposedSizes transposed_sizes(const Sizes& s, const Geometry& g) {
  if (!use_transposed(s, g)) return {};
  const PatchSource src = patch_source(g);
  return {src.padded ? s.cg * src.plane() : 0, g.out_size() * s.mg,
          g.out_size() + s.cg * g.k_size()};
}

// The group's channels (xg) into the zero-padded planes of `src` at `out`.
void pad_patch_source(const float* xg, int64_t channels, const Geometry& g, const PatchSource& src,
                      float* out) {
  const int64_t ip = g.in_size(), plane = src.plane();
  parallel_for(channels, grain_for(plane), [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      float* row = out + c * plane;
      for (int64_t d = 0; d < src.dims[0]; ++d) {
        for (int64_t h = 0; h < src.dims[1]; ++h, row += src.dims[2]) {
          const int64_t id = d - g.pad[0], ih = h - g.pad[1];
          std::fill(row, row + src.dims[2], 0.0f);
          if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) continue;
          const float* xr = xg + c * ip + (id * g.in[1] + ih) * g.in[2];
          const int64_t w0 = std::max<int64_t>(g.pad[2], 0);
          const int64_t w1 = std::min(src.dims[2], g.in[2] + g.pad[2]);
          if (w1 > w0) std::copy(xr + (w0 - g.pad[2]), xr + (w1 - g.pad[2]), row + w0);
        }
      }
    }
  });
}

// A convolution of small maps as the transposed product (use_transposed): per (image,
// group), patches gathered from the input (or its padded copy in `source`) straight into the
// GEMM's A panels, times the filter's packed transpose (`packed`: pack_filter's transposed
// form), with the bias as column bias, into Y^T at `product`; then Y^T is written into y
// transposed (added to y's values for Z) and activated. `offsets` holds
// transposed_sizes().offsets values.
void transposed_convolve(const float* x, const float* packed, const float* bias, float* y,
                         const Sizes& s, const Geometry& g, const ConvEpilogue& e, float* source,
                         float* product, int64_t* offsets) {
  if (!product || !offsets) throw std::logic_error("transposed convolution without workspace");
  const math::GemmKernels& t = math::kernels().gemm;
  const PatchSource src = patch_source(g);
  const int64_t ip = g.in_size(), op = g.out_size(), kk = s.cg * g.k_size();
  const int64_t d12 = src.dims[1] * src.dims[2];
  // Output position p reads its window from pos[p]; patch row q (channel, tap) adds row[q].
  int64_t* pos = offsets;
  int64_t* row = offsets + op;
  for (int64_t od = 0, p = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      for (int64_t ow = 0; ow < g.out[2]; ++ow, ++p) {
        pos[p] = od * g.stride[0] * d12 + oh * g.stride[1] * src.dims[2] + ow * g.stride[2];
      }
    }
  }
  for (int64_t c = 0, q = 0; c < s.cg; ++c) {
    for (int64_t kd = 0; kd < g.k[0]; ++kd) {
      for (int64_t kh = 0; kh < g.k[1]; ++kh) {
        for (int64_t kw = 0; kw < g.k[2]; ++kw, ++q) {
          row[q] =
              c * src.plane() + kd * g.dil[0] * d12 + kh * g.dil[1] * src.dims[2] + kw * g.dil[2];
        }
      }
    }
  }
  const int64_t per = math::PackedB::packed_floats(kk, s.mg, t.nr);
  math::GemmOptions o;
  if (!e.accumulate) o.activation = e.activation;
  for (int64_t u = 0; u < s.n * s.groups; ++u) {
    const int64_t n = u / s.groups, grp = u % s.groups;
    const float* base = x + (n * s.c + grp * s.cg) * ip;
    if (src.padded) {
      pad_patch_source(base, s.cg, g, src, source);
      base = source;
    }
    // Plain loops, not std::copy / std::fill: a dozen floats per call are cheaper copied in
    // place than through memmove.
    const math::APacker pack_a = [&](int64_t i0, int rows, int mr, int64_t p0, int64_t kc,
                                     float* out) {
      const int64_t* pi = pos + i0;
      const int64_t first = pi[0];
      const bool run = pi[rows - 1] - first == rows - 1;  // consecutive inputs
      for (int64_t q = 0; q < kc; ++q, out += mr) {
        const float* b = base + row[p0 + q];
        if (run) {
          for (int r = 0; r < rows; ++r) out[r] = b[first + r];
        } else {
          for (int r = 0; r < rows; ++r) out[r] = b[pi[r]];
        }
        for (int r = rows; r < mr; ++r) out[r] = 0.0f;
      }
    };
    o.bias = bias ? bias + grp * s.mg : nullptr;
    const math::PackedB wt(packed + grp * per, kk, s.mg, t.nr);
    if (use_strided_windows(s, g)) {
      // Position p's window is the run of the signal (or its padded copy) from p * stride,
      // its taps dilation apart: A is the signal itself as a strided matrix (its rows overlap
      // where the windows do), packed by the level's own (vector) packing.
      math::sgemm(math::MatrixView{base, op, kk, g.stride[2], g.dil[2]}, wt, product, s.mg, o);
    } else if (is_pointwise(g)) {
      // The patches are the input's columns: A is the input read transposed, packed by the
      // level's own (vector) packing.
      math::sgemm(math::MatrixView::col_major(base, op, kk, ip), wt, product, s.mg, o);
    } else {
      math::sgemm(op, pack_a, wt, product, s.mg, o);
    }
    // Y^T into y in blocks of 16 positions by 16 channels, each block copied into `tile`
    // first (Y^T's rows are mg floats apart: read in place, a column of a block would touch
    // 16 lines of one cache set).
    float* yu = y + (n * s.m + grp * s.mg) * op;
    constexpr int64_t kBlock = 16;
    parallel_for((s.mg + kBlock - 1) / kBlock, grain_for(op * kBlock), [&](int64_t lo, int64_t hi) {
      alignas(64) float tile[kBlock][kBlock];
      for (int64_t m0 = lo * kBlock; m0 < std::min(s.mg, hi * kBlock); m0 += kBlock) {
        const int64_t mc = std::min(s.mg - m0, kBlock);
        for (int64_t p0 = 0; p0 < op; p0 += kBlock) {
          const int64_t pc = std::min(op - p0, kBlock);
          for (int64_t p = 0; p < pc; ++p)
            std::copy(product + (p0 + p) * s.mg + m0, product + (p0 + p) * s.mg + m0 + mc, tile[p]);
          for (int64_t m = 0; m < mc; ++m) {
            float* dst = yu + (m0 + m) * op + p0;
            if (e.accumulate) {
              for (int64_t p = 0; p < pc; ++p) dst[p] += tile[p][m];
            } else {
              for (int64_t p = 0; p < pc; ++p) dst[p] = tile[p][m];
            }
          }
        }
        if (e.accumulate) {
          for (int64_t m = m0; m < m0 + mc; ++m) apply_activation(e.activation, yu + m * op, op);
        }
      }
    });
  }
}

// Floats of the wide path's buffers (one group's padded input channels, then the product
// over the wide positions) for float convolutions of these sizes, 0 where the path does not
// apply. It is the kernel's workspace (see conv_workspace): taken whenever this is nonzero,
// used unless the product runs one (image, group) unit per thread instead.
int64_t wide_floats(const Sizes& s, const Geometry& g) {
  if (g.out_size() == 0 || s.m == 0 || s.n == 0 || use_direct(s, g) || use_winograd(s, g) ||
      use_transposed(s, g) || is_pointwise(g) || g.out[2] < kMinWideWidth) {
    return 0;
  }
  int64_t in_row0 = 0;
  const WideExtent w(band_geometry(g, 0, wide_band(s, g), in_row0));
  return s.cg * w.plane + s.mg * w.wide_n;
}

// The float paths' workspace parts (see conv_parts): the wide or direct paths' buffers, and
// the transposed product's.
struct ConvSpace {
  float* wide = nullptr;
  float* source = nullptr;
  float* product = nullptr;
  int64_t* offsets = nullptr;
  float* winograd = nullptr;  // winograd_plan's workspace
  int threads = 1;            // the threads the workspace was planned for
};

// The form the float paths read the filter in for these sizes.
FilterForm filter_form(const Sizes& s, const Geometry& g) {
  if (const int tile = winograd_tile(s, g)) {
    return tile == 4 ? FilterForm::Winograd4 : FilterForm::Winograd2;
  }
  return use_transposed(s, g) ? FilterForm::Transposed : FilterForm::Packed;
}

math::WinogradPlan winograd_plan(const Sizes& s, const Geometry& g, int threads) {
  return math::winograd_plan(winograd_shape(s, g), s.n, threads, math::kernels());
}

// A convolution as Winograd products (use_winograd), group by group; `packed` is the
// filter's Winograd form. Relu is applied as the outputs are stored, other activations after.
void winograd_convolve(const float* x, const float* packed, const float* bias, float* y,
                       const Sizes& s, const Geometry& g, const ConvEpilogue& e,
                       const ConvSpace& space) {
  if (!space.winograd) throw std::logic_error("Winograd convolution without its workspace");
  const math::MathKernels& t = math::kernels();
  const math::WinogradPlan plan = winograd_plan(s, g, space.threads);
  const int64_t per = math::winograd_filter_floats(s.mg, s.cg, t.gemm.mr, plan.shape.tile);
  const int64_t ip = g.in_size(), op = g.out_size();
  const bool relu = e.activation == math::Activation::Relu;
  for (int64_t grp = 0; grp < s.groups; ++grp) {
    math::winograd_convolve(plan, x + grp * s.cg * ip, s.c * ip, packed + grp * per,
                            bias ? bias + grp * s.mg : nullptr, e.accumulate, relu,
                            y + grp * s.mg * op, s.m * op, space.winograd, t);
  }
  if (!relu) apply_activation(e.activation, y, s.n * s.m * op);
}

// Float convolution through the GEMM layer; `packed` is pack_filter's form of the filter
// (transposed for small maps: use_transposed). The wide path's buffers are `space.wide`
// (wide_floats of them) when given, else scratch from `ctx` (without a context the path is
// not taken).
void gemm_convolve(OpContext* ctx, const float* x, const float* packed, const float* bias, float* y,
                   const Sizes& s, const Geometry& g, const ConvEpilogue& e,
                   const ConvSpace& space) {
  if (use_strided_windows(s, g)) strided_window_count.fetch_add(1, std::memory_order_relaxed);
  if (use_winograd(s, g)) {
    winograd_convolve(x, packed, bias, y, s, g, e, space);
    return;
  }
  if (use_transposed(s, g)) {
    transposed_convolve(x, packed, bias, y, s, g, e, space.source, space.product, space.offsets);
    return;
  }
  float* wide_space = space.wide;
  const math::MathKernels& t = math::kernels();
  const math::ConvGeometry cg = conv_geometry(g);
  const int64_t ip = g.in_size(), op = g.out_size(), kk = s.cg * g.k_size();
  const int64_t per = math::PackedA::packed_floats(s.mg, kk, t.gemm.mr);
  const bool pointwise = is_pointwise(g);
  const int64_t units = s.n * s.groups;
  const double work = static_cast<double>(units) * static_cast<double>(s.mg) *
                      static_cast<double>(kk) * static_cast<double>(op);
  const int tasks = math::task_count(work);
  // Many (image, group) units: one single-threaded product each; else one after another,
  // each split across the threads.
  const bool by_unit = tasks > 1 && units >= 2 * tasks;
  math::GemmOptions o;
  o.accumulate = e.accumulate;
  o.activation = e.activation;
  if (by_unit) o.max_threads = 1;
  const bool wide = (ctx || wide_space) && !by_unit && wide_floats(s, g) > 0;
  if (wide) {
    // Bands of output rows (all of them in one unless the layout would outgrow the caches);
    // the first band's layout is the largest.
    const int64_t band = wide_band(s, g);
    int64_t in_row0 = 0;
    const WideExtent first(band_geometry(g, 0, band, in_row0));
    Tensor xp_scratch, wide_scratch;
    float* xp = wide_space;
    float* wide_y = wide_space ? wide_space + s.cg * first.plane : nullptr;
    if (!wide_space) {
      xp_scratch = ctx->allocate(DataType::Float, Shape{s.cg * first.plane});
      wide_scratch = ctx->allocate(DataType::Float, Shape{s.mg * first.wide_n});
      xp = xp_scratch.data<float>();
      wide_y = wide_scratch.data<float>();
    }
    for (int64_t oh0 = 0; oh0 < g.out[1]; oh0 += band) {
      const math::ConvGeometry bg = band_geometry(g, oh0, std::min(band, g.out[1] - oh0), in_row0);
      const WideLayout layout(bg, s.cg);
      for (int64_t u = 0; u < units; ++u) {
        const int64_t n = u / s.groups, grp = u % s.groups;
        const math::PackedA a(packed + grp * per, s.mg, kk, t.gemm.mr);
        wide_convolve(x + (n * s.c + grp * s.cg) * ip + in_row0 * g.in[2], ip, a,
                      bias ? bias + grp * s.mg : nullptr,
                      y + (n * s.m + grp * s.mg) * op + oh0 * g.out[2], op, s, bg, layout, e, xp,
                      wide_y);
      }
    }
    return;
  }
  auto unit_product = [&](int64_t unit) {
    const int64_t n = unit / s.groups, grp = unit % s.groups;
    const float* xg = x + (n * s.c + grp * s.cg) * ip;
    const math::PackedA a(packed + grp * per, s.mg, kk, t.gemm.mr);
    math::GemmOptions uo = o;
    uo.row_bias = bias ? bias + grp * s.mg : nullptr;
    math::BPacker pack_b;
    if (pointwise) {
      pack_b = [&](int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
        t.gemm.pack_b(xg + p0 * ip + j0, ip, 1, kc, nc, out);
      };
    } else {
      pack_b = [&](int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
        t.conv.im2col_panels(xg, cg, p0, kc, j0, nc, out);
      };
    }
    math::sgemm(a, op, pack_b, y + (n * s.m + grp * s.mg) * op, op, uo);
  };
  if (by_unit) {
    parallel_for(units, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t u = lo; u < hi; ++u) unit_product(u);
    });
  } else {
    for (int64_t u = 0; u < units; ++u) unit_product(u);
  }
}

// Y[n, m, :] for all n and m; x, w, bias (may be null) and y contiguous. `packed` holds the
// float filter of every group packed for the GEMM (null for depthwise and double).
// `col` (double only) holds kk x op values: one (image, group) lowered.
template <typename T>
void convolve(const T* x, const T* w, const float* packed, const T* bias, T* y, const Sizes& s,
              const Geometry& g, const ConvEpilogue& e = {}, OpContext* ctx = nullptr,
              const ConvSpace& space = {}, T* col = nullptr) {
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size(), kk = s.cg * kp;
  if (op == 0 || s.m == 0 || s.n == 0) return;

  const int64_t units = s.n * s.groups;
  if constexpr (std::is_same_v<T, float>) {
    if (use_direct(s, g)) {
      direct_convolve(x, w, bias, y, s, g, e, space.wide);
    } else {
      gemm_convolve(ctx, x, packed, bias, y, s, g, e, space);
    }
  } else {
    // Double: lower each (image, group) whole, then plain loops (never fused).
    (void)packed;
    (void)e;
    (void)ctx;
    (void)space;
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t n = unit / s.groups, grp = unit % s.groups;
      im2col(x + (n * s.c + grp * s.cg) * ip, s.cg, g, 0, op, col);
      parallel_for(s.mg, grain_for(kk * op), [&](int64_t m0, int64_t m1) {
        for (int64_t mi = m0; mi < m1; ++mi) {
          const int64_t mo = grp * s.mg + mi;
          T* yr = y + (n * s.m + mo) * op;
          std::fill(yr, yr + op, bias ? bias[mo] : T(0));
          const T* wr = w + mo * kk;
          for (int64_t q = 0; q < kk; ++q) {
            const T wv = wr[q];
            const T* cr = col + q * op;
            for (int64_t j = 0; j < op; ++j) yr[j] += wv * cr[j];
          }
        }
      });
    }
  }
}

// An activation with parameters (onnxruntime's LeakyRelu, Clip, HardSigmoid), applied after
// the product.
struct ParamActivation {
  enum class Kind : uint8_t { None, LeakyRelu, Clip, HardSigmoid } kind = Kind::None;
  float a = 0, b = 0;

  void apply(float* y, int64_t n) const {
    switch (kind) {
      case Kind::None:
        return;
      case Kind::LeakyRelu:
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] >= 0 ? y[i] : a * y[i];
        return;
      case Kind::Clip:
        for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(y[i], a), b);
        return;
      case Kind::HardSigmoid:
        for (int64_t i = 0; i < n; ++i) y[i] = std::min(1.0f, std::max(0.0f, a * y[i] + b));
        return;
    }
  }
};

// com.microsoft.FusedConv's activation (onnxruntime's GetFusedActivationAttr): the fused one
// in `fused`, a parameterized one in `post`.
void parse_ort_activation(const NodeInfo& info, math::Activation& fused, ParamActivation& post) {
  const std::string a = info.attr_string("activation", "");
  fused = math::Activation::None;
  if (a.empty()) return;
  if (a == "Relu") fused = math::Activation::Relu;
  if (a == "Tanh") fused = math::Activation::Tanh;
  if (a == "Sigmoid") fused = math::Activation::Sigmoid;
  if (fused != math::Activation::None) return;
  size_t count = 2;
  if (a == "LeakyRelu") {
    post.kind = ParamActivation::Kind::LeakyRelu;
    count = 1;
  } else if (a == "Clip") {
    post.kind = ParamActivation::Kind::Clip;
  } else if (a == "HardSigmoid") {
    post.kind = ParamActivation::Kind::HardSigmoid;
  } else {
    info.fail("unknown activation '" + a + "'", ErrorKind::Unsupported);
  }
  const std::vector<float> params = info.attr_floats("activation_params");
  if (params.size() != count) {
    info.fail(a + " needs " + std::to_string(count) + " activation_params, got " +
              std::to_string(params.size()));
  }
  post.a = params[0];
  post.b = count > 1 ? params[1] : 0.0f;
}

// Whether a constant filter is packed for the GEMM once, at load (not for the direct
// convolutions, which read it as it is; see use_direct).
bool packable_filter(const Tensor& w, int64_t groups) {
  return w.rank() >= 3 && w.numel() > 0 && w.dim(0) % groups == 0 &&
         ((w.dim(1) > 1 && w.dim(0) / groups > 2) || strided_window_filter(w, groups)) &&
         (w.dtype() == DataType::Float || w.dtype() == DataType::Float16 ||
          w.dtype() == DataType::BFloat16);
}

// The workspace of one convolution, as both the kernel and conv_workspace lay it out: for half
// types X, the bias, the filter of the direct loops and Y in float; the packed filter when it
// was not packed at load (`filter_at_load`); the convolution before a broadcasting Z is added
// (kiln.FusedConv); the wide paths' buffers (wide_floats, depthwise_floats) or the direct
// loops' padded planes, one per task on `threads` threads (padded_plane_floats). Double reads
// everything in place.
struct ConvParts {
  WorkspaceLayout layout;
  int x = -1, bias = -1, w = -1, packed = -1, y = -1, conv = -1, wide = -1;
  int source = -1, product = -1, offsets = -1;  // the transposed product's (transposed_sizes)
  int winograd = -1;                            // winograd_plan's
  int col = -1;                                 // double: one (image, group) lowered
  int threads = 1;

  ConvSpace float_space(const Workspace& space) const {
    return {space.data<float>(wide),      space.data<float>(source),   space.data<float>(product),
            space.data<int64_t>(offsets), space.data<float>(winograd), threads};
  }
};

ConvParts conv_parts(DataType dtype, const Sizes& s, const Geometry& g, bool has_bias,
                     bool filter_at_load, bool z_broadcasts, int threads) {
  ConvParts p;
  p.threads = threads;
  WorkspaceLayout& l = p.layout;
  if (dtype == DataType::Double) {
    p.col = l.add(DataType::Double, s.cg * g.k_size() * g.out_size());
    return p;
  }
  const bool half = dtype != DataType::Float;
  const int64_t kk = s.cg * g.k_size(), out = s.n * s.m * g.out_size();
  if (half) {
    p.x = l.add(DataType::Float, s.n * s.c * g.in_size());
    if (has_bias) p.bias = l.add(DataType::Float, s.m);
  }
  if (use_direct(s, g)) {
    if (half) p.w = l.add(DataType::Float, s.m * kk);
  } else if (!filter_at_load) {
    p.packed = l.add(DataType::Float, form_floats(s.groups, s.mg, s.cg, kk, filter_form(s, g)));
  }
  if (half) p.y = l.add(DataType::Float, out);
  if (z_broadcasts) p.conv = l.add(DataType::Float, out);
  // The GEMM's wide path, the depthwise one or the direct loops' padded planes (one at most:
  // the depthwise and padded planes are direct, and the padded planes not depthwise).
  p.wide = l.add(DataType::Float,
                 wide_floats(s, g) + depthwise_floats(s, g) + padded_plane_floats(s, g, threads));
  const TransposedSizes ts = transposed_sizes(s, g);
  p.source = l.add(DataType::Float, ts.source);
  p.product = l.add(DataType::Float, ts.product);
  p.offsets = l.add(DataType::Int64, ts.offsets);
  p.winograd = l.add(DataType::Float,
                     use_winograd(s, g) ? winograd_plan(s, g, threads).workspace_floats() : 0);
  return p;
}

// Which convolution a Conv kernel runs.
enum class ConvKind : uint8_t { Plain, KilnFused, OrtFused };

class Conv final : public Kernel {
 public:
  Conv(const NodeInfo& info, ConvKind kind)
      : fused_(kind != ConvKind::Plain),
        ort_(kind == ConvKind::OrtFused),
        activation_(kind == ConvKind::KilnFused ? parse_activation(info) : math::Activation::None),
        group_(info.attr_int("group", 1)),
        window_(window_attrs(info.node())) {
    if (group_ < 1 || group_ > kMaxWindowAttr) info.fail("group must be in [1, 2^31]");
    if (ort_) parse_ort_activation(info, activation_, post_);
    // A constant filter is packed for the GEMM once (not for the direct convolutions, which
    // read it as it is; see use_direct).
    const Tensor* w = info.constant_input(1);
    filter_planned_ = info.is_initializer(1) &&
                      packable_filter(info.graph().value(info.node().inputs[1]).constant, group_);
    if (w && packable_filter(*w, group_)) {
      form_ = hinted_form(info, *w);
      const int64_t groups = group_;
      const FilterForm form = form_;
      packed_ = info.prepared_input(1, packing_name(groups, form), [groups, form](const Tensor& f) {
        return pack_filter(f, groups, form);
      });
      packed_groups_ = group_;
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const bool has_bias = ctx.has_input(2);
    if (x.rank() < 3 || x.rank() > 5) {
      ctx.fail("input must have 1 to 3 spatial dimensions, got " + x.describe(),
               x.rank() > 5 ? ErrorKind::Unsupported : ErrorKind::Runtime);
    }
    if (w.rank() != x.rank())
      ctx.fail("weight " + w.describe() + " does not match " + x.describe());
    if (w.dtype() != x.dtype() || (has_bias && ctx.input(2).dtype() != x.dtype())) {
      ctx.fail("inputs have different element types");
    }
    Sizes s{x.dim(0), x.dim(1), w.dim(0), group_, w.dim(1), 0};
    if (s.cg * s.groups != s.c) {
      ctx.fail("input channels " + std::to_string(s.c) + " do not match weight " + w.describe() +
               " with group " + std::to_string(s.groups));
    }
    if (s.m % s.groups != 0) ctx.fail("output channels are not divisible by group");
    s.mg = s.m / s.groups;
    if (has_bias && (ctx.input(2).rank() != 1 || ctx.input(2).dim(0) != s.m)) {
      ctx.fail("bias " + ctx.input(2).describe() + " must have " + std::to_string(s.m) + " values");
    }
    const std::vector<WindowAxis> axes = forward_windows(
        spatial_dims(x.shape()), conv_kernel(window_, spatial_dims(w.shape())), window_);
    const Geometry g = right_aligned(axes);
    const Shape out_shape = windowed_shape(s.n, s.m, axes);
    if (fused_) {
      if (ort_ && ctx.has_input(3) && ctx.input(3).shape() != out_shape) {
        ctx.fail("Z " + ctx.input(3).describe() + " must have the output's shape " +
                 shape_to_string(out_shape));
      }
      Tensor& y = run_fused(ctx, s, g, out_shape);
      post_.apply(y.data<float>(), y.numel());
      return;
    }

    dispatch(TypeList<float, double, float16, bfloat16>{}, x.dtype(), [&]<typename T>() {
      Tensor& y = ctx.output(0, x.dtype(), out_shape);
      if constexpr (std::is_same_v<T, double>) {
        const ConvParts parts =
            conv_parts(x.dtype(), s, g, has_bias, filter_planned_, false, ctx.threads());
        const Workspace space(ctx, parts.layout);
        convolve<T>(x.data<const T>(), w.data<const T>(), nullptr,
                    has_bias ? ctx.input(2).data<const T>() : nullptr, y.data<T>(), s, g, {},
                    nullptr, {}, space.data<double>(parts.col));
      } else {
        // Float, or a half type computed in float in the workspace (conv_parts), which
        // follows the output.
        const ConvParts parts =
            conv_parts(x.dtype(), s, g, has_bias, filter_planned_, false, ctx.threads());
        const Workspace space(ctx, parts.layout);
        auto widen = [&](const Tensor& t, int part) {
          if (t.dtype() == DataType::Float) return t;
          Tensor f = space.tensor(part, t.shape());
          unary_loop<T, float>(t, f, [](T v) { return static_cast<float>(v); });
          return f;
        };
        const Tensor fx = widen(x, parts.x);
        const Tensor fb = has_bias ? widen(ctx.input(2), parts.bias) : Tensor();
        Tensor fw, packed_now;
        const float* packed = filter(
            ctx, s, g, [&](const Tensor& t) { return widen(t, parts.w); },
            space.data<float>(parts.packed), fw, packed_now);
        const bool is_float = std::is_same_v<T, float>;
        Tensor fy = is_float ? y : space.tensor(parts.y, out_shape);
        convolve<float>(fx.data<const float>(), fw.defined() ? fw.data<const float>() : nullptr,
                        packed, has_bias ? fb.data<const float>() : nullptr, fy.data<float>(), s, g,
                        {}, &ctx, parts.float_space(space));
        if (!is_float) unary_loop<float, T>(fy, y, [](float v) { return T(v); });
      }
    });
  }

 private:
  // The filter as the convolution reads it: for the direct loops `fw` (widened to float by
  // `widen`), else the packed GEMM form returned (the cached one, or packed into
  // `room`, the workspace's part for it, from a filter computed at run time; scratch in
  // `packed_now` only should a filter the rule saw packed at load not be).
  template <typename Widen>
  const float* filter(OpContext& ctx, const Sizes& s, const Geometry& g, const Widen& widen,
                      float* room, Tensor& fw, Tensor& packed_now) const {
    const Tensor& w = ctx.input(1);
    if (use_direct(s, g)) {
      fw = widen(w);  // direct loops read the filter as it is
      return nullptr;
    }
    const FilterForm form = filter_form(s, g);
    if (packed_ && packed_groups_ == s.groups) {
      if (form == form_) return packed_->data<const float>();
      return other_form(w, s.groups, form);
    }
    const int64_t floats = packed_filter_floats(w, s.groups, form);
    if (floats == 0) return nullptr;  // an empty product reads no filter
    if (!room) {
      packed_now = ctx.allocate(DataType::Float, Shape{floats});
      room = packed_now.data<float>();
    }
    pack_filter_into(w, s.groups, form, room);
    return room;
  }

  // The name of the weights cache's packed filter in one form.
  static std::string packing_name(int64_t groups, FilterForm form) {
    const math::MathKernels& t = math::kernels();
    const std::string level = math::isa_name(t.isa), g = "-g" + std::to_string(groups);
    switch (form) {
      case FilterForm::Transposed:
        return "conv-filter-t-" + level + "-nr" + std::to_string(t.gemm.nr) + g;
      case FilterForm::Winograd4:
        return "conv-filter-winograd4-" + level + "-mr" + std::to_string(t.gemm.mr) + g;
      case FilterForm::Winograd2:
        return "conv-filter-winograd2-" + level + "-mr" + std::to_string(t.gemm.mr) + g;
      case FilterForm::Packed:
        break;
    }
    return "conv-filter-" + level + "-mr" + std::to_string(t.gemm.mr) + g;
  }

  // The form the input's shape as inferred at load makes the convolution read (filter_form);
  // the plain packed form when the shape is not known.
  FilterForm hinted_form(const NodeInfo& info, const Tensor& w) const {
    const Shape* x = info.input_shape_hint(0);
    if (!x || x->size() != w.rank() || w.rank() < 3 || (*x)[1] != w.dim(1) * group_)
      return FilterForm::Packed;
    try {
      const Geometry g = right_aligned(forward_windows(
          spatial_dims(*x), conv_kernel(window_, spatial_dims(w.shape())), window_));
      return filter_form(Sizes{(*x)[0], (*x)[1], w.dim(0), group_, w.dim(1), w.dim(0) / group_}, g);
    } catch (const Error&) {
      return FilterForm::Packed;  // the run reports a bad shape
    }
  }

  // The constant filter in a form the load-time shape did not choose (a run on maps of
  // another size): packed on the first such run and kept.
  const float* other_form(const Tensor& w, int64_t groups, FilterForm form) const {
    const std::lock_guard<std::mutex> lock(other_mutex_);
    std::shared_ptr<const Tensor>& other = others_[static_cast<size_t>(form)];
    if (!other) other = std::make_shared<const Tensor>(pack_filter(w, groups, form));
    return other->data<const float>();
  }

  // kiln.FusedConv: y = activation(conv + bias + Z); returns y.
  Tensor& run_fused(OpContext& ctx, const Sizes& s, const Geometry& g, const Shape& out_shape) {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::Float) ctx.fail("takes float inputs, got " + x.describe());
    const bool has_bias = ctx.has_input(2), has_z = ctx.has_input(3);
    const float* bias = has_bias ? ctx.input(2).data<const float>() : nullptr;
    ConvEpilogue e;
    e.activation = activation_;
    const Tensor* z = has_z ? &ctx.input(3) : nullptr;
    if (z && z->dtype() != DataType::Float) ctx.fail("Z " + z->describe() + " must be float");
    // Z of another shape broadcasts (to the convolution's shape or beyond): the sum is a
    // broadcasting Add of the convolution, made in the workspace.
    const bool z_broadcasts = z && z->shape() != out_shape;
    Shape sum_shape = out_shape;
    if (z_broadcasts) {
      try {
        sum_shape = broadcast_shapes(out_shape, z->shape());
      } catch (const Error&) {
        ctx.fail("Z " + z->describe() + " does not broadcast to the convolution's output " +
                 shape_to_string(out_shape));
      }
    }
    Tensor* out = nullptr;
    if (z && !z_broadcasts) {
      // Accumulate onto Z: in place when Z dies here, else onto a copy of it.
      e.accumulate = true;
      out = ctx.can_overwrite(3) ? &ctx.output_reusing(0, 3, DataType::Float, out_shape)
                                 : &ctx.output(0, DataType::Float, out_shape);
      if (out->raw_data() == z->raw_data()) {
        ctx.count_in_place();
      } else {
        copy_elements(*z, *out);
        ctx.count_copy(static_cast<uint64_t>(out->nbytes()));
      }
    } else {
      out = &ctx.output(0, DataType::Float, sum_shape);
    }
    Tensor& y = *out;
    // The workspace follows the output.
    const ConvParts parts =
        conv_parts(DataType::Float, s, g, has_bias, filter_planned_, z_broadcasts, ctx.threads());
    const Workspace space(ctx, parts.layout);
    Tensor fw, packed_now;
    const float* packed = filter(
        ctx, s, g, [](const Tensor& t) { return t; }, space.data<float>(parts.packed), fw,
        packed_now);
    const float* w = fw.defined() ? fw.data<const float>() : nullptr;
    const ConvSpace cs = parts.float_space(space);
    if (!z_broadcasts) {
      convolve<float>(x.data<const float>(), w, packed, bias, y.data<float>(), s, g, e, &ctx, cs);
      return y;
    }
    Tensor conv = space.tensor(parts.conv, out_shape);
    convolve<float>(x.data<const float>(), w, packed, bias, conv.data<float>(), s, g, {}, &ctx, cs);
    binary_loop<float, float, float>(conv, *z, y, [](float a, float b) { return a + b; });
    apply_activation(activation_, y.data<float>(), y.numel());
    return y;
  }

  // The spatial axes right-aligned in three dimensions.
  bool fused_;
  bool ort_;  // com.microsoft.FusedConv
  math::Activation activation_;
  ParamActivation post_;
  int64_t group_;
  WindowAttrs window_;
  std::shared_ptr<const Tensor> packed_;  // the weights cache's packed filter
  int64_t packed_groups_ = 0;
  FilterForm form_ = FilterForm::Packed;  // packed_'s form
  mutable std::mutex other_mutex_;
  mutable std::array<std::shared_ptr<const Tensor>, kFilterForms> others_;  // other_form's
  // The filter is an initializer packed at load: the workspace has no room to pack it
  // (conv_parts' `filter_at_load`, as the workspace rule decides it).
  bool filter_planned_ = false;
};

Shape conv_output_shape(const ShapeContext& c) {
  return ops::conv_output_shape(c.shape(0), c.shape(1), window_attrs(c.node()));
}

void conv_shape(ShapeContext& c) {
  c.set(0, c.dtype(0), conv_output_shape(c));
}

// The kernel's workspace (conv_parts) for these shapes on c.threads() threads.
uint64_t conv_workspace(const ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  const Shape out = conv_output_shape(c);
  const int64_t groups = c.attr_i("group", 1);
  if (groups <= 0 || w[0] % groups != 0) unknown("bad group");
  const Sizes s{x[0], x[1], w[0], groups, w[1], w[0] / groups};
  const WindowAttrs a = window_attrs(c.node());
  const Geometry g =
      right_aligned(forward_windows(spatial_dims(x), conv_kernel(a, spatial_dims(w)), a));
  const Tensor* filter = c.constant(1);
  const bool z_broadcasts = c.has(3) && c.shape(3) != out;
  return conv_parts(c.dtype(0), s, g, c.has(2), filter && packable_filter(*filter, groups),
                    z_broadcasts, c.threads())
      .layout.bytes();
}

// kiln.FusedConv: the convolution plus Z, which may broadcast.
void fused_conv_shape(ShapeContext& c) {
  const Shape out = conv_output_shape(c);
  c.set(0, c.dtype(0), c.has(3) ? broadcast_shapes(out, c.shape(3)) : out);
}

}  // namespace

uint64_t strided_window_convolutions() {
  return strided_window_count.load(std::memory_order_relaxed);
}

KILN_REGISTER_OP({.op = "Conv",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = conv_shape,
                  .workspace = conv_workspace,
                  .create = [](const NodeInfo& info) -> std::unique_ptr<Kernel> {
                    return std::make_unique<Conv>(info, ConvKind::Plain);
                  }});

KILN_REGISTER_OP({.domain = "kiln",
                  .op = "FusedConv",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(3),
                  .types = "float",
                  .shape = fused_conv_shape,
                  .workspace = conv_workspace,
                  .create = [](const NodeInfo& info) -> std::unique_ptr<Kernel> {
                    return std::make_unique<Conv>(info, ConvKind::KilnFused);
                  }});

// onnxruntime's com.microsoft.FusedConv: float only; Z has the output's shape.
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "FusedConv",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(3),
                  .types = "float",
                  .shape = conv_shape,
                  .workspace = conv_workspace,
                  .create = [](const NodeInfo& info) -> std::unique_ptr<Kernel> {
                    return std::make_unique<Conv>(info, ConvKind::OrtFused);
                  }});

}  // namespace kiln::ops
