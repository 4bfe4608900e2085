// DepthToSpace and SpaceToDepth (DCR and CRD orders): block rearrangements between the
// channel and spatial dims, copied into a new tensor.
#include <array>
#include <cstring>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

int64_t block_size(const NodeInfo& info) {
  const int64_t b = info.attr_int("blocksize");
  if (b <= 0) info.fail("blocksize must be positive, got " + std::to_string(b));
  return b;
}

bool crd_mode(const NodeInfo& info) {
  const std::string mode = info.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") info.fail("mode must be DCR or CRD, got '" + mode + "'");
  return mode == "CRD";
}

void check_input(const OpContext& ctx, const Tensor& x) {
  if (x.rank() != 4) ctx.fail("input must be 4-D, got " + x.describe());
  if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
    throw_unsupported_type(x.dtype(), "input");
  }
}

// Both ops are a reshape to 6-D, a transpose and a reshape back: the input is read as a
// 6-D strided view in output order and copied into the contiguous output.
class DepthToSpace final : public Kernel {
 public:
  explicit DepthToSpace(const NodeInfo& info) : b_(block_size(info)), crd_(crd_mode(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    check_input(ctx, x);
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = b_;
    int64_t bb = 0, oh = 0, ow = 0;
    if (__builtin_mul_overflow(b, b, &bb) || c % bb != 0) {
      ctx.fail("channels " + std::to_string(c) + " are not a multiple of blocksize^2");
    }
    const int64_t oc = c / bb;
    if (__builtin_mul_overflow(h, b, &oh) || __builtin_mul_overflow(w, b, &ow)) {
      ctx.fail("output too large");
    }
    Tensor& y = ctx.output(0, x.dtype(), {n, oc, oh, ow});
    if (y.numel() == 0) return;  // past here c >= b * b, so the strides below cannot overflow
    const Shape& s = x.strides();
    const Shape view_shape{n, oc, h, b, w, b};
    const Shape view_strides = crd_ ? Shape{s[0], s[1] * b * b, s[2], s[1] * b, s[3], s[1]}
                                    : Shape{s[0], s[1], s[2], s[1] * b * oc, s[3], s[1] * oc};
    copy_strided(x.view(view_shape, view_strides, x.byte_offset()), y.reshaped(view_shape));
    ctx.count_copy(y.nbytes());
  }

 private:
  int64_t b_;
  bool crd_;
};

class SpaceToDepth final : public Kernel {
 public:
  explicit SpaceToDepth(const NodeInfo& info) : b_(block_size(info)), crd_(crd_mode(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    check_input(ctx, x);
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = b_;
    if (h % b != 0 || w % b != 0) {
      ctx.fail("spatial dims of " + x.describe() + " are not multiples of the blocksize");
    }
    const int64_t oh = h / b, ow = w / b;
    int64_t bb = 0, oc = 0;
    if (__builtin_mul_overflow(b, b, &bb) || __builtin_mul_overflow(c, bb, &oc)) {
      ctx.fail("output too large");
    }
    Tensor& y = ctx.output(0, x.dtype(), {n, oc, oh, ow});
    if (y.numel() == 0) return;  // past here h, w >= b, so the strides below cannot overflow
    const Shape& s = x.strides();
    const Shape view_shape = crd_ ? Shape{n, c, b, b, oh, ow} : Shape{n, b, b, c, oh, ow};
    const Shape view_strides = crd_ ? Shape{s[0], s[1], s[2], s[3], s[2] * b, s[3] * b}
                                    : Shape{s[0], s[2], s[3], s[1], s[2] * b, s[3] * b};
    copy_strided(x.view(view_shape, view_strides, x.byte_offset()), y.reshaped(view_shape));
    ctx.count_copy(y.nbytes());
  }

 private:
  int64_t b_;
  bool crd_;
};

// The kernels' output shapes, or unknown where they would fail.
int64_t block_of(const ShapeContext& c) {
  const int64_t b = c.attr_int("blocksize", 0);
  if (b <= 0) unknown("blocksize must be positive");
  return b;
}

void depth_to_space_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.size() != 4) unknown("input must be 4-D");
  const int64_t b = block_of(c), bb = checked_mul(b, b);
  if (x[1] % bb != 0) unknown("channels are not a multiple of blocksize^2");
  c.set(0, c.dtype(0), {x[0], x[1] / bb, checked_mul(x[2], b), checked_mul(x[3], b)});
}

void space_to_depth_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.size() != 4) unknown("input must be 4-D");
  const int64_t b = block_of(c);
  if (x[2] % b != 0 || x[3] % b != 0) unknown("spatial dims are not multiples of the blocksize");
  c.set(0, c.dtype(0), {x[0], checked_mul(x[1], checked_mul(b, b)), x[2] / b, x[3] / b});
}

}  // namespace

KILN_REGISTER_OP({.op = "DepthToSpace",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = depth_to_space_shape,
                  .create = make<DepthToSpace>});
KILN_REGISTER_OP({.op = "SpaceToDepth",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = space_to_depth_shape,
                  .create = make<SpaceToDepth>});

}  // namespace kiln::ops
