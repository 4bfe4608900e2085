// MatMulNBits with int8 activations (accuracy_level 4, onnxruntime's "CompInt8"): each row of
// A is quantized per block of B to int8, symmetric, one float scale per block (scale =
// amax / 127, values rounded to nearest even, as onnxruntime's QuantizeARow), and each block
// of a column is an integer dot product of those bytes with the 4-bit values:
//   sum_p a_p (q_p - z) s ~= s sa (sum_p qa_p q_p) - s z (sa sum_p qa_p),
// the last factor (A's scale times its quantized block sum) computed once per row.
//
// Within a block the quantized row is in chunks of 32 values (16 bytes of B), each chunk's
// even-indexed values first, then its odd-indexed ones: the order its low and high nibbles
// come out in. Levels with AVX2 multiply 32 bytes at a time (`NBitsDot`, defined before this
// file: pmaddubsw, or vpdpbusd where AVX512-VNNI is compiled in); the generic level and blocks
// narrower than a chunk use plain loops. Included by each ops/math/isa_*.cpp inside its
// namespace (the avx512 level twice); includes nothing.

constexpr int64_t kNBitsChunk = 32;

// Where value p of a block of bs values goes in the quantized row.
inline int64_t nbits_i8_position(int64_t p, int64_t bs, int bits) {
  if (bits != 4) return p;
  const int64_t c = bs < kNBitsChunk ? bs : kNBitsChunk, i = p % c;
  return p - i + (i % 2) * (c / 2) + i / 2;
}

// x rounded to the nearest integer, ties to even (the default rounding mode), clamped to int8.
inline int8_t nbits_i8_round(float x) {
  x = x < -127.0f ? -127.0f : (x > 127.0f ? 127.0f : x);
  return static_cast<int8_t>(_mm_cvtss_si32(_mm_set_ss(x)));
}

void nbits_quantize_a(const float* a, int64_t lda, int rows, const NBitsMatrix& b, int8_t* out,
                      float* scales, float* sums) {
  const int64_t bs = b.block, padded = b.blocks * bs;
  for (int r = 0; r < rows; ++r) {
    for (int64_t blk = 0; blk < b.blocks; ++blk) {
      const int64_t p0 = blk * bs, len = b.k - p0 < bs ? b.k - p0 : bs;
      const float* ab = a + r * lda + p0;
      int8_t* ob = out + r * padded + p0;
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i)
        amax = ab[i] > amax ? ab[i] : (-ab[i] > amax ? -ab[i] : amax);
      const float scale = amax / 127.0f, inv = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t i = 0; i < bs; ++i) ob[i] = 0;
      int32_t sum = 0;
      for (int64_t i = 0; i < len; ++i) {
        const int8_t q = nbits_i8_round(ab[i] * inv);
        ob[nbits_i8_position(i, bs, b.bits)] = q;
        sum += q;
      }
      scales[r * b.blocks + blk] = scale;
      sums[r * b.blocks + blk] = scale * static_cast<float>(sum);
    }
  }
}

// One block's integer dot product with one quantized row (plain loops).
inline int32_t nbits_i8_block_dot(const int8_t* ab, const uint8_t* q, const NBitsMatrix& b) {
  const int64_t bytes = b.block_bytes();
  int32_t acc = 0;
  if (b.bits != 4) {
    for (int64_t i = 0; i < bytes; ++i) acc += ab[i] * static_cast<int32_t>(q[i]);
    return acc;
  }
  const int64_t c = b.block < kNBitsChunk ? b.block : kNBitsChunk, h = c / 2;
  for (int64_t i = 0; i < bytes; ++i) {
    const int8_t* ac = ab + i / h * c + i % h;
    acc += ac[0] * (q[i] & 15) + ac[h] * (q[i] >> 4);
  }
  return acc;
}

