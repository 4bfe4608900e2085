// Single-precision GEMM kernels, written once against the level's vector type: the MR x NR
// register tile (C += A_panel * B_panel over k), and the packing of A and B into the panels
// it reads. Included by each ops/math/isa_*.cpp inside its namespace; includes nothing.
//
// Layouts (see ops/math/gemm.h for the driver):
//   packed A: for each k, kGemmMr consecutive floats (rows of the tile; alpha applied,
//             rows past the matrix zero);
//   packed B: panels of kGemmNr columns; panel j holds, for each k, kGemmNr consecutive
//             floats (columns past the matrix zero). The tile reads B with a row stride
//             `ldb`, so a row-major unpacked B (ldb = its row stride) is read the same way.

// Rows of the tile: as many as the level's registers hold beside the B vectors
// (kGemmMr x kGemmNv accumulators + kGemmNv B vectors + one broadcast).
constexpr int kGemmNv = 2;
constexpr int kGemmNr = kGemmNv * kLanes;
constexpr int kGemmMr = kLanes == 16 ? 12 : 6;
// Floats of packed A ahead of the tile's reads that it prefetches (about a DRAM latency's
// worth of its consumption).
constexpr int kGemmPrefetchA = 1024;
// The same for a packed B panel (32 k steps ahead).
constexpr int kGemmPrefetchB = 32 * kGemmNr;

// B's element type in the tile: float, or bfloat16 / float16 panels (weights kept at half the
// size; widened to float in registers, so products and sums stay in float).
struct BF32 {
  using T = float;
  static constexpr bool kPadded = false;  // an edge panel may end at the matrix's last column
  static VF load(const float* p) { return vload(p); }
};
// Packed float B: panels are padded to kGemmNr columns, so edge tiles load whole vectors too.
struct BF32Packed {
  using T = float;
  static constexpr bool kPadded = true;
  static VF load(const float* p) { return vload(p); }
};
struct BBF16 {
  using T = uint16_t;
  static constexpr bool kPadded = true;
  static VF load(const uint16_t* p) { return vfrom_bits(vshl<16>(vload_u16(p))); }
};
struct BF16 {
  using T = uint16_t;
  static constexpr bool kPadded = true;
  static VF load(const uint16_t* p) { return vload_f16(p); }
};

// Rows x (kGemmNv vectors) of C += A * B. `Full`: all kGemmNr columns are valid in C (and in
// B); otherwise float B is read with masks, while half-type B is always a padded panel.
// `ColdA`, `ColdB`: A or B is a packed constant streaming from memory (a cold filter or
// weight matrix), fetched ahead. `Nv`: vectors of columns computed (one for a narrow edge
// tile of at most kLanes columns, which then costs half a full one).
// Writes (or, with `accumulate`, adds) a Rows x Nv-vector tile of sums to C, with the epilogue
// `e` when given; without Full, only `cols` columns.
// Calls f.template operator()<R>() for R = rows (1 to kGemmMr): the tile kernels' row
// counts as template arguments. Nothing is called for rows outside that range.
template <typename F, int... R>
inline void dispatch_rows_of(int rows, F& f, std::integer_sequence<int, R...>) {
  (void)((rows == R + 1 ? (f.template operator()<R + 1>(), true) : false) || ...);
}
template <typename F>
inline void dispatch_rows(int rows, F&& f) {
  dispatch_rows_of(rows, f, std::make_integer_sequence<int, kGemmMr>{});
}

// Calls f.template operator()<Rows, Full, Nv>() for a tile of `rows` rows and `cols` columns:
// Full when all kGemmNr columns are valid, one vector computed (Nv = 1) for an edge tile of
// at most kLanes columns, else kGemmNv vectors with the columns past `cols` masked.
template <typename F>
inline void dispatch_tile(int rows, int cols, F&& f) {
  dispatch_rows(rows, [&]<int R>() {
    if (cols == kGemmNr) {
      f.template operator()<R, true, kGemmNv>();
    } else if (cols <= kLanes) {
      f.template operator()<R, false, 1>();
    } else {
      f.template operator()<R, false, kGemmNv>();
    }
  });
}

