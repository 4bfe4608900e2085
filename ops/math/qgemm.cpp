#include "ops/math/qgemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "ops/math/threading.h"

namespace kiln::math {
namespace {

// The largest register tile any level uses, for the driver's per-tile arrays.
constexpr int kMaxMr = 16, kMaxNr = 64;
// A row block of packed A (mc rows x all of k) and a column block of B lowered by a filler
// (all of k x nc) are sized to stay in L2 while the tiles sweep them.
constexpr int64_t kABlockBytes = 256 << 10;
constexpr int64_t kBBlockBytes = 128 << 10;

std::atomic<uint64_t> b_packs{0};

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Sums and products modulo 2^32, as int32 accumulation wraps (without signed overflow).
int32_t wrap_add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
int32_t wrap_mul(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}

// A 64-byte aligned scratch buffer per thread and purpose, grown on demand and kept. Used
// only inside a task body, which starts no other task, so no other product on this thread
// can take it meanwhile.
struct Scratch {
  void* data = nullptr;
  int64_t size = 0;
  ~Scratch() { std::free(data); }
  template <typename T>
  T* get(int64_t count) {
    const int64_t bytes =
        std::max<int64_t>(64, round_up(count * static_cast<int64_t>(sizeof(T)), 64));
    if (bytes > size) {
      std::free(data);
      data = std::aligned_alloc(64, static_cast<size_t>(bytes));
      if (!data) throw std::bad_alloc();
      size = bytes;
    }
    return static_cast<T*>(data);
  }
};

enum ScratchUse { kAPanels, kRowSums, kBRaw, kBPanels, kColSums, kColTerms, kScratchCount };

Scratch& scratch(ScratchUse use) {
  thread_local Scratch s[kScratchCount];
  return s[use];
}

std::shared_ptr<uint8_t[]> aligned_bytes(int64_t bytes) {
  return std::shared_ptr<uint8_t[]>(new (std::align_val_t(64))
                                        uint8_t[static_cast<size_t>(std::max<int64_t>(bytes, 1))],
                                    [](uint8_t* p) { operator delete[](p, std::align_val_t(64)); });
}

const MathKernels& table_of(const MathKernels* t) {
  return t ? *t : kernels();
}

int64_t groups_of(int64_t k, const Int8GemmKernels& t) {
  return (k + t.kb - 1) / t.kb;
}

// How the zero points and biases of one product enter its tiles (see qgemm.h):
//   R = C' - za'_i * P_j - zb'_j * rowsum_i + row_bias_i + col_bias_j,
//   P_j = colsum_j - K * zb'_j,
// as the tile's row_add[i] + col_add[j] + row_mul[i] * col_mul[j], plus, only when both zero
// points are vectors, the term -zb'_j * rowsum_i applied after the tile.
struct Plan {
  const MathKernels* table = nullptr;
  const Int8GemmKernels* t = nullptr;
  const QGemmOutput* out = nullptr;
  const QGemmOptions* o = nullptr;
  int64_t m = 0, n = 0, k = 0, groups = 0;
  uint8_t a_flip = 0, b_flip = 0;
  int32_t a_off = 0, b_off = 0;  // za' = za + a_off, zb' = zb - b_off
  int32_t za = 0, zb = 0;        // the flipped scalar zero points
  bool za_rows = false, zb_cols = false;
  bool use_row_add = false, use_col_add = false, product = false, extra = false;
  bool need_row_sums = false;

