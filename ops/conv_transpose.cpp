// ConvTranspose: the gradient of Conv with respect to its input, for 1-D, 2-D and 3-D
// inputs with groups, strides, dilations, pads, output_padding, output_shape and auto_pad.
//
// Each (image, group) is one GEMM, columns = W^T * X ([out channels * kernel] x input
// positions), followed by col2im, which adds every column into the output positions its
// kernel taps reach. Tasks own disjoint blocks of output channels, so they never write the
// same output and need no synchronisation.
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/common.h"
#include "ops/elementwise.h"

namespace kiln::ops {
namespace {

// Attribute values above this are rejected, so that sizes computed from them stay far
// from int64 overflow.
constexpr int64_t kMaxAttr = int64_t{1} << 31;

// Fails unless `shape` has an element count that int64 arithmetic (and memory) can hold.
void check_output_size(const OpContext& ctx, const Shape& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 48)) {
      ctx.fail("output shape " + shape_to_string(shape) + " is too large");
    }
  }
}

enum class AutoPad { NotSet, SameUpper, SameLower, Valid };

// Sizes of one transposed convolution in three dimensions (1-D and 2-D get leading 1s).
// `pad` is the leading padding and may be negative when output_shape asks for more.
struct Geometry {
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, stride{1, 1, 1}, dil{1, 1, 1},
      pad{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};

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

template <typename T>
void transpose_convolve(OpContext& ctx, const T* x, const T* w, const T* bias, T* y, const Sizes& s,
                        const Geometry& g) {
  using RM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
  using S = Eigen::OuterStride<>;
  const int64_t ip = g.in_size(), op = g.out_size(), kp = g.k_size(), wrow = s.mg * kp;
  if (op == 0 || s.m == 0 || s.n == 0) return;
  const int64_t units = s.n * s.groups;
  const int threads = tbb::this_task_arena::max_concurrency();
  constexpr double kMinParallel = 1 << 17, kMinTask = 1 << 15;
  constexpr int64_t kScratchElems = 1 << 18;

  // Channel blocks bound the scratch size and give threads work.
  const int64_t per_channel = kp * ip;
  int64_t cb = std::min<int64_t>(s.mg, (s.mg * per_channel + kScratchElems - 1) / kScratchElems);
  const double total = static_cast<double>(units) * s.mg * per_channel * s.cg;
  if (threads > 1 && total >= kMinParallel && units * cb < 2 * threads) {
    const int64_t target = std::min<int64_t>(
        2 * threads, std::max<int64_t>(1, static_cast<int64_t>(total / kMinTask)));
    cb = std::min<int64_t>(s.mg, std::max(cb, (target + units - 1) / units));
  }
  cb = std::max<int64_t>(cb, 1);
  const int64_t chans = (s.mg + cb - 1) / cb;
  const int64_t slots = std::max(threads, 1);
  Tensor scratch = ctx.allocate(data_type_of<T>(), {slots, chans * per_channel});

  parallel_for(units * cb, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t unit = t / cb, blk = t % cb;
      const int64_t n = unit / s.groups, grp = unit % s.groups;
      const int64_t m0 = blk * chans, m1 = std::min(s.mg, m0 + chans);
      if (m0 >= m1) continue;
      int slot = tbb::this_task_arena::current_thread_index();
      if (slot < 0 || slot >= slots) slot = 0;
      T* col = scratch.data<T>() + slot * chans * per_channel;
      // W for this group is [cg, mg * kernel] row-major; its transpose is a column-major map.
      Eigen::Map<const CM, 0, S> wt(w + grp * s.cg * wrow + m0 * kp, (m1 - m0) * kp, s.cg, S(wrow));
      Eigen::Map<const RM> xm(x + (n * s.c + grp * s.cg) * ip, s.cg, ip);
      Eigen::Map<RM> cm(col, (m1 - m0) * kp, ip);
      cm.noalias() = wt * xm;
      const int64_t mo = grp * s.mg + m0;
      T* yb = y + (n * s.m + mo) * op;
      for (int64_t i = 0; i < m1 - m0; ++i) {
        std::fill(yb + i * op, yb + (i + 1) * op, bias ? bias[mo + i] : T(0));
      }
      col2im(col, m1 - m0, g, yb);
    }
  });
}

