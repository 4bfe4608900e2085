// DeformConv: 2-D convolution whose kernel taps are shifted by learned per-position offsets
// (sampled bilinearly, zero outside the image) and optionally scaled by a mask.
//
// Like Conv it is im2col + GEMM: each task samples the patches of a block of output
// positions of one (image, group) into a per-thread buffer and multiplies it by the group's
// weights in the GEMM layer (ops/math/gemm.h), single-threaded inside the task, with the
// bias as the row epilogue.
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/core/geometry.h"
#include "ops/core/workspace.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

struct Problem {
  int64_t n, c, m, groups, cg, mg, offset_groups;
  int64_t ih, iw, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw;
};

// x at (h, w) by bilinear interpolation; taps outside the image read as zero.
template <typename T>
T bilinear(const T* x, int64_t height, int64_t width, T h, T w) {
  if (!(h > T(-1) && h < T(height) && w > T(-1) && w < T(width))) return T(0);
  const T hf = std::floor(h), wf = std::floor(w);
  const int64_t h0 = static_cast<int64_t>(hf), w0 = static_cast<int64_t>(wf);
  const T lh = h - hf, lw = w - wf;
  auto at = [&](int64_t y, int64_t xx) {
    return y >= 0 && y < height && xx >= 0 && xx < width ? x[y * width + xx] : T(0);
  };
  return (T(1) - lh) * ((T(1) - lw) * at(h0, w0) + lw * at(h0, w0 + 1)) +
         lh * ((T(1) - lw) * at(h0 + 1, w0) + lw * at(h0 + 1, w0 + 1));
}

// How the positions of each (image, group) split into blocks of `blk` for the tasks, and the
// patches' scratch: `slots` buffers of `kk * blk` elements (one per thread when tasks run in
// parallel). A function of the sizes and the thread count alone: the workspace rule and the
// kernel both call it.
struct PositionBlocks {
  int64_t cb = 0, blk = 0, kk = 0, slots = 0;
  int tasks = 1;
  int64_t scratch_elements() const { return slots * kk * blk; }
};

PositionBlocks position_blocks(const Problem& p, int threads) {
  PositionBlocks b;
  const int64_t kp = p.kh * p.kw, op = p.oh * p.ow;
  b.kk = p.cg * kp;
  if (op == 0 || p.m == 0 || p.n == 0) return b;
  constexpr int64_t kScratchElems = 1 << 18;
  const int64_t units = p.n * p.groups;
  int64_t cb = (b.kk * op + kScratchElems - 1) / kScratchElems;
  // Multiply-adds of the products plus the sampling (four taps per patch element).
  const double work = static_cast<double>(units) * static_cast<double>(b.kk) *
                      static_cast<double>(op) * static_cast<double>(p.mg + 4);
  b.tasks = math::tasks_for(work, threads);
  if (b.tasks > 1 && units * cb < 2 * b.tasks) {
    cb = std::max(cb, std::min<int64_t>((2 * b.tasks + units - 1) / units, op / 16));
  }
  b.cb = std::clamp<int64_t>(cb, 1, op);
  b.blk = (op + b.cb - 1) / b.cb;
  // The tasks sample and multiply blocks of output positions; each product stays on its
  // task's thread.
  b.slots = b.tasks > 1 ? threads : 1;
  return b;
}

