// ConvTranspose: the gradient of Conv with respect to its input, for 1-D, 2-D and 3-D
// inputs with groups, strides, dilations, pads, output_padding, output_shape and auto_pad.
//
// Each (image, group) is a GEMM in the GEMM layer (ops/math/gemm.h), columns = W^T * X
// ([out channels * kernel] x input positions), followed by col2im, which adds every column
// into the output positions its kernel taps reach. W^T of each group is packed once when the
// session is planned (shared through the weights cache) and X is read as the GEMM's B. The
// product runs in blocks of output channels that bound the columns' scratch; tasks own
// disjoint blocks, so they never write the same output. Half types compute in float; double
// reads W in place with plain loops.
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <numeric>
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

// Sizes of one transposed convolution in three dimensions (1-D and 2-D get leading 1s).
// `pad` is the leading padding and may be negative when output_shape asks for more.
using Geometry = Windows3;

// First j >= 0 with base + j * s >= limit (s > 0).
inline int64_t first_at_least(int64_t base, int64_t s, int64_t limit) {
  const int64_t need = limit - base;
  return need <= 0 ? 0 : (need + s - 1) / s;
}

// Adds the columns of `channels` output channels ([channels * kernel] x input positions)
// into their output planes `y`.
template <typename T>
void col2im(const T* col, int64_t channels, const Geometry& g, T* y) {
  const int64_t ip = g.in_size(), op = g.out_size();
  const T* src = col;
  for (int64_t c = 0; c < channels; ++c) {
    T* yc = y + c * op;
    for (int64_t kd = 0; kd < g.k[0]; ++kd) {
      for (int64_t kh = 0; kh < g.k[1]; ++kh) {
        for (int64_t kw = 0; kw < g.k[2]; ++kw, src += ip) {
          const int64_t base = kw * g.dil[2] - g.pad[2];
          const int64_t lo = std::min(first_at_least(base, g.stride[2], 0), g.in[2]);
          const int64_t hi =
              std::clamp<int64_t>(first_at_least(base, g.stride[2], g.out[2]), lo, g.in[2]);
          for (int64_t id = 0; id < g.in[0]; ++id) {
            const int64_t od = id * g.stride[0] - g.pad[0] + kd * g.dil[0];
            if (od < 0 || od >= g.out[0]) continue;
            for (int64_t ih = 0; ih < g.in[1]; ++ih) {
              const int64_t oh = ih * g.stride[1] - g.pad[1] + kh * g.dil[1];
              if (oh < 0 || oh >= g.out[1]) continue;
              T* yrow = yc + (od * g.out[1] + oh) * g.out[2];
              const T* srow = src + (id * g.in[1] + ih) * g.in[2];
              if (g.stride[2] == 1) {
                for (int64_t j = lo; j < hi; ++j) yrow[base + j] += srow[j];
              } else {
                for (int64_t j = lo; j < hi; ++j) yrow[base + j * g.stride[2]] += srow[j];
              }
            }
          }
        }
      }
    }
  }
}

struct Sizes {
  int64_t n, c, m, groups, cg, mg;
};