inline void nbits_i8_columns_scalar(const int8_t* a, const float* sa, const float* sums, int rows,
                                    const NBitsMatrix& b, int64_t j0, int64_t j1, float* y,
                                    int64_t ldy) {
  const int64_t bs = b.block, bytes = b.block_bytes(), padded = b.blocks * bs;
  for (int r = 0; r < rows; ++r) {
    for (int64_t j = j0; j < j1; ++j) {
      const uint8_t* q = b.data + j * b.blocks * bytes;
      float total = 0.0f;
      for (int64_t blk = 0; blk < b.blocks; ++blk, q += bytes) {
        const int64_t i = r * b.blocks + blk;
        const int32_t dot = nbits_i8_block_dot(a + r * padded + blk * bs, q, b);
        total += b.scales[j * b.blocks + blk] *
                 (sa[i] * static_cast<float>(dot) - b.zero_point(j, blk) * sums[i]);
      }
      y[r * ldy + j] = total;
    }
  }
}

#if defined(__AVX2__)
inline float nbits_i8_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Block `blk` of one column (bytes at q) times Rows quantized rows: total[r] += s sa (qa . q)
// in 8 lanes, shift[r] += s z (sa sum qa).
template <int Rows>
inline void nbits_i8_block(const int8_t* a, int64_t lda, const float* sa, const float* sums,
                           const NBitsMatrix& b, int64_t j, int64_t blk, const uint8_t* q,
                           __m256* total, float* shift) {
  const int64_t bytes = b.block_bytes();
  const int8_t* ab = a + blk * b.block;
  const __m128i low = _mm_set1_epi8(15);
  __m256i acc[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_si256();
  for (int64_t i = 0; i < bytes; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    const __m256i w =
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
    for (int r = 0; r < Rows; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + r * lda + 2 * i));
      acc[r] = NBitsDot::dot(acc[r], w, x);
    }
  }
  const float s = b.scales[j * b.blocks + blk], zs = s * b.zero_point(j, blk);
  for (int r = 0; r < Rows; ++r) {
    const int64_t k = r * b.blocks + blk;
    total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_set1_ps(s * sa[k]), total[r]);
    shift[r] += zs * sums[k];
  }
}

// One column times Rows quantized rows; even and odd blocks into separate sums, as the float
// gemv does, so one row is not one chain of dependent multiply-adds.
template <int Rows>
inline void nbits_i8_column(const int8_t* a, const float* sa, const float* sums,
                            const NBitsMatrix& b, int64_t j, float* y, int64_t ldy) {
  const int64_t bytes = b.block_bytes(), lda = b.blocks * b.block;
  const uint8_t* q = b.data + j * b.blocks * bytes;
  __m256 total[2][Rows];
  float shift[2][Rows];
  for (int r = 0; r < Rows; ++r) {
    total[0][r] = total[1][r] = _mm256_setzero_ps();
    shift[0][r] = shift[1][r] = 0.0f;
  }
  int64_t blk = 0;
  for (; blk + 1 < b.blocks; blk += 2, q += 2 * bytes) {
    nbits_i8_block<Rows>(a, lda, sa, sums, b, j, blk, q, total[0], shift[0]);
    nbits_i8_block<Rows>(a, lda, sa, sums, b, j, blk + 1, q + bytes, total[1], shift[1]);
  }
  if (blk < b.blocks) nbits_i8_block<Rows>(a, lda, sa, sums, b, j, blk, q, total[0], shift[0]);
  for (int r = 0; r < Rows; ++r) {
    y[r * ldy] =
        nbits_i8_hsum(_mm256_add_ps(total[0][r], total[1][r])) - (shift[0][r] + shift[1][r]);
  }
}

