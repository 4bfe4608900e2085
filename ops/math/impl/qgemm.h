// 8-bit integer GEMM kernels: the MR x NR register tile (uint8 A times int8 B into int32), the
// packing of A and B into the panels it reads, and the requantization of its results.
// Written once against the level's vector type and a dot-product step `QDot` that the
// including unit defines first (impl/qgemm_widen.h, or AVX512-VNNI in isa_avx512.cpp):
//
//   QDot::kb               k values per group;
//   QDot::kName            the name of the packed layouts;
//   QDot::mr               rows of the tile (its registers: mr x 2 sums, the B vectors, a
//                          broadcast and what madd needs besides);
//   QDot::load_b(p)        kLanes columns of one k group of a B panel (kLanes * kb bytes);
//   QDot::madd(acc, a, b)  acc + the sum over the group of a * b in each int32 lane, where a
//                          holds one A word (a row's values of the group) in every lane.
//
// Included by each ops/math/isa_*.cpp inside its namespace; includes nothing. The byte
// shuffles of the packers use 128-bit SSE4.1 operations, which every level has.
//
// Layouts (the driver is ops/math/qgemm.h):
//   packed A: for each k group, kQgemmMr 32-bit words, one per row, value t of the group in
//             bits [t * 32 / kb, (t + 1) * 32 / kb) (zero-extended); zero past the rows and k.
//   packed B: panels of kQgemmNr columns; for each k group a panel holds kQgemmNr * kb bytes,
//             column j's values at j * kb; zero past the columns and k.

constexpr int kQgemmNv = 2;
constexpr int kQgemmNr = kQgemmNv * kLanes;
constexpr int kQgemmMr = QDot::mr;
constexpr int kQgemmKb = QDot::kb;
constexpr int kQgemmBits = 32 / kQgemmKb;  // bits per value in an A word

// Rows x kQgemmNv vectors of C = A * B + fix over `groups` k groups. A short tile (a GEMV
// row) keeps a second set of sums for the odd groups, where the registers allow, so that the
// latency of one multiply-add chain does not bound it. The sums stay in this one function
// (passed by reference to helpers, GCC keeps them in memory), and an empty asm statement
// after each multiply-add holds each sum in its register: without it GCC computes every
// product of a step before adding any, runs out of registers and spills sums.
template <int Rows>
inline void qgemm_tile(int64_t groups, const int32_t* a, const uint8_t* b, int32_t* c, int64_t ldc,
                       int cols, const Int8TileFix& fix) {
  // Vector registers, less those two-operand SSE code needs for copies.
  constexpr int kRegisters = kLanes == 16 ? 32 : (kLanes == 8 ? 16 : 12);
  constexpr bool kSplit = Rows < 4 && 2 * Rows * kQgemmNv + 2 * kQgemmNv + 2 <= kRegisters;
  constexpr int64_t kStepB = kQgemmNr * kQgemmKb;
  VI acc[Rows][kQgemmNv], odd[kSplit ? Rows : 1][kQgemmNv];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kQgemmNv; ++v) acc[r][v] = odd[kSplit ? r : 0][v] = viset1(0);
  }
  int64_t g = 0;
  if constexpr (kSplit) {
    for (; g + 2 <= groups; g += 2) {
      VI b0[kQgemmNv], b1[kQgemmNv];
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) {
        b0[v] = QDot::load_b(b + v * kLanes * kQgemmKb);
        b1[v] = QDot::load_b(b + kStepB + v * kLanes * kQgemmKb);
      }
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) {
        const VI a0 = vibroadcast(a + r), a1 = vibroadcast(a + kQgemmMr + r);
#pragma GCC unroll 4
        for (int v = 0; v < kQgemmNv; ++v) {
          acc[r][v] = QDot::madd(acc[r][v], a0, b0[v]);
          odd[r][v] = QDot::madd(odd[r][v], a1, b1[v]);
          __asm__("" : "+v"(acc[r][v]), "+v"(odd[r][v]));
        }
      }
      a += 2 * kQgemmMr;
      b += 2 * kStepB;
    }
  }
  for (; g < groups; ++g) {
    VI bv[kQgemmNv];
#pragma GCC unroll 4
    for (int v = 0; v < kQgemmNv; ++v) bv[v] = QDot::load_b(b + v * kLanes * kQgemmKb);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const VI ar = vibroadcast(a + r);
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) {
        acc[r][v] = QDot::madd(acc[r][v], ar, bv[v]);
        __asm__("" : "+v"(acc[r][v]));
      }
    }
    a += kQgemmMr;
    b += kStepB;
  }
  if constexpr (kSplit) {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) acc[r][v] = viadd(acc[r][v], odd[r][v]);
    }
  }

  // The fix, one term at a time so that every loop unrolls and the sums stay in registers.
  if (fix.row_mul && fix.col_mul) {
    VI col_mul[kQgemmNv];
#pragma GCC unroll 4
    for (int v = 0; v < kQgemmNv; ++v) col_mul[v] = viload(fix.col_mul + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const VI row_mul = viset1(fix.row_mul[r]);
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) acc[r][v] = viadd(acc[r][v], vimul(row_mul, col_mul[v]));
    }
  }
  if (fix.col_add) {
    VI col_add[kQgemmNv];
#pragma GCC unroll 4
    for (int v = 0; v < kQgemmNv; ++v) col_add[v] = viload(fix.col_add + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) acc[r][v] = viadd(acc[r][v], col_add[v]);
    }
  }
  if (fix.row_add) {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const VI row_add = viset1(fix.row_add[r]);
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) acc[r][v] = viadd(acc[r][v], row_add);
    }
  }
  if (cols == kQgemmNr) {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < kQgemmNv; ++v) vistore(c + r * ldc + v * kLanes, acc[r][v]);
    }
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kQgemmNv; ++v) {
      const int left = cols - v * kLanes;
      if (left >= kLanes) {
        vistore(c + r * ldc + v * kLanes, acc[r][v]);
      } else if (left > 0) {
        vistore_partial(c + r * ldc + v * kLanes, acc[r][v], left);
      }
    }
  }
}

