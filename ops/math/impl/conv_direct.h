// Direct convolution of one input plane into one output plane, y += w (*) x, for the
// convolutions where a GEMM is the wrong shape: depthwise ones (one input channel per group)
// and ones with very few output channels (a product with one or two rows would spend its
// time lowering patches); the padded planes it reads, and depthwise convolution a channel per
// vector lane. Plain loops along the innermost output dimension, which the compiler vectorises
// at this level's width. Included by impl/conv.h (inside each ops/math/isa_*.cpp's
// namespace); includes nothing.

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

// dst[j] = the input row `src` at column base + j * s for j < n, `fill` where that column is
// outside [0, width) (src may be null when the whole row is outside).
inline void dc_copy_row(const float* src, int64_t width, int64_t base, int64_t s, int64_t n,
                        float* dst, float fill = 0.0f) {
  int64_t lo = n, hi = n;
  if (src && s == 1) {  // no division on the common path
    lo = dc_min(dc_max(-base, 0), n);
    hi = dc_max(lo, dc_min(n, width - base));
  } else if (src) {
    lo = dc_min(dc_first_at_least(base, s, 0), n);
    const int64_t h = dc_first_at_least(base, s, width);
    hi = h < lo ? lo : (h > n ? n : h);
  }
  for (int64_t i = 0; i < lo; ++i) dst[i] = fill;
  if (hi > lo) {
    // A constant stride lets the compiler vectorise the gather (two loads and a permute per
    // vector for stride 2); a runtime stride leaves it one float at a time.
    const float* from = src + base;
    if (s == 1) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = from[i];
    } else if (s == 2) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = from[2 * i];
    } else {
      for (int64_t i = lo; i < hi; ++i) dst[i] = from[i * s];
    }
  }
  for (int64_t i = hi; i < n; ++i) dst[i] = fill;
}

// Direct convolution works on a padded copy of one input plane: zeros around it, so no tap
// needs a bounds check, and each row split into `stride` phases (column c at phase c % s,
// index c / s), so the inputs of consecutive output columns are consecutive in memory for
// every tap and stride. Then each vector of outputs sums all its taps in a register.
void dc_pad_plane(const float* x, const ConvGeometry& g, float fill, float* out) {
  int64_t rows[3], len[3];
  conv_padded_extent(g, rows, len);
  const int64_t s = g.stride[2], phase = len[2];
  float* o = out;
  for (int64_t dp = 0; dp < rows[0]; ++dp) {
    const int64_t id = dp - g.pad[0];
    for (int64_t hp = 0; hp < rows[1]; ++hp, o += s * phase) {
      const int64_t ih = hp - g.pad[1];
      const bool inside = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1];
      const float* src = inside ? x + (id * g.in[1] + ih) * g.in[2] : nullptr;
      // Phase ph holds padded columns ph, ph + s, ...: entry i is input column
      // i * s + ph - pad.
      for (int64_t ph = 0; ph < s; ++ph) {
        dc_copy_row(src, g.in[2], ph - g.pad[2], s, phase, o + ph * phase, fill);
      }
    }
  }
}

