// CenterCropPad: crops or zero-pads the given axes to a target size around the centre,
// into a new tensor.
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

// Largest element count an output may have: far below where byte counts overflow.
constexpr int64_t kMaxElements = int64_t{1} << 57;

// Rejects negative dims and element counts above kMaxElements.
void check_output_shape(const OpContext& ctx, const Shape& shape) {
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) ctx.fail("shape " + shape_to_string(shape) + " has a negative dimension");
    empty = empty || d == 0;
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (!empty && (__builtin_mul_overflow(n, d, &n) || n > kMaxElements)) {
      ctx.fail("shape " + shape_to_string(shape) + " is too large");
    }
  }
}

// The block of `t` starting at `start` with `len` elements along each dim.
Tensor window(const Tensor& t, const Shape& start, const Shape& len) {
  int64_t off = 0;
  for (size_t d = 0; d < start.size(); ++d) off += start[d] * t.strides()[d];
  const int64_t es = bits_per_element(t.dtype()) / 8;
  return t.view(len, t.strides(),
                static_cast<size_t>(static_cast<int64_t>(t.byte_offset()) + off * es));
}

class CenterCropPad final : public Kernel {
 public:
  explicit CenterCropPad(const NodeInfo& info)
      : axes_(info.attr_ints("axes")), has_axes_(info.has_attr("axes")) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
      throw_unsupported_type(x.dtype(), "CenterCropPad input");
    }
    const size_t rank = x.rank();
    const std::vector<int64_t> target = to_int64s(ctx.input(1));
    std::vector<int64_t> axes = axes_;
    if (!has_axes_) {
      for (size_t d = 0; d < rank; ++d) axes.push_back(static_cast<int64_t>(d));
    }
    if (target.size() != axes.size()) {
      ctx.fail("shape has " + std::to_string(target.size()) + " entries for " +
               std::to_string(axes.size()) + " axes");
    }
    Shape out_shape = x.shape(), len = x.shape(), crop_start(rank, 0), pad_start(rank, 0);
    std::vector<bool> seen(rank, false);
    for (size_t i = 0; i < axes.size(); ++i) {
      const auto a = static_cast<size_t>(normalize_axis(axes[i], static_cast<int64_t>(rank)));
      if (seen[a]) ctx.fail("axis " + std::to_string(axes[i]) + " is repeated");
      seen[a] = true;
      const int64_t t = target[i], d = x.dim(a);
      if (t < 0) ctx.fail("shape has a negative size " + std::to_string(t));
      out_shape[a] = t;
      // The smaller half of an odd difference goes before.
      if (t < d) {
        crop_start[a] = (d - t) / 2;
        len[a] = t;
      } else if (t > d) {
        pad_start[a] = (t - d) / 2;
      }
    }
    check_output_shape(ctx, out_shape);
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    if (y.dtype() != DataType::String) std::memset(y.raw_data(), 0, y.nbytes());
    copy_strided(window(x, crop_start, len), window(y, pad_start, len));
    ctx.count_copy(y.nbytes());
  }

 private:
  std::vector<int64_t> axes_;
  bool has_axes_;
};

}  // namespace

KILN_REGISTER_OP({.op = "CenterCropPad",
                  .since = 18,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .create = make<CenterCropPad>});

}  // namespace kiln::ops
