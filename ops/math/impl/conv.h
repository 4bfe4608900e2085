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

// The taps of a pooling window's row at column stride 2 (tap kw reads input column
// 2 * ow + kw * dil - pad), grouped by the pair of input vectors they read: group i's pair
// starts at column 2 * (ow + shift[i]), and its taps read the pair's even columns, its odd
// ones or both.
struct DcPoolPairs {
  static constexpr int kMax = ConvKernels::direct_max_width;
  int n = 0;
  int64_t shift[kMax] = {};
  bool even[kMax] = {}, odd[kMax] = {};
};

// The groups of g's window row, or false when there are more than DcPoolPairs::kMax.
inline bool dc_pool_pairs(const ConvGeometry& g, DcPoolPairs& p) {
  p.n = 0;
  for (int64_t kw = 0; kw < g.k[2]; ++kw) {
    const int64_t c = kw * g.dil[2] - g.pad[2];
    const int64_t q = c >= 0 ? c / 2 : -((1 - c) / 2);  // floor(c / 2)
    int i = 0;
    while (i < p.n && p.shift[i] != q) ++i;
    if (i == p.n) {
      if (p.n == DcPoolPairs::kMax) return false;
      p.shift[p.n] = q, p.even[p.n] = false, p.odd[p.n] = false;
      ++p.n;
    }
    (c - 2 * q == 0 ? p.even : p.odd)[i] = true;
  }
  return true;
}

// 2 * kLanes input columns from c0, masked where they fall outside [0, width).
struct DcPairLoad {
  int64_t c0;
  bool full;  // all inside: plain loads
  VM m0, m1;  // the columns inside, in the first and second kLanes

  void set(int64_t c, int64_t width) {
    c0 = c;
    const int64_t e0 = dc_min(dc_max(-c, 0), 2 * kLanes);
    const int64_t e1 = dc_max(e0, dc_min(width - c, 2 * kLanes));
    full = e0 == 0 && e1 == 2 * kLanes;
    m0 = vlanes_between(static_cast<int>(dc_min(e0, kLanes)), static_cast<int>(dc_min(e1, kLanes)));
    m1 = vlanes_between(static_cast<int>(dc_max(e0 - kLanes, 0)),
                        static_cast<int>(dc_max(e1 - kLanes, 0)));
  }
};

// The loads of one vector of outputs in a row pass of dc_pool_planes_of: at column stride 1
// one per tap (lane l reads column shift + l; m0 the lanes inside the input), at stride 2 one
// per pair group (DcPairLoad: 2 * kLanes columns from shift, m0 and m1 the halves' lanes
// inside).
struct DcRowLoad {
  int64_t shift;
  bool full;
  VM m0, m1;
};

// The loads of the vector of outputs from column j: at stride 1 tap i's, at stride 2 pair
// group i's; whether all of them are full.
template <int S>
inline bool dc_row_loads(const ConvGeometry& g, const DcPoolPairs& pairs, int n, int64_t j,
                         DcRowLoad* ld) {
  bool full = true;
  for (int i = 0; i < n; ++i) {
    DcRowLoad& l = ld[i];
    if (S == 1) {
      l.shift = j + i * g.dil[2] - g.pad[2];
      const int64_t lo = dc_min(dc_max(-l.shift, 0), kLanes);
      const int64_t hi = dc_max(lo, dc_min(g.in[2] - l.shift, kLanes));
      l.full = lo == 0 && hi == kLanes;
      l.m0 = l.m1 = vlanes_between(static_cast<int>(lo), static_cast<int>(hi));
    } else {
      DcPairLoad pl;
      pl.set(2 * (j + pairs.shift[i]), g.in[2]);
      l.shift = pl.c0, l.full = pl.full, l.m0 = pl.m0, l.m1 = pl.m1;
    }
    full = full && l.full;
  }
  return full;
}

// The loads of one vector of outputs with the phases their pairs give (stride 2), copied out
// of the tables for a run of rows: with N known the copies live in registers. Rows
// [safe0, safe1) of the plane have all the vector's loads inside the plane's memory, though
// not inside their row: there whole vectors are loaded and the lanes outside the row
// replaced (masked loads are a loop of scalar loads at the generic level).
template <int N>
struct DcRowLoads {
  static constexpr int kCap = N > 0 ? N : kDirectMaxWidth;
  DcRowLoad ld[kCap] = {};
  bool even[kCap] = {}, odd[kCap] = {};
  int n = 0;
  int64_t safe0 = 0, safe1 = 0;

  DcRowLoads() = default;
  // `S` the column stride, the plane in_h rows of `width` floats.
  DcRowLoads(const DcRowLoad* from, int count, const DcPoolPairs& pairs, int S, int64_t width,
             int64_t in_h) {
    n = N > 0 ? N : count;
    safe0 = 0, safe1 = in_h;
    for (int i = 0; i < n; ++i) {
      ld[i] = from[i];
      even[i] = pairs.even[i];
      odd[i] = pairs.odd[i];
      // Rows ih with 0 <= ih * width + shift and ih * width + shift + S * kLanes <= in_h * width.
      const int64_t lo = ld[i].shift, hi = ld[i].shift + S * kLanes;
      if (lo < 0) safe0 = dc_max(safe0, (-lo + width - 1) / width);
      if (hi > width) safe1 = dc_min(safe1, in_h - (hi - width + width - 1) / width);
    }
    safe1 = dc_max(safe0, safe1);
  }
};

// How dc_row_vector reads a row: every load inside the row (Full), masked loads (Masked), or
// whole vectors inside the plane with the lanes outside the row replaced (Select).
enum class DcRead { Full, Masked, Select };