// A tile's sums set to zero.
template <int Rows, int Nv>
inline void tile_zero(VF (&acc)[Rows][Nv]) {
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) acc[r][v] = vzero();
  }
}

// One k step of a tile: row r's sums += (A's value for row r, broadcast) * the B vectors,
// the row's value read at a_row(r).
template <int Rows, int Nv, typename ARow>
inline void tile_step(VF (&acc)[Rows][Nv], const VF (&bv)[Nv], ARow a_row) {
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
    const VF ar = vbroadcast(a_row(r));
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) acc[r][v] = vfmadd(ar, bv[v], acc[r][v]);
  }
}

template <int Rows, bool Full, int Nv>
inline void store_tile(const VF (&acc)[Rows][Nv], float* c, int64_t ldc, int cols, bool accumulate,
                       const TileEpilogue* e) {
  VF col_bias[Nv];
  if (e) {
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      const int left = Full ? kLanes : cols - v * kLanes;
      col_bias[v] = !e->col_bias || left <= 0 ? vzero()
                    : left >= kLanes          ? vload(e->col_bias + v * kLanes)
                                              : vload_partial(e->col_bias + v * kLanes, left);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
    float* cr = c + r * ldc;
    const VF row_bias = e && e->row_bias ? vset1(e->row_bias[r]) : vzero();
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      const int left = Full ? kLanes : cols - v * kLanes;
      if (left <= 0) continue;
      const bool whole = left >= kLanes;
      VF x = acc[r][v];
      if (accumulate)
        x = vadd(x, whole ? vload(cr + v * kLanes) : vload_partial(cr + v * kLanes, left));
      if (e) {
        x = vadd(x, vadd(row_bias, col_bias[v]));
        if (e->relu) x = vmax(x, vzero());
      }
      if (whole) {
        vstore(cr + v * kLanes, x);
      } else {
        vstore_partial(cr + v * kLanes, x, left);
      }
    }
  }
}

template <int Rows, bool Full, typename B, bool ColdA = false, bool ColdB = false, int Nv = kGemmNv>
inline void gemm_tile(int64_t k, const float* a, const typename B::T* b, int64_t ldb, float* c,
                      int64_t ldc, int cols, bool accumulate, const TileEpilogue* e) {
  VF acc[Rows][Nv];
  tile_zero(acc);
  for (int64_t p = 0; p < k; ++p) {
    VF bv[Nv];
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      const int left = cols - v * kLanes;
      if constexpr (Full || B::kPadded) {
        bv[v] = B::load(b + v * kLanes);
      } else {
        bv[v] = left >= kLanes ? vload(b + v * kLanes)
                               : (left > 0 ? vload_partial(b + v * kLanes, left) : vzero());
      }
    }
    if constexpr (ColdA) __builtin_prefetch(a + kGemmPrefetchA);
    if constexpr (ColdB) {
      __builtin_prefetch(b + kGemmPrefetchB);
      __builtin_prefetch(b + kGemmPrefetchB + kGemmNr / 2);
    }
    tile_step(acc, bv, [a](int r) { return a + r; });
    a += kGemmMr;
    b += ldb;
  }
  store_tile<Rows, Full, Nv>(acc, c, ldc, cols, accumulate, e);
}

// C[rows x cols] (+)= packed A [k x kGemmMr] * B [k x kGemmNr, row stride ldb].
template <typename B, bool ColdA = false, bool ColdB = false>
void gemm_kernel(int64_t k, const float* a, const typename B::T* b, int64_t ldb, float* c,
                 int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  dispatch_tile(rows, cols, [&]<int R, bool Full, int Nv>() {
    gemm_tile<R, Full, B, ColdA, ColdB, Nv>(k, a, b, ldb, c, ldc, cols, accumulate, e);
  });
}

