// Winograd F(4x4, 3x3) convolution: the input and output transforms (the driver, the filter
// transform and the products between them are ops/math/winograd.h). A 3x3 stride-1 filter
// over a 6x6 input tile d gives the 4x4 output tile A^T [(G g G^T) .* (B^T d B)] A, so each
// of the 36 transformed positions is one product of the transformed filter (filters x
// channels) with the transformed tiles (channels x tiles): 36 multiplies per 16 outputs
// instead of 144.
//
// Lanes hold consecutive tiles of a pass, whatever rows they lie in (a 14x14 map has four
// tiles to a row; a vector takes four rows of them). The input's rows are transformed down
// the columns first (B^T over the window's six rows, straight from the input) into strips
// where tile t's first four columns lie at 4t and its last two, in a second strip, also at
// 4t: a vector of tiles' six columns is then four phases of the first strip and two of the
// second (vpack_even / vpack_odd). The output tiles' four columns are interleaved back
// (vzip_lo / vzip_hi) into strips of 4 floats a tile, copied into the output's rows. Included
// by each ops/math/isa_*.cpp inside its namespace; includes nothing.
// The transforms of F(M x M, 3 x 3) along one axis: window W = M + 2 inputs to W
// transformed values, and W products to M outputs.
template <int M>
struct WinoF;

// F(4x4, 3x3). B^T (rows):
//   [4  0 -5  0 1 0]   [0 -4 -4  1 1 0]   [0 4 -4 -1 1 0]
//   [0 -2 -1  2 1 0]   [0  2 -1 -2 1 0]   [0 4  0 -5 0 1]
// A^T (rows): [1 1 1 1 1 0]   [0 1 -1 2 -2 0]   [0 1 1 4 4 0]   [0 1 -1 8 -8 1]
template <>
struct WinoF<4> {
  static constexpr int W = 6;
  static void input_1d(const VF* d, VF* t) {
    t[0] = vfmadd(vset1(4.0f), d[0], vfmadd(vset1(-5.0f), d[2], d[4]));
    const VF a = vfmadd(vset1(-4.0f), d[2], d[4]);  // d4 - 4 d2
    const VF b = vfmadd(vset1(-4.0f), d[1], d[3]);  // d3 - 4 d1
    t[1] = vadd(a, b);
    t[2] = vsub(a, b);
    const VF c = vsub(d[4], d[2]);
    const VF e = vsub(d[3], d[1]);
    t[3] = vfmadd(vset1(2.0f), e, c);
    t[4] = vfmadd(vset1(-2.0f), e, c);
    t[5] = vfmadd(vset1(4.0f), d[1], vfmadd(vset1(-5.0f), d[3], d[5]));
  }
  static void output_1d(const VF* m, VF* o) {
    const VF p = vadd(m[1], m[2]), q = vsub(m[1], m[2]);
    const VF r = vadd(m[3], m[4]), s = vsub(m[3], m[4]);
    o[0] = vadd(vadd(m[0], p), r);
    o[1] = vfmadd(vset1(2.0f), s, q);
    o[2] = vfmadd(vset1(4.0f), r, p);
    o[3] = vadd(vfmadd(vset1(8.0f), s, q), m[5]);
  }
  // A vector of tiles' six columns from the strips (tile t's columns 0..3 at 4t of `z`, its
  // columns 4..5 at 4t of `z2`): four phases of one, two of the other.
  static void columns(const float* z, const float* z2, VF* d) {
    const VF a0 = vload(z), a1 = vload(z + kLanes), a2 = vload(z + 2 * kLanes),
             a3 = vload(z + 3 * kLanes);
    const VF e1 = vpack_even(a0, a1), o1 = vpack_odd(a0, a1);
    const VF e2 = vpack_even(a2, a3), o2 = vpack_odd(a2, a3);
    const VF b0 = vload(z2), b1 = vload(z2 + kLanes), b2 = vload(z2 + 2 * kLanes),
             b3 = vload(z2 + 3 * kLanes);
    d[0] = vpack_even(e1, e2);
    d[1] = vpack_even(o1, o2);
    d[2] = vpack_odd(e1, e2);
    d[3] = vpack_odd(o1, o2);
    d[4] = vpack_even(vpack_even(b0, b1), vpack_even(b2, b3));
    d[5] = vpack_even(vpack_odd(b0, b1), vpack_odd(b2, b3));
  }
  // A vector of tiles' four output columns interleaved, four floats a tile, at dst.
  static void store_row(const VF* o, float* dst) {
    const VF z0 = vzip_lo(o[0], o[2]), z1 = vzip_hi(o[0], o[2]);
    const VF z2 = vzip_lo(o[1], o[3]), z3 = vzip_hi(o[1], o[3]);
    vstore(dst, vzip_lo(z0, z2));
    vstore(dst + kLanes, vzip_hi(z0, z2));
    vstore(dst + 2 * kLanes, vzip_lo(z1, z3));
    vstore(dst + 3 * kLanes, vzip_hi(z1, z3));
  }
};