// One input row's reduction across a vector of outputs' window rows: N loads (0: l.n, known
// at run time). Max skips NaN inputs (vmax(a, h) is a > h ? a : h, as dc_step) and counts
// columns outside the input as -inf.
template <int S, int N, DcRead R, DcMode Mode>
inline VF dc_row_vector(const float* row, const DcRowLoads<N>& l) {
  constexpr bool kMax = Mode == DcMode::Max;
  const VF low = vset1(-__builtin_inff());
  // What a column outside the row counts as: after a masked load a sum's lanes are zero.
  const VF fill = kMax ? low : vzero();
  const int count = N > 0 ? N : l.n;
  VF h = fill;
  for (int i = 0; i < count; ++i) {
    const DcRowLoad& c = l.ld[i];
    VF a = R == DcRead::Masked ? vload_masked(row + c.shift, c.m0) : vload(row + c.shift);
    if (R == DcRead::Select || (kMax && R == DcRead::Masked)) a = vselect(c.m0, a, fill);
    if (S == 1) {
      h = kMax ? vmax(a, h) : (i == 0 ? a : vadd(h, a));
      continue;
    }
    const float* p = row + c.shift + kLanes;
    VF b = R == DcRead::Masked ? vload_masked(p, c.m1) : vload(p);
    if (R == DcRead::Select || (kMax && R == DcRead::Masked)) b = vselect(c.m1, b, fill);
    if (l.even[i]) h = kMax ? vmax(vpack_even(a, b), h) : vadd(h, vpack_even(a, b));
    if (l.odd[i]) h = kMax ? vmax(vpack_odd(a, b), h) : vadd(h, vpack_odd(a, b));
  }
  return h;
}

// Whether rows whose loads reach outside the row take whole vectors and a select where they
// stay inside the plane: at the generic level, whose masked loads are scalar loops.
constexpr bool kSelectRows = kLanes == 4;

// Row ih by dc_row_vector, reading as `full` and the loads' safe rows allow.
template <int S, int N, DcMode Mode>
inline VF dc_row_vector_at(const float* row, int64_t ih, const DcRowLoads<N>& l, bool full) {
  if (full) return dc_row_vector<S, N, DcRead::Full, Mode>(row, l);
  if (kSelectRows && ih >= l.safe0 && ih < l.safe1) {
    return dc_row_vector<S, N, DcRead::Select, Mode>(row, l);
  }
  return dc_row_vector<S, N, DcRead::Masked, Mode>(row, l);
}

// How far ahead of the rows being read the row passes prefetch the input, in floats: a plane
// its producer wrote some time before is mostly out of the caches, and the hardware's stream
// prefetch alone kept too few lines in flight to read it at the memory's bandwidth.
inline int64_t dc_prefetch_distance(int64_t width) {
  constexpr int64_t kRows = 16, kMinFloats = 1024;  // 16 rows, and at least 4 KiB
  return dc_max(kRows * width, kMinFloats);
}

// Inputs of fewer floats (1 MiB, a core's L2 on recent processors) are not prefetched: a
// producer that wrote them left most of them in the caches, and the prefetches would cost
// more than they save.
constexpr int64_t kPrefetchMinFloats = int64_t{1} << 18;

// A prefetch of each cache line of the `width` floats at p.
inline void dc_prefetch_row(const float* p, int64_t width) {
  for (int64_t c = 0; c < width; c += 16) __builtin_prefetch(p + c);
}

// Input rows [r0, r1) of plane x reduced across one vector of outputs' window rows into h (a
// row every `pitch` floats); first, when `prefetch` is given, the same rows of it prefetched.
template <int S, int N, DcMode Mode>
inline void dc_row_pass(const float* x, int64_t width, int64_t r0, int64_t r1,
                        const DcRowLoads<N>& loads, bool full, float* h, int64_t pitch,
                        const float* prefetch) {
  // A copy: a vector store may alias the caller's table (the vector types may alias
  // anything), and the loads' shifts and masks would be read again after every row.
  const DcRowLoads<N> l = loads;
  const float* row = x + r0 * width;
  if (prefetch) {
    for (int64_t ih = r0; ih < r1; ++ih) dc_prefetch_row(prefetch + ih * width, width);
  }
  if (full) {
    for (int64_t ih = r0; ih < r1; ++ih, row += width, h += pitch) {
      vstore(h, dc_row_vector<S, N, DcRead::Full, Mode>(row, l));
    }
    return;
  }
  // Masked loads in the rows at the plane's ends, whole vectors between them (kSelectRows).
  const int64_t a = kSelectRows ? dc_min(dc_max(l.safe0, r0), r1) : r1;
  const int64_t b = kSelectRows ? dc_max(a, dc_min(l.safe1, r1)) : r1;
  for (int64_t ih = r0; ih < r1; ++ih, row += width, h += pitch) {
    if (ih == a) {
      for (; ih < b; ++ih, row += width, h += pitch) {
        vstore(h, dc_row_vector<S, N, DcRead::Select, Mode>(row, l));
      }
      if (ih == r1) break;
    }
    vstore(h, dc_row_vector<S, N, DcRead::Masked, Mode>(row, l));
  }
}

// The reduction of `count` row results `step` floats apart (K > 0: count is K).
template <int K, DcMode Mode>
inline VF dc_col_vector(const float* h, int64_t step, int64_t count) {
  const int64_t n = K > 0 ? K : count;
  if (n == 0) return Mode == DcMode::Max ? vset1(-__builtin_inff()) : vzero();
  VF acc = vload(h);
  for (int64_t i = 1; i < n; ++i) {
    const VF v = vload(h + i * step);
    acc = Mode == DcMode::Max ? vmax(v, acc) : vadd(acc, v);  // no NaN left to skip
  }
  return acc;
}