  int32_t za_of(int64_t i) const { return za_rows ? wrap_add(o->a_zeros[i], a_off) : za; }
  int32_t zb_of(int64_t j) const { return zb_cols ? wrap_add(o->b_zeros[j], -b_off) : zb; }
};

Plan make_plan(const MathKernels& table, int64_t m, int64_t n, int64_t k, bool a_signed,
               bool b_signed, const QGemmOutput& out, const QGemmOptions& o) {
  const Int8GemmKernels& t = table.int8_gemm;
  if (t.mr > kMaxMr || t.nr > kMaxNr) {
    throw Error(ErrorKind::Runtime, "qgemm: the int8 tile is larger than the driver supports");
  }
  if (!out.c && !out.y && !out.f) throw Error(ErrorKind::Runtime, "qgemm: no output given");
  if (out.f && (!out.f_scales || (out.f_scale_cs != 0 && out.f_scale_cs != 1))) {
    throw Error(ErrorKind::Runtime,
                "qgemm: float output needs scales with a column step of 0 or 1");
  }
  if (out.y && (!out.scales || (out.scale_cs != 0 && out.scale_cs != 1))) {
    throw Error(ErrorKind::Runtime,
                "qgemm: requantized output needs scales with a column step of 0 or 1");
  }
  Plan p;
  p.table = &table;
  p.t = &t;
  p.out = &out;
  p.o = &o;
  p.m = m, p.n = n, p.k = k, p.groups = groups_of(k, t);
  p.a_flip = a_signed ? 0x80 : 0;
  p.b_flip = b_signed ? 0 : 0x80;
  p.a_off = a_signed ? 128 : 0;
  p.b_off = b_signed ? 0 : 128;
  p.za_rows = o.a_zeros != nullptr;
  p.zb_cols = o.b_zeros != nullptr;
  p.za = wrap_add(o.a_zero, p.a_off);
  p.zb = wrap_add(o.b_zero, -p.b_off);
  p.product = p.za_rows || p.zb_cols;
  p.extra = p.za_rows && p.zb_cols;
  p.need_row_sums = p.zb_cols || p.zb != 0;
  p.use_row_add = o.row_bias || (!p.zb_cols && p.zb != 0);
  p.use_col_add = o.col_bias || (!p.za_rows && p.za != 0);
  return p;
}

// The column arrays of columns [j0, j0 + count) (count a multiple of nr past the end).
struct ColumnTerms {
  const int32_t* add = nullptr;  // col_add, or null
  const int32_t* mul = nullptr;  // col_mul, or null
  const int32_t* zb = nullptr;   // zb'_j, for the term after the tile, or null
  ColumnTerms at(int64_t j) const {
    return {add ? add + j : nullptr, mul ? mul + j : nullptr, zb ? zb + j : nullptr};
  }
};

// Fills `buf` (3 x padded entries) with the terms of columns [j0, j0 + count) from their
// column sums `cs`; entries past count are zero.
ColumnTerms column_terms(const Plan& p, int64_t j0, int64_t count, int64_t padded,
                         const int32_t* cs, int32_t* buf) {
  int32_t* add = buf;
  int32_t* mul = buf + padded;
  int32_t* zbv = buf + 2 * padded;
  const int32_t kk = static_cast<int32_t>(static_cast<uint32_t>(p.k));
  for (int64_t j = 0; j < padded; ++j) {
    if (j >= count) {
      add[j] = mul[j] = zbv[j] = 0;
      continue;
    }
    const int32_t zb = p.zb_of(j0 + j);
    const int32_t pj = wrap_add(cs[j], -wrap_mul(kk, zb));
    const int32_t bias = p.o->col_bias ? p.o->col_bias[j0 + j] : 0;
    add[j] = p.za_rows ? bias : wrap_add(bias, -wrap_mul(p.za, pj));
    mul[j] = p.za_rows ? pj : zb;
    zbv[j] = zb;
  }
  ColumnTerms t;
  t.add = p.use_col_add ? add : nullptr;
  t.mul = p.product ? mul : nullptr;
  t.zb = p.extra ? zbv : nullptr;
  return t;
}

// The float output of a finished tile (dst, row stride ld) at rows [i, i + rows) x columns
// [j, j + cols), converted by the level's vector kernel, then activated while in cache.
void to_float(const MathKernels& table, const QGemmOutput& out, const int32_t* dst, int64_t ld,
              int64_t i, int64_t j, int rows, int cols) {
  const float* scale = out.f_scales + j * out.f_scale_cs;
  const float* bias = out.f_bias ? out.f_bias + j : nullptr;
  alignas(64) float row_scaled[kMaxNr];
  for (int r = 0; r < rows; ++r) {
    float* f = out.f + (i + r) * out.ldf + j;
    const float* s = scale;
    int step = static_cast<int>(out.f_scale_cs);
    if (out.f_row_scales) {
      // The row's scale folded into the column scales of this tile: one product per column
      // here instead of one per element in the conversion.
      const float rs = out.f_row_scales[i + r];
      for (int c = 0; c < cols; ++c) row_scaled[c] = rs * scale[c * step];
      s = row_scaled;
      step = 1;
    }
    table.int8_gemm.to_float(dst + r * ld, cols, s, step, bias, out.f_accumulate, f);
    if (out.f_row_bias) {
      const float rb = out.f_row_bias[i + r];
      for (int c = 0; c < cols; ++c) f[c] += rb;
    }
    activate(out.f_activation, f, cols, table);
  }
}

// One register tile: rows [i, i + rows) x columns [j, j + cols), with `rs` the row sums of
// those rows (null when the plan needs none), `ct` the column terms at column j.
void tile(const Plan& p, const int32_t* a, const uint8_t* b, int64_t i, int64_t j, int rows,
          int cols, const int32_t* rs, const ColumnTerms& ct) {
  const QGemmOptions& o = *p.o;
  const QGemmOutput& out = *p.out;
  int32_t row_add[kMaxMr], row_mul[kMaxMr];
  Int8TileFix fix;
  fix.col_add = ct.add;
  if (p.use_row_add) {
    for (int r = 0; r < rows; ++r) {
      int32_t v = o.row_bias ? o.row_bias[i + r] : 0;
      if (!p.zb_cols) v = wrap_add(v, -wrap_mul(p.zb, rs ? rs[r] : 0));
      row_add[r] = v;
    }
    fix.row_add = row_add;
  }
  if (p.product) {
    for (int r = 0; r < rows; ++r) {
      row_mul[r] = p.za_rows ? -p.za_of(i + r) : -rs[r];
    }
    fix.row_mul = row_mul;
    fix.col_mul = ct.mul;
  }
  alignas(64) int32_t buf[kMaxMr * kMaxNr];
  int32_t* dst = buf;
  int64_t ld = p.t->nr;
  if (out.c) {
    dst = out.c + i * out.ldc + j;
    ld = out.ldc;
  }
  p.t->kernel(p.groups, a, b, dst, ld, rows, cols, fix);
  if (p.extra) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        dst[r * ld + c] = wrap_add(dst[r * ld + c], -wrap_mul(ct.zb[c], rs[r]));
      }
    }
  }
  if (out.y) {
    for (int r = 0; r < rows; ++r) {
      const int64_t row = i + r;
      const int32_t zp = out.y_zero_points ? out.y_zero_points[row * out.y_zero_rs] : 0;
      p.t->requantize(dst + r * ld, cols, out.scales + row * out.scale_rs + j * out.scale_cs,
                      out.scale_cs ? 1 : 0, zp, out.y_signed, out.y + row * out.ldy + j);
    }
  }
  if (out.f) to_float(*p.table, out, dst, ld, i, j, rows, cols);
}