// C[rows x cols] = packed A [groups x kQgemmMr words] * B panel [groups x kQgemmNr x kb] + fix.
void qgemm_kernel(int64_t groups, const int32_t* a, const uint8_t* b, int32_t* c, int64_t ldc,
                  int rows, int cols, const Int8TileFix& fix) {
  switch (rows) {
#define KILN_QGEMM_ROWS(R)                            \
  case R:                                             \
    if constexpr (R <= kQgemmMr) {                    \
      qgemm_tile<R>(groups, a, b, c, ldc, cols, fix); \
    }                                                 \
    break;
    KILN_QGEMM_ROWS(1)
    KILN_QGEMM_ROWS(2)
    KILN_QGEMM_ROWS(3)
    KILN_QGEMM_ROWS(4)
    KILN_QGEMM_ROWS(5)
    KILN_QGEMM_ROWS(6)
    KILN_QGEMM_ROWS(7)
    KILN_QGEMM_ROWS(8)
    KILN_QGEMM_ROWS(9)
    KILN_QGEMM_ROWS(10)
    KILN_QGEMM_ROWS(11)
    KILN_QGEMM_ROWS(12)
#undef KILN_QGEMM_ROWS
    default:
      break;
  }
}

// The A word of src[t * step] for t < count (count <= kb), each value xor flip.
inline int32_t qgemm_a_word(const uint8_t* src, int64_t step, int count, uint8_t flip) {
  uint32_t w = 0;
  for (int t = 0; t < count; ++t) {
    w |= static_cast<uint32_t>(static_cast<uint8_t>(src[t * step] ^ flip)) << (t * kQgemmBits);
  }
  return static_cast<int32_t>(w);
}