// One output row yr (out_w floats) from its window's row results: `count` rows from h,
// `step` apart (K > 0: count is K); a sum times rs * cs[ow] when cs is given.
template <int K, DcMode Mode>
inline void dc_col_line(const float* h, int64_t step, int64_t count, int64_t out_w, float rs,
                        const float* cs, float* yr) {
  int64_t j = 0;
  for (; j + kLanes <= out_w; j += kLanes) {
    VF acc = dc_col_vector<K, Mode>(h + j, step, count);
    if (Mode == DcMode::Sum && cs) acc = vmul(acc, vmul(vset1(rs), vload(cs + j)));
    vstore(yr + j, acc);
  }
  if (j < out_w) {
    const int lanes = static_cast<int>(out_w - j);
    VF acc = dc_col_vector<K, Mode>(h + j, step, count);
    if (Mode == DcMode::Sum && cs) acc = vmul(acc, vmul(vset1(rs), vload_partial(cs + j, lanes)));
    vstore_partial(yr + j, acc, lanes);
  }
}

// `n_rows` output rows of one vector of outputs (`lanes` of them; row r at yr + r * out_w):
// row r's window's row results from h + r * row_step, K of them (0: count) `step` apart; a
// sum times rs[r] * cs when rs is given.
template <int K, DcMode Mode>
inline void dc_col_rows(const float* h, int64_t row_step, int64_t step, int64_t count,
                        int64_t n_rows, const float* rs, VF cs, int lanes, float* yr,
                        int64_t out_w) {
  for (int64_t r = 0; r < n_rows; ++r, h += row_step, yr += out_w) {
    VF acc = dc_col_vector<K, Mode>(h, step, count);
    if (Mode == DcMode::Sum && rs) acc = vmul(acc, vmul(vset1(rs[r]), cs));
    if (lanes == kLanes) {
      vstore(yr, acc);
    } else {
      vstore_partial(yr, acc, lanes);
    }
  }
}