void sgemm_kernel(int64_t k, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                  int rows, int cols, bool accumulate, const TileEpilogue* e) {
  gemm_kernel<BF32>(k, a, b, ldb, c, ldc, rows, cols, accumulate, e);
}

void sgemm_kernel_packed(int64_t k, const float* a, const float* b, int64_t ldb, float* c,
                         int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  gemm_kernel<BF32Packed>(k, a, b, ldb, c, ldc, rows, cols, accumulate, e);
}

void sgemm_kernel_cold_a(int64_t k, const float* a, const float* b, int64_t ldb, float* c,
                         int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  gemm_kernel<BF32Packed, true>(k, a, b, ldb, c, ldc, rows, cols, accumulate, e);
}

void sgemm_kernel_cold_b(int64_t k, const float* a, const float* b, int64_t ldb, float* c,
                         int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  gemm_kernel<BF32Packed, false, true>(k, a, b, ldb, c, ldc, rows, cols, accumulate, e);
}

void sgemm_kernel_bf16(int64_t k, const float* a, const uint16_t* b, int64_t ldb, float* c,
                       int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  gemm_kernel<BBF16>(k, a, b, ldb, c, ldc, rows, cols, accumulate, e);
}

void sgemm_kernel_f16(int64_t k, const float* a, const uint16_t* b, int64_t ldb, float* c,
                      int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  gemm_kernel<BF16>(k, a, b, ldb, c, ldc, rows, cols, accumulate, e);
}

// gemm_tile with B's row p at b_rows[p] + j0 (an indirect B, read in place) and A a packed
// constant fetched ahead. Full: all kGemmNr columns valid (else masked loads and stores).
template <int Rows, bool Full, int Nv = kGemmNv>
inline void gemm_tile_indirect(int64_t k, const float* a, const float* const* b_rows, int64_t j0,
                               float* c, int64_t ldc, int cols, bool accumulate,
                               const TileEpilogue* e) {
  VF acc[Rows][Nv];
  tile_zero(acc);
  for (int64_t p = 0; p < k; ++p) {
    const float* b = b_rows[p] + j0;
    VF bv[Nv];
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      const int left = cols - v * kLanes;
      if constexpr (Full) {
        bv[v] = vload(b + v * kLanes);
      } else {
        bv[v] = left >= kLanes ? vload(b + v * kLanes)
                               : (left > 0 ? vload_partial(b + v * kLanes, left) : vzero());
      }
    }
    __builtin_prefetch(a + kGemmPrefetchA);
    tile_step(acc, bv, [a](int r) { return a + r; });
    a += kGemmMr;
  }
  store_tile<Rows, Full, Nv>(acc, c, ldc, cols, accumulate, e);
}

void sgemm_kernel_indirect(int64_t k, const float* a, const float* const* b_rows, int64_t j0,
                           float* c, int64_t ldc, int rows, int cols, bool accumulate,
                           const TileEpilogue* e) {
  dispatch_tile(rows, cols, [&]<int R, bool Full, int Nv>() {
    gemm_tile_indirect<R, Full, Nv>(k, a, b_rows, j0, c, ldc, cols, accumulate, e);
  });
}

// gemm_tile with A read in place: row r of the tile at a + r * lda (a row-major A, its
// columns consecutive), B in packed panels. Each k step broadcasts one float of every row,
// as from a packed panel; the rows are Rows sequential streams, each cache line serving
// kLanes steps.
template <int Rows, bool Full, int Nv = kGemmNv>
inline void gemm_tile_rows_a(int64_t k, const float* a, int64_t lda, const float* b, float* c,
                             int64_t ldc, int cols, bool accumulate, const TileEpilogue* e) {
  VF acc[Rows][Nv];
  tile_zero(acc);
  for (int64_t p = 0; p < k; ++p) {
    VF bv[Nv];
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) bv[v] = vload(b + v * kLanes);
    tile_step(acc, bv, [a, lda, p](int r) { return a + r * lda + p; });
    b += kGemmNr;
  }
  store_tile<Rows, Full, Nv>(acc, c, ldc, cols, accumulate, e);
}