// One row of A, element p at src[p * cs] xor flip, into its words of a panel (`o`, step
// kQgemmMr); returns the sum of its flipped values when `want_sum`, else 0.
inline int64_t qgemm_pack_a_row(const uint8_t* src, int64_t cs, int64_t k, uint8_t flip, int32_t* o,
                                bool want_sum) {
  const int64_t groups = (k + kQgemmKb - 1) / kQgemmKb, full = k / kQgemmKb;
  const __m128i vflip = _mm_set1_epi8(static_cast<char>(flip)), zero = _mm_setzero_si128();
  int64_t g = 0;
  int64_t sum = 0;
  if (cs == 1) {
    // 16 bytes at a time; psadbw sums them on the way.
    constexpr int kPer = 16 / kQgemmKb;  // groups in 16 bytes
    __m128i sad = zero;
    for (; g + kPer <= full; g += kPer) {
      const __m128i x = _mm_xor_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + g * kQgemmKb)), vflip);
      sad = _mm_add_epi64(sad, _mm_sad_epu8(x, zero));
      int32_t* og = o + g * kQgemmMr;
      if constexpr (kQgemmKb == 4) {
        og[0] = _mm_cvtsi128_si32(x);
        og[kQgemmMr] = _mm_extract_epi32(x, 1);
        og[2 * kQgemmMr] = _mm_extract_epi32(x, 2);
        og[3 * kQgemmMr] = _mm_extract_epi32(x, 3);
      } else {
        const __m128i lo = _mm_cvtepu8_epi16(x), hi = _mm_unpackhi_epi8(x, zero);
        og[0] = _mm_cvtsi128_si32(lo);
        og[kQgemmMr] = _mm_extract_epi32(lo, 1);
        og[2 * kQgemmMr] = _mm_extract_epi32(lo, 2);
        og[3 * kQgemmMr] = _mm_extract_epi32(lo, 3);
        og[4 * kQgemmMr] = _mm_cvtsi128_si32(hi);
        og[5 * kQgemmMr] = _mm_extract_epi32(hi, 1);
        og[6 * kQgemmMr] = _mm_extract_epi32(hi, 2);
        og[7 * kQgemmMr] = _mm_extract_epi32(hi, 3);
      }
    }
    sum = _mm_cvtsi128_si64(sad) + _mm_extract_epi64(sad, 1);
  }
  if (want_sum) {
    for (int64_t p = g * kQgemmKb; p < k; ++p) sum += static_cast<uint8_t>(src[p * cs] ^ flip);
  }
  for (; g < full; ++g) o[g * kQgemmMr] = qgemm_a_word(src + g * kQgemmKb * cs, cs, kQgemmKb, flip);
  if (full < groups) {
    o[full * kQgemmMr] =
        qgemm_a_word(src + full * kQgemmKb * cs, cs, static_cast<int>(k - full * kQgemmKb), flip);
  }
  return want_sum ? sum : 0;
}

// Zero words for rows [rows, kQgemmMr) of a panel of `groups` groups.
inline void qgemm_pad_a(int rows, int64_t groups, int32_t* out) {
  for (int r = rows; r < kQgemmMr; ++r) {
    for (int64_t g = 0; g < groups; ++g) out[g * kQgemmMr + r] = 0;
  }
}

// rows (<= kQgemmMr) x k of A, element (r, p) at a[r * rs + p * cs] xor flip, into one panel;
// with row_sums, each row's sum of flipped values.
void qgemm_pack_a(const uint8_t* a, int64_t rs, int64_t cs, int rows, int64_t k, uint8_t flip,
                  int32_t* out, int32_t* row_sums) {
  for (int r = 0; r < rows; ++r) {
    const int64_t sum = qgemm_pack_a_row(a + r * rs, cs, k, flip, out + r, row_sums != nullptr);
    if (row_sums) row_sums[r] = static_cast<int32_t>(sum);
  }
  qgemm_pad_a(rows, (k + kQgemmKb - 1) / kQgemmKb, out);
}

// Columns [0, kCols) (8 or 16) of one k group of a full panel: row t of the group is kCols
// bytes at rows[t] (xor flip; a null row, past k, is zero); the kCols * kb interleaved
// bytes go to `out`.
template <int kCols>
inline void qgemm_pack_b_group(const uint8_t* const* rows, __m128i vflip, uint8_t* out) {
  __m128i x[kQgemmKb];
#pragma GCC unroll 4
  for (int t = 0; t < kQgemmKb; ++t) {
    if (!rows[t]) {
      x[t] = _mm_setzero_si128();
    } else if constexpr (kCols == 16) {
      x[t] = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[t])), vflip);
    } else {
      x[t] = _mm_xor_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[t])), vflip);
    }
  }
  auto store = [&](int at, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + at), v);
  };
  if constexpr (kQgemmKb == 2) {
    store(0, _mm_unpacklo_epi8(x[0], x[1]));
    if constexpr (kCols == 16) store(16, _mm_unpackhi_epi8(x[0], x[1]));
  } else {
    const __m128i p01 = _mm_unpacklo_epi8(x[0], x[1]), p23 = _mm_unpacklo_epi8(x[2], x[3]);
    store(0, _mm_unpacklo_epi16(p01, p23));
    store(16, _mm_unpackhi_epi16(p01, p23));
    if constexpr (kCols == 16) {
      const __m128i q01 = _mm_unpackhi_epi8(x[0], x[1]), q23 = _mm_unpackhi_epi8(x[2], x[3]);
      store(32, _mm_unpacklo_epi16(q01, q23));
      store(48, _mm_unpackhi_epi16(q01, q23));
    }
  }
}