// F(2x2, 3x3). B^T (rows): [1 0 -1 0]   [0 1 1 0]   [0 -1 1 0]   [0 1 0 -1]
// A^T (rows): [1 1 1 0]   [0 1 -1 -1]
template <>
struct WinoF<2> {
  static constexpr int W = 4;
  static void input_1d(const VF* d, VF* t) {
    t[0] = vsub(d[0], d[2]);
    t[1] = vadd(d[1], d[2]);
    t[2] = vsub(d[2], d[1]);
    t[3] = vsub(d[1], d[3]);
  }
  static void output_1d(const VF* m, VF* o) {
    o[0] = vadd(vadd(m[0], m[1]), m[2]);
    o[1] = vsub(vsub(m[1], m[2]), m[3]);
  }
  // Tile t's columns 0..1 at 2t of `z`, 2..3 at 2t of `z2`: two phases of each.
  static void columns(const float* z, const float* z2, VF* d) {
    const VF a0 = vload(z), a1 = vload(z + kLanes);
    const VF b0 = vload(z2), b1 = vload(z2 + kLanes);
    d[0] = vpack_even(a0, a1);
    d[1] = vpack_odd(a0, a1);
    d[2] = vpack_even(b0, b1);
    d[3] = vpack_odd(b0, b1);
  }
  // Two output columns interleaved, two floats a tile.
  static void store_row(const VF* o, float* dst) {
    vstore(dst, vzip_lo(o[0], o[1]));
    vstore(dst + kLanes, vzip_hi(o[0], o[1]));
  }
};

// The tile row segment [tx0, tx0 + n) of tile row ty within a block starting at block tile
// t0: calls f(ty, tx0, n, block-relative index of tx0) for each such segment of the block.
template <typename F>
inline void wino_segments(const WinogradTiles& b, F&& f) {
  for (int64_t t = b.t0; t < b.t0 + b.count;) {
    const int64_t ty = t / b.tiles_w, tx0 = t % b.tiles_w;
    const int64_t n = dc_min(b.tiles_w - tx0, b.t0 + b.count - t);
    f(ty, tx0, n, t - b.t0);
    t += n;
  }
}

// Channels [c0, c1) of x (planes `ip` floats apart) over the pass's tiles into the
// transformed products' B operands (WinogradTransforms::input). `rows` holds
// winograd_scratch_floats(b.count) floats: the strips.
template <int M>
void wino_input(const float* x, int64_t ip, int64_t c0, int64_t c1, const WinogradTiles& b,
                float* v, int64_t ldv, float* rows) {
  constexpr int W = WinoF<M>::W, kPositions = W * W;
  const int64_t len = winograd_strip_len(b.count), groups = (b.count + kLanes - 1) / kLanes;
  // strip[rho]: the column-transformed row rho, tile t's columns 0..M-1 at M t;
  // next[rho]: its columns M..2M-1 at M t (only M and M + 1 are read).
  float* strip[W];
  float* next[W];
  for (int r = 0; r < W; ++r) {
    strip[r] = rows + r * len;
    next[r] = rows + (W + r) * len;
  }
  for (int64_t c = c0; c < c1; ++c) {
    wino_segments(b, [&](int64_t ty, int64_t tx0, int64_t n, int64_t tile0) {
      const int64_t col0 = M * tx0 - b.pad_w, row0 = M * ty - b.pad_h;
      const float* in[W];
      for (int64_t r = 0; r < W; ++r) {
        const int64_t ih = row0 + r;
        in[r] = ih >= 0 && ih < b.in_h ? x + c * ip + ih * b.in_w + col0 : nullptr;
      }
      // B^T down the columns of the segment's M n + 2 input columns (zero outside the input),
      // read straight from the input rows. Whole vectors may write past the segment's end:
      // the next segment (or the tail cleared below) writes there after.
      const int64_t at = M * tile0;
      for (int64_t w = 0; w < M * n + M; w += kLanes) {
        const int64_t lo = dc_max(-(col0 + w), 0), hi = dc_min(b.in_w - (col0 + w), kLanes);
        VF d[W], t[W];
        if (lo == 0 && hi == kLanes) {
          for (int r = 0; r < W; ++r) d[r] = in[r] ? vload(in[r] + w) : vzero();
        } else if (hi > lo) {
          const VM m = vlanes_between(static_cast<int>(lo), static_cast<int>(hi));
          for (int r = 0; r < W; ++r) d[r] = in[r] ? vload_masked(in[r] + w, m) : vzero();
        } else {
          for (int r = 0; r < W; ++r) d[r] = vzero();
        }
        WinoF<M>::input_1d(d, t);
        for (int r = 0; r < W; ++r) {
          if (w < M * n) vstore(strip[r] + at + w, t[r]);
          // Columns M on go to `next`, M floats back (the first vector's first M lanes
          // belong to the previous tile's slots there, so they are not written).
          if (w == 0) {
            vstore_lanes(next[r] + at - M, t[r], static_cast<int>(dc_min(M, kLanes)), kLanes);
          } else {
            vstore(next[r] + at + w - M, t[r]);
          }
        }
      }
    });
    // Past the last tile the vectors read zeros, not whatever the strips held.
    for (int r = 0; r < 2 * W; ++r) {
      for (int64_t i = M * b.count; i < M * groups * kLanes; ++i) rows[r * len + i] = 0.0f;
    }
    // Then B along each row: lane l takes its tile's W columns.
    float* vc = v + c * kPositions * ldv;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t rho = 0; rho < W; ++rho) {
        VF d[W], t[W];
        WinoF<M>::columns(strip[rho] + M * g * kLanes, next[rho] + M * g * kLanes, d);
        WinoF<M>::input_1d(d, t);
        // Whole vectors: a row holds ld >= the pass's tiles rounded up to whole vectors.
        for (int64_t s = 0; s < W; ++s) vstore(vc + (rho * W + s) * ldv + g * kLanes, t[s]);
      }
    }
  }
}