// Rows of A packed at once: a multiple of the tile rows, mc x k within kABlockBytes.
int64_t row_block(const Plan& p) {
  const int mr = p.t->mr;
  const int64_t fit = kABlockBytes / std::max<int64_t>(1, p.groups * 4) / mr * mr;
  return std::clamp<int64_t>(fit, mr, 16 * mr);
}

// Columns of B lowered and packed at once by a filler.
int64_t col_block(const Plan& p) {
  const int nr = p.t->nr;
  const int64_t fit = kBBlockBytes / std::max<int64_t>(1, p.groups * p.t->kb) / nr * nr;
  return std::clamp<int64_t>(fit, nr, 16 * nr);
}

// A packed a row block at a time by pack_rows(i, rows, out, row_sums) (rows <= mr), packed
// B: rows [m0, m1) x columns [n0, n1) (n0 a multiple of nr).
template <typename PackRows>
void run_a_rows(const Plan& p, const PackRows& pack_rows, const uint8_t* b, const ColumnTerms& ct,
                int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const Int8GemmKernels& t = *p.t;
  const int mr = t.mr, nr = t.nr;
  const int64_t mc = row_block(p);
  const int64_t panel_bytes = p.groups * nr * t.kb;
  int32_t* apack = scratch(kAPanels).get<int32_t>(mc * std::max<int64_t>(p.groups, 1));
  int32_t* rsum = p.need_row_sums ? scratch(kRowSums).get<int32_t>(mc) : nullptr;
  for (int64_t i0 = m0; i0 < m1; i0 += mc) {
    const int64_t rows = std::min(mc, m1 - i0);
    for (int64_t r = 0; r < rows; r += mr) {
      const int tr = static_cast<int>(std::min<int64_t>(mr, rows - r));
      pack_rows(i0 + r, tr, apack + r * p.groups, rsum ? rsum + r : nullptr);
    }
    for (int64_t j0 = n0; j0 < n1; j0 += nr) {
      const int tc = static_cast<int>(std::min<int64_t>(nr, n1 - j0));
      const uint8_t* bp = b + j0 / nr * panel_bytes;
      for (int64_t r = 0; r < rows; r += mr) {
        const int tr = static_cast<int>(std::min<int64_t>(mr, rows - r));
        tile(p, apack + r * p.groups, bp, i0 + r, j0, tr, tc, rsum ? rsum + r : nullptr, ct.at(j0));
      }
    }
  }
}

