#include "ops/core/half.h"

#include <stdexcept>

#include "ops/core/common.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

// Elements per parallel task: a conversion streams memory, so tasks stay large.
constexpr int64_t kConvertGrain = 1 << 16;

}  // namespace

void widen_half(const void* src, float* dst, int64_t n) {
  math::kernels().convert.f16_to_f32(static_cast<const uint16_t*>(src), dst, n);
}

void narrow_half(const float* src, void* dst, int64_t n) {
  math::kernels().convert.f32_to_f16(src, static_cast<uint16_t*>(dst), n);
}

Tensor widen_to_float(OpContext& ctx, const Tensor& t) {
  if (t.dtype() == DataType::Float && t.is_contiguous()) return t;
  const Tensor c = t.contiguous();
  if (c.dtype() == DataType::Float) return c;
  if (c.dtype() != DataType::Float16) ctx.fail("cannot widen " + c.describe() + " to float");
  return widen_into(c, ctx.allocate(DataType::Float, c.shape()));
}

Tensor widen_into(const Tensor& t, Tensor dst) {
  const Tensor c = t.contiguous();
  if (c.dtype() != DataType::Float16 || dst.dtype() != DataType::Float ||
      dst.numel() != c.numel() || !dst.is_contiguous()) {
    throw std::logic_error("widen_into: " + c.describe() + " into " + dst.describe());
  }
  const auto* s = reinterpret_cast<const uint16_t*>(c.raw_data());
  float* d = dst.data<float>();
  parallel_for(c.numel(), kConvertGrain,
               [&](int64_t lo, int64_t hi) { widen_half(s + lo, d + lo, hi - lo); });
  return dst;
}

void narrow_into(const Tensor& src, Tensor& dst) {
  const float* s = src.data<const float>();
  auto* d = reinterpret_cast<uint16_t*>(dst.raw_data());
  parallel_for(src.numel(), kConvertGrain,
               [&](int64_t lo, int64_t hi) { narrow_half(s + lo, d + lo, hi - lo); });
}

}  // namespace kiln::ops
