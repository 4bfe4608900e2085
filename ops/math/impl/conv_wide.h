// Wide-layout kernels (the layout in ops/conv/wide_layout.h): one plane laid out padded and split
// into stride phases, where every tap reads consecutive output positions' inputs as one run,
// convolved or pooled there (wide_plane); and the row copies that lay planes out (pad_rows,
// pad_rows_pair). Included by impl/conv.h after impl/conv_direct.h (inside each
// ops/math/isa_*.cpp's namespace); includes nothing.

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