// Strided A, packed B.
void run_a_view(const Plan& p, const QMatrixView& a, const uint8_t* b, const ColumnTerms& ct,
                int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const auto* ad = static_cast<const uint8_t*>(a.data);
  const auto pack = [&](int64_t i, int rows, int32_t* out, int32_t* sums) {
    p.t->pack_a(ad + i * a.rs, a.rs, a.cs, rows, p.k, p.a_flip, out, sums);
  };
  run_a_rows(p, pack, b, ct, m0, m1, n0, n1);
}

// Packed A, B from a filler: rows [m0, m1) x columns [n0, n1) (both multiples of the tile).
void run_a_packed(const Plan& p, const QPackedA& a, const QBFiller& fill, int64_t m0, int64_t m1,
                  int64_t n0, int64_t n1) {
  const Int8GemmKernels& t = *p.t;
  const int mr = t.mr, nr = t.nr;
  const int64_t mc = row_block(p), nc = col_block(p);
  const int64_t panel_bytes = p.groups * nr * t.kb;
  uint8_t* raw = scratch(kBRaw).get<uint8_t>(p.k * nc);
  uint8_t* bpack = scratch(kBPanels).get<uint8_t>(nc / nr * panel_bytes);
  int32_t* csum = scratch(kColSums).get<int32_t>(nc);
  int32_t* terms = scratch(kColTerms).get<int32_t>(3 * nc);
  for (int64_t j0 = n0; j0 < n1; j0 += nc) {
    const int64_t cols = std::min(nc, n1 - j0);
    fill(j0, cols, raw);
    t.pack_b(raw, cols, 1, p.k, cols, p.b_flip, bpack, csum);
    const ColumnTerms ct = column_terms(p, j0, cols, round_up(cols, nr), csum, terms);
    for (int64_t i0 = m0; i0 < m1; i0 += mc) {
      const int64_t i1 = std::min(m1, i0 + mc);
      for (int64_t q = 0; q * nr < cols; ++q) {
        const int tc = static_cast<int>(std::min<int64_t>(nr, cols - q * nr));
        const uint8_t* bp = bpack + q * panel_bytes;
        for (int64_t i = i0; i < i1; i += mr) {
          const int tr = static_cast<int>(std::min<int64_t>(mr, i1 - i));
          tile(p, a.panel(i), bp, i, j0 + q * nr, tr, tc,
               p.need_row_sums ? a.row_sums() + i : nullptr, ct.at(q * nr));
        }
      }
    }
  }
}