void sgemm_kernel_rows_a(int64_t k, const float* a, int64_t lda, const float* b, float* c,
                         int64_t ldc, int rows, int cols, bool accumulate, const TileEpilogue* e) {
  dispatch_tile(rows, cols, [&]<int R, bool Full, int Nv>() {
    gemm_tile_rows_a<R, Full, Nv>(k, a, lda, b, c, ldc, cols, accumulate, e);
  });
}

// rows (<= kGemmMr) x k of A, element (r, p) at a[r * rs + p * cs], into one packed panel,
// times alpha.
void sgemm_pack_a(const float* a, int64_t rs, int64_t cs, int rows, int64_t k, float alpha,
                  float* out) {
  if (cs == 1 && rows == kGemmMr) {
    // Row-major: read each row once, in blocks of kLanes columns.
    const VF va = vset1(alpha);
    int64_t p = 0;
    alignas(64) float t[kGemmMr][kLanes];
    for (; p + kLanes <= k; p += kLanes) {
      for (int r = 0; r < kGemmMr; ++r) vstore(t[r], vmul(vload(a + r * rs + p), va));
      for (int q = 0; q < kLanes; ++q) {
        for (int r = 0; r < kGemmMr; ++r) out[(p + q) * kGemmMr + r] = t[r][q];
      }
    }
    for (; p < k; ++p) {
      for (int r = 0; r < kGemmMr; ++r) out[p * kGemmMr + r] = alpha * a[r * rs + p];
    }
    return;
  }
  for (int64_t p = 0; p < k; ++p) {
    float* o = out + p * kGemmMr;
    const float* src = a + p * cs;
    int r = 0;
    for (; r < rows; ++r) o[r] = alpha * src[r * rs];
    for (; r < kGemmMr; ++r) o[r] = 0.0f;
  }
}

// k x n of B, element (p, j) at b[p * rs + j * cs], into ceil(n / kGemmNr) panels.
void sgemm_pack_b(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n, float* out) {
  for (int64_t j0 = 0; j0 < n; j0 += kGemmNr) {
    const int cols = static_cast<int>(n - j0 < kGemmNr ? n - j0 : kGemmNr);
    float* panel = out + j0 * k;
    if (cs == 1) {
      for (int64_t p = 0; p < k; ++p) {
        const float* src = b + p * rs + j0;
        float* o = panel + p * kGemmNr;
#pragma GCC unroll 4
        for (int v = 0; v < kGemmNv; ++v) {
          const int left = cols - v * kLanes;
          const VF x = left >= kLanes
                           ? vload(src + v * kLanes)
                           : (left > 0 ? vload_partial(src + v * kLanes, left) : vzero());
          vstore(o + v * kLanes, x);
        }
      }
    } else {
      // Column-major (a transposed view): each column is contiguous along k.
      for (int j = 0; j < kGemmNr; ++j) {
        if (j < cols) {
          const float* src = b + (j0 + j) * cs;
          for (int64_t p = 0; p < k; ++p) panel[p * kGemmNr + j] = src[p * rs];
        } else {
          for (int64_t p = 0; p < k; ++p) panel[p * kGemmNr + j] = 0.0f;
        }
      }
    }
  }
}

// sgemm_pack_b into bfloat16 / float16 panels (rounded to nearest even), through a float
// panel row at a time.
template <bool Bf16>
void pack_b_half(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n, uint16_t* out) {
  alignas(64) float row[kGemmNr];
  for (int64_t j0 = 0; j0 < n; j0 += kGemmNr) {
    const int cols = static_cast<int>(n - j0 < kGemmNr ? n - j0 : kGemmNr);
    uint16_t* panel = out + j0 * k;
    for (int64_t p = 0; p < k; ++p) {
      for (int j = 0; j < kGemmNr; ++j) row[j] = j < cols ? b[p * rs + (j0 + j) * cs] : 0.0f;
#pragma GCC unroll 4
      for (int v = 0; v < kGemmNv; ++v) {
        if (Bf16) {
          vstore_u16(panel + p * kGemmNr + v * kLanes, bf16_bits(vload(row + v * kLanes)));
        } else {
          vstore_f16(panel + p * kGemmNr + v * kLanes, vload(row + v * kLanes));
        }
      }
    }
  }
}

