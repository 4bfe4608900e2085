// Convolution kernels: the lowering of input patches into GEMM panels, and direct
// convolution of one input plane into one output plane, y += w (*) x, for the
// convolutions where a GEMM is the wrong shape: depthwise ones (one input channel per group)
// and ones with very few output channels (a product with one or two rows would spend its
// time lowering patches). Plain loops along the innermost output dimension, which the
// compiler vectorises at this level's width. Included by each ops/math/isa_*.cpp inside its
// namespace; includes nothing.

inline int64_t dc_min(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t dc_max(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// Smallest j >= 0 with base + j * s >= limit (s > 0).
inline int64_t dc_first_at_least(int64_t base, int64_t s, int64_t limit) {
  const int64_t need = limit - base;
  return need <= 0 ? 0 : (need + s - 1) / s;
}

// y[j] += sum over taps k of w[k] * x[base + k * dil + j * stride] for j in [j0, j1), every
// tap inside the input. A compile-time tap count lets the taps unroll.
template <int K>
inline void dc_taps(float* __restrict y, const float* __restrict x, const float* __restrict w,
                    int64_t taps, int64_t j0, int64_t j1, int64_t base, int64_t dil,
                    int64_t stride) {
  const int64_t n = K > 0 ? K : taps;
  if (stride == 1) {
    for (int64_t j = j0; j < j1; ++j) {
      float acc = y[j];
      for (int64_t k = 0; k < n; ++k) acc += w[k] * x[base + k * dil + j];
      y[j] = acc;
    }
  } else {
    for (int64_t j = j0; j < j1; ++j) {
      float acc = y[j];
      for (int64_t k = 0; k < n; ++k) acc += w[k] * x[base + k * dil + j * stride];
      y[j] = acc;
    }
  }
}

// Long kernels (hundreds of taps, as 1-D audio front ends have) with unit stride: the taps
// outer, so each pass streams one shifted row of x into y.
inline void dc_long_taps(float* __restrict y, const float* __restrict x, const float* __restrict w,
                         int64_t taps, int64_t j0, int64_t j1, int64_t base, int64_t dil) {
  for (int64_t k = 0; k < taps; ++k) {
    const float wk = w[k];
    const float* xs = x + base + k * dil;
    for (int64_t j = j0; j < j1; ++j) y[j] += wk * xs[j];
  }
}

// The 3x3 stride-1 case with all three input rows inside the input: nine taps, one store.
inline void dc_3x3(float* __restrict y, const float* __restrict x0, const float* __restrict x1,
                   const float* __restrict x2, const float* __restrict w, int64_t j0, int64_t j1,
                   int64_t base, int64_t d) {
  const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6],
              w7 = w[7], w8 = w[8];
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t c = base + j;
    float acc = y[j];
    acc += w0 * x0[c] + w1 * x0[c + d] + w2 * x0[c + 2 * d];
    acc += w3 * x1[c] + w4 * x1[c + d] + w5 * x1[c + 2 * d];
    acc += w6 * x2[c] + w7 * x2[c + d] + w8 * x2[c + 2 * d];
    y[j] = acc;
  }
}

// Every row of a plane as its even columns followed by its odd columns, so that a stride-2
// convolution reads each tap contiguously.
void dc_deinterleave_rows(const float* x, int64_t rows, int64_t width, float* out) {
  const int64_t even = (width + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * width;
    float* e = out + r * width;
    for (int64_t i = 0; i < even; ++i) e[i] = src[2 * i];
    for (int64_t i = 0; i < width / 2; ++i) e[even + i] = src[2 * i + 1];
  }
}

// dc_taps for stride 2 on a deinterleaved row: column base + k * dil + 2j is entry
// floor(t / 2) + j of the even half (t even) or of the odd half (t odd).
template <int K>
inline void dc_taps_split(float* __restrict y, const float* __restrict row,
                          const float* __restrict w, int64_t j0, int64_t j1, int64_t base,
                          int64_t dil, int64_t even) {
  int64_t off[K];
  for (int k = 0; k < K; ++k) {
    const int64_t t = base + k * dil;
    const int64_t half = t >= 0 ? t / 2 : -((1 - t) / 2);
    off[k] = half + (t - 2 * half == 0 ? 0 : even);
  }
  for (int64_t j = j0; j < j1; ++j) {
    float acc = y[j];
    for (int k = 0; k < K; ++k) acc += w[k] * row[off[k] + j];
    y[j] = acc;
  }
}

