// Concat: joins its inputs along one axis into a new tensor. Inputs may have any strides;
// each is copied into its window of the output.
#include <array>
#include <cstring>
#include <string>

#include "ops/common.h"
#include "ops/elementwise.h"

namespace kiln::ops {
namespace {

template <typename U>
void copy_run(std::byte* dst, const std::byte* src, int64_t n, int64_t ds, int64_t ss) {
  for (int64_t i = 0; i < n; ++i) {
    U v;
    std::memcpy(&v, src + i * ss * static_cast<int64_t>(sizeof(U)), sizeof(U));
    std::memcpy(dst + i * ds * static_cast<int64_t>(sizeof(U)), &v, sizeof(U));
  }
}

// dst = src for tensors of the same shape and type in any layouts; rows run in parallel.
void copy_strided(const Tensor& src, const Tensor& dst) {
  const std::array<Shape, 2> strides{src.strides(), dst.strides()};
  if (src.dtype() == DataType::String) {
    const std::string* s = src.data<const std::string>();
    std::string* d = dst.data<std::string>();
    for_each_row<2>(src.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* st) {
      for (int64_t i = 0; i < n; ++i) d[off[1] + i * st[1]] = s[off[0] + i * st[0]];
    });
    return;
  }
  const int bits = bits_per_element(src.dtype());
  if (bits % 8 != 0) {
    copy_elements(src, dst);  // sub-byte elements: contiguous tensors only
    return;
  }
  const int64_t es = bits / 8;
  const std::byte* s = src.raw_data();
  std::byte* d = dst.raw_data();
  for_each_row<2>(src.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* st) {
    const std::byte* a = s + off[0] * es;
    std::byte* o = d + off[1] * es;
    if (st[0] == 1 && st[1] == 1) {
      std::memcpy(o, a, static_cast<size_t>(n * es));
      return;
    }
    switch (es) {
      case 1:
        copy_run<uint8_t>(o, a, n, st[1], st[0]);
        break;
      case 2:
        copy_run<uint16_t>(o, a, n, st[1], st[0]);
        break;
      case 4:
        copy_run<uint32_t>(o, a, n, st[1], st[0]);
        break;
      case 8:
        copy_run<uint64_t>(o, a, n, st[1], st[0]);
        break;
      default:
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(o + i * st[1] * es, a + i * st[0] * es, static_cast<size_t>(es));
        }
    }
  });
}

class Concat final : public Kernel {
 public:
  explicit Concat(const NodeInfo& info) : axis_(info.attr_int("axis")) {}

  void run(OpContext& ctx) override {
    size_t axis = 0;
    const Shape shape = output_shape(ctx, &axis);
    Tensor& out = ctx.output(0, ctx.input(0).dtype(), shape);
    copy_inputs(ctx, out, axis);
    ctx.count_copy(out.nbytes(), CopyCause::Concat);
  }

 private:
  // The output's shape; every input must match the first except along the axis.
  Shape output_shape(const OpContext& ctx, size_t* axis) const {
    if (ctx.num_inputs() == 0) ctx.fail("needs at least one input");
    const Tensor& first = ctx.input(0);
    if (first.rank() == 0) ctx.fail("cannot concatenate scalars");
    if (first.dtype() != DataType::String && bits_per_element(first.dtype()) < 8) {
      throw_unsupported_type(first.dtype(), "Concat input");
    }
    *axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(first.rank())));
    Shape shape = first.shape();
    shape[*axis] = 0;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      if (t.dtype() != first.dtype()) ctx.fail("inputs have different element types");
      bool same = t.rank() == first.rank();
      for (size_t d = 0; same && d < t.rank(); ++d) {
        same = d == *axis || t.dim(d) == first.dim(d);
      }
      if (!same) {
        ctx.fail("input " + std::to_string(i) + " " + t.describe() + " does not match input 0 " +
                 first.describe() + " outside axis " + std::to_string(*axis));
      }
      if (__builtin_add_overflow(shape[*axis], t.dim(*axis), &shape[*axis])) {
        ctx.fail("output size overflows");
      }
    }
    return shape;
  }

  // Copies each input into its window [offset, offset + dim) along the axis.
  static void copy_inputs(const OpContext& ctx, const Tensor& out, size_t axis) {
    const auto es = static_cast<size_t>(bits_per_element(out.dtype()) / 8);
    int64_t offset = 0;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      const size_t byte_offset =
          out.byte_offset() + static_cast<size_t>(offset * out.strides()[axis]) * es;
      copy_strided(t, out.view(t.shape(), out.strides(), byte_offset));
      offset += t.dim(axis);
    }
  }

  int64_t axis_;
};

}  // namespace

KILN_REGISTER_OP({.op = "Concat",
                  .since = 4,
                  .min_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .create = make<Concat>});

}  // namespace kiln::ops
