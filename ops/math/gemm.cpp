#include "ops/math/gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "ops/math/threading.h"

namespace kiln::math {
namespace {

// k block: a B panel block (kKc x nr floats, 32 KiB at nr = 32) stays in L1 while a row
// block of packed A (mc x kKc) stays in L2.
constexpr int64_t kKc = PackedA::kBlock;
// Rows of A packed at once: a multiple of the tile rows near 128.
int64_t row_block(int mr) {
  return std::max<int64_t>(mr, 128 / mr * mr);
}

std::atomic<uint64_t> b_packs{0};
std::atomic<uint64_t> b_allocations{0};

// A 64-byte aligned scratch buffer per thread, grown on demand and kept.
struct Scratch {
  float* data = nullptr;
  int64_t size = 0;
  ~Scratch() { std::free(data); }
  float* get(int64_t floats) {
    if (floats > size) {
      std::free(data);
      const auto bytes = static_cast<size_t>((floats * 4 + 63) / 64 * 64);
      data = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!data) throw std::bad_alloc();
      size = floats;
    }
    return data;
  }
};

Scratch& a_scratch() {
  thread_local Scratch s;
  return s;
}

// The rest of `o`'s epilogue over a block of tiles stored with tile_epilogue's: activations
// but Relu, a row at a time once the block's tiles are done (a call per tile row would run the
// vector kernels over a few dozen floats at a time).
void finish_tile(const GemmOptions& o, float* c, int64_t ldc, int64_t rows, int64_t cols) {
  if (o.activation == Activation::None || o.activation == Activation::Relu) return;
  const MathKernels& t = o.kernels ? *o.kernels : kernels();
  for (int64_t i = 0; i < rows; ++i) activate(o.activation, c + i * ldc, cols, t);
}

void apply_epilogue(const GemmOptions& o, float* c, int64_t ldc, int64_t rows, int64_t cols,
                    int64_t i0, int64_t j0) {
  const bool relu = o.activation == Activation::Relu;
  if (o.bias || o.row_bias || relu) {
    const MathKernels& t = o.kernels ? *o.kernels : kernels();
    t.gemm.epilogue(c, ldc, rows, cols, o.bias ? o.bias + j0 : nullptr,
                    o.row_bias ? o.row_bias + i0 : nullptr, relu);
  }
  finish_tile(o, c, ldc, rows, cols);
}

// The part of `o`'s epilogue the tile kernels apply as they store a tile at row i0, column j0
// (the biases and Relu), in `room`; null when there is none.
const TileEpilogue* tile_epilogue(const GemmOptions& o, int64_t i0, int64_t j0,
                                  TileEpilogue& room) {
  const bool relu = o.activation == Activation::Relu;
  if (!o.bias && !o.row_bias && !relu) return nullptr;
  room = {o.row_bias ? o.row_bias + i0 : nullptr, o.bias ? o.bias + j0 : nullptr, relu};
  return &room;
}

// B as the tiles read it: packed panels, or a row-major float view read in place.
struct BSource {
  const void* data = nullptr;
  bool packed = false;
  int64_t ldb = 0;  // row stride in elements of an unpacked B
  PackedType type = PackedType::Float32;
  int64_t panel_stride = 0;  // packed: elements from one panel to the next

  int elem() const { return type == PackedType::Float32 ? 4 : 2; }
  // Row p0, column j0 (a multiple of nr).
  const void* at(int64_t p0, int64_t j0, int nr) const {
    const int64_t e = packed ? j0 / nr * panel_stride + p0 * nr : p0 * ldb + j0;
    return static_cast<const char*>(data) + e * elem();
  }
};

// One tile; `first` when it is the first row tile to read this B panel block.
void tile(const GemmKernels& g, const BSource& b, int64_t kc, const float* a, const void* bp,
          float* c, int64_t ldc, int rows, int cols, bool accumulate, bool first,
          const TileEpilogue* e) {
  const int64_t ldb = b.packed ? g.nr : b.ldb;
  switch (b.type) {
    case PackedType::Float32:
      return (b.packed ? (first ? g.kernel_cold_b : g.kernel_packed) : g.kernel)(
          kc, a, static_cast<const float*>(bp), ldb, c, ldc, rows, cols, accumulate, e);
    case PackedType::BFloat16:
      return g.kernel_bf16(kc, a, static_cast<const uint16_t*>(bp), ldb, c, ldc, rows, cols,
                           accumulate, e);
    case PackedType::Float16:
      return g.kernel_f16(kc, a, static_cast<const uint16_t*>(bp), ldb, c, ldc, rows, cols,
                          accumulate, e);
  }
}

// The row tiles of `rows` rows of an A packed (or read) per call: whole tiles of mr rows,
// except that where the last would be shorter than half a tile the rows are spread evenly
// over as many tiles. A tile of one or two rows keeps too few sums in flight to hide the
// FMA's latency: a lone last row costs as much as a whole tile (measured: docs/performance.md,
// "Figures cited in code comments").
struct RowTiles {
  int64_t count = 0, base = 0, extra = 0;
  bool even = false;
  int mr = 0;