// `scratch` holds `b.scratch_elements()` (position_blocks of these sizes).
template <typename T>
void deform_convolve(const Problem& p, const PositionBlocks& b, T* scratch, const T* x, const T* w,
                     const T* offset, const T* mask, const T* bias, T* y) {
  const int64_t kp = p.kh * p.kw, kk = p.cg * kp, op = p.oh * p.ow, ip = p.ih * p.iw;
  if (op == 0 || p.m == 0 || p.n == 0) return;
  const int64_t cpo = p.c / p.offset_groups;  // input channels per offset group
  const int64_t units = p.n * p.groups;
  const int64_t cb = b.cb, blk = b.blk, slots = b.slots;
  const int tasks = b.tasks;
  math::GemmOptions o;
  o.max_threads = 1;

  parallel_for(units * cb, tasks > 1 ? 1 : units * cb, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t unit = t / cb, n = unit / p.groups, g = unit % p.groups;
      const int64_t p0 = (t % cb) * blk, p1 = std::min(op, p0 + blk);
      if (p0 >= p1) continue;
      int slot = slots > 1 ? tbb::this_task_arena::current_thread_index() : 0;
      if (slot < 0 || slot >= slots) slot = 0;
      T* col = scratch + slot * kk * blk;
      const int64_t len = p1 - p0;
      for (int64_t c = 0; c < p.cg; ++c) {
        const int64_t ch = g * p.cg + c, og = ch / cpo;
        const T* xc = x + (n * p.c + ch) * ip;
        for (int64_t k = 0; k < kp; ++k) {
          const int64_t ki = k / p.kw, kj = k % p.kw;
          const T* off_h = offset + ((n * p.offset_groups + og) * kp * 2 + 2 * k) * op;
          const T* off_w = off_h + op;
          const T* mk = mask ? mask + ((n * p.offset_groups + og) * kp + k) * op : nullptr;
          T* dst = col + (c * kp + k) * len;
          for (int64_t q = p0; q < p1; ++q) {
            const int64_t oy = q / p.ow, ox = q % p.ow;
            const T h = static_cast<T>(oy * p.sh - p.ph + ki * p.dh) + off_h[q];
            const T ww = static_cast<T>(ox * p.sw - p.pw + kj * p.dw) + off_w[q];
            T v = bilinear(xc, p.ih, p.iw, h, ww);
            if (mk) v *= mk[q];
            dst[q - p0] = v;
          }
        }
      }
      // Y[mo.., p0..p1) = W (this group's [mg x kk]) * col (+ bias per output channel)
      const int64_t mo = g * p.mg;
      math::GemmOptions go = o;
      T* yb = y + (n * p.m + mo) * op + p0;
      if constexpr (std::is_same_v<T, float>) {
        go.row_bias = bias ? bias + mo : nullptr;
        math::sgemm(math::MatrixView::row_major(w + mo * kk, p.mg, kk, kk),
                    math::MatrixView::row_major(col, kk, len, len), yb, op, go);
      } else {
        math::gemm<T>(w + mo * kk, p.mg, kk, kk, 1, col, len, len, 1, yb, op, go);
        if (bias) {
          for (int64_t i = 0; i < p.mg; ++i) {
            for (int64_t j = 0; j < len; ++j) yb[i * op + j] += bias[mo + i];
          }
        }
      }
    }
  });
}

// The sizes of one deformable convolution of X and W of these (4-D) shapes.
Problem problem_of(const Shape& x, const Shape& w, int64_t groups, int64_t offset_groups,
                   const WindowAttrs& window) {
  Problem p{};
  p.n = x[0];
  p.c = x[1];
  p.m = w[0];
  p.groups = groups;
  p.cg = w[1];
  p.mg = p.m / p.groups;
  p.offset_groups = offset_groups;
  p.ih = x[2];
  p.iw = x[3];
  const std::vector<WindowAxis> axes =
      forward_windows(spatial_dims(x), conv_kernel(window, spatial_dims(w)), window);
  p.kh = axes[0].kernel;
  p.kw = axes[1].kernel;
  p.sh = axes[0].stride;
  p.sw = axes[1].stride;
  p.dh = axes[0].dilation;
  p.dw = axes[1].dilation;
  p.ph = axes[0].pad_begin;
  p.pw = axes[1].pad_begin;
  p.oh = axes[0].out;
  p.ow = axes[1].out;
  return p;
}

// The workspace of one run: the patches' scratch (position_blocks), and for half types the
// inputs (of `shapes`, empty when absent) and Y in float.
struct Parts {
  WorkspaceLayout layout;
  PositionBlocks blocks;
  std::array<int, 5> wide{-1, -1, -1, -1, -1};
  int y = -1, columns = -1;
};

Parts workspace_parts(DataType dtype, const Problem& p, const std::array<Shape, 5>& shapes,
                      int threads) {
  Parts r;
  const bool half = dtype == DataType::Float16 || dtype == DataType::BFloat16;
  if (half) {
    for (size_t i = 0; i < shapes.size(); ++i)
      if (!shapes[i].empty()) r.wide[i] = r.layout.add(DataType::Float, shape_numel(shapes[i]));
    r.y = r.layout.add(DataType::Float, p.n * p.m * p.oh * p.ow);
  }
  r.blocks = position_blocks(p, threads);
  r.columns = r.layout.add(dtype == DataType::Double ? DataType::Double : DataType::Float,
                           r.blocks.scratch_elements());
  return r;
}