// ConvKernels::pool_planes for column stride S and N loads per row vector (0: n, known at run
// time): per plane, bands of output rows whose windows' input rows fit in a stack buffer;
// each input row of a band reduced across every output column's window row once (the row
// pass), then each output row the reduction of its window's rows from the buffer (the column
// pass), scaled and stored. Rows of one or two vectors are swept a vector at a time (each
// vector's masked loads set once for all planes); wider ones are read and written row by row
// in order, one stream each, the vectors between the borders with plain loads. Both prefetch
// the input ahead (dc_prefetch_distance).
template <int S, int N, DcMode Mode>
void dc_pool_planes_of(const float* x, int64_t ip, int64_t planes, const ConvGeometry& g,
                       const DcPoolPairs& pairs, const float* row_scale, const float* col_scale,
                       float* y, int64_t op) {
  const int64_t in_h = g.in[1], width = g.in[2], out_h = g.out[1], out_w = g.out[2];
  const int64_t k1 = g.k[1], s1 = g.stride[1], d1 = g.dil[1], p1 = g.pad[1];
  const int64_t vecs = (out_w + kLanes - 1) / kLanes, pitch = vecs * kLanes;
  const int64_t span = (k1 - 1) * d1 + 1;  // input rows under one output row's window
  constexpr int64_t kBuffer = ConvKernels::pool_rows_floats;
  const int64_t band = (kBuffer / pitch - span) / s1 + 1;  // >= 1: pool_planes_fit
  alignas(64) float rows[kBuffer];
  const int n = static_cast<int>(S == 1 ? g.k[2] : pairs.n);
  // The loads of the vectors at the row's ends that reach outside the input, [0, vf0) and
  // [vf1, vecs), at most kEdge at each end (vector v at edges[v], or at
  // edges[kEdge + vecs - 1 - v] at the right end); vector v between them reads at inner's
  // shifts plus v * kLanes * S. `swept`: more border vectors than that (each band swept a
  // vector at a time instead, its loads set per band).
  constexpr int64_t kEdge = 3;
  DcRowLoad ld[kDirectMaxWidth];
  dc_row_loads<S>(g, pairs, n, 0, ld);
  const DcRowLoads<N> inner(ld, n, pairs, S, width, in_h);
  int64_t vf0 = 0, vf1 = vecs;
  while (vf0 < vecs && !dc_row_loads<S>(g, pairs, n, vf0 * kLanes, ld)) ++vf0;
  while (vf1 > vf0 && !dc_row_loads<S>(g, pairs, n, (vf1 - 1) * kLanes, ld)) --vf1;
  const bool swept = vf0 > kEdge || vecs - vf1 > kEdge;
  DcRowLoads<N> edges[2 * kEdge];
  for (int64_t v = 0; !swept && v < vecs; ++v) {
    if (v >= vf0 && v < vf1) continue;
    dc_row_loads<S>(g, pairs, n, v * kLanes, ld);
    edges[v < vf0 ? v : kEdge + vecs - 1 - v] = DcRowLoads<N>(ld, n, pairs, S, width, in_h);
  }
  const bool narrow = vecs <= 2;
  // Output rows [in0, in1) have all their window's rows inside the input.
  const int64_t last = in_h - span + p1;  // the last such row times s1, at most
  const int64_t in0 = dc_min(dc_first_at_least(-p1, s1, 0), out_h);
  const int64_t in1 = dc_max(in0, dc_min(out_h, last < 0 ? 0 : last / s1 + 1));
  const int64_t step = d1 * pitch, row_step = s1 * pitch;
  const int64_t ahead = dc_prefetch_distance(width);
  const bool prefetch = planes * ip >= kPrefetchMinFloats;
  for (int64_t p = 0; p < planes; ++p) {
    const float* xp = x + p * ip;
    float* yp = y + p * op;
    for (int64_t oh0 = 0; oh0 < out_h; oh0 += band) {
      const int64_t oh1 = dc_min(out_h, oh0 + band);
      // The band's input rows inside the input, [r0, r1); input row ih at buffer row
      // ih - first.
      const int64_t first = oh0 * s1 - p1;
      const int64_t r0 = dc_max(first, 0), r1 = dc_min((oh1 - 1) * s1 - p1 + span, in_h);
      float* hb = rows + (r0 - first) * pitch;
      if (narrow) {  // the first vector's sweep prefetches
        for (int64_t v = 0; v < vecs; ++v) {
          const bool full = v >= vf0 && v < vf1;
          dc_row_pass<S, N, Mode>(xp + (full ? v * kLanes * S : 0), width, r0, r1,
                                  full ? inner : edges[v < vf0 ? v : kEdge + vecs - 1 - v], full,
                                  hb + v * kLanes, pitch,
                                  prefetch && v == 0 ? xp + ahead : nullptr);
        }
      } else if (swept) {
        for (int64_t v = 0; v < vecs; ++v) {
          const bool full = dc_row_loads<S>(g, pairs, n, v * kLanes, ld);
          dc_row_pass<S, N, Mode>(xp, width, r0, r1, DcRowLoads<N>(ld, n, pairs, S, width, in_h),
                                  full, hb + v * kLanes, pitch,
                                  prefetch && v == 0 ? xp + ahead : nullptr);
        }
      } else {
        const float* row = xp + r0 * width;
        for (int64_t ih = r0; ih < r1; ++ih, row += width, hb += pitch) {
          if (prefetch) dc_prefetch_row(row + ahead, width);
          for (int64_t v = 0; v < vf0; ++v) {
            vstore(hb + v * kLanes, dc_row_vector_at<S, N, Mode>(row, ih, edges[v], false));
          }
          for (int64_t v = vf0; v < vf1; ++v) {
            vstore(hb + v * kLanes,
                   dc_row_vector<S, N, DcRead::Full, Mode>(row + v * kLanes * S, inner));
          }
          for (int64_t v = vf1; v < vecs; ++v) {
            vstore(hb + v * kLanes,
                   dc_row_vector_at<S, N, Mode>(row, ih, edges[kEdge + vecs - 1 - v], false));
          }
        }
      }
      if (narrow) {  // a vector at a time, the interior rows in one run
        const int64_t a = dc_min(dc_max(in0, oh0), oh1), b = dc_max(a, dc_min(in1, oh1));
        for (int64_t j = 0; j < out_w; j += kLanes) {
          const int lanes = static_cast<int>(dc_min(kLanes, out_w - j));
          VF cs = vzero();
          if (Mode == DcMode::Sum && col_scale) {
            cs = lanes == kLanes ? vload(col_scale + j) : vload_partial(col_scale + j, lanes);
          }
          if (b > a) {  // output row oh's first window row is input row oh * s1 - p1
            const float* h = rows + j + (a * s1 - p1 - first) * pitch;
            const float* rs = row_scale ? row_scale + a : nullptr;
            float* yr = yp + a * out_w + j;
            switch (k1) {
              case 2:
                dc_col_rows<2, Mode>(h, row_step, step, 2, b - a, rs, cs, lanes, yr, out_w);
                break;
              case 3:
                dc_col_rows<3, Mode>(h, row_step, step, 3, b - a, rs, cs, lanes, yr, out_w);
                break;
              default:
                dc_col_rows<0, Mode>(h, row_step, step, k1, b - a, rs, cs, lanes, yr, out_w);
                break;
            }
          }
          for (int64_t oh = oh0; oh < oh1; ++oh) {  // the border rows
            if (oh == a && b > a) oh = b;
            if (oh >= oh1) break;
            const int64_t h0 = oh * s1 - p1;
            const int64_t lo = dc_min(dc_first_at_least(h0, d1, 0), k1);
            const int64_t hi = dc_max(lo, dc_min(dc_first_at_least(h0, d1, in_h), k1));
            dc_col_rows<0, Mode>(rows + j + (lo < hi ? (h0 + lo * d1 - first) * pitch : 0),
                                 row_step, step, hi - lo, 1, row_scale ? row_scale + oh : nullptr,
                                 cs, lanes, yp + oh * out_w + j, out_w);
          }
        }
        continue;
      }
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        // Output row oh's window starts at input row h0; its rows inside the input are taps
        // [lo, hi).
        const int64_t h0 = oh * s1 - p1;
        int64_t lo = 0, hi = k1;
        if (oh < in0 || oh >= in1) {
          lo = dc_min(dc_first_at_least(h0, d1, 0), k1);
          hi = dc_max(lo, dc_min(dc_first_at_least(h0, d1, in_h), k1));
        }
        const float* h = rows + (lo < hi ? (h0 + lo * d1 - first) * pitch : 0);
        const float rs = row_scale ? row_scale[oh] : 1.0f;
        float* yr = yp + oh * out_w;
        switch (hi - lo) {
          case 2:
            dc_col_line<2, Mode>(h, step, 2, out_w, rs, col_scale, yr);
            break;
          case 3:
            dc_col_line<3, Mode>(h, step, 3, out_w, rs, col_scale, yr);
            break;
          default:
            dc_col_line<0, Mode>(h, step, hi - lo, out_w, rs, col_scale, yr);
            break;
        }
      }
    }
  }
}

// The row pitch of dc_max_pool_3x3s2's buffer: a padded row's columns written (pl, then the
// input's in whole vectors) and read (two vectors from column 2j and two from 2j + 2 for each
// vector of outputs j), in whole vectors.
inline int64_t dc_max_pool_pitch(const ConvGeometry& g) {
  const int64_t vecs = (g.out[2] + kLanes - 1) / kLanes;
  const int64_t written = g.pad[2] + (g.in[2] + kLanes - 1) / kLanes * kLanes;
  const int64_t read = 2 * vecs * kLanes + 2;
  return (dc_max(written, read) + kLanes - 1) / kLanes * kLanes;
}

// Max pooling with 3x3 windows at stride 2 (no dilation, any padding) over 2-D planes whose
// padded rows fit dc_max_pool_3x3s2's buffer, more than one vector of outputs wide (narrower
// rows do as well rows first, a vector swept down the plane): the stem pools of most CNNs.
inline bool dc_max_pool_3x3s2_fits(const ConvGeometry& g) {
  return g.in[0] == 1 && g.out[0] == 1 && g.out[2] > kLanes && g.k[0] == 1 && g.k[1] == 3 &&
         g.k[2] == 3 && g.stride[1] == 2 && g.stride[2] == 2 && g.dil[1] == 1 && g.dil[2] == 1 &&
         dc_max_pool_pitch(g) <= ConvKernels::pool_rows_floats;
}

