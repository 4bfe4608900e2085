// Products with block-quantized 4- and 8-bit weights (com.microsoft.MatMulNBits), written once
// against the level's vector type. Included by each ops/math/isa_*.cpp inside its namespace;
// includes nothing.
//
// A decode step multiplies one row (or a few) by a weight matrix that is read once, so the
// product is bound by how fast the packed weights stream in. gemv reads each column's blocks
// once and widens kLanes bytes at a time to floats in registers. Every row of A is first
// reordered (prepare_a) to the order the nibbles come out of a byte vector: the low nibbles
// of a 4-bit block's bytes are its even-indexed values, the high ones its odd-indexed ones.
// The zero point then leaves the inner loop:
//   sum_p a_p (q_p - z) s = s (sum_p a_p q_p - z sum_p a_p),
// with sum_p a_p per block computed once per row by prepare_a.

constexpr int kNBitsRows = 4;

void nbits_prepare_a(const float* a, int64_t lda, int rows, const NBitsMatrix& b, float* out,
                     float* sums) {
  const int64_t bs = b.block, half = bs / 2, padded = b.blocks * bs;
  for (int r = 0; r < rows; ++r) {
    const float* ar = a + r * lda;
    float* o = out + r * padded;
    for (int64_t blk = 0; blk < b.blocks; ++blk) {
      const int64_t p0 = blk * bs, len = b.k - p0 < bs ? b.k - p0 : bs;
      float* ob = o + p0;
      for (int64_t i = 0; i < bs; ++i) ob[i] = 0.0f;
      float sum = 0.0f;
      for (int64_t i = 0; i < len; ++i) {
        const float v = ar[p0 + i];
        sum += v;
        ob[b.bits == 4 ? (i % 2) * half + i / 2 : i] = v;
      }
      sums[r * b.blocks + blk] = sum;
    }
  }
}