// Runs body(m0, m1, n0, n1) over the blocks of a split of the product across threads. An
// 8-bit multiply-add costs about a quarter of a float one, so the work is counted so.
template <typename Body>
void run_split(const Plan& p, bool columns_first, Body&& body) {
  const double work = static_cast<double>(p.m) * static_cast<double>(p.n) *
                      static_cast<double>(std::max<int64_t>(p.k, 1)) / 4;
  const int tasks = task_count(work, p.o->max_threads);
  const SplitPolicy policy = columns_first ? SplitPolicy::ColumnsFirst : SplitPolicy::RowsFirst;
  math::run_split(split_for(tasks, p.m, p.n, p.t->mr, p.t->nr, policy), p.m, p.n, p.t->mr, p.t->nr,
                  body);
}

bool same_layout(const char* layout, int tile, const Int8GemmKernels& t, int t_tile) {
  return layout && t.layout && std::string_view(layout) == t.layout && tile == t_tile;
}

}  // namespace

int64_t QPackedB::packed_bytes(int64_t k, int64_t n, const Int8GemmKernels& t) {
  const int64_t cols = round_up(n, t.nr);
  return cols * groups_of(k, t) * t.kb + cols * 4;
}

void QPackedB::pack_into(const QMatrixView& b, void* out, const MathKernels& t) {
  const Int8GemmKernels& g = t.int8_gemm;
  auto* bytes = static_cast<uint8_t*>(out);
  const int64_t panels = round_up(b.cols, g.nr) * groups_of(b.rows, g) * g.kb;
  g.pack_b(static_cast<const uint8_t*>(b.data), b.rs, b.cs, b.rows, b.cols, b.is_signed ? 0 : 0x80,
           bytes, reinterpret_cast<int32_t*>(bytes + panels));
}

QPackedB::QPackedB(const QMatrixView& b, const MathKernels* t) {
  const MathKernels& table = table_of(t);
  std::shared_ptr<uint8_t[]> owned = aligned_bytes(packed_bytes(b.rows, b.cols, table.int8_gemm));
  pack_into(b, owned.get(), table);
  *this = QPackedB(owned.get(), b.rows, b.cols, b.is_signed, &table);
  owned_ = std::move(owned);
}

QPackedB::QPackedB(const void* data, int64_t k, int64_t n, bool is_signed, const MathKernels* t)
    : data_(static_cast<const uint8_t*>(data)), k_(k), n_(n), is_signed_(is_signed) {
  const Int8GemmKernels& g = table_of(t).int8_gemm;
  layout_ = g.layout;
  nr_ = g.nr;
  col_sums_ = reinterpret_cast<const int32_t*>(data_ + round_up(n, g.nr) * groups_of(k, g) * g.kb);
}

int64_t QPackedA::packed_bytes(int64_t m, int64_t k, const Int8GemmKernels& t) {
  const int64_t rows = round_up(m, t.mr);
  return rows * groups_of(k, t) * 4 + rows * 4;
}

void QPackedA::pack_into(const QMatrixView& a, void* out, const MathKernels& t) {
  const Int8GemmKernels& g = t.int8_gemm;
  auto* words = static_cast<int32_t*>(out);
  const int64_t groups = groups_of(a.cols, g);
  int32_t* sums = words + round_up(a.rows, g.mr) * groups;
  const auto* data = static_cast<const uint8_t*>(a.data);
  for (int64_t i0 = 0; i0 < a.rows; i0 += g.mr) {
    const int rows = static_cast<int>(std::min<int64_t>(g.mr, a.rows - i0));
    g.pack_a(data + i0 * a.rs, a.rs, a.cs, rows, a.cols, a.is_signed ? 0x80 : 0,
             words + i0 * groups, sums + i0);
    for (int r = rows; r < g.mr; ++r) sums[i0 + r] = 0;
  }
}

QPackedA::QPackedA(const QMatrixView& a, const MathKernels* t) {
  const MathKernels& table = table_of(t);
  std::shared_ptr<uint8_t[]> owned = aligned_bytes(packed_bytes(a.rows, a.cols, table.int8_gemm));
  pack_into(a, owned.get(), table);
  *this = QPackedA(owned.get(), a.rows, a.cols, a.is_signed, &table);
  owned_ = std::move(owned);
}

