// CenterCropPad: crops or zero-pads the given axes to a target size around the centre,
// into a new tensor.
#include <array>
#include <cstring>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

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
    check_output_size(out_shape);
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    if (y.dtype() != DataType::String) std::memset(y.raw_data(), 0, y.nbytes());
    copy_strided(window(x, crop_start, len), window(y, pad_start, len));
    ctx.count_copy(y.nbytes());
  }

 private:
  std::vector<int64_t> axes_;
  bool has_axes_;
};

// The input's shape with each listed axis set to its target size.
void center_crop_pad_shape(ShapeContext& c) {
  Shape out = c.shape(0);
  const auto rank = static_cast<int64_t>(out.size());
  const std::vector<int64_t>& target = c.data(1);
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (!c.has_attr("axes")) {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  if (target.size() != axes.size()) unknown("one target size per axis");
  std::vector<bool> seen(out.size(), false);
  for (size_t i = 0; i < axes.size(); ++i) {
    const auto a = static_cast<size_t>(normalize_axis(axes[i], rank));
    if (seen[a] || target[i] < 0) unknown("repeated axis or negative size");
    seen[a] = true;
    out[a] = target[i];
  }
  c.set(0, c.dtype(0), out);
}

}  // namespace

KILN_REGISTER_OP({.op = "CenterCropPad",
                  .since = 18,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = center_crop_pad_shape,
                  .create = make<CenterCropPad>});

}  // namespace kiln::ops
