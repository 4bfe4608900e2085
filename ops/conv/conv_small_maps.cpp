#include "ops/conv/conv_small_maps.h"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "ops/core/common.h"
#include "ops/elementwise/activation.h"
#include "ops/math/gemm.h"

namespace kiln::ops::convolution {
namespace {

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

}  // namespace

TransposedSizes transposed_sizes(const Sizes& s, const Geometry& g) {
  if (!use_transposed(s, g)) return {};
  const PatchSource src = patch_source(g);
  return {src.padded ? s.cg * src.plane() : 0, g.out_size() * s.mg,
          g.out_size() + s.cg * g.k_size()};
}

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

}  // namespace kiln::ops::convolution
