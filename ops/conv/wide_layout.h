// The "wide" layout of a convolution's or pooling's input channel, shared by Conv's GEMM
// path (ops/conv/conv_wide.cpp) and the small-plane depthwise and pooling paths
// (ops/conv/conv_direct.cpp, ops/nn/pool.cpp): the channel padded and split into stride phases, so
// that every tap reads the inputs of consecutive output positions as one contiguous run (see
// WideExtent).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/math/kernels.h"
#include "ops/math/threading.h"

namespace kiln::ops {

// Fills `fill` at j < lo and j >= hi and dst[j] = src[base + j * stride] in between.
template <typename T>
inline void gather_row(T* dst, int64_t n, const T* src, int64_t base, int64_t stride, int64_t lo,
                       int64_t hi, T fill = T(0)) {
  lo = std::clamp<int64_t>(lo, 0, n);
  hi = std::clamp<int64_t>(hi, lo, n);
  std::fill(dst, dst + lo, fill);
  if (stride == 1) {
    std::copy(src + (base + lo), src + (base + hi), dst + lo);
  } else {
    for (int64_t j = lo; j < hi; ++j) dst[j] = src[base + j * stride];
  }
  std::fill(dst + hi, dst + n, fill);
}

// Smallest j >= 0 with base + j * s >= limit (s > 0).
inline int64_t first_at_least(int64_t base, int64_t s, int64_t limit) {
  const int64_t need = limit - base;
  return need <= 0 ? 0 : (need + s - 1) / s;
}

// The wide path's layout of one padded input channel: split into stride phases along every
// axis (padded position a along axis i lands in phase a % stride[i] at index a / stride[i]),
// each phase a box of len[0] x len[1] x len[2]. A tap then reads, for every output position,
// the same phase at the output's own index plus a fixed shift, so consecutive output
// positions read consecutive floats whatever the stride. Only the phases some tap reads are
// kept (a 1x1 stride-2 filter reads one of four), one after another. With stride 1 there is
// one phase: the plainly padded channel.
struct WideExtent {
  int64_t len[3] = {};
  std::vector<int64_t> slot;  // per phase: its place among the kept ones, -1 if unread
  std::vector<int64_t> taps;  // per tap (filter order): where it reads for output position 0
  int64_t phase = 0;          // floats of one phase
  int64_t plane = 0;          // floats of one laid-out channel (its kept phases)
  int64_t wide_n = 0;         // wide output positions, up to the last valid one