class DeformConv final : public Kernel {
 public:
  explicit DeformConv(const NodeInfo& info)
      : group_(info.attr_int("group", 1)),
        offset_group_(info.attr_int("offset_group", 1)),
        window_(window_attrs(info.node())) {
    if (group_ < 1 || offset_group_ < 1 || group_ > kMaxWindowAttr ||
        offset_group_ > kMaxWindowAttr)
      info.fail("group and offset_group must be positive");
    const auto two_d = [](const std::vector<int64_t>& v, size_t n) {
      return v.empty() || v.size() == n;
    };
    if (!two_d(window_.strides, 2) || !two_d(window_.dilations, 2) || !two_d(window_.pads, 4) ||
        !two_d(window_.kernel_shape, 2)) {
      info.fail("only 2-D DeformConv is supported", ErrorKind::Unsupported);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor& off = ctx.input(2);
    const bool has_bias = ctx.has_input(3), has_mask = ctx.has_input(4);
    if (x.rank() != 4 || w.rank() != 4 || off.rank() != 4) {
      ctx.fail("only 2-D DeformConv is supported (X, W and offset must be 4-D)",
               ErrorKind::Unsupported);
    }
    for (size_t i = 1; i < 5; ++i) {
      if (ctx.has_input(i) && ctx.input(i).dtype() != x.dtype()) {
        ctx.fail("inputs have different element types");
      }
    }
    const Problem p = problem_of(x.shape(), w.shape(), group_, offset_group_, window_);
    if (p.cg * p.groups != p.c || p.m % p.groups != 0) {
      ctx.fail("weight " + w.describe() + " does not match input " + x.describe() + " with group " +
               std::to_string(p.groups));
    }
    if (p.c % p.offset_groups != 0) ctx.fail("input channels are not divisible by offset_group");
    const int64_t kp = p.kh * p.kw;
    if (off.shape() != Shape{p.n, p.offset_groups * kp * 2, p.oh, p.ow}) {
      ctx.fail("offset " + off.describe() + " does not match the output size");
    }
    if (has_mask && ctx.input(4).shape() != Shape{p.n, p.offset_groups * kp, p.oh, p.ow}) {
      ctx.fail("mask " + ctx.input(4).describe() + " does not match the output size");
    }
    if (has_bias && ctx.input(3).numel() != p.m) ctx.fail("bias must have one value per channel");
    const Shape out_shape{p.n, p.m, p.oh, p.ow};
    // The output, then the workspace (deform_conv_workspace).
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    std::array<Shape, 5> shapes;
    for (size_t i = 0; i < 5; ++i)
      if (ctx.has_input(i)) shapes[i] = ctx.input(i).shape();
    const Parts parts = workspace_parts(x.dtype(), p, shapes, ctx.threads());
    const Workspace space(ctx, parts.layout);
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        // Computed in float: the inputs and Y widened in the workspace.
        auto widen = [&](size_t i) {
          if (!ctx.has_input(i)) return Tensor();
          const Tensor& t = ctx.input(i);
          Tensor f = space.tensor(parts.wide[i], t.shape());
          unary_loop<T, float>(t, f, [](T v) { return static_cast<float>(v); });
          return f;
        };
        const Tensor fx = widen(0), fw = widen(1), fo = widen(2), fb = widen(3), fm = widen(4);
        Tensor fy = space.tensor(parts.y, out_shape);
        deform_convolve<float>(p, parts.blocks, space.data<float>(parts.columns),
                               fx.data<const float>(), fw.data<const float>(),
                               fo.data<const float>(), has_mask ? fm.data<const float>() : nullptr,
                               has_bias ? fb.data<const float>() : nullptr, fy.data<float>());
        unary_loop<float, T>(fy, y, [](float v) { return T(v); });
      } else {
        deform_convolve<T>(p, parts.blocks, space.data<T>(parts.columns), x.data<const T>(),
                           w.data<const T>(), off.data<const T>(),
                           has_mask ? ctx.input(4).data<const T>() : nullptr,
                           has_bias ? ctx.input(3).data<const T>() : nullptr, y.data<T>());
      }
    });
  }

 private:
  int64_t group_, offset_group_;
  WindowAttrs window_;
};

void deform_conv_shape(ShapeContext& c) {
  c.set(0, c.dtype(0), conv_output_shape(c.shape(0), c.shape(1), window_attrs(c.node())));
}

// The kernel's workspace (workspace_parts) for these shapes on c.threads() threads.
uint64_t deform_conv_workspace(const ShapeContext& c) {
  std::array<Shape, 5> shapes;
  for (size_t i = 0; i < 5; ++i)
    if (c.has_input(i)) shapes[i] = c.shape(i);
  if (shapes[0].size() != 4 || shapes[1].size() != 4) unknown("X or W not 4-D");
  const int64_t groups = c.attr_int("group", 1);
  if (groups < 1 || shapes[1][0] % groups != 0) unknown("bad group");
  const Problem p = problem_of(shapes[0], shapes[1], groups, c.attr_int("offset_group", 1),
                               window_attrs(c.node()));
  return workspace_parts(c.dtype(0), p, shapes, c.threads()).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "DeformConv",
                  .since = 19,
                  .min_inputs = 3,
                  .max_inputs = 5,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16 (2-D only)",
                  .shape = deform_conv_shape,
                  .workspace = deform_conv_workspace,
                  .create = make<DeformConv>});

}  // namespace kiln::ops
