// TopK: the k largest (or smallest) elements along an axis and their indices. Equal values
// keep the lower index first, as onnxruntime does.
//
// Each element is turned into an unsigned 64-bit key with the same order as the value, so
// the selection and sort are instantiated once; only the key extraction is per type.
#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// Order-preserving key: NaN above +inf (all NaNs equal), -0 equal to +0.
template <typename T>
uint64_t order_key(T v) {
  if constexpr (std::is_floating_point_v<compute_t<T>>) {
    double d = static_cast<double>(static_cast<compute_t<T>>(v));
    if (std::isnan(d)) return ~uint64_t{0};
    if (d == 0) d = 0;
    const uint64_t bits = std::bit_cast<uint64_t>(d);
    return (bits >> 63) ? ~bits : bits | (uint64_t{1} << 63);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<uint64_t>(static_cast<int64_t>(v)) ^ (uint64_t{1} << 63);
  } else {
    return static_cast<uint64_t>(v);
  }
}

using KeyFn = void (*)(const void* data, int64_t start, int64_t n, int64_t stride, bool flip,
                       uint64_t* keys);

// keys[j] = key of element start + j * stride, complemented when the largest come first.
template <typename T>
void read_keys(const void* data, int64_t start, int64_t n, int64_t stride, bool flip,
               uint64_t* keys) {
  const T* p = static_cast<const T*>(data) + start;
  const uint64_t mask = flip ? ~uint64_t{0} : 0;
  for (int64_t j = 0; j < n; ++j) keys[j] = order_key<T>(p[j * stride]) ^ mask;
}

template <typename F>
void dispatch_width(DataType dt, F&& f) {
  switch (bits_per_element(dt)) {
    case 8:
      return f.template operator()<uint8_t>();
    case 16:
      return f.template operator()<uint16_t>();
    case 32:
      return f.template operator()<uint32_t>();
    default:
      return f.template operator()<uint64_t>();
  }
}

// The shape of the values and indices: `x` with k along the axis (`*axis`, normalized).
Shape topk_output_shape(const Shape& x, int64_t axis_attr, int64_t k, size_t* axis) {
  if (x.empty()) throw Error(ErrorKind::Runtime, "input must have rank >= 1");
  *axis = static_cast<size_t>(normalize_axis(axis_attr, static_cast<int64_t>(x.size())));
  const int64_t n = x[*axis];
  if (k < 0 || k > n) {
    throw Error(ErrorKind::Runtime,
                "k = " + std::to_string(k) + " is outside [0, " + std::to_string(n) + "]");
  }
  Shape shape = x;
  shape[*axis] = k;
  return shape;
}

class TopK final : public Kernel {
 public:
  explicit TopK(const NodeInfo& info)
      : axis_(info.attr_int("axis", -1)),
        largest_(info.attr_int("largest", 1) != 0),
        k_attr_(info.opset() < 10 ? info.attr_int("k") : -1) {
    if (info.opset() < 10 && k_attr_ < 0) info.fail("k must be >= 0");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    int64_t k = k_attr_;
    if (ctx.opset() >= 10) {
      const Tensor& kt = ctx.input(1);
      if (kt.numel() != 1) ctx.fail("K must hold one value, got " + kt.describe());
      k = to_int64s(kt)[0];
    }
    size_t axis = 0;
    const Shape shape = topk_output_shape(x.shape(), axis_, k, &axis);
    const int64_t n = x.dim(axis);
    KeyFn keys_of = nullptr;
    dispatch(NumericTypes{}, x.dtype(), [&]<typename T>() { keys_of = &read_keys<T>; });

    Tensor& values = ctx.output(0, x.dtype(), shape);
    Tensor& indices = ctx.output(1, DataType::Int64, shape);
    if (values.numel() == 0) return;
    const int64_t outer = shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
    const int64_t inner = shape_numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
    int64_t* out_idx = indices.data<int64_t>();
    const bool flip = largest_;

    parallel_for(outer * inner, grain_for(n * 8), [&](int64_t begin, int64_t end) {
      std::vector<std::pair<uint64_t, int64_t>> row(static_cast<size_t>(n));
      std::vector<uint64_t> keys(static_cast<size_t>(n));
      for (int64_t r = begin; r < end; ++r) {
        const int64_t o = r / inner, i = r % inner;
        keys_of(x.raw_data(), o * n * inner + i, n, inner, flip, keys.data());
        for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = {keys[j], j};
        // Pairs compare by key, then by index: the order is total, ties go to the lower index.
        if (k * 4 < n) {
          std::partial_sort(row.begin(), row.begin() + k, row.end());
        } else {
          if (k < n) std::nth_element(row.begin(), row.begin() + k, row.end());
          std::sort(row.begin(), row.begin() + k);
        }
        int64_t* o_idx = out_idx + o * k * inner + i;
        for (int64_t j = 0; j < k; ++j) o_idx[j * inner] = row[static_cast<size_t>(j)].second;
      }
    });
    // Values are copied from the input at the chosen indices.
    dispatch_width(x.dtype(), [&]<typename U>() {
      const U* src = reinterpret_cast<const U*>(x.raw_data());
      U* dst = reinterpret_cast<U*>(values.raw_data());
      const int64_t total = values.numel();
      for (int64_t e = 0; e < total; ++e) {
        const int64_t i = e % inner, o = e / (k * inner);
        dst[e] = src[(o * n + out_idx[e]) * inner + i];
      }
    });
  }

 private:
  int64_t axis_;
  bool largest_;
  int64_t k_attr_;
};

// The input's shape with k along the axis: the values and their int64 indices.
void topk_shape(ShapeContext& c) {
  int64_t k = c.attr_int("k", -1);
  if (c.opset() >= 10) {
    const std::vector<int64_t>& kt = c.data(1);
    if (kt.size() != 1) unknown("K must hold one value");
    k = kt[0];
  }
  size_t axis = 0;
  const Shape shape = topk_output_shape(c.shape(0), c.attr_int("axis", -1), k, &axis);
  c.set(0, c.dtype(0), shape);
  c.set(1, DataType::Int64, shape);
}

}  // namespace

KILN_REGISTER_OP({.op = "TopK",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .min_outputs = 2,
                  .max_outputs = 2,
                  .types = "all numeric",
                  .shape = topk_shape,
                  .create = make<TopK>});

}  // namespace kiln::ops
