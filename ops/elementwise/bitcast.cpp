// BitCast (opset 26): the same bits seen as another element type of the same width. The
// output shares the input's storage, so nothing is copied.
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

bool bitcastable(DataType t) {
  return t != DataType::Undefined && t != DataType::String && bits_per_element(t) >= 8;
}

class BitCast final : public Kernel {
 public:
  explicit BitCast(const NodeInfo& info) {
    const int64_t to = info.attr_int("to");
    if (to < INT32_MIN || to > INT32_MAX || !is_known_data_type(static_cast<int32_t>(to)) ||
        !bitcastable(static_cast<DataType>(to))) {
      info.fail("BitCast 'to' is not a supported element type: " + std::to_string(to),
                ErrorKind::Unsupported);
    }
    to_ = static_cast<DataType>(to);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (!bitcastable(x.dtype())) throw_unsupported_type(x.dtype(), "BitCast input");
    if (bits_per_element(x.dtype()) != bits_per_element(to_)) {
      ctx.fail("BitCast needs types of the same width: " + std::string(data_type_name(x.dtype())) +
               " has " + std::to_string(bits_per_element(x.dtype())) + " bits, " +
               std::string(data_type_name(to_)) + " has " + std::to_string(bits_per_element(to_)));
    }
    if (to_ == DataType::Bool) {
      // Only 0 and 1 are valid bools; other bytes would be read back inconsistently.
      const Tensor c = x.contiguous();
      const auto* p = reinterpret_cast<const uint8_t*>(c.raw_data());
      Tensor& y = ctx.output(0, to_, x.shape());
      auto* q = reinterpret_cast<uint8_t*>(y.raw_data());
      for (int64_t i = 0; i < c.numel(); ++i) q[i] = p[i] != 0;
      ctx.count_copy(static_cast<uint64_t>(c.numel()));
      return;
    }
    ctx.set_output(0, Value(Tensor(to_, x.shape(), x.storage(), x.byte_offset(), x.strides())));
  }

 private:
  DataType to_;
};

void bitcast_shape(ShapeContext& c) {
  const int64_t to = c.attr_int("to", 0);
  if (to < INT32_MIN || to > INT32_MAX || !is_known_data_type(static_cast<int32_t>(to)) ||
      !bitcastable(static_cast<DataType>(to)) || !bitcastable(c.dtype(0)) ||
      bits_per_element(c.dtype(0)) != bits_per_element(static_cast<DataType>(to))) {
    unknown("types BitCast does not take");
  }
  c.set(0, static_cast<DataType>(to), c.shape(0));
}

// The result views the input's bytes, except a cast to bool, which checks them into a copy.
void place_bitcast(Placement& p) {
  if (p.output(0).dtype == DataType::Bool) {
    p.allocate(0);
  } else {
    p.view(0, 0, p.strides(0));
  }
}

}  // namespace

KILN_REGISTER_OP({.op = "BitCast",
                  .since = 26,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "fixed-width types of 8 bits or more (not string)",
                  .shape = bitcast_shape,
                  .place = place_bitcast,
                  .create = make<BitCast>});

}  // namespace kiln::ops