  explicit WideExtent(const math::ConvGeometry& cg) {
    for (int i = 0; i < 3; ++i) len[i] = cg.out[i] + (cg.k[i] - 1) * cg.dil[i] / cg.stride[i];
    phase = len[0] * len[1] * len[2];
    slot.assign(static_cast<size_t>(cg.stride[0] * cg.stride[1] * cg.stride[2]), -1);
    int64_t kept = 0, t[3];
    for (t[0] = 0; t[0] < cg.k[0]; ++t[0]) {
      for (t[1] = 0; t[1] < cg.k[1]; ++t[1]) {
        for (t[2] = 0; t[2] < cg.k[2]; ++t[2]) {
          int64_t ph = 0, shift = 0;
          for (int i = 0; i < 3; ++i) {
            const int64_t a = t[i] * cg.dil[i];
            ph = ph * cg.stride[i] + a % cg.stride[i];
            shift = shift * len[i] + a / cg.stride[i];
          }
          int64_t& sl = slot[static_cast<size_t>(ph)];
          if (sl < 0) sl = kept++;
          taps.push_back(sl * phase + shift);
        }
      }
    }
    plane = kept * phase;
    wide_n = ((cg.out[0] - 1) * len[1] + cg.out[1] - 1) * len[2] + cg.out[2];
  }
};

// One input channel `x` into the wide layout at `out`: the kept phases, `fill` outside the
// input (zeros for convolutions and sums, -inf for max pooling), each depth slice by `k`'s
// pad_rows (the dispatched level's unless given). With column stride 2, the row phases whose
// two column phases are both kept are written by pad_rows_pair, walking the input rows in
// order (each read once, split into both column phases).
inline void pad_phases(const float* x, const math::ConvGeometry& cg, const WideExtent& w,
                       float* out, float fill = 0.0f,
                       const math::ConvKernels& k = math::kernels().conv) {
  const int64_t s0 = cg.stride[0], s1 = cg.stride[1], s2 = cg.stride[2];
  const int64_t ip = cg.in[1] * cg.in[2], slice = w.len[1] * w.len[2];
  // Row phases (r0 * s1 + r1) whose two column phases are both kept, at column stride 2 and
  // row strides up to 2: their slots' floats, or -1.
  int64_t pair0[4] = {-1, -1, -1, -1}, pair1[4] = {-1, -1, -1, -1};
  if (s2 == 2 && s0 <= 2 && s1 <= 2) {
    for (int64_t r01 = 0; r01 < s0 * s1; ++r01) {
      const int64_t a = w.slot[static_cast<size_t>(r01 * 2)];
      const int64_t b = w.slot[static_cast<size_t>(r01 * 2 + 1)];
      if (a >= 0 && b >= 0) pair0[r01] = a * w.phase, pair1[r01] = b * w.phase;
    }
    constexpr int64_t kRows = 32;  // rows handed to the kernel at once
    const float* src[kRows];
    float* d0[kRows];
    float* d1[kRows];
    for (int64_t r0 = 0; r0 < s0; ++r0) {
      for (int64_t i0 = 0; i0 < w.len[0]; ++i0) {
        const int64_t id = i0 * s0 + r0 - cg.pad[0];
        const float* plane = id >= 0 && id < cg.in[0] ? x + id * ip : nullptr;
        int64_t n = 0;
        // Padded rows in order: padded row i1 * s1 + r1 is row i1 of row phase r1.
        for (int64_t i1 = 0; i1 < w.len[1]; ++i1) {
          for (int64_t r1 = 0; r1 < s1; ++r1) {
            const int64_t r01 = r0 * s1 + r1;
            if (pair0[r01] < 0) continue;
            const int64_t ih = i1 * s1 + r1 - cg.pad[1];
            src[n] = plane && ih >= 0 && ih < cg.in[1] ? plane + ih * cg.in[2] : nullptr;
            const int64_t at = i0 * slice + i1 * w.len[2];
            d0[n] = out + pair0[r01] + at;
            d1[n] = out + pair1[r01] + at;
            if (++n == kRows) {
              k.pad_rows_pair(src, n, cg.in[2], -cg.pad[2], w.len[2], fill, d0, d1);
              n = 0;
            }
          }
        }
        if (n > 0) k.pad_rows_pair(src, n, cg.in[2], -cg.pad[2], w.len[2], fill, d0, d1);
      }
    }
  }
  for (int64_t p = 0; p < s0 * s1 * s2; ++p) {
    const int64_t sl = w.slot[static_cast<size_t>(p)];
    if (sl < 0 || (s2 == 2 && s0 <= 2 && s1 <= 2 && pair0[p / 2] >= 0)) continue;
    const int64_t r0 = p / (s1 * s2), r1 = p / s2 % s1, r2 = p % s2;
    float* dst = out + sl * w.phase;
    // Index i of a row is input column i * s2 + base.
    const int64_t base = r2 - cg.pad[2];
    for (int64_t i0 = 0; i0 < w.len[0]; ++i0, dst += slice) {
      const int64_t id = i0 * s0 + r0 - cg.pad[0];
      const bool inside = id >= 0 && id < cg.in[0];
      k.pad_rows(inside ? x + id * ip : nullptr, cg.in[1], cg.in[2], r1 - cg.pad[1], s1, w.len[1],
                 base, s2, w.len[2], fill, dst);
    }
  }
}

// Depthwise convolutions and poolings with output planes of at most this many positions run
// each plane through its wide form (use_wide_planes); past it the direct kernels' row
// vectors are full enough that the padded copy does not pay.
constexpr int64_t kWideMaxPlane = 64 * 64;

// Planes worked on at once by those paths, each with its own slot of the kernel's workspace
// (a machine with more threads runs this many tasks: these ops are small).
constexpr int64_t kWideSlots = 16;

// Strides 1 and 2: a stride-2 plane is split into its phases in one pass over each input row
// (pad_rows_pair), after which every tap reads whole vectors without the direct kernels'
// per-tap permutes and border masks.
inline bool use_wide_planes(const math::ConvGeometry& g, int64_t planes) {
  const int64_t out = g.out[0] * g.out[1] * g.out[2];
  return out > 0 && out <= kWideMaxPlane && planes > 0 && g.stride[0] <= 2 && g.stride[1] <= 2 &&
         g.stride[2] <= 2;
}

// One slot: a plane laid out wide, then its wide output, each with wide_plane's slack.
inline int64_t wide_slot_floats(const WideExtent& w) {
  return w.plane + w.wide_n + 2 * math::ConvKernels::wide_slack;
}

// The workspace floats of the per-plane wide paths over `planes` planes.
inline int64_t wide_planes_floats(const WideExtent& w, int64_t planes) {
  return std::min(kWideSlots, planes) * wide_slot_floats(w);
}

// Runs body(xp, wide, plane) for every plane in [0, planes), split into tasks (work: the
// cost of one plane) that each take a run of planes and one slot of `space`
// (wide_planes_floats floats): xp is the slot's laid-out plane, `wide` its wide output.
template <typename Body>
void for_wide_slots(const WideExtent& w, int64_t planes, int64_t work, float* space, Body&& body) {
  const int64_t per = wide_slot_floats(w), slack = math::ConvKernels::wide_slack;
  const double total = static_cast<double>(planes) * static_cast<double>(work);
  const int tasks =
      static_cast<int>(std::min<int64_t>(math::task_count(total), std::min(kWideSlots, planes)));
  math::run_tasks(tasks, [&](int t) {
    float* xp = space + t * per;
    float* wide = xp + w.plane + slack;
    // The slack past the plane reaches only positions past wide_n: zeros, not stale floats.
    std::fill(xp + w.plane, wide, 0.0f);
    for (int64_t p = planes * t / tasks; p < planes * (t + 1) / tasks; ++p) body(xp, wide, p);
  });
}

}  // namespace kiln::ops
