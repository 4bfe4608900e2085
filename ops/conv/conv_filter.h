// The forms the float convolution paths (ops/conv/conv.cpp) read a filter in, and their packing for
// the GEMM layer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::ops::convolution {

// The forms a float filter is packed in for the GEMM layer: of each group, a packed A
// ([mg x cg * kernel], the output channels as rows); for the transposed product of small
// maps (use_transposed), its transpose as a packed B ([cg * kernel x mg], the output channels
// as columns); for 3x3 stride-1 convolutions (winograd_tile), the Winograd transform's 36
// (4x4 output tiles) or 16 (2x2 tiles) packed A ([mg x cg] each). The groups one after
// another.
enum class FilterForm : uint8_t { Packed, Transposed, Winograd4, Winograd2 };
constexpr size_t kFilterForms = 4;

// Floats of a form for `groups` groups of mg output channels, cg input channels and kk =
// cg * kernel values per output channel.
int64_t form_floats(int64_t groups, int64_t mg, int64_t cg, int64_t kk, FilterForm form);

int64_t packed_filter_floats(const Tensor& w, int64_t groups, FilterForm form);

// That form into `out` (packed_filter_floats floats).
void pack_filter_into(const Tensor& w, int64_t groups, FilterForm form, float* out);

// pack_filter_into a tensor of its own (the weights cache's prepared form).
Tensor pack_filter(const Tensor& w, int64_t groups, FilterForm form);

}  // namespace kiln::ops::convolution
