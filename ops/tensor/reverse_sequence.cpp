// ReverseSequence: reverses the first sequence_lens[b] entries along the time axis of
// each batch entry b; later entries are copied as they are.
#include <algorithm>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

struct Bytes16 {
  uint64_t lo, hi;
};

template <typename F>
void dispatch_width(DataType dt, F&& f) {
  if (dt == DataType::String) return f.template operator()<std::string>();
  switch (bits_per_element(dt)) {
    case 8:
      return f.template operator()<uint8_t>();
    case 16:
      return f.template operator()<uint16_t>();
    case 32:
      return f.template operator()<uint32_t>();
    case 64:
      return f.template operator()<uint64_t>();
    case 128:
      return f.template operator()<Bytes16>();
    default:
      throw_unsupported_type(dt, "input");
  }
}

class ReverseSequence final : public Kernel {
 public:
  explicit ReverseSequence(const NodeInfo& info)
      : time_axis_(info.attr_int("time_axis", 0)), batch_axis_(info.attr_int("batch_axis", 1)) {
    const bool valid =
        (time_axis_ == 0 && batch_axis_ == 1) || (time_axis_ == 1 && batch_axis_ == 0);
    if (!valid) info.fail("time_axis and batch_axis must be 0 and 1 in some order");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& lens_t = ctx.input(1);
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    const int64_t batch = x.dim(static_cast<size_t>(batch_axis_));
    const int64_t steps = x.dim(static_cast<size_t>(time_axis_));
    if (lens_t.rank() != 1 || lens_t.numel() != batch) {
      ctx.fail("sequence_lens " + lens_t.describe() + " must have one entry per batch (" +
               std::to_string(batch) + ")");
    }
    const std::vector<int64_t> lens = to_int64s(lens_t);
    for (int64_t len : lens) {
      if (len < 0 || len > steps) {
        ctx.fail("sequence length " + std::to_string(len) + " is outside [0, " +
                 std::to_string(steps) + "]");
      }
    }
    Tensor& out = ctx.output(0, x.dtype(), x.shape());
    if (out.numel() == 0) return;
    const int64_t inner = shape_numel(Shape(x.shape().begin() + 2, x.shape().end()));
    // Element stride of one step in time and of one batch entry.
    const int64_t dim1 = x.dim(1);
    const int64_t time_stride = time_axis_ == 0 ? dim1 * inner : inner;
    const int64_t batch_stride = batch_axis_ == 0 ? dim1 * inner : inner;
    dispatch_width(x.dtype(), [&]<typename T>() {
      const T* src = reinterpret_cast<const T*>(x.raw_data());
      T* dst = reinterpret_cast<T*>(out.raw_data());
      parallel_for(batch * steps, grain_for(inner), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t b = r / steps, t = r % steps;
          const int64_t len = lens[static_cast<size_t>(b)];
          const int64_t from = t < len ? len - 1 - t : t;
          std::copy_n(src + b * batch_stride + from * time_stride, inner,
                      dst + b * batch_stride + t * time_stride);
        }
      });
    });
    ctx.count_copy(out.nbytes());
  }

 private:
  int64_t time_axis_, batch_axis_;
};

void reverse_sequence_shape(ShapeContext& c) {
  if (c.shape(0).size() < 2) unknown("input must have rank >= 2");
  same_shape(c);
}

}  // namespace

KILN_REGISTER_OP({.op = "ReverseSequence",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types",
                  .shape = reverse_sequence_shape,
                  .create = make<ReverseSequence>});

}  // namespace kiln::ops