// The filter of each group as a packed GEMM A: W^T of the group ([mg * kernel] x cg, read
// in place from W's [cg, mg * kernel] rows), one group after another.
Tensor pack_filter(const Tensor& w, int64_t groups) {
  Tensor f = w.contiguous();
  if (f.dtype() != DataType::Float) {
    Tensor wide(DataType::Float, f.shape(),
                Storage::heap_uninitialized(storage_bytes(DataType::Float, f.numel())));
    const math::ConvertKernels& cv = math::kernels().convert;
    (f.dtype() == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(
        reinterpret_cast<const uint16_t*>(f.raw_data()), wide.data<float>(), f.numel());
    f = wide;
  }
  const math::MathKernels& t = math::kernels();
  const int64_t cg = f.dim(0) / groups, wrow = f.numel() / f.dim(0);
  const int64_t per = math::PackedA::packed_floats(wrow, cg, t.gemm.mr);
  Tensor packed(DataType::Float, Shape{groups * per},
                Storage::heap_uninitialized(storage_bytes(DataType::Float, groups * per)));
  for (int64_t grp = 0; grp < groups; ++grp) {
    math::PackedA::pack_into(
        math::MatrixView::col_major(f.data<const float>() + grp * cg * wrow, wrow, cg, wrow),
        packed.data<float>() + grp * per, t);
  }
  packed.storage()->set_read_only();
  return packed;
}

// Columns of one channel block are at most this many elements (they stay in L2 for col2im).
constexpr int64_t kScratchElems = 1 << 18;

// How the product runs in blocks of output channels, and the columns' scratch it takes:
// `slots` blocks of `chans * per_channel` elements (one per thread when blocks run in
// parallel). A function of the sizes and the thread count alone: the workspace rule and the
// kernel both call it.
struct ChannelBlocks {
  int64_t chans = 0, blocks = 0, per_channel = 0, slots = 0;
  bool by_block = false;
  int64_t scratch_elements() const { return slots * chans * per_channel; }
};

ChannelBlocks channel_blocks(const Sizes& s, const Geometry& g, bool is_float, int threads) {
  ChannelBlocks b;
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size(), wrow = s.mg * kp;
  if (op == 0 || s.m == 0 || s.n == 0 || s.cg == 0) return b;  // no product
  const int64_t units = s.n * s.groups;
  const int64_t mr = math::kernels().gemm.mr;
  // A block of output channels starts at a panel of the packed filter: its first row
  // (channel * kernel) is a multiple of the tile height.
  const int64_t step = is_float ? mr / std::gcd<int64_t>(kp, mr) : 1;
  b.per_channel = kp * ip;
  auto to_step = [&](int64_t c) {
    c = std::max<int64_t>(step, (c + step - 1) / step * step);
    return std::min(c, s.mg);
  };
  b.chans = to_step(kScratchElems / std::max<int64_t>(b.per_channel, 1) / step * step);
  const double work = static_cast<double>(units) * static_cast<double>(wrow) *
                      static_cast<double>(s.cg) * static_cast<double>(ip);
  const int tasks = math::tasks_for(work, threads);
  b.blocks = (s.mg + b.chans - 1) / b.chans;
  if (tasks > 1 && units * b.blocks < 2 * tasks) {  // smaller blocks, to give every task work
    const int64_t want = (2 * tasks + units - 1) / units;
    b.chans = to_step((s.mg + want - 1) / want);
    b.blocks = (s.mg + b.chans - 1) / b.chans;
  }
  // Enough blocks for every task: one single-threaded product each; else one block after
  // another, each product split across the threads.
  b.by_block = tasks > 1 && units * b.blocks >= tasks;
  b.slots = b.by_block ? threads : 1;
  return b;
}

// Y for all images and groups; x, bias (may be null) and y contiguous. Float reads the filter
// as pack_filter made it (`packed`); double reads W (`w`) in place. `scratch` holds
// `b.scratch_elements()` (channel_blocks of these sizes).
template <typename T>
void transpose_convolve(const T* x, const T* w, const float* packed, const T* bias, T* y,
                        const Sizes& s, const Geometry& g, const ChannelBlocks& b, T* scratch) {
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size(), wrow = s.mg * kp;
  if (op == 0 || s.m == 0 || s.n == 0) return;
  if (s.cg == 0) {  // no input channels: the bias alone
    for (int64_t i = 0; i < s.n * s.m; ++i) {
      std::fill(y + i * op, y + (i + 1) * op, bias ? bias[i % s.m] : T(0));
    }
    return;
  }
  const int64_t units = s.n * s.groups;
  const math::MathKernels& t = math::kernels();
  constexpr bool kFloat = std::is_same_v<T, float>;
  const int64_t chans = b.chans, blocks = b.blocks, per_channel = b.per_channel;
  const bool by_block = b.by_block;
  const int64_t slots = b.slots;
  math::GemmOptions o;
  if (by_block) o.max_threads = 1;
  const int64_t per = kFloat ? math::PackedA::packed_floats(wrow, s.cg, t.gemm.mr) : 0;

  auto block = [&](int64_t task) {
    const int64_t unit = task / blocks, blk = task % blocks;
    const int64_t n = unit / s.groups, grp = unit % s.groups;
    const int64_t m0 = blk * chans, m1 = std::min(s.mg, m0 + chans);
    int slot = by_block ? tbb::this_task_arena::current_thread_index() : 0;
    if (slot < 0 || slot >= slots) slot = 0;
    T* col = scratch + slot * chans * per_channel;
    const T* xg = x + (n * s.c + grp * s.cg) * ip;
    // col ([channels * kernel] x input positions) = W^T (rows of this block) * X
    if constexpr (kFloat) {
      const math::PackedA a =
          math::PackedA(packed + grp * per, wrow, s.cg, t.gemm.mr).rows(m0 * kp, (m1 - m0) * kp);
      math::sgemm(
          a, ip,
          [&](int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
            t.gemm.pack_b(xg + p0 * ip + j0, ip, 1, kc, nc, out);
          },
          col, ip, o);
    } else {
      math::gemm<T>(w + grp * s.cg * wrow + m0 * kp, (m1 - m0) * kp, s.cg, 1, wrow, xg, ip, ip, 1,
                    col, ip, o);
    }
    const int64_t mo = grp * s.mg + m0;
    T* yb = y + (n * s.m + mo) * op;
    for (int64_t i = 0; i < m1 - m0; ++i) {
      std::fill(yb + i * op, yb + (i + 1) * op, bias ? bias[mo + i] : T(0));
    }
    col2im(col, m1 - m0, g, yb);
  };
  if (by_block) {
    parallel_for(units * blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t task = lo; task < hi; ++task) block(task);
    });
  } else {
    for (int64_t task = 0; task < units * blocks; ++task) block(task);
  }
}

