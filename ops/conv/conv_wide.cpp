#include "ops/conv/conv_wide.h"

#include <algorithm>

#include "ops/core/common.h"
#include "ops/elementwise/activation.h"

namespace kiln::ops::convolution {
namespace {

// Output rows at least this wide take the wide path below (narrower ones would compute
// too many discarded positions: (kernel width - 1) / stride per row).
constexpr int64_t kMinWideWidth = 12;

// Output rows at least this wide may be products of their own (rows_direct).
constexpr int64_t kMinDirectRowWidth = 64;

// Whether each output row is better its own product, written straight into y, than a band of
// wide rows copied out: when the row's columns, rounded to the tile kernels' vectors (a last
// tile of at most half the tile width takes one vector), are at most the wide row's plus a
// thirty-second (the copy-out's pass over y). light resnet50's 7x7 stride-2 stem (112
// outputs a row, wide rows of 115) and squeezenet's 3x3 stride-2 first layer (111 of 112) are
// such rows; a 28-wide output row (wide rows of 29-30 columns, 32 computed) is not.
bool rows_direct(const math::ConvGeometry& cg, const WideExtent& w, int nr) {
  const int64_t out_w = cg.out[2], rest = out_w % nr;
  const int64_t computed = out_w - rest + (rest == 0 ? 0 : rest <= nr / 2 ? nr / 2 : nr);
  return out_w >= kMinDirectRowWidth && computed <= w.len[2] + w.len[2] / 32;
}

// The wide path's product one output row at a time, each row's patch rows read in place from
// the laid-out channels and its product stored into y with the bias, Z and activation (the
// tile epilogue): no wide product, no copy-out. Rows are dealt to the threads (a single row
// is split inside the product).
void direct_rows(const math::PackedA& a, const float* bias, float* y, int64_t op, const Sizes& s,
                 const math::ConvGeometry& cg, const WideLayout& w, const ConvEpilogue& e,
                 const float* xp) {
  const int64_t rows_out = cg.out[0] * cg.out[1], out_w = cg.out[2];
  const auto kk = static_cast<int64_t>(w.row_offsets.size());
  math::GemmOptions o;
  o.row_bias = bias;
  o.accumulate = e.accumulate;
  o.activation = e.activation;
  if (rows_out > 1) o.max_threads = 1;
  const int64_t row_work = s.mg * out_w * kk;
  parallel_for(rows_out, grain_for(row_work, int64_t{1} << 20), [&](int64_t lo, int64_t hi) {
    std::vector<const float*> rows(static_cast<size_t>(kk));
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t od = r / cg.out[1], oh = r % cg.out[1];
      const float* base = xp + (od * w.len[1] + oh) * w.len[2];
      for (int64_t p = 0; p < kk; ++p) rows[static_cast<size_t>(p)] = base + w.row_offsets[p];
      math::sgemm_indirect(a, out_w, rows.data(), y + r * out_w, op, o);
    }
  });
}

// The wide path's buffers (one group's laid-out channels and the product over the wide
// positions) are kept within this many floats (2 MiB) by running the product over bands of
// output rows, one after another, so its patch rows are read, and its product copied out,
// from the caches rather than from memory (a large map's layer runs markedly faster in bands:
// measured, docs/performance.md, "Figures cited in code comments").
constexpr int64_t kWideBandFloats = int64_t{1} << 19;

}  // namespace

void wide_convolve(const float* xg, int64_t ip, const math::PackedA& a, const float* bias, float* y,
                   int64_t op, const Sizes& s, const math::ConvGeometry& cg, const WideLayout& w,
                   const ConvEpilogue& e, float* xp, float* wide) {
  const int64_t wp = w.len[2];
  parallel_for(s.cg, grain_for(w.plane), [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) pad_phases(xg + c * ip, cg, w, xp + c * w.plane);
  });
  if (rows_direct(cg, w, math::kernels().gemm.nr)) {
    return direct_rows(a, bias, y, op, s, cg, w, e, xp);
  }
  // The bias and the activation are applied while the valid columns are copied out (one
  // pass over y instead of another over the wide product).
  // Every patch-matrix row is a run of xp: the product reads it there (no lowering).
  std::vector<const float*> rows(w.row_offsets.size());
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = xp + w.row_offsets[r];
  math::sgemm_indirect(a, w.wide_n, rows.data(), wide, w.wide_n);
  const bool relu = e.activation == math::Activation::Relu;
  parallel_for(s.mg, grain_for(op), [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      float* ym = y + m * op;
      const float b = bias ? bias[m] : 0.0f;
      for (int64_t od = 0; od < cg.out[0]; ++od) {
        for (int64_t oh = 0; oh < cg.out[1]; ++oh) {
          const float* src = wide + m * w.wide_n + (od * w.len[1] + oh) * wp;
          float* dst = ym + (od * cg.out[1] + oh) * cg.out[2];
          if (e.accumulate) {
            for (int64_t i = 0; i < cg.out[2]; ++i) dst[i] += src[i] + b;
          } else if (relu) {
            for (int64_t i = 0; i < cg.out[2]; ++i) {
              const float v = src[i] + b;
              dst[i] = v > 0.0f ? v : 0.0f;
            }
          } else {
            for (int64_t i = 0; i < cg.out[2]; ++i) dst[i] = src[i] + b;
          }
        }
      }
      if (e.accumulate || !relu)
        apply_activation(e.activation, ym, cg.out[0] * cg.out[1] * cg.out[2]);
    }
  });
}

math::ConvGeometry band_geometry(const Geometry& g, int64_t oh0, int64_t rows, int64_t& in_row0) {
  math::ConvGeometry b = conv_geometry(g);
  const int64_t start = oh0 * g.stride[1] - g.pad[1];
  const int64_t end = (oh0 + rows - 1) * g.stride[1] - g.pad[1] + (g.k[1] - 1) * g.dil[1] + 1;
  in_row0 = std::clamp<int64_t>(start, 0, g.in[1]);
  b.in[1] = std::max<int64_t>(std::min(end, g.in[1]) - in_row0, 0);
  b.pad[1] = in_row0 - start;
  b.out[1] = rows;
  return b;
}

int64_t wide_band(const Sizes& s, const Geometry& g) {
  if (g.out[0] != 1) return g.out[1];
  int64_t rows = g.out[1], in_row0 = 0;
  auto floats = [&](int64_t r) {
    const WideExtent w(band_geometry(g, 0, r, in_row0));
    return s.cg * w.plane + s.mg * w.wide_n;
  };
  while (rows > 1 && floats(rows) > kWideBandFloats) rows = (rows + 1) / 2;
  return rows;
}

int64_t wide_floats(const Sizes& s, const Geometry& g) {
  if (g.out_size() == 0 || s.m == 0 || s.n == 0 || use_direct(s, g) || use_winograd(s, g) ||
      use_transposed(s, g) || is_pointwise(g) || g.out[2] < kMinWideWidth) {
    return 0;
  }
  int64_t in_row0 = 0;
  const WideExtent w(band_geometry(g, 0, wide_band(s, g), in_row0));
  return s.cg * w.plane + s.mg * w.wide_n;
}

}  // namespace kiln::ops::convolution
