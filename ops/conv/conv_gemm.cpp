#include "ops/conv/conv_gemm.h"

#include <atomic>
#include <stdexcept>

#include "ops/conv/conv.h"
#include "ops/conv/conv_small_maps.h"
#include "ops/conv/conv_wide.h"
#include "ops/core/common.h"
#include "ops/elementwise/activation.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"

namespace kiln::ops::convolution {
namespace {

// Float convolutions run as strided windows (strided_window_convolutions()).
std::atomic<uint64_t> strided_window_count{0};

// A convolution as Winograd products (use_winograd), group by group; `packed` is the
// filter's Winograd form. Relu is applied as the outputs are stored, other activations after.
void winograd_convolve(const float* x, const float* packed, const float* bias, float* y,
                       const Sizes& s, const Geometry& g, const ConvEpilogue& e,
                       const ConvSpace& space) {
  if (!space.winograd) throw std::logic_error("Winograd convolution without its workspace");
  const math::MathKernels& t = math::kernels();
  const math::WinogradPlan plan = winograd_plan(s, g, space.threads);
  const int64_t per = math::winograd_filter_floats(s.mg, s.cg, t.gemm.mr, plan.shape.tile);
  const int64_t ip = g.in_size(), op = g.out_size();
  const bool relu = e.activation == math::Activation::Relu;
  for (int64_t grp = 0; grp < s.groups; ++grp) {
    math::winograd_convolve(plan, x + grp * s.cg * ip, s.c * ip, packed + grp * per,
                            bias ? bias + grp * s.mg : nullptr, e.accumulate, relu,
                            y + grp * s.mg * op, s.m * op, space.winograd, t);
  }
  if (!relu) apply_activation(e.activation, y, s.n * s.m * op);
}

}  // namespace

math::WinogradPlan winograd_plan(const Sizes& s, const Geometry& g, int threads) {
  return math::winograd_plan(winograd_shape(s, g), s.n, threads, math::kernels());
}

void gemm_convolve(OpContext* ctx, const float* x, const float* packed, const float* bias, float* y,
                   const Sizes& s, const Geometry& g, const ConvEpilogue& e,
                   const ConvSpace& space) {
  if (use_strided_windows(s, g)) strided_window_count.fetch_add(1, std::memory_order_relaxed);
  if (use_winograd(s, g)) {
    winograd_convolve(x, packed, bias, y, s, g, e, space);
    return;
  }
  if (use_transposed(s, g)) {
    transposed_convolve(x, packed, bias, y, s, g, e, space.source, space.product, space.offsets);
    return;
  }
  float* wide_space = space.wide;
  const math::MathKernels& t = math::kernels();
  const math::ConvGeometry cg = conv_geometry(g);
  const int64_t ip = g.in_size(), op = g.out_size(), kk = s.cg * g.k_size();
  const int64_t per = math::PackedA::packed_floats(s.mg, kk, t.gemm.mr);
  const bool pointwise = is_pointwise(g);
  const int64_t units = s.n * s.groups;
  const double work = static_cast<double>(units) * static_cast<double>(s.mg) *
                      static_cast<double>(kk) * static_cast<double>(op);
  const int tasks = math::task_count(work);
  // Many (image, group) units: one single-threaded product each; else one after another,
  // each split across the threads.
  const bool by_unit = tasks > 1 && units >= 2 * tasks;
  math::GemmOptions o;
  o.accumulate = e.accumulate;
  o.activation = e.activation;
  if (by_unit) o.max_threads = 1;
  const bool wide = (ctx || wide_space) && !by_unit && wide_floats(s, g) > 0;
  if (wide) {
    // Bands of output rows (all of them in one unless the layout would outgrow the caches);
    // the first band's layout is the largest.
    const int64_t band = wide_band(s, g);
    int64_t in_row0 = 0;
    const WideExtent first(band_geometry(g, 0, band, in_row0));
    Tensor xp_scratch, wide_scratch;
    float* xp = wide_space;
    float* wide_y = wide_space ? wide_space + s.cg * first.plane : nullptr;
    if (!wide_space) {
      xp_scratch = ctx->allocate(DataType::Float, Shape{s.cg * first.plane});
      wide_scratch = ctx->allocate(DataType::Float, Shape{s.mg * first.wide_n});
      xp = xp_scratch.data<float>();
      wide_y = wide_scratch.data<float>();
    }
    for (int64_t oh0 = 0; oh0 < g.out[1]; oh0 += band) {
      const math::ConvGeometry bg = band_geometry(g, oh0, std::min(band, g.out[1] - oh0), in_row0);
      const WideLayout layout(bg, s.cg);
      for (int64_t u = 0; u < units; ++u) {
        const int64_t n = u / s.groups, grp = u % s.groups;
        const math::PackedA a(packed + grp * per, s.mg, kk, t.gemm.mr);
        wide_convolve(x + (n * s.c + grp * s.cg) * ip + in_row0 * g.in[2], ip, a,
                      bias ? bias + grp * s.mg : nullptr,
                      y + (n * s.m + grp * s.mg) * op + oh0 * g.out[2], op, s, bg, layout, e, xp,
                      wide_y);
      }
    }
    return;
  }
  auto unit_product = [&](int64_t unit) {
    const int64_t n = unit / s.groups, grp = unit % s.groups;
    const float* xg = x + (n * s.c + grp * s.cg) * ip;
    const math::PackedA a(packed + grp * per, s.mg, kk, t.gemm.mr);
    math::GemmOptions uo = o;
    uo.row_bias = bias ? bias + grp * s.mg : nullptr;
    math::BPacker pack_b;
    if (pointwise) {
      pack_b = [&](int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
        t.gemm.pack_b(xg + p0 * ip + j0, ip, 1, kc, nc, out);
      };
    } else {
      pack_b = [&](int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
        t.conv.im2col_panels(xg, cg, p0, kc, j0, nc, out);
      };
    }
    math::sgemm(a, op, pack_b, y + (n * s.m + grp * s.mg) * op, op, uo);
  };
  if (by_unit) {
    parallel_for(units, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t u = lo; u < hi; ++u) unit_product(u);
    });
  } else {
    for (int64_t u = 0; u < units; ++u) unit_product(u);
  }
}

}  // namespace kiln::ops::convolution

namespace kiln::ops {

uint64_t strided_window_convolutions() {
  return convolution::strided_window_count.load(std::memory_order_relaxed);
}

}  // namespace kiln::ops
