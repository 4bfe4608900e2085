// OneHot: out[..., d, ...] = values[1] where indices[...] == d (negative indices count
// from depth), values[0] elsewhere. Indices and depth may be any numeric type.
#include <cmath>
#include <limits>
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
      throw_unsupported_type(dt, "values");
  }
}

// Index values as int64; -1 - depth (never a hit) for values that are not finite integers
// in range, so that out-of-range indices give an all-off row as the spec requires.
std::vector<int64_t> read_indices(const Tensor& t, int64_t depth) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  const int64_t miss = -1 - depth;
  dispatch(
      NumericTypes{}, t.dtype(),
      [&]<typename T>() {
        const T* p = t.data<const T>();
        for (size_t i = 0; i < out.size(); ++i) {
          const auto v = static_cast<compute_t<T>>(p[i]);
          if constexpr (std::is_floating_point_v<decltype(v)>) {
            const double d = std::trunc(static_cast<double>(v));
            out[i] = (std::isfinite(d) && std::abs(d) <= static_cast<double>(depth))
                         ? static_cast<int64_t>(d)
                         : miss;
          } else if constexpr (std::is_unsigned_v<decltype(v)>) {
            out[i] = v <= static_cast<uint64_t>(depth) ? static_cast<int64_t>(v) : miss;
          } else {
            out[i] = static_cast<int64_t>(v);
          }
        }
      },
      "indices");
  return out;
}

class OneHot final : public Kernel {
 public:
  explicit OneHot(const NodeInfo& info) : axis_(info.attr_int("axis", -1)) {}

  void run(OpContext& ctx) override {
    const Tensor& indices = ctx.input(0);
    const Tensor& depth_t = ctx.input(1);
    const Tensor& values = ctx.input(2);
    if (depth_t.numel() != 1) ctx.fail("depth must hold one value, got " + depth_t.describe());
    if (values.numel() != 2) ctx.fail("values must hold [off, on], got " + values.describe());
    const double depth_d = std::trunc(scalar_as_double(depth_t));
    if (!(depth_d >= 1) || depth_d > static_cast<double>(std::numeric_limits<int32_t>::max())) {
      ctx.fail("depth must be a positive integer, got " + std::to_string(depth_d));
    }
    const int64_t depth = static_cast<int64_t>(depth_d);
    const int64_t r = static_cast<int64_t>(indices.rank());
    const int64_t axis = normalize_axis(axis_, r + 1);

    Shape out_shape = indices.shape();
    out_shape.insert(out_shape.begin() + axis, depth);
    const int64_t n = indices.numel();
    if (n > 0 && depth > std::numeric_limits<int64_t>::max() / 16 / n) {
      ctx.fail("output would be too large");
    }
    const std::vector<int64_t> idx = read_indices(indices, depth);
    const int64_t suffix =
        shape_numel(Shape(indices.shape().begin() + axis, indices.shape().end()));
    const int64_t prefix = suffix == 0 ? 0 : n / suffix;
    Tensor& out = ctx.output(0, values.dtype(), out_shape);
    if (out.numel() == 0) return;
    dispatch_width(values.dtype(), [&]<typename T>() {
      const T* v = reinterpret_cast<const T*>(values.raw_data());
      T* o = reinterpret_cast<T*>(out.raw_data());
      std::fill_n(o, out.numel(), v[0]);
      for (int64_t p = 0; p < prefix; ++p) {
        for (int64_t s = 0; s < suffix; ++s) {
          int64_t d = idx[static_cast<size_t>(p * suffix + s)];
          if (d < 0) d += depth;
          if (d >= 0 && d < depth) o[(p * depth + d) * suffix + s] = v[1];
        }
      }
    });
  }

 private:
  int64_t axis_;
};

// The indices' shape with `depth` inserted at `axis`; known when depth is an integer constant.
void onehot_shape(ShapeContext& c) {
  const std::vector<int64_t>& depth = c.data(1);
  if (depth.size() != 1 || depth[0] < 1 || depth[0] > std::numeric_limits<int32_t>::max()) {
    unknown("depth must be one positive integer");
  }
  if (c.shape(2).size() != 1 || c.shape(2)[0] != 2) unknown("values must hold [off, on]");
  Shape out = c.shape(0);
  const int64_t axis = normalize_axis(c.attr_int("axis", -1), static_cast<int64_t>(out.size()) + 1);
  out.insert(out.begin() + axis, depth[0]);
  c.set(0, c.dtype(2), out);
}

}  // namespace

KILN_REGISTER_OP({.op = "OneHot",
                  .since = 9,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "numeric indices and depth; values of any type",
                  .shape = onehot_shape,
                  .create = make<OneHot>});

}  // namespace kiln::ops