// The workspace of one transposed convolution: the columns' scratch (channel_blocks), and for
// half types X, the bias and Y in float.
struct Parts {
  WorkspaceLayout layout;
  ChannelBlocks blocks;
  int x = -1, bias = -1, y = -1, columns = -1;
};

Parts workspace_parts(DataType dtype, const Sizes& s, const Geometry& g, bool has_bias,
                      int threads) {
  Parts p;
  const bool half = dtype == DataType::Float16 || dtype == DataType::BFloat16;
  if (half) {
    p.x = p.layout.add(DataType::Float, s.n * s.c * g.in_size());
    if (has_bias) p.bias = p.layout.add(DataType::Float, s.m);
    p.y = p.layout.add(DataType::Float, s.n * s.m * g.out_size());
  }
  const bool is_double = dtype == DataType::Double;
  p.blocks = channel_blocks(s, g, !is_double, threads);
  p.columns =
      p.layout.add(is_double ? DataType::Double : DataType::Float, p.blocks.scratch_elements());
  return p;
}

class ConvTranspose final : public Kernel {
 public:
  explicit ConvTranspose(const NodeInfo& info)
      : group_(info.attr_int("group", 1)), window_(window_attrs(info.node())) {
    if (group_ < 1 || group_ > kMaxWindowAttr) info.fail("group must be in [1, 2^31]");
    // A constant filter is packed for the GEMM once, W^T per group.
    const Tensor* w = info.constant_input(1);
    if (w && w->rank() >= 3 && w->numel() > 0 && w->dim(0) % group_ == 0 &&
        (w->dtype() == DataType::Float || w->dtype() == DataType::Float16 ||
         w->dtype() == DataType::BFloat16)) {
      const math::MathKernels& t = math::kernels();
      const int64_t groups = group_;
      packed_ =
          info.prepared_input(1,
                              std::string("convtranspose-filter-") + math::isa_name(t.isa) + "-mr" +
                                  std::to_string(t.gemm.mr) + "-g" + std::to_string(groups),
                              [groups](const Tensor& f) { return pack_filter(f, groups); });
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const bool has_bias = ctx.has_input(2);
    if (x.rank() < 3 || x.rank() > 5) {
      ctx.fail("input must have 1 to 3 spatial dimensions, got " + x.describe(),
               x.rank() > 5 ? ErrorKind::Unsupported : ErrorKind::Runtime);
    }
    if (w.rank() != x.rank())
      ctx.fail("weight " + w.describe() + " does not match " + x.describe());
    if (w.dtype() != x.dtype() || (has_bias && ctx.input(2).dtype() != x.dtype())) {
      ctx.fail("inputs have different element types");
    }
    Sizes s{x.dim(0), x.dim(1), 0, group_, 0, w.dim(1)};
    if (w.dim(0) != s.c || s.c % s.groups != 0) {
      ctx.fail("weight " + w.describe() + " does not match input channels of " + x.describe() +
               " with group " + std::to_string(s.groups));
    }
    s.cg = s.c / s.groups;
    s.m = s.mg * s.groups;
    if (has_bias && (ctx.input(2).rank() != 1 || ctx.input(2).dim(0) != s.m)) {
      ctx.fail("bias " + ctx.input(2).describe() + " must have " + std::to_string(s.m) + " values");
    }
    const std::vector<WindowAxis> axes = transposed_windows(
        spatial_dims(x.shape()), conv_kernel(window_, spatial_dims(w.shape())), window_);
    const Geometry g = right_aligned(axes);
    const Shape out_shape = windowed_shape(s.n, s.m, axes);

    // The output, then the workspace (conv_transpose_workspace).
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    const Parts parts = workspace_parts(x.dtype(), s, g, has_bias, ctx.threads());
    const Workspace space(ctx, parts.layout);
    dispatch(TypeList<float, double, float16, bfloat16>{}, x.dtype(), [&]<typename T>() {
      if constexpr (std::is_same_v<T, double>) {
        transpose_convolve<T>(x.data<const T>(), w.data<const T>(), nullptr,
                              has_bias ? ctx.input(2).data<const T>() : nullptr, y.data<T>(), s, g,
                              parts.blocks, space.data<T>(parts.columns));
      } else {
        // Float, or a half type computed in float (X, the bias and Y widened in the workspace).
        auto widen = [&](const Tensor& t, int part) {
          if (t.dtype() == DataType::Float) return t;
          Tensor f = space.tensor(part, t.shape());
          unary_loop<T, float>(t, f, [](T v) { return static_cast<float>(v); });
          return f;
        };
        const Tensor fx = widen(x, parts.x);
        const Tensor fb = has_bias ? widen(ctx.input(2), parts.bias) : Tensor();
        // The filter packed when the session was planned, or now (a filter computed at run
        // time).
        Tensor packed_now;
        if (!packed_ && s.cg > 0) packed_now = pack_filter(w, s.groups);
        const float* packed = packed_                ? packed_->data<const float>()
                              : packed_now.defined() ? packed_now.data<const float>()
                                                     : nullptr;
        const bool direct = std::is_same_v<T, float>;
        Tensor fy = direct ? y : space.tensor(parts.y, out_shape);
        transpose_convolve<float>(fx.data<const float>(), nullptr, packed,
                                  has_bias ? fb.data<const float>() : nullptr, fy.data<float>(), s,
                                  g, parts.blocks, space.data<float>(parts.columns));
        if (!direct) unary_loop<float, T>(fy, y, [](float v) { return T(v); });
      }
    });
  }

 private:
  int64_t group_;
  WindowAttrs window_;
  std::shared_ptr<const Tensor> packed_;  // the weights cache's packed filter
};

void conv_transpose_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() < 3 || w.size() != x.size()) unknown("ranks of X and W");
  const WindowAttrs a = window_attrs(c.node());
  check_window_ranks(a, x.size() - 2);
  const std::vector<int64_t> kernel = conv_kernel(a, spatial_dims(w));
  const int64_t channels = checked_mul(w[1], c.attr_int("group", 1));
  c.set(0, c.dtype(0),
        windowed_shape(x[0], channels, transposed_windows(spatial_dims(x), kernel, a)));
}

// The kernel's workspace (workspace_parts) for these shapes on c.threads() threads.
uint64_t conv_transpose_workspace(const ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() < 3 || x.size() > 5 || w.size() != x.size()) unknown("ranks of X and W");
  const int64_t groups = c.attr_int("group", 1);
  if (groups < 1 || x[1] % groups != 0) unknown("bad group");
  Sizes s{x[0], x[1], 0, groups, x[1] / groups, w[1]};
  s.m = checked_mul(s.mg, groups);
  const WindowAttrs a = window_attrs(c.node());
  const Geometry g =
      right_aligned(transposed_windows(spatial_dims(x), conv_kernel(a, spatial_dims(w)), a));
  return workspace_parts(c.dtype(0), s, g, c.has_input(2), c.threads()).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "ConvTranspose",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = conv_transpose_shape,
                  .workspace = conv_transpose_workspace,
                  .create = make<ConvTranspose>});

}  // namespace kiln::ops
