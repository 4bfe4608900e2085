// Helpers every op file uses: element-type dispatch, axis handling, reading small integer
// tensors (shapes, axes), and parallel loops on the environment's oneTBB arena.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/util/float_mode.h"
#include "engine/util/tsan.h"
#include "kiln/data_type.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "ops/core/kernel.h"

namespace kiln::ops {

template <typename... Ts>
struct TypeList {};

using FloatTypes = TypeList<float, double, float16, bfloat16>;
using SignedIntTypes = TypeList<int8_t, int16_t, int32_t, int64_t>;
using UnsignedIntTypes = TypeList<uint8_t, uint16_t, uint32_t, uint64_t>;
using IntTypes = TypeList<int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t>;
using NumericTypes = TypeList<float, double, float16, bfloat16, int8_t, int16_t, int32_t, int64_t,
                              uint8_t, uint16_t, uint32_t, uint64_t>;
using SignedNumericTypes =
    TypeList<float, double, float16, bfloat16, int8_t, int16_t, int32_t, int64_t>;
using AllTypes = TypeList<float, double, float16, bfloat16, int8_t, int16_t, int32_t, int64_t,
                          uint8_t, uint16_t, uint32_t, uint64_t, bool, std::string>;
// Types that are plain bytes of a fixed width (everything but strings and sub-byte types).
using PodTypes = TypeList<float, double, float16, bfloat16, int8_t, int16_t, int32_t, int64_t,
                          uint8_t, uint16_t, uint32_t, uint64_t, bool>;

[[noreturn]] void throw_unsupported_type(DataType dt, const char* what);

// Largest element count an op may make an output of (Expand, Tile, Pad, CenterCropPad,
// ConstantOfShape, Range): far below where byte counts overflow.
inline constexpr int64_t kMaxOutputElements = int64_t{1} << 57;

// Throws kiln::Error (no node: the executor names it) for a negative dimension or more than
// kMaxOutputElements elements.
void check_output_size(const Shape& shape);

// Calls f.template operator()<T>() for the T in `list` whose DataType is `dt`.
//   dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() { ... });
template <typename... Ts, typename F>
void dispatch(TypeList<Ts...>, DataType dt, F&& f, const char* what = "input") {
  bool done = ((dt == data_type_of<Ts>() ? (f.template operator()<Ts>(), true) : false) || ...);
  if (!done) throw_unsupported_type(dt, what);
}

template <typename... Ts>
bool type_in(TypeList<Ts...>, DataType dt) {
  return ((dt == data_type_of<Ts>()) || ...);
}

// The type arithmetic is done in: half types compute in float.
template <typename T>
struct ComputeTypeOf {
  using type = T;
};
template <>
struct ComputeTypeOf<float16> {
  using type = float;
};
template <>
struct ComputeTypeOf<bfloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeTypeOf<T>::type;

template <typename T>
inline T from_compute(compute_t<T> v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T(v);
  } else {
    return v;
  }
}

// Negative axes count from the end; throws Error naming the op's rank when out of range.
int64_t normalize_axis(int64_t axis, int64_t rank);
// Reads an integer tensor (int32 or int64, any rank) as int64 values.
Shape to_int64s(const Tensor& t);
// Reads a float-typed or integer scalar tensor as double.
double scalar_as_double(const Tensor& t);
// numpy-style broadcasting of two shapes; throws Error on incompatible shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Strides (in elements) of `t` seen with the shape `out` (right-aligned, 0 where broadcast).
Shape broadcast_strides(const Tensor& t, const Shape& out);

// What the tasks of parallel_for call. oneTBB copies it into each task, on the thread that
// makes the task: each copy states the hand-off to ThreadSanitizer (tsan.h) keyed on its own
// address, which the task knows before reading anything; the tasks hand their writes back
// to the caller keyed on the body's address. Each range runs in the caller's floating-point
// mode (float_mode.h: the run's denormal setting).
template <typename F>
struct RangeCall {
  F* body;
  unsigned mode;
  explicit RangeCall(F* b) : body(b), mode(fp::mode()) { tsan::release(this); }
  RangeCall(const RangeCall& other) : body((tsan::acquire(&other), other.body)), mode(other.mode) {
    tsan::release(this);
  }
  RangeCall& operator=(const RangeCall&) = delete;
  void operator()(const tbb::blocked_range<int64_t>& r) const {
    tsan::acquire(this);
    const fp::ModeScope scope(mode);
    (*body)(r.begin(), r.end());
    tsan::release(body);
  }
};

// Runs body(begin, end) over [0, n) on the current arena; ranges of fewer than `grain`
// iterations stay on one thread so that small tensors are not split.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n <= grain) {
    body(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    RangeCall<std::remove_reference_t<F>>(&body));
  tsan::acquire(&body);
}

// y[p] = the mean of x's plane p (`size` floats each, size > 0), for p < planes: each plane's
// vector sum, planes in parallel (GlobalAveragePool, and AveragePool over a whole plane).
void plane_means(const float* x, int64_t planes, int64_t size, float* y);

// A grain that gives each task roughly `work_per_task` units when each item costs `cost`.
inline int64_t grain_for(int64_t cost_per_item, int64_t work_per_task = 32768) {
  int64_t g = work_per_task / (cost_per_item > 0 ? cost_per_item : 1);
  return g < 1 ? 1 : g;
}

}  // namespace kiln::ops