// The column sums of one packed panel (as int8 values), with the tile's own multiply-add: an
// A word of ones in every lane.
inline void qgemm_panel_sums(const uint8_t* panel, int64_t groups, int32_t* sums) {
  const VI ones = viset1(kQgemmKb == 4 ? 0x01010101 : 0x00010001);
  VI s[kQgemmNv];
#pragma GCC unroll 4
  for (int v = 0; v < kQgemmNv; ++v) s[v] = viset1(0);
  for (int64_t g = 0; g < groups; ++g) {
#pragma GCC unroll 4
    for (int v = 0; v < kQgemmNv; ++v) {
      s[v] = QDot::madd(s[v], ones, QDot::load_b(panel + (g * kQgemmNr + v * kLanes) * kQgemmKb));
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < kQgemmNv; ++v) vistore(sums + v * kLanes, s[v]);
}

// k x n of B, element (p, j) at b[p * rs + j * cs] xor flip, into ceil(n / kQgemmNr) panels,
// and each column's sum of flipped values (as int8) into col_sums (zero past n).
void qgemm_pack_b(const uint8_t* b, int64_t rs, int64_t cs, int64_t k, int64_t n, uint8_t flip,
                  uint8_t* out, int32_t* col_sums) {
  const int64_t groups = (k + kQgemmKb - 1) / kQgemmKb;
  const int64_t panel_bytes = groups * kQgemmNr * kQgemmKb;
  const __m128i vflip = _mm_set1_epi8(static_cast<char>(flip));
  constexpr int kCols = kQgemmNr % 16 == 0 ? 16 : 8;
  for (int64_t j0 = 0; j0 < n; j0 += kQgemmNr) {
    const int cols = static_cast<int>(n - j0 < kQgemmNr ? n - j0 : kQgemmNr);
    uint8_t* panel = out + j0 / kQgemmNr * panel_bytes;
    if (cs == 1 && cols == kQgemmNr) {
      // Row-major and whole: kCols columns of a group at a time.
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* rows[kQgemmKb];
#pragma GCC unroll 4
        for (int t = 0; t < kQgemmKb; ++t) {
          const int64_t p = g * kQgemmKb + t;
          rows[t] = p < k ? b + p * rs + j0 : nullptr;
        }
        for (int c = 0; c < kQgemmNr; c += kCols) {
          const uint8_t* at[kQgemmKb];
#pragma GCC unroll 4
          for (int t = 0; t < kQgemmKb; ++t) at[t] = rows[t] ? rows[t] + c : nullptr;
          qgemm_pack_b_group<kCols>(at, vflip, panel + (g * kQgemmNr + c) * kQgemmKb);
        }
      }
    } else {
      for (int64_t g = 0; g < groups; ++g) {
        for (int t = 0; t < kQgemmKb; ++t) {
          const int64_t p = g * kQgemmKb + t;
          uint8_t* o = panel + g * kQgemmNr * kQgemmKb + t;
          int j = 0;
          if (p < k) {
            const uint8_t* src = b + p * rs + j0 * cs;
            for (; j < cols; ++j) o[j * kQgemmKb] = static_cast<uint8_t>(src[j * cs] ^ flip);
          }
          for (; j < kQgemmNr; ++j) o[j * kQgemmKb] = 0;
        }
      }
    }
    qgemm_panel_sums(panel, groups, col_sums + j0);
  }
}

// y[j] = saturate(round_half_even(float(acc[j]) * scale[j * scale_step]) + zero_point). The
// product is clamped to the output range less the zero point before it is converted (the
// bounds are integers, so clamping first rounds the same), so it never overflows int32.
void qgemm_requantize(const int32_t* acc, int64_t n, const float* scale, int scale_step,
                      int32_t zero_point, bool out_signed, uint8_t* y) {
  const VF lo = vset1(static_cast<float>((out_signed ? -128 : 0) - zero_point));
  const VF hi = vset1(static_cast<float>((out_signed ? 127 : 255) - zero_point));
  const VI zp = viset1(zero_point);
  const VF one_scale = vset1(scale[0]);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF s = scale_step ? vload(scale + j) : one_scale;
    const VF v = vmin(vmax(vmul(vcvt_float(viload(acc + j)), s), lo), hi);
    vstore_lo8(y + j, viadd(vcvt_int(v), zp));
  }
  if (j < n) {
    const int left = static_cast<int>(n - j);
    const VF s = scale_step ? vload_partial(scale + j, left) : one_scale;
    const VF v = vmin(vmax(vmul(vcvt_float(viload_partial(acc + j, left)), s), lo), hi);
    vstore_lo8_partial(y + j, viadd(vcvt_int(v), zp), left);
  }
}