// Rows [oh, oh + R) of one output depth slice: each vector of R rows' outputs sums all taps
// in R independent accumulators (one chain of dependent FMAs per row would wait on latency).
template <int R>
inline void dc_rows(const float* base, int64_t row_step, const VF* wv, const int64_t* off,
                    int64_t n_taps, int64_t width, float* yr) {
  int64_t j = 0;
  for (; j + kLanes <= width; j += kLanes) {
    VF acc[R];
    for (int r = 0; r < R; ++r) acc[r] = vload(yr + r * width + j);
    for (int64_t t = 0; t < n_taps; ++t) {
      const float* src = base + off[t] + j;
      for (int r = 0; r < R; ++r) acc[r] = vfmadd(wv[t], vload(src + r * row_step), acc[r]);
    }
    for (int r = 0; r < R; ++r) vstore(yr + r * width + j, acc[r]);
  }
  if (j < width) {
    const int n = static_cast<int>(width - j);
    VF acc[R];
    for (int r = 0; r < R; ++r) acc[r] = vload_partial(yr + r * width + j, n);
    for (int64_t t = 0; t < n_taps; ++t) {
      const float* src = base + off[t] + j;
      for (int r = 0; r < R; ++r) {
        acc[r] = vfmadd(wv[t], vload_partial(src + r * row_step, n), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) vstore_partial(yr + r * width + j, acc[r], n);
  }
}

// y += w (*) x over one output plane, from dc_pad_plane's copy of x; `off` holds each tap's
// offset in the copy (conv_tap_offsets).
void dc_padded_plane(const float* xp, const float* w, const int64_t* off, const ConvGeometry& g,
                     float* y) {
  int64_t rows[3], len[3];
  conv_padded_extent(g, rows, len);
  const int64_t row = g.stride[2] * len[2], row_step = g.stride[1] * row;
  const int64_t taps = g.k[0] * g.k[1] * g.k[2];
  constexpr int64_t kChunk = 32;
  constexpr int kRows = 4;
  VF wv[kChunk];
  for (int64_t t0 = 0; t0 < taps; t0 += kChunk) {
    const int64_t n_taps = dc_min(kChunk, taps - t0);
    for (int64_t t = 0; t < n_taps; ++t) wv[t] = vset1(w[t0 + t]);
    const int64_t* o = off + t0;
    for (int64_t od = 0; od < g.out[0]; ++od) {
      const float* slice = xp + od * g.stride[0] * rows[1] * row;
      float* ys = y + od * g.out[1] * g.out[2];
      int64_t oh = 0;
      for (; oh + kRows <= g.out[1]; oh += kRows) {
        dc_rows<kRows>(slice + oh * row_step, row_step, wv, o, n_taps, g.out[2],
                       ys + oh * g.out[2]);
      }
      for (; oh < g.out[1]; ++oh) {
        dc_rows<1>(slice + oh * row_step, row_step, wv, o, n_taps, g.out[2], ys + oh * g.out[2]);
      }
    }
  }
}

// The unpadded direct kernels (ConvKernels::direct_plane, direct_pool_plane) keep one
// column loader per filter column for each vector of output columns.
constexpr int64_t kDirectMaxWidth = ConvKernels::direct_max_width;

// The inputs of one filter column for a vector of output columns at column stride S (1 or
// 2): lane l reads the input row at column shift + S * l, zero outside [0, width). Lanes
// whose column is outside the input are masked off the loads, so nothing outside the row is
// read and no padded copy is needed; stride 2 loads 2 * kLanes columns and keeps the even
// ones.
template <int S>
struct DcColumn {
  // No initialisers: the kernels keep an array of these per vector of outputs and set()
  // only the ones they use.
  int64_t shift;
  bool full;  // every column the vector reads is inside the input: plain loads
  VM lanes;   // output lanes whose column is inside the input
  VM m0, m1;  // the columns read, in the first and second kLanes of the row

  void set(int64_t c0, int64_t width) {
    shift = c0;
    // Lanes [lo, hi) are inside: c0 + S * l in [0, width).
    const int64_t lo = dc_min(dc_first_at_least(c0, S, 0), kLanes);
    const int64_t hi = dc_max(lo, dc_min(dc_first_at_least(c0, S, width), kLanes));
    full = lo == 0 && c0 + S * kLanes <= width;
    lanes = vlanes_between(static_cast<int>(lo), static_cast<int>(hi));
    // Elements [S * lo, S * (hi - 1) + 1) of the row from c0.
    const int64_t e0 = S * lo, e1 = hi > lo ? S * (hi - 1) + 1 : e0;
    m0 = vlanes_between(static_cast<int>(dc_min(e0, kLanes)), static_cast<int>(dc_min(e1, kLanes)));
    m1 = m0;
    if (S == 2) {
      m1 = vlanes_between(static_cast<int>(dc_min(dc_max(e0 - kLanes, 0), kLanes)),
                          static_cast<int>(dc_min(dc_max(e1 - kLanes, 0), kLanes)));
    }
  }
  VF load_full(const float* row) const {
    const float* p = row + shift;
    return S == 1 ? vload(p) : vpack_even(vload(p), vload(p + kLanes));
  }
  VF load_masked(const float* row) const {
    const float* p = row + shift;
    return S == 1 ? vload_masked(p, m0)
                  : vpack_even(vload_masked(p, m0), vload_masked(p + kLanes, m1));
  }
};

// What the unpadded direct kernels compute over their taps.
enum class DcMode { Conv, Max, Sum };

// Sums scaled when stored (average pooling's divisors): output (row, column) times
// row[row] * col[column]; none when row is null.
struct DcScale {
  const float* row = nullptr;
  const float* col = nullptr;
};

// One tap of an unpadded direct kernel: the weight times v added, the larger (v > acc is
// false for a NaN v, so NaN inputs are skipped), or the sum.
template <DcMode Mode>
inline VF dc_step(VF wv, VF v, VF acc) {
  if (Mode == DcMode::Conv) return vfmadd(wv, v, acc);
  if (Mode == DcMode::Sum) return vadd(acc, v);
  return vselect(vgt(v, acc), v, acc);
}

// Output rows [0, R) (row r at yr + r * out[2]) of an unpadded direct kernel, vector by
// vector: acc = init, then for each of the n filter rows (row_tap[i]; its input row for
// output row r at x + row_off[i] + r * row_step, inside the input where bit r of
// row_valid[i] is set, else skipped) every filter column's inputs (DcColumn): Conv adds the
// tap's weight times them (init: bias, plus y when `accumulate`; max(acc, 0) after for
// `relu`), Max keeps the larger (skipping NaN inputs, from -inf, as dc_pool_rows does), Sum
// adds them (from 0). R rows keep R independent chains in flight.
template <int R, int S, DcMode Mode>
void dc_direct_rows(const float* x, const int64_t* row_off, const int64_t* row_tap,
                    const int* row_valid, int64_t n, int64_t row_step, const float* w,
                    const ConvGeometry& g, float bias, bool accumulate, bool relu,
                    const DcScale& scale, float* yr) {
  const int64_t kw_n = g.k[2], out_w = g.out[2];
  const VF init = Mode == DcMode::Max ? vset1(-__builtin_inff()) : vset1(bias);
  constexpr int kAll = (1 << R) - 1;
  for (int64_t j = 0; j < out_w; j += kLanes) {
    const int lanes = static_cast<int>(dc_min(kLanes, out_w - j));
    DcColumn<S> col[kDirectMaxWidth];
    for (int64_t kw = 0; kw < kw_n; ++kw) col[kw].set(j * S + kw * g.dil[2] - g.pad[2], g.in[2]);
    VF acc[R];
    for (int r = 0; r < R; ++r) {
      float* yv = yr + r * out_w + j;
      if (!accumulate) {
        acc[r] = init;
        continue;
      }
      const VF prev = lanes == kLanes ? vload(yv) : vload_partial(yv, lanes);
      acc[r] = Mode == DcMode::Max ? prev : vadd(prev, init);
    }
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x + row_off[i];
      const float* wr = Mode == DcMode::Conv ? w + row_tap[i] * kw_n : nullptr;
      const int valid = row_valid[i];
      for (int64_t kw = 0; kw < kw_n; ++kw) {
        const DcColumn<S>& c = col[kw];
        const VF wv = Mode == DcMode::Conv ? vset1(wr[kw]) : init;
        if (valid == kAll && c.full) {  // the interior: plain loads, no lane to fill
          for (int r = 0; r < R; ++r)
            acc[r] = dc_step<Mode>(wv, c.load_full(row + r * row_step), acc[r]);
          continue;
        }
        if (valid == kAll) {  // every row inside, the columns at a border
          for (int r = 0; r < R; ++r) {
            VF v = c.load_masked(row + r * row_step);
            if (Mode == DcMode::Max) v = vselect(c.lanes, v, init);
            acc[r] = dc_step<Mode>(wv, v, acc[r]);
          }
          continue;
        }
        for (int r = 0; r < R; ++r) {
          if (!((valid >> r) & 1)) continue;
          VF v = c.load_masked(row + r * row_step);
          if (Mode == DcMode::Max) v = vselect(c.lanes, v, init);
          acc[r] = dc_step<Mode>(wv, v, acc[r]);
        }
      }
    }
    if (Mode == DcMode::Sum && scale.row) {
      const VF cs = lanes == kLanes ? vload(scale.col + j) : vload_partial(scale.col + j, lanes);
      for (int r = 0; r < R; ++r) acc[r] = vmul(acc[r], vmul(vset1(scale.row[r]), cs));
    }
    for (int r = 0; r < R; ++r) {
      if (Mode == DcMode::Conv && relu) acc[r] = vmax(acc[r], vzero());
      if (lanes == kLanes) {
        vstore(yr + r * out_w + j, acc[r]);
      } else {
        vstore_partial(yr + r * out_w + j, acc[r], lanes);
      }
    }
  }
}

// Rows [oh, oh + R) of one output depth slice (od) of an unpadded direct kernel: the filter
// rows with some of the R input rows inside the input, kMaxTaps at a time (the first pass
// starts from init, later ones continue from y, the last applies the Relu).
template <int R, int S, DcMode Mode>
void dc_direct_block(const float* x, const float* w, const ConvGeometry& g, int64_t od, int64_t oh,
                     float bias, bool accumulate, bool relu, const DcScale& scale, float* yr) {
  constexpr int64_t kMaxTaps = 64;
  int64_t row_off[kMaxTaps], row_tap[kMaxTaps];
  int row_valid[kMaxTaps];
  const int64_t row_step = g.stride[1] * g.in[2];
  int64_t n = 0;
  bool first = true;
  for (int64_t t = 0; t < g.k[0] * g.k[1]; ++t) {
    const int64_t id = od * g.stride[0] - g.pad[0] + (t / g.k[1]) * g.dil[0];
    if (id < 0 || id >= g.in[0]) continue;
    const int64_t ih = oh * g.stride[1] - g.pad[1] + (t % g.k[1]) * g.dil[1];
    int valid = 0;
    for (int r = 0; r < R; ++r) {
      const int64_t h = ih + r * g.stride[1];
      if (h >= 0 && h < g.in[1]) valid |= 1 << r;
    }
    if (valid == 0) continue;
    row_off[n] = (id * g.in[1] + ih) * g.in[2];
    row_tap[n] = t;
    row_valid[n++] = valid;
    if (n == kMaxTaps) {
      dc_direct_rows<R, S, Mode>(x, row_off, row_tap, row_valid, n, row_step, w, g,
                                 first ? bias : 0.0f, !first || accumulate, false, DcScale{}, yr);
      n = 0;
      first = false;
    }
  }
  // The rows of this block in the scale's row table.
  const DcScale here{scale.row ? scale.row + od * g.out[1] + oh : nullptr, scale.col};
  dc_direct_rows<R, S, Mode>(x, row_off, row_tap, row_valid, n, row_step, w, g, first ? bias : 0.0f,
                             !first || accumulate, relu, here, yr);
}

// One output plane of an unpadded direct kernel, four output rows at a time.
template <int S, DcMode Mode>
void dc_direct_plane_of(const float* x, const float* w, const ConvGeometry& g, float bias,
                        bool accumulate, bool relu, const DcScale& scale, float* y) {
  for (int64_t od = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1];) {
      float* yr = y + (od * g.out[1] + oh) * g.out[2];
      switch (dc_min(4, g.out[1] - oh)) {
        case 4:
          dc_direct_block<4, S, Mode>(x, w, g, od, oh, bias, accumulate, relu, scale, yr);
          oh += 4;
          break;
        case 3:
          dc_direct_block<3, S, Mode>(x, w, g, od, oh, bias, accumulate, relu, scale, yr);
          oh += 3;
          break;
        case 2:
          dc_direct_block<2, S, Mode>(x, w, g, od, oh, bias, accumulate, relu, scale, yr);
          oh += 2;
          break;
        default:
          dc_direct_block<1, S, Mode>(x, w, g, od, oh, bias, accumulate, relu, scale, yr);
          oh += 1;
          break;
      }
    }
  }
}

