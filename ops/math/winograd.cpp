#include "ops/math/winograd.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "ops/math/gemm.h"
#include "ops/math/threading.h"

namespace kiln::math {
namespace {

std::atomic<uint64_t> g_convolutions{0};
// A pass's transformed inputs and products (P x (channels + filters) floats a tile) are
// kept near this size, so both stay in the core's L2 between the transforms and products.
constexpr int64_t kPassBytes = int64_t{512} << 10;
// Tiles a pass takes at least when the transformed filter is larger than kPassBytes (each
// of its floats then serves that many multiply-adds per pass).
constexpr int64_t kColdFilterTiles = 96;
// Floats past a pass's products that the output transform may read (a vector's width).
constexpr int64_t kSlack = 16;

// The filter transform G g G^T of one 3x3 filter for tile size M (4 or 2), in double: W x W
// values, W = M + 2.
void transform_filter(const float* g, int tile, double* u) {
  static constexpr double G4[6][3] = {{1.0 / 4, 0, 0},
                                      {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                      {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                      {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                      {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                      {0, 0, 1}};
  static constexpr double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  const int w = tile + 2;
  const double(*G)[3] = tile == 4 ? G4 : G2;
  double t[6][3];
  for (int i = 0; i < w; ++i) {
    for (int c = 0; c < 3; ++c) t[i][c] = G[i][0] * g[c] + G[i][1] * g[3 + c] + G[i][2] * g[6 + c];
  }
  for (int i = 0; i < w; ++i) {
    for (int j = 0; j < w; ++j)
      u[i * w + j] = t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2];
  }
}

int64_t positions(int tile) {
  return (tile + 2) * (tile + 2);
}

// M_xi = U_xi V_xi of one pass for filters [f0, f1) (f0 a multiple of mr): the transformed
// filter's rows in tiles of mr, the pass's tiles in columns of nr (V_xi's rows P ld floats
// apart).
void pass_products(const GemmKernels& g, const float* filter, int64_t per, int64_t f0, int64_t f1,
                   const WinogradPlan& p, int64_t count, const float* v, float* m) {
  const int64_t filters = p.shape.filters, channels = p.shape.channels, P = positions(p.shape.tile);
  const int64_t panels = (count + g.nr - 1) / g.nr, stride = P * p.ld;
  for (int64_t xi = 0; xi < P; ++xi) {
    const PackedA a(filter + xi * per, filters, channels, g.mr);
    const float* vx = v + xi * p.ld;
    float* mx = m + xi * p.ld;
    for (int64_t p0 = 0; p0 < channels; p0 += PackedA::kBlock) {
      const int64_t kc = std::min(PackedA::kBlock, channels - p0);
      for (int64_t i = f0; i < f1; i += g.mr) {
        const int rows = static_cast<int>(std::min<int64_t>(g.mr, f1 - i));
        const float* ap = a.panel(i, p0);
        for (int64_t q = 0; q < panels; ++q) {
          const int cols = static_cast<int>(std::min<int64_t>(g.nr, count - q * g.nr));
          g.kernel_cold_a(kc, ap, vx + p0 * stride + q * g.nr, stride, mx + i * stride + q * g.nr,
                          stride, rows, cols, p0 > 0, nullptr);
        }
      }
    }
  }
}

// Zeros the columns past the pass's `count` tiles up to the last register tile's edge
// (channels [c0, c1)), which the tile reads: left unwritten, they would hold whatever the
// buffer held.
void clear_tail(const WinogradPlan& p, int nr, int64_t count, int64_t c0, int64_t c1, float* v) {
  const int64_t end = (count + nr - 1) / nr * nr, P = positions(p.shape.tile);
  if (end == count) return;
  for (int64_t row = c0 * P; row < c1 * P; ++row)
    std::fill(v + row * p.ld + count, v + row * p.ld + end, 0.0f);
}

}  // namespace

int64_t winograd_filter_floats(int64_t filters, int64_t channels, int mr, int tile) {
  return positions(tile) * PackedA::packed_floats(filters, channels, mr);
}

void winograd_pack_filter(const float* w, int64_t filters, int64_t channels, int tile, float* out,
                          const MathKernels& kernels) {
  const int64_t P = positions(tile), mr = kernels.gemm.mr;
  const int64_t per = PackedA::packed_floats(filters, channels, kernels.gemm.mr);
  // A row tile of filters at a time: their transforms (P floats per filter and channel) are
  // packed position by position into the row tile's place in each position's operand.
  std::vector<float> block(static_cast<size_t>(mr * channels * P));
  double u[36];
  for (int64_t f0 = 0; f0 < filters; f0 += mr) {
    const int64_t rows = std::min(mr, filters - f0);
    for (int64_t fc = 0; fc < rows * channels; ++fc) {
      transform_filter(w + (f0 * channels + fc) * 9, tile, u);
      for (int64_t xi = 0; xi < P; ++xi)
        block[static_cast<size_t>(fc * P + xi)] = static_cast<float>(u[xi]);
    }
    for (int64_t xi = 0; xi < P; ++xi) {
      const MatrixView view{block.data() + xi, rows, channels, channels * P, P};
      PackedA::pack_rows_into(view, f0, filters, out + xi * per, kernels);
    }
  }
}

WinogradPlan winograd_plan(const WinogradShape& s, int64_t images, int threads,
                           const MathKernels& kernels) {
  WinogradPlan p;
  p.shape = s;
  p.images = images;
  const int64_t nr = kernels.gemm.nr, P = positions(s.tile), m = s.tile;
  p.tiles_w = (s.out_w + m - 1) / m;
  p.tiles = (s.out_h + m - 1) / m * p.tiles_w;
  const int64_t per_tile = P * (s.channels + s.filters) * 4;
  int64_t target = std::max<int64_t>(kPassBytes / std::max<int64_t>(per_tile, 1) / nr, 1) * nr;
  // A transformed filter larger than that streams from memory (or L3) once a pass: passes
  // of enough tiles keep its stream below the products' pace.
  if (P * s.channels * s.filters * 4 > kPassBytes) target = std::max(target, kColdFilterTiles);
  p.block = std::max<int64_t>(std::min(target, p.tiles), 1);
  p.blocks = (p.tiles + p.block - 1) / p.block;
  const double work = static_cast<double>(images * p.tiles) * static_cast<double>(P) *
                      static_cast<double>(s.channels) * static_cast<double>(s.filters);
  p.tasks = tasks_for(work, threads);
  const int64_t passes = images * p.blocks;
  p.by_pass = p.tasks > 1 && passes >= 2 * p.tasks;
  p.ld = (p.block + nr - 1) / nr * nr;
  p.slot_floats = P * p.ld * (s.channels + s.filters) + kSlack;
  p.slots = p.tasks;
  p.row_floats = winograd_scratch_floats(p.block);
  return p;
}

uint64_t winograd_convolutions() {
  return g_convolutions.load(std::memory_order_relaxed);
}

void winograd_convolve(const WinogradPlan& p, const float* x, int64_t x_image, const float* filter,
                       const float* bias, bool accumulate, bool relu, float* y, int64_t y_image,
                       float* space, const MathKernels& kernels) {
  g_convolutions.fetch_add(1, std::memory_order_relaxed);
  const WinogradShape& s = p.shape;
  const GemmKernels& g = kernels.gemm;
  const WinogradTransforms& w = s.tile == 4 ? kernels.winograd.f4 : kernels.winograd.f2;
  const int64_t P = positions(s.tile);
  const int64_t per = PackedA::packed_floats(s.filters, s.channels, g.mr);
  const int64_t ip = s.in_h * s.in_w, op = s.out_h * s.out_w;
  float* rows = space + p.slots * p.slot_floats;
  auto tiles_of = [&](int64_t pass) {
    WinogradTiles b;
    b.in_h = s.in_h, b.in_w = s.in_w, b.pad_h = s.pad_h, b.pad_w = s.pad_w;
    b.out_h = s.out_h, b.out_w = s.out_w, b.tiles_w = p.tiles_w;
    b.t0 = pass % p.blocks * p.block;
    b.count = std::min(p.block, p.tiles - b.t0);
    return b;
  };
  const int64_t passes = p.images * p.blocks;
  if (p.by_pass) {
    // Passes dealt to the tasks in turn, each with its own buffers.
    run_tasks(p.tasks, [&](int t) {
      float* v = space + t * p.slot_floats;
      float* m = v + P * p.ld * s.channels;
      float* r = rows + t * p.row_floats;
      for (int64_t pass = t; pass < passes; pass += p.tasks) {
        const int64_t n = pass / p.blocks;
        const WinogradTiles b = tiles_of(pass);
        clear_tail(p, g.nr, b.count, 0, s.channels, v);
        w.input(x + n * x_image, ip, 0, s.channels, b, v, p.ld, r);
        pass_products(g, filter, per, 0, s.filters, p, b.count, v, m);
        w.output(m, p.ld, 0, s.filters, b, bias, accumulate, relu, y + n * y_image, op, r);
      }
    });
    return;
  }
  // Too few passes to deal out: each pass's filters split among the tasks, each task
  // transforming the pass's input itself (a few per cent of the work done twice, where
  // splitting the transforms too would take three hand-offs per pass).
  for (int64_t pass = 0; pass < passes; ++pass) {
    const int64_t n = pass / p.blocks;
    const WinogradTiles b = tiles_of(pass);
    run_tasks(p.tasks, [&](int t) {
      const int64_t f0 = part_edge(t, p.tasks, s.filters, g.mr);
      const int64_t f1 = part_edge(t + 1, p.tasks, s.filters, g.mr);
      if (f0 >= f1) return;
      float* v = space + t * p.slot_floats;
      float* m = v + P * p.ld * s.channels;
      float* r = rows + t * p.row_floats;
      clear_tail(p, g.nr, b.count, 0, s.channels, v);
      w.input(x + n * x_image, ip, 0, s.channels, b, v, p.ld, r);
      pass_products(g, filter, per, f0, f1, p, b.count, v, m);
      w.output(m, p.ld, f0, f1, b, bias, accumulate, relu, y + n * y_image, op, r);
    });
  }
}

}  // namespace kiln::math
