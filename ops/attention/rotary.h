// The rotation of rotary position embeddings (RoPE), shared by ai.onnx and com.microsoft
// RotaryEmbedding and by com.microsoft.GroupQueryAttention's do_rotary.
#pragma once

#include <cstdint>

#include "ops/core/common.h"

namespace kiln::ops {

// Rotates the pairs of the first `rotary_dim` features of one head by one position's angles
// (cos/sin hold rotary_dim / 2 values): the pairs are the two halves of that part
// (x[i], x[i + d/2]), or adjacent features (x[2i], x[2i + 1]) when `interleaved`. Features
// past rotary_dim are copied. Each pair is read before either element is written, so `out`
// may alias `in`.
template <typename T>
void rotate_head(const T* in, T* out, int64_t head_size, int64_t rotary_dim, const T* cos,
                 const T* sin, bool interleaved) {
  using C = compute_t<T>;
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t i1 = interleaved ? 2 * i : i;
    const int64_t i2 = interleaved ? 2 * i + 1 : i + half;
    const C x1 = static_cast<C>(in[i1]), x2 = static_cast<C>(in[i2]);
    const C cv = static_cast<C>(cos[i]), sv = static_cast<C>(sin[i]);
    out[i1] = from_compute<T>(cv * x1 - sv * x2);
    out[i2] = from_compute<T>(sv * x1 + cv * x2);
  }
  if (out != in) {
    for (int64_t i = rotary_dim; i < head_size; ++i) out[i] = in[i];
  }
}

}  // namespace kiln::ops
