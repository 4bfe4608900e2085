// Convolution kernels: the lowering of input patches into GEMM panels, and the table of the
// convolution and pooling kernels, whose direct loops (impl/conv_direct.h), pooling
// (impl/conv_pool.h) and wide layout (impl/conv_wide.h) have headers of their own. Included by
// each ops/math/isa_*.cpp inside its namespace; includes nothing outside impl/.

#include "ops/math/impl/conv_direct.h"

#include "ops/math/impl/conv_pool.h"
#include "ops/math/impl/conv_wide.h"

// A run of output positions along one output row inside one panel: where its input row
// and column start (before the tap offsets) and where it goes in the panel block.
struct Im2colRun {
  int64_t id0, ih0, iw0, len, dst;
};

// Rows [p0, p0 + kc) of one (image, group)'s patch matrix (rows: channel, kd, kh, kw;
// columns: output positions) for positions [j0, j0 + nc), straight into GEMM panels of
// kGemmNr positions (panel q at out + q * kc * kGemmNr), zero past nc and outside the input.
// The runs of consecutive output columns are found once per block, not once per row.
void im2col_panels(const float* x, const ConvGeometry& g, int64_t p0, int64_t kc, int64_t j0,
                   int64_t nc, float* out) {
  const int64_t ip = g.in[0] * g.in[1] * g.in[2], kp = g.k[0] * g.k[1] * g.k[2];
  const int64_t ohw = g.out[1] * g.out[2], khw = g.k[1] * g.k[2];
  const int64_t s = g.stride[2];
  // Worst case a run per position (one output column): groups of panels bound the table.
  constexpr int64_t kGroupPanels = 16, kMaxRuns = kGroupPanels * kGemmNr;
  Im2colRun runs[kMaxRuns];
  const int64_t panels = (nc + kGemmNr - 1) / kGemmNr;
  for (int64_t q0 = 0; q0 < panels; q0 += kGroupPanels) {
    const int64_t q1 = dc_min(panels, q0 + kGroupPanels);
    int64_t n_runs = 0;
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t first = j0 + q * kGemmNr, last = first + dc_min(kGemmNr, nc - q * kGemmNr);
      for (int64_t p = first; p < last;) {
        const int64_t od = p / ohw, oh = (p % ohw) / g.out[2], ow = p % g.out[2];
        const int64_t len = dc_min(last - p, g.out[2] - ow);
        runs[n_runs++] = {od * g.stride[0] - g.pad[0], oh * g.stride[1] - g.pad[1],
                          ow * s - g.pad[2], len, q * kc * kGemmNr + (p - first)};
        p += len;
      }
    }
    for (int64_t r = 0; r < kc; ++r) {
      const int64_t row = p0 + r, c = row / kp, t = row % kp;
      const int64_t kd = t / khw, kh = (t % khw) / g.k[2], kw = t % g.k[2];
      const float* xc = x + c * ip;
      float* base_out = out + r * kGemmNr;
      for (int64_t i = 0; i < n_runs; ++i) {
        const Im2colRun& run = runs[i];
        float* dst = base_out + run.dst;
        const int64_t id = run.id0 + kd * g.dil[0], ih = run.ih0 + kh * g.dil[1];
        if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
          for (int64_t j = 0; j < run.len; ++j) dst[j] = 0.0f;
          continue;
        }
        // Input column of the run's position j: base + j * s.
        dc_copy_row(xc + (id * g.in[1] + ih) * g.in[2], g.in[2], run.iw0 + kw * g.dil[2], s,
                    run.len, dst);
      }
      // The last panel's columns past nc.
      if (q1 == panels) {
        const int64_t tail = nc - (panels - 1) * kGemmNr;
        float* last_panel = base_out + (panels - 1) * kc * kGemmNr;
        for (int64_t j = tail; j < kGemmNr; ++j) last_panel[j] = 0.0f;
      }
    }
  }
}

constexpr ConvKernels kConvKernels{.pad_plane = dc_pad_plane,
                                   .padded_plane = dc_padded_plane,
                                   .im2col_panels = im2col_panels,
                                   .pool_plane = dc_pool_plane,
                                   .direct_plane = dc_direct_plane,
                                   .direct_pool_plane = dc_direct_pool_plane,
                                   .pad_rows = dc_pad_rows,
                                   .pad_rows_pair = dc_pad_rows_pair,
                                   .wide_plane = dc_wide_plane,
                                   .depthwise_lanes = dc_depthwise_lanes,
                                   .pool_planes = dc_pool_planes,
                                   .lanes = kLanes};