  RowTiles(int64_t rows, int tile) : count((rows + tile - 1) / tile), mr(tile) {
    even = count > 1 && rows % tile != 0 && rows % tile < tile / 2;
    base = even ? rows / count : tile;
    extra = even ? rows % count : 0;
    last = rows - (count - 1) * tile;
  }
  int64_t start(int64_t t) const { return even ? t * base + std::min(t, extra) : t * mr; }
  int size(int64_t t) const {
    if (even) return static_cast<int>(base + (t < extra ? 1 : 0));
    return static_cast<int>(t + 1 < count ? mr : last);
  }

 private:
  int64_t last = 0;
};

// The largest k that is multiplied in one k block (a B panel of 384 x 32 floats, 48 KiB: the
// L1 of recent cores).
constexpr int64_t kOneBlockK = 384;

// The k block of a product over `rows` rows of A per call. k blocks keep a B block in L1 for
// the many row tiles that use it. With a single row tile (a GEMV-shaped product) nothing
// reuses it: B is better read in one pass, each panel a single sequential stream. A k of at
// most kOneBlockK is one block too: cut at 256 it left a second block of 128 steps, whose
// tiles reload and store C again for half the work (measured: docs/performance.md, "Figures
// cited in code comments").
int64_t k_block(int64_t rows, int mr, int64_t k) {
  return rows <= mr || k <= kOneBlockK ? k : kKc;
}

// The product over rows [m0, m1) and columns [n0, n1) (n0 a multiple of nr), A's panels
// made by pack_a(i, rows, p0, kc, out) (rows i.. of k block p0.. into one panel at out).
template <typename PackA>
void run_block(const GemmKernels& g, const PackA& pack_a, const BSource& b, int64_t k, float* c,
               int64_t ldc, const GemmOptions& o, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int mr = g.mr, nr = g.nr;
  const int64_t mc = row_block(mr);
  const int64_t kb = k_block(m1 - m0, mr, k);
  // Packed panels always hold whole tiles of mr rows (short ones padded).
  const int64_t rows_packed = std::min(mc, (m1 - m0 + mr - 1) / mr * mr);
  float* apack = a_scratch().get(rows_packed * std::min(k, kb));
  for (int64_t p0 = 0; p0 < k; p0 += kb) {
    const int64_t kc = std::min(kb, k - p0);
    const bool first = p0 == 0, last = p0 + kc == k;
    const bool accumulate = !first || o.accumulate;
    for (int64_t i0 = m0; i0 < m1; i0 += mc) {
      const int64_t rows = std::min(mc, m1 - i0);
      const RowTiles tiles(rows, mr);
      for (int64_t t = 0; t < tiles.count; ++t) {
        pack_a(i0 + tiles.start(t), tiles.size(t), p0, kc, apack + t * mr * kc);
      }
      for (int64_t j0 = n0; j0 < n1; j0 += nr) {
        const int tc = static_cast<int>(std::min<int64_t>(nr, n1 - j0));
        const void* bp = b.at(p0, j0, nr);
        for (int64_t t = 0; t < tiles.count; ++t) {
          const int64_t r = tiles.start(t);
          float* ct = c + (i0 + r) * ldc + j0;
          TileEpilogue room;
          tile(g, b, kc, apack + t * mr * kc, bp, ct, ldc, tiles.size(t), tc, accumulate, t == 0,
               last ? tile_epilogue(o, i0 + r, j0, room) : nullptr);
        }
      }
      if (last) finish_tile(o, c + i0 * ldc + n0, ldc, rows, n1 - n0);
    }
  }
}

// run_block's A packer for a strided view (times alpha).
auto view_packer(const GemmKernels& g, const MatrixView& a, float alpha) {
  return [&g, a, alpha](int64_t i, int rows, int64_t p0, int64_t kc, float* out) {
    g.pack_a(a.data + i * a.rs + p0 * a.cs, a.rs, a.cs, rows, kc, alpha, out);
  };
}

// run_block with A read in place (GemmKernels::kernel_rows_a): a row-major A, alpha 1, float
// B in packed panels.
void run_rows_a_block(const GemmKernels& g, const MatrixView& a, const BSource& b, int64_t k,
                      float* c, int64_t ldc, const GemmOptions& o, int64_t m0, int64_t m1,
                      int64_t n0, int64_t n1) {
  const int mr = g.mr, nr = g.nr;
  const int64_t mc = row_block(mr);
  const int64_t kb = k_block(m1 - m0, mr, k);
  for (int64_t p0 = 0; p0 < k; p0 += kb) {
    const int64_t kc = std::min(kb, k - p0);
    const bool last = p0 + kc == k;
    const bool accumulate = p0 > 0 || o.accumulate;
    for (int64_t i0 = m0; i0 < m1; i0 += mc) {
      const int64_t rows = std::min(mc, m1 - i0);
      for (int64_t j0 = n0; j0 < n1; j0 += nr) {
        const int tc = static_cast<int>(std::min<int64_t>(nr, n1 - j0));
        const auto* bp = static_cast<const float*>(b.at(p0, j0, nr));
        const RowTiles tiles(rows, mr);
        for (int64_t t = 0; t < tiles.count; ++t) {
          const int64_t r = tiles.start(t);
          const int tr = tiles.size(t);
          TileEpilogue room;
          g.kernel_rows_a(kc, a.data + (i0 + r) * a.rs + p0, a.rs, bp, c + (i0 + r) * ldc + j0, ldc,
                          tr, tc, accumulate, last ? tile_epilogue(o, i0 + r, j0, room) : nullptr);
        }
      }
      if (last) finish_tile(o, c + i0 * ldc + n0, ldc, rows, n1 - n0);
    }
  }
}

// Products of at most this many column panels read a row-major A in place: a packed A panel
// would serve only this many tiles, so making it costs about what it saves: attention's
// product of a block's softmaxed scores by V (few columns) spent a visible share of an
// encoder's time packing A (measured: docs/performance.md, "Figures cited in code comments").
constexpr int64_t kRowsAMaxPanels = 2;

bool reads_a_in_place(const GemmKernels& g, const MatrixView& a, const BSource& b, int64_t n,
                      const GemmOptions& o) {
  return b.packed && b.type == PackedType::Float32 && a.cs == 1 && o.alpha == 1.0f &&
         n <= kRowsAMaxPanels * g.nr;
}

void run(const GemmKernels& g, const MatrixView& a, const BSource& b, int64_t k, int64_t n,
         float* c, int64_t ldc, const GemmOptions& o) {
  const int64_t m = a.rows;
  const int tasks = task_count(product_work(m, n, k, g.mr), o.max_threads);
  const Split split = split_for(tasks, m, n, g.mr, g.nr, SplitPolicy::RowsFirst);
  if (reads_a_in_place(g, a, b, n, o)) {
    run_split(split, m, n, g.mr, g.nr, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      run_rows_a_block(g, a, b, k, c, ldc, o, m0, m1, n0, n1);
    });
    return;
  }
  const auto pack_a = view_packer(g, a, o.alpha);
  run_split(split, m, n, g.mr, g.nr, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    run_block(g, pack_a, b, k, c, ldc, o, m0, m1, n0, n1);
  });
}