// That pooling a column of windows first: over a band of output rows, each output row's (up
// to) three input rows are reduced into one padded row of the buffer (a vector max per input
// vector, the NaN-skipping max of dc_step), then each output is the max of three consecutive
// columns there, read as the even and odd lanes of two vectors and the even lanes of the two
// after them. A band's rows are all reduced before any is read back, so the unaligned reads
// find the rows in the cache rather than waiting on the stores that wrote them. An output row
// costs about a fifth fewer operations than pool_planes' rows-first passes, which reduce
// every input row across the windows (twice per output row at stride 2) and then the window
// rows.
void dc_max_pool_3x3s2(const float* x, int64_t ip, int64_t planes, const ConvGeometry& g, float* y,
                       int64_t op) {
  const int64_t in_h = g.in[1], in_w = g.in[2], out_h = g.out[1], out_w = g.out[2];
  const int64_t pt = g.pad[1], pl = g.pad[2];
  const int64_t full = in_w / kLanes * kLanes, tail = in_w - full;
  const int64_t pitch = dc_max_pool_pitch(g);
  const int64_t band = dc_max(int64_t{1}, ConvKernels::pool_rows_floats / pitch);
  const VF low = vset1(-__builtin_inff());
  // Column c of a padded row at row[c] (input column c - pl); the columns outside the input,
  // and those read only for lanes past out_w, are -inf throughout (set once, for the rows a
  // band uses).
  alignas(64) float rows[ConvKernels::pool_rows_floats];
  const int64_t used = dc_min(band, out_h) * pitch;
  for (int64_t c = 0; c < used; c += kLanes) vstore(rows + c, low);
  const VM tail_mask = vlanes_below(static_cast<int>(tail));
  const int64_t ahead = dc_prefetch_distance(in_w);
  const bool prefetch = planes * ip >= kPrefetchMinFloats;
  for (int64_t p = 0; p < planes; ++p) {
    const float* xp = x + p * ip;
    float* yp = y + p * op;
    for (int64_t oh0 = 0; oh0 < out_h; oh0 += band) {
      const int64_t oh1 = dc_min(out_h, oh0 + band);
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        float* r = rows + (oh - oh0) * pitch + pl;
        const int64_t h0 = oh * 2 - pt;
        // The two rows this output row's successor first reads, `ahead` floats on.
        if (prefetch) dc_prefetch_row(xp + (h0 + 3) * in_w + ahead, 2 * in_w);
        const int64_t lo = dc_max(h0, 0), hi = dc_min(h0 + 3, in_h);
        const int64_t n = dc_max(hi - lo, 0);
        const float* a = xp + lo * in_w;
        const float* b = a + (n > 1 ? in_w : 0);
        const float* c = a + (n > 2 ? 2 * in_w : 0);
        if (n == 0) {  // no row inside the input (a ceil_mode window)
          for (int64_t i = 0; i < in_w; i += kLanes) vstore(r + i, low);
          continue;
        }
        int64_t i = 0;
        for (; i < full; i += kLanes) {
          vstore(r + i, vmax(vload(c + i), vmax(vload(b + i), vmax(vload(a + i), low))));
        }
        if (tail) {
          const VF t =
              vmax(vload_masked(c + i, tail_mask),
                   vmax(vload_masked(b + i, tail_mask), vmax(vload_masked(a + i, tail_mask), low)));
          // Lanes past the input stay -inf (the masked loads gave zeros there).
          vstore(r + i, vselect(tail_mask, t, low));
        }
      }
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        const float* row = rows + (oh - oh0) * pitch;
        float* yr = yp + oh * out_w;
        for (int64_t j = 0; j < out_w; j += kLanes) {
          const float* q = row + 2 * j;
          const VF v0 = vload(q), v1 = vload(q + kLanes);
          const VF w0 = vload(q + 2), w1 = vload(q + 2 + kLanes);
          const VF o = vmax(vpack_even(w0, w1), vmax(vpack_odd(v0, v1), vpack_even(v0, v1)));
          if (j + kLanes <= out_w) {
            vstore(yr + j, o);
          } else {
            vstore_partial(yr + j, o, static_cast<int>(out_w - j));
          }
        }
      }
    }
  }
}

// ConvKernels::pool_planes.
void dc_pool_planes(const float* x, int64_t ip, int64_t planes, const ConvGeometry& g, bool max,
                    const float* row_scale, const float* col_scale, float* y, int64_t op) {
  if (max && dc_max_pool_3x3s2_fits(g)) return dc_max_pool_3x3s2(x, ip, planes, g, y, op);
  DcPoolPairs pairs;
  if (g.stride[2] == 2) dc_pool_pairs(g, pairs);
  const float* rs = max ? nullptr : row_scale;
  const float* cs = max || !row_scale ? nullptr : col_scale;
  // The common windows with their loads unrolled: 2 or 3 columns at stride 1, the one or two
  // pairs of vectors of 2 or 3 columns at stride 2.
  const int64_t n = g.stride[2] == 1 ? g.k[2] : pairs.n;
  auto run = [&]<int S, DcMode Mode>() {
    switch (n) {
      case 1:
        dc_pool_planes_of<S, 1, Mode>(x, ip, planes, g, pairs, rs, cs, y, op);
        break;
      case 2:
        dc_pool_planes_of<S, 2, Mode>(x, ip, planes, g, pairs, rs, cs, y, op);
        break;
      case 3:
        dc_pool_planes_of<S, 3, Mode>(x, ip, planes, g, pairs, rs, cs, y, op);
        break;
      default:
        dc_pool_planes_of<S, 0, Mode>(x, ip, planes, g, pairs, rs, cs, y, op);
        break;
    }
  };
  if (g.stride[2] == 1) {
    if (max) {
      run.template operator()<1, DcMode::Max>();
    } else {
      run.template operator()<1, DcMode::Sum>();
    }
  } else if (max) {
    run.template operator()<2, DcMode::Max>();
  } else {
    run.template operator()<2, DcMode::Sum>();
  }
}

