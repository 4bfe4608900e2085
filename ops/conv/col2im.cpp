// Col2Im: the inverse of im2col. Input [N, C * prod(block_shape), L] holds one column per
// sliding-block position; every column value is added into the image position its kernel
// tap covers. Handles 1 to 3 spatial dimensions; (image, channel) planes run in parallel.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/geometry.h"

namespace kiln::ops {
namespace {

// First j >= 0 with base + j * s >= limit (s > 0).
inline int64_t first_at_least(int64_t base, int64_t s, int64_t limit) {
  const int64_t need = limit - base;
  return need <= 0 ? 0 : (need + s - 1) / s;
}

// The output [N, C, image...] of a Col2Im of `x` [N, C * prod(block_shape), L], after checking
// that x holds one column per position of the block grid (the windows of block_shape sliding
// over the padded image), which go to `grid` when given. The kernel and the shape rule both
// use it.
Shape col2im_shape(const Shape& x, const std::vector<int64_t>& image,
                   const std::vector<int64_t>& block, const WindowAttrs& window,
                   std::vector<WindowAxis>* grid = nullptr) {
  const size_t r = image.size();
  if (r == 0 || r > 3 || block.size() != r) {
    throw Error(r > 3 ? ErrorKind::Unsupported : ErrorKind::Runtime,
                "image_shape and block_shape must have the same length, 1 to 3");
  }
  if (x.size() != 3)
    throw Error(ErrorKind::Runtime, "input must be 3-D, got " + shape_to_string(x));
  int64_t kp = 1, positions = 1;
  const std::vector<WindowAxis> axes = forward_windows(image, block, window);
  for (const WindowAxis& a : axes) {
    // A product that overflows cannot match the input's sizes.
    if (__builtin_mul_overflow(kp, a.kernel, &kp) ||
        __builtin_mul_overflow(positions, a.out, &positions)) {
      kp = positions = -1;
      break;
    }
  }
  if (kp < 0 || x[1] % kp != 0 || x[2] != positions) {
    throw Error(ErrorKind::Runtime,
                "input " + shape_to_string(x) + " does not match block_shape and image_shape");
  }
  Shape shape{x[0], x[1] / kp};
  shape.insert(shape.end(), image.begin(), image.end());
  check_output_elements(shape);
  if (grid) *grid = axes;
  return shape;
}

void col2im_shape_rule(ShapeContext& c) {
  c.set(0, c.dtype(0), col2im_shape(c.shape(0), c.data(1), c.data(2), window_attrs(c.node())));
}

class Col2Im final : public Kernel {
 public:
  explicit Col2Im(const NodeInfo& info) : window_(window_attrs(info.node())) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> image = to_int64s(ctx.input(1));
    const std::vector<int64_t> block = to_int64s(ctx.input(2));
    // The block grid is the windows of block_shape sliding over the padded image.
    std::vector<WindowAxis> axes;
    const Shape shape = col2im_shape(x.shape(), image, block, window_, &axes);
    // Three dimensions: image (out), block grid (grid), kernel (k); leading ones are 1.
    std::array<int64_t, 3> out{1, 1, 1}, grid{1, 1, 1}, k{1, 1, 1}, st{1, 1, 1}, dil{1, 1, 1},
        pad{0, 0, 0};
    const size_t r = image.size();
    for (size_t d = 0; d < r; ++d) {
      const WindowAxis& a = axes[d];
      const size_t i = 3 - r + d;
      out[i] = a.in, grid[i] = a.out, k[i] = a.kernel;
      st[i] = a.stride, dil[i] = a.dilation, pad[i] = a.pad_begin;
    }
    const int64_t kp = k[0] * k[1] * k[2], positions = grid[0] * grid[1] * grid[2];
    const int64_t n = shape[0], channels = shape[1];
    const int64_t op = out[0] * out[1] * out[2];
    using Types = FloatTypes;
    dispatch(Types{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* in = x.data<const T>();
      T* y = ctx.output(0, x.dtype(), shape).template data<T>();
      parallel_for(n * channels, grain_for(kp * positions), [&](int64_t lo, int64_t hi) {
        std::vector<C> acc(static_cast<size_t>(op));
        for (int64_t plane = lo; plane < hi; ++plane) {
          std::fill(acc.begin(), acc.end(), C(0));
          const T* src = in + plane * kp * positions;
          for (int64_t kd = 0; kd < k[0]; ++kd) {
            for (int64_t kh = 0; kh < k[1]; ++kh) {
              for (int64_t kw = 0; kw < k[2]; ++kw, src += positions) {
                const int64_t base = kw * dil[2] - pad[2];
                const int64_t jlo = std::min(first_at_least(base, st[2], 0), grid[2]);
                const int64_t jhi = std::clamp(first_at_least(base, st[2], out[2]), jlo, grid[2]);
                for (int64_t gd = 0; gd < grid[0]; ++gd) {
                  const int64_t od = gd * st[0] - pad[0] + kd * dil[0];
                  if (od < 0 || od >= out[0]) continue;
                  for (int64_t gh = 0; gh < grid[1]; ++gh) {
                    const int64_t oh = gh * st[1] - pad[1] + kh * dil[1];
                    if (oh < 0 || oh >= out[1]) continue;
                    C* row = acc.data() + (od * out[1] + oh) * out[2];
                    const T* s = src + (gd * grid[1] + gh) * grid[2];
                    for (int64_t j = jlo; j < jhi; ++j) {
                      row[base + j * st[2]] += static_cast<C>(s[j]);
                    }
                  }
                }
              }
            }
          }
          T* dst = y + plane * op;
          for (int64_t i = 0; i < op; ++i) dst[i] = from_compute<T>(acc[static_cast<size_t>(i)]);
        }
      });
    });
  }

 private:
  WindowAttrs window_;
};

}  // namespace

KILN_REGISTER_OP({.op = "Col2Im",
                  .since = 18,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = col2im_shape_rule,
                  .create = make<Col2Im>});

}  // namespace kiln::ops