// C = 0 (or unchanged when accumulating) plus the epilogue, for k == 0.
void empty_product(int64_t m, int64_t n, float* c, int64_t ldc, const GemmOptions& o) {
  for (int64_t i = 0; i < m; ++i) {
    if (!o.accumulate) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
  }
  apply_epilogue(o, c, ldc, m, n, 0, 0);
}

// x (1 x k) contiguous: `a` itself, or its elements copied into `copy`.
const float* contiguous_row(const MatrixView& a, int64_t k, std::vector<float>& copy) {
  if (a.cs == 1) return a.data;
  copy.resize(static_cast<size_t>(k));
  for (int64_t p = 0; p < k; ++p) copy[static_cast<size_t>(p)] = a.data[p * a.cs];
  return copy.data();
}

// y (1 x n) = alpha * x (1 x k) * B with B row-major: B's rows streamed once, each weighted
// by its element of x (the register-tile kernel would compute a whole tile of rows for the
// one that exists). Tasks take column ranges.
void gemv_by_rows(const GemmKernels& g, const MatrixView& a, const MatrixView& b, float* c,
                  const GemmOptions& o) {
  const int64_t k = b.rows, n = b.cols;
  // (Not in the thread's scratch: while this thread waits for the tasks below it may run
  // another product that uses it.)
  std::vector<float> xcopy;
  const float* x = contiguous_row(a, k, xcopy);
  const int tasks = task_count(product_work(1, n, k, g.mr), o.max_threads);
  run_tasks(tasks, [&](int t) {
    const int64_t j0 = n * t / tasks, j1 = n * (t + 1) / tasks;
    if (!o.accumulate && o.alpha == 1.0f) {
      g.gemv_rows(x, b.data + j0, b.rs, k, j1 - j0, c + j0);
      return;
    }
    float part[256];
    for (int64_t j = j0; j < j1; j += 256) {
      const int64_t len = std::min<int64_t>(256, j1 - j);
      g.gemv_rows(x, b.data + j, b.rs, k, len, part);
      for (int64_t i = 0; i < len; ++i) {
        const float v = o.alpha * part[i];
        c[j + i] = o.accumulate ? c[j + i] + v : v;
      }
    }
  });
  apply_epilogue(o, c, 0, 1, n, 0, 0);
}

