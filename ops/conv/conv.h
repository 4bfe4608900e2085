// What the Conv kernels (ops/conv/conv.cpp, ops/conv/conv_gemm.cpp) report about the strategies
// they ran.
#pragma once

#include <cstdint>

namespace kiln::ops {

// Float convolutions run as strided windows since the process started: 1-D windows over one
// input channel per group with long kernels and several filters, as GEMM products that read
// the signal as a strided matrix (see use_strided_windows in ops/conv/conv_strategy.cpp).
uint64_t strided_window_convolutions();

}  // namespace kiln::ops