// Max or sum pooling of one plane straight from the input plane, over each window's taps
// inside the input, for column stride 1 or 2 and windows at most kDirectMaxWidth wide; each
// sum times row_scale[row] * col_scale[column] when row_scale is given.
void dc_direct_pool_plane(const float* x, const ConvGeometry& g, bool max, const float* row_scale,
                          const float* col_scale, float* y) {
  const DcScale scale{row_scale, col_scale};
  if (g.stride[2] == 1) {
    if (max) {
      dc_direct_plane_of<1, DcMode::Max>(x, nullptr, g, 0.0f, false, false, scale, y);
    } else {
      dc_direct_plane_of<1, DcMode::Sum>(x, nullptr, g, 0.0f, false, false, scale, y);
    }
  } else if (max) {
    dc_direct_plane_of<2, DcMode::Max>(x, nullptr, g, 0.0f, false, false, scale, y);
  } else {
    dc_direct_plane_of<2, DcMode::Sum>(x, nullptr, g, 0.0f, false, false, scale, y);
  }
}

// Positions [i, i + V * kLanes) of a plane's wide form: V vectors of independent
// accumulators, each tap one load per vector (its inputs are contiguous in the layout).
template <int V, DcMode Mode>
inline void dc_wide_block(const float* xp, const float* w, const int64_t* taps, int64_t n_taps,
                          VF init, float* out) {
  VF acc[V];
  for (int v = 0; v < V; ++v) acc[v] = init;
  for (int64_t t = 0; t < n_taps; ++t) {
    const float* src = xp + taps[t];
    const VF wv = Mode == DcMode::Conv ? vset1(w[t]) : init;
    for (int v = 0; v < V; ++v) acc[v] = dc_step<Mode>(wv, vload(src + v * kLanes), acc[v]);
  }
  for (int v = 0; v < V; ++v) vstore(out + v * kLanes, acc[v]);
}

template <DcMode Mode>
void dc_wide_plane_of(const float* xp, const float* w, const int64_t* taps, int64_t n_taps,
                      int64_t n, VF init, float* out) {
  constexpr int64_t kBlock = 4 * kLanes;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    dc_wide_block<4, Mode>(xp + i, w, taps, n_taps, init, out + i);
  }
  // The last vectors, the final one partly past n (the caller's slack).
  switch ((n - i + kLanes - 1) / kLanes) {
    case 4:
      dc_wide_block<4, Mode>(xp + i, w, taps, n_taps, init, out + i);
      break;
    case 3:
      dc_wide_block<3, Mode>(xp + i, w, taps, n_taps, init, out + i);
      break;
    case 2:
      dc_wide_block<2, Mode>(xp + i, w, taps, n_taps, init, out + i);
      break;
    case 1:
      dc_wide_block<1, Mode>(xp + i, w, taps, n_taps, init, out + i);
      break;
    default:
      break;
  }
}

static_assert(kLanes <= ConvKernels::wide_slack, "wide_plane writes whole vectors into the slack");

// One row of n outputs from its wide row, with the epilogue (row_scale: this row's).
inline void dc_wide_store_row(const float* src, int64_t n, const WideEpilogue& e, float row_scale,
                              float* dst) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const int lanes = static_cast<int>(dc_min(kLanes, n - j));
    const bool full = lanes == kLanes;
    VF v = full ? vload(src + j) : vload_partial(src + j, lanes);
    if (e.accumulate) v = vadd(v, full ? vload(dst + j) : vload_partial(dst + j, lanes));
    if (e.row_scale) {
      const VF cs = full ? vload(e.col_scale + j) : vload_partial(e.col_scale + j, lanes);
      v = vmul(v, vmul(vset1(row_scale), cs));
    }
    if (e.relu) v = vmax(v, vzero());
    if (full) {
      vstore(dst + j, v);
    } else {
      vstore_partial(dst + j, v, lanes);
    }
  }
}

// Positions [q0, q1) of out: each the op (Max or Sum, from init) over src[q + off[t]] for
// t < n_off, four vectors at a time; the last vector stored partly, so nothing at or past
// q1 is written (whole vectors are read, up to kLanes - 1 floats past the last position).
// out may be src when every offset is >= 0 (a position reads only at or past itself).
template <DcMode Mode>
void dc_wide_taps(const float* src, const int64_t* off, int64_t n_off, int64_t q0, int64_t q1,
                  VF init, float* out) {
  int64_t q = q0;
  for (; q + 4 * kLanes <= q1; q += 4 * kLanes) {
    VF acc[4] = {init, init, init, init};
    for (int64_t t = 0; t < n_off; ++t) {
      const float* p = src + q + off[t];
      for (int v = 0; v < 4; ++v) acc[v] = dc_step<Mode>(init, vload(p + v * kLanes), acc[v]);
    }
    for (int v = 0; v < 4; ++v) vstore(out + q + v * kLanes, acc[v]);
  }
  for (; q < q1; q += kLanes) {
    VF acc = init;
    for (int64_t t = 0; t < n_off; ++t) acc = dc_step<Mode>(init, vload(src + q + off[t]), acc);
    if (q + kLanes <= q1) {
      vstore(out + q, acc);
    } else {
      vstore_partial(out + q, acc, static_cast<int>(q1 - q));
    }
  }
}