#if defined(__AVX512BW__)
// One row and blocks of 32 on 512-bit vectors: a pair of blocks per step, the low eight
// int32 lanes the first block's, the high eight the second's, each scaled by its pair of
// scales spread over its lanes. Steps alternate between two sums, as in nbits_i8_column.
inline void nbits_i8_pair(const int8_t* a, const float* sa, const float* sums, const NBitsMatrix& b,
                          int64_t j, int64_t blk, __m512& total, float& shift) {
  const uint8_t* q = b.data + (j * b.blocks + blk) * 16;
  const __m256i low = _mm256_set1_epi8(15);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  // [low nibbles of both blocks | high nibbles of both], then block by block.
  const __m512i halves = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low)),
                                            _mm256_and_si256(_mm256_srli_epi16(v, 4), low), 1);
  const __m512i w = _mm512_shuffle_i64x2(halves, halves, _MM_SHUFFLE(3, 1, 2, 0));
  const __m512i x = _mm512_loadu_si512(a + blk * 32);
  const __m512i d = NBitsDot::dot512(_mm512_setzero_si512(), w, x);
  const float* s = b.scales + j * b.blocks + blk;
  // Two floats each (the pair's scales), loaded unaligned (_mm_loadl_epi64 makes no
  // alignment claim; a double load of a float pointer would).
  const __m128 sc =
      _mm_mul_ps(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s))),
                 _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sa + blk))));
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
                          _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(sc)), total);
  float z0 = 8.0f, z1 = 8.0f;
  if (b.zero_points) {  // blk is even: one byte holds both blocks' zero points
    const uint8_t zp = b.zero_points[j * b.zp_bytes() + blk / 2];
    z0 = static_cast<float>(zp & 15);
    z1 = static_cast<float>(zp >> 4);
  } else if (b.float_zero_points) {
    z0 = b.float_zero_points[j * b.blocks + blk];
    z1 = b.float_zero_points[j * b.blocks + blk + 1];
  }
  shift += s[0] * z0 * sums[blk] + s[1] * z1 * sums[blk + 1];
}

inline void nbits_i8_column_pairs(const int8_t* a, const float* sa, const float* sums,
                                  const NBitsMatrix& b, int64_t j, float* y) {
  __m512 total[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  float shift[2] = {0.0f, 0.0f};
  int64_t blk = 0;
  for (; blk + 3 < b.blocks; blk += 4) {
    nbits_i8_pair(a, sa, sums, b, j, blk, total[0], shift[0]);
    nbits_i8_pair(a, sa, sums, b, j, blk + 2, total[1], shift[1]);
  }
  if (blk + 1 < b.blocks) {
    nbits_i8_pair(a, sa, sums, b, j, blk, total[0], shift[0]);
    blk += 2;
  }
  float rest = 0.0f;
  if (blk < b.blocks) {
    const uint8_t* q = b.data + (j * b.blocks + blk) * 16;
    const float s = b.scales[j * b.blocks + blk];
    rest = s * (sa[blk] * static_cast<float>(nbits_i8_block_dot(a + blk * 32, q, b)) -
                b.zero_point(j, blk) * sums[blk]);
  }
  *y = _mm512_reduce_add_ps(_mm512_add_ps(total[0], total[1])) - (shift[0] + shift[1]) + rest;
}
#endif

template <int Rows>
inline void nbits_i8_columns(const int8_t* a, const float* sa, const float* sums,
                             const NBitsMatrix& b, int64_t j0, int64_t j1, float* y, int64_t ldy) {
#if defined(__AVX512BW__)
  if (Rows == 1 && b.block == 32) {
    for (int64_t j = j0; j < j1; ++j) nbits_i8_column_pairs(a, sa, sums, b, j, y + j);
    return;
  }
#endif
  for (int64_t j = j0; j < j1; ++j) nbits_i8_column<Rows>(a, sa, sums, b, j, y + j, ldy);
}
#endif

void nbits_gemv_int8(const int8_t* a, const float* sa, const float* sums, int rows,
                     const NBitsMatrix& b, int64_t j0, int64_t j1, float* y, int64_t ldy) {
#if defined(__AVX2__)
  if (b.bits == 4 && b.block % kNBitsChunk == 0) {
    switch (rows) {
      case 1:
        return nbits_i8_columns<1>(a, sa, sums, b, j0, j1, y, ldy);
      case 2:
        return nbits_i8_columns<2>(a, sa, sums, b, j0, j1, y, ldy);
      case 3:
        return nbits_i8_columns<3>(a, sa, sums, b, j0, j1, y, ldy);
      default:
        return nbits_i8_columns<4>(a, sa, sums, b, j0, j1, y, ldy);
    }
  }
#endif
  nbits_i8_columns_scalar(a, sa, sums, rows, b, j0, j1, y, ldy);
}