QPackedA::QPackedA(const void* data, int64_t m, int64_t k, bool is_signed, const MathKernels* t)
    : data_(static_cast<const int32_t*>(data)), m_(m), k_(k), is_signed_(is_signed) {
  const Int8GemmKernels& g = table_of(t).int8_gemm;
  layout_ = g.layout;
  mr_ = g.mr;
  groups_ = groups_of(k, g);
  row_sums_ = data_ + round_up(m, g.mr) * groups_;
}

const int32_t* QPackedA::panel(int64_t i) const {
  return data_ + i / mr_ * groups_ * mr_;
}

namespace {

// The checks and column terms of a product with packed B, then body(plan, column terms).
template <typename Body>
void with_packed_b(int64_t m, int64_t k, bool a_signed, const QPackedB& b, const QGemmOutput& out,
                   const QGemmOptions& o, const Body& body) {
  const MathKernels& table = table_of(o.kernels);
  const Int8GemmKernels& t = table.int8_gemm;
  if (!same_layout(b.layout(), b.nr(), t, t.nr)) {
    throw Error(ErrorKind::Runtime, std::string("qgemm: B was packed for the ") +
                                        (b.layout() ? b.layout() : "?") + " layout of " +
                                        std::to_string(b.nr()) + " columns, the kernels use " +
                                        t.layout + " of " + std::to_string(t.nr));
  }
  if (k != b.k()) {
    throw Error(ErrorKind::Runtime, "qgemm: A has " + std::to_string(k) + " columns but B has " +
                                        std::to_string(b.k()) + " rows");
  }
  const int64_t n = b.n();
  if (m == 0 || n == 0) return;
  const Plan p = make_plan(table, m, n, k, a_signed, b.is_signed(), out, o);
  const int64_t padded = round_up(n, t.nr);
  std::vector<int32_t> terms(static_cast<size_t>(3 * padded));
  const ColumnTerms ct = column_terms(p, 0, n, padded, b.col_sums(), terms.data());
  body(p, ct);
}

}  // namespace

void qgemm(const QFloatA& a, const QPackedB& b, const QGemmOutput& out, const QGemmOptions& o) {
  QGemmOptions oa = o;
  oa.a_zero = static_cast<int32_t>(a.zero_point);
  oa.a_zeros = nullptr;
  with_packed_b(a.rows, a.cols, false, b, out, oa, [&](const Plan& p, const ColumnTerms& ct) {
    const auto pack = [&](int64_t i, int rows, int32_t* panel, int32_t* sums) {
      p.t->pack_a_quantized(a.data + i * a.ld, a.ld, rows, p.k, &a.scale, &a.zero_point, 0, panel,
                            sums);
    };
    run_split(p, false, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      run_a_rows(p, pack, b.panels(), ct, m0, m1, n0, n1);
    });
  });
}

void row_quant_params(float lo, float hi, float* scale, float* zero_point) {
  const float s = (hi == lo ? 1.0f : hi - lo) / 255.0f;
  const float z = std::clamp(0.0f - lo / s, 0.0f, 255.0f);
  *scale = s;
  *zero_point = std::isnan(z) ? 0.0f : std::nearbyint(z);
}