void sgemm_pack_b_bf16(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n,
                       uint16_t* out) {
  pack_b_half<true>(b, rs, cs, k, n, out);
}

void sgemm_pack_b_f16(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n, uint16_t* out) {
  pack_b_half<false>(b, rs, cs, k, n, out);
}

// y[j] = sum over p of x[p] * b[j * ldb + p] for j < n: dot products with n contiguous rows,
// four at a time so x is loaded once for four of them.
void sdots(const float* x, const float* b, int64_t ldb, int64_t k, int64_t n, float* y) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* b0 = b + j * ldb;
    const float* b1 = b0 + ldb;
    const float* b2 = b1 + ldb;
    const float* b3 = b2 + ldb;
    VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
    int64_t p = 0;
    for (; p + kLanes <= k; p += kLanes) {
      const VF xv = vload(x + p);
      s0 = vfmadd(xv, vload(b0 + p), s0);
      s1 = vfmadd(xv, vload(b1 + p), s1);
      s2 = vfmadd(xv, vload(b2 + p), s2);
      s3 = vfmadd(xv, vload(b3 + p), s3);
    }
    if (p < k) {
      const int left = static_cast<int>(k - p);
      const VF xv = vload_partial(x + p, left);
      s0 = vfmadd(xv, vload_partial(b0 + p, left), s0);
      s1 = vfmadd(xv, vload_partial(b1 + p, left), s1);
      s2 = vfmadd(xv, vload_partial(b2 + p, left), s2);
      s3 = vfmadd(xv, vload_partial(b3 + p, left), s3);
    }
    y[j] = vreduce_add(s0);
    y[j + 1] = vreduce_add(s1);
    y[j + 2] = vreduce_add(s2);
    y[j + 3] = vreduce_add(s3);
  }
  for (; j < n; ++j) {
    const float* bj = b + j * ldb;
    VF s0 = vzero();
    int64_t p = 0;
    for (; p + kLanes <= k; p += kLanes) s0 = vfmadd(vload(x + p), vload(bj + p), s0);
    if (p < k) {
      const int left = static_cast<int>(k - p);
      s0 = vfmadd(vload_partial(x + p, left), vload_partial(bj + p, left), s0);
    }
    y[j] = vreduce_add(s0);
  }
}

// y[j] = sum over p of w[p] * b[p * ldb + j] for j < n: a row vector times a row-major
// matrix read row by row, each row once (attention's weighted sum of a query's values).
void sgemv_rows(const float* w, const float* b, int64_t ldb, int64_t k, int64_t n, float* y) {
  constexpr int kMaxVectors = 8;
  for (int64_t j0 = 0; j0 < n; j0 += kMaxVectors * kLanes) {
    const int64_t cols = n - j0 < kMaxVectors * kLanes ? n - j0 : kMaxVectors * kLanes;
    const int full = static_cast<int>(cols / kLanes), left = static_cast<int>(cols % kLanes);
    VF acc[kMaxVectors + 1];
#pragma GCC unroll 9
    for (int v = 0; v <= kMaxVectors; ++v) acc[v] = vzero();
    for (int64_t p = 0; p < k; ++p) {
      const VF wv = vset1(w[p]);
      const float* row = b + p * ldb + j0;
#pragma GCC unroll 8
      for (int v = 0; v < kMaxVectors; ++v) {
        if (v < full) acc[v] = vfmadd(wv, vload(row + v * kLanes), acc[v]);
      }
      if (left) acc[full] = vfmadd(wv, vload_partial(row + full * kLanes, left), acc[full]);
    }
    for (int v = 0; v < full; ++v) vstore(y + j0 + v * kLanes, acc[v]);
    if (left) vstore_partial(y + j0 + full * kLanes, acc[full], left);
  }
}

