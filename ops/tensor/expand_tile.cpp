// Expand broadcasts without copying: a view with stride 0 along broadcast dims. Tile
// copies: the output, seen as [r0, d0, r1, d1, ...], is the input with stride 0 on the
// repeat dims.
#include <array>
#include <cstring>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

void require_byte_types(const Tensor& x, const char* what) {
  if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
    throw_unsupported_type(x.dtype(), what);
  }
}

// Expand's output shape: `x` broadcast with `target`, whose dimensions must not be negative.
Shape expand_output_shape(const Shape& x, const Shape& target) {
  for (int64_t d : target) {
    if (d < 0)
      throw Error(ErrorKind::Runtime,
                  "shape " + shape_to_string(target) + " has a negative dimension");
  }
  return broadcast_shapes(x, target);
}

// Tile's output shape: each dimension of `x` times its repeat.
Shape tile_output_shape(const Shape& x, const Shape& repeats) {
  if (repeats.size() != x.size()) {
    throw Error(ErrorKind::Runtime, "repeats has " + std::to_string(repeats.size()) +
                                        " entries for an input of rank " +
                                        std::to_string(x.size()));
  }
  Shape shape(x.size());
  for (size_t d = 0; d < x.size(); ++d) {
    if (repeats[d] < 0)
      throw Error(ErrorKind::Runtime, "repeats has a negative value " + std::to_string(repeats[d]));
    if (__builtin_mul_overflow(x[d], repeats[d], &shape[d]))
      throw Error(ErrorKind::Runtime, "output too large");
  }
  return shape;
}

class Expand final : public Kernel {
 public:
  explicit Expand(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_byte_types(x, "Expand input");
    const Shape shape = expand_output_shape(x.shape(), to_int64s(ctx.input(1)));
    check_output_size(shape);
    Shape strides = broadcast_strides(x, shape);
    Tensor y = x.view(shape, std::move(strides), x.byte_offset());
    if (x.dtype() == DataType::String && !y.is_contiguous()) {
      // The engine cannot make strided string tensors contiguous later: copy them now.
      Tensor& out = ctx.output(0, x.dtype(), shape);
      copy_strided(y, out);
      ctx.count_copy(out.nbytes());
      return;
    }
    ctx.set_output(0, std::move(y));
  }
};

class Tile final : public Kernel {
 public:
  explicit Tile(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_byte_types(x, "Tile input");
    const Shape repeats = to_int64s(ctx.input(1));
    const size_t rank = x.rank();
    const Shape shape = tile_output_shape(x.shape(), repeats);
    check_output_size(shape);
    Tensor& out = ctx.output(0, x.dtype(), shape);
    // Interleave (repeat, dim) pairs: the output in that order is contiguous.
    Shape split(2 * rank), out_strides(2 * rank), in_strides(2 * rank);
    for (size_t d = 0; d < rank; ++d) {
      split[2 * d] = repeats[d];
      split[2 * d + 1] = x.dim(d);
      out_strides[2 * d] = out.strides()[d] * x.dim(d);
      out_strides[2 * d + 1] = out.strides()[d];
      in_strides[2 * d] = 0;
      in_strides[2 * d + 1] = x.strides()[d];
    }
    copy_strided(x.view(split, in_strides, x.byte_offset()),
                 out.view(split, out_strides, out.byte_offset()));
    ctx.count_copy(out.nbytes());
  }
};

void expand_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const ValueFacts& target = c.facts(1);
  if (!x.known || !target.has_data) {
    // Partial facts: the broadcast of the input and the target, where the target's elements
    // are known (a 1 keeps the input's dimension).
    if (!x.ranked || target.rank() != 1 || target.shape[0] == kUnknownDim ||
        target.shape[0] > kMaxKnownData) {
      c.set(0, typed_facts(x.dtype));
      return;
    }
    ValueFacts dims;
    dims.ranked = true;
    for (int64_t k = 0; k < target.shape[0]; ++k) {
      const std::optional<int64_t> e = target.elem(static_cast<size_t>(k));
      append_dim(dims, e && *e >= 0 ? *e : kUnknownDim);
    }
    ValueFacts out = broadcast_facts({&x, &dims});
    out.dtype = x.dtype;
    c.set(0, std::move(out));
    return;
  }
  const Shape out = expand_output_shape(x.shape, c.data(1));
  const int64_t n = numel_or_unknown(out);
  if (x.has_data && n <= kMaxKnownData) {
    std::vector<int64_t> data;
    for (int64_t k = 0; k < n; ++k)
      data.push_back(x.data[static_cast<size_t>(broadcast_index(x.shape, out, k))]);
    c.set(0, x.dtype, out, &data);
    return;
  }
  c.set(0, x.dtype, out);
}

// A view with stride 0 along the broadcast dimensions (see Expand::run).
void place_expand(Placement& p) {
  const Shape& xs = p.input(0).shape;
  const Shape& ys = p.output(0).shape;
  const Shape from = p.strides(0);
  Shape strides(ys.size(), 0);
  for (size_t k = 0; k < xs.size(); ++k) {
    const size_t d = ys.size() - xs.size() + k;
    strides[d] = xs[k] == 1 && ys[d] != 1 ? 0 : from[k];
  }
  p.view(0, 0, strides);
}

void tile_shape(ShapeContext& c) {
  const ValueFacts& x = c.in(0);
  c.set(0, x.dtype, tile_output_shape(x.shape, c.data(1)));
}

}  // namespace

KILN_REGISTER_OP({.op = "Expand",
                  .since = 8,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = expand_shape,
                  .place = place_expand,
                  .create = make<Expand>});
KILN_REGISTER_OP({.op = "Tile",
                  .since = 6,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = tile_shape,
                  .create = make<Tile>});

}  // namespace kiln::ops