class ConvTranspose final : public Kernel {
 public:
  explicit ConvTranspose(const NodeInfo& info)
      : group_(info.attr_int("group", 1)),
        kernel_shape_(info.attr_ints("kernel_shape")),
        strides_(info.attr_ints("strides")),
        dilations_(info.attr_ints("dilations")),
        pads_(info.attr_ints("pads")),
        output_padding_(info.attr_ints("output_padding")),
        output_shape_(info.attr_ints("output_shape")) {
    const std::string ap = info.attr_string("auto_pad", "NOTSET");
    if (ap == "NOTSET") {
      auto_pad_ = AutoPad::NotSet;
    } else if (ap == "SAME_UPPER") {
      auto_pad_ = AutoPad::SameUpper;
    } else if (ap == "SAME_LOWER") {
      auto_pad_ = AutoPad::SameLower;
    } else if (ap == "VALID") {
      auto_pad_ = AutoPad::Valid;
    } else {
      info.fail("unknown auto_pad '" + ap + "'");
    }
    if (group_ < 1 || group_ > kMaxAttr) info.fail("group must be in [1, 2^31]");
    for (int64_t v : output_shape_)
      if (v < 0 || v > kMaxAttr) info.fail("output_shape must be in [0, 2^31]");
    for (int64_t v : strides_)
      if (v < 1 || v > kMaxAttr) info.fail("strides must be in [1, 2^31]");
    for (int64_t v : dilations_)
      if (v < 1 || v > kMaxAttr) info.fail("dilations must be in [1, 2^31]");
    for (int64_t v : pads_)
      if (v < 0 || v > kMaxAttr) info.fail("pads must be in [0, 2^31]");
    for (int64_t v : output_padding_)
      if (v < 0 || v > kMaxAttr) info.fail("output_padding must be in [0, 2^31]");
    for (int64_t v : kernel_shape_)
      if (v < 1 || v > kMaxAttr) info.fail("kernel_shape must be in [1, 2^31]");
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
    const Geometry g = geometry(ctx, x, w);
    Shape out_shape{s.n, s.m};
    for (size_t d = 0; d + 2 < x.rank(); ++d) out_shape.push_back(g.out[3 - (x.rank() - 2) + d]);
    check_output_size(ctx, out_shape);

    dispatch(TypeList<float, double, float16, bfloat16>{}, x.dtype(), [&]<typename T>() {
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        auto widen = [&](const Tensor& t) {
          Tensor f = ctx.allocate(DataType::Float, t.shape());
          unary_loop<T, float>(t, f, [](T v) { return static_cast<float>(v); });
          return f;
        };
        const Tensor fx = widen(x), fw = widen(w);
        const Tensor fb = has_bias ? widen(ctx.input(2)) : Tensor();
        Tensor fy = ctx.allocate(DataType::Float, out_shape);
        transpose_convolve<float>(ctx, fx.data<const float>(), fw.data<const float>(),
                                  has_bias ? fb.data<const float>() : nullptr, fy.data<float>(), s,
                                  g);
        Tensor& y = ctx.output(0, x.dtype(), out_shape);
        unary_loop<float, T>(fy, y, [](float v) { return T(v); });
      } else {
        Tensor& y = ctx.output(0, x.dtype(), out_shape);
        transpose_convolve<T>(ctx, x.data<const T>(), w.data<const T>(),
                              has_bias ? ctx.input(2).data<const T>() : nullptr, y.data<T>(), s, g);
      }
    });
  }

 private:
  Geometry geometry(const OpContext& ctx, const Tensor& x, const Tensor& w) const {
    const size_t r = x.rank() - 2, off = 3 - r;
    auto check = [&](const std::vector<int64_t>& v, size_t n, const char* name) {
      if (!v.empty() && v.size() != n) ctx.fail(std::string(name) + " has the wrong length");
    };
    check(kernel_shape_, r, "kernel_shape");
    check(strides_, r, "strides");
    check(dilations_, r, "dilations");
    check(pads_, 2 * r, "pads");
    check(output_padding_, r, "output_padding");
    // output_shape may list the spatial sizes only, or the whole output shape.
    std::vector<int64_t> out_spatial = output_shape_;
    if (out_spatial.size() == r + 2)
      out_spatial.erase(out_spatial.begin(), out_spatial.begin() + 2);
    check(out_spatial, r, "output_shape");
    Geometry g;
    for (size_t d = 0; d < r; ++d) {
      const size_t i = off + d;
      g.in[i] = x.dim(d + 2);
      g.k[i] = w.dim(d + 2);
      if (g.k[i] < 1) ctx.fail("weight " + w.describe() + " has an empty kernel");
      if (!kernel_shape_.empty() && kernel_shape_[d] != g.k[i]) {
        ctx.fail("kernel_shape does not match weight " + w.describe());
      }
      g.stride[i] = strides_.empty() ? 1 : strides_[d];
      g.dil[i] = dilations_.empty() ? 1 : dilations_[d];
      const int64_t opad = output_padding_.empty() ? 0 : output_padding_[d];
      const int64_t full = g.stride[i] * (g.in[i] - 1) + opad + (g.k[i] - 1) * g.dil[i] + 1;
      int64_t pb = 0, out = 0;
      if (!out_spatial.empty() || auto_pad_ == AutoPad::SameUpper ||
          auto_pad_ == AutoPad::SameLower) {
        out = !out_spatial.empty() ? out_spatial[d] : g.in[i] * g.stride[i];
        const int64_t total = out_spatial.empty() ? std::max<int64_t>(0, full - out) : full - out;
        // The odd unit of padding goes at the end for SAME_UPPER and at the start otherwise;
        // halves round towards negative infinity when the output is larger than `full`.
        const int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);
        pb = auto_pad_ == AutoPad::SameUpper ? half : total - half;
      } else {
        const int64_t pe = pads_.empty() || auto_pad_ == AutoPad::Valid ? 0 : pads_[d + r];
        pb = pads_.empty() || auto_pad_ == AutoPad::Valid ? 0 : pads_[d];
        out = full - pb - pe;
      }
      if (out < 0) ctx.fail("output size would be negative for input " + x.describe());
      g.out[i] = out;
      g.pad[i] = pb;
    }
    return g;
  }

  AutoPad auto_pad_ = AutoPad::NotSet;
  int64_t group_;
  std::vector<int64_t> kernel_shape_, strides_, dilations_, pads_, output_padding_, output_shape_;
};

}  // namespace

KILN_REGISTER_OP({.op = "ConvTranspose",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .create = make<ConvTranspose>});

}  // namespace kiln::ops