// Block `blk` of one column (bytes at q) times Rows rows of prepared A: total[r] += scale *
// (a . q), shift[r] += scale * zero point * the rows' block sums.
template <int Rows, int Bits>
inline void nbits_block(const float* a, int64_t lda, const float* sums, const NBitsMatrix& b,
                        int64_t j, int64_t blk, const uint8_t* q, VF* total, float* shift) {
  const int64_t bytes = b.block_bytes();
  const float* ab = a + blk * b.block;
  const VI low = viset1(15);
  VF acc[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = vzero();
  for (int64_t i = 0; i < bytes; i += kLanes) {
    const VI v = vload_u8(q + i);
    if constexpr (Bits == 4) {
      const VF lo = vcvt_float(viand(v, low)), hi = vcvt_float(vshr<4>(v));
      for (int r = 0; r < Rows; ++r) {
        acc[r] = vfmadd(vload(ab + r * lda + i), lo, acc[r]);
        acc[r] = vfmadd(vload(ab + r * lda + bytes + i), hi, acc[r]);
      }
    } else {
      const VF w = vcvt_float(v);
      for (int r = 0; r < Rows; ++r) acc[r] = vfmadd(vload(ab + r * lda + i), w, acc[r]);
    }
  }
  const float s = b.scales[j * b.blocks + blk], zs = s * b.zero_point(j, blk);
  const VF sv = vset1(s);
  for (int r = 0; r < Rows; ++r) {
    total[r] = vfmadd(acc[r], sv, total[r]);
    shift[r] += zs * sums[r * b.blocks + blk];
  }
}

// One column of B times Rows rows of prepared A (row stride lda): y[r * ldy]. For one row,
// even and odd blocks add into separate sums: a single chain of dependent multiply-adds
// would bound it at one block per multiply-add latency (more rows are chains of their own).
template <int Rows, int Bits>
inline void nbits_column(const float* a, int64_t lda, const float* sums, const NBitsMatrix& b,
                         int64_t j, float* y, int64_t ldy) {
  const int64_t bytes = b.block_bytes();
  const uint8_t* q = b.data + j * b.blocks * bytes;
  VF total[2][Rows];
  float shift[2][Rows];
  for (int r = 0; r < Rows; ++r) {
    total[0][r] = total[1][r] = vzero();
    shift[0][r] = shift[1][r] = 0.0f;
  }
  int64_t blk = 0;
  if constexpr (Rows == 1) {
    for (; blk + 1 < b.blocks; blk += 2, q += 2 * bytes) {
      nbits_block<Rows, Bits>(a, lda, sums, b, j, blk, q, total[0], shift[0]);
      nbits_block<Rows, Bits>(a, lda, sums, b, j, blk + 1, q + bytes, total[1], shift[1]);
    }
  }
  for (; blk < b.blocks; ++blk, q += bytes) {
    nbits_block<Rows, Bits>(a, lda, sums, b, j, blk, q, total[0], shift[0]);
  }
  for (int r = 0; r < Rows; ++r) {
    y[r * ldy] = vreduce_add(vadd(total[0][r], total[1][r])) - (shift[0][r] + shift[1][r]);
  }
}

// The same one value at a time, for blocks narrower than a vector's bytes.
inline void nbits_column_scalar(const float* a, int64_t lda, int rows, const float* sums,
                                const NBitsMatrix& b, int64_t j, float* y, int64_t ldy) {
  const int64_t bs = b.block, bytes = b.block_bytes();
  for (int r = 0; r < rows; ++r) {
    const uint8_t* q = b.data + j * b.blocks * bytes;
    float total = 0.0f;
    for (int64_t blk = 0; blk < b.blocks; ++blk, q += bytes) {
      const float* ab = a + r * lda + blk * bs;
      float acc = 0.0f;
      for (int64_t i = 0; i < bytes; ++i) {
        if (b.bits == 4) {
          acc +=
              ab[i] * static_cast<float>(q[i] & 15) + ab[bytes + i] * static_cast<float>(q[i] >> 4);
        } else {
          acc += ab[i] * static_cast<float>(q[i]);
        }
      }
      const float s = b.scales[j * b.blocks + blk];
      total += s * (acc - b.zero_point(j, blk) * sums[r * b.blocks + blk]);
    }
    y[r * ldy] = total;
  }
}

template <int Rows>
inline void nbits_columns(const float* a, const float* sums, const NBitsMatrix& b, int64_t j0,
                          int64_t j1, float* y, int64_t ldy) {
  const int64_t lda = b.blocks * b.block;
  for (int64_t j = j0; j < j1; ++j) {
    if (b.block_bytes() % kLanes != 0) {
      nbits_column_scalar(a, lda, Rows, sums, b, j, y + j, ldy);
    } else if (b.bits == 4) {
      nbits_column<Rows, 4>(a, lda, sums, b, j, y + j, ldy);
    } else {
      nbits_column<Rows, 8>(a, lda, sums, b, j, y + j, ldy);
    }
  }
}

void nbits_gemv(const float* a, const float* sums, int rows, const NBitsMatrix& b, int64_t j0,
                int64_t j1, float* y, int64_t ldy) {
  switch (rows) {
    case 1:
      return nbits_columns<1>(a, sums, b, j0, j1, y, ldy);
    case 2:
      return nbits_columns<2>(a, sums, b, j0, j1, y, ldy);
    case 3:
      return nbits_columns<3>(a, sums, b, j0, j1, y, ldy);
    default:
      return nbits_columns<4>(a, sums, b, j0, j1, y, ldy);
  }
}

// Columns [j0, j1) of B dequantized, column j into the row out + (j - j0) * blocks * block in
// prepare_a's order (4-bit blocks: even-indexed values, then odd-indexed ones), so that a
// product of prepared rows of A with these rows is A times B. Vectors as in gemv:
// w = q s - z s, one multiply-add per value; the values past k are finite and meet A's zeros.
void nbits_dequantize_rows(const NBitsMatrix& b, int64_t j0, int64_t j1, float* out) {
  const int64_t bs = b.block, bytes = b.block_bytes(), padded = b.blocks * bs;
  const bool vector = bytes % kLanes == 0;
  const VI low = viset1(15);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* q = b.data + j * b.blocks * bytes;
    float* o = out + (j - j0) * padded;
    for (int64_t blk = 0; blk < b.blocks; ++blk, q += bytes, o += bs) {
      const float s = b.scales[j * b.blocks + blk], zs = -s * b.zero_point(j, blk);
      if (!vector) {
        for (int64_t i = 0; i < bytes; ++i) {
          if (b.bits == 4) {
            o[i] = static_cast<float>(q[i] & 15) * s + zs;
            o[bytes + i] = static_cast<float>(q[i] >> 4) * s + zs;
          } else {
            o[i] = static_cast<float>(q[i]) * s + zs;
          }
        }
        continue;
      }
      const VF sv = vset1(s), zv = vset1(zs);
      for (int64_t i = 0; i < bytes; i += kLanes) {
        const VI v = vload_u8(q + i);
        if (b.bits == 4) {
          vstore(o + i, vfmadd(vcvt_float(viand(v, low)), sv, zv));
          vstore(o + bytes + i, vfmadd(vcvt_float(vshr<4>(v)), sv, zv));
        } else {
          vstore(o + i, vfmadd(vcvt_float(v), sv, zv));
        }
      }
    }
  }
}

constexpr NBitsKernels kNBitsKernels{.max_rows = kNBitsRows,
                                     .prepare_a = nbits_prepare_a,
                                     .gemv = nbits_gemv,
                                     .dequantize_rows = nbits_dequantize_rows,
                                     .quantize_a = nbits_quantize_a,
                                     .gemv_int8 = nbits_gemv_int8};
