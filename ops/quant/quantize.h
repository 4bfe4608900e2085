// Dynamic quantization of float activations to uint8, per tensor, shared by
// DynamicQuantizeLinear and the com.microsoft ops that quantize their inputs as they run
// (DynamicQuantizeMatMul, DynamicQuantizeLSTM).
#pragma once

#include <cstdint>

namespace kiln::ops {

struct DynamicQuant {
  float scale = 1.0f;
  uint8_t zero_point = 0;
};

// Quantizes x[0, n) into y as onnxruntime and the ONNX reference do: the range [min, max]
// widened to include 0 (NaNs skipped), scale (max - min) / 255 (1 when the range is empty),
// zero point round_half_even(clamp(-min / scale, 0, 255)), y = saturate(round_half_even(x /
// scale) + zero point).
DynamicQuant dynamic_quantize_u8(const float* x, int64_t n, uint8_t* y);

// Only the scale and zero point dynamic_quantize_u8 would use for x[0, n): the fused products
// quantize A as they pack it (math::QFloatA).
DynamicQuant dynamic_quant_params(const float* x, int64_t n);

}  // namespace kiln::ops