// y[j] = float(acc[j]) * scale[j * scale_step] (+ bias[j]) (added to y[j] when accumulate),
// each step rounded to float as the scalar expression rounds it: the empty asm statement
// keeps the compiler from contracting the product and the bias into one fused multiply-add,
// which would round once (the unfused graph's Mul and Add round twice).
void qgemm_to_float(const int32_t* acc, int64_t n, const float* scale, int scale_step,
                    const float* bias, bool accumulate, float* y) {
  const VF one_scale = vset1(scale[0]);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    VF v = vmul(vcvt_float(viload(acc + j)), scale_step ? vload(scale + j) : one_scale);
    __asm__("" : "+v"(v));
    if (bias) v = vadd(v, vload(bias + j));
    if (accumulate) v = vadd(vload(y + j), v);
    vstore(y + j, v);
  }
  if (j < n) {
    const int left = static_cast<int>(n - j);
    VF v = vmul(vcvt_float(viload_partial(acc + j, left)),
                scale_step ? vload_partial(scale + j, left) : one_scale);
    __asm__("" : "+v"(v));
    if (bias) v = vadd(v, vload_partial(bias + j, left));
    if (accumulate) v = vadd(vload_partial(y + j, left), v);
    vstore_partial(y + j, v, left);
  }
}

void qgemm_quant_range(const float* x, int64_t n, float* lo, float* hi) {
  // vmin/vmax return their second operand when the first is NaN: NaNs are skipped.
  VF vlo = vzero(), vhi = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF v = vload(x + i);
    vlo = vmin(v, vlo);
    vhi = vmax(v, vhi);
  }
  alignas(64) float los[kLanes], his[kLanes];
  vstore(los, vlo);
  vstore(his, vhi);
  float mn = 0.0f, mx = 0.0f;
  for (int l = 0; l < kLanes; ++l) {
    mn = std::min(mn, los[l]);
    mx = std::max(mx, his[l]);
  }
  for (; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  *lo = mn;
  *hi = mx;
}

void qgemm_quantize_u8(const float* x, int64_t n, float scale, float zero_point, uint8_t* y) {
  const VF s = vset1(scale), z = vset1(zero_point), top = vset1(255.0f), bottom = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    // x / scale rounded to float, then half to even; a NaN leaves vmax as 0.
    const VF q = vadd(vround(vdiv(vload(x + i), s)), z);
    vstore_lo8(y + i, vcvt_int(vmin(vmax(q, bottom), top)));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF q = vadd(vround(vdiv(vload_partial(x + i, left), s)), z);
    vstore_lo8_partial(y + i, vcvt_int(vmin(vmax(q, bottom), top)), left);
  }
}

// rows (<= kQgemmMr) x k of float A (row stride lda) quantized as qgemm_quantize_u8 does
// (row r with scale[r * param_step] and zero_point[r * param_step]) straight into one panel,
// as qgemm_pack_a packs uint8 A (no flip); with row_sums, each row's sum of quantized values.
// A row goes through a small stack buffer a chunk at a time, which stays in L1, so the
// quantized tensor is never written out.
void qgemm_pack_a_quantized(const float* a, int64_t lda, int rows, int64_t k, const float* scale,
                            const float* zero_point, int param_step, int32_t* out,
                            int32_t* row_sums) {
  constexpr int64_t kChunk = 256;  // a multiple of kQgemmKb and of 16
  alignas(64) uint8_t buf[kChunk];
  for (int r = 0; r < rows; ++r) {
    int64_t sum = 0;
    const float row_scale = scale[r * param_step], row_zero = zero_point[r * param_step];
    for (int64_t p0 = 0; p0 < k; p0 += kChunk) {
      const int64_t len = k - p0 < kChunk ? k - p0 : kChunk;
      qgemm_quantize_u8(a + r * lda + p0, len, row_scale, row_zero, buf);
      sum +=
          qgemm_pack_a_row(buf, 1, len, 0, out + r + p0 / kQgemmKb * kQgemmMr, row_sums != nullptr);
    }
    if (row_sums) row_sums[r] = static_cast<int32_t>(sum);
  }
  qgemm_pad_a(rows, (k + kQgemmKb - 1) / kQgemmKb, out);
}

constexpr Int8GemmKernels kInt8GemmKernels{.layout = QDot::kName,
                                           .mr = kQgemmMr,
                                           .nr = kQgemmNr,
                                           .kb = kQgemmKb,
                                           .pack_a = qgemm_pack_a,
                                           .pack_b = qgemm_pack_b,
                                           .kernel = qgemm_kernel,
                                           .requantize = qgemm_requantize,
                                           .to_float = qgemm_to_float,
                                           .quant_range = qgemm_quant_range,
                                           .quantize_u8 = qgemm_quantize_u8,
                                           .pack_a_quantized = qgemm_pack_a_quantized};