// sum over p of x[p] * y[p].
float sdot(const float* x, const float* y, int64_t n) {
  VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    s0 = vfmadd(vload(x + i), vload(y + i), s0);
    s1 = vfmadd(vload(x + i + kLanes), vload(y + i + kLanes), s1);
    s2 = vfmadd(vload(x + i + 2 * kLanes), vload(y + i + 2 * kLanes), s2);
    s3 = vfmadd(vload(x + i + 3 * kLanes), vload(y + i + 3 * kLanes), s3);
  }
  for (; i + kLanes <= n; i += kLanes) s0 = vfmadd(vload(x + i), vload(y + i), s0);
  if (i < n) {
    const int left = static_cast<int>(n - i);
    s1 = vfmadd(vload_partial(x + i, left), vload_partial(y + i, left), s1);
  }
  return vreduce_add(vadd(vadd(s0, s1), vadd(s2, s3)));
}

// For benchmarks: `iterations` rounds of independent FMA chains (enough to cover the FMA
// latency on every level); returns the floating-point operations done.
double fma_peak_loop(int64_t iterations) {
  constexpr int kChains = 12;
  VF acc[kChains];
  const VF x = vset1(1.0000001f), y = vset1(0.9999999f);
#pragma GCC unroll 12
  for (int i = 0; i < kChains; ++i) acc[i] = vset1(static_cast<float>(i));
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = vfmadd(acc[i], x, y);
  }
  VF s = acc[0];
  for (int i = 1; i < kChains; ++i) s = vadd(s, acc[i]);
  // The sum is returned through a volatile store so the loop cannot be removed.
  volatile float sink = vreduce_add(s);
  (void)sink;
  return 2.0 * kChains * kLanes * static_cast<double>(iterations);
}

// A finished tile's bias and ReLU, one vector at a time while the tile is in L1.
void gemm_epilogue(float* c, int64_t ldc, int64_t rows, int64_t cols, const float* bias,
                   const float* row_bias, bool relu) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = c + i * ldc;
    const VF rb = vset1(row_bias ? row_bias[i] : 0.0f);
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      VF v = vadd(vload(row + j), rb);
      if (bias) v = vadd(v, vload(bias + j));
      if (relu) v = vmax(v, vzero());
      vstore(row + j, v);
    }
    if (j < cols) {
      const int n = static_cast<int>(cols - j);
      VF v = vadd(vload_partial(row + j, n), rb);
      if (bias) v = vadd(v, vload_partial(bias + j, n));
      if (relu) v = vmax(v, vzero());
      vstore_partial(row + j, v, n);
    }
  }
}

constexpr GemmKernels kGemmKernels{.mr = kGemmMr,
                                   .nr = kGemmNr,
                                   .kernel = sgemm_kernel,
                                   .pack_a = sgemm_pack_a,
                                   .pack_b = sgemm_pack_b,
                                   .dot = sdot,
                                   .fma_peak_loop = fma_peak_loop,
                                   .kernel_bf16 = sgemm_kernel_bf16,
                                   .kernel_f16 = sgemm_kernel_f16,
                                   .pack_b_bf16 = sgemm_pack_b_bf16,
                                   .pack_b_f16 = sgemm_pack_b_f16,
                                   .kernel_packed = sgemm_kernel_packed,
                                   .kernel_cold_a = sgemm_kernel_cold_a,
                                   .kernel_cold_b = sgemm_kernel_cold_b,
                                   .kernel_indirect = sgemm_kernel_indirect,
                                   .kernel_rows_a = sgemm_kernel_rows_a,
                                   .dots = sdots,
                                   .gemv_rows = sgemv_rows,
                                   .epilogue = gemm_epilogue};
