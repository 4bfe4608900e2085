// Pooling kernels, which the direct convolution's loops also run (DcMode::Max, DcMode::Sum):
// whole planes of pooling windows at column stride 1 or 2 (pool_planes, max pooling 3x3 stride
// 2 of its own), one plane read in place with masked loads (direct_pool_plane), and one padded
// plane (pool_plane). Included by impl/conv.h after impl/conv_direct.h (inside each
// ops/math/isa_*.cpp's namespace); includes nothing.

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