void qgemm(const QRowFloatA& a, const QPackedB& b, const QGemmOutput& out, const QGemmOptions& o) {
  if (!out.f) throw Error(ErrorKind::Runtime, "qgemm: a per-row quantized A needs a float output");
  if (a.rows == 0 || b.n() == 0) return;
  const Int8GemmKernels& t = table_of(o.kernels).int8_gemm;
  // Per row: its scale and zero point (as floats for the packer), the zero point as the
  // driver's per-row a_zeros, and the output's row scale alpha * s_i.
  const size_t m = static_cast<size_t>(a.rows);
  std::vector<float> params(3 * m);
  std::vector<int32_t> zeros(m);
  float* scales = params.data();
  float* zero_points = scales + m;
  float* row_scales = zero_points + m;
  // One pass over A for the rows' ranges, split by rows when A is large (an encoder's
  // 1500-row activations), so that it does not stay serial beside the parallel product.
  const int tasks =
      task_count(static_cast<double>(a.rows) * static_cast<double>(a.cols), o.max_threads);
  run_tasks(tasks, [&](int task) {
    const int64_t i0 = part_edge(task, tasks, a.rows, 1),
                  i1 = part_edge(task + 1, tasks, a.rows, 1);
    for (int64_t r = i0; r < i1; ++r) {
      const size_t i = static_cast<size_t>(r);
      float lo = 0.0f, hi = 0.0f;
      t.quant_range(a.data + r * a.ld, a.cols, &lo, &hi);
      row_quant_params(lo, hi, &scales[i], &zero_points[i]);
      zeros[i] = static_cast<int32_t>(zero_points[i]);
      row_scales[i] = a.alpha * scales[i] * (out.f_row_scales ? out.f_row_scales[i] : 1.0f);
    }
  });
  QGemmOutput fo = out;
  fo.f_row_scales = row_scales;
  QGemmOptions oa = o;
  oa.a_zero = 0;
  oa.a_zeros = zeros.data();
  with_packed_b(a.rows, a.cols, false, b, fo, oa, [&](const Plan& p, const ColumnTerms& ct) {
    const auto pack = [&](int64_t i, int rows, int32_t* panel, int32_t* sums) {
      p.t->pack_a_quantized(a.data + i * a.ld, a.ld, rows, p.k, scales + i, zero_points + i, 1,
                            panel, sums);
    };
    run_split(p, false, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      run_a_rows(p, pack, b.panels(), ct, m0, m1, n0, n1);
    });
  });
}

namespace {

// A product with an unpacked B: B packed for this call, then the product with the packed B.
template <typename AOperand>
void with_b_packed_now(const AOperand& a, const QMatrixView& b, const QGemmOutput& out,
                       const QGemmOptions& o) {
  if (a.cols != b.rows) {
    throw Error(ErrorKind::Runtime, "qgemm: A has " + std::to_string(a.cols) +
                                        " columns but B has " + std::to_string(b.rows) + " rows");
  }
  if (a.rows == 0 || b.cols == 0) return;
  b_packs.fetch_add(1, std::memory_order_relaxed);
  const QPackedB packed(b, &table_of(o.kernels));
  qgemm(a, packed, out, o);
}

}  // namespace

void qgemm(const QFloatA& a, const QMatrixView& b, const QGemmOutput& out, const QGemmOptions& o) {
  with_b_packed_now(a, b, out, o);
}

void qgemm(const QMatrixView& a, const QPackedB& b, const QGemmOutput& out, const QGemmOptions& o) {
  with_packed_b(a.rows, a.cols, a.is_signed, b, out, o, [&](const Plan& p, const ColumnTerms& ct) {
    run_split(p, false, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      run_a_view(p, a, b.panels(), ct, m0, m1, n0, n1);
    });
  });
}

void qgemm(const QMatrixView& a, const QMatrixView& b, const QGemmOutput& out,
           const QGemmOptions& o) {
  with_b_packed_now(a, b, out, o);
}

void qgemm(const QPackedA& a, int64_t n, bool b_signed, const QBFiller& fill_b,
           const QGemmOutput& out, const QGemmOptions& o) {
  const MathKernels& table = table_of(o.kernels);
  const Int8GemmKernels& t = table.int8_gemm;
  if (!same_layout(a.layout(), a.mr(), t, t.mr)) {
    throw Error(ErrorKind::Runtime, std::string("qgemm: A was packed for the ") +
                                        (a.layout() ? a.layout() : "?") + " layout of " +
                                        std::to_string(a.mr()) + " rows, the kernels use " +
                                        t.layout + " of " + std::to_string(t.mr));
  }
  const int64_t m = a.m(), k = a.k();
  if (m == 0 || n == 0) return;
  const Plan p = make_plan(table, m, n, k, a.is_signed(), b_signed, out, o);
  // Columns first: each task then lowers only its own part of B.
  run_split(p, true, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    run_a_packed(p, a, fill_b, m0, m1, n0, n1);
  });
}

uint64_t qgemm_b_packs() {
  return b_packs.load(std::memory_order_relaxed);
}

}  // namespace kiln::math