// y (1 x n) = alpha * x (1 x k) * B with B column-major: one dot product per column.
void gemv_columns(const GemmKernels& g, const MatrixView& a, const MatrixView& b, float* c,
                  const GemmOptions& o) {
  const int64_t k = b.rows, n = b.cols;
  // x must be contiguous for the dot kernel (not in the thread's scratch: see gemv_by_rows).
  std::vector<float> xcopy;
  const float* x = contiguous_row(a, k, xcopy);
  const int tasks = task_count(product_work(1, n, k, g.mr), o.max_threads);
  run_tasks(tasks, [&](int t) {
    const int64_t j0 = n * t / tasks, j1 = n * (t + 1) / tasks;
    if (!o.accumulate && o.alpha == 1.0f) {
      g.dots(x, b.data + j0 * b.cs, b.cs, k, j1 - j0, c + j0);
      return;
    }
    float part[256];
    for (int64_t j = j0; j < j1; j += 256) {
      const int64_t len = std::min<int64_t>(256, j1 - j);
      g.dots(x, b.data + j * b.cs, b.cs, k, len, part);
      for (int64_t i = 0; i < len; ++i) {
        const float v = o.alpha * part[i];
        c[j + i] = o.accumulate ? c[j + i] + v : v;
      }
    }
  });
  apply_epilogue(o, c, 0, 1, n, 0, 0);
}

const MathKernels& table_of(const GemmOptions& o) {
  return o.kernels ? *o.kernels : kernels();
}

// Throws unless an operand was packed for the kernels' tile (`what`: its rows or columns).
void check_packed_tile(const char* operand, int packed, int used, const char* what) {
  if (packed != used) {
    throw Error(ErrorKind::Runtime, std::string("sgemm: ") + operand + " was packed for tiles of " +
                                        std::to_string(packed) + " " + what + ", the kernels use " +
                                        std::to_string(used));
  }
}

void check_shapes(const MatrixView& a, int64_t brows) {
  if (a.cols != brows) {
    throw Error(ErrorKind::Runtime, "sgemm: A has " + std::to_string(a.cols) +
                                        " columns but B has " + std::to_string(brows) + " rows");
  }
}

// Columns of B packed per block when B comes from a BPacker, and rows of A per block: the
// B block (kKc x nc) and the A rows it meets (mc x kKc) stay in L2 together.
constexpr int64_t kPanelsPerBlock = 8;
constexpr int64_t kRowsPerBlock = 252;  // a multiple of every level's tile height
constexpr int64_t kFewPanels = 4;
// Floats of a B packed whole (by a one-task product) that a thread's buffer grows to hold and
// keeps (4 MB); a larger B is packed into memory of its own for the call.
constexpr int64_t kKeptPackedB = int64_t{1} << 20;

// This thread's packed B: blocks from a BPacker, or a task's own columns of an unpacked B.
Scratch& b_scratch() {
  thread_local Scratch s;
  return s;
}

// A B packed once for row tasks that read it while this thread waits for them: the waiting
// thread may take another product's task, which may itself pack a shared B, so each product
// in flight on the thread takes the buffer one level deeper (levels kept, grown on demand);
// deeper than kSharedLevels, or larger than kKeptPackedB, B gets memory of its own.
constexpr int kSharedLevels = 4;
struct SharedB {
  std::array<Scratch, kSharedLevels> levels;
  int depth = 0;
};
SharedB& shared_b() {
  thread_local SharedB s;
  return s;
}

// Holds one level of this thread's SharedB for the product's lifetime.
class SharedBLevel {
 public:
  explicit SharedBLevel(int64_t floats) : s_(shared_b()) {
    if (floats <= kKeptPackedB && s_.depth < kSharedLevels) {
      data_ = s_.levels[static_cast<size_t>(s_.depth)].get(floats);
      ++s_.depth;
    }
  }
  ~SharedBLevel() {
    if (data_) --s_.depth;
  }
  SharedBLevel(const SharedBLevel&) = delete;
  SharedBLevel& operator=(const SharedBLevel&) = delete;
  float* data() const { return data_; }  // null: no level left, or too large to keep