// y[0, n) = src[0, n) (plus y's values when `accumulate`), then max(., 0) when `relu`.
inline void wino_copy_out(const float* src, int64_t n, bool accumulate, bool relu, float* y) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    VF r = vload(src + i);
    if (accumulate) r = vadd(r, vload(y + i));
    if (relu) r = vmax(r, vzero());
    vstore(y + i, r);
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    VF r = vload_partial(src + i, left);
    if (accumulate) r = vadd(r, vload_partial(y + i, left));
    if (relu) r = vmax(r, vzero());
    vstore_partial(y + i, r, left);
  }
}

// Filters [k0, k1) of the pass's tiles from the products m (WinogradTransforms::output);
// `rows` holds winograd_scratch_floats(b.count) floats (the output strips).
template <int M>
void wino_output(const float* m, int64_t ldm, int64_t k0, int64_t k1, const WinogradTiles& b,
                 const float* bias, bool accumulate, bool relu, float* y, int64_t op, float* rows) {
  constexpr int W = WinoF<M>::W, kPositions = W * W;
  const int64_t len = winograd_strip_len(b.count), groups = (b.count + kLanes - 1) / kLanes;
  for (int64_t k = k0; k < k1; ++k) {
    const VF bv = vset1(bias ? bias[k] : 0.0f);
    // Output row i of tile t at rows[i * len + M t], M floats.
    for (int64_t g = 0; g < groups; ++g) {
      const float* mk = m + k * kPositions * ldm + g * kLanes;
      // A^T along each row of the W x W products, then down the columns.
      VF u[W][M];
      for (int64_t i = 0; i < W; ++i) {
        VF row[W];
        for (int64_t j = 0; j < W; ++j) row[j] = vload(mk + (i * W + j) * ldm);
        WinoF<M>::output_1d(row, u[i]);
      }
      VF o[M][M];
      for (int64_t j = 0; j < M; ++j) {
        VF col[W], out[M];
        for (int64_t i = 0; i < W; ++i) col[i] = u[i][j];
        WinoF<M>::output_1d(col, out);
        for (int64_t i = 0; i < M; ++i) o[i][j] = vadd(out[i], bv);
      }
      for (int64_t i = 0; i < M; ++i) WinoF<M>::store_row(o[i], rows + i * len + M * g * kLanes);
    }
    // Each tile row's segment into y's rows, cut at the plane's edges.
    wino_segments(b, [&](int64_t ty, int64_t tx0, int64_t n, int64_t tile0) {
      const int64_t oh0 = M * ty, out_rows = dc_min(M, b.out_h - oh0);
      const int64_t valid = dc_min(M * n, b.out_w - M * tx0);
      float* yk = y + k * op + oh0 * b.out_w + M * tx0;
      for (int64_t i = 0; i < out_rows; ++i)
        wino_copy_out(rows + i * len + M * tile0, valid, accumulate, relu, yk + i * b.out_w);
    });
  }
}

constexpr WinogradKernels kWinogradKernels{
    .f4 = {.input = wino_input<4>, .output = wino_output<4>},
    .f2 = {.input = wino_input<2>, .output = wino_output<2>}};