// y = init + w (*) x over one output plane, read straight from the input plane (no padded
// copy), for column stride 1 or 2 and filters at most kDirectMaxWidth wide: init is y plus
// `bias` when `accumulate`, else `bias`; max(y, 0) after when `relu`. The taps sum in
// filter order from init, as dc_padded_plane's do (which adds w * 0 for a tap outside the
// input where this skips it).
void dc_direct_plane(const float* x, const float* w, const ConvGeometry& g, float bias,
                     bool accumulate, bool relu, float* y) {
  if (g.stride[2] == 1) {
    dc_direct_plane_of<1, DcMode::Conv>(x, w, g, bias, accumulate, relu, DcScale{}, y);
  } else {
    dc_direct_plane_of<2, DcMode::Conv>(x, w, g, bias, accumulate, relu, DcScale{}, y);
  }
}

// Depthwise convolution of `lanes` (at most kLanes) consecutive channels at once, one channel
// per vector lane: their planes (ip floats apart) are laid out position-major in a
// zero-padded tile, every output position sums its taps as whole vectors in filter order from
// the bias, and the results go back to y's planes (op floats apart), added to y's values
// when `accumulate`, then max(., 0) when `relu`. 2-D geometry (g.in[0] = g.k[0] = 1); `tile`
// holds depthwise_lanes_floats(g) floats.
void dc_depthwise_lanes(const float* x, int64_t ip, const float* w, const float* bias, int lanes,
                        const ConvGeometry& g, bool accumulate, bool relu, float* tile, float* y,
                        int64_t op) {
  const int64_t in_h = g.in[1], in_w = g.in[2], out_h = g.out[1], out_w = g.out[2];
  const int64_t kh_n = g.k[1], kw_n = g.k[2], kp = kh_n * kw_n;
  int64_t hp = 0, wp = 0;
  depthwise_lanes_extent(g, hp, wp);
  float* xt = tile;
  float* wt = xt + hp * wp * kLanes;
  float* yt = wt + kp * kLanes;
  for (int64_t i = 0; i < hp * wp; ++i) vstore(xt + i * kLanes, vzero());
  for (int c = 0; c < lanes; ++c) {
    const float* xc = x + c * ip;
    for (int64_t h = 0; h < in_h; ++h) {
      float* row = xt + ((h + g.pad[1]) * wp + g.pad[2]) * kLanes + c;
      const float* src = xc + h * in_w;
      for (int64_t j = 0; j < in_w; ++j) row[j * kLanes] = src[j];
    }
  }
  for (int64_t t = 0; t < kp; ++t) {
    for (int c = 0; c < kLanes; ++c) wt[t * kLanes + c] = c < lanes ? w[c * kp + t] : 0.0f;
  }
  const VF b = bias ? vload_partial(bias, lanes) : vzero();
  const int64_t row_step = g.stride[1] * wp * kLanes, col_step = g.stride[2] * kLanes;
  const int64_t tap_row = g.dil[1] * wp * kLanes, tap_col = g.dil[2] * kLanes;
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const float* xr = xt + oh * row_step;
    float* yr = yt + oh * out_w * kLanes;
    for (int64_t ow = 0; ow < out_w; ++ow) {
      const float* xo = xr + ow * col_step;
      VF acc = b;
      for (int64_t kh = 0; kh < kh_n; ++kh) {
        const float* xk = xo + kh * tap_row;
        const float* wk = wt + kh * kw_n * kLanes;
        for (int64_t kw = 0; kw < kw_n; ++kw)
          acc = vfmadd(vload(wk + kw * kLanes), vload(xk + kw * tap_col), acc);
      }
      if (relu && !accumulate) acc = vmax(acc, vzero());
      vstore(yr + ow * kLanes, acc);
    }
  }
  const int64_t positions = out_h * out_w;
  for (int c = 0; c < lanes; ++c) {
    float* yc = y + c * op;
    const float* src = yt + c;
    if (!accumulate) {
      for (int64_t i = 0; i < positions; ++i) yc[i] = src[i * kLanes];
      continue;
    }
    for (int64_t i = 0; i < positions; ++i) {
      const float v = yc[i] + src[i * kLanes];
      yc[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
  }
}