 private:
  SharedB& s_;
  float* data_ = nullptr;
};

// The product over rows [m0, m1) and columns [n0, n1) (both multiples of the tile) with A
// packed and B packed block by block into this thread's buffer.
void run_packed_a_block(const GemmKernels& g, const PackedA& a, const BPacker& pack_b, float* c,
                        int64_t ldc, const GemmOptions& o, int64_t m0, int64_t m1, int64_t n0,
                        int64_t n1) {
  const int mr = g.mr, nr = g.nr;
  const int64_t k = a.k(), nc_max = kPanelsPerBlock * nr;
  float* bpack = b_scratch().get(std::min(k, kKc) * nc_max);
  for (int64_t j0 = n0; j0 < n1; j0 += nc_max) {
    const int64_t nc = std::min(nc_max, n1 - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kKc) {
      const int64_t kc = std::min(kKc, k - p0);
      const bool last = p0 + kc == k;
      const bool accumulate = p0 > 0 || o.accumulate;
      pack_b(p0, kc, j0, nc, bpack);
      auto tile = [&](int64_t i, int64_t i1, int64_t q) {
        const int tr = static_cast<int>(std::min<int64_t>(mr, i1 - i));
        const int tc = static_cast<int>(std::min<int64_t>(nr, nc - q * nr));
        float* ct = c + i * ldc + j0 + q * nr;
        TileEpilogue room;
        g.kernel_cold_a(kc, a.panel(i, p0), bpack + q * kc * nr, nr, ct, ldc, tr, tc, accumulate,
                        last ? tile_epilogue(o, i, j0 + q * nr, room) : nullptr);
      };
      const int64_t panels = (nc + nr - 1) / nr;
      if (panels <= kFewPanels) {
        // Few columns: each A panel (a constant's, often cold) is read once, for all of them.
        for (int64_t i = m0; i < m1; i += mr) {
          for (int64_t q = 0; q < panels; ++q) tile(i, m1, q);
        }
      } else {
        for (int64_t i0 = m0; i0 < m1; i0 += kRowsPerBlock) {
          const int64_t i1 = std::min(m1, i0 + kRowsPerBlock);
          for (int64_t q = 0; q < panels; ++q) {
            for (int64_t i = i0; i < i1; i += mr) tile(i, i1, q);
          }
        }
      }
      if (last) finish_tile(o, c + m0 * ldc + j0, ldc, m1 - m0, nc);
    }
  }
}

// run_packed_a_block with B read in place through its row pointers instead of packed.
void run_indirect_block(const GemmKernels& g, const PackedA& a, const float* const* b_rows,
                        float* c, int64_t ldc, const GemmOptions& o, int64_t m0, int64_t m1,
                        int64_t n0, int64_t n1) {
  const int mr = g.mr, nr = g.nr;
  const int64_t k = a.k(), nc_max = kPanelsPerBlock * nr;
  for (int64_t j0 = n0; j0 < n1; j0 += nc_max) {
    const int64_t nc = std::min(nc_max, n1 - j0);
    const int64_t panels = (nc + nr - 1) / nr;
    for (int64_t p0 = 0; p0 < k; p0 += kKc) {
      const int64_t kc = std::min(kKc, k - p0);
      const bool last = p0 + kc == k;
      const bool accumulate = p0 > 0 || o.accumulate;
      for (int64_t i0 = m0; i0 < m1; i0 += kRowsPerBlock) {
        const int64_t i1 = std::min(m1, i0 + kRowsPerBlock);
        for (int64_t q = 0; q < panels; ++q) {
          const int tc = static_cast<int>(std::min<int64_t>(nr, nc - q * nr));
          for (int64_t i = i0; i < i1; i += mr) {
            const int tr = static_cast<int>(std::min<int64_t>(mr, i1 - i));
            float* ct = c + i * ldc + j0 + q * nr;
            TileEpilogue room;
            g.kernel_indirect(kc, a.panel(i, p0), b_rows + p0, j0 + q * nr, ct, ldc, tr, tc,
                              accumulate, last ? tile_epilogue(o, i, j0 + q * nr, room) : nullptr);
          }
        }
      }
      if (last) finish_tile(o, c + m0 * ldc + j0, ldc, m1 - m0, nc);
    }
  }
}

}  // namespace