// One output plane: y += w (*) x. Along the innermost dimension the outputs whose taps are
// all inside the input take the fused loops; the few border outputs add their valid taps
// one by one. `split` is x deinterleaved (dc_deinterleave_rows) for stride-2 rows of 3, 5 or
// 7 taps, else null.
void dc_plane(const float* x, const float* split, const float* w, const ConvGeometry& g, float* y) {
  const int64_t kw_n = g.k[2], s = g.stride[2], ow_n = g.out[2];
  int64_t lo_buf[kConvMaxTaps], hi_buf[kConvMaxTaps];
  if (kw_n > kConvMaxTaps) return;  // callers keep longer kernels on the GEMM path
  int64_t* lo = lo_buf;
  int64_t* hi = hi_buf;
  int64_t j0 = 0, j1 = ow_n;
  for (int64_t kw = 0; kw < kw_n; ++kw) {
    const int64_t base = kw * g.dil[2] - g.pad[2];
    lo[kw] = dc_min(dc_first_at_least(base, s, 0), ow_n);
    const int64_t h = dc_first_at_least(base, s, g.in[2]);
    hi[kw] = h < lo[kw] ? lo[kw] : (h > ow_n ? ow_n : h);
    j0 = dc_max(j0, lo[kw]);
    j1 = dc_min(j1, hi[kw]);
  }
  if (j1 < j0) j1 = j0;
  for (int64_t od = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      float* yrow = y + (od * g.out[1] + oh) * ow_n;
      const int64_t id0 = od * g.stride[0] - g.pad[0], ih0 = oh * g.stride[1] - g.pad[1];
      const bool fuse9 = s == 1 && g.k[0] == 1 && g.k[1] == 3 && kw_n == 3 && id0 >= 0 &&
                         id0 < g.in[0] && ih0 >= 0 && ih0 + 2 * g.dil[1] < g.in[1];
      if (fuse9) {
        const int64_t rs = g.dil[1] * g.in[2];
        const float* r0 = x + (id0 * g.in[1] + ih0) * g.in[2];
        dc_3x3(yrow, r0, r0 + rs, r0 + 2 * rs, w, j0, j1, -g.pad[2], g.dil[2]);
      }
      for (int64_t kd = 0; kd < g.k[0]; ++kd) {
        const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
        if (id < 0 || id >= g.in[0]) continue;
        for (int64_t kh = 0; kh < g.k[1]; ++kh) {
          const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
          if (ih < 0 || ih >= g.in[1]) continue;
          const float* xrow = x + (id * g.in[1] + ih) * g.in[2];
          const float* wk = w + (kd * g.k[1] + kh) * kw_n;
          const int64_t base = -g.pad[2];
          const int64_t even = (g.in[2] + 1) / 2;
          const float* srow = split ? split + (xrow - x) : nullptr;
          if (fuse9) {
            // The interior is done; only the border outputs remain.
          } else if (srow && kw_n == 3) {
            dc_taps_split<3>(yrow, srow, wk, j0, j1, base, g.dil[2], even);
          } else if (srow && kw_n == 5) {
            dc_taps_split<5>(yrow, srow, wk, j0, j1, base, g.dil[2], even);
          } else if (srow && kw_n == 7) {
            dc_taps_split<7>(yrow, srow, wk, j0, j1, base, g.dil[2], even);
          } else if (kw_n == 1) {
            dc_taps<1>(yrow, xrow, wk, kw_n, j0, j1, base, g.dil[2], s);
          } else if (kw_n == 3) {
            dc_taps<3>(yrow, xrow, wk, kw_n, j0, j1, base, g.dil[2], s);
          } else if (kw_n == 5) {
            dc_taps<5>(yrow, xrow, wk, kw_n, j0, j1, base, g.dil[2], s);
          } else if (s == 1 && kw_n > 16) {
            dc_long_taps(yrow, xrow, wk, kw_n, j0, j1, base, g.dil[2]);
          } else {
            dc_taps<0>(yrow, xrow, wk, kw_n, j0, j1, base, g.dil[2], s);
          }
          for (int64_t kw = 0; kw < kw_n; ++kw) {
            const int64_t b = kw * g.dil[2] - g.pad[2];
            const float wv = wk[kw];
            const int64_t left_end = dc_min(hi[kw], j0), right_start = dc_max(lo[kw], j1);
            for (int64_t j = lo[kw]; j < left_end; ++j) yrow[j] += wv * xrow[b + j * s];
            for (int64_t j = right_start; j < hi[kw]; ++j) yrow[j] += wv * xrow[b + j * s];
          }
        }
      }
    }
  }
}

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
        // Input column of the run's position j: base + j * s; inside for j in [lo, hi).
        const int64_t base = run.iw0 + kw * g.dil[2];
        const float* src = xc + (id * g.in[1] + ih) * g.in[2];
        int64_t lo, hi;
        if (s == 1) {
          lo = base < 0 ? dc_min(-base, run.len) : 0;
          hi = dc_max(lo, dc_min(run.len, g.in[2] - base));
        } else {
          lo = dc_min(dc_first_at_least(base, s, 0), run.len);
          const int64_t h = dc_first_at_least(base, s, g.in[2]);
          hi = h < lo ? lo : (h > run.len ? run.len : h);
        }
        for (int64_t j = 0; j < lo; ++j) dst[j] = 0.0f;
        if (s == 1) {
          const float* sp = src + base;
          for (int64_t j = lo; j < hi; ++j) dst[j] = sp[j];
        } else {
          for (int64_t j = lo; j < hi; ++j) dst[j] = src[base + j * s];
        }
        for (int64_t j = hi; j < run.len; ++j) dst[j] = 0.0f;
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

constexpr ConvKernels kConvKernels{
    .plane = dc_plane, .deinterleave_rows = dc_deinterleave_rows, .im2col_panels = im2col_panels};
