// Col2Im: the inverse of im2col. Input [N, C * prod(block_shape), L] holds one column per
// sliding-block position; every column value is added into the image position its kernel
// tap covers. Handles 1 to 3 spatial dimensions; (image, channel) planes run in parallel.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/geometry.h"

namespace kiln::ops {
namespace {

// First j >= 0 with base + j * s >= limit (s > 0).
inline int64_t first_at_least(int64_t base, int64_t s, int64_t limit) {
  const int64_t need = limit - base;
  return need <= 0 ? 0 : (need + s - 1) / s;
}

class Col2Im final : public Kernel {
 public:
  explicit Col2Im(const NodeInfo& info) : window_(window_attrs(info.node())) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> image = to_int64s(ctx.input(1));
    const std::vector<int64_t> block = to_int64s(ctx.input(2));
    const size_t r = image.size();
    if (r == 0 || r > 3 || block.size() != r) {
      ctx.fail("image_shape and block_shape must have the same length, 1 to 3",
               r > 3 ? ErrorKind::Unsupported : ErrorKind::Runtime);
    }
    if (x.rank() != 3) ctx.fail("input must be 3-D, got " + x.describe());
    // The block grid is the windows of block_shape sliding over the padded image.
    const std::vector<WindowAxis> axes = forward_windows(image, block, window_);
    // Three dimensions: image (out), block grid (grid), kernel (k); leading ones are 1.
    std::array<int64_t, 3> out{1, 1, 1}, grid{1, 1, 1}, k{1, 1, 1}, st{1, 1, 1}, dil{1, 1, 1},
        pad{0, 0, 0};
    int64_t kp = 1, positions = 1;
    for (size_t d = 0; d < r; ++d) {
      const WindowAxis& a = axes[d];
      const size_t i = 3 - r + d;
      out[i] = a.in, grid[i] = a.out, k[i] = a.kernel;
      st[i] = a.stride, dil[i] = a.dilation, pad[i] = a.pad_begin;
      // A product that overflows cannot match the input's sizes.
      if (__builtin_mul_overflow(kp, k[i], &kp) ||
          __builtin_mul_overflow(positions, grid[i], &positions)) {
        kp = positions = -1;
        break;
      }
    }
    if (kp < 0 || x.dim(1) % kp != 0 || x.dim(2) != positions) {
      ctx.fail("input " + x.describe() + " does not match block_shape and image_shape");
    }
    const int64_t n = x.dim(0), channels = x.dim(1) / kp;
    Shape shape{n, channels};
    shape.insert(shape.end(), image.begin(), image.end());
    check_output_elements(shape);
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
                  .create = make<Col2Im>});

}  // namespace kiln::ops