void activate(Activation a, float* y, int64_t n, const MathKernels& t) {
  switch (a) {
    case Activation::None:
      return;
    case Activation::Relu:
      return t.gemm.epilogue(y, n, 1, n, nullptr, nullptr, true);
    case Activation::Gelu:
      return t.vec.gelu(y, y, n);
    case Activation::GeluTanh:
      return t.vec.gelu_tanh(y, y, n);
    case Activation::Silu:
      return t.vec.silu(y, y, n);
    case Activation::QuickGelu:
      return t.vec.swish(y, y, n, kQuickGeluAlpha);
    case Activation::Sigmoid:
      return t.vec.sigmoid(y, y, n);
    case Activation::Tanh:
      return t.vec.tanh(y, y, n);
  }
}

int64_t PackedA::packed_floats(int64_t m, int64_t k, int mr) {
  return (m + mr - 1) / mr * mr * k;
}

void PackedA::pack_into(const MatrixView& a, float* out, const MathKernels& t) {
  pack_rows_into(a, 0, a.rows, out, t);
}

void PackedA::pack_rows_into(const MatrixView& a, int64_t r0, int64_t m, float* out,
                             const MathKernels& t) {
  const int mr = t.gemm.mr;
  const int64_t padded = (m + mr - 1) / mr * mr;
  for (int64_t p0 = 0; p0 < a.cols; p0 += kBlock) {
    const int64_t kc = std::min(kBlock, a.cols - p0);
    for (int64_t i0 = 0; i0 < a.rows; i0 += mr) {
      const int rows = static_cast<int>(std::min<int64_t>(mr, a.rows - i0));
      t.gemm.pack_a(a.data + i0 * a.rs + p0 * a.cs, a.rs, a.cs, rows, kc, 1.0f,
                    out + p0 * padded + (r0 + i0) * kc);
    }
  }
}

PackedA::PackedA(const MatrixView& a, const MathKernels* t) {
  const MathKernels& table = t ? *t : kernels();
  m_ = a.rows;
  k_ = a.cols;
  mr_ = table.gemm.mr;
  padded_rows_ = (m_ + mr_ - 1) / mr_ * mr_;
  const int64_t floats = packed_floats(m_, k_, mr_);
  owned_ = std::shared_ptr<float[]>(new (std::align_val_t(64)) float[static_cast<size_t>(floats)],
                                    [](float* p) { operator delete[](p, std::align_val_t(64)); });
  pack_into(a, owned_.get(), table);
  data_ = owned_.get();
}

PackedA::PackedA(const float* data, int64_t m, int64_t k, int mr)
    : data_(data), m_(m), k_(k), padded_rows_((m + mr - 1) / mr * mr), mr_(mr) {}

PackedA PackedA::rows(int64_t r0, int64_t m) const {
  if (r0 % mr_ != 0 || r0 < 0 || m < 0 || r0 + m > m_) {
    throw Error(ErrorKind::Runtime, "PackedA::rows: rows [" + std::to_string(r0) + ", " +
                                        std::to_string(r0 + m) + ") of " + std::to_string(m_) +
                                        " do not start at a tile");
  }
  PackedA v = *this;
  v.row0_ = row0_ + r0;
  v.m_ = m;
  return v;
}

namespace {

// The products of a packed A: its checks and empty cases, then `block(g, m0, m1, n0, n1)` over
// the tasks. Columns are split when B is the larger operand (each task then lowers only its
// own part of B), rows when A is (a large filter over a small image: each task then reads
// only its own part of A, and B, lowered by both, is small).
template <typename Block>
void run_packed_a(const PackedA& a, int64_t n, float* c, int64_t ldc, const GemmOptions& o,
                  Block&& block) {
  const GemmKernels& g = table_of(o).gemm;
  check_packed_tile("A", a.mr(), g.mr, "rows");
  if (o.alpha != 1.0f) throw Error(ErrorKind::Runtime, "sgemm: a packed A takes no alpha");
  const int64_t m = a.m(), k = a.k();
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, ldc, o);
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int tasks = task_count(work, o.max_threads);
  run_split(split_for(tasks, m, n, g.mr, g.nr, SplitPolicy::LargerOperand), m, n, g.mr, g.nr,
            [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) { block(g, m0, m1, n0, n1); });
}

}  // namespace

void sgemm(const PackedA& a, int64_t n, const BPacker& pack_b, float* c, int64_t ldc,
           const GemmOptions& o) {
  run_packed_a(a, n, c, ldc, o,
               [&](const GemmKernels& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
                 run_packed_a_block(g, a, pack_b, c, ldc, o, m0, m1, n0, n1);
               });
}

