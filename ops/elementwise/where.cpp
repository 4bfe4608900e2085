// Where: out = condition ? x : y with numpy broadcasting of all three inputs. Elements
// are only selected, never computed on, so the loop runs on unsigned integers of the
// element's width (one instantiation per width, plus strings).
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

// The same elements seen as another element type of the same width.
Tensor alias_as(const Tensor& t, DataType dtype) {
  return Tensor(dtype, t.shape(), t.storage(), t.byte_offset(), t.strides());
}

class Where final : public Kernel {
 public:
  explicit Where(const NodeInfo&) {}

  void run(OpContext& ctx) override {
    const Tensor& cond = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& y = ctx.input(2);
    if (cond.dtype() != DataType::Bool) ctx.fail("condition must be bool, got " + cond.describe());
    if (x.dtype() != y.dtype()) {
      ctx.fail("x and y have different element types (" + x.describe() + " and " + y.describe() +
               ")");
    }
    const DataType dtype = x.dtype();
    const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(x.shape(), y.shape()));
    Tensor* out = nullptr;
    if (x.shape() == shape && ctx.can_overwrite(1)) {
      out = &ctx.output_reusing(0, 1, dtype, shape);
    } else if (y.shape() == shape && ctx.can_overwrite(2)) {
      out = &ctx.output_reusing(0, 2, dtype, shape);
    } else {
      out = &ctx.output(0, dtype, shape);
    }
    if (dtype == DataType::String) {
      ternary_loop<bool, std::string, std::string, std::string>(
          cond, x, y, *out,
          [](bool c, const std::string& a, const std::string& b) -> const std::string& {
            return c ? a : b;
          });
      return;
    }
    auto select = [&]<typename U>() {
      const DataType w = data_type_of<U>();
      ternary_loop<bool, U, U, U>(cond, alias_as(x, w), alias_as(y, w), alias_as(*out, w),
                                  [](bool c, U a, U b) { return c ? a : b; });
    };
    switch (bits_per_element(dtype)) {
      case 8:
        return select.operator()<uint8_t>();
      case 16:
        return select.operator()<uint16_t>();
      case 32:
        return select.operator()<uint32_t>();
      case 64:
        return select.operator()<uint64_t>();
      default:
        throw_unsupported_type(dtype, "Where input");
    }
  }
};

void where_shape(ShapeContext& c) {
  broadcast_shape(c, DataType::Undefined, 1,
                  [](const std::vector<int64_t>& a) { return a[0] ? a[1] : a[2]; });
}

}  // namespace

KILN_REGISTER_OP({.op = "Where",
                  .since = 9,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(1, 2),
                  .strided_inputs = true,
                  .types = "all types (bool condition)",
                  .shape = where_shape,
                  .create = make<Where>});

}  // namespace kiln::ops