// Max or Sum over a separable window of one phase (stride 1, a 2-D window of k1 rows of k2
// taps: tap (kh, kw) at rows[kh] + cols[kw]): first each row of taps at every position
// the rows need, in place over xp (cols are >= 0, so a position reads only at or past
// itself), then those row results down each window's column into out. 2 (k1 + k2) - 4
// steps per output in chains of k1 or k2 instead of k1 k2 - 1.
template <DcMode Mode>
void dc_wide_separable(float* xp, const int64_t* rows, int64_t k1, const int64_t* cols, int64_t k2,
                       int64_t n, VF init, float* out) {
  dc_wide_taps<Mode>(xp, cols, k2, 0, rows[k1 - 1] + n, init, xp);
  // Whole vectors into out's slack, as dc_wide_plane_of writes them.
  dc_wide_taps<Mode>(xp, rows, k1, 0, (n + kLanes - 1) / kLanes * kLanes, init, out);
}

// Whether the taps of a plane's wide form (stride 1, 2-D) are k1 rows of k2 taps with the
// same column offsets, rows[kh] + cols[kw] (rows[0] = 0): then Max and Sum are separable.
inline bool dc_separable(const int64_t* taps, int64_t n_taps, const ConvGeometry& g, int64_t* rows,
                         int64_t* cols) {
  const int64_t k1 = g.k[1], k2 = g.k[2];
  constexpr int64_t kMax = ConvKernels::wide_separable_max;
  if (g.k[0] != 1 || k1 < 2 || k2 < 2 || k1 > kMax || k2 > kMax || n_taps != k1 * k2 ||
      g.stride[0] != 1 || g.stride[1] != 1 || g.stride[2] != 1 || taps[0] != 0) {
    return false;
  }
  for (int64_t kh = 0; kh < k1; ++kh) rows[kh] = taps[kh * k2];
  for (int64_t kw = 0; kw < k2; ++kw) {
    cols[kw] = taps[kw];
    if (cols[kw] < 0) return false;
  }
  for (int64_t kh = 0; kh < k1; ++kh) {
    for (int64_t kw = 0; kw < k2; ++kw) {
      if (taps[kh * k2 + kw] != rows[kh] + cols[kw]) return false;
    }
  }
  return true;
}

// ConvKernels::wide_plane.
void dc_wide_plane(float* xp, const float* w, const int64_t* taps, int64_t n_taps, WideOp op,
                   float init, const ConvGeometry& g, int64_t len1, int64_t len2,
                   const WideEpilogue& e, float* scratch, float* y) {
  const int64_t n = ((g.out[0] - 1) * len1 + g.out[1] - 1) * len2 + g.out[2];
  int64_t rows[ConvKernels::wide_separable_max], cols[ConvKernels::wide_separable_max];
  const bool separable = op != WideOp::Conv && dc_separable(taps, n_taps, g, rows, cols);
  switch (op) {
    case WideOp::Conv:
      dc_wide_plane_of<DcMode::Conv>(xp, w, taps, n_taps, n, vset1(init), scratch);
      break;
    case WideOp::Max:
      if (separable) {
        dc_wide_separable<DcMode::Max>(xp, rows, g.k[1], cols, g.k[2], n, vset1(-__builtin_inff()),
                                       scratch);
      } else {
        dc_wide_plane_of<DcMode::Max>(xp, w, taps, n_taps, n, vset1(-__builtin_inff()), scratch);
      }
      break;
    case WideOp::Sum:
      if (separable) {
        dc_wide_separable<DcMode::Sum>(xp, rows, g.k[1], cols, g.k[2], n, vzero(), scratch);
      } else {
        dc_wide_plane_of<DcMode::Sum>(xp, w, taps, n_taps, n, vzero(), scratch);
      }
      break;
  }
  for (int64_t od = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      const int64_t r = od * g.out[1] + oh;
      dc_wide_store_row(scratch + (od * len1 + oh) * len2, g.out[2], e,
                        e.row_scale ? e.row_scale[r] : 1.0f, y + r * g.out[2]);
    }
  }
}

// ConvKernels::pad_rows for column stride S: a chunk of column vectors at a time, each
// vector's loader (DcColumn) set once for every row.
template <int S>
void dc_pad_rows_of(const float* x, int64_t in_h, int64_t width, int64_t ih0, int64_t sh,
                    int64_t rows, int64_t base, int64_t n, float fill, float* dst) {
  constexpr int64_t kChunk = 8;
  const VF f = vset1(fill);
  for (int64_t j0 = 0; j0 < n; j0 += kChunk * kLanes) {
    const int64_t vecs = dc_min(kChunk, (n - j0 + kLanes - 1) / kLanes);
    DcColumn<S> col[kChunk];
    for (int64_t v = 0; v < vecs; ++v) col[v].set(base + (j0 + v * kLanes) * S, width);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t ih = ih0 + i * sh;
      const float* row = x && ih >= 0 && ih < in_h ? x + ih * width : nullptr;
      float* d = dst + i * n + j0;
      for (int64_t v = 0; v < vecs; ++v) {
        const DcColumn<S>& c = col[v];
        VF val = f;
        if (row) val = c.full ? c.load_full(row) : vselect(c.lanes, c.load_masked(row), f);
        const int64_t j = v * kLanes;
        if (j0 + j + kLanes <= n) {
          vstore(d + j, val);
        } else {
          vstore_partial(d + j, val, static_cast<int>(n - j0 - j));
        }
      }
    }
  }
}

// ConvKernels::pad_rows.
void dc_pad_rows(const float* x, int64_t in_h, int64_t width, int64_t ih0, int64_t sh, int64_t rows,
                 int64_t base, int64_t s, int64_t n, float fill, float* dst) {
  if (s == 1) {
    dc_pad_rows_of<1>(x, in_h, width, ih0, sh, rows, base, n, fill, dst);
  } else if (s == 2) {
    dc_pad_rows_of<2>(x, in_h, width, ih0, sh, rows, base, n, fill, dst);
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t ih = ih0 + i * sh;
      const float* row = x && ih >= 0 && ih < in_h ? x + ih * width : nullptr;
      dc_copy_row(row, width, base, s, n, dst + i * n, fill);
    }
  }
}