void sgemm_indirect(const PackedA& a, int64_t n, const float* const* b_rows, float* c, int64_t ldc,
                    const GemmOptions& o) {
  run_packed_a(a, n, c, ldc, o,
               [&](const GemmKernels& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
                 run_indirect_block(g, a, b_rows, c, ldc, o, m0, m1, n0, n1);
               });
}

int64_t PackedB::packed_floats(int64_t k, int64_t n, int nr) {
  return (n + nr - 1) / nr * nr * k;
}

int64_t PackedB::packed_bytes(int64_t k, int64_t n, int nr, PackedType type) {
  return packed_floats(k, n, nr) * (type == PackedType::Float32 ? 4 : 2);
}

void PackedB::pack_into(const MatrixView& b, void* out, const MathKernels& t, PackedType type) {
  switch (type) {
    case PackedType::Float32:
      return t.gemm.pack_b(b.data, b.rs, b.cs, b.rows, b.cols, static_cast<float*>(out));
    case PackedType::BFloat16:
      return t.gemm.pack_b_bf16(b.data, b.rs, b.cs, b.rows, b.cols, static_cast<uint16_t*>(out));
    case PackedType::Float16:
      return t.gemm.pack_b_f16(b.data, b.rs, b.cs, b.rows, b.cols, static_cast<uint16_t*>(out));
  }
}

PackedB::PackedB(const MatrixView& b, const MathKernels* t, PackedType type) {
  const MathKernels& table = t ? *t : kernels();
  k_ = b.rows;
  n_ = b.cols;
  nr_ = table.gemm.nr;
  type_ = type;
  const auto bytes = static_cast<size_t>(packed_bytes(k_, n_, nr_, type));
  owned_ = std::shared_ptr<char[]>(new (std::align_val_t(64)) char[bytes],
                                   [](char* p) { operator delete[](p, std::align_val_t(64)); });
  pack_into(b, owned_.get(), table, type);
  data_ = owned_.get();
  panel_stride_ = k_ * nr_;
}

PackedB::PackedB(const void* data, int64_t k, int64_t n, int nr, PackedType type)
    : data_(data), k_(k), n_(n), nr_(nr), type_(type), panel_stride_(k * nr) {}

PackedB PackedB::block(int64_t p0, int64_t k, int64_t j0, int64_t n) const {
  PackedB v = *this;
  const int64_t e = j0 / nr_ * panel_stride_ + p0 * nr_;
  v.data_ = static_cast<const char*>(data_) + e * (type_ == PackedType::Float32 ? 4 : 2);
  v.k_ = k;
  v.n_ = n;
  return v;
}

void sgemm(const MatrixView& a, const MatrixView& b, float* c, int64_t ldc, const GemmOptions& o) {
  check_shapes(a, b.rows);
  const GemmKernels& g = table_of(o).gemm;
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, ldc, o);
  if (m == 1 && b.rs == 1 && b.cs != 1) return gemv_columns(g, a, b, c, o);
  if (m == 1 && b.cs == 1) return gemv_by_rows(g, a, b, c, o);
  // A row-major B is read in place while A is too short to repay packing it.
  if (b.cs == 1 && m <= 4 * g.mr) {
    return run(g, a, {b.data, false, b.rs, PackedType::Float32, 0}, k, n, c, ldc, o);
  }
  b_packs.fetch_add(1, std::memory_order_relaxed);
  // Split over columns when they go round, each task packing only the columns it multiplies,
  // in parallel and into its own thread's memory: packing all of B first is a serial step,
  // and panels packed by one thread and read by another cross between the cores' caches
  // (measured: docs/performance.md, "Figures cited in code comments").
  const int tasks = task_count(
      static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k), o.max_threads);
  const Split split = split_for(tasks, m, n, g.mr, g.nr, SplitPolicy::ColumnsFirst);
  if (tasks > 1 && split.row_parts == 1) {
    const MathKernels& table = table_of(o);
    run_split(split, m, n, g.mr, g.nr, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      const MatrixView part{b.data + n0 * b.cs, b.rows, n1 - n0, b.rs, b.cs};
      float* panels = b_scratch().get(PackedB::packed_floats(k, n1 - n0, g.nr));
      PackedB::pack_into(part, panels, table, PackedType::Float32);
      GemmOptions own = o;
      own.max_threads = 1;
      if (o.bias) own.bias = o.bias + n0;
      run_block(g, view_packer(g, a, o.alpha), {panels, true, 0, PackedType::Float32, k * g.nr}, k,
                c + n0, ldc, own, m0, m1, 0, n1 - n0);
    });
    return;
  }
  // One task: B packed into this thread's kept buffer, as a column task's part is (nothing
  // else runs on this thread while the product does) unless larger than kKeptPackedB.
  const int64_t floats = PackedB::packed_floats(k, n, g.nr);
  if (tasks == 1 && task_count(product_work(m, n, k, g.mr), o.max_threads) == 1 &&
      floats <= kKeptPackedB) {
    float* panels = b_scratch().get(floats);
    PackedB::pack_into(b, panels, table_of(o), PackedType::Float32);
    return run(g, a, {panels, true, 0, PackedType::Float32, k * g.nr}, k, n, c, ldc, o);
  }
  // Otherwise B is packed once for the tasks, into this thread's shared-B buffer of the
  // product's level (SharedBLevel), or memory of its own when none is left.
  const SharedBLevel level(floats);
  if (level.data()) {
    PackedB::pack_into(b, level.data(), table_of(o), PackedType::Float32);
    return run(g, a, {level.data(), true, 0, PackedType::Float32, k * g.nr}, k, n, c, ldc, o);
  }
  b_allocations.fetch_add(1, std::memory_order_relaxed);
  const PackedB packed(b, &table_of(o));
  run(g, a, {packed.data(), true, 0, PackedType::Float32, packed.panel_stride()}, k, n, c, ldc, o);
}

