#include "ops/conv/conv_direct.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "ops/conv/wide_layout.h"
#include "ops/core/common.h"
#include "ops/elementwise/activation.h"
#include "ops/math/threading.h"

namespace kiln::ops::convolution {
namespace {

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

// Depthwise convolution of small planes: each input plane is laid out once in the wide form
// (padded, split into stride phases; ops/conv/wide_layout.h), where every tap reads the inputs of
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

}  // namespace

int64_t depthwise_floats(const Sizes& s, const Geometry& g) {
  if (!use_depthwise_wide(s, g)) return 0;
  return wide_planes_floats(WideExtent(conv_geometry(g)), s.n * s.m);
}

int64_t padded_plane_floats(const Sizes& s, const Geometry& g, int threads) {
  if (!use_direct(s, g) || use_depthwise_lanes(s, g) || use_depthwise_wide(s, g) ||
      direct_in_place(g))
    return 0;
  return plane_tasks(s, g, threads) * math::conv_padded_floats(conv_geometry(g));
}

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

}  // namespace kiln::ops::convolution