// ConvKernels::pad_rows_pair: each vector of 2 * kLanes input columns loaded once (masked
// at the row's ends) and split into its even columns and its odd ones.
void dc_pad_rows_pair(const float* const* src, int64_t rows, int64_t width, int64_t base, int64_t n,
                      float fill, float* const* dst0, float* const* dst1) {
  constexpr int64_t kChunk = 8;
  const VF f = vset1(fill);
  struct Pair {
    int64_t c0;
    bool full;     // all 2 * kLanes columns inside the input
    VM m0, m1;     // the columns read, in the first and second kLanes
    VM even, odd;  // output lanes whose column is inside, per phase
  };
  for (int64_t j0 = 0; j0 < n; j0 += kChunk * kLanes) {
    const int64_t vecs = dc_min(kChunk, (n - j0 + kLanes - 1) / kLanes);
    Pair col[kChunk];
    for (int64_t v = 0; v < vecs; ++v) {
      Pair& c = col[v];
      c.c0 = base + 2 * (j0 + v * kLanes);
      // Elements [e0, e1) of the 2 * kLanes from c0 are inside [0, width).
      const int64_t e0 = dc_min(dc_max(-c.c0, 0), 2 * kLanes);
      const int64_t e1 = dc_max(e0, dc_min(width - c.c0, 2 * kLanes));
      c.full = e0 == 0 && e1 == 2 * kLanes;
      c.m0 = vlanes_between(static_cast<int>(dc_min(e0, kLanes)),
                            static_cast<int>(dc_min(e1, kLanes)));
      c.m1 = vlanes_between(static_cast<int>(dc_max(e0 - kLanes, 0)),
                            static_cast<int>(dc_max(e1 - kLanes, 0)));
      // Even lane l reads element 2l, odd lane l element 2l + 1.
      c.even = vlanes_between(static_cast<int>((e0 + 1) / 2), static_cast<int>((e1 + 1) / 2));
      c.odd = vlanes_between(static_cast<int>(e0 / 2), static_cast<int>(e1 / 2));
    }
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = src[i];
      float* d0 = dst0[i] + j0;
      float* d1 = dst1[i] + j0;
      for (int64_t v = 0; v < vecs; ++v) {
        const Pair& c = col[v];
        VF ev = f, od = f;
        if (row && c.full) {
          const VF a = vload(row + c.c0), b = vload(row + c.c0 + kLanes);
          ev = vpack_even(a, b);
          od = vpack_odd(a, b);
        } else if (row) {
          const VF a = vload_masked(row + c.c0, c.m0);
          const VF b = vload_masked(row + c.c0 + kLanes, c.m1);
          ev = vselect(c.even, vpack_even(a, b), f);
          od = vselect(c.odd, vpack_odd(a, b), f);
        }
        const int64_t j = v * kLanes;
        if (j0 + j + kLanes <= n) {
          vstore(d0 + j, ev);
          vstore(d1 + j, od);
        } else {
          const int tail = static_cast<int>(n - j0 - j);
          vstore_partial(d0 + j, ev, tail);
          vstore_partial(d1 + j, od, tail);
        }
      }
    }
  }
}

// Rows [oh, oh + R) of one pooled depth slice: y = max or sum over all taps, R rows of
// vectors at a time in independent registers.
template <int R, bool Max>
inline void dc_pool_rows(const float* base, int64_t row_step, const int64_t* off, int64_t taps,
                         int64_t width, float* yr) {
  int64_t j = 0;
  for (; j < width; j += kLanes) {
    const int n = static_cast<int>(dc_min(kLanes, width - j));
    // v > acc is false for a NaN v, so max pooling skips NaN inputs (starting from -inf, as
    // the scalar loops do).
    VF acc[R];
    for (int r = 0; r < R; ++r) acc[r] = Max ? vset1(-__builtin_inff()) : vzero();
    for (int64_t t = 0; t < taps; ++t) {
      for (int r = 0; r < R; ++r) {
        const float* src = base + r * row_step + off[t] + j;
        const VF v = n == kLanes ? vload(src) : vload_partial(src, n);
        acc[r] = Max ? vselect(vgt(v, acc[r]), v, acc[r]) : vadd(acc[r], v);
      }
    }
    for (int r = 0; r < R; ++r) {
      if (n == kLanes) {
        vstore(yr + r * width + j, acc[r]);
      } else {
        vstore_partial(yr + r * width + j, acc[r], n);
      }
    }
  }
}

template <bool Max>
void dc_pool_plane_of(const float* xp, const int64_t* off, const ConvGeometry& g, float* y) {
  int64_t rows[3], len[3];
  conv_padded_extent(g, rows, len);
  const int64_t row = g.stride[2] * len[2], row_step = g.stride[1] * row;
  const int64_t taps = g.k[0] * g.k[1] * g.k[2];
  constexpr int kRows = 4;
  for (int64_t od = 0; od < g.out[0]; ++od) {
    const float* slice = xp + od * g.stride[0] * rows[1] * row;
    float* ys = y + od * g.out[1] * g.out[2];
    int64_t oh = 0;
    for (; oh + kRows <= g.out[1]; oh += kRows) {
      dc_pool_rows<kRows, Max>(slice + oh * row_step, row_step, off, taps, g.out[2],
                               ys + oh * g.out[2]);
    }
    for (; oh < g.out[1]; ++oh) {
      dc_pool_rows<1, Max>(slice + oh * row_step, row_step, off, taps, g.out[2],
                           ys + oh * g.out[2]);
    }
  }
}

void dc_pool_plane(const float* xp, const int64_t* off, const ConvGeometry& g, bool max, float* y) {
  if (max) {
    dc_pool_plane_of<true>(xp, off, g, y);
  } else {
    dc_pool_plane_of<false>(xp, off, g, y);
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