void sgemm(const MatrixView& a, const PackedB& b, float* c, int64_t ldc, const GemmOptions& o) {
  check_shapes(a, b.k());
  const GemmKernels& g = table_of(o).gemm;
  check_packed_tile("B", b.nr(), g.nr, "columns");
  const int64_t m = a.rows, n = b.n(), k = b.k();
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, ldc, o);
  run(g, a, {b.data(), true, 0, b.type(), b.panel_stride()}, k, n, c, ldc, o);
}

void sgemm(int64_t m, const APacker& pack_a, const PackedB& b, float* c, int64_t ldc,
           const GemmOptions& o) {
  const GemmKernels& g = table_of(o).gemm;
  check_packed_tile("B", b.nr(), g.nr, "columns");
  if (o.alpha != 1.0f) throw Error(ErrorKind::Runtime, "sgemm: an A packer takes no alpha");
  const int64_t n = b.n(), k = b.k();
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, ldc, o);
  const BSource source{b.data(), true, 0, b.type(), b.panel_stride()};
  const int mr = g.mr;
  const auto packer = [&](int64_t i, int rows, int64_t p0, int64_t kc, float* out) {
    pack_a(i, rows, mr, p0, kc, out);
  };
  // B (a constant, the larger operand here) is split between the tasks, each reading only its
  // own columns; the small A is packed by each.
  const int tasks = task_count(product_work(m, n, k, g.mr), o.max_threads);
  run_split(split_for(tasks, m, n, g.mr, g.nr, SplitPolicy::LargerOperand), m, n, g.mr, g.nr,
            [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
              run_block(g, packer, source, k, c, ldc, o, m0, m1, n0, n1);
            });
}

template <>
void gemm<float>(const float* a, int64_t m, int64_t k, int64_t ars, int64_t acs, const float* b,
                 int64_t n, int64_t brs, int64_t bcs, float* c, int64_t ldc, const GemmOptions& o) {
  sgemm({a, m, k, ars, acs}, {b, k, n, brs, bcs}, c, ldc, o);
}

template <>
void gemm<double>(const double* a, int64_t m, int64_t k, int64_t ars, int64_t acs, const double* b,
                  int64_t n, int64_t brs, int64_t bcs, double* c, int64_t ldc,
                  const GemmOptions& o) {
  const int tasks = task_count(
      static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k), o.max_threads);
  const double alpha = o.alpha;
  run_tasks(tasks, [&](int t) {
    std::vector<double> acc(static_cast<size_t>(n));
    for (int64_t i = m * t / tasks; i < m * (t + 1) / tasks; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = 0; p < k; ++p) {
        const double av = a[i * ars + p * acs];
        const double* row = b + p * brs;
        for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] += av * row[j * bcs];
      }
      double* out = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) {
        double v = alpha * acc[static_cast<size_t>(j)];
        if (o.accumulate) v += out[j];
        if (o.bias) v += o.bias[j];
        if (o.row_bias) v += o.row_bias[i];
        if (o.activation == Activation::Relu && v < 0) v = 0;
        out[j] = v;
      }
    }
  });
}

uint64_t gemm_b_packs() {
  return b_packs.load(std::memory_order_relaxed);
}

uint64_t gemm_b_allocations() {
  return b_allocations.load(std::memory_order_relaxed);
}

}  // namespace kiln::math
